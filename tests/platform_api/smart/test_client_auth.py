"""Backend services (client_credentials with private_key_jwt, RS384 and ES384): the
assertion rules, keys registered inline or fetched from a JWKS URL (a stand-in server on
a real socket), and what a backend token reaches."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import jwt
import pytest
from asgi_lifespan import LifespanManager
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from platform_api.app import create_app
from platform_api.settings import Settings
from platform_api.smart.client_auth import ASSERTION_TYPE
from tests.browser_support import run_server
from tests.conftest import make_clinic_admin, make_settings
from tests.platform_api.smart.support import Clinic, bearer, make_clinic

JSON = dict[str, Any]
TOKEN_URL = "http://testserver/oauth2/token"
SCOPE = "system/Observation.rs system/Patient.rs"


class ClientKeys:
    """A backend client's key pair (ES384 or RS384) and its public JWK."""

    def __init__(self, alg: str, kid: str):
        self.alg, self.kid = alg, kid
        if alg == "ES384":
            self.private: Any = ec.generate_private_key(ec.SECP384R1())
            public = jwt.algorithms.ECAlgorithm.to_jwk(self.private.public_key(), as_dict=True)
        else:
            self.private = rsa.generate_private_key(public_exponent=65537, key_size=2048)
            public = jwt.algorithms.RSAAlgorithm.to_jwk(self.private.public_key(), as_dict=True)
        self.jwk = {**public, "kid": kid, "alg": alg}

    def assertion(self, client_id: str, *, aud: str = TOKEN_URL, expires_in: int = 240,
                  jti: str | None = None, **header: Any) -> str:
        now = int(time.time())
        claims = {"iss": client_id, "sub": client_id, "aud": aud, "exp": now + expires_in,
                  "iat": now, "jti": jti or str(uuid.uuid4())}
        return jwt.encode(claims, self.private, algorithm=self.alg,
                          headers={"kid": self.kid, "typ": "JWT", **header})


class JwksServer:
    """A client's JWKS URL: counts fetches, answers with the Cache-Control it is told."""

    def __init__(self) -> None:
        self.keys: list[JSON] = []
        self.cache_control = "max-age=600"
        self.fetches = 0

    async def jwks(self, request: Request) -> JSONResponse:
        self.fetches += 1
        return JSONResponse({"keys": self.keys},
                            headers={"Cache-Control": self.cache_control})


REFETCH = 0.3  # seconds between fetches of one jwks_uri in these tests


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    """The stand-in JWKS server is on 127.0.0.1: the allow-list opens it (a clinic's own
    network, as an operator would); small bounds so the tests see them."""
    return make_settings(tmp_path, outbound_allow=["127.0.0.1/32"], base_url="http://testserver",
                         smart_jwks_refetch_seconds=REFETCH, smart_jwks_max_bytes=16_384)


@pytest.fixture
def jwks_server() -> Iterator[tuple[JwksServer, str]]:
    server = JwksServer()
    with run_server(Starlette(routes=[Route("/jwks.json", server.jwks)])) as url:
        yield server, f"{url}/jwks.json"


async def register_backend(client: httpx.AsyncClient, clinic: Clinic, **metadata: Any
                           ) -> str:
    body = {"client_name": "Kisumu Lab Sync", "grant_types": ["client_credentials"],
            "token_endpoint_auth_method": "private_key_jwt", "scope": SCOPE,
            "organization_id": clinic.org_id, **metadata}
    response = await client.post("/oauth2/register", json=body,
                                 headers=clinic.platform_admin["headers"])
    assert response.status_code == 201, response.text
    return str(response.json()["client_id"])


async def token(client: httpx.AsyncClient, assertion: str, scope: str = SCOPE,
                **form: str) -> httpx.Response:
    return await client.post("/oauth2/token", data={
        "grant_type": "client_credentials", "scope": scope,
        "client_assertion_type": ASSERTION_TYPE, "client_assertion": assertion, **form})


@pytest.mark.parametrize("alg", ["ES384", "RS384"])
async def test_a_backend_client_signing_its_jwt_gets_a_short_system_token(
        client: httpx.AsyncClient, clinic: Clinic, alg: str,
        jwks_server: tuple[JwksServer, str]) -> None:
    keys = ClientKeys(alg, f"lab-sync-{alg.lower()}")
    server, url = jwks_server
    server.keys = [keys.jwk]
    client_id = await register_backend(client, clinic, jwks_uri=url)
    response = await token(client, keys.assertion(client_id))
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["token_type"] == "Bearer" and body["scope"] == SCOPE
    assert 0 < body["expires_in"] <= 300 and "refresh_token" not in body
    assert response.headers["cache-control"] == "no-store"
    found = (await client.get("/fhir/Observation", headers=bearer(body["access_token"])))
    assert found.status_code == 200
    assert {e["resource"]["id"] for e in found.json()["entry"]} == {
        o for ids in clinic.observations.values() for o in ids}


