"""The access policy, role by role, through /fhir and /api: what each caller may read,
search and write, in two organizations that must never see each other's patients.

The world: Kibera Community Clinic (its administrator, a doctor, a lab technician, a
billing clerk) and Mathare North Health Centre (its administrator); each registered a
patient with an observation; Kibera's billing clerk filed a claim; a patient account
(Baraka) whose record Kibera keeps; a stranger with no relation to anything; a platform
administrator."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from platform_api.policy.roles import ORG_BILLING, ORG_DOCTOR, ORG_LAB
from tests.conftest import add_member, make_admin, make_clinic_admin, register_and_login

FHIR = {"Content-Type": "application/fhir+json"}
LOINC = "http://loinc.org"


@dataclass
class World:
    client: httpx.AsyncClient
    app: Any
    people: dict[str, dict[str, Any]]
    ids: dict[str, str]

    def h(self, who: str) -> dict[str, str]:
        return {**self.people[who]["headers"], **FHIR}

    async def get(self, who: str, path: str, **params: str) -> httpx.Response:
        return await self.client.get(path, params=params, headers=self.h(who))

    async def found(self, who: str, path: str, **params: str) -> set[str]:
        """Short names of the resources a search returns (matches and includes)."""
        response = await self.get(who, path, **params)
        assert response.status_code == 200, response.text
        names = {v: k for k, v in self.ids.items()}
        return {names.get(e["resource"]["id"], e["resource"]["id"])
                for e in response.json().get("entry", [])
                if e.get("search", {}).get("mode") in ("match", "include")}


def heart_rate(patient_id: str, value: int) -> dict[str, Any]:
    return {"resourceType": "Observation", "status": "final",
            "code": {"coding": [{"system": LOINC, "code": "8867-4", "display": "Heart rate"}]},
            "subject": {"reference": f"Patient/{patient_id}"},
            "valueQuantity": {"value": value, "unit": "/min", "system": "http://unitsofmeasure.org",
                              "code": "/min"}}


async def _created(response: httpx.Response) -> str:
    assert response.status_code == 201, response.text
    body = response.json()
    return str(body["data"]["id"] if "data" in body else body["id"])


@pytest.fixture
async def world(app: Any, client: httpx.AsyncClient) -> World:
    people: dict[str, dict[str, Any]] = {}
    people["kibera_admin"] = await make_clinic_admin(client)
    people["mathare_admin"] = await make_clinic_admin(
        client, name="Mathare North Health Centre", first_name="Otieno", last_name="Ouma")
    kibera = people["kibera_admin"]["org_id"]
    for who, role in (("doctor", ORG_DOCTOR), ("lab", ORG_LAB), ("billing", ORG_BILLING)):
        people[who] = await register_and_login(client, first_name=who.title(),
                                               last_name="Kamau")
        await add_member(app, kibera, people[who], role)
    people["baraka"] = await register_and_login(client, first_name="Baraka",
                                                last_name="Mwangi")
    people["stranger"] = await register_and_login(client, first_name="Zawadi",
                                                  last_name="Njeri")
    people["platform_admin"] = await make_admin(app, client)
    w = World(client, app, people, {})
    ids = w.ids
    ids["kibera_patient"] = await _created(await client.post(
        f"/api/organizations/{kibera}/patients", headers=people["kibera_admin"]["headers"],
        json={"first_name": "Amina", "last_name": "Odhiambo", "date_of_birth": "1988-04-12",
              "gender": "female", "mrn": "KCC-0001"}))
    ids["mathare_patient"] = await _created(await client.post(
        f"/api/organizations/{people['mathare_admin']['org_id']}/patients",
        headers=people["mathare_admin"]["headers"],
        json={"first_name": "Chebet", "last_name": "Kiprono", "date_of_birth": "1979-02-03",
              "gender": "female", "mrn": "MNH-0001"}))
    # Kibera keeps Baraka's record, and knows his account: the record is his to see.
    baraka = {"resourceType": "Patient", "name": [{"family": "Mwangi", "given": ["Baraka"]}],
              "identifier": [{"system": "urn:healthplatform:user",
                              "value": people["baraka"]["user"]["id"]}]}
    ids["baraka_patient"] = await _created(await client.post(
        "/fhir/Patient", json=baraka, headers=w.h("kibera_admin")))
    ids["kibera_obs"] = await _created(await client.post(
        "/fhir/Observation", json=heart_rate(ids["kibera_patient"], 72), headers=w.h("doctor")))
    ids["baraka_obs"] = await _created(await client.post(
        "/fhir/Observation", json=heart_rate(ids["baraka_patient"], 64), headers=w.h("doctor")))
    ids["mathare_obs"] = await _created(await client.post(
        "/fhir/Observation", json=heart_rate(ids["mathare_patient"], 88),
        headers=w.h("mathare_admin")))
    claim = {"resourceType": "Claim", "status": "active", "use": "claim",
             "type": {"coding": [{"system": "http://terminology.hl7.org/CodeSystem/claim-type",
                                  "code": "professional"}]},
             "patient": {"reference": f"Patient/{ids['kibera_patient']}"},
             "created": "2026-11-20", "provider": {"reference": f"Organization/{kibera}"},
             "priority": {"coding": [{"code": "normal"}]},
             "insurance": [{"sequence": 1, "focal": True,
                            "coverage": {"display": "NHIF"}}]}
    ids["kibera_claim"] = await _created(await client.post("/fhir/Claim", json=claim,
                                                           headers=w.h("billing")))
    return w


# -- the defect this fixes -------------------------------------------------------------------
async def test_a_patient_account_cannot_read_or_find_another_organizations_patient(world):
    other = world.ids["mathare_patient"]
    for path in (f"/fhir/Patient/{other}", f"/api/patients/{other}"):
        response = await world.get("stranger", path)
        assert response.status_code == 403, path
    assert await world.found("stranger", "/fhir/Patient") == set()
    assert await world.found("stranger", "/fhir/Observation") == set()
    refused = await world.get("stranger", f"/fhir/Patient/{other}")
    assert refused.json()["issue"][0]["code"] == "forbidden"


# -- reads, role by role ----------------------------------------------------------------------
READS = {  # who → resource → status of a read on /fhir
    "doctor": {"kibera_patient": 200, "kibera_obs": 200, "kibera_claim": 200,
               "mathare_patient": 403, "mathare_obs": 403},
    "lab": {"kibera_patient": 200, "kibera_obs": 200, "kibera_claim": 403,
            "mathare_obs": 403},
    "billing": {"kibera_patient": 200, "kibera_obs": 403, "kibera_claim": 200,
                "mathare_patient": 403},
    "mathare_admin": {"kibera_patient": 403, "kibera_obs": 403, "kibera_claim": 403,
                      "mathare_patient": 200, "mathare_obs": 200},
    "baraka": {"baraka_patient": 200, "baraka_obs": 200, "kibera_patient": 403,
               "kibera_obs": 403},
    "stranger": {"kibera_patient": 403, "baraka_obs": 403},
    "platform_admin": {"kibera_patient": 200, "mathare_obs": 200, "kibera_claim": 200},
}
TYPES = {"kibera_patient": "Patient", "mathare_patient": "Patient", "baraka_patient": "Patient",
         "kibera_obs": "Observation", "mathare_obs": "Observation",
         "baraka_obs": "Observation", "kibera_claim": "Claim"}


@pytest.mark.parametrize("who", sorted(READS))
async def test_each_role_reads_what_it_may_and_is_refused_the_rest(world, who):
    for name, expected in READS[who].items():
        response = await world.get(who, f"/fhir/{TYPES[name]}/{world.ids[name]}")
        assert response.status_code == expected, (who, name, response.text)


# who → type → what a search of the type returns (None: 403, a type no relation of the
# caller can ever reach; a type only their own patient record could hold answers empty)
SEARCHES = {
    "doctor": {"Patient": {"kibera_patient", "baraka_patient"},
               "Observation": {"kibera_obs", "baraka_obs"}, "AuditEvent": None},
    "billing": {"Patient": {"kibera_patient", "baraka_patient"}, "Observation": set(),
                "Claim": {"kibera_claim"}},
    "mathare_admin": {"Patient": {"mathare_patient"}, "Observation": {"mathare_obs"},
                      "Claim": set()},
    "baraka": {"Patient": {"baraka_patient"}, "Observation": {"baraka_obs"}},
    "platform_admin": {"Observation": {"kibera_obs", "baraka_obs", "mathare_obs"}},
}


@pytest.mark.parametrize("who", sorted(SEARCHES))
async def test_each_role_searches_only_what_it_may_see(world, who):
    for resource_type, expected in SEARCHES[who].items():
        if expected is None:
            response = await world.get(who, f"/fhir/{resource_type}")
            assert response.status_code == 403, (who, resource_type)
            continue
        found = await world.found(who, f"/fhir/{resource_type}", _total="accurate")
        assert found == expected, (who, resource_type)


async def test_totals_count_only_what_the_caller_may_see(world):
    response = await world.get("doctor", "/fhir/Observation", _total="accurate", _count="1")
    assert response.json()["total"] == 2
    system = await world.found("mathare_admin", "/fhir", _type="Patient,Observation")
    assert system == {"mathare_patient", "mathare_obs"}


async def test_an_api_key_is_held_to_its_scopes_and_its_owners_memberships(world):
    key = await world.client.post("/api/developer/keys", headers=world.people["doctor"]["headers"],
                                  json={"name": "lab interface", "scopes": ["Observation:read"]})
    headers = {"X-API-Key": key.json()["data"]["key"]}
    assert (await world.client.get(f"/fhir/Observation/{world.ids['kibera_obs']}",
                                   headers=headers)).status_code == 200
    assert (await world.client.get(f"/fhir/Observation/{world.ids['mathare_obs']}",
                                   headers=headers)).status_code == 403
    assert (await world.client.get(f"/fhir/Patient/{world.ids['kibera_patient']}",
                                   headers=headers)).status_code == 403


# -- what searches must not leak ----------------------------------------------------------------
async def test_include_revinclude_and_has_never_cross_into_another_organization(world):
    # A record that crosses over (written by an administrator): Kibera's observation
    # about Mathare's patient, and Mathare's observation about Kibera's patient.
    admin = world.h("platform_admin")
    kibera_org = world.people["kibera_admin"]["org_id"]
    mathare_org = world.people["mathare_admin"]["org_id"]
    crossing = heart_rate(world.ids["mathare_patient"], 90)
    crossing["meta"] = {"security": [{"system": "urn:healthplatform:organization",
                                      "code": kibera_org}]}
    world.ids["crossing_obs"] = await _created(await world.client.post(
        "/fhir/Observation", json=crossing, headers=admin))
    back = heart_rate(world.ids["kibera_patient"], 120)
    back["code"]["coding"][0]["code"] = "8310-5"
    back["meta"] = {"security": [{"system": "urn:healthplatform:organization",
                                  "code": mathare_org}]}
    world.ids["mathare_about_kibera"] = await _created(await world.client.post(
        "/fhir/Observation", json=back, headers=admin))

    included = await world.found("doctor", "/fhir/Observation",
                                 _include="Observation:subject")
    assert "crossing_obs" in included and "mathare_patient" not in included
    revincluded = await world.found("doctor", "/fhir/Patient", _id=world.ids["kibera_patient"],
                                    _revinclude="Observation:subject")
    assert "mathare_about_kibera" not in revincluded and "kibera_obs" in revincluded
    has = await world.found("doctor", "/fhir/Patient", **{"_has:Observation:subject:code":
                                                          "8310-5"})
    assert has == set()  # only Mathare's observation has that code
    chained = await world.found("doctor", "/fhir/Observation",
                                **{"subject:Patient.family": "Kiprono"})
    assert chained == set()  # Mathare's patient is not Kibera's to find by name


async def test_history_lists_only_what_the_caller_may_read(world):
    response = await world.get("mathare_admin", "/fhir/Observation/_history")
    ids = {e["resource"]["id"] for e in response.json()["entry"] if "resource" in e}
    assert ids == {world.ids["mathare_obs"]}
    system = await world.get("mathare_admin", "/fhir/_history")
    assert world.ids["kibera_obs"] not in system.text
    instance = await world.get("mathare_admin", f"/fhir/Observation/{world.ids['kibera_obs']}"
                               "/_history")
    assert instance.status_code == 403


async def test_compartment_and_everything_need_the_patient(world):
    kibera_patient = world.ids["kibera_patient"]
    assert (await world.get("mathare_admin", f"/fhir/Patient/{kibera_patient}/$everything")
            ).status_code == 403
    assert (await world.get("mathare_admin", f"/fhir/Patient/{kibera_patient}/Observation")
            ).status_code == 403
    everything = await world.found("doctor", f"/fhir/Patient/{kibera_patient}/$everything")
    assert {"kibera_patient", "kibera_obs"} <= everything
    assert "kibera_claim" in everything  # the doctor's role reads claims
    billing = await world.found("billing", f"/fhir/Patient/{kibera_patient}/$everything")
    assert "kibera_obs" not in billing and "kibera_claim" in billing


# -- writes -----------------------------------------------------------------------------------
async def test_writes_land_in_the_writers_organization_and_never_in_anothers(world):
    doctor = world.h("doctor")
    mine = await world.client.post("/fhir/Observation", headers=doctor,
                                   json=heart_rate(world.ids["kibera_patient"], 70))
    assert mine.status_code == 201
    assert {c["code"] for c in mine.json()["meta"]["security"]} == {
        world.people["kibera_admin"]["org_id"]}
    theirs = await world.client.post("/fhir/Observation", headers=doctor,
                                     json=heart_rate(world.ids["mathare_patient"], 70))
    assert theirs.status_code == 403
    current = (await world.get("platform_admin",
                               f"/fhir/Observation/{world.ids['mathare_obs']}")).json()
    overwrite = await world.client.put(f"/fhir/Observation/{world.ids['mathare_obs']}",
                                       json=current, headers=doctor)
    assert overwrite.status_code == 403
    assert (await world.client.delete(f"/fhir/Observation/{world.ids['mathare_obs']}",
                                       headers=doctor)).status_code == 403
    # a doctor may not delete a patient (demographics: cru), an administrator may
    assert (await world.client.delete(f"/fhir/Patient/{world.ids['baraka_patient']}",
                                      headers=doctor)).status_code == 403
    assert (await world.client.delete(f"/fhir/Patient/{world.ids['baraka_patient']}",
                                      headers=world.h("kibera_admin"))).status_code == 200
    # a lab technician writes results, not claims
    lab = world.h("lab")
    assert (await world.client.post("/fhir/Observation", headers=lab,
                                    json=heart_rate(world.ids["kibera_patient"], 71))
            ).status_code == 201
    claim = (await world.get("billing", f"/fhir/Claim/{world.ids['kibera_claim']}")).json()
    claim["status"] = "cancelled"
    assert (await world.client.put(f"/fhir/Claim/{claim['id']}", json=claim, headers=lab)
            ).status_code == 403


async def test_a_writer_cannot_hand_a_record_to_another_organization(world):
    stolen = heart_rate(world.ids["kibera_patient"], 80)
    stolen["meta"] = {"security": [{"system": "urn:healthplatform:organization",
                                    "code": world.people["mathare_admin"]["org_id"]}]}
    refused = await world.client.post("/fhir/Observation", json=stolen,
                                      headers=world.h("doctor"))
    assert refused.status_code == 403
    assert "meta.security" in refused.json()["issue"][0]["expression"][0]


async def test_every_transaction_entry_goes_through_the_policy(world):
    bundle = {"resourceType": "Bundle", "type": "transaction", "entry": [
        {"request": {"method": "POST", "url": "Observation"},
         "resource": heart_rate(world.ids["kibera_patient"], 75)},
        {"request": {"method": "POST", "url": "Observation"},
         "resource": heart_rate(world.ids["mathare_patient"], 75)},
    ]}
    refused = await world.client.post("/fhir", json=bundle, headers=world.h("doctor"))
    assert refused.status_code == 403
    issue = refused.json()["issue"][0]
    assert issue["expression"][0] == "Bundle.entry[1]" and issue["code"] == "forbidden"
    assert await world.found("doctor", "/fhir/Observation", _total="accurate") == {
        "kibera_obs", "baraka_obs"}  # nothing of the transaction was stored
    # a read the caller may not make fails the transaction before anything is stored
    reading = {"resourceType": "Bundle", "type": "transaction", "entry": [
        {"request": {"method": "POST", "url": "Observation"},
         "resource": heart_rate(world.ids["kibera_patient"], 76)},
        {"request": {"method": "GET", "url": f"Patient/{world.ids['mathare_patient']}"}},
    ]}
    refused = await world.client.post("/fhir", json=reading, headers=world.h("doctor"))
    assert refused.status_code == 403
    assert refused.json()["issue"][0]["expression"][0] == "Bundle.entry[1]"
    assert await world.found("doctor", "/fhir/Observation", _total="accurate") == {
        "kibera_obs", "baraka_obs"}
    searching = {"resourceType": "Bundle", "type": "batch", "entry": [
        {"request": {"method": "GET", "url": "Patient"}},
        {"request": {"method": "GET", "url": f"Patient/{world.ids['mathare_patient']}"}},
    ]}
    batch = (await world.client.post("/fhir", json=searching, headers=world.h("doctor"))).json()
    listed = {e["resource"]["id"] for e in batch["entry"][0]["resource"]["entry"]}
    assert world.ids["mathare_patient"] not in listed
    assert batch["entry"][1]["response"]["status"].startswith("403")


# -- /api ---------------------------------------------------------------------------------------
async def test_api_lists_and_reads_follow_the_same_policy(world):
    kibera = world.people["kibera_admin"]["org_id"]
    listed = await world.client.get(f"/api/organizations/{kibera}/patients",
                                    headers=world.people["doctor"]["headers"])
    assert listed.status_code == 200
    assert {p["id"] for p in listed.json()["data"]} == {world.ids["kibera_patient"],
                                                        world.ids["baraka_patient"]}
    assert listed.json()["meta"]["total"] == 2
    refused = await world.client.get(f"/api/organizations/{kibera}/patients",
                                     headers=world.people["mathare_admin"]["headers"])
    assert refused.status_code == 403
    results = await world.client.get(f"/api/patients/{world.ids['kibera_patient']}/lab-results",
                                     headers=world.people["mathare_admin"]["headers"])
    assert results.status_code == 403
    for who, status in (("doctor", 200), ("billing", 200), ("stranger", 403),
                        ("platform_admin", 200)):
        response = await world.client.get(f"/api/patients/{world.ids['kibera_patient']}",
                                          headers=world.people[who]["headers"])
        assert response.status_code == status, who


# -- consent ---------------------------------------------------------------------------------------
async def test_consent_opens_a_patients_record_to_an_organization_until_revoked(world):
    doctor, mathare_patient = world.h("doctor"), world.ids["mathare_patient"]
    assert (await world.client.get(f"/fhir/Patient/{mathare_patient}", headers=doctor)
            ).status_code == 403
    consent = {
        "resourceType": "Consent", "status": "active",
        "scope": {"coding": [{"system": "http://terminology.hl7.org/CodeSystem/consentscope",
                              "code": "patient-privacy"}]},
        "category": [{"coding": [{"system": LOINC, "code": "59284-0"}]}],
        "patient": {"reference": f"Patient/{mathare_patient}"},
        "policyRule": {"coding": [{"system": "http://terminology.hl7.org/CodeSystem/v3-ActCode",
                                   "code": "OPTIN"}]},
        "provision": {"type": "permit", "actor": [{
            "role": {"coding": [{"system": "http://terminology.hl7.org/CodeSystem/v3-RoleClass",
                                 "code": "PROV"}]},
            "reference": {"reference": f"Organization/{world.people['kibera_admin']['org_id']}"}}]},
    }
    created = await world.client.post("/fhir/Consent", json=consent,
                                      headers=world.h("mathare_admin"))
    assert created.status_code == 201, created.text
    assert (await world.client.get(f"/fhir/Patient/{mathare_patient}", headers=doctor)
            ).status_code == 200
    assert "mathare_obs" in await world.found("doctor", "/fhir/Observation")
    # the billing clerk's role still does not read observations, consent or not
    assert (await world.client.get(f"/fhir/Observation/{world.ids['mathare_obs']}",
                                   headers=world.h("billing"))).status_code == 403
    revoked = {**created.json(), "status": "inactive"}
    assert (await world.client.put(f"/fhir/Consent/{revoked['id']}", json=revoked,
                                   headers=world.h("mathare_admin"))).status_code == 200
    assert (await world.client.get(f"/fhir/Patient/{mathare_patient}", headers=doctor)
            ).status_code == 403


async def test_a_record_the_patient_index_linked_does_not_widen_self(world):
    """Result 4 of issue 31: another person's record linked to the user's own (as the
    master patient index links a probable duplicate, both ways) stays that person's."""
    own = world.ids["baraka_patient"]
    other = {"resourceType": "Patient", "name": [{"family": "Mwangi", "given": ["Baraka"]}],
             "identifier": [{"system": "urn:kcc:mrn", "value": "KCC-0420"}],
             "link": [{"other": {"reference": f"Patient/{own}"}, "type": "seealso"}]}
    other_id = await _created(await world.client.post(
        "/fhir/Patient", json=other, headers=world.h("kibera_admin")))
    mine = (await world.get("kibera_admin", f"/fhir/Patient/{own}")).json()
    mine["link"] = [{"other": {"reference": f"Patient/{other_id}"}, "type": "seealso"}]
    updated = await world.client.put(f"/fhir/Patient/{own}", json=mine,
                                     headers=world.h("kibera_admin"))
    assert updated.status_code == 200, updated.text
    other_obs = await _created(await world.client.post(
        "/fhir/Observation", json=heart_rate(other_id, 91), headers=world.h("doctor")))
    # The user's own record: still theirs.
    assert (await world.get("baraka", f"/fhir/Patient/{own}")).status_code == 200
    # The linked person's record and data: refused, and found by no search.
    assert (await world.get("baraka", f"/fhir/Patient/{other_id}")).status_code == 403
    assert (await world.get("baraka", f"/api/patients/{other_id}")).status_code == 403
    assert (await world.get("baraka", f"/fhir/Observation/{other_obs}")).status_code == 403
    assert await world.found("baraka", "/fhir/Patient") == {"baraka_patient"}
    assert other_id not in await world.found("baraka", "/fhir/Patient",
                                              _revinclude="Patient:link")
    assert other_obs not in await world.found("baraka", "/fhir/Observation")
    # The clinic that keeps both still reads both.
    assert (await world.get("kibera_admin", f"/fhir/Patient/{other_id}")).status_code == 200
