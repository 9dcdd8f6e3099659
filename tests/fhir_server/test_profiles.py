"""Profiles in use over HTTP: a StructureDefinition written through /fhir (its snapshot
generated on write), $validate with profile and mode, and meta.profile on every write
(off | warn | enforce, per type and per organization)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from fhir_server.conformance.enforcement import ProfilePolicy
from tests.conftest import make_clinic_admin

DATA = Path(__file__).resolve().parents[1] / "data" / "conformance"
FHIR = {"Content-Type": "application/fhir+json"}
NATIONAL = "http://example.org/fhir/StructureDefinition/national-patient"


@pytest.fixture
def h(clinic_admin: dict[str, Any]) -> dict[str, str]:
    return {**clinic_admin["headers"], **FHIR}


def national_profile() -> dict[str, Any]:
    return json.loads((DATA / "national-patient.json").read_text())


def countries() -> dict[str, Any]:
    return json.loads((DATA / "countries.json").read_text())


def amina(**elements: Any) -> dict[str, Any]:
    patient = {"resourceType": "Patient",
               "identifier": [{"system": "http://example.org/fhir/sid/national-id",
                               "value": "27311409"}],
               "name": [{"family": "Odhiambo", "given": ["Amina"]}], "gender": "female",
               "birthDate": "1990-04-12", "address": [{"city": "Kisumu", "country": "KE"}]}
    patient.update(elements)
    return {k: v for k, v in patient.items() if v is not None}


async def install_national_profile(client: Any, h: dict[str, str]) -> dict[str, Any]:
    response = await client.put("/fhir/ValueSet/countries", json=countries(), headers=h)
    assert response.status_code in (200, 201), response.text
    response = await client.put("/fhir/StructureDefinition/national-patient",
                                json=national_profile(), headers=h)
    assert response.status_code in (200, 201), response.text
    return response.json()  # type: ignore[no-any-return]


def enforce(app: Any, settings: dict[str, Any]) -> None:
    """The server's profile enforcement, as HEALTHPLATFORM_FHIR_PROFILE_ENFORCEMENT."""
    app.state.services.fhir.conformance.policy = ProfilePolicy.from_settings(settings)


async def test_a_differential_written_through_fhir_gets_its_snapshot(client, h):
    stored = await install_national_profile(client, h)
    elements = {e["id"]: e for e in stored["snapshot"]["element"]}
    assert elements["Patient.identifier:nationalId.system"]["fixedUri"] == \
        "http://example.org/fhir/sid/national-id"
    assert elements["Patient.birthDate"]["min"] == 1
    assert elements["Patient.contact"]["definition"]  # the base's, carried over
    broken = national_profile()
    broken["differential"]["element"].append({"id": "Patient.gender", "path": "Patient.gender",
                                              "max": "3"})
    refused = await client.put("/fhir/StructureDefinition/national-patient", json=broken,
                               headers=h)
    assert refused.status_code == 422
    assert "max 3 is above" in refused.json()["issue"][0]["diagnostics"]


async def test_validate_with_profile_and_mode_uses_a_profile_at_once(client, h):
    await install_national_profile(client, h)
    body = {"resourceType": "Parameters", "parameter": [
        {"name": "resource", "resource": amina(birthDate=None, address=[{"country": "FR"}])},
        {"name": "profile", "valueCanonical": NATIONAL}, {"name": "mode", "valueCode": "create"}]}
    response = await client.post("/fhir/Patient/$validate", json=body, headers=h)
    assert response.status_code == 200
    issues = [(i["severity"], i["expression"][0], i["details"]["coding"][0]["code"])
              for i in response.json()["issue"] if i["severity"] == "error"]
    assert ("error", "Patient", "cardinality-min") in issues
    assert ("error", "Patient.address[0].country", "binding-required") in issues
    fine = await client.post(f"/fhir/Patient/$validate?profile={NATIONAL}", json=amina(),
                             headers=h)
    assert [i["severity"] for i in fine.json()["issue"]] == ["information"], fine.text


async def test_warn_mode_stores_and_reports_what_does_not_conform(client, h):
    await install_national_profile(client, h)
    claims = amina(meta={"profile": [NATIONAL]}, birthDate=None)
    response = await client.post("/fhir/Patient", json=claims,
                                 headers={**h, "Prefer": "return=OperationOutcome"})
    assert response.status_code == 201, response.text
    warnings = [i for i in response.json()["issue"] if i["severity"] == "warning"]
    assert warnings and warnings[0]["expression"] == ["Patient"]
    assert "birthDate" in warnings[0]["diagnostics"]


