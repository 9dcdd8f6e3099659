"""The Revenue cycle tests' world: the clinic of tests/platform_api/clinic.py, and a local
stand-in payer answering as two payers: NHIF over FHIR, Jubilee Insurance in its own
format (both with a short timeout, so a payer that hangs is seen quickly)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from platform_api.settings import Settings
from tests.conftest import make_settings
from tests.platform_api.clinic import Clinic, clinic  # noqa: F401  (the fixture)
from tests.platform_api.rcm.payer_standin import PayerStandIn
from tests.stand_ins import serving

KEY = "payer-test-key-5f1c"
JSON = dict[str, Any]
ITEMS = [{"description": "Outpatient consultation", "code": "11429006",
          "system": "http://snomed.info/sct", "unit_price": "1500.00"},
         {"description": "Malaria rapid diagnostic test", "code": "394915009",
          "system": "http://snomed.info/sct", "quantity": 2, "unit_price": "175.25"}]


@pytest.fixture
async def payer() -> AsyncIterator[tuple[PayerStandIn, str]]:
    stand_in = PayerStandIn(KEY)
    async with serving(stand_in.app()) as url:
        yield stand_in, url


@pytest.fixture
def settings(tmp_path: Path, payer: tuple[PayerStandIn, str]) -> Settings:
    base = payer[1]
    # the OpenAPI walk (test_routes) makes many refused requests from one address
    return make_settings(tmp_path, rate_limit_enabled=False, rcm_payers={
        "nhif": {"name": "NHIF", "base_url": base + "/fhir", "format": "fhir",
                 "api_key": KEY, "timeout_seconds": 0.5},
        "jubilee-insurance": {"name": "Jubilee Insurance", "base_url": base + "/own",
                              "format": "own", "api_key": KEY, "timeout_seconds": 0.5}})


def data(response: httpx.Response, status: int = 200) -> Any:
    assert response.status_code == status, response.text
    return response.json()["data"]


async def draft(world: Clinic, who: str = "billing", **extra: Any) -> httpx.Response:
    body = {"organization_id": world.org_id, "patient_id": world.patient_id,
            "insurer": "NHIF", "policy_number": "NHIF-2231-8890", "currency": "KES",
            "diagnoses": ["B50.9"], "service_date": "2026-11-20", "items": ITEMS, **extra}
    return await world.post(who, "/api/rcm/claims", body)


async def put(world: Clinic, who: str, path: str, body: Any) -> httpx.Response:
    return await world.client.put(path, json=body, headers=world.h(who))
