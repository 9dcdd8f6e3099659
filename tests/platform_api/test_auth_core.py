"""Auth core: registration, login, PASETO access tokens, refresh rotation, logout.

Real HTTP through a small ASGI app that mounts the auth router, a real SQLite store in
a temporary directory, real keys on disk.
"""

from __future__ import annotations

import asyncio
import json
import os
import stat
from collections.abc import AsyncIterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pyseto
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from pyseto import Key

from fhir_server.store.sqlite import SQLiteStore
from platform_api.auth.dependencies import (
    authenticate_request,
    optional_principal,
    require_platform_admin,
    require_roles,
    require_super_admin,
)
from platform_api.auth.keys import generate_key_file
from platform_api.auth.principal import Principal
from platform_api.auth.routes import router
from platform_api.auth.service import AuthService
from platform_api.envelope import ApiError, JSONResponse, error_response, ok
from platform_api.settings import Settings

PASSWORD = "Kilimanjaro-2026"
AMINA = {
    "email": "Amina.Odhiambo@Kenyatta-Hospital.example",
    "password": PASSWORD,
    "first_name": "Amina",
    "last_name": "Odhiambo",
}
KWAME = {
    "email": "kwame.mensah@korlebu.example",
    "password": "Volta-river-77",
    "first_name": "Kwame",
    "last_name": "Mensah",
    "registration_role": "DOCTOR",
}


# -- the app under test --------------------------------------------------------------
def make_settings(data_dir: Path, **overrides: Any) -> Settings:
    # Cheap argon2 parameters keep the suite fast; production uses the defaults.
    values: dict[str, Any] = {"argon2_time_cost": 1, "argon2_memory_kib": 1024, **overrides}
    return Settings(data_dir=data_dir, **values)


def build_app(auth: AuthService, store: SQLiteStore, settings: Settings) -> FastAPI:
    app = FastAPI()
    app.state.services = SimpleNamespace(settings=settings, store=store, auth=auth)
    app.include_router(router)

    @app.exception_handler(ApiError)
    async def render_api_error(_: Request, exc: ApiError) -> JSONResponse:
        return error_response(
            exc.status, exc.code, exc.message, field=exc.field, headers=exc.headers
        )

    @app.exception_handler(RequestValidationError)
    async def render_validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0]
        field = ".".join(str(p) for p in first["loc"][1:])
        return error_response(422, "VALIDATION_ERROR", first["msg"], field=field)

    @app.get("/test/doctors-only")
    async def doctors_only(p: Principal = Depends(require_roles("ORG:DOCTOR"))) -> JSONResponse:
        return ok({"user_id": p.user_id})

    @app.get("/test/platform-admin")
    async def platform_admin(p: Principal = Depends(require_platform_admin)) -> JSONResponse:
        return ok({"user_id": p.user_id})

    @app.get("/test/super-admin")
    async def super_admin(p: Principal = Depends(require_super_admin)) -> JSONResponse:
        return ok({"user_id": p.user_id})

    @app.get("/test/optional")
    async def optional(p: Principal | None = Depends(optional_principal)) -> JSONResponse:
        return ok({"user_id": p.user_id if p else None})

    @app.get("/test/outside-di")
    async def outside_di(request: Request) -> JSONResponse:
        principal = await authenticate_request(request)
        return ok({"same": request.state.principal is principal})

    return app


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return make_settings(tmp_path)


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SQLiteStore]:
    store = SQLiteStore(tmp_path / "healthplatform.db")
    await store.open()
    yield store
    await store.close()


@pytest.fixture
async def auth(settings: Settings, store: SQLiteStore) -> AuthService:
    service = AuthService(settings, store)
    await service.start()
    return service


@pytest.fixture
async def client(
    auth: AuthService, store: SQLiteStore, settings: Settings
) -> AsyncIterator[httpx.AsyncClient]:
    app = build_app(auth, store, settings)
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app), base_url="http://platform.test"
    ) as client:
        yield client


