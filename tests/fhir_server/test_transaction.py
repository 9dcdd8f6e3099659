"""Batch and transaction Bundles (R4 3.1.0.11) over ``POST /fhir`` and from Python."""

from __future__ import annotations

import asyncio
import base64
import json
from typing import Any

import pytest

from fhir_server.access import SYSTEM
from fhir_server.transactions import process_bundle
from tests.fhir_server.clinical_data import LOINC, MRN, UCUM

FHIR = {"Content-Type": "application/fhir+json"}


@pytest.fixture
def h(clinic_admin: dict[str, Any]) -> dict[str, str]:
    return {**clinic_admin["headers"], **FHIR}


def patient(mrn: str, family: str = "Odhiambo") -> dict[str, Any]:
    return {"resourceType": "Patient", "identifier": [{"system": MRN, "value": mrn}],
            "name": [{"family": family, "given": ["Amina"]}], "birthDate": "1988-04-12"}


def heart_rate(subject: str, value: int = 72, encounter: str | None = None) -> dict[str, Any]:
    resource: dict[str, Any] = {
        "resourceType": "Observation", "status": "final",
        "code": {"coding": [{"system": LOINC, "code": "8867-4", "display": "Heart rate"}]},
        "subject": {"reference": subject}, "effectiveDateTime": "2024-03-01T09:15:00Z",
        "valueQuantity": {"value": value, "system": UCUM, "code": "/min"}}
    if encounter:
        resource["encounter"] = {"reference": encounter}
    return resource


def entry(method: str, url: str, resource: dict | None = None, full_url: str | None = None,
          **request: str) -> dict[str, Any]:
    item: dict[str, Any] = {"request": {"method": method, "url": url, **request}}
    if resource is not None:
        item["resource"] = resource
    if full_url:
        item["fullUrl"] = full_url
    return item


def bundle(kind: str, *entries: dict[str, Any]) -> dict[str, Any]:
    return {"resourceType": "Bundle", "type": kind, "entry": list(entries)}


async def total(client, h, path: str) -> int:
    separator = "&" if "?" in path else "?"
    result = await client.get(f"/fhir/{path}{separator}_total=accurate", headers=h)
    return int(result.json()["total"])


async def test_transaction_rewrites_urn_uuid_references(client, h):
    body = bundle(
        "transaction",
        entry("POST", "Observation", heart_rate("urn:uuid:p-1", encounter="urn:uuid:e-1"),
              "urn:uuid:o-1"),
        entry("POST", "Encounter", {"resourceType": "Encounter", "status": "finished",
                                    "class": {"code": "AMB"},
                                    "subject": {"reference": "urn:uuid:p-1"}}, "urn:uuid:e-1"),
        entry("POST", "Patient", patient("KE-T1"), "urn:uuid:p-1"),
    )
    response = await client.post("/fhir", json=body, headers=h)
    assert response.status_code == 200, response.text
    result = response.json()
    assert result["type"] == "transaction-response"
    statuses = [e["response"]["status"] for e in result["entry"]]
    assert statuses == ["201 Created"] * 3
    observation, encounter, created = (e["resource"] for e in result["entry"])
    assert observation["subject"]["reference"] == f"Patient/{created['id']}"
    assert observation["encounter"]["reference"] == f"Encounter/{encounter['id']}"
    assert result["entry"][2]["response"]["location"].endswith(
        f"Patient/{created['id']}/_history/1")
    found = await client.get("/fhir/Observation?subject:Patient.identifier=KE-T1", headers=h)
    assert found.json()["total"] == 1


async def test_transaction_processes_delete_post_put_then_get(client, h):
    old = (await client.post("/fhir/Patient", json=patient("KE-T2", "Old"), headers=h)).json()
    body = bundle(
        "transaction",
        entry("GET", "Patient?identifier=KE-T2"),
        entry("PUT", "Patient/ke-t2-new", {**patient("KE-T2", "New"), "id": "ke-t2-new"}),
        entry("POST", "Patient", patient("KE-T2", "Posted")),
        entry("DELETE", f"Patient/{old['id']}"),
    )
    response = await client.post("/fhir", json=body, headers=h)
    assert response.status_code == 200, response.text
    result = response.json()["entry"]
    assert [e["response"]["status"] for e in result] == [
        "200 OK", "201 Created", "201 Created", "204 No Content"]
    searched = result[0]["resource"]
    assert searched["type"] == "searchset" and searched["total"] == 2  # after the writes


