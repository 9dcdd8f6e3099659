"""Trusting CDS clients (CDS Hooks 2.0): the JWT signed with the spec's own example key
(ES384) and with RS384 and ES256 keys is accepted; unsigned, HMAC, expired, too-long,
wrong-audience, unknown-issuer, foreign-jku and replayed tokens are refused; JWK Sets
by URL come from a stand-in server, cached, fetched again for a rotated key."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from jwt.algorithms import ECAlgorithm, RSAAlgorithm
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from cds_hooks.auth import ClientAccess, ClientVerifier, ReplayGuard
from cds_hooks.models import CdsError
from fhir_server.access import CREATE, READ
from tests.cds_hooks.examples_data import example
from tests.cds_hooks.stand_in import serve

EHR = "https://fhir-ehr.example.com/"
SERVICE_URL = "https://cds.example.org/cds-services/drug-interactions"
SPEC_PRIVATE = example("client-jwk-private.spec-example.json")
SPEC_JWKS = example("client-jwks-public.spec-example.json")


def spec_key() -> Any:
    return ECAlgorithm.from_jwk(SPEC_PRIVATE)


def sign(key: Any, alg: str = "ES384", kid: str | None = "example-kid", *,
         jku: str | None = None, **claims: Any) -> str:
    now = int(time.time())
    payload = {"iss": EHR, "aud": SERVICE_URL, "exp": now + 240, "iat": now,
               "jti": str(uuid.uuid4()), "tenant": "2ddd6c3a-8e9a-44c6-a305-52111ad302a2"}
    payload.update(claims)
    headers = {"typ": "JWT", **({"kid": kid} if kid else {}), **({"jku": jku} if jku else {})}
    return jwt.encode({k: v for k, v in payload.items() if v is not None}, key, algorithm=alg,
                      headers=headers)


@pytest.fixture
async def http() -> Any:
    async with httpx.AsyncClient(timeout=5) as client:
        yield client


def verifier(http: httpx.AsyncClient, clients: dict[str, Any] | None = None) -> ClientVerifier:
    return ClientVerifier.from_settings(clients or {EHR: {"jwks": SPEC_JWKS}}, http)


async def test_the_specs_example_key_and_claims_are_accepted(http: httpx.AsyncClient) -> None:
    # The spec's example header and payload, with times that have not passed.
    header = example("client-jwt-header.spec-example.json")
    claims = example("client-jwt-payload.spec-example.json")
    now = int(time.time())
    token = jwt.encode({**claims, "aud": SERVICE_URL, "iat": now, "exp": now + 300},
                       spec_key(), algorithm="ES384",
                       headers={"kid": header["kid"], "typ": "JWT"})
    verified = await verifier(http).verify(token, [SERVICE_URL])
    assert verified.client.iss == EHR and "sub" not in verified.claims


@pytest.mark.parametrize("alg", ["RS384", "ES256"])
async def test_rs384_and_es256_clients_are_accepted(http: httpx.AsyncClient, alg: str) -> None:
    private = rsa.generate_private_key(public_exponent=65537, key_size=2048) \
        if alg == "RS384" else ec.generate_private_key(ec.SECP256R1())
    public = (RSAAlgorithm if alg == "RS384" else ECAlgorithm).to_jwk(
        private.public_key(), as_dict=True)
    clients = {EHR: {"jwks": {"keys": [{**public, "kid": "k1", "alg": alg}]}}}
    verified = await verifier(http, clients).verify(sign(private, alg, "k1"), [SERVICE_URL])
    assert verified.client.iss == EHR


def _unsigned(**claims: Any) -> str:
    now = int(time.time())
    payload = {"iss": EHR, "aud": SERVICE_URL, "exp": now + 60, "iat": now, "jti": "j"}
    return jwt.encode({**payload, **claims}, None, algorithm="none")


REFUSALS: dict[str, tuple[Any, str]] = {
    "unsigned": (lambda: _unsigned(), "alg 'none'"),
    "HMAC": (lambda: jwt.encode({"iss": EHR, "aud": SERVICE_URL, "exp": time.time() + 60,
                                 "iat": time.time(), "jti": "j"},
                                "a-shared-secret-of-32-bytes!!!!!", algorithm="HS256"),
             "alg 'HS256'"),
    "expired": (lambda: sign(spec_key(), exp=int(time.time()) - 120), "expired"),
    "more than 5 minutes": (lambda: sign(spec_key(), exp=int(time.time()) + 3600),
                            "5 minutes"),
    "wrong audience": (lambda: sign(spec_key(), aud="https://cds.example.org/cds-services/x"),
                       "aud"),
    "unknown issuer": (lambda: sign(spec_key(), iss="https://rogue-ehr.example.net/"),
                       "not a trusted CDS client"),
    "no jti": (lambda: sign(spec_key(), jti=None), "jti"),
    "unknown kid": (lambda: sign(spec_key(), kid="other-kid"), "No single key"),
    "foreign jku": (lambda: jwt.encode(
        {"iss": EHR, "aud": SERVICE_URL, "exp": int(time.time()) + 60,
         "iat": int(time.time()), "jti": "j"}, spec_key(), algorithm="ES384",
        headers={"kid": "example-kid", "jku": "https://attacker.example/jwks"}), "jku"),
    "signed by another key": (lambda: sign(ec.generate_private_key(ec.SECP384R1())),
                              "not valid"),
    "not a JWT": (lambda: "opaque-token", "not a JWT"),
}


@pytest.mark.parametrize("case", sorted(REFUSALS))
async def test_bad_tokens_are_refused_with_a_401(http: httpx.AsyncClient, case: str) -> None:
    make, message = REFUSALS[case]
    with pytest.raises(CdsError) as refused:
        await verifier(http).verify(make(), [SERVICE_URL])
    assert refused.value.status == 401
    assert message in refused.value.message
    assert refused.value.headers["WWW-Authenticate"].startswith('Bearer error="invalid_token"')


async def test_a_replayed_jti_is_refused(http: httpx.AsyncClient) -> None:
    check = verifier(http)
    token = sign(spec_key())
    await check.verify(token, [SERVICE_URL])
    with pytest.raises(CdsError, match="already used"):
        await check.verify(token, [SERVICE_URL])


async def test_replays_are_shared_through_redis_when_configured() -> None:
    redis_url = "redis://127.0.0.1:6379/15"
    first, second = ReplayGuard(redis_url), ReplayGuard(redis_url)
    jti = str(uuid.uuid4())
    try:
        try:
            assert await first.first_use(EHR, jti, time.time() + 60)
        except OSError as exc:  # redis.ConnectionError is an OSError too
            pytest.skip(f"no Redis at {redis_url}: {exc}")
        assert not await second.first_use(EHR, jti, time.time() + 60)
    finally:
        await first.close()
        await second.close()


class JwksServer:
    """A CDS client's JWK Set URL: serves the current keys, counts the fetches."""

    def __init__(self) -> None:
        self.keys: list[dict[str, Any]] = list(SPEC_JWKS["keys"])
        self.fetches = 0
        self.app = Starlette(routes=[Route("/jwks.json", self.jwks)])

    async def jwks(self, request: Request) -> JSONResponse:
        self.fetches += 1
        return JSONResponse({"keys": self.keys})


