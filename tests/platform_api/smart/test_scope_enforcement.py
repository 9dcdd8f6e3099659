"""SMART scopes on every /fhir interaction (platform_api.policy.smart): they narrow what
the user's relations allow and never widen it; patient/ scopes confine to the launch
patient's compartment; refusals name the scope."""

from __future__ import annotations

from typing import Any

import httpx

from tests.conftest import register_and_login
from tests.platform_api.smart.support import CATEGORY, LOINC, Clinic, bearer, smart_token

JSON = dict[str, Any]


async def token_for(client: httpx.AsyncClient, app: JSON, clinic: Clinic, scope: str,
                    patient: str | None = None, email: str | None = None) -> dict[str, str]:
    body = await smart_token(client, app["client_id"], scope,
                             email or clinic.doctor["user"]["email"], patient)
    return bearer(body["access_token"])


def ids(bundle: JSON, kind: str | None = None) -> set[str]:
    return {e["resource"]["id"] for e in bundle.get("entry", [])
            if kind is None or e["resource"]["resourceType"] == kind}


async def test_patient_scopes_search_only_the_launch_patients_compartment(
        client: httpx.AsyncClient, clinic: Clinic, public_app: JSON) -> None:
    headers = await token_for(client, public_app, clinic, "patient/*.rs", clinic.amina)
    everything = (await client.get("/fhir/Observation", headers=headers)).json()
    assert ids(everything) == set(clinic.observations[clinic.amina])
    other = (await client.get(f"/fhir/Observation?subject=Patient/{clinic.baraka}",
                              headers=headers)).json()
    assert other.get("total", 0) == 0 and ids(other) == set()
    patients = (await client.get("/fhir/Patient", headers=headers)).json()
    assert ids(patients) == {clinic.amina}


async def test_includes_and_revincludes_cannot_leave_the_compartment(
        client: httpx.AsyncClient, clinic: Clinic, public_app: JSON) -> None:
    headers = await token_for(client, public_app, clinic, "patient/*.rs", clinic.amina)
    included = (await client.get("/fhir/Observation?_include=Observation:subject",
                                 headers=headers)).json()
    assert ids(included, "Patient") == {clinic.amina}
    reverse = (await client.get(
        f"/fhir/Patient?_id={clinic.amina},{clinic.baraka}&_revinclude=Observation:subject",
        headers=headers)).json()
    assert ids(reverse, "Patient") == {clinic.amina}
    assert ids(reverse, "Observation") == set(clinic.observations[clinic.amina])
    chained = (await client.get("/fhir/Observation?subject:Patient.family=Kiptoo",
                                headers=headers)).json()
    assert ids(chained) == set()


async def test_reading_another_patients_record_is_403_naming_the_compartment(
        client: httpx.AsyncClient, clinic: Clinic, public_app: JSON) -> None:
    headers = await token_for(client, public_app, clinic, "patient/*.rs", clinic.amina)
    baraka_heart_rate = clinic.observations[clinic.baraka][0]
    refused = await client.get(f"/fhir/Observation/{baraka_heart_rate}", headers=headers)
    assert refused.status_code == 403
    issue = refused.json()["issue"][0]
    assert issue["code"] == "forbidden"
    assert f"compartment of Patient/{clinic.amina}" in issue["diagnostics"]
    history = await client.get(f"/fhir/Observation/{baraka_heart_rate}/_history",
                               headers=headers)
    assert history.status_code == 403


async def test_a_granular_category_scope_admits_only_that_category(
        client: httpx.AsyncClient, clinic: Clinic, public_app: JSON) -> None:
    scope = f"patient/Observation.rs?category={CATEGORY}|laboratory patient/Patient.r"
    headers = await token_for(client, public_app, clinic, scope, clinic.amina)
    heart_rate, glucose = clinic.observations[clinic.amina]
    found = (await client.get("/fhir/Observation", headers=headers)).json()
    assert ids(found) == {glucose}
    assert (await client.get(f"/fhir/Observation/{glucose}", headers=headers)
            ).status_code == 200
    assert (await client.get(f"/fhir/Observation/{heart_rate}", headers=headers)
            ).status_code == 403


async def test_read_and_search_are_separate_permissions(
        client: httpx.AsyncClient, clinic: Clinic, public_app: JSON) -> None:
    heart_rate = clinic.observations[clinic.amina][0]
    read_only = await token_for(client, public_app, clinic,
                                "patient/Observation.r patient/Patient.r", clinic.amina)
    assert (await client.get(f"/fhir/Observation/{heart_rate}", headers=read_only)
            ).status_code == 200
    search = await client.get("/fhir/Observation", headers=read_only)
    assert search.status_code == 403
    assert "patient/Observation.s" in search.json()["issue"][0]["diagnostics"]
    history = await client.get("/fhir/Observation/_history", headers=read_only)
    assert history.status_code == 403
    search_only = await token_for(client, public_app, clinic, "patient/Observation.s",
                                  clinic.amina)
    assert (await client.get("/fhir/Observation", headers=search_only)).status_code == 200
    read = await client.get(f"/fhir/Observation/{heart_rate}", headers=search_only)
    assert read.status_code == 403
    assert "patient/Observation.r" in read.json()["issue"][0]["diagnostics"]


async def test_a_type_outside_the_scopes_is_403_naming_the_missing_scope(
        client: httpx.AsyncClient, clinic: Clinic, public_app: JSON) -> None:
    headers = await token_for(client, public_app, clinic, "patient/Observation.rs",
                              clinic.amina)
    refused = await client.get("/fhir/Condition", headers=headers)
    assert refused.status_code == 403
    diagnostics = refused.json()["issue"][0]["diagnostics"]
    assert "patient/Condition.s" in diagnostics and "user/Condition.s" in diagnostics


