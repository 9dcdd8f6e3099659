"""E-mail verification and password reset over real SMTP: a local aiosmtpd server
receives the messages, the tests read them and follow the links."""

from __future__ import annotations

import email
import re
import socket
import time
from collections.abc import Iterator
from email.message import EmailMessage
from email.policy import default as default_policy
from pathlib import Path
from typing import Any

import httpx
import pytest
from aiosmtpd.controller import Controller

from platform_api.settings import Settings
from tests.conftest import make_settings, register_and_login

PASSWORD = "correct horse battery"
NEW_PASSWORD = "Mount-Kenya-5199"
WEB_APP = "https://app.kliniki.example"


class Inbox:
    """An aiosmtpd handler keeping every message it receives."""

    def __init__(self) -> None:
        self.messages: list[EmailMessage] = []

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        message = email.message_from_bytes(envelope.content, policy=default_policy)
        self.messages.append(message)  # type: ignore[arg-type]
        return "250 Message accepted for delivery"

    def to(self, address: str) -> list[EmailMessage]:
        return [m for m in self.messages if m["To"] == address]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def inbox() -> Iterator[tuple[Inbox, int]]:
    handler, port = Inbox(), free_port()
    controller = Controller(handler, hostname="127.0.0.1", port=port)
    controller.start()
    try:
        yield handler, port
    finally:
        controller.stop()


@pytest.fixture
def settings(tmp_path: Path, inbox: tuple[Inbox, int]) -> Settings:
    return make_settings(tmp_path, smtp_host="127.0.0.1", smtp_port=inbox[1], smtp_tls="none",
                         smtp_from="Kliniki <no-reply@kliniki.example>", web_app_url=WEB_APP)


def link_in(message: EmailMessage, path: str) -> str:
    body = message.get_content()
    found = re.search(rf"{re.escape(WEB_APP + path)}\?token=(\S+)", body)
    assert found, body
    return found.group(1)


async def delivered(app: Any) -> None:
    """Wait for the e-mails the app sends after its answers."""
    await app.state.services.auth.drain()


def refusal(response: httpx.Response) -> tuple[int, str]:
    return response.status_code, response.json()["error"]["code"]


# -- e-mail verification ---------------------------------------------------------------
async def test_registration_sends_a_verification_link_that_works_once(
    app: Any, client: httpx.AsyncClient, inbox: tuple[Inbox, int]
) -> None:
    person = await register_and_login(client, email="amina.odhiambo@kliniki.example")
    await delivered(app)
    [message] = inbox[0].to("amina.odhiambo@kliniki.example")
    assert message["From"] == "Kliniki <no-reply@kliniki.example>"
    assert "Confirm your e-mail address" in message["Subject"]
    token = link_in(message, "/verify-email")
    assert token.startswith("ev_")
    me = await client.get("/api/auth/me", headers=person["headers"])
    assert me.json()["data"]["email_verified"] is False
    verified = await client.post("/api/auth/verify-email", json={"token": token})
    assert verified.status_code == 200 and verified.json()["data"]["email_verified"] is True
    me = await client.get("/api/auth/me", headers=person["headers"])
    assert me.json()["data"]["email_verified"] is True
    again = await client.post("/api/auth/verify-email", json={"token": token})
    assert refusal(again) == (400, "INVALID_VERIFICATION_TOKEN")


async def test_the_verification_link_is_stored_only_hashed(
    app: Any, client: httpx.AsyncClient, inbox: tuple[Inbox, int]
) -> None:
    await register_and_login(client, email="kwame.mensah@kliniki.example")
    await delivered(app)
    token = link_in(inbox[0].to("kwame.mensah@kliniki.example")[0], "/verify-email")
    stored = await app.state.services.store.find_documents("one_time_tokens")
    assert len(stored) == 1 and token not in str(stored)