@pytest.fixture
async def elsewhere_store(tmp_path: Path, store: SQLiteStore) -> AsyncIterator[SQLiteStore]:
    """A second connection to the same database file, as another app process has."""
    other = SQLiteStore(tmp_path / "healthplatform.db")
    await other.open()
    yield other
    await other.close()


async def other_process(settings: Settings, store: SQLiteStore) -> AuthService:
    """A second AuthService on the same data directory and database: another process."""
    service = AuthService(settings, store, recheck_seconds=0)
    await service.start()
    return service


async def register(client: httpx.AsyncClient, person: dict[str, str]) -> dict[str, Any]:
    response = await client.post("/api/auth/register", json=person)
    assert response.status_code == 201, response.text
    return response.json()["data"]  # type: ignore[no-any-return]


async def login(client: httpx.AsyncClient, person: dict[str, str]) -> dict[str, Any]:
    response = await client.post(
        "/api/auth/login", json={"email": person["email"], "password": person["password"]}
    )
    assert response.status_code == 200, response.text
    return response.json()["data"]  # type: ignore[no-any-return]


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def error_of(response: httpx.Response) -> tuple[int, str]:
    body = response.json()
    assert body["success"] is False
    return response.status_code, body["error"]["code"]


# -- registration --------------------------------------------------------------------
async def test_register_returns_201_with_the_user_resource(client: httpx.AsyncClient) -> None:
    user = await register(client, AMINA)
    assert set(user) == {"id", "email", "first_name", "last_name", "registration_role"}
    assert user["email"] == "amina.odhiambo@kenyatta-hospital.example"
    assert user["registration_role"] == "PATIENT"


async def test_register_stores_an_active_user_with_argon2id_hash(
    client: httpx.AsyncClient, store: SQLiteStore
) -> None:
    user = await register(client, AMINA)
    stored = await store.get_document("users", user["id"])
    assert stored is not None
    assert stored["password_hash"].startswith("$argon2id$")
    assert PASSWORD not in json.dumps(stored)
    assert stored["status"] == "active" and stored["roles"] == []
    assert len(stored["referral_code"]) == 8


async def test_register_with_taken_email_answers_as_for_a_new_account(
        client: httpx.AsyncClient, app: Any) -> None:
    """Registration does not tell who is registered (login and reset do not either): the
    same 201 and User shape, nothing stored, no event; the owner is told by e-mail
    (test_auth_email)."""
    first = await register(client, AMINA)
    again = {**AMINA, "email": AMINA["email"].upper(), "first_name": "Mallory"}
    response = await client.post("/api/auth/register", json=again)
    assert response.status_code == 201
    answered = response.json()["data"]
    assert set(answered) == set(first) and answered["id"] != first["id"]
    assert answered["email"] == first["email"]
    stored = await app.state.services.store.find_documents("users")
    assert [u["first_name"] for u in stored] == ["Amina"]
    events = [e for e in await app.state.services.store.pending_events(100)
              if e["topic"] == "platform.auth.user_created"]
    assert len(events) <= 1  # the first registration's (if not relayed yet), no other
    login = await client.post("/api/auth/login", json={"email": AMINA["email"],
                                                       "password": AMINA["password"]})
    assert login.json()["data"]["user"]["id"] == first["id"]


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"email": "amina.at.kenyatta"}, "email"),
        ({"password": "short"}, "password"),
        ({"first_name": "   "}, "first_name"),
        ({"registration_role": "SUPER_ADMIN"}, "registration_role"),
    ],
)
async def test_register_with_invalid_field_returns_422(
    client: httpx.AsyncClient, change: dict[str, str], field: str
) -> None:
    response = await client.post("/api/auth/register", json={**AMINA, **change})
    assert error_of(response) == (422, "VALIDATION_ERROR")
    assert response.json()["error"]["field"] == field