async def test_keys_registered_inline_work_and_only_the_matching_kid_and_kty(
        client: httpx.AsyncClient, clinic: Clinic) -> None:
    rs, es = ClientKeys("RS384", "rs-1"), ClientKeys("ES384", "es-1")
    client_id = await register_backend(client, clinic, jwks={"keys": [rs.jwk, es.jwk]})
    assert (await token(client, rs.assertion(client_id))).status_code == 200
    assert (await token(client, es.assertion(client_id))).status_code == 200
    impostor = ClientKeys("ES384", "rs-1")  # right kid, wrong key type for its alg
    refused = await token(client, impostor.assertion(client_id))
    assert refused.status_code == 401 and refused.json()["error"] == "invalid_client"


@pytest.mark.parametrize(("change", "says"), [
    ({"expires_in": -30}, "expired"),
    ({"expires_in": 900}, "five minutes"),
    ({"aud": "https://other.example.org/token"}, "aud"),
    ({"jku": "https://attacker.example.net/jwks.json"}, "jku"),
])
async def test_assertions_that_break_a_rule_are_invalid_client(
        client: httpx.AsyncClient, clinic: Clinic, change: JSON, says: str) -> None:
    keys = ClientKeys("ES384", "es-1")
    client_id = await register_backend(client, clinic, jwks={"keys": [keys.jwk]})
    refused = await token(client, keys.assertion(client_id, **change))
    assert refused.status_code == 401
    assert refused.json()["error"] == "invalid_client" and says in \
        refused.json()["error_description"]


async def test_a_replayed_jti_is_refused(client: httpx.AsyncClient, clinic: Clinic) -> None:
    keys = ClientKeys("ES384", "es-1")
    client_id = await register_backend(client, clinic, jwks={"keys": [keys.jwk]})
    assertion = keys.assertion(client_id, jti="lab-sync-0001")
    assert (await token(client, assertion)).status_code == 200
    replayed = await token(client, assertion)
    assert replayed.status_code == 401 and "replay" in replayed.json()["error_description"]
    fresh_same_jti = await token(client, keys.assertion(client_id, jti="lab-sync-0001"))
    assert fresh_same_jti.status_code == 401


async def test_a_wrong_assertion_type_or_grant_type_is_refused(
        client: httpx.AsyncClient, clinic: Clinic) -> None:
    keys = ClientKeys("ES384", "es-1")
    client_id = await register_backend(client, clinic, jwks={"keys": [keys.jwk]})
    wrong_type = await token(client, keys.assertion(client_id),
                             client_assertion_type="urn:example:not-jwt")
    assert wrong_type.status_code in (400, 401)
    not_a_grant = await client.post("/oauth2/token", data={
        "grant_type": "not_a_grant_type", "client_assertion_type": ASSERTION_TYPE,
        "client_assertion": keys.assertion(client_id)})
    assert not_a_grant.status_code == 400


async def test_only_registered_system_scopes_are_granted(
        client: httpx.AsyncClient, clinic: Clinic) -> None:
    keys = ClientKeys("ES384", "es-1")
    client_id = await register_backend(client, clinic, jwks={"keys": [keys.jwk]})
    narrowed = await token(client, keys.assertion(client_id),
                           "system/Observation.rs system/Condition.rs patient/*.rs")
    assert narrowed.json()["scope"] == "system/Observation.rs"
    refused = await token(client, keys.assertion(client_id), "system/Condition.rs")
    assert refused.status_code == 400 and refused.json()["error"] == "invalid_scope"
    headers = bearer(narrowed.json()["access_token"])
    patient = await client.get(f"/fhir/Patient/{clinic.amina}", headers=headers)
    assert patient.status_code == 403 and "system/Patient.r" in patient.text


async def test_an_organizations_client_reaches_its_data_and_a_platform_wide_one_all(
        client: httpx.AsyncClient, clinic: Clinic) -> None:
    other = await make_clinic_admin(client, name="Eldoret Family Clinic",
                                    first_name="Chebet", last_name="Rotich")
    theirs = await client.post(f"/api/organizations/{other['org_id']}/patients",
                               headers=other["headers"], json={
                                   "first_name": "Kibet", "last_name": "Langat",
                                   "date_of_birth": "1990-01-15", "gender": "male",
                                   "mrn": "EFC-0001"})
    assert theirs.status_code == 201
    keys = ClientKeys("ES384", "es-1")
    scoped = await register_backend(client, clinic, jwks={"keys": [keys.jwk]})
    wide = await register_backend(client, clinic, jwks={"keys": [keys.jwk]},
                                  organization_id=None, platform_wide=True)
    nowhere = await register_backend(client, clinic, jwks={"keys": [keys.jwk]},
                                     organization_id=None)

    async def patients(client_id: str) -> set[str]:
        access = (await token(client, keys.assertion(client_id))).json()["access_token"]
        found = (await client.get("/fhir/Patient", headers=bearer(access))).json()
        return {e["resource"]["id"] for e in found.get("entry", [])}

    assert await patients(scoped) == {clinic.amina, clinic.baraka}
    assert await patients(wide) >= {clinic.amina, clinic.baraka,
                                    theirs.json()["data"]["id"]}
    assert await patients(nowhere) == set()