async def test_transaction_if_none_exist_and_conditional_references(client, h):
    existing = (await client.post("/fhir/Patient", json=patient("KE-T3"), headers=h)).json()
    body = bundle(
        "transaction",
        entry("POST", "Patient", patient("KE-T3"), "urn:uuid:p-3",
              ifNoneExist=f"identifier={MRN}|KE-T3"),
        entry("POST", "Observation", heart_rate("urn:uuid:p-3", 80)),
        entry("POST", "Observation", heart_rate(f"Patient?identifier={MRN}|KE-T3", 81)),
    )
    response = await client.post("/fhir", json=body, headers=h)
    assert response.status_code == 200, response.text
    result = response.json()["entry"]
    assert result[0]["response"]["status"] == "200 OK"
    assert result[0]["resource"]["id"] == existing["id"]
    for item in result[1:]:
        assert item["resource"]["subject"]["reference"] == f"Patient/{existing['id']}"
    assert await total(client, h, "Patient?identifier=KE-T3") == 1


async def test_failing_entry_rolls_back_everything_and_is_named(client, h):
    body = bundle(
        "transaction",
        entry("POST", "Patient", patient("KE-T4")),
        entry("POST", "Observation", heart_rate("Patient/nobody")),
        entry("POST", "Observation", {**heart_rate("Patient/nobody"),
                                      "valueQuantity": {"value": "seventy-two"}}),
    )
    response = await client.post("/fhir", json=body, headers=h)
    assert response.status_code == 400
    issue = response.json()["issue"][0]
    assert "Bundle.entry[2]" in issue["diagnostics"]
    assert "Bundle.entry[2]" in issue["expression"]
    assert await total(client, h, "Patient?identifier=KE-T4") == 0


async def test_conditional_reference_without_a_single_match_fails(client, h):
    body = bundle("transaction",
                  entry("POST", "Patient", patient("KE-T5")),
                  entry("POST", "Observation", heart_rate("Patient?identifier=KE-NOBODY")))
    response = await client.post("/fhir", json=body, headers=h)
    assert response.status_code == 412
    assert "Bundle.entry[1]" in response.json()["issue"][0]["diagnostics"]
    assert await total(client, h, "Patient?identifier=KE-T5") == 0


async def test_transaction_conditional_put_delete_and_patch(client, h):
    await client.post("/fhir/Patient", json=patient("KE-T6"), headers=h)
    kept = (await client.post("/fhir/Patient", json=patient("KE-T6-P"), headers=h)).json()
    await client.post("/fhir/Patient", json=patient("KE-T6-GONE", "Gone"), headers=h)
    patch = base64.b64encode(json.dumps(
        [{"op": "add", "path": "/active", "value": True}]).encode()).decode()
    body = bundle(
        "transaction",
        entry("PUT", f"Patient?identifier={MRN}|KE-T6", {**patient("KE-T6"), "gender": "female"}),
        entry("DELETE", "Patient?family=gone"),
        entry("PATCH", f"Patient/{kept['id']}", {"resourceType": "Binary",
                                                 "contentType": "application/json-patch+json",
                                                 "data": patch}),
    )
    response = await client.post("/fhir", json=body, headers=h)
    assert response.status_code == 200, response.text
    patched = (await client.get(f"/fhir/Patient/{kept['id']}", headers=h)).json()
    assert patched["active"] is True and patched["meta"]["versionId"] == "2"
    updated = await client.get(f"/fhir/Patient?identifier={MRN}|KE-T6", headers=h)
    assert updated.json()["entry"][0]["resource"]["gender"] == "female"
    assert await total(client, h, "Patient?family=gone") == 0


async def test_transaction_changing_a_resource_twice_fails(client, h):
    kept = (await client.post("/fhir/Patient", json=patient("KE-T8"), headers=h)).json()
    body = bundle(
        "transaction",
        entry("PUT", f"Patient?identifier={MRN}|KE-T8", patient("KE-T8")),
        entry("DELETE", f"Patient/{kept['id']}"),
    )
    response = await client.post("/fhir", json=body, headers=h)
    assert response.status_code == 400
    assert "Bundle.entry[0]" in response.text and "Bundle.entry[1]" in response.text


