"""Token hygiene through the whole app: key rotation and retirement, tokens of other
PASETO versions and purposes, tampered footers, wrong audience, expiry, credentials of
the wrong kind. Every refusal is a 401 (an OperationOutcome under /fhir)."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from typing import Any

import httpx
import pyseto
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from pyseto import Key

from platform_api.auth.tokens import rfc3339


def claims_for(user_id: str, **changes: Any) -> dict[str, Any]:
    now = time.time()
    return {"iss": "healthplatform", "sub": user_id, "aud": "healthplatform",
            "jti": str(uuid.uuid4()), "iat": rfc3339(now), "exp": rfc3339(now + 600),
            "roles": [], **changes}


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def refusal(response: httpx.Response) -> tuple[int, str]:
    return response.status_code, response.json()["error"]["code"]


def pem(private_key: Any) -> bytes:
    return private_key.private_bytes(serialization.Encoding.PEM,  # type: ignore[no-any-return]
                                     serialization.PrivateFormat.PKCS8,
                                     serialization.NoEncryption())


def auth_of(app: Any) -> Any:
    return app.state.services.auth


async def test_after_rotation_old_tokens_work_until_the_old_key_retires(
    app: Any, client: httpx.AsyncClient, user: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    auth = auth_of(app)
    old = auth.keys.signing_key
    # Signed by hand, so no cache of this process has seen it verified.
    long_lived = pyseto.encode(old.secret, claims_for(user["user"]["id"], exp=rfc3339(
        time.time() + 7200)), footer={"kid": old.kid}, serializer=json).decode()
    await asyncio.sleep(0.001)  # key file names carry a microsecond stamp
    new = auth.keys.rotate()
    assert new.kid != old.kid
    assert (await client.get("/api/auth/me", headers=user["headers"])).status_code == 200
    assert (await client.get("/api/auth/me", headers=bearer(long_lived))).status_code == 200
    fresh = (await client.post("/api/auth/login", json={
        "email": user["user"]["email"], "password": "correct horse battery"})).json()["data"]
    assert json.loads(pyseto.Token.new(fresh["token"]).footer)["kid"] == new.kid  # type: ignore[arg-type]

    retired_by = time.time() + app.state.services.settings.access_token_ttl_seconds + 61
    monkeypatch.setattr(auth.keys, "clock", lambda: retired_by)
    auth._sessions.clear()  # as in a process that has not seen these tokens yet
    response = await client.get("/api/auth/me", headers=bearer(long_lived))
    assert refusal(response) == (401, "INVALID_TOKEN")
    assert "retired" in response.json()["error"]["message"]
    assert (await client.get("/api/auth/me", headers=bearer(fresh["token"]))).status_code == 200


@pytest.mark.parametrize("version_purpose", [
    "v1.local", "v1.public", "v2.local", "v2.public", "v3.local", "v3.public", "v4.local",
])
async def test_tokens_of_other_versions_and_purposes_are_refused(
    app: Any, client: httpx.AsyncClient, user: dict[str, Any], version_purpose: str
) -> None:
    version, purpose = int(version_purpose[1]), version_purpose.split(".")[1]
    if purpose == "local":
        key = Key.new(version, "local", b"k" * 32)
    else:
        private = {1: lambda: rsa.generate_private_key(65537, 2048),
                   2: ed25519.Ed25519PrivateKey.generate,
                   3: lambda: ec.generate_private_key(ec.SECP384R1())}[version]()
        key = Key.new(version, "public", pem(private))
    kid = auth_of(app).keys.signing_key.kid
    token = pyseto.encode(key, claims_for(user["user"]["id"]), footer={"kid": kid},
                          serializer=json).decode()
    assert token.startswith(version_purpose + ".")
    response = await client.get("/api/auth/me", headers=bearer(token))
    assert refusal(response) == (401, "INVALID_TOKEN")
    assert version_purpose in response.json()["error"]["message"]
    fhir = await client.get("/fhir/Patient", headers=bearer(token))
    assert fhir.status_code == 401 and fhir.json()["issue"][0]["code"] == "login"


async def test_tampered_footers_are_refused(
    app: Any, client: httpx.AsyncClient, user: dict[str, Any]
) -> None:
    prefix = ".".join(user["token"].split(".")[:3])  # v4.public.<signed message>
    for footer in (
        {"kid": auth_of(app).keys.signing_key.kid, "role": "SUPER:ADMIN"},  # extra claim
        {"kid": "k4.pid.AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"},  # another key id
        {"kid": auth_of(app).keys.signing_key.kid.upper()},
        {},
    ):
        encoded = pyseto.utils.base64url_encode(json.dumps(footer).encode()).decode()
        response = await client.get("/api/auth/me", headers=bearer(f"{prefix}.{encoded}"))
        assert refusal(response) == (401, "INVALID_TOKEN"), footer
    for broken in (prefix, f"{prefix}.", f"{prefix}.bm90LWpzb24"):
        assert refusal(await client.get("/api/auth/me", headers=bearer(broken))) == (
            401, "INVALID_TOKEN"), broken


async def test_wrong_audience_issuer_expired_and_not_yet_valid_tokens_are_refused(
    app: Any, client: httpx.AsyncClient, user: dict[str, Any]
) -> None:
    key = auth_of(app).keys.signing_key
    now = time.time()
    for changes, code in (
        ({"aud": "another-platform"}, "INVALID_TOKEN"),
        ({"iss": "someone-else"}, "INVALID_TOKEN"),
        ({"exp": rfc3339(now - 5)}, "TOKEN_EXPIRED"),
        ({"nbf": rfc3339(now + 600)}, "INVALID_TOKEN"),
        ({"exp": int(now + 600)}, "INVALID_TOKEN"),  # an epoch number, not RFC 3339
    ):
        token = pyseto.encode(key.secret, claims_for(user["user"]["id"], **changes),
                              footer={"kid": key.kid}, serializer=json).decode()
        assert refusal(await client.get("/api/auth/me", headers=bearer(token))) == (
            401, code), changes
        fhir = await client.get("/fhir/Patient", headers=bearer(token))
        assert fhir.status_code == 401, changes


async def test_credentials_of_the_wrong_kind_are_refused(
    client: httpx.AsyncClient, user: dict[str, Any]
) -> None:
    mfa_like = await client.get("/api/auth/me", headers=bearer("mfa_" + "x" * 43))
    assert refusal(mfa_like) == (401, "INVALID_TOKEN")
    assert "MFA token" in mfa_like.json()["error"]["message"]
    key_as_bearer = await client.get("/api/auth/me", headers=bearer("hpk_ABCDEFGH." + "x" * 32))
    assert refusal(key_as_bearer) == (401, "INVALID_TOKEN")
    assert "X-API-Key" in key_as_bearer.json()["error"]["message"]
    both = await client.get("/fhir/Patient", headers={
        **user["headers"], "X-API-Key": "hpk_ABCDEFGH." + "x" * 32})
    assert both.status_code == 401
    basic = await client.get("/api/auth/me", headers={"Authorization": "Basic YW1pbmE6eA=="})
    assert refusal(basic) == (401, "UNAUTHORIZED")
