"""The Revenue cycle area as a whole (``platform_api.rcm``): every operation the spec lists
for it is served, documented with its models, and refused without credentials."""

from __future__ import annotations

from typing import Any

import httpx
import jsonschema_rs

from tests.platform_api.area_operations import (
    assert_credentials_needed,
    assert_served_and_documented,
)
from tests.platform_api.clinic import Clinic
from tests.platform_api.rcm.conftest import ITEMS
from tests.platform_api.rcm.payer_standin import PayerStandIn
from tests.platform_api.test_openapi import (
    bodies,
    check,
    documented,
    match,
    operations,
    url_of,
)


async def test_every_operation_of_the_area_is_served_and_documented(client):
    await assert_served_and_documented(client, "Revenue cycle", 17)


async def test_static_paths_are_not_taken_for_a_claim_id(client):
    spec = (await client.get("/openapi.json")).json()
    paths = list(spec["paths"])
    item = paths.index("/api/rcm/claims/{resource_id}")
    for static in ("analytics/by-insurer", "analytics/by-provider", "fraud-flags",
                   "reconciliation"):
        assert paths.index(f"/api/rcm/claims/{static}") < item


async def test_every_route_of_the_area_needs_credentials(client):
    assert await assert_credentials_needed(client, "Revenue cycle") == []


async def test_every_answer_of_the_area_is_documented(app, client, clinic: Clinic,
                                                      payer: tuple[PayerStandIn, str]):
    """The OpenAPI walk of tests/platform_api/test_openapi.py over this area's routes
    (mistaken and refused requests), then its successes and the payers' failures."""
    spec = (await client.get("/openapi.json")).json()
    seen: set[tuple[str, str, int]] = set()
    callers = [clinic.people["platform_admin"], clinic.people["stranger"]]
    for path, method, operation in operations(spec):
        if not path.startswith("/api/rcm"):
            continue
        url = url_of(path)
        for content_type, body in bodies(operation):
            headers = {"Content-Type": content_type} if content_type else {}
            check(spec, method, url, await client.request(method, url, content=body,
                                                          headers=headers), seen)
            for who in callers:
                check(spec, method, url, await client.request(
                    method, url, content=body, headers={**who["headers"], **headers}), seen)

    async def send(who: str, method: str, url: str, body: Any = None, **params: Any
                   ) -> httpx.Response:
        answer = await client.request(method, url, json=body, params=params,
                                      headers=clinic.h(who))
        if answer.status_code in (502, 504):  # the payer's failure, not the server's
            template, operation = match(spec, method, url)
            described = documented(spec, operation, answer.status_code)
            assert described is not None, (method, url, answer.status_code)
            schema = described["content"]["application/json"]["schema"]
            validator = jsonschema_rs.validator_for({**schema,
                                                     "components": spec["components"]})
            assert validator.is_valid(answer.json()), answer.text
            seen.add((method, template, answer.status_code))
        else:
            check(spec, method, url, answer, seen)
        return answer
    claim = (await send("billing", "POST", "/api/rcm/claims", {
        "organization_id": clinic.org_id, "patient_id": clinic.patient_id, "insurer": "NHIF",
        "policy_number": "N-1", "currency": "KES", "service_date": "2026-11-20",
        "items": ITEMS})).json()["data"]
    item = f"/api/rcm/claims/{claim['id']}"
    await send("billing", "PUT", item, {"diagnoses": ["B50.9"]})
    await send("billing", "POST", item + "/eligibility")
    await send("billing", "POST", item + "/preauth")
    payer[0].decision, payer[0].delay = "timeout", 1.0
    await send("billing", "POST", item + "/submit")
    payer[0].decision = "fail"
    await send("billing", "POST", item + "/submit")
    await send("doctor", "POST", item + "/submit")  # 403
    payer[0].decision = "approve"
    await send("billing", "POST", item + "/submit")
    await send("billing", "POST", item + "/submit")  # 409
    await send("billing", "POST", item + "/preauth")  # 409
    await send("billing", "GET", item)
    for report in ("analytics/by-insurer", "analytics/by-provider", "fraud-flags",
                   "reconciliation"):
        await send("billing", "GET", f"/api/rcm/claims/{report}")
    await send("billing", "GET", "/api/rcm/claims", status="paid")
    invoice = (await send("billing", "POST", "/api/rcm/invoices", {
        "organization_id": clinic.org_id, "patient_id": clinic.patient_id,
        "currency": "KES", "line_items": ITEMS})).json()["data"]
    await send("billing", "GET", f"/api/rcm/invoices/{invoice['id']}")
    await send("billing", "GET", "/api/rcm/invoices")
    await send("billing", "GET", "/api/rcm/marketplace/plans")
    await send("billing", "GET", "/api/rcm/marketplace/policies")
    statuses = {(method, status) for method, _, status in seen}
    assert {("POST", 201), ("PUT", 200), ("POST", 200), ("GET", 200), ("POST", 409),
            ("POST", 504), ("POST", 502), ("POST", 401), ("POST", 403), ("GET", 404),
            ("POST", 422), ("POST", 415), ("POST", 400)} <= statuses, statuses