async def test_enforce_mode_refuses_with_422_naming_each_problem(app, client, h):
    await install_national_profile(client, h)
    enforce(app, {"types": {"Patient": "enforce"}})
    claims = amina(meta={"profile": [NATIONAL]}, birthDate=None)
    refused = await client.post("/fhir/Patient", json=claims, headers=h)
    assert refused.status_code == 422
    issues = refused.json()["issue"]
    assert issues[0]["code"] == "processing" and NATIONAL in issues[0]["diagnostics"]
    assert any(i["expression"] == ["Patient"] and "birthDate" in i["diagnostics"]
               for i in issues[1:])
    assert (await client.post("/fhir/Patient", json=amina(meta={"profile": [NATIONAL]}),
                              headers=h)).status_code == 201
    unknown = amina(meta={"profile": ["http://example.org/fhir/StructureDefinition/none"]})
    assert (await client.post("/fhir/Patient", json=unknown, headers=h)).status_code == 422
    # a type left at the default (warn) is stored whatever it claims
    observation = {"resourceType": "Observation", "status": "final",
                   "code": {"text": "Haemoglobin"},
                   "meta": {"profile": ["http://hl7.org/fhir/StructureDefinition/vitalsigns"]}}
    assert (await client.post("/fhir/Observation", json=observation, headers=h)
            ).status_code == 201
    enforce(app, {"default": "off", "types": {"Patient": "enforce"}})
    # and an update is checked as a create is
    created = await client.post("/fhir/Patient", json=amina(meta={"profile": [NATIONAL]}),
                                headers=h)
    changed = {**created.json(), "gender": "woman"}
    updated = await client.put(f"/fhir/Patient/{changed['id']}", json=changed, headers=h)
    assert updated.status_code in (400, 422)


async def test_an_organization_can_require_its_national_profile(app, client, h,
                                                                clinic_admin):
    await install_national_profile(client, h)
    enforce(app, {"default": "off", "organizations": {
        clinic_admin["org_id"]: {"default": "enforce", "require": {"Patient": [NATIONAL]}}}})
    # claims nothing, owned by the clinic: the national profile is required anyway
    refused = await client.post("/fhir/Patient", json=amina(identifier=None), headers=h)
    assert refused.status_code == 422, refused.text
    assert any("nationalId" in i["diagnostics"] for i in refused.json()["issue"])
    assert (await client.post("/fhir/Patient", json=amina(), headers=h)).status_code == 201
    # another organization's writes are not held to it
    other = await make_clinic_admin(client, name="Mombasa Road Clinic", first_name="Baraka",
                                    last_name="Mwangi")
    elsewhere = await client.post("/fhir/Patient", json=amina(identifier=None),
                                  headers={**other["headers"], **FHIR})
    assert elsewhere.status_code == 201, elsewhere.text


def test_policy_resolution_is_most_specific_first_and_strictest_across_owners():
    policy = ProfilePolicy.from_settings({
        "default": "off", "types": {"Observation": "warn"},
        "require": {"Patient": ["http://example.org/a"]},
        "organizations": {"clinic-a": {"default": "warn",
                                       "types": {"Patient": "enforce"},
                                       "require": {"Patient": ["http://example.org/b"]}},
                          "clinic-b": {"types": {"Observation": "off"}}}})
    assert policy.rule_for("Patient", []) == ("off", ("http://example.org/a",))
    assert policy.rule_for("Observation", []) == ("warn", ())
    assert policy.rule_for("Patient", ["clinic-a"]) == (
        "enforce", ("http://example.org/a", "http://example.org/b"))
    assert policy.rule_for("Observation", ["clinic-b"]) == ("off", ())
    assert policy.rule_for("Observation", ["clinic-a", "clinic-b"])[0] == "warn"
    with pytest.raises(ValueError, match="must be one of off, warn, enforce"):
        ProfilePolicy.from_settings({"types": {"Patient": "strict"}})
    with pytest.raises(ValueError, match="unknown keys"):
        ProfilePolicy.from_settings({"defaults": "warn"})
