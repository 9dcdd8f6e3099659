"""Social login: OpenID Connect ID tokens verified against a local stand-in provider
that serves its discovery document and JWKS over HTTP (a real server on 127.0.0.1)."""

from __future__ import annotations

import json
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa

from platform_api.settings import Settings
from tests.conftest import make_settings, register_and_login

CLIENT_ID = "kliniki-web.apps.example"
NONCE = "n-0S6_WzA2Mj-kliniki"


class Provider:
    """A stand-in OpenID provider: one RSA key, served as JWKS, and a token minter."""

    def __init__(self) -> None:
        self.key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self.kid = "provider-key-1"
        self.port = _free_port()
        self.issuer = f"http://127.0.0.1:{self.port}"
        self.requests: list[str] = []

    def jwks(self) -> dict[str, Any]:
        public = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(self.key.public_key()))
        return {"keys": [{**public, "kid": self.kid, "use": "sig", "alg": "RS256"}]}

    def discovery(self) -> dict[str, Any]:
        return {"issuer": self.issuer, "jwks_uri": f"{self.issuer}/jwks.json",
                "id_token_signing_alg_values_supported": ["RS256"]}

    def id_token(self, *, key: Any = None, kid: str | None = None, alg: str = "RS256",
                 **claims: Any) -> str:
        now = int(time.time())
        payload = {"iss": self.issuer, "sub": "248289761001", "aud": CLIENT_ID,
                   "iat": now, "exp": now + 300, "nonce": NONCE,
                   "email": "amina.odhiambo@gmail.example", "email_verified": True,
                   "given_name": "Amina", "family_name": "Odhiambo", **claims}
        payload = {k: v for k, v in payload.items() if v is not None}
        return jwt.encode(payload, key or self.key, algorithm=alg,
                          headers={"kid": kid or self.kid})


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def provider() -> Iterator[Provider]:
    stand_in = Provider()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            stand_in.requests.append(self.path)
            documents = {"/.well-known/openid-configuration": stand_in.discovery(),
                         "/jwks.json": stand_in.jwks()}
            body = json.dumps(documents.get(self.path, {})).encode()
            self.send_response(200 if self.path in documents else 404)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:  # keep the test output quiet
            pass

    server = ThreadingHTTPServer(("127.0.0.1", stand_in.port), Handler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02},
                              daemon=True)
    thread.start()
    try:
        yield stand_in
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def settings(tmp_path: Path, provider: Provider) -> Settings:
    return make_settings(tmp_path, oidc_providers={
        "kliniki-id": {"issuer": provider.issuer, "client_id": CLIENT_ID}})


async def social_login(client: httpx.AsyncClient, id_token: str, **extra: Any
                       ) -> httpx.Response:
    body = {"provider": "kliniki-id", "id_token": id_token, "nonce": NONCE, **extra}
    return await client.post("/api/auth/social-login", json=body)


def refusal(response: httpx.Response) -> tuple[int, str]:
    return response.status_code, response.json()["error"]["code"]


async def test_first_social_login_creates_a_verified_account_and_the_next_finds_it(
    client: httpx.AsyncClient, provider: Provider
) -> None:
    first = await social_login(client, provider.id_token())
    assert first.status_code == 200, first.text
    session = first.json()["data"]
    assert session["token"].startswith("v4.public.")
    assert session["user"]["email"] == "amina.odhiambo@gmail.example"
    assert session["user"]["first_name"] == "Amina"
    me = await client.get("/api/auth/me", headers={"Authorization": f"Bearer {session['token']}"})
    assert me.json()["data"]["email_verified"] is True
    again = await social_login(client, provider.id_token(email="changed@gmail.example"))
    assert again.json()["data"]["user"]["id"] == session["user"]["id"]
    assert provider.requests.count("/jwks.json") == 1  # the key set is cached
    assert "/.well-known/openid-configuration" in provider.requests