async def test_asking_again_sends_a_new_link_without_telling_who_is_registered(
    app: Any, client: httpx.AsyncClient, inbox: tuple[Inbox, int]
) -> None:
    await register_and_login(client, email="zanele.dlamini@kliniki.example")
    await delivered(app)
    known = await client.post("/api/auth/verify-email",
                              json={"email": "zanele.dlamini@kliniki.example"})
    unknown = await client.post("/api/auth/verify-email",
                                json={"email": "nobody@kliniki.example"})
    assert known.status_code == unknown.status_code == 202
    assert known.json() == unknown.json()
    await delivered(app)
    assert len(inbox[0].to("zanele.dlamini@kliniki.example")) == 2
    assert inbox[0].to("nobody@kliniki.example") == []
    neither = await client.post("/api/auth/verify-email", json={})
    assert refusal(neither) == (422, "VALIDATION_ERROR")


async def test_a_made_up_verification_token_is_refused(client: httpx.AsyncClient) -> None:
    response = await client.post("/api/auth/verify-email", json={"token": "ev_made-up"})
    assert refusal(response) == (400, "INVALID_VERIFICATION_TOKEN")


# -- password reset --------------------------------------------------------------------
async def request_reset(app: Any, client: httpx.AsyncClient, inbox: Inbox, address: str
                        ) -> str:
    response = await client.post("/api/auth/forgot-password", json={"email": address})
    assert response.status_code == 202
    await delivered(app)
    messages = [m for m in inbox.to(address) if "Reset your" in m["Subject"]]
    return link_in(messages[-1], "/reset-password")


async def test_forgot_password_answers_the_same_for_unknown_addresses(
    app: Any, client: httpx.AsyncClient, inbox: tuple[Inbox, int]
) -> None:
    await register_and_login(client, email="amina.odhiambo@kliniki.example")
    known = await client.post("/api/auth/forgot-password",
                              json={"email": "Amina.Odhiambo@kliniki.example"})
    unknown = await client.post("/api/auth/forgot-password",
                                json={"email": "no.one@kliniki.example"})
    assert known.status_code == unknown.status_code == 202
    assert known.json() == unknown.json()
    await delivered(app)
    resets = [m for m in inbox[0].messages if "Reset your" in m["Subject"]]
    assert [m["To"] for m in resets] == ["amina.odhiambo@kliniki.example"]


async def test_reset_sets_the_password_and_signs_out_every_session(
    app: Any, client: httpx.AsyncClient, inbox: tuple[Inbox, int]
) -> None:
    address = "amina.odhiambo@kliniki.example"
    person = await register_and_login(client, email=address)
    phone = (await client.post("/api/auth/login", json={"email": address,
                                                        "password": PASSWORD})).json()["data"]
    token = await request_reset(app, client, inbox[0], address)
    assert token.startswith("pr_")
    response = await client.post("/api/auth/reset-password",
                                 json={"token": token, "password": NEW_PASSWORD})
    assert response.status_code == 200, response.text
    assert (await client.get("/api/auth/me", headers=person["headers"])).status_code == 401
    refreshed = await client.post("/api/auth/refresh",
                                  json={"refresh_token": phone["refresh_token"]})
    assert refusal(refreshed) == (401, "INVALID_REFRESH_TOKEN")
    old = await client.post("/api/auth/login", json={"email": address, "password": PASSWORD})
    assert refusal(old) == (401, "INVALID_CREDENTIALS")
    new = await client.post("/api/auth/login", json={"email": address, "password": NEW_PASSWORD})
    assert new.status_code == 200
    again = await client.post("/api/auth/reset-password",
                              json={"token": token, "password": "Another-pass-123"})
    assert refusal(again) == (400, "INVALID_RESET_TOKEN")


async def test_a_reset_retires_the_other_reset_links(
    app: Any, client: httpx.AsyncClient, inbox: tuple[Inbox, int]
) -> None:
    address = "kwame.mensah@kliniki.example"
    await register_and_login(client, email=address)
    first = await request_reset(app, client, inbox[0], address)
    second = await request_reset(app, client, inbox[0], address)
    assert first != second
    ok = await client.post("/api/auth/reset-password",
                           json={"token": second, "password": NEW_PASSWORD})
    assert ok.status_code == 200
    stale = await client.post("/api/auth/reset-password",
                              json={"token": first, "password": "Another-pass-123"})
    assert refusal(stale) == (400, "INVALID_RESET_TOKEN")