async def test_fetched_key_sets_are_cached_and_refetched_at_a_bounded_rate(
        client: httpx.AsyncClient, clinic: Clinic,
        jwks_server: tuple[JwksServer, str]) -> None:
    server, url = jwks_server
    first, rotated = ClientKeys("ES384", "2026-03"), ClientKeys("ES384", "2026-04")
    server.keys = [first.jwk]
    client_id = await register_backend(client, clinic, jwks_uri=url)
    for _ in range(3):
        assert (await token(client, first.assertion(client_id))).status_code == 200
    assert server.fetches == 1
    server.keys = [first.jwk, rotated.jwk]
    # an unknown kid within the refetch interval: refused, nothing fetched
    for _ in range(3):
        assert (await token(client, rotated.assertion(client_id))).status_code == 401
    assert server.fetches == 1
    await asyncio.sleep(REFETCH + 0.1)  # past it: one fetch finds the rotated key
    assert (await token(client, rotated.assertion(client_id))).status_code == 200
    assert server.fetches == 2
    server.cache_control = "no-store"  # not kept past the refetch interval either
    uncached = await register_backend(client, clinic, jwks_uri=f"{url}?client=2")
    for _ in range(2):
        assert (await token(client, rotated.assertion(uncached))).status_code == 200
    assert server.fetches == 3
    await asyncio.sleep(REFETCH + 0.1)
    assert (await token(client, rotated.assertion(uncached))).status_code == 200
    assert server.fetches == 4


async def test_the_key_set_is_not_fetched_for_an_assertion_that_cannot_pass(
        client: httpx.AsyncClient, clinic: Clinic,
        jwks_server: tuple[JwksServer, str]) -> None:
    server, url = jwks_server
    keys = ClientKeys("ES384", "es-1")
    server.keys = [keys.jwk]
    client_id = await register_backend(client, clinic, jwks_uri=url)
    for bad in (keys.assertion(client_id, expires_in=-60),
                keys.assertion(client_id, aud="https://elsewhere.example/token"),
                keys.assertion(client_id, kid=""),
                keys.assertion("no-such-client")):
        assert (await token(client, bad)).status_code == 401
    assert server.fetches == 0
    assert (await token(client, keys.assertion(client_id))).status_code == 200
    assert server.fetches == 1


async def test_an_internal_jwks_uri_is_refused_without_telling_open_from_closed(
        tmp_path: Path, jwks_server: tuple[JwksServer, str]) -> None:
    """Result 1: with the default settings (no allow-list) the server fetches no
    loopback or private URL, and its answer is the same for an open and a closed port."""
    server, url = jwks_server
    keys = ClientKeys("ES384", "es-1")
    server.keys = [keys.jwk]
    app = create_app(make_settings(tmp_path, base_url="http://testserver"))
    async with LifespanManager(app, startup_timeout=30), httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://testserver") as http:
        clinic = await make_clinic(app, http)
        descriptions = []
        for jwks_uri in (url, "http://127.0.0.1:9/jwks.json"):
            client_id = await register_backend(http, clinic, jwks_uri=jwks_uri)
            refused = await token(http, keys.assertion(client_id))
            assert refused.status_code == 401
            descriptions.append(refused.json()["error_description"].replace(jwks_uri, "U"))
        assert server.fetches == 0 and descriptions[0] == descriptions[1]


async def test_a_key_set_larger_than_the_bound_is_refused(
        client: httpx.AsyncClient, clinic: Clinic,
        jwks_server: tuple[JwksServer, str]) -> None:
    """Result 2: the answer is capped (HEALTHPLATFORM_SMART_JWKS_MAX_BYTES)."""
    server, url = jwks_server
    keys = ClientKeys("ES384", "es-1")
    server.keys = [keys.jwk] + [{**keys.jwk, "kid": f"padding-{i}"} for i in range(400)]
    client_id = await register_backend(client, clinic, jwks_uri=url)
    refused = await token(client, keys.assertion(client_id))
    assert refused.status_code == 401 and "could not be used" in \
        refused.json()["error_description"]
    server.keys = [keys.jwk]
    await asyncio.sleep(REFETCH + 0.1)
    assert (await token(client, keys.assertion(client_id))).status_code == 200