async def test_doctor_registration_is_stored_and_emits_user_created(
    client: httpx.AsyncClient, store: SQLiteStore
) -> None:
    user = await register(client, KWAME)
    assert user["registration_role"] == "DOCTOR"
    stored = await store.get_document("users", user["id"])
    assert stored is not None and stored["registration_role"] == "DOCTOR"
    events = [e for e in await store.pending_events() if e["topic"] == "platform.auth.user_created"]
    assert len(events) == 1
    assert events[0]["source_service"] == "auth"
    assert events[0]["payload"] == {
        "user_id": user["id"],
        "email": "kwame.mensah@korlebu.example",
        "first_name": "Kwame",
        "last_name": "Mensah",
        "registration_role": "DOCTOR",
    }


async def test_refused_registration_emits_no_event(
    client: httpx.AsyncClient, store: SQLiteStore
) -> None:
    await register(client, AMINA)
    await client.post("/api/auth/register", json=AMINA)
    assert len(await store.pending_events()) == 1


# -- login ---------------------------------------------------------------------------
async def test_login_returns_user_and_token_pair(client: httpx.AsyncClient) -> None:
    user = await register(client, AMINA)
    response = await client.post(
        "/api/auth/login", json={"email": AMINA["email"], "password": PASSWORD}
    )
    assert response.status_code == 200
    assert response.headers["cache-control"] == "no-store"
    data = response.json()["data"]
    assert data["user"] == user
    assert data["token"].startswith("v4.public.")
    assert data["refresh_token"].startswith("rt_")
    assert data["token_type"] == "Bearer"
    assert 890 <= data["expires_in"] <= 900


async def test_access_token_carries_the_registered_claims_and_kid(
    client: httpx.AsyncClient, auth: AuthService
) -> None:
    user = await register(client, AMINA)
    token = (await login(client, AMINA))["token"]
    footer = json.loads(pyseto.Token.new(token).footer)  # type: ignore[arg-type]
    assert footer == {"kid": auth.keys.signing_key.kid}
    assert footer["kid"].startswith("k4.pid.")
    claims = pyseto.decode(
        auth.keys.signing_key.public, token, deserializer=json, aud="healthplatform"
    ).payload
    assert isinstance(claims, dict)
    assert claims["iss"] == "healthplatform" and claims["sub"] == user["id"]
    assert claims["email"] == "amina.odhiambo@kenyatta-hospital.example"
    assert isinstance(claims["exp"], str) and claims["exp"].endswith("+00:00")
    assert isinstance(claims["iat"], str) and claims["jti"] and claims["roles"] == []


async def test_login_with_wrong_password_returns_401_invalid_credentials(
    client: httpx.AsyncClient,
) -> None:
    await register(client, AMINA)
    response = await client.post(
        "/api/auth/login", json={"email": AMINA["email"], "password": "Kilimanjaro-2025"}
    )
    assert error_of(response) == (401, "INVALID_CREDENTIALS")


async def test_login_with_unknown_email_returns_the_same_401(client: httpx.AsyncClient) -> None:
    await register(client, AMINA)
    response = await client.post(
        "/api/auth/login", json={"email": "nobody@kenyatta-hospital.example", "password": PASSWORD}
    )
    assert error_of(response) == (401, "INVALID_CREDENTIALS")
    assert response.json()["error"]["message"] == "E-mail or password is incorrect"


async def test_login_rehashes_a_password_made_with_older_parameters(
    client: httpx.AsyncClient, store: SQLiteStore, tmp_path: Path
) -> None:
    user = await register(client, AMINA)
    stronger = AuthService(make_settings(tmp_path, argon2_time_cost=2), store)
    await stronger.start()
    await stronger.login(AMINA["email"], PASSWORD)
    stored = await store.get_document("users", user["id"])
    assert stored is not None and ",t=2," in stored["password_hash"]
    await stronger.login(AMINA["email"], PASSWORD)


