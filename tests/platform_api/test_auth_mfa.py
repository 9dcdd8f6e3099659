"""TOTP MFA: enroll (secret, otpauth URI, QR code), verify, the login challenge,
disable; one step of tolerance, no replay, ten single-use recovery codes, limited
attempts. The server's TOTP clock is fixed per test so no 30-second boundary can make
a test flaky."""

from __future__ import annotations

import asyncio
import base64
import time
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlparse

import httpx
import pyotp
import pytest
from asgi_lifespan import LifespanManager

from platform_api.app import create_app
from tests.conftest import make_settings, register_and_login

PASSWORD = "correct horse battery"
STEP = 30
# The middle of a step: codes of the steps either side are unambiguous.
NOW = (int(time.time()) // STEP) * STEP + STEP / 2


@pytest.fixture(autouse=True)
def fixed_totp_clock(app: Any) -> None:
    app.state.services.auth.mfa.clock = lambda: NOW


def code(secret: str, steps: int = 0) -> str:
    return pyotp.TOTP(secret).at(NOW + steps * STEP)


async def enroll(client: httpx.AsyncClient, headers: dict[str, str]) -> dict[str, Any]:
    response = await client.post("/api/auth/mfa/enroll", headers=headers)
    assert response.status_code == 200, response.text
    return response.json()["data"]  # type: ignore[no-any-return]


async def enable(client: httpx.AsyncClient, headers: dict[str, str], steps: int = 0
                 ) -> tuple[str, list[str]]:
    """Enroll and verify; returns (secret, recovery codes)."""
    secret = (await enroll(client, headers))["secret"]
    response = await client.post("/api/auth/mfa/verify", headers=headers,
                                 json={"code": code(secret, steps)})
    assert response.status_code == 200, response.text
    return secret, response.json()["data"]["recovery_codes"]


async def password_login(client: httpx.AsyncClient, email: str) -> dict[str, Any]:
    response = await client.post("/api/auth/login", json={"email": email, "password": PASSWORD})
    assert response.status_code == 200, response.text
    return response.json()["data"]  # type: ignore[no-any-return]


async def challenge(client: httpx.AsyncClient, mfa_token: str, answer: str) -> httpx.Response:
    return await client.post("/api/auth/mfa/challenge", json={"code": answer},
                             headers={"Authorization": f"Bearer {mfa_token}"})


def error_code(response: httpx.Response) -> tuple[int, str]:
    return response.status_code, response.json()["error"]["code"]


# -- enrollment ------------------------------------------------------------------------
async def test_enroll_returns_the_secret_an_otpauth_uri_and_qr_codes(
    client: httpx.AsyncClient, user: dict[str, Any]
) -> None:
    response = await client.post("/api/auth/mfa/enroll", headers=user["headers"])
    assert response.headers["cache-control"] == "no-store"
    data = response.json()["data"]
    assert len(data["secret"]) == 32
    uri = urlparse(data["otpauth_uri"])
    assert (uri.scheme, uri.netloc) == ("otpauth", "totp")
    assert unquote(uri.path) == f"/healthplatform:{user['user']['email']}"
    assert parse_qs(uri.query)["secret"] == [data["secret"]]
    assert parse_qs(uri.query)["issuer"] == ["healthplatform"]
    png = data["qr_png"].removeprefix("data:image/png;base64,")
    assert base64.b64decode(png).startswith(b"\x89PNG\r\n\x1a\n")
    assert data["qr_svg"].startswith("data:image/svg+xml")
    me = (await client.get("/api/auth/me", headers=user["headers"])).json()["data"]
    assert me["mfa_enabled"] is False  # pending until verified


async def test_the_secret_is_stored_encrypted(
    app: Any, client: httpx.AsyncClient, user: dict[str, Any]
) -> None:
    secret = (await enroll(client, user["headers"]))["secret"]
    stored = await app.state.services.store.get_document("mfa_factors", user["user"]["id"])
    assert stored["status"] == "pending"
    assert secret not in str(stored)


async def test_verify_activates_mfa_and_returns_ten_recovery_codes(
    client: httpx.AsyncClient, user: dict[str, Any]
) -> None:
    secret = (await enroll(client, user["headers"]))["secret"]
    wrong = await client.post("/api/auth/mfa/verify", headers=user["headers"],
                              json={"code": code(secret, 5)})
    assert error_code(wrong) == (401, "INVALID_MFA_CODE")
    response = await client.post("/api/auth/mfa/verify", headers=user["headers"],
                                 json={"code": code(secret)})
    assert response.status_code == 200
    codes = response.json()["data"]["recovery_codes"]
    assert len(codes) == 10 and len(set(codes)) == 10
    me = (await client.get("/api/auth/me", headers=user["headers"])).json()["data"]
    assert me["mfa_enabled"] is True
    again = await client.post("/api/auth/mfa/enroll", headers=user["headers"])
    assert error_code(again) == (409, "MFA_ALREADY_ENABLED")


async def test_verify_without_enrollment_is_a_conflict(
    client: httpx.AsyncClient, user: dict[str, Any]
) -> None:
    response = await client.post("/api/auth/mfa/verify", headers=user["headers"],
                                 json={"code": "123456"})
    assert error_code(response) == (409, "MFA_NOT_PENDING")


# -- logging in ------------------------------------------------------------------------
async def test_login_with_mfa_answers_mfa_required_and_the_challenge_finishes_it(
    client: httpx.AsyncClient, user: dict[str, Any]
) -> None:
    secret, _ = await enable(client, user["headers"], steps=-1)
    first = await password_login(client, user["user"]["email"])
    assert first["mfa_required"] is True and "token" not in first
    assert first["mfa_token"].startswith("mfa_") and first["expires_in"] == 300
    response = await challenge(client, first["mfa_token"], code(secret))
    assert response.status_code == 200, response.text
    session = response.json()["data"]
    assert session["token"].startswith("v4.public.") and session["refresh_token"]
    assert session["user"]["id"] == user["user"]["id"]
    me = await client.get("/api/auth/me", headers={"Authorization": f"Bearer {session['token']}"})
    assert me.status_code == 200
    reused = await challenge(client, first["mfa_token"], code(secret, 1))
    assert error_code(reused) == (401, "INVALID_MFA_TOKEN")


async def test_codes_one_step_either_side_pass_and_two_steps_away_fail(
    client: httpx.AsyncClient, user: dict[str, Any]
) -> None:
    secret, _ = await enable(client, user["headers"], steps=-1)
    token = (await password_login(client, user["user"]["email"]))["mfa_token"]
    assert error_code(await challenge(client, token, code(secret, -2))) == (
        401, "INVALID_MFA_CODE")
    assert error_code(await challenge(client, token, code(secret, 2))) == (
        401, "INVALID_MFA_CODE")
    assert (await challenge(client, token, code(secret, 1))).status_code == 200


async def test_a_code_is_accepted_once(client: httpx.AsyncClient, user: dict[str, Any]) -> None:
    secret, _ = await enable(client, user["headers"])  # spends the current step
    token = (await password_login(client, user["user"]["email"]))["mfa_token"]
    replay = await challenge(client, token, code(secret))
    assert error_code(replay) == (401, "INVALID_MFA_CODE")
    assert "already used" in replay.json()["error"]["message"]
    older = await challenge(client, token, code(secret, -1))  # before the last accepted one
    assert error_code(older) == (401, "INVALID_MFA_CODE")
    assert (await challenge(client, token, code(secret, 1))).status_code == 200


async def test_two_logins_racing_with_one_code_let_one_through(
    client: httpx.AsyncClient, user: dict[str, Any]
) -> None:
    secret, _ = await enable(client, user["headers"], steps=-1)
    tokens = [(await password_login(client, user["user"]["email"]))["mfa_token"]
              for _ in range(2)]
    answers = await asyncio.gather(*(challenge(client, t, code(secret)) for t in tokens))
    assert sorted(a.status_code for a in answers) == [200, 401]


async def test_recovery_codes_complete_a_login_once_each(
    client: httpx.AsyncClient, user: dict[str, Any]
) -> None:
    _, recovery = await enable(client, user["headers"])
    for recovery_code in recovery[:2]:
        token = (await password_login(client, user["user"]["email"]))["mfa_token"]
        assert (await challenge(client, token, recovery_code.lower())).status_code == 200
    token = (await password_login(client, user["user"]["email"]))["mfa_token"]
    used = await challenge(client, token, recovery[0])
    assert error_code(used) == (401, "INVALID_MFA_CODE")
    assert error_code(await challenge(client, token, "ABCDE-23456")) == (401, "INVALID_MFA_CODE")


async def test_disable_needs_a_current_code(client: httpx.AsyncClient, user: dict[str, Any]
                                            ) -> None:
    secret, _ = await enable(client, user["headers"], steps=-1)
    wrong = await client.post("/api/auth/mfa/disable", headers=user["headers"],
                              json={"code": code(secret, -1)})  # already used
    assert error_code(wrong) == (401, "INVALID_MFA_CODE")
    response = await client.post("/api/auth/mfa/disable", headers=user["headers"],
                                 json={"code": code(secret)})
    assert response.status_code == 200 and response.json()["data"] == {"enabled": False}
    assert "token" in await password_login(client, user["user"]["email"])
    again = await client.post("/api/auth/mfa/disable", headers=user["headers"],
                              json={"code": code(secret, 1)})
    assert error_code(again) == (409, "MFA_NOT_ENABLED")


async def test_disable_accepts_a_recovery_code(client: httpx.AsyncClient, user: dict[str, Any]
                                               ) -> None:
    _, recovery = await enable(client, user["headers"])
    response = await client.post("/api/auth/mfa/disable", headers=user["headers"],
                                 json={"code": recovery[3]})
    assert response.status_code == 200


# -- refusals --------------------------------------------------------------------------
async def test_the_challenge_needs_the_mfa_token_not_an_access_token(
    client: httpx.AsyncClient, user: dict[str, Any]
) -> None:
    secret, _ = await enable(client, user["headers"], steps=-1)
    assert error_code(await client.post("/api/auth/mfa/challenge", json={"code": "123456"})
                      ) == (401, "UNAUTHORIZED")
    with_access_token = await client.post("/api/auth/mfa/challenge", headers=user["headers"],
                                          json={"code": code(secret)})
    assert with_access_token.status_code == 401
    assert error_code(await challenge(client, "mfa_" + "A" * 43, code(secret))) == (
        401, "INVALID_MFA_TOKEN")
    token = (await password_login(client, user["user"]["email"]))["mfa_token"]
    as_access = await client.get("/api/auth/me", headers={"Authorization": f"Bearer {token}"})
    assert error_code(as_access) == (401, "INVALID_TOKEN")


async def test_an_expired_mfa_token_is_refused(
    app: Any, client: httpx.AsyncClient, user: dict[str, Any]
) -> None:
    secret, _ = await enable(client, user["headers"], steps=-1)
    token = (await password_login(client, user["user"]["email"]))["mfa_token"]
    store = app.state.services.store
    [pending] = await store.find_documents("mfa_challenges")
    async with store.unit_of_work() as uow:  # five minutes later
        uow.put_document("mfa_challenges", pending["id"],
                         {**pending, "expires_at": "2020-01-01T00:00:00+00:00"})
        await uow.commit()
    expired = await challenge(client, token, code(secret))
    assert error_code(expired) == (401, "INVALID_MFA_TOKEN")
    assert "expired" in expired.json()["error"]["message"]


async def test_mfa_attempts_are_limited_per_account(tmp_path: Path) -> None:
    application = create_app(make_settings(tmp_path, rate_limits={"mfa": "4/300"}))
    async with LifespanManager(application, startup_timeout=30):
        application.state.services.auth.mfa.clock = lambda: NOW
        transport = httpx.ASGITransport(app=application)
        async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as c:
            person = await register_and_login(c)
            secret, _ = await enable(c, person["headers"], steps=-1)  # attempt 1
            token = (await password_login(c, person["user"]["email"]))["mfa_token"]
            for _ in range(3):
                assert error_code(await challenge(c, token, "000000")) == (
                    401, "INVALID_MFA_CODE")
            limited = await challenge(c, token, code(secret))
            assert error_code(limited) == (429, "RATE_LIMITED")
            assert int(limited.headers["retry-after"]) > 0
            assert "MFA attempts" in limited.json()["error"]["message"]


async def test_api_keys_cannot_manage_mfa(client: httpx.AsyncClient, user: dict[str, Any]
                                          ) -> None:
    created = await client.post("/api/developer/keys", headers=user["headers"],
                                json={"name": "sync", "scopes": ["*:*"]})
    key = {"X-API-Key": created.json()["data"]["key"]}
    assert error_code(await client.post("/api/auth/mfa/enroll", headers=key)) == (
        403, "INSUFFICIENT_SCOPE")