async def test_a_verified_address_links_to_the_existing_account(
    client: httpx.AsyncClient, provider: Provider
) -> None:
    person = await register_and_login(client, email="kwame.mensah@gmail.example")
    response = await social_login(client, provider.id_token(
        sub="1170", email="Kwame.Mensah@gmail.example", given_name="Kwame"))
    assert response.json()["data"]["user"]["id"] == person["user"]["id"]


async def test_an_unverified_address_neither_links_nor_creates(
    client: httpx.AsyncClient, provider: Provider
) -> None:
    await register_and_login(client, email="kwame.mensah@gmail.example")
    response = await social_login(client, provider.id_token(
        sub="666", email="kwame.mensah@gmail.example", email_verified=False))
    assert refusal(response) == (422, "EMAIL_NOT_VERIFIED")


@pytest.mark.parametrize(("change", "reason"), [
    ({"aud": "another-client"}, "aud"),
    ({"iss": "https://impostor.example"}, "issuer"),
    ({"exp": int(time.time()) - 120}, "expired"),
    ({"nonce": "someone-elses-nonce"}, "nonce"),
    ({"nonce": None}, "nonce"),
    ({"iat": None}, "iat"),
])
async def test_id_tokens_with_wrong_claims_are_refused(
    client: httpx.AsyncClient, provider: Provider, change: dict[str, Any], reason: str
) -> None:
    response = await social_login(client, provider.id_token(**change))
    assert refusal(response) == (401, "INVALID_ID_TOKEN")
    assert reason in response.json()["error"]["message"]


async def test_id_tokens_with_a_bad_signature_or_key_are_refused(
    client: httpx.AsyncClient, provider: Provider
) -> None:
    stranger = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    forged = await social_login(client, provider.id_token(key=stranger))
    assert refusal(forged) == (401, "INVALID_ID_TOKEN")
    assert "signature" in forged.json()["error"]["message"]
    unknown_kid = await social_login(client, provider.id_token(key=stranger, kid="rotated-2"))
    assert refusal(unknown_kid) == (401, "INVALID_ID_TOKEN")
    symmetric = await social_login(client, provider.id_token(key=CLIENT_ID * 2, alg="HS256"))
    assert refusal(symmetric) == (401, "INVALID_ID_TOKEN")
    assert "algorithm" in symmetric.json()["error"]["message"]
    unsigned = jwt.encode({"iss": provider.issuer, "sub": "1", "aud": CLIENT_ID,
                           "nonce": NONCE}, key=None, algorithm="none")
    assert refusal(await social_login(client, unsigned)) == (401, "INVALID_ID_TOKEN")
    assert refusal(await social_login(client, "not.a.jwt")) == (401, "INVALID_ID_TOKEN")


async def test_an_unknown_provider_is_a_validation_error(client: httpx.AsyncClient,
                                                         provider: Provider) -> None:
    response = await client.post("/api/auth/social-login", json={
        "provider": "facebook", "id_token": provider.id_token(), "nonce": NONCE})
    assert refusal(response) == (422, "VALIDATION_ERROR")
    assert response.json()["error"]["field"] == "provider"


async def test_social_login_goes_through_mfa_when_the_account_has_it(
    app: Any, client: httpx.AsyncClient, provider: Provider
) -> None:
    session = (await social_login(client, provider.id_token())).json()["data"]
    headers = {"Authorization": f"Bearer {session['token']}"}
    secret = (await client.post("/api/auth/mfa/enroll", headers=headers)).json()["data"]["secret"]
    import pyotp

    app.state.services.auth.mfa.clock = time.time
    await client.post("/api/auth/mfa/verify", headers=headers,
                      json={"code": pyotp.TOTP(secret).now()})
    pending = (await social_login(client, provider.id_token(jti=str(uuid.uuid4())))).json()
    assert pending["data"]["mfa_required"] is True


async def test_refused_social_logins_are_audited(app: Any, client: httpx.AsyncClient,
                                                 provider: Provider) -> None:
    await social_login(client, provider.id_token(aud="another-client"))
    bodies = await app.state.services.fhir.search("AuditEvent", [])
    assert any(b["outcome"] == "4" and b["entity"][0]["detail"][0]["valueString"]
               == "oidc:kliniki-id" for b in bodies)
