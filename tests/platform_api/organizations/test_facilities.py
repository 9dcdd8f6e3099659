"""Organizations as FHIR Organization: the directory, the caller's own organizations,
changes by the ORG:ADMIN, and the status moves, with a suspended organization's members
losing access to its data on /api and /fhir until it is reactivated."""

from __future__ import annotations

from typing import Any

from tests.platform_api.clinic import Clinic, refusal

FHIR = {"Content-Type": "application/fhir+json"}


async def test_the_directory_lists_active_organizations_with_filters(clinic: Clinic):
    listed = await clinic.get("stranger", "/api/organizations", name="kibera")
    assert listed.status_code == 200, listed.text
    body = listed.json()
    assert [o["name"] for o in body["data"]] == ["Kibera Community Clinic"]
    assert body["meta"] == {"page": 1, "limit": 20, "total": 1}
    assert body["data"][0]["status"] == "active" and body["data"][0]["country"] == "KE"
    both = (await clinic.get("stranger", "/api/organizations", country="KE", limit=1)).json()
    assert both["meta"]["total"] == 2 and len(both["data"]) == 1
    bad = await clinic.get("stranger", "/api/organizations", country="Kenya")
    assert refusal(bad) == (422, "VALIDATION_ERROR")
    assert bad.json()["error"]["field"] == "country"
    assert (await clinic.client.get("/api/organizations")).status_code == 401


async def test_me_lists_the_callers_organizations_with_their_roles(clinic: Clinic):
    mine = (await clinic.get("nurse", "/api/organizations/me")).json()
    assert mine["meta"]["total"] == 1
    [entry] = mine["data"]
    assert entry["organization"]["id"] == clinic.org_id
    assert entry["membership"]["role"] == "ORG:NURSE"
    assert (await clinic.get("stranger", "/api/organizations/me")).json()["data"] == []


async def test_only_the_organizations_admin_changes_it(clinic: Clinic):
    url = f"/api/organizations/{clinic.org_id}"
    changed = await clinic.client.put(url, json={"phone": "+254722000111", "city": "Nairobi"},
                                      headers=clinic.h("admin"))
    assert changed.status_code == 200, changed.text
    view = changed.json()["data"]
    assert view["phone"] == "+254722000111" and view["city"] == "Nairobi"
    assert view["name"] == "Kibera Community Clinic"  # what was not sent stays
    fhir = (await clinic.client.get(f"/fhir/Organization/{clinic.org_id}",
                                    headers=clinic.h("admin"))).json()
    assert fhir["address"][0]["city"] == "Nairobi"
    for who in ("nurse", "other_admin"):
        refused = await clinic.client.put(url, json={"name": "Renamed"}, headers=clinic.h(who))
        assert refusal(refused) == (403, "FORBIDDEN"), who
    unknown = await clinic.client.put("/api/organizations/nowhere", json={"name": "X"},
                                      headers=clinic.h("admin"))
    assert refusal(unknown) == (404, "NOT_FOUND")


async def status(clinic: Clinic, who: str, target: str, reason: str | None = None) -> Any:
    return await clinic.client.patch(f"/api/organizations/{clinic.org_id}/status",
                                     json={"status": target, "reason": reason},
                                     headers=clinic.h(who))


async def test_a_suspended_organizations_members_lose_access_until_it_is_reactivated(
        clinic: Clinic):
    events = clinic.recorded("platform.organization.status_changed")
    patients = f"/api/organizations/{clinic.org_id}/patients"
    patient = f"/fhir/Patient/{clinic.patient_id}"
    assert (await clinic.get("doctor", patients)).status_code == 200
    assert (await clinic.get("doctor", patient)).status_code == 200

    suspended = await status(clinic, "platform_admin", "suspended", "Licence under review")
    assert suspended.status_code == 200, suspended.text
    assert suspended.json()["data"]["status"] == "suspended"
    assert refusal(await clinic.get("doctor", patients)) == (403, "ORGANIZATION_INACTIVE")
    assert (await clinic.get("doctor", patient)).status_code == 403
    search = await clinic.get("doctor", "/fhir/Patient", family="odhiambo")
    assert search.status_code == 200 and search.json().get("total", 0) == 0
    assert (await clinic.get("platform_admin", patient)).status_code == 200
    # Hidden from the directory, except for platform administrators.
    names = [o["id"] for o in (await clinic.get("stranger", "/api/organizations")).json()["data"]]
    assert clinic.org_id not in names
    assert refusal(await clinic.get("stranger", "/api/organizations", status="suspended")) \
        == (403, "FORBIDDEN")
    listed = (await clinic.get("platform_admin", "/api/organizations", status="suspended")
              ).json()
    assert [o["id"] for o in listed["data"]] == [clinic.org_id]
    # The caller still sees the membership, with the status.
    mine = (await clinic.get("doctor", "/api/organizations/me")).json()["data"]
    assert mine[0]["organization"]["status"] == "suspended"

    assert (await status(clinic, "platform_admin", "active")).status_code == 200
    assert (await clinic.get("doctor", patients)).status_code == 200
    assert (await clinic.get("doctor", patient)).status_code == 200
    await clinic.drain()
    assert [(e["payload"]["previous_status"], e["payload"]["status"]) for e in events] == [
        ("active", "suspended"), ("suspended", "active")]
    assert events[0]["payload"]["reason"] == "Licence under review"


async def test_status_moves_follow_the_table_and_who_may_make_them(clinic: Clinic):
    assert refusal(await status(clinic, "admin", "suspended")) == (403, "FORBIDDEN")
    assert refusal(await status(clinic, "nurse", "closed")) == (403, "FORBIDDEN")
    assert refusal(await status(clinic, "other_admin", "closed")) == (403, "FORBIDDEN")
    again = await status(clinic, "platform_admin", "active")
    assert refusal(again) == (409, "INVALID_TRANSITION")
    bad = await status(clinic, "platform_admin", "demolished")
    assert refusal(bad) == (422, "VALIDATION_ERROR")
    closed = await status(clinic, "admin", "closed")  # its ORG:ADMIN may close it
    assert closed.status_code == 200 and closed.json()["data"]["status"] == "closed"
    assert refusal(await status(clinic, "platform_admin", "active")) == (
        409, "INVALID_TRANSITION")
    fhir = (await clinic.client.get(f"/fhir/Organization/{clinic.org_id}",
                                    headers=clinic.h("platform_admin"))).json()
    assert fhir["active"] is False
    assert {"system": "urn:healthplatform:organization-status", "code": "closed"} in fhir[
        "meta"]["tag"]