@pytest.fixture
def jwks_server() -> Iterator[tuple[JwksServer, str]]:
    stand_in = JwksServer()
    with serve(stand_in.app) as base:
        yield stand_in, f"{base}/jwks.json"


async def test_keys_by_url_are_cached_and_fetched_again_for_a_rotated_key(
        http: httpx.AsyncClient, jwks_server: tuple[JwksServer, str]) -> None:
    stand_in, uri = jwks_server
    check = verifier(http, {EHR: {"jwks_uri": uri}})
    await check.verify(sign(spec_key(), jku=uri), [SERVICE_URL])
    await check.verify(sign(spec_key()), [SERVICE_URL])
    assert stand_in.fetches == 1
    rotated = ec.generate_private_key(ec.SECP384R1())
    stand_in.keys.append({**ECAlgorithm.to_jwk(rotated.public_key(), as_dict=True),
                          "kid": "2026-03", "alg": "ES384"})
    await check.verify(sign(rotated, kid="2026-03"), [SERVICE_URL])
    assert stand_in.fetches == 2


def test_a_client_reads_only_its_organizations_records_and_writes_nothing() -> None:
    verifier_config = {"jwks": SPEC_JWKS, "organizations": ["org-kisumu"]}
    from cds_hooks.auth import CdsClient

    access = ClientAccess(CdsClient.from_config(EHR, verifier_config))
    grants = access.grants(READ)
    assert grants is not None and grants[0].owners == {"org-kisumu"}
    assert access.grants(CREATE) == ()
    with pytest.raises(ValueError, match="exactly one"):
        CdsClient.from_config(EHR, {})
