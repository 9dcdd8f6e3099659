"""The organizations a doctor practises at: an organization's ORG:ADMIN invites a doctor
by their profile (POST /api/doctors/:id/organizations answers 202 with the pending
invitation), and the doctor joins only by accepting it (issue 31, result 2: an ORG:ADMIN
used to add any doctor at once, without their consent, and then read their e-mail in the
member list). Leaving and removal; the doctors list of an organization. Over real SMTP (a
local aiosmtpd server), as the organizations' invitations are."""

from __future__ import annotations

from typing import Any

from platform_api.policy.roles import ORG_DOCTOR
from tests.conftest import register_and_login
from tests.platform_api.clinic import Clinic, refusal
from tests.platform_api.doctors.test_profiles import PROFILE
from tests.platform_api.organizations import test_invitations as mailed
from tests.platform_api.organizations.test_invitations import (
    PickyInbox,
    invitations,
    token_in,
)

# The local SMTP server, and the app's settings sending to it.
inbox, settings = mailed.inbox, mailed.settings

DOCTOR_EMAIL = "wanjiru.kamau@kliniki.example"


async def new_doctor(clinic: Clinic, email: str = DOCTOR_EMAIL
                     ) -> tuple[dict[str, Any], dict[str, Any]]:
    """An account with a doctor profile and no organization: (the user, the profile)."""
    user = await register_and_login(clinic.client, first_name="Wanjiru", last_name="Kamau",
                                    email=email)
    created = await clinic.client.post("/api/doctors", json=PROFILE, headers=user["headers"])
    assert created.status_code == 201, created.text
    return user, created.json()["data"]


async def invite(clinic: Clinic, who: str | dict[str, Any], doctor_id: str,
                 org_id: str | None = None) -> Any:
    headers = clinic.h(who) if isinstance(who, str) else who["headers"]
    return await clinic.client.post(f"/api/doctors/{doctor_id}/organizations",
                                    json={"organization_id": org_id or clinic.org_id},
                                    headers=headers)


async def accept(clinic: Clinic, user: dict[str, Any], token: str) -> Any:
    return await clinic.client.post("/api/organizations/invitations/accept",
                                    json={"token": token}, headers=user["headers"])


async def joined(clinic: Clinic, inbox: PickyInbox, user: dict[str, Any],
                 doctor: dict[str, Any]) -> None:
    """The clinic's ORG:ADMIN invites the doctor, who accepts."""
    assert (await invite(clinic, "admin", doctor["id"])).status_code == 202
    accepted = await accept(clinic, user, token_in(invitations(inbox, DOCTOR_EMAIL)[-1]))
    assert accepted.status_code == 200, accepted.text
    await clinic.drain()  # the PractitionerRole comes from member_added


async def doctors_of(clinic: Clinic, who: str = "nurse") -> list[str]:
    listed = await clinic.get(who, f"/api/organizations/{clinic.org_id}/doctors")
    assert listed.status_code == 200, listed.text
    return [d["id"] for d in listed.json()["data"]]


