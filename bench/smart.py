"""SMART costs: backend token issuance, and what scope enforcement adds to a FHIR read.

Runs the whole app in one process on a fresh SQLite store in a temporary directory
(rate limits off), calling it as ASGI directly (no HTTP client in the measured path).
Measures:

- ``client_credentials_per_s``: ``POST /oauth2/token`` with ``grant_type=client_credentials``
  and an ES384 ``client_assertion`` (assertions are signed beforehand: the client's
  cost): form parsing, the client document, the ES384 signature check, the ``jti``
  replay guard written to the store, scope negotiation and the PASETO signature;
- ``read_platform_us``: ``GET /fhir/Observation/{id}`` by an organization's doctor with
  their platform login token;
- ``read_smart_user_us`` / ``read_smart_patient_us``: the same read by the same doctor
  through a SMART app's token with ``user/*.rs``, and with ``patient/*.rs`` for the
  observation's patient (the compartment check included);
- ``scope_overhead_us`` and ``scope_overhead_pct``: the SMART read minus the platform
  read (the worse of the two SMART reads), in µs and as a share of the platform read.
  Target: at most 5%.

Each read figure is the median of ``--reads`` reads of its kind, the three kinds taking
turns read by read (a busy moment of a shared machine weighs on all alike). Prints one
JSON line.
Usage: ``python bench/smart.py [--tokens 300] [--reads 3000]``
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import shutil
import statistics
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import httpx
import jwt
from asgi_lifespan import LifespanManager
from cryptography.hazmat.primitives.asymmetric import ec

from platform_api.app import create_app
from platform_api.auth.tokens import SmartClaims
from platform_api.settings import Settings

PASSWORD = "correct horse battery staple"
ASSERTION_TYPE = "urn:ietf:params:oauth:client-assertion-type:jwt-bearer"
TOKEN_URL = "http://bench/oauth2/token"
Call = Callable[[], Awaitable[None]]


def asgi_call(app: Any, method: str, path: str, headers: list[tuple[bytes, bytes]],
              body: bytes = b"", expect: int = 200) -> Call:
    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start" and message["status"] != expect:
            raise RuntimeError(f"{method} {path} answered {message['status']}")

    async def one() -> None:
        scope = {"type": "http", "http_version": "1.1", "method": method, "path": path,
                 "raw_path": path.encode(), "root_path": "", "scheme": "http",
                 "query_string": b"", "headers": [(b"host", b"bench"), *headers],
                 "client": ("127.0.0.1", 5000), "server": ("bench", 80)}
        await app(scope, receive, send)
    return one


async def setup(app: Any) -> dict[str, Any]:
    """A clinic, its doctor, a patient with an observation, and a backend client."""
    services = app.state.services
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://bench") as client:
        async def user(email: str, first: str) -> dict[str, Any]:
            await client.post("/api/auth/register", json={
                "email": email, "password": PASSWORD, "first_name": first,
                "last_name": "Kamau"})
            login = await client.post("/api/auth/login", json={"email": email,
                                                               "password": PASSWORD})
            data = login.json()["data"]
            return {"id": data["user"]["id"], "token": data["token"],
                    "headers": {"Authorization": f"Bearer {data['token']}"}}

        doctor = await user("doctor@kliniki.example", "Wanjiru")
        org = (await client.post("/api/organizations", headers=doctor["headers"], json={
            "name": "Kliniki ya Bench", "country": "KE"})).json()["data"]["id"]
        patient = (await client.post(f"/api/organizations/{org}/patients",
                                     headers=doctor["headers"], json={
            "first_name": "Amina", "last_name": "Odhiambo", "date_of_birth": "1988-04-12",
            "gender": "female", "mrn": "B-1"})).json()["data"]["id"]
        observation = (await client.post("/fhir/Observation", headers=doctor["headers"], json={
            "resourceType": "Observation", "status": "final",
            "code": {"coding": [{"system": "http://loinc.org", "code": "8867-4",
                                 "display": "Heart rate"}]},
            "subject": {"reference": f"Patient/{patient}"},
            "valueQuantity": {"value": 72, "unit": "/min"}})).json()["id"]
        await services.auth.create_admin("admin@kliniki.example", PASSWORD, "Grace", "Admin")
        admin = await client.post("/api/auth/login", json={"email": "admin@kliniki.example",
                                                           "password": PASSWORD})
        admin_headers = {"Authorization": f"Bearer {admin.json()['data']['token']}"}
        key = ec.generate_private_key(ec.SECP384R1())
        jwk = {**jwt.algorithms.ECAlgorithm.to_jwk(key.public_key(), as_dict=True),
               "kid": "bench-1"}
        app_client = (await client.post("/oauth2/register", headers=admin_headers, json={
            "client_name": "Bench app", "redirect_uris": ["https://bench.example/cb"],
            "token_endpoint_auth_method": "none",
            "scope": "patient/*.rs user/*.rs"})).json()["client_id"]
        backend = (await client.post("/oauth2/register", headers=admin_headers, json={
            "client_name": "Bench sync", "grant_types": ["client_credentials"],
            "token_endpoint_auth_method": "private_key_jwt", "jwks": {"keys": [jwk]},
            "scope": "system/Observation.rs", "organization_id": org})).json()["client_id"]
    user_doc = await services.store.get_document("users", doctor["id"])

    def smart(scope: str) -> str:
        return services.auth.issue_smart_token(
            doctor["id"], SmartClaims(app_client, scope, patient), ttl_seconds=3600,
            user=user_doc).token
    return {"doctor": doctor, "observation": observation, "backend": backend, "key": key,
            "platform": doctor["token"], "smart_user": smart("user/*.rs"),
            "smart_patient": smart("patient/*.rs")}


def assertion(key: Any, client_id: str) -> str:
    now = int(time.time())
    return jwt.encode({"iss": client_id, "sub": client_id, "aud": TOKEN_URL,
                       "exp": now + 290, "jti": str(uuid.uuid4())}, key, algorithm="ES384",
                      headers={"kid": "bench-1", "typ": "JWT"})


async def issuance_per_s(app: Any, data: dict[str, Any], count: int) -> float:
    bodies = [urlencode({"grant_type": "client_credentials", "scope": "system/Observation.rs",
                         "client_assertion_type": ASSERTION_TYPE,
                         "client_assertion": assertion(data["key"], data["backend"])}
                        ).encode() for _ in range(count)]
    headers = [(b"content-type", b"application/x-www-form-urlencoded")]
    calls = [asgi_call(app, "POST", "/oauth2/token", headers, body) for body in bodies]
    started = time.perf_counter()
    for call in calls:
        await call()
    return count / (time.perf_counter() - started)


async def read_costs(app: Any, data: dict[str, Any], reads: int) -> dict[str, float]:
    """Median µs of each kind of read, the kinds taking turns read by read (so a busy
    moment of the machine weighs on all of them alike)."""
    path = f"/fhir/Observation/{data['observation']}"
    kinds = {name: asgi_call(app, "GET", path, [(b"authorization",
                                                 f"Bearer {data[name]}".encode())])
             for name in ("platform", "smart_user", "smart_patient")}
    samples: dict[str, list[float]] = {name: [] for name in kinds}
    for _ in range(200):  # warm the caches (tokens, subjects, grants)
        for call in kinds.values():
            await call()
    clock = time.perf_counter_ns
    for _ in range(reads):
        for name, call in kinds.items():
            started = clock()
            await call()
            samples[name].append((clock() - started) / 1000)
    return {name: statistics.median(values) for name, values in samples.items()}


async def main(tokens: int, reads: int) -> dict[str, Any]:
    logging.disable(logging.WARNING)
    data_dir = Path(tempfile.mkdtemp(prefix="bench-smart-"))
    settings = Settings(data_dir=data_dir, access_log=False, log_level="WARNING",
                        rate_limit_enabled=False, base_url="http://bench",
                        housekeeping_interval_seconds=0)
    app = create_app(settings)
    try:
        async with LifespanManager(app):
            data = await setup(app)
            per_s = await issuance_per_s(app, data, tokens)
            costs = await read_costs(app, data, reads)
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)
    smart = max(costs["smart_user"], costs["smart_patient"])
    overhead = smart - costs["platform"]
    return {
        "bench": "smart",
        "client_credentials_per_s": round(per_s, 1),
        "read_platform_us": round(costs["platform"], 1),
        "read_smart_user_us": round(costs["smart_user"], 1),
        "read_smart_patient_us": round(costs["smart_patient"], 1),
        "scope_overhead_us": round(overhead, 1),
        "scope_overhead_pct": round(100 * overhead / costs["platform"], 1),
        "target_pct": 5,
        "within_target": overhead <= 0.05 * costs["platform"],
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=300)
    parser.add_argument("--reads", type=int, default=3000)
    arguments = parser.parse_args()
    print(json.dumps(asyncio.run(main(arguments.tokens, arguments.reads))))