async def test_batch_entries_succeed_or_fail_on_their_own(client, h):
    existing = (await client.post("/fhir/Patient", json=patient("KE-B1"), headers=h)).json()
    body = bundle(
        "batch",
        entry("POST", "Patient", patient("KE-B2")),
        entry("POST", "Patient", {**patient("KE-B3"), "birthDate": "yesterday"}),
        entry("GET", f"Patient/{existing['id']}"),
        entry("GET", "Patient/does-not-exist"),
        entry("PUT", f"Patient/{existing['id']}", {**patient("KE-B1"), "id": existing["id"]},
              ifMatch='W/"9"'),
    )
    response = await client.post("/fhir", json=body, headers=h)
    assert response.status_code == 200
    result = response.json()
    assert result["type"] == "batch-response"
    statuses = [e["response"]["status"] for e in result["entry"]]
    assert statuses == ["201 Created", "400 Bad Request", "200 OK", "404 Not Found",
                        "412 Precondition Failed"]
    assert result["entry"][1]["response"]["outcome"]["resourceType"] == "OperationOutcome"
    assert await total(client, h, "Patient?identifier=KE-B2") == 1


SEARCH_URLS = [
    "Patient?identifier={mrn}|KE-NEW",
    "Patient?identifier={mrn}%7CKE-NEW",  # the bar encoded
    "/Patient?identifier={mrn}|KE-NEW",
    "Patient/?identifier={mrn}|KE-NEW",  # a trailing slash
    "Patient/_search?identifier={mrn}|KE-NEW",
    "http://example.org/fhir/Patient?identifier={mrn}|KE-NEW",  # another server's base
    "https://hie.example.org/base/R4/Patient?identifier={mrn}%7CKE-NEW",
]


@pytest.mark.parametrize("url", SEARCH_URLS)
async def test_a_get_entry_before_the_post_finds_exactly_what_the_transaction_created(
        client, h, url):
    """http.html#trules: GET entries run after the writes, whatever their place, and
    keep their criteria whatever form their URL takes."""
    for mrn in ("KE-OLD-1", "KE-OLD-2"):
        await client.post("/fhir/Patient", json=patient(mrn), headers=h)
    response = await client.post("/fhir", headers=h, json=bundle(
        "transaction", entry("GET", url.format(mrn=MRN)),
        entry("POST", "Patient", patient("KE-NEW"), "urn:uuid:new")))
    assert response.status_code == 200, response.text
    searchset = response.json()["entry"][0]["resource"]
    assert searchset["total"] == 1
    assert searchset["entry"][0]["resource"]["identifier"][0]["value"] == "KE-NEW"


@pytest.mark.parametrize("url", SEARCH_URLS)
async def test_a_get_entry_of_a_batch_keeps_its_criteria(client, h, url):
    for mrn in ("KE-OLD-1", "KE-NEW"):
        await client.post("/fhir/Patient", json=patient(mrn), headers=h)
    response = await client.post("/fhir", headers=h, json=bundle(
        "batch", entry("GET", url.format(mrn=MRN))))
    assert response.json()["entry"][0]["resource"]["total"] == 1


async def test_bundle_shape_errors(client, h):
    assert (await client.post("/fhir", json=patient("x"), headers=h)).status_code == 400
    unknown = bundle("transaction", entry("POST", "Spaceship", {"resourceType": "Spaceship"}))
    assert (await client.post("/fhir", json=unknown, headers=h)).status_code == 400
    wrong = bundle("transaction", entry("POST", "Patient", heart_rate("Patient/1")))
    response = await client.post("/fhir", json=wrong, headers=h)
    assert response.status_code == 400 and "Bundle.entry[0]" in response.text


async def test_prefer_minimal_leaves_out_the_resources(client, h):
    response = await client.post("/fhir", json=bundle("transaction", entry(
        "POST", "Patient", patient("KE-T7"))), headers={**h, "Prefer": "return=minimal"})
    assert "resource" not in response.json()["entry"][0]


async def test_the_engine_runs_from_python_without_http_and_concurrently(app):
    fhir = app.state.services.fhir
    message = bundle(
        "transaction",
        entry("POST", "Patient", patient("KE-HL7"), "urn:uuid:pat",
              ifNoneExist=f"identifier={MRN}|KE-HL7"),
        entry("POST", "Observation", heart_rate("urn:uuid:pat")),
    )
    results = await asyncio.gather(*[process_bundle(fhir, json.loads(json.dumps(message)),
                                                    access=SYSTEM) for _ in range(5)])
    patient_ids = {r["entry"][0]["response"]["location"].split("/")[1] for r in results}
    assert len(patient_ids) == 1
    found = await fhir.search("Observation", [("subject:Patient.identifier", "KE-HL7")])
    assert len(found) == 5
