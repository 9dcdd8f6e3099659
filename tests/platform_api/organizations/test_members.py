"""Members of an organization: the list, role changes and removals by its ORG:ADMIN, a
member leaving, and the rule that an organization keeps at least one ORG:ADMIN, also
when two administrators demote each other at the same moment."""

from __future__ import annotations

import asyncio
from typing import Any

from tests.platform_api.clinic import Clinic, refusal


def members_url(clinic: Clinic, user: str | None = None) -> str:
    base = f"/api/organizations/{clinic.org_id}/members"
    return base if user is None else f"{base}/{clinic.user_id(user)}"


async def test_members_are_listed_with_their_roles_for_members_only(clinic: Clinic):
    listed = await clinic.get("nurse", members_url(clinic), limit=3)
    assert listed.status_code == 200
    body = listed.json()
    assert body["meta"]["total"] == 6 and len(body["data"]) == 3
    assert body["data"][0]["role"] == "ORG:ADMIN" and body["data"][0]["first_name"] == "Wanjiku"
    assert refusal(await clinic.get("stranger", members_url(clinic))) == (403, "FORBIDDEN")
    assert refusal(await clinic.get("nurse", "/api/organizations/nowhere/members")) == (
        404, "NOT_FOUND")


async def change(clinic: Clinic, who: str, user: str, role: str) -> Any:
    return await clinic.client.patch(members_url(clinic, user) + "/role", json={"role": role},
                                     headers=clinic.h(who))


async def test_the_admin_changes_a_members_role(clinic: Clinic):
    events = clinic.recorded("platform.organization.member_role_changed")
    changed = await change(clinic, "admin", "nurse", "ORG:DOCTOR")
    assert changed.status_code == 200, changed.text
    assert changed.json()["data"]["role"] == "ORG:DOCTOR"
    mine = (await clinic.get("nurse", "/api/organizations/me")).json()["data"]
    assert mine[0]["membership"]["role"] == "ORG:DOCTOR"
    assert refusal(await change(clinic, "nurse", "receptionist", "ORG:ADMIN")) == (
        403, "FORBIDDEN")
    assert refusal(await change(clinic, "admin", "stranger", "ORG:NURSE")) == (404, "NOT_FOUND")
    invalid = await change(clinic, "admin", "nurse", "ORG:JANITOR")
    assert refusal(invalid) == (422, "VALIDATION_ERROR")
    assert invalid.json()["error"]["field"] == "role"
    await clinic.drain()
    assert [(e["payload"]["previous_role"], e["payload"]["role"]) for e in events] == [
        ("ORG:NURSE", "ORG:DOCTOR")]


async def test_the_last_admin_cannot_be_demoted_or_removed(clinic: Clinic):
    assert refusal(await change(clinic, "admin", "admin", "ORG:DOCTOR")) == (409, "LAST_ADMIN")
    removed = await clinic.client.delete(members_url(clinic, "admin"), headers=clinic.h("admin"))
    assert refusal(removed) == (409, "LAST_ADMIN")
    assert (await change(clinic, "admin", "doctor", "ORG:ADMIN")).status_code == 200
    assert (await change(clinic, "doctor", "admin", "ORG:DOCTOR")).status_code == 200


async def test_two_admins_demoting_each_other_at_once_leave_one_admin(clinic: Clinic):
    assert (await change(clinic, "admin", "doctor", "ORG:ADMIN")).status_code == 200
    first, second = await asyncio.gather(change(clinic, "admin", "doctor", "ORG:NURSE"),
                                         change(clinic, "doctor", "admin", "ORG:NURSE"))
    assert sorted([first.status_code, second.status_code]) == [200, 409]
    loser = first if first.status_code == 409 else second
    assert loser.json()["error"]["code"] == "LAST_ADMIN"
    admins = [m for m in (await clinic.get("platform_admin", members_url(clinic), limit=100)
                          ).json()["data"] if m["role"] == "ORG:ADMIN"]
    assert len(admins) == 1


async def test_admins_remove_members_and_members_leave(clinic: Clinic):
    events = clinic.recorded("platform.organization.member_removed")
    patients = f"/api/organizations/{clinic.org_id}/patients"
    assert (await clinic.get("receptionist", patients)).status_code == 200
    removed = await clinic.client.delete(members_url(clinic, "receptionist"),
                                         headers=clinic.h("admin"))
    assert removed.status_code == 200 and removed.json()["data"]["role"] == "ORG:RECEPTIONIST"
    assert refusal(await clinic.get("receptionist", patients)) == (403, "FORBIDDEN")
    refused = await clinic.client.delete(members_url(clinic, "doctor"), headers=clinic.h("nurse"))
    assert refusal(refused) == (403, "FORBIDDEN")
    left = await clinic.client.delete(members_url(clinic, "nurse"), headers=clinic.h("nurse"))
    assert left.status_code == 200
    again = await clinic.client.delete(members_url(clinic, "nurse"), headers=clinic.h("admin"))
    assert refusal(again) == (404, "NOT_FOUND")
    await clinic.drain()
    assert [(e["payload"]["user_id"], e["payload"]["removed_by"]) for e in events] == [
        (clinic.user_id("receptionist"), clinic.user_id("admin")),
        (clinic.user_id("nurse"), clinic.user_id("nurse"))]