# -- /me and access-token verification ----------------------------------------------
async def test_me_with_token_returns_the_account(client: httpx.AsyncClient) -> None:
    user = await register(client, AMINA)
    token = (await login(client, AMINA))["token"]
    response = await client.get("/api/auth/me", headers=bearer(token))
    assert response.status_code == 200
    account = response.json()["data"]
    assert account["id"] == user["id"] and account["status"] == "active"
    assert "password_hash" not in account


async def test_me_without_token_returns_401_with_www_authenticate(
    client: httpx.AsyncClient,
) -> None:
    response = await client.get("/api/auth/me")
    assert error_of(response) == (401, "UNAUTHORIZED")
    assert response.headers["www-authenticate"] == "Bearer"


async def test_me_with_basic_credentials_returns_401(client: httpx.AsyncClient) -> None:
    response = await client.get("/api/auth/me", headers={"Authorization": "Basic YTpi"})
    assert error_of(response) == (401, "UNAUTHORIZED")


async def test_me_with_tampered_token_returns_401_invalid_token(client: httpx.AsyncClient) -> None:
    await register(client, AMINA)
    token = (await login(client, AMINA))["token"]
    body, footer = token.removeprefix("v4.public.").split(".")
    flipped = body[:10] + ("A" if body[10] != "A" else "B") + body[11:]
    response = await client.get("/api/auth/me", headers=bearer(f"v4.public.{flipped}.{footer}"))
    assert error_of(response) == (401, "INVALID_TOKEN")
    assert response.headers["www-authenticate"].startswith("Bearer")


async def test_me_with_garbage_token_returns_401_invalid_token(client: httpx.AsyncClient) -> None:
    for garbage in ("v4.public.%%%.@@@", "v4.public.", "not-a-token", "v4.public." + "A" * 5000):
        response = await client.get("/api/auth/me", headers=bearer(garbage))
        assert error_of(response) == (401, "INVALID_TOKEN"), garbage


async def test_me_with_expired_token_returns_401_token_expired(
    client: httpx.AsyncClient, auth: AuthService, store: SQLiteStore
) -> None:
    user = await register(client, AMINA)
    stored = await store.get_document("users", user["id"])
    assert stored is not None
    expired = auth.issue_access_token(stored, ttl_seconds=-60).token
    response = await client.get("/api/auth/me", headers=bearer(expired))
    assert error_of(response) == (401, "TOKEN_EXPIRED")


async def test_cached_token_is_refused_once_it_expires(
    client: httpx.AsyncClient, auth: AuthService, store: SQLiteStore
) -> None:
    user = await register(client, AMINA)
    stored = await store.get_document("users", user["id"])
    assert stored is not None
    token = auth.issue_access_token(stored, ttl_seconds=2).token
    assert (await client.get("/api/auth/me", headers=bearer(token))).status_code == 200
    await asyncio.sleep(2.1)
    response = await client.get("/api/auth/me", headers=bearer(token))
    assert error_of(response) == (401, "TOKEN_EXPIRED")


def _private_pem() -> bytes:
    return Ed25519PrivateKey.generate().private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


async def test_v4_local_token_is_refused(client: httpx.AsyncClient, auth: AuthService) -> None:
    await register(client, AMINA)
    local = Key.new(4, "local", b"a" * 32)
    token = pyseto.encode(
        local, {"sub": "x", "aud": "healthplatform"}, footer={"kid": auth.keys.signing_key.kid}
    ).decode()
    response = await client.get("/api/auth/me", headers=bearer(token))
    assert error_of(response) == (401, "INVALID_TOKEN")
    assert "v4.local" in response.json()["error"]["message"]


