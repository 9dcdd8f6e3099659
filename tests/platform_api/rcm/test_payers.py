"""The payers' client (platform_api/rcm/payers.py) against the stand-in payer over HTTP:
both formats, its refusals with codes, and how a decision is read from a ClaimResponse."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest

from platform_api.envelope import ApiError
from platform_api.rcm.payers import (
    PayerClient,
    PayerConfig,
    decision_of,
    payer_config,
    total_of,
)
from tests.conftest import make_settings
from tests.platform_api.rcm.conftest import KEY
from tests.platform_api.rcm.payer_standin import PayerStandIn

Payer = tuple[PayerStandIn, str]
CLAIM: dict[str, Any] = {
    "resourceType": "Claim", "id": "c1", "status": "active", "use": "claim",
    "created": "2026-11-20T10:00:00Z", "identifier": [{"value": "CLM-1"}],
    "type": {"coding": [{"code": "institutional"}]},
    "patient": {"reference": "Patient/p1"}, "provider": {"reference": "Organization/o1"},
    "insurer": {"display": "Jubilee Insurance"}, "billablePeriod": {"start": "2026-11-20"},
    "priority": {"coding": [{"code": "normal"}]},
    "item": [{"sequence": 1, "productOrService": {"coding": [{"code": "US-ABD"}],
                                                  "text": "Ultrasound"},
              "quantity": {"value": 2}, "unitPrice": {"value": 1000, "currency": "KES"},
              "net": {"value": 2000, "currency": "KES"}}],
    "total": {"value": 2000, "currency": "KES"}}
COVERAGE = {"resourceType": "Coverage", "id": "cov1", "subscriberId": "JUB-77"}


def client(base: str, fmt: str = "own", key: str = KEY, timeout: float = 2.0) -> PayerClient:
    path = "/own" if fmt == "own" else "/fhir"
    return PayerClient("jubilee-insurance", PayerConfig.model_validate({
        "name": "Jubilee Insurance", "base_url": base + path, "format": fmt, "api_key": key,
        "timeout_seconds": timeout}))


async def test_the_own_format_is_sent_and_read_back_as_a_claim_response(payer: Payer):
    stand_in, base = payer
    stand_in.decision = "partial"
    response = await client(base).submit(CLAIM, COVERAGE)
    path, sent = stand_in.received[-1]
    assert path == "/own/claims" and sent["member_number"] == "JUB-77"
    assert sent["lines"] == [{"line": 1, "code": "US-ABD", "description": "Ultrasound",
                              "quantity": "2", "unit_price": "1000.00", "amount": "2000.00"}]
    assert response["resourceType"] == "ClaimResponse" and response["outcome"] == "complete"
    assert total_of(response, "benefit") == Decimal("1200.00")
    assert decision_of(response) == "partial"
    assert response["identifier"][0]["value"] == "JUB-CLM-1"


async def test_a_wrong_key_and_a_slow_payer_are_refusals_with_codes(payer: Payer):
    stand_in, base = payer
    with pytest.raises(ApiError) as refused:
        await client(base, key="stolen").submit(CLAIM, COVERAGE)
    assert (refused.value.status, refused.value.code) == (502, "PAYER_REFUSED")
    assert "stolen" not in refused.value.message
    with pytest.raises(ApiError) as fhir_refused:
        await client(base, fmt="fhir", key="stolen").submit(CLAIM, COVERAGE)
    assert "Unknown key" in fhir_refused.value.message
    stand_in.decision, stand_in.delay = "timeout", 1.0
    with pytest.raises(ApiError) as slow:
        await client(base, timeout=0.2).submit(CLAIM, COVERAGE)
    assert (slow.value.status, slow.value.code) == (504, "PAYER_TIMEOUT")
    with pytest.raises(ApiError) as unreachable:
        await client("http://127.0.0.1:9").submit(CLAIM, COVERAGE)
    assert (unreachable.value.status, unreachable.value.code) == (502, "PAYER_UNAVAILABLE")


def test_payer_settings_are_checked(tmp_path):
    settings = make_settings(tmp_path, rcm_payers={"nhif": {"name": "NHIF",
                                                            "base_url": "ftp://x"}})
    with pytest.raises(ApiError) as invalid:
        payer_config(settings, "nhif")
    assert invalid.value.code == "PAYER_UNAVAILABLE" and "base_url" in invalid.value.message
    with pytest.raises(ApiError) as missing:
        payer_config(settings, "aar")
    assert (missing.value.status, missing.value.code) == (422, "PAYER_NOT_CONFIGURED")


@pytest.mark.parametrize(("outcome", "submitted", "benefit", "decision"), [
    ("complete", 100, 100, "approved"), ("complete", 100, 40, "partial"),
    ("complete", 100, 0, "rejected"), ("error", 100, 100, "rejected"),
    ("queued", 100, 0, "pending"), ("partial", 100, 100, "approved")])
def test_the_decision_is_read_from_the_benefit_granted(outcome, submitted, benefit,
                                                       decision):
    def total(category: str, value: int) -> dict[str, Any]:
        return {"category": {"coding": [{"code": category}]},
                "amount": {"value": value, "currency": "KES"}}
    response = {"outcome": outcome, "total": [total("submitted", submitted),
                                              total("benefit", benefit)]}
    assert decision_of(response) == decision
    # a payer answering per item only is read the same
    per_item = {"outcome": outcome, "item": [{"adjudication": response["total"]}]}
    assert decision_of(per_item) == decision
