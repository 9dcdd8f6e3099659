"""Conditional create, update, patch and delete (R4 3.1.0.4.3, 3.1.0.7.1, 3.1.0.8.1),
their safety under concurrent requests, and the FhirService search conveniences."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import pytest

from fhir_server.access import SYSTEM
from fhir_server.caller import CallerFhir
from fhir_server.service import FhirService
from fhir_server.store.sqlite import SQLiteStore
from tests.fhir_server.clinical_data import MRN

FHIR = {"Content-Type": "application/fhir+json"}


def patient(mrn: str, family: str = "Odhiambo", **extra: Any) -> dict[str, Any]:
    return {"resourceType": "Patient", "identifier": [{"system": MRN, "value": mrn}],
            "name": [{"family": family, "given": ["Amina"]}], "gender": "female",
            "birthDate": "1988-04-12", **extra}


@pytest.fixture
def h(clinic_admin: dict[str, Any]) -> dict[str, str]:
    return {**clinic_admin["headers"], **FHIR}


async def count(client, h, query: str) -> int:
    bundle = (await client.get(f"/fhir/Patient?{query}&_total=accurate", headers=h)).json()
    return int(bundle["total"])


# --- conditional create ------------------------------------------------------------------------

async def test_conditional_create_creates_once_then_returns_the_match(client, h):
    condition = {"If-None-Exist": f"identifier={MRN}|KE-1001"}
    first = await client.post("/fhir/Patient", json=patient("KE-1001"), headers={**h, **condition})
    assert first.status_code == 201
    again = await client.post("/fhir/Patient", json=patient("KE-1001", family="Changed"),
                              headers={**h, **condition})
    assert again.status_code == 200
    assert again.json()["id"] == first.json()["id"]
    assert again.json()["name"][0]["family"] == "Odhiambo"  # nothing was written
    assert again.headers["location"].endswith(f"{first.json()['id']}/_history/1")
    assert await count(client, h, f"identifier={MRN}|KE-1001") == 1


async def test_conditional_create_with_several_matches_is_412(client, h):
    for _ in range(2):
        await client.post("/fhir/Patient", json=patient("KE-1002"), headers=h)
    response = await client.post("/fhir/Patient", json=patient("KE-1002"),
                                 headers={**h, "If-None-Exist": "identifier=KE-1002"})
    assert response.status_code == 412
    assert response.json()["issue"][0]["code"] == "multiple-matches"


async def test_conditional_create_refuses_unknown_criteria(client, h):
    response = await client.post("/fhir/Patient", json=patient("KE-1003"),
                                 headers={**h, "If-None-Exist": "shoe-size=42"})
    assert response.status_code == 400


async def test_identical_conditional_creates_at_once_create_one_resource(client, h):
    condition = {"If-None-Exist": f"identifier={MRN}|KE-RACE"}
    responses = await asyncio.gather(*[
        client.post("/fhir/Patient", json=patient("KE-RACE"), headers={**h, **condition})
        for _ in range(12)])
    assert sorted(r.status_code for r in responses) == [200] * 11 + [201]
    assert len({r.json()["id"] for r in responses}) == 1
    assert await count(client, h, f"identifier={MRN}|KE-RACE") == 1


def test_conditional_creates_from_two_processes_create_one_resource(tmp_path: Path):
    """Two store connections (as two server processes would have) race on one file:
    the condition is re-checked inside each BEGIN IMMEDIATE transaction."""
    path = tmp_path / "shared.db"
    results: list[bool] = []
    barrier = threading.Barrier(2, timeout=30)  # a worker that died must not hang the run

    def worker() -> None:
        async def run() -> None:
            store = SQLiteStore(path)
            await store.open()
            fhir = CallerFhir(FhirService(store), SYSTEM)
            barrier.wait()
            for _ in range(20):
                _stored, created = await fhir.create(
                    patient("KE-PROC"), if_none_exist=[("identifier", f"{MRN}|KE-PROC")])
                results.append(created)
            await store.close()
        asyncio.run(run())

    threads = [threading.Thread(target=worker) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert results.count(True) == 1 and len(results) == 40


# --- conditional update ------------------------------------------------------------------------

async def test_conditional_update_creates_updates_and_refuses(client, h):
    url = f"/fhir/Patient?identifier={MRN}|KE-2001"
    created = await client.put(url, json=patient("KE-2001"), headers=h)
    assert created.status_code == 201
    patient_id = created.json()["id"]
    updated = await client.put(url, json=patient("KE-2001", gender="other"), headers=h)
    assert updated.status_code == 200
    assert updated.json()["id"] == patient_id and updated.json()["meta"]["versionId"] == "2"
    wrong_id = await client.put(url, json={**patient("KE-2001"), "id": "someone-else"},
                                headers=h)
    assert wrong_id.status_code == 400
    stale = await client.put(url, json=patient("KE-2001"), headers={**h, "If-Match": 'W/"1"'})
    assert stale.status_code == 412
    await client.post("/fhir/Patient", json=patient("KE-2001"), headers=h)
    several = await client.put(url, json=patient("KE-2001"), headers=h)
    assert several.status_code == 412


async def test_conditional_update_without_match_keeps_the_body_id(client, h):
    response = await client.put(f"/fhir/Patient?identifier={MRN}|KE-2002",
                                json={**patient("KE-2002"), "id": "ke-2002"}, headers=h)
    assert response.status_code == 201 and response.json()["id"] == "ke-2002"


# --- conditional patch and delete -----------------------------------------------------------------

async def test_conditional_patch(client, h):
    await client.post("/fhir/Patient", json=patient("KE-3001"), headers=h)
    patch = [{"op": "replace", "path": "/gender", "value": "unknown"}]
    headers = {**h, "Content-Type": "application/json-patch+json"}
    response = await client.patch("/fhir/Patient?identifier=KE-3001", json=patch,
                                  headers=headers)
    assert response.status_code == 200 and response.json()["gender"] == "unknown"
    missing = await client.patch("/fhir/Patient?identifier=KE-NONE", json=patch, headers=headers)
    assert missing.status_code == 404


async def test_conditional_delete_removes_every_match(client, h):
    for family in ("Mensah", "Mensah", "Okafor"):
        await client.post("/fhir/Patient", json=patient("KE-4001", family=family), headers=h)
    deleted = await client.delete("/fhir/Patient?family=mensah", headers=h)
    assert deleted.status_code == 200
    assert "Deleted 2" in deleted.json()["issue"][0]["diagnostics"]
    assert await count(client, h, "identifier=KE-4001") == 1
    nothing = await client.delete("/fhir/Patient?family=mensah", headers=h)
    assert nothing.status_code == 200
    assert "nothing was deleted" in nothing.json()["issue"][0]["diagnostics"]
    refused = await client.delete("/fhir/Patient?shoe-size=42", headers=h)
    assert refused.status_code == 400


# --- the FhirService conveniences other packages call --------------------------------------------

async def test_service_search_finds_a_patient_by_identifier(app, client, h):
    await client.post("/fhir/Patient", json=patient("KE-5001"), headers=h)
    fhir: FhirService = app.state.services.fhir
    found = await fhir.search("Patient", [("identifier", f"{MRN}|KE-5001")])
    assert [p["identifier"][0]["value"] for p in found] == ["KE-5001"]
    assert found[0]["resourceType"] == "Patient" and found[0]["meta"]["versionId"] == "1"
    assert await fhir.search("Patient", [("identifier", f"{MRN}|KE-NOBODY")]) == []
