"""The policy's workflow actions and its one named elevation, through the real app: a
refused action and every elevation land in the clinical audit trail; a refusal names only
what its reader may see; the rule table renders for the README."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from platform_api.envelope import ApiError
from platform_api.policy import API_DOOR, Target
from platform_api.policy.actions import render_actions, rules
from platform_api.policy.roles import ORG_DOCTOR
from tests.conftest import add_member, make_clinic_admin, register_and_login

JSON = dict[str, Any]
FHIR = {"Content-Type": "application/fhir+json"}


def services(app: Any) -> Any:
    return app.state.services


async def flushed_trail(app: Any, client: httpx.AsyncClient, headers: dict[str, str],
                        **query: str) -> list[JSON]:
    await services(app).extras["sessions.clinical_audit"].flush()
    response = await client.get("/api/clinical/audit/search", params=query, headers=headers)
    assert response.status_code == 200, response.text
    return response.json()["data"]  # type: ignore[no-any-return]


async def principal_of(app: Any, token_headers: dict[str, str]) -> Any:
    auth = services(app).auth
    return await auth.authenticate(token_headers["Authorization"].removeprefix("Bearer "))


@pytest.fixture
async def clinics(app: Any, client: httpx.AsyncClient) -> JSON:
    kibera = await make_clinic_admin(client)
    mathare = await make_clinic_admin(client, name="Mathare North Health Centre",
                                      first_name="Otieno", last_name="Ouma")
    doctor = await register_and_login(client, first_name="Wanjiru", last_name="Kamau")
    await add_member(app, kibera["org_id"], doctor, ORG_DOCTOR)
    made = await client.post(
        f"/api/organizations/{mathare['org_id']}/patients", headers=mathare["headers"],
        json={"first_name": "Chebet", "last_name": "Kiprono", "date_of_birth": "1979-02-03",
              "gender": "female", "mrn": "MNH-0001"})
    assert made.status_code == 201, made.text
    return {"kibera": kibera, "mathare": mathare, "doctor": doctor,
            "mathare_patient": made.json()["data"]["id"]}


async def test_a_refused_workflow_action_is_a_403_with_its_rule_and_is_audited(app, clinics):
    policy = services(app).policy
    doctor = await principal_of(app, clinics["doctor"]["headers"])
    access = await policy.access(doctor, API_DOOR)
    kibera = clinics["kibera"]["org_id"]
    # A member works in the organization; only its ORG:ADMIN manages it.
    assert policy.decide(access, "organization.work-in", Target.of(kibera)) is not None
    with pytest.raises(ApiError) as refused:
        policy.authorize(access, "organization.manage", Target.of(kibera))
    assert (refused.value.status, refused.value.code) == (403, "FORBIDDEN")
    admin = await policy.access(await principal_of(app, clinics["kibera"]["headers"]),
                                API_DOOR)
    assert policy.decide(admin, "organization.manage", Target.of(kibera)) is not None
    # Nothing in another organization.
    mathare = clinics["mathare"]["org_id"]
    assert policy.decide(admin, "organization.work-in", Target.of(mathare)) is None
    await services(app).extras["sessions.clinical_audit"].flush()
    found = await services(app).fhir.search("AuditEvent", [("outcome", "4")])
    refusals = [e for e in found if e["subtype"][0]["code"] == "workflow:organization.manage"]
    assert refusals and refusals[0]["agent"][0]["who"]["identifier"]["value"] == \
        clinics["doctor"]["user"]["id"]
    with pytest.raises(KeyError):
        policy.decide(access, "organization.manaeg", Target.of(kibera))  # deny a typo loudly


async def test_an_elevation_is_recorded_with_its_caller_and_reason(app, clinics):
    policy = services(app).policy
    doctor = await principal_of(app, clinics["doctor"]["headers"])
    system = policy.elevate("test: read a record the doctor may not", doctor)
    assert await system.find_json("Patient", clinics["mathare_patient"]) is not None
    with pytest.raises(ValueError):
        policy.elevate("no reason given")
    await services(app).extras["sessions.clinical_audit"].flush()
    found = await services(app).fhir.search("AuditEvent", [("subtype", "elevation")])
    # (the components that elevate once when the app starts are recorded too, as the
    # platform's own)
    for_doctor = [e for e in found if e["agent"][0]["who"].get("identifier", {}).get(
        "value") == clinics["doctor"]["user"]["id"]]
    assert [e["outcomeDesc"] for e in for_doctor] == ["test: read a record the doctor may not"]


async def test_a_refusal_names_no_patient_its_reader_may_not_see(app, client, clinics):
    """Result 6 of issue 31: a clinic's refused write about another clinic's patient is in
    its own clinic's audit trail without that patient's id."""
    other = clinics["mathare_patient"]
    refused = await client.post("/fhir/Observation", headers={
        **clinics["doctor"]["headers"], **FHIR}, json={
        "resourceType": "Observation", "status": "final",
        "code": {"coding": [{"system": "http://loinc.org", "code": "8867-4"}]},
        "subject": {"reference": f"Patient/{other}"}})
    assert refused.status_code == 403
    assert other not in refused.text
    trail = await flushed_trail(app, client, clinics["kibera"]["headers"],
                                outcome="minor_failure")
    assert trail, "the refusal is recorded for the clinic that made it"
    assert other not in str(trail)
    # The other clinic's own trail still shows reads of its patient (its own data).
    assert await flushed_trail(app, client, clinics["mathare"]["headers"]) is not None


def test_every_rule_says_what_it_is_and_the_table_renders():
    assert all(rule.summary and rule.relations for rule in rules().values())
    table = render_actions()
    assert "`organization.manage`" in table and "`ORG:ADMIN` of the organization" in table


def test_the_readme_shows_the_rules_as_they_are():
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    shown = readme.split("<!-- workflow-actions -->")[1].split("<!-- /workflow-actions -->")[0]
    assert shown.strip() == render_actions(), "run scripts/render_workflow_actions.py"