async def test_an_expired_reset_link_is_refused(
    app: Any, client: httpx.AsyncClient, inbox: tuple[Inbox, int]
) -> None:
    address = "zanele.dlamini@kliniki.example"
    await register_and_login(client, email=address)
    token = await request_reset(app, client, inbox[0], address)
    store = app.state.services.store
    [doc] = [d for d in await store.find_documents("one_time_tokens")
             if d["purpose"] == "password-reset"]
    async with store.unit_of_work() as uow:  # an hour and a bit later
        uow.put_document("one_time_tokens", doc["id"], {
            **doc, "expires_at": time.strftime("%Y-%m-%dT%H:%M:%S+00:00",
                                               time.gmtime(time.time() - 60))})
        await uow.commit()
    response = await client.post("/api/auth/reset-password",
                                 json={"token": token, "password": NEW_PASSWORD})
    assert refusal(response) == (400, "INVALID_RESET_TOKEN")
    assert "expired" in response.json()["error"]["message"]


async def test_reset_refuses_a_weak_password_and_a_verification_token(
    app: Any, client: httpx.AsyncClient, inbox: tuple[Inbox, int]
) -> None:
    address = "amina.odhiambo@kliniki.example"
    await register_and_login(client, email=address)
    await delivered(app)
    verification = link_in(inbox[0].to(address)[0], "/verify-email")
    token = await request_reset(app, client, inbox[0], address)
    weak = await client.post("/api/auth/reset-password", json={"token": token, "password": "short"})
    assert refusal(weak) == (422, "VALIDATION_ERROR")
    wrong_kind = await client.post("/api/auth/reset-password",
                                   json={"token": verification, "password": NEW_PASSWORD})
    assert refusal(wrong_kind) == (400, "INVALID_RESET_TOKEN")


async def test_a_reset_unlocks_an_account_locked_by_failed_logins(
    app: Any, client: httpx.AsyncClient, inbox: tuple[Inbox, int]
) -> None:
    address = "amina.odhiambo@kliniki.example"
    await register_and_login(client, email=address)
    wrong = {"email": address, "password": "not-her-password"}
    for _ in range(10):
        await client.post("/api/auth/login", json=wrong)
    assert (await client.post("/api/auth/login", json=wrong)).status_code == 429
    token = await request_reset(app, client, inbox[0], address)
    await client.post("/api/auth/reset-password", json={"token": token, "password": NEW_PASSWORD})
    login = await client.post("/api/auth/login", json={"email": address, "password": NEW_PASSWORD})
    assert login.status_code == 200


# -- registration with a taken address -----------------------------------------------------
async def test_registering_a_taken_address_tells_its_owner_not_the_registrant(
    app: Any, client: httpx.AsyncClient, inbox: tuple[Inbox, int]
) -> None:
    owner = "wanjiru.kamau@kliniki.example"
    await register_and_login(client, email=owner, first_name="Wanjiru", last_name="Kamau")
    await delivered(app)
    inbox[0].messages.clear()
    attempt = await client.post("/api/auth/register", json={
        "email": owner, "password": "another long phrase", "first_name": "Someone",
        "last_name": "Else"})
    fresh = await client.post("/api/auth/register", json={
        "email": "baraka.otieno@kliniki.example", "password": "another long phrase",
        "first_name": "Baraka", "last_name": "Otieno"})
    assert attempt.status_code == fresh.status_code == 201
    assert set(attempt.json()["data"]) == set(fresh.json()["data"])
    await delivered(app)
    [notice] = inbox[0].to(owner)
    assert "tried to create" in notice["Subject"]
    body = notice.get_content()
    assert "Hello Wanjiru" in body and f"{WEB_APP}/forgot-password" in body
    assert "token=" not in body  # nothing usable by whoever reads it first
    [verification] = inbox[0].to("baraka.otieno@kliniki.example")
    assert "Confirm your e-mail address" in verification["Subject"]