async def test_adding_a_doctor_is_an_invitation_the_doctor_accepts(clinic: Clinic,
                                                                  inbox: PickyInbox):
    added = clinic.recorded("platform.organization.member_added")
    linked = clinic.recorded("platform.doctors.organization_linked")
    user, doctor = await new_doctor(clinic)
    # Refused: the doctor themselves (a doctor joins by accepting), members who do not
    # manage the organization, another clinic's administrator, a stranger.
    for who in (user, "nurse", "doctor", "other_admin", "stranger"):
        assert refusal(await invite(clinic, who, doctor["id"])) == (403, "FORBIDDEN"), who
    assert refusal(await invite(clinic, "admin", "nobody")) == (404, "NOT_FOUND")
    assert refusal(await invite(clinic, "admin", doctor["id"], "nowhere")) == (
        404, "NOT_FOUND")

    # Allowed: the clinic's ORG:ADMIN, whose request is a pending invitation ...
    sent = await invite(clinic, "admin", doctor["id"])
    assert sent.status_code == 202, sent.text
    invitation = sent.json()["data"]
    assert invitation["status"] == "pending" and invitation["role"] == ORG_DOCTOR
    assert invitation["doctor_id"] == doctor["id"] and invitation["email"] is None
    assert DOCTOR_EMAIL not in sent.text  # the address is the doctor's to give
    assert refusal(await invite(clinic, "admin", doctor["id"])) == (409, "INVITATION_PENDING")
    # ... and nothing about the doctor changed: no membership, no role, no e-mail shown.
    members = await clinic.get("admin", f"/api/organizations/{clinic.org_id}/members")
    assert user["user"]["id"] not in {m["user_id"] for m in members.json()["data"]}
    assert DOCTOR_EMAIL not in members.text
    listed = await clinic.get("admin", f"/api/organizations/{clinic.org_id}/invitations")
    assert [i["doctor_id"] for i in listed.json()["data"]] == [doctor["id"]]
    assert DOCTOR_EMAIL not in listed.text
    await clinic.drain()
    assert await doctors_of(clinic) == [] and added == [] and linked == []
    mine = await clinic.client.get("/api/doctors/me", headers=user["headers"])
    assert mine.json()["data"]["organizations"] == []
    assert refusal(await clinic.client.get(f"/api/organizations/{clinic.org_id}/patients",
                                           headers=user["headers"])) == (403, "FORBIDDEN")

    # The doctor is asked by e-mail; only their own account accepts.
    [message] = invitations(inbox, DOCTOR_EMAIL)
    assert "Kibera Community Clinic" in message["Subject"] and ORG_DOCTOR in \
        message.get_content()
    token = token_in(message)
    assert refusal(await accept(clinic, clinic.people["stranger"], token)) == (
        403, "INVITATION_FOR_ANOTHER_ACCOUNT")
    accepted = await accept(clinic, user, token)
    assert accepted.status_code == 200, accepted.text
    assert accepted.json()["data"]["role"] == ORG_DOCTOR
    await clinic.drain()
    assert await doctors_of(clinic) == [doctor["id"]]
    mine = await clinic.client.get("/api/doctors/me", headers=user["headers"])
    assert [o["id"] for o in mine.json()["data"]["organizations"]] == [clinic.org_id]
    members = await clinic.get("admin", f"/api/organizations/{clinic.org_id}/members")
    assert DOCTOR_EMAIL in members.text  # now a member, by their own choice
    assert [e["payload"]["user_id"] for e in added] == [user["user"]["id"]]
    assert [e["payload"] for e in linked] == [{"doctor_id": doctor["id"],
                                               "organization_id": clinic.org_id}]
    assert refusal(await invite(clinic, "admin", doctor["id"])) == (409, "ALREADY_LINKED")


async def test_a_platform_admin_invites_too_and_a_profile_without_account_cannot_be(
        clinic: Clinic, inbox: PickyInbox):
    _user, doctor = await new_doctor(clinic)
    sent = await invite(clinic, "platform_admin", doctor["id"])
    assert sent.status_code == 202 and sent.json()["data"]["status"] == "pending"
    orphan = await clinic.client.post("/fhir/Practitioner", headers={
        **clinic.h("platform_admin"), "Content-Type": "application/fhir+json"}, json={
        "resourceType": "Practitioner", "name": [{"family": "Mwangi", "given": ["Peter"]}]})
    assert orphan.status_code == 201, orphan.text
    assert refusal(await invite(clinic, "admin", orphan.json()["id"])) == (
        409, "DOCTOR_WITHOUT_ACCOUNT")


async def test_a_doctor_leaves_and_an_admin_removes_a_doctor(clinic: Clinic,
                                                             inbox: PickyInbox):
    user, doctor = await new_doctor(clinic)
    await joined(clinic, inbox, user, doctor)
    url = f"/api/doctors/{doctor['id']}/organizations/{clinic.org_id}"
    for who in ("nurse", "other_admin", "stranger"):
        assert refusal(await clinic.client.delete(url, headers=clinic.h(who))) == (
            403, "FORBIDDEN"), who
    left = await clinic.client.delete(url, headers=user["headers"])
    assert left.status_code == 200 and left.json()["data"]["organizations"] == []
    assert (await clinic.client.get("/api/organizations/me", headers=user["headers"])
            ).json()["data"] == []
    assert refusal(await clinic.client.delete(url, headers=user["headers"])) == (
        404, "NOT_FOUND")

    await joined(clinic, inbox, user, doctor)  # invited again, and accepted again
    removed = await clinic.client.delete(url, headers=clinic.h("admin"))
    assert removed.status_code == 200 and removed.json()["data"]["organizations"] == []
    assert await doctors_of(clinic) == []


async def test_a_member_who_creates_a_profile_practises_at_once(clinic: Clinic):
    # Already a member (their own invitation accepted): nobody else adds them anywhere.
    mine = await clinic.client.post("/api/doctors", json={**PROFILE, "first_name": "Achieng",
                                                          "last_name": "Otieno"},
                                    headers=clinic.h("doctor"))
    assert [o["id"] for o in mine.json()["data"]["organizations"]] == [clinic.org_id]
    assert await doctors_of(clinic) == [mine.json()["data"]["id"]]
    for who in ("stranger", "other_admin"):
        assert refusal(await clinic.get(who, f"/api/organizations/{clinic.org_id}/doctors")
                       ) == (403, "FORBIDDEN")
    assert await doctors_of(clinic, "platform_admin") == [mine.json()["data"]["id"]]
