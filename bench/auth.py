"""Authentication cost: logins per second and the per-request price of credentials.

Runs in one process on a fresh SQLite store in a temporary directory, with the
production argon2 parameters (the settings' defaults). Measures:

- ``login_per_s``: ``AuthService.login`` in a loop, one at a time: argon2id verification
  (in a worker thread), the refresh-token family, the AuditEvent and the last-login
  record, all written to the store;
- ``token_verify_first_us``: authenticating a PASETO token this process has not seen
  (footer, key lookup, Ed25519 signature, claims, account state) ;
- ``token_verify_cached_us``: the same token again (the verified-claims cache);
- ``api_key_verify_us``: an ``X-API-Key`` (one document read, a SHA-256, scopes);
- ``access_middleware_us``: what the access middleware adds to a request with a cached
  token (route match, authentication, role and scope check, in-memory rate limit,
  RateLimit headers), measured as the difference between the same trivial ASGI route
  with and without the middleware in front. Target: at most 100 µs.

Prints one JSON line. Usage: ``python bench/auth.py [--logins 40] [--requests 20000]``
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
from collections.abc import Awaitable, Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from fastapi import FastAPI

from fhir_server.store.sqlite import SQLiteStore
from platform_api.access import ACCESS_TABLE, AUTHENTICATED, AccessMiddleware, Rule
from platform_api.auth.service import AuthService
from platform_api.settings import Settings

PASSWORD = "correct horse battery staple"
BENCH_PATH = "/bench/whoami"


async def timed(fn: Callable[[], Awaitable[Any]], repeat: int) -> float:
    """Seconds per call, best of three runs (the least disturbed by the machine)."""
    runs = []
    for _ in range(3):
        started = time.perf_counter()
        for _ in range(repeat):
            await fn()
        runs.append((time.perf_counter() - started) / repeat)
    return min(runs)


async def measure_logins(auth: AuthService, count: int) -> tuple[float, float]:
    started = time.perf_counter()
    for _ in range(count):
        await auth.login("bench@kliniki.example", PASSWORD)
    per_s = count / (time.perf_counter() - started)
    user = await auth.find_user_by_email("bench@kliniki.example")
    assert user is not None
    hashes = []
    for _ in range(10):
        t0 = time.perf_counter()
        auth.passwords.verify(user["password_hash"], PASSWORD)
        hashes.append(time.perf_counter() - t0)
    return per_s, statistics.median(hashes) * 1000


async def measure_tokens(auth: AuthService, user: dict[str, Any], count: int
                         ) -> tuple[float, float]:
    # Signed by the codec, not issue_access_token: the service would cache them.
    tokens = [auth.codec.issue(subject=user["id"], roles=[], email=user["email"],
                               session_id=None, ttl_seconds=900).token for _ in range(count)]
    started = time.perf_counter()
    for token in tokens:
        await auth.authenticate(token)
    first = (time.perf_counter() - started) / count
    token = tokens[0]
    cached = await timed(lambda: auth.authenticate(token), 20_000)
    return first * 1e6, cached * 1e6


async def measure_api_key(auth: AuthService, user: dict[str, Any]) -> float:
    issued = await auth.api_keys.create(user["id"], "bench", ["Patient:read"])
    await auth.authenticate_api_key(issued.key)
    return await timed(lambda: auth.authenticate_api_key(issued.key), 5_000) * 1e6


def bench_app(auth: AuthService, settings: Settings, with_access: bool) -> Any:
    app = FastAPI(docs_url=None, redoc_url=None, openapi_url=None)
    app.state.services = SimpleNamespace(auth=auth, settings=settings)

    async def whoami(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": b'{"ok":true}'})

    if not with_access:
        return whoami
    table = {**ACCESS_TABLE, ("GET", BENCH_PATH): Rule(AUTHENTICATED, scope="bench:read")}
    middleware = AccessMiddleware(whoami, table=table)

    async def with_app(scope: Any, receive: Any, send: Any) -> None:
        scope["app"] = app
        await middleware(scope, receive, send)

    return with_app


async def measure_middleware(auth: AuthService, settings: Settings, token: str,
                             requests: int) -> float:
    headers = [(b"host", b"bench"), (b"user-agent", b"bench/1"),
               (b"authorization", f"Bearer {token}".encode())]

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start" and message["status"] != 200:
            raise RuntimeError(f"bench request answered {message['status']}")

    def call(app: Any) -> Callable[[], Awaitable[None]]:
        async def one() -> None:
            scope = {"type": "http", "method": "GET", "path": BENCH_PATH, "root_path": "",
                     "headers": headers, "query_string": b"", "client": ("127.0.0.1", 5000)}
            await app(scope, receive, send)
        return one

    bare = await timed(call(bench_app(auth, settings, False)), requests)
    guarded = await timed(call(bench_app(auth, settings, True)), requests)
    return (guarded - bare) * 1e6


async def main(logins: int, requests: int) -> dict[str, Any]:
    logging.disable(logging.WARNING)  # stdout carries the one JSON line; keep stderr quiet
    data_dir = Path(tempfile.mkdtemp(prefix="bench-auth-"))
    # Production argon2 cost (the defaults); route limits high enough not to interfere.
    settings = Settings(data_dir=data_dir, access_log=False, log_level="WARNING",
                        rate_limits={"read": f"{10 * requests}/60",
                                     "login": "100000/60"})
    store = SQLiteStore(data_dir / "healthplatform.db")
    await store.open()
    try:
        auth = AuthService(settings, store)
        await auth.start()
        await auth.register("bench@kliniki.example", PASSWORD, "Bench", "Runner")
        user = await auth.find_user_by_email("bench@kliniki.example")
        assert user is not None
        login_per_s, argon2_ms = await measure_logins(auth, logins)
        first_us, cached_us = await measure_tokens(auth, user, 2_000)
        api_key_us = await measure_api_key(auth, user)
        token = auth.issue_access_token(user).token
        middleware_us = await measure_middleware(auth, settings, token, requests)
        await auth.stop()
    finally:
        await store.close()
        shutil.rmtree(data_dir, ignore_errors=True)
    return {
        "bench": "auth",
        "argon2": {"time_cost": settings.argon2_time_cost,
                   "memory_kib": settings.argon2_memory_kib, "verify_ms": round(argon2_ms, 1)},
        "login_per_s": round(login_per_s, 1),
        "token_verify_first_us": round(first_us, 1),
        "token_verify_cached_us": round(cached_us, 2),
        "api_key_verify_us": round(api_key_us, 1),
        "access_middleware_us": round(middleware_us, 2),
        "target_us": 100,
        "within_target": middleware_us <= 100,
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--logins", type=int, default=40)
    parser.add_argument("--requests", type=int, default=20_000)
    arguments = parser.parse_args()
    print(json.dumps(asyncio.run(main(arguments.logins, arguments.requests))))
