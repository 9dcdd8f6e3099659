"""Custom SearchParameter resources take effect after ``healthplatform reindex``, which
rebuilds every resource's index rows (with a progress bar) and is followed by running
servers."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from typer.testing import CliRunner

from platform_api.cli import app as cli

FHIR = {"Content-Type": "application/fhir+json"}
MAIDEN_NAME = "http://hl7.org/fhir/StructureDefinition/patient-mothersMaidenName"
SEARCH_PARAMETER = {
    "resourceType": "SearchParameter", "url": "http://example.org/fhir/SearchParameter/mmn",
    "name": "MothersMaidenName", "status": "active", "code": "mothers-maiden-name",
    "base": ["Patient"], "type": "string",
    "description": "Search by the mother's maiden name",
    "expression": f"Patient.extension('{MAIDEN_NAME}').value",
}


def patient(family: str, maiden_name: str) -> dict[str, Any]:
    return {"resourceType": "Patient", "name": [{"family": family}],
            "extension": [{"url": MAIDEN_NAME, "valueString": maiden_name}]}


@pytest.fixture
def h(clinic_admin: dict[str, Any]) -> dict[str, str]:
    return {**clinic_admin["headers"], **FHIR}


async def matches(client, h, query: str) -> tuple[list[str], bool]:
    bundle = (await client.get(f"/fhir/Patient?{query}", headers=h)).json()
    families = [e["resource"]["name"][0]["family"] for e in bundle["entry"]
                if e["search"]["mode"] == "match"]
    ignored = any(e["search"]["mode"] == "outcome" for e in bundle["entry"])
    return sorted(families), ignored


async def test_custom_search_parameter_works_after_reindex(app, client, h, settings,
                                                            monkeypatch):
    for family, maiden in (("Odhiambo", "Wambui"), ("Mensah", "Asante")):
        assert (await client.post("/fhir/Patient", json=patient(family, maiden),
                                  headers=h)).status_code == 201
    assert (await client.post("/fhir/SearchParameter", json=SEARCH_PARAMETER,
                              headers=h)).status_code == 201
    before, ignored = await matches(client, h, "mothers-maiden-name=wambui")
    assert ignored and before == ["Mensah", "Odhiambo"]  # not in effect yet

    monkeypatch.setenv("HEALTHPLATFORM_DATA_DIR", str(settings.data_dir))
    monkeypatch.setenv("HEALTHPLATFORM_STORE", settings.store_url)  # whichever adapter
    result = await asyncio.to_thread(CliRunner().invoke, cli, ["reindex"])
    assert result.exit_code == 0, result.output
    assert "Reindexed" in result.output

    await app.state.services.fhir.refresh_registry(force=True)
    after, ignored = await matches(client, h, "mothers-maiden-name=wambui")
    assert not ignored and after == ["Odhiambo"]
    # New writes are indexed with it too.
    await client.post("/fhir/Patient", json=patient("Okafor", "Wambugu"), headers=h)
    assert (await matches(client, h, "mothers-maiden-name=wambu"))[0] == ["Odhiambo", "Okafor"]
    statement = (await client.get("/fhir/metadata")).json()
    patient_params = next(r for r in statement["rest"][0]["resource"]
                          if r["type"] == "Patient")["searchParam"]
    assert "mothers-maiden-name" in {p["name"] for p in patient_params}


async def test_retiring_the_parameter_and_reindexing_removes_it(app, client, h, settings,
                                                                monkeypatch):
    created = (await client.post("/fhir/SearchParameter", json=SEARCH_PARAMETER,
                                 headers=h)).json()
    await client.post("/fhir/Patient", json=patient("Odhiambo", "Wambui"), headers=h)
    monkeypatch.setenv("HEALTHPLATFORM_DATA_DIR", str(settings.data_dir))
    monkeypatch.setenv("HEALTHPLATFORM_STORE", settings.store_url)  # whichever adapter
    await asyncio.to_thread(CliRunner().invoke, cli, ["reindex"])
    await client.put(f"/fhir/SearchParameter/{created['id']}",
                     json={**created, "status": "retired"}, headers=h)
    await asyncio.to_thread(CliRunner().invoke, cli, ["reindex"])
    await app.state.services.fhir.refresh_registry(force=True)
    assert (await matches(client, h, "mothers-maiden-name=wambui"))[1] is True