async def test_writes_need_their_letter_and_stay_in_the_compartment(
        client: httpx.AsyncClient, clinic: Clinic, public_app: JSON) -> None:
    headers = await token_for(client, public_app, clinic,
                              "patient/Observation.crs patient/Patient.r", clinic.amina)
    body = {"resourceType": "Observation", "status": "final",
            "code": {"coding": [{"system": LOINC, "code": "29463-7",
                                 "display": "Body weight"}]},
            "valueQuantity": {"value": 61.5, "unit": "kg"}}
    mine = await client.post("/fhir/Observation", headers=headers, json={
        **body, "subject": {"reference": f"Patient/{clinic.amina}"}})
    assert mine.status_code == 201, mine.text
    theirs = await client.post("/fhir/Observation", headers=headers, json={
        **body, "subject": {"reference": f"Patient/{clinic.baraka}"}})
    assert theirs.status_code == 403
    update = await client.put(f"/fhir/Observation/{mine.json()['id']}", headers=headers,
                              json={**mine.json(), "status": "amended"})
    assert update.status_code == 403
    assert "patient/Observation.u" in update.json()["issue"][0]["diagnostics"]


async def test_a_transaction_entry_outside_the_scopes_fails_the_transaction(
        client: httpx.AsyncClient, clinic: Clinic, public_app: JSON) -> None:
    headers = await token_for(client, public_app, clinic,
                              "patient/Observation.crs patient/Patient.r", clinic.amina)
    observation = {"resourceType": "Observation", "status": "final",
                   "code": {"coding": [{"system": LOINC, "code": "8310-5",
                                        "display": "Body temperature"}]},
                   "subject": {"reference": f"Patient/{clinic.amina}"},
                   "valueQuantity": {"value": 37.2, "unit": "Cel"}}
    condition = {"resourceType": "Condition",
                 "code": {"coding": [{"system": "http://hl7.org/fhir/sid/icd-10",
                                      "code": "B54", "display": "Malaria"}]},
                 "subject": {"reference": f"Patient/{clinic.amina}"}}
    bundle = {"resourceType": "Bundle", "type": "transaction", "entry": [
        {"resource": observation, "request": {"method": "POST", "url": "Observation"}},
        {"resource": condition, "request": {"method": "POST", "url": "Condition"}}]}
    refused = await client.post("/fhir", headers=headers, json=bundle)
    assert refused.status_code == 403, refused.text
    issue = refused.json()["issue"][0]
    assert "patient/Condition.c" in issue["diagnostics"]
    assert "Bundle.entry[1]" in str(issue.get("expression"))
    count = (await client.get("/fhir/Observation?code=8310-5", headers=clinic.admin[
        "headers"])).json()
    assert count.get("total", 0) == 0  # nothing of it was stored
    read_entry = {"resourceType": "Bundle", "type": "batch", "entry": [
        {"request": {"method": "GET", "url": f"Patient/{clinic.baraka}"}},
        {"request": {"method": "GET", "url": f"Patient/{clinic.amina}"}}]}
    batch = (await client.post("/fhir", headers=headers, json=read_entry)).json()
    assert [e["response"]["status"][:3] for e in batch["entry"]] == ["403", "200"]


async def test_user_scopes_reach_only_what_the_user_may_see(
        client: httpx.AsyncClient, clinic: Clinic, public_app: JSON) -> None:
    doctor = await token_for(client, public_app, clinic, "user/Patient.rs user/Observation.rs")
    assert ids((await client.get("/fhir/Patient", headers=doctor)).json()) == {
        clinic.amina, clinic.baraka}
    stranger = await register_and_login(client, first_name="Halima", last_name="Njeri")
    outsider = await token_for(client, public_app, clinic, "user/Patient.rs",
                               email=stranger["user"]["email"])
    assert ids((await client.get("/fhir/Patient", headers=outsider)).json()) == set()
    assert (await client.get(f"/fhir/Patient/{clinic.amina}", headers=outsider)
            ).status_code == 403


async def test_a_platform_administrators_app_gets_no_administrator_powers(
        client: httpx.AsyncClient, clinic: Clinic, public_app: JSON) -> None:
    admin = await token_for(client, public_app, clinic, "user/*.rs",
                            email=clinic.platform_admin["user"]["email"])
    assert (await client.get(f"/fhir/Patient/{clinic.amina}", headers=admin)
            ).status_code == 403
    assert (await client.get(f"/fhir/Patient/{clinic.amina}",
                             headers=clinic.platform_admin["headers"])).status_code == 200


async def test_missing_or_invalid_tokens_are_401_with_a_bearer_challenge(
        client: httpx.AsyncClient) -> None:
    for headers in ({}, bearer("v4.public.not-a-token")):
        response = await client.get("/fhir/Patient", headers=headers)
        assert response.status_code == 401
        assert response.headers["www-authenticate"].startswith("Bearer")
        assert response.json()["resourceType"] == "OperationOutcome"


async def test_a_smart_token_reaches_only_fhir(
        client: httpx.AsyncClient, clinic: Clinic, public_app: JSON) -> None:
    headers = await token_for(client, public_app, clinic, "user/*.cruds")
    refused = await client.get(f"/api/organizations/{clinic.org_id}", headers=headers)
    assert refused.status_code == 403
    assert refused.json()["error"]["code"] == "INSUFFICIENT_SCOPE"


async def test_platform_tokens_keep_working_on_fhir_as_their_roles_allow(
        client: httpx.AsyncClient, clinic: Clinic) -> None:
    for who in (clinic.admin, clinic.doctor):
        found = (await client.get("/fhir/Patient", headers=who["headers"])).json()
        assert ids(found) == {clinic.amina, clinic.baraka}
