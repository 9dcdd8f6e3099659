"""Referral codes: every user has one; anyone may look up who it belongs to (first name
and last initial only); registration may carry one."""

from __future__ import annotations

from typing import Any

import httpx

from tests.conftest import register_and_login


def refusal(response: httpx.Response) -> tuple[int, str]:
    return response.status_code, response.json()["error"]["code"]


async def my_code(client: httpx.AsyncClient, person: dict[str, Any]) -> str:
    me = await client.get("/api/auth/me", headers=person["headers"])
    return str(me.json()["data"]["referral_code"])


async def test_every_user_has_a_code_anyone_can_look_up(
    client: httpx.AsyncClient, user: dict[str, Any]
) -> None:
    code = await my_code(client, user)
    assert len(code) == 8 and code.isupper()
    response = await client.get(f"/api/auth/referral/{code}")  # no credentials
    assert response.status_code == 200
    assert response.json()["data"] == {
        "code": code, "valid": True,
        "referrer": {"first_name": "Amina", "last_initial": "O."},
    }
    assert user["user"]["email"] not in response.text and user["user"]["id"] not in response.text
    typed = f"{code[:4].lower()}-{code[4:].lower()}"
    assert (await client.get(f"/api/auth/referral/{typed}")).status_code == 200


async def test_unknown_and_malformed_codes_are_not_found(client: httpx.AsyncClient) -> None:
    for code in ("ZZZZZZZZ", "short", "0OIL1OIL"):
        assert refusal(await client.get(f"/api/auth/referral/{code}")) == (404, "NOT_FOUND")


async def test_registration_records_who_referred(
    app: Any, client: httpx.AsyncClient, user: dict[str, Any]
) -> None:
    code = await my_code(client, user)
    response = await client.post("/api/auth/register", json={
        "email": "kwame.mensah@korlebu.example", "password": "Volta-river-77",
        "first_name": "Kwame", "last_name": "Mensah", "referral_code": code.lower()})
    assert response.status_code == 201
    stored = await app.state.services.store.get_document("users", response.json()["data"]["id"])
    assert stored["referred_by"] == user["user"]["id"]


async def test_registration_with_an_unknown_code_is_refused(client: httpx.AsyncClient) -> None:
    response = await client.post("/api/auth/register", json={
        "email": "kwame.mensah@korlebu.example", "password": "Volta-river-77",
        "first_name": "Kwame", "last_name": "Mensah", "referral_code": "ZZZZZZZZ"})
    assert refusal(response) == (422, "VALIDATION_ERROR")
    assert response.json()["error"]["field"] == "referral_code"


async def test_a_suspended_referrers_code_stops_working(
    app: Any, client: httpx.AsyncClient
) -> None:
    referrer = await register_and_login(client, first_name="Zanele", last_name="Dlamini")
    code = await my_code(client, referrer)
    await app.state.services.auth.set_user_status(referrer["user"]["id"], "suspended")
    assert refusal(await client.get(f"/api/auth/referral/{code}")) == (404, "NOT_FOUND")
