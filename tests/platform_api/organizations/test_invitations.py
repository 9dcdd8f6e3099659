"""Invitations over real SMTP (a local aiosmtpd server): e-mailed links with single-use,
expiring tokens stored hashed; accepted by the invited address's account, which becomes
a member and emits member_added; revoked links stop working."""

from __future__ import annotations

import re
from collections.abc import Iterator
from email.message import EmailMessage
from pathlib import Path
from typing import Any

import pytest
from aiosmtpd.controller import Controller

from platform_api.mailer import SmtpConfig
from platform_api.settings import Settings
from tests.conftest import make_settings, register_and_login
from tests.platform_api.clinic import Clinic, refusal
from tests.platform_api.test_auth_email import Inbox, free_port

WEB_APP = "https://app.kliniki.example"
INVITEE = "baraka.mwangi@kliniki.example"


class PickyInbox(Inbox):
    """Refuses mail to addresses at refused.example."""

    async def handle_RCPT(self, server: Any, session: Any, envelope: Any, address: str,
                          options: Any) -> str:
        if address.endswith("@refused.example"):
            return "550 No such mailbox"
        envelope.rcpt_tos.append(address)
        return "250 OK"


@pytest.fixture
def inbox() -> Iterator[PickyInbox]:
    handler, port = PickyInbox(), free_port()
    controller = Controller(handler, hostname="127.0.0.1", port=port)
    controller.start()
    handler.port = port  # type: ignore[attr-defined]
    try:
        yield handler
    finally:
        controller.stop()


@pytest.fixture
def settings(tmp_path: Path, inbox: PickyInbox) -> Settings:
    return make_settings(tmp_path, smtp_host="127.0.0.1", smtp_port=inbox.port,  # type: ignore[attr-defined]
                         smtp_tls="none", smtp_from="Kliniki <no-reply@kliniki.example>",
                         web_app_url=WEB_APP)


def invitations(inbox: Inbox, address: str = INVITEE) -> list[EmailMessage]:
    """The invitations mailed to ``address`` (not the account's own e-mails)."""
    return [m for m in inbox.to(address) if "invited" in str(m["Subject"])]


def token_in(message: EmailMessage) -> str:
    found = re.search(rf"{re.escape(WEB_APP)}/invitations/accept\?token=(\S+)",
                      message.get_content())
    assert found, message.get_content()
    return found.group(1)


async def invite(clinic: Clinic, who: str = "admin", email: str = INVITEE,
                 role: str = "ORG:NURSE") -> Any:
    return await clinic.post(who, f"/api/organizations/{clinic.org_id}/invitations",
                             {"email": email, "role": role})


async def accept(clinic: Clinic, user: dict[str, Any], token: str) -> Any:
    return await clinic.client.post("/api/organizations/invitations/accept",
                                    json={"token": token}, headers=user["headers"])


async def test_an_invitation_is_mailed_and_accepted_by_the_invited_account(
        clinic: Clinic, inbox: PickyInbox):
    added = clinic.recorded("platform.organization.member_added")
    sent = await invite(clinic, email="Baraka.Mwangi@kliniki.example")
    assert sent.status_code == 201, sent.text
    invitation = sent.json()["data"]
    assert invitation["email"] == INVITEE and invitation["status"] == "pending"
    assert invitation["email_sent"] is True
    [message] = invitations(inbox)
    assert "Kibera Community Clinic" in message["Subject"]
    token = token_in(message)
    # Stored hashed: no document holds the token itself.
    store = clinic.app.state.services.store
    for collection in ("org_invitations", "one_time_tokens"):
        assert token not in str(await store.find_documents(collection, {}))

    stranger = clinic.people["stranger"]
    assert refusal(await accept(clinic, stranger, token)) == (
        403, "INVITATION_FOR_ANOTHER_ACCOUNT")
    baraka = await register_and_login(clinic.client, first_name="Baraka", last_name="Mwangi",
                                      email=INVITEE)
    accepted = await accept(clinic, baraka, token)
    assert accepted.status_code == 200, accepted.text
    assert accepted.json()["data"]["role"] == "ORG:NURSE"
    assert (await clinic.client.get(f"/api/organizations/{clinic.org_id}/patients",
                                    headers=baraka["headers"])).status_code == 200
    assert refusal(await accept(clinic, baraka, token)) == (400, "INVALID_INVITATION")
    listed = (await clinic.get("admin", f"/api/organizations/{clinic.org_id}/invitations")
              ).json()
    assert listed["data"][0]["status"] == "accepted"
    assert listed["data"][0]["accepted_by"] == baraka["user"]["id"]
    await clinic.drain()
    assert [e["payload"] for e in added] == [{"organization_id": clinic.org_id,
                                             "user_id": baraka["user"]["id"],
                                             "role": "ORG:NURSE"}]