async def test_v2_public_token_is_refused(client: httpx.AsyncClient, auth: AuthService) -> None:
    pem = auth.keys.signing_key.path.read_bytes()  # even with our own key material
    token = pyseto.encode(
        Key.new(2, "public", pem),
        {"sub": "x", "aud": "healthplatform"},
        footer={"kid": auth.keys.signing_key.kid},
    ).decode()
    response = await client.get("/api/auth/me", headers=bearer(token))
    assert error_of(response) == (401, "INVALID_TOKEN")
    assert "v2.public" in response.json()["error"]["message"]


async def test_token_signed_by_an_unknown_key_is_refused(
    client: httpx.AsyncClient, auth: AuthService, store: SQLiteStore
) -> None:
    user = await register(client, AMINA)
    stranger = Key.new(4, "public", _private_pem())
    claims = {
        "iss": "healthplatform",
        "sub": user["id"],
        "aud": "healthplatform",
        "jti": "j-1",
        "exp": "2099-01-01T00:00:00+00:00",
        "roles": ["SUPER:ADMIN"],
    }
    own_kid = pyseto.encode(stranger, claims, footer={"kid": stranger.to_peer_paserk_id()}).decode()
    response = await client.get("/api/auth/me", headers=bearer(own_kid))
    assert error_of(response) == (401, "INVALID_TOKEN")
    assert "unknown signing key" in response.json()["error"]["message"]
    # Claiming our kid does not help: the signature is checked with our key only.
    our_kid = pyseto.encode(stranger, claims, footer={"kid": auth.keys.signing_key.kid}).decode()
    assert error_of(await client.get("/api/auth/me", headers=bearer(our_kid))) == (
        401,
        "INVALID_TOKEN",
    )
    no_footer = pyseto.encode(stranger, claims).decode()
    assert error_of(await client.get("/api/auth/me", headers=bearer(no_footer))) == (
        401,
        "INVALID_TOKEN",
    )


async def test_token_for_another_audience_or_issuer_is_refused(
    client: httpx.AsyncClient, auth: AuthService
) -> None:
    user = await register(client, AMINA)
    key = auth.keys.signing_key
    for change in ({"aud": "another-service"}, {"iss": "someone-else"}):
        claims = {
            "iss": "healthplatform",
            "sub": user["id"],
            "aud": "healthplatform",
            "jti": "j-2",
            "exp": "2099-01-01T00:00:00+00:00",
            "roles": [],
            **change,
        }
        token = pyseto.encode(key.secret, claims, footer={"kid": key.kid}).decode()
        response = await client.get("/api/auth/me", headers=bearer(token))
        assert error_of(response) == (401, "INVALID_TOKEN"), change


# -- keys ----------------------------------------------------------------------------
async def test_first_start_creates_a_private_key_file_readable_by_owner_only(
    auth: AuthService, tmp_path: Path
) -> None:
    files = list((tmp_path / "keys").glob("ed25519-*.pem"))
    assert len(files) == 1
    assert stat.S_IMODE(os.stat(files[0]).st_mode) == 0o600
    assert files[0].read_bytes().startswith(b"-----BEGIN PRIVATE KEY-----")


async def test_restart_reuses_the_existing_key(
    auth: AuthService, settings: Settings, elsewhere_store: SQLiteStore
) -> None:
    again = await other_process(settings, elsewhere_store)
    assert again.keys.signing_key.kid == auth.keys.signing_key.kid