async def test_a_revoked_or_expired_invitation_cannot_be_accepted(clinic: Clinic,
                                                                  inbox: PickyInbox):
    invitation = (await invite(clinic)).json()["data"]
    token = token_in(invitations(inbox)[0])
    url = f"/api/organizations/{clinic.org_id}/invitations/{invitation['id']}"
    assert refusal(await clinic.client.delete(url, headers=clinic.h("nurse"))) == (
        403, "FORBIDDEN")
    revoked = await clinic.client.delete(url, headers=clinic.h("admin"))
    assert revoked.status_code == 200 and revoked.json()["data"]["status"] == "revoked"
    baraka = await register_and_login(clinic.client, first_name="Baraka", last_name="Mwangi",
                                      email=INVITEE)
    assert refusal(await accept(clinic, baraka, token)) == (400, "INVALID_INVITATION")
    assert refusal(await clinic.client.delete(url, headers=clinic.h("admin"))) == (
        409, "INVITATION_NOT_PENDING")
    assert refusal(await clinic.client.delete(url + "x", headers=clinic.h("admin"))) == (
        404, "NOT_FOUND")

    await invite(clinic)  # a new one may go out once the first is revoked
    token = token_in(invitations(inbox)[1])
    store = clinic.app.state.services.store
    [doc] = [d for d in await store.find_documents("one_time_tokens", {}) if d.get(
        "purpose") == "org-invitation" and d["used_at"] is None]
    async with store.unit_of_work() as uow:
        uow.put_document("one_time_tokens", doc["id"], {**doc,
                                                         "expires_at": "2020-01-01T00:00:00+00:00"})
        await uow.commit()
    assert refusal(await accept(clinic, baraka, token)) == (400, "INVALID_INVITATION")


async def test_invitations_are_refused_when_they_cannot_be_honoured(clinic: Clinic,
                                                                    inbox: PickyInbox,
                                                                    monkeypatch):
    assert refusal(await invite(clinic, who="nurse")) == (403, "FORBIDDEN")
    listing = f"/api/organizations/{clinic.org_id}/invitations"
    assert refusal(await clinic.get("nurse", listing)) == (403, "FORBIDDEN")
    assert refusal(await clinic.get("other_admin", listing)) == (403, "FORBIDDEN")
    assert refusal(await invite(clinic, who="stranger")) == (403, "FORBIDDEN")
    bad = await invite(clinic, role="ORG:OWNER")
    assert refusal(bad) == (422, "VALIDATION_ERROR") and bad.json()["error"]["field"] == "role"
    member_email = clinic.people["nurse"]["user"]["email"]
    assert refusal(await invite(clinic, email=member_email)) == (409, "ALREADY_MEMBER")
    assert (await invite(clinic)).status_code == 201
    assert refusal(await invite(clinic)) == (409, "INVITATION_PENDING")
    refused = await invite(clinic, email="nobody@refused.example")
    assert refusal(refused) == (502, "EMAIL_NOT_SENT")
    withdrawn = (await clinic.get("admin", f"/api/organizations/{clinic.org_id}/invitations")
                 ).json()["data"]
    assert [i["status"] for i in withdrawn if i["email"] == "nobody@refused.example"] == [
        "revoked"]
    mailer = clinic.app.state.services.auth.mailer
    monkeypatch.setattr(mailer, "config", SmtpConfig(host="", port=25, sender="x@y.example"))
    assert refusal(await invite(clinic, email="halima@kliniki.example")) == (
        503, "EMAIL_DISABLED")