async def test_tokens_signed_with_the_old_key_still_verify_after_rotation(
    client: httpx.AsyncClient,
    auth: AuthService,
    settings: Settings,
    elsewhere_store: SQLiteStore,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    await register(client, AMINA)
    old_token = (await login(client, AMINA))["token"]
    old_kid = auth.keys.signing_key.kid
    await asyncio.sleep(0.001)  # key file names carry a microsecond timestamp
    generate_key_file(tmp_path / "keys")

    restarted = await other_process(settings, elsewhere_store)
    assert set(restarted.keys.kids) == {old_kid, restarted.keys.signing_key.kid}
    assert restarted.keys.signing_key.kid != old_kid
    assert (await restarted.authenticate(old_token)).email == AMINA["email"].lower()
    new_token = (await restarted.login(AMINA["email"], PASSWORD)).tokens.access_token
    assert json.loads(pyseto.Token.new(new_token).footer)["kid"] != old_kid  # type: ignore[arg-type]
    # The running process has not reloaded yet: it rescans on the unknown kid.
    monkeypatch.setattr("platform_api.auth.keys.RESCAN_INTERVAL_SECONDS", 0.0)
    assert (await auth.authenticate(new_token)).email == AMINA["email"].lower()


# -- refresh -------------------------------------------------------------------------
async def test_refresh_returns_a_new_pair_and_the_old_refresh_token_is_used(
    client: httpx.AsyncClient,
) -> None:
    await register(client, AMINA)
    first = await login(client, AMINA)
    response = await client.post(
        "/api/auth/refresh", json={"refresh_token": first["refresh_token"]}
    )
    assert response.status_code == 200
    second = response.json()["data"]
    assert second["refresh_token"] != first["refresh_token"]
    assert second["token"] != first["token"] and second["user"] == first["user"]
    assert (await client.get("/api/auth/me", headers=bearer(second["token"]))).status_code == 200
    third = await client.post("/api/auth/refresh", json={"refresh_token": second["refresh_token"]})
    assert third.status_code == 200


async def test_reused_refresh_token_revokes_the_whole_family(client: httpx.AsyncClient) -> None:
    await register(client, AMINA)
    first = await login(client, AMINA)
    rotated = (
        await client.post("/api/auth/refresh", json={"refresh_token": first["refresh_token"]})
    ).json()["data"]
    reuse = await client.post("/api/auth/refresh", json={"refresh_token": first["refresh_token"]})
    assert error_of(reuse) == (401, "REFRESH_TOKEN_REUSED")
    successor = await client.post(
        "/api/auth/refresh", json={"refresh_token": rotated["refresh_token"]}
    )
    assert error_of(successor) == (401, "INVALID_REFRESH_TOKEN")
    me = await client.get("/api/auth/me", headers=bearer(rotated["token"]))
    assert error_of(me) == (401, "INVALID_TOKEN")


async def test_reuse_does_not_touch_other_sessions(client: httpx.AsyncClient) -> None:
    await register(client, AMINA)
    phone, laptop = await login(client, AMINA), await login(client, AMINA)
    await client.post("/api/auth/refresh", json={"refresh_token": phone["refresh_token"]})
    await client.post("/api/auth/refresh", json={"refresh_token": phone["refresh_token"]})
    assert (await client.get("/api/auth/me", headers=bearer(laptop["token"]))).status_code == 200
    response = await client.post(
        "/api/auth/refresh", json={"refresh_token": laptop["refresh_token"]}
    )
    assert response.status_code == 200


async def test_concurrent_use_of_one_refresh_token_lets_only_one_through(
    client: httpx.AsyncClient,
) -> None:
    await register(client, AMINA)
    session = await login(client, AMINA)
    answers = await asyncio.gather(
        *[
            client.post("/api/auth/refresh", json={"refresh_token": session["refresh_token"]})
            for _ in range(2)
        ]
    )
    assert sorted(a.status_code for a in answers) == [200, 401]
    refused = next(a for a in answers if a.status_code == 401)
    assert error_of(refused) == (401, "REFRESH_TOKEN_REUSED")


async def test_unknown_refresh_token_returns_401(client: httpx.AsyncClient) -> None:
    response = await client.post("/api/auth/refresh", json={"refresh_token": "rt_made-up"})
    assert error_of(response) == (401, "INVALID_REFRESH_TOKEN")


async def test_refresh_token_is_stored_only_as_a_sha256_hash(
    client: httpx.AsyncClient, store: SQLiteStore
) -> None:
    await register(client, AMINA)
    session = await login(client, AMINA)
    stored = await store.find_documents("refresh_tokens")
    assert len(stored) == 1 and len(stored[0]["id"]) == 64
    assert session["refresh_token"] not in json.dumps(stored)


# -- logout --------------------------------------------------------------------------
async def test_logout_revokes_the_access_token_and_the_refresh_tokens(
    client: httpx.AsyncClient, settings: Settings, elsewhere_store: SQLiteStore
) -> None:
    await register(client, AMINA)
    session = await login(client, AMINA)
    response = await client.post("/api/auth/logout", headers=bearer(session["token"]))
    assert response.status_code == 200 and response.json()["data"] == {"logged_out": True}
    me = await client.get("/api/auth/me", headers=bearer(session["token"]))
    assert error_of(me) == (401, "INVALID_TOKEN")
    refresh = await client.post(
        "/api/auth/refresh", json={"refresh_token": session["refresh_token"]}
    )
    assert error_of(refresh) == (401, "INVALID_REFRESH_TOKEN")
    # Another process learns it from the store.
    elsewhere = await other_process(settings, elsewhere_store)
    with pytest.raises(ApiError) as refused:
        await elsewhere.authenticate(session["token"])
    assert refused.value.code == "INVALID_TOKEN"


async def test_logout_in_another_process_is_seen_after_the_recheck(
    client: httpx.AsyncClient, auth: AuthService, settings: Settings, elsewhere_store: SQLiteStore
) -> None:
    await register(client, AMINA)
    session = await login(client, AMINA)
    assert (await client.get("/api/auth/me", headers=bearer(session["token"]))).status_code == 200
    await (await other_process(settings, elsewhere_store)).logout(session["token"])
    auth.recheck_seconds = 0
    me = await client.get("/api/auth/me", headers=bearer(session["token"]))
    assert error_of(me) == (401, "INVALID_TOKEN")


async def test_logout_without_token_returns_401(client: httpx.AsyncClient) -> None:
    assert error_of(await client.post("/api/auth/logout")) == (401, "UNAUTHORIZED")


# -- account status and roles --------------------------------------------------------
async def test_suspended_user_cannot_log_in_use_tokens_or_refresh(
    client: httpx.AsyncClient, auth: AuthService
) -> None:
    user = await register(client, AMINA)
    session = await login(client, AMINA)
    await auth.set_user_status(user["id"], "suspended")
    login_again = await client.post(
        "/api/auth/login", json={"email": AMINA["email"], "password": PASSWORD}
    )
    assert error_of(login_again) == (403, "ACCOUNT_SUSPENDED")
    me = await client.get("/api/auth/me", headers=bearer(session["token"]))
    assert error_of(me) == (403, "ACCOUNT_SUSPENDED")
    refresh = await client.post(
        "/api/auth/refresh", json={"refresh_token": session["refresh_token"]}
    )
    assert error_of(refresh) == (401, "INVALID_REFRESH_TOKEN")


async def test_suspension_elsewhere_is_seen_after_the_recheck(
    client: httpx.AsyncClient, auth: AuthService, settings: Settings, elsewhere_store: SQLiteStore
) -> None:
    user = await register(client, AMINA)
    session = await login(client, AMINA)
    assert (await client.get("/api/auth/me", headers=bearer(session["token"]))).status_code == 200
    await (await other_process(settings, elsewhere_store)).set_user_status(user["id"], "suspended")
    auth.recheck_seconds = 0
    me = await client.get("/api/auth/me", headers=bearer(session["token"]))
    assert error_of(me) == (403, "ACCOUNT_SUSPENDED")


async def test_reactivated_user_can_log_in_again(
    client: httpx.AsyncClient, auth: AuthService
) -> None:
    user = await register(client, AMINA)
    await auth.set_user_status(user["id"], "suspended")
    await auth.set_user_status(user["id"], "active")
    await login(client, AMINA)


async def test_role_checks_admit_the_role_and_super_admin_only(
    client: httpx.AsyncClient, auth: AuthService
) -> None:
    patient = await register(client, AMINA)
    doctor = await register(client, KWAME)
    await auth.set_roles(doctor["id"], ["ORG:DOCTOR"])
    admin, created = await auth.create_admin(
        "root@platform.example", "Serengeti-root-1", "Platform", "Admin"
    )
    assert created and admin["roles"] == ["SUPER:ADMIN"]
    tokens = {
        "patient": (await login(client, AMINA))["token"],
        "doctor": (await login(client, KWAME))["token"],
        "admin": (
            await auth.login("root@platform.example", "Serengeti-root-1")
        ).tokens.access_token,
    }
    expected = {
        "/test/doctors-only": {"patient": 403, "doctor": 200, "admin": 200},
        "/test/platform-admin": {"patient": 403, "doctor": 403, "admin": 200},
        "/test/super-admin": {"patient": 403, "doctor": 403, "admin": 200},
    }
    for path, by_who in expected.items():
        for who, status in by_who.items():
            response = await client.get(path, headers=bearer(tokens[who]))
            assert response.status_code == status, (path, who)
            if status == 403:
                assert error_of(response) == (403, "FORBIDDEN")
    assert patient["id"] != doctor["id"]


async def test_role_change_applies_to_tokens_already_issued(
    client: httpx.AsyncClient, auth: AuthService
) -> None:
    doctor = await register(client, KWAME)
    token = (await login(client, KWAME))["token"]
    assert (await client.get("/test/doctors-only", headers=bearer(token))).status_code == 403
    await auth.set_roles(doctor["id"], ["ORG:DOCTOR"])
    assert (await client.get("/test/doctors-only", headers=bearer(token))).status_code == 200


async def test_create_admin_promotes_an_existing_account_keeping_its_password(
    client: httpx.AsyncClient, auth: AuthService
) -> None:
    user = await register(client, AMINA)
    admin, created = await auth.create_admin(AMINA["email"], "ignored-password", "A", "O")
    assert not created and admin["id"] == user["id"] and "SUPER:ADMIN" in admin["roles"]
    token = (await login(client, AMINA))["token"]
    assert (await client.get("/test/super-admin", headers=bearer(token))).status_code == 200


async def test_optional_principal_is_none_without_header_and_strict_with_one(
    client: httpx.AsyncClient,
) -> None:
    user = await register(client, AMINA)
    token = (await login(client, AMINA))["token"]
    assert (await client.get("/test/optional")).json()["data"] == {"user_id": None}
    mine = await client.get("/test/optional", headers=bearer(token))
    assert mine.json()["data"] == {"user_id": user["id"]}
    assert error_of(await client.get("/test/optional", headers=bearer("v4.public.x.y"))) == (
        401,
        "INVALID_TOKEN",
    )


async def test_authenticate_request_works_outside_dependency_injection(
    client: httpx.AsyncClient,
) -> None:
    await register(client, AMINA)
    token = (await login(client, AMINA))["token"]
    response = await client.get("/test/outside-di", headers=bearer(token))
    assert response.json()["data"] == {"same": True}
    assert error_of(await client.get("/test/outside-di")) == (401, "UNAUTHORIZED")


# -- documentation and cost ----------------------------------------------------------
async def test_openapi_documents_the_auth_bodies(
    auth: AuthService, store: SQLiteStore, settings: Settings
) -> None:
    schema = build_app(auth, store, settings).openapi()
    assert {
        "/api/auth/register",
        "/api/auth/login",
        "/api/auth/refresh",
        "/api/auth/logout",
        "/api/auth/me",
    } <= set(schema["paths"])
    components = schema["components"]["schemas"]
    assert {"RegisterRequest", "LoginRequest", "RefreshRequest", "Session", "User"} <= set(
        components
    )
    assert "PASETO" in schema["components"]["securitySchemes"]
