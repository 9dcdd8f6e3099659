"""Rate limits: per client (user, API key or IP) and per route class, 429 with
Retry-After and the envelope; in memory, or in Redis shared by several processes (the
local server at 127.0.0.1:6379)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis.asyncio as redis_asyncio
from asgi_lifespan import LifespanManager

from platform_api.app import create_app
from platform_api.rate_limit import Backoff, Limit, MemoryLimiter, RedisLimiter, parse_limits
from tests.conftest import make_settings, register_and_login

REDIS_URL = "redis://127.0.0.1:6379/0"
PASSWORD = "correct horse battery"


@asynccontextmanager
async def running(tmp_path: Path, **overrides: Any) -> AsyncIterator[tuple[Any, httpx.AsyncClient]]:
    """The whole app with these settings, and a client speaking to it."""
    application = create_app(make_settings(tmp_path, **overrides))
    async with LifespanManager(application, startup_timeout=30):
        transport = httpx.ASGITransport(app=application)
        async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as c:
            yield application, c


def assert_rate_limited(response: httpx.Response) -> None:
    assert response.status_code == 429, response.text
    assert response.json()["success"] is False
    assert response.json()["error"]["code"] == "RATE_LIMITED"
    assert int(response.headers["retry-after"]) >= 1
    assert response.headers["ratelimit-remaining"] == "0"


# -- the limiter -----------------------------------------------------------------------
def test_limits_parse_and_refuse_nonsense() -> None:
    assert Limit.parse("30/60") == Limit(30, 60.0)
    for bad in ("30", "0/60", "30/0", "thirty/60", "30/-1"):
        with pytest.raises(ValueError, match="requests"):
            Limit.parse(bad)
    assert parse_limits({"read": "5/1"})["read"] == Limit(5, 1.0)


async def test_memory_limiter_counts_a_window_per_client_and_resets() -> None:
    limiter = MemoryLimiter({"write": Limit(2, 0.3)})
    first, second, third = [await limiter.hit("write", "user:amina") for _ in range(3)]
    assert (first.allowed, first.remaining) == (True, 1)
    assert (second.allowed, second.remaining) == (True, 0)
    assert not third.allowed and 0 < third.reset_after <= 0.3
    assert (await limiter.hit("write", "user:kwame")).allowed  # another client
    assert not (await limiter.peek("write", "user:amina")).allowed
    await asyncio.sleep(0.35)
    assert (await limiter.hit("write", "user:amina")).allowed  # a new window
    await limiter.reset("write", "user:amina")
    assert (await limiter.peek("write", "user:amina")).remaining == 2


# -- per route class -------------------------------------------------------------------
async def test_reads_past_the_limit_get_429_with_retry_after_per_user(tmp_path: Path) -> None:
    async with running(tmp_path, rate_limits={"read": "3/60"}) as (_, client):
        amina = await register_and_login(client)
        kwame = await register_and_login(client, first_name="Kwame", last_name="Mensah")
        answers = [await client.get("/api/auth/me", headers=amina["headers"]) for _ in range(3)]
        assert [a.status_code for a in answers] == [200, 200, 200]
        assert [a.headers["ratelimit-remaining"] for a in answers] == ["2", "1", "0"]
        assert answers[0].headers["ratelimit-limit"] == "3"
        assert_rate_limited(await client.get("/api/auth/me", headers=amina["headers"]))
        assert (await client.get("/api/auth/me", headers=kwame["headers"])).status_code == 200
        # Writes are another class with their own budget.
        patient = {"first_name": "Amina", "last_name": "Odhiambo", "date_of_birth":
                   "1988-04-12", "gender": "female"}
        created = await client.post("/api/patients", json=patient, headers=amina["headers"])
        assert created.status_code == 201


async def test_fhir_rate_limit_answers_an_operation_outcome(tmp_path: Path) -> None:
    async with running(tmp_path, rate_limits={"read": "1/60"}) as (_, client):
        amina = await register_and_login(client)
        assert (await client.get("/fhir/Patient", headers=amina["headers"])).status_code == 200
        refused = await client.get("/fhir/Patient", headers=amina["headers"])
        assert refused.status_code == 429 and "retry-after" in refused.headers
        assert refused.json()["resourceType"] == "OperationOutcome"
        assert refused.json()["issue"][0]["code"] == "throttled"


async def test_public_routes_are_limited_per_address(tmp_path: Path) -> None:
    async with running(tmp_path, rate_limits={"public": "2/60"}) as (_, client):
        statuses = [(await client.get("/openapi.json")).status_code for _ in range(2)]
        assert statuses == [200, 200]
        assert_rate_limited(await client.get("/openapi.json"))
        async with at_address(client, "198.51.100.7") as other:
            assert (await other.get("/openapi.json")).status_code == 200


async def test_health_checks_spend_no_budget(tmp_path: Path) -> None:
    """A load balancer probing /healthz as often as it likes never turns the service
    "down", nor uses up the public budget of /fhir/metadata."""
    async with running(tmp_path, rate_limits={"public": "3/60"}) as (_, client):
        for _ in range(50):
            probe = await client.get("/healthz")
            assert probe.status_code == 200 and "ratelimit-limit" not in probe.headers
        assert (await client.get("/fhir/metadata")).status_code == 200
        assert (await client.get("/fhir/metadata")).headers["ratelimit-remaining"] == "1"


async def test_login_refresh_and_registration_have_budgets_of_their_own(
        tmp_path: Path) -> None:
    async with running(tmp_path, rate_limits={"login": "2/60"}) as (_, client):
        amina = await register_and_login(client)  # one login of 2 from 127.0.0.1
        async with at_address(client, "127.0.0.1") as same_address:  # no device cookie
            body = {"email": "nobody@clinic.example.org", "password": "guess-number-1"}
            assert (await same_address.post("/api/auth/login", json=body)).status_code == 401
            assert_rate_limited(await same_address.post("/api/auth/login", json=body))
            # ... which leaves refreshing tokens and registering alone
            session = amina["refresh_token"]
            refreshed = await same_address.post("/api/auth/refresh",
                                                json={"refresh_token": session})
            assert refreshed.status_code == 200
            registered = await same_address.post("/api/auth/register", json={
                "email": "kwame@clinic.example.org", "password": PASSWORD,
                "first_name": "Kwame", "last_name": "Mensah"})
            assert registered.status_code == 201
        # A device that signed in before spends a budget of its own.
        again = await client.post("/api/auth/login", json={
            "email": amina["user"]["email"], "password": PASSWORD})
        assert again.status_code == 200, again.text


def with_backoffs(app: Any, **backoffs: Backoff) -> None:
    """Shorter delays, so that a test can wait them out."""
    app.state.services.auth.backoffs.update(backoffs)


@asynccontextmanager
async def at_address(client: httpx.AsyncClient, ip: str) -> AsyncIterator[httpx.AsyncClient]:
    """Another client of the same app, connecting from ``ip`` (no cookies)."""
    transport = httpx.ASGITransport(app=client._transport.app,  # type: ignore[attr-defined]
                                    client=(ip, 4000))
    async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as c:
        yield c


async def test_guesses_against_an_account_wait_longer_and_longer_not_its_owner(
        tmp_path: Path) -> None:
    async with running(tmp_path) as (app, client):
        with_backoffs(app, account=Backoff(free=3, base=0.2, cap=0.8, window=60))
        amina = await register_and_login(client)  # from 127.0.0.1: her known address
        wrong = {"email": amina["user"]["email"], "password": "not-her-password"}
        right = {"email": amina["user"]["email"], "password": PASSWORD}
        async with at_address(client, "203.0.113.66") as attacker:
            answers = [await attacker.post("/api/auth/login", json=wrong) for _ in range(4)]
            assert [a.status_code for a in answers] == [401, 401, 401, 429]
            assert "failed logins" in answers[3].json()["error"]["message"]
            # the right password from an unknown place waits too: the guesser cannot tell
            assert_rate_limited(await attacker.post("/api/auth/login", json=right))
            waits = []
            for _ in range(3):  # each failure after the free ones doubles the wait
                await asyncio.sleep(float(waits[-1]) if waits else 0.25)
                assert (await attacker.post("/api/auth/login", json=wrong)).status_code == 401
                refused = await attacker.post("/api/auth/login", json=wrong)
                assert refused.status_code == 429
                waits.append(refused.headers["retry-after"])
            assert [float(w) for w in waits] == sorted(float(w) for w in waits)
        # Her own address, where she signed in before: never stopped by the guesser.
        assert (await client.post("/api/auth/login", json=right)).status_code == 200


async def test_a_known_device_signs_in_whatever_is_guessed_from_its_address(
        tmp_path: Path) -> None:
    """A clinic's NAT: someone behind it sends 70 bad logins for random e-mails; staff
    who signed in on their device before are not stopped, a newcomer only slowed."""
    async with running(tmp_path) as (app, client):
        with_backoffs(app, address=Backoff(free=20, base=30, cap=300, window=3600))
        async with at_address(client, "192.0.2.10") as nurse_device:
            wanjiru = await register_and_login(nurse_device, first_name="Wanjiru",
                                               last_name="Kamau")
            assert "hp_device" in nurse_device.cookies
        async with at_address(client, "192.0.2.10") as attacker:
            for n in range(70):
                await attacker.post("/api/auth/login", json={
                    "email": f"random{n}@clinic.example.org", "password": "Summer2026!"})
            guess = await attacker.post("/api/auth/login", json={
                "email": "random-last@clinic.example.org", "password": "Summer2026!"})
            assert_rate_limited(guess)
        async with at_address(client, "192.0.2.10") as nurse_device:
            nurse_device.cookies.set("hp_device", wanjiru["device"], domain="testserver.local",
                                     path="/api/auth")
            login = await nurse_device.post("/api/auth/login", json={
                "email": wanjiru["user"]["email"], "password": PASSWORD})
            assert login.status_code == 200, login.text


async def test_a_burst_of_parallel_guesses_cannot_slip_in_before_the_first_failure(
        tmp_path: Path) -> None:
    async with running(tmp_path) as (app, client):
        with_backoffs(app, account=Backoff(free=3, base=60, cap=900, window=3600))
        amina = await register_and_login(client)
        async with at_address(client, "203.0.113.66") as attacker:
            answers = await asyncio.gather(*(attacker.post("/api/auth/login", json={
                "email": amina["user"]["email"], "password": f"guess-number-{n}"})
                for n in range(12)))
        statuses = sorted(a.status_code for a in answers)
        assert statuses.count(401) == 3 and statuses.count(429) == 9


async def test_a_forged_device_cookie_is_an_unknown_device(tmp_path: Path) -> None:
    async with running(tmp_path) as (app, client):
        with_backoffs(app, account=Backoff(free=1, base=60, cap=900, window=3600))
        amina = await register_and_login(client)
        async with at_address(client, "203.0.113.66") as attacker:
            wrong = {"email": amina["user"]["email"], "password": "not-her-password"}
            assert (await attacker.post("/api/auth/login", json=wrong)).status_code == 401
            tampered = amina["device"][:-4] + ("AAAA" if not amina["device"].endswith(
                "AAAA") else "BBBB")
            attacker.cookies.set("hp_device", tampered, path="/api/auth")
            assert_rate_limited(await attacker.post("/api/auth/login", json=wrong))


def test_backoff_delays_double_up_to_the_cap() -> None:
    backoff = Backoff(free=2, base=1.0, cap=10.0, window=60)
    assert [backoff.delay(f) for f in range(7)] == [0, 0, 1, 2, 4, 8, 10]


async def test_repeated_bad_credentials_turn_into_429_while_good_ones_pass(
    tmp_path: Path,
) -> None:
    async with running(tmp_path, rate_limits={"auth_failure": "2/60"}) as (_, client):
        amina = await register_and_login(client)
        bad = {"Authorization": "Bearer v4.public.not-a-real-token"}
        assert (await client.get("/api/auth/me", headers=bad)).status_code == 401
        assert (await client.get("/api/auth/me", headers=bad)).status_code == 401
        assert_rate_limited(await client.get("/api/auth/me", headers=bad))
        bad_key = {"X-API-Key": "hpk_AAAAAAAA." + "B" * 32}
        assert_rate_limited(await client.get("/api/patients/me", headers=bad_key))
        assert (await client.get("/api/auth/me", headers=amina["headers"])).status_code == 200


async def test_requests_without_credentials_are_401_however_many_and_are_not_guesses(
    tmp_path: Path,
) -> None:
    async with running(tmp_path, rate_limits={"auth_failure": "2/60"}) as (_, client):
        for _ in range(70):
            response = await client.get("/fhir/Patient")
            assert response.status_code == 401, response.text
        assert (await client.get("/api/patients/me")).status_code == 401
        # ... and do not use up the budget that wrong credentials are counted against
        bad = {"Authorization": "Bearer v4.public.not-a-real-token"}
        assert (await client.get("/api/auth/me", headers=bad)).status_code == 401
        assert (await client.get("/api/auth/me", headers=bad)).status_code == 401
        assert_rate_limited(await client.get("/api/auth/me", headers=bad))


async def test_route_limits_can_be_switched_off_but_login_throttling_stays(
    tmp_path: Path,
) -> None:
    """As the README says: HEALTHPLATFORM_RATE_LIMIT_ENABLED=false turns off the budgets
    per route and the failed-authentication budget per address; the growing delays after
    failed logins and the MFA attempts per account stay."""
    async with running(tmp_path, rate_limit_enabled=False,
                       rate_limits={"read": "1/60", "auth_failure": "1/60"}) as (app, client):
        with_backoffs(app, account=Backoff(free=1, base=60, cap=900, window=3600))
        amina = await register_and_login(client)
        for _ in range(3):
            answer = await client.get("/api/auth/me", headers=amina["headers"])
            assert answer.status_code == 200 and "ratelimit-limit" not in answer.headers
        bad = {"Authorization": "Bearer v4.public.not-a-real-token"}
        assert [(await client.get("/api/auth/me", headers=bad)).status_code
                for _ in range(3)] == [401, 401, 401]
        async with at_address(client, "203.0.113.66") as attacker:
            wrong = {"email": amina["user"]["email"], "password": "not-her-password"}
            assert (await attacker.post("/api/auth/login", json=wrong)).status_code == 401
            assert_rate_limited(await attacker.post("/api/auth/login", json=wrong))


# -- Redis -----------------------------------------------------------------------------
@pytest.fixture
async def redis_url() -> AsyncIterator[str]:
    client = redis_asyncio.Redis.from_url(REDIS_URL, socket_connect_timeout=0.5)
    try:
        await client.ping()
    except (OSError, redis_asyncio.RedisError):
        pytest.skip(f"no Redis server at {REDIS_URL}")
    finally:
        await client.aclose()
    yield REDIS_URL


async def test_redis_limiter_shares_counts_between_processes(redis_url: str) -> None:
    prefix = f"hp:test:{uuid.uuid4().hex}"
    limits = {"write": Limit(3, 5.0)}
    first, second = RedisLimiter(redis_url, limits, prefix=prefix), RedisLimiter(
        redis_url, limits, prefix=prefix)
    try:
        assert (await first.hit("write", "user:amina")).remaining == 2
        assert (await second.hit("write", "user:amina")).remaining == 1
        assert (await first.hit("write", "user:amina")).allowed
        refused = await second.hit("write", "user:amina")
        assert not refused.allowed and 0 < refused.reset_after <= 5
        assert not (await first.peek("write", "user:amina")).allowed
        assert (await second.hit("write", "user:kwame")).allowed
        await first.reset("write", "user:amina")
        assert (await second.peek("write", "user:amina")).remaining == 3
        assert await first.ping()
    finally:
        await first.close()
        await second.close()


async def test_redis_window_expires(redis_url: str) -> None:
    limiter = RedisLimiter(redis_url, {"mfa": Limit(1, 0.3)}, prefix=f"hp:test:{uuid.uuid4()}")
    try:
        assert (await limiter.hit("mfa", "user:amina")).allowed
        assert not (await limiter.hit("mfa", "user:amina")).allowed
        await asyncio.sleep(0.4)
        assert (await limiter.hit("mfa", "user:amina")).allowed
    finally:
        await limiter.close()


async def test_two_app_processes_on_redis_share_one_budget(
    tmp_path: Path, redis_url: str
) -> None:
    settings = {"redis_url": redis_url, "rate_limits": {"read": "3/60"}}
    async with running(tmp_path, **settings) as (_, first):
        amina = await register_and_login(first)
        async with running(tmp_path, **settings) as (second_app, second):
            assert second_app.state.services.auth.limiter.backend == "redis"
            me = "/api/auth/me"
            assert (await first.get(me, headers=amina["headers"])).status_code == 200
            assert (await second.get(me, headers=amina["headers"])).status_code == 200
            assert (await first.get(me, headers=amina["headers"])).status_code == 200
            assert_rate_limited(await second.get(me, headers=amina["headers"]))


async def test_unreachable_redis_falls_back_to_counting_in_memory() -> None:
    limiter = RedisLimiter("redis://127.0.0.1:9/0", {"login": Limit(2, 60.0)})
    try:
        assert (await limiter.hit("login", "ip:203.0.113.9")).allowed
        assert (await limiter.hit("login", "ip:203.0.113.9")).allowed
        assert not (await limiter.hit("login", "ip:203.0.113.9")).allowed
        assert not await limiter.ping()
    finally:
        await limiter.close()


async def test_redis_backoff_is_shared_and_forgiven(redis_url: str) -> None:
    prefix = f"hp:test:{uuid.uuid4().hex}"
    backoff = Backoff(free=2, base=0.3, cap=1.0, window=60)
    first, second = RedisLimiter(redis_url, {}, prefix=prefix), RedisLimiter(
        redis_url, {}, prefix=prefix)
    try:
        assert (await first.attempt(backoff, "account:amina")).allowed
        assert (await second.attempt(backoff, "account:amina")).allowed
        refused = await first.attempt(backoff, "account:amina")
        assert not refused.allowed and 0 < refused.reset_after <= 0.3
        await second.forgive("account:amina")  # the second attempt succeeded after all
        assert (await first.attempt(backoff, "account:amina")).allowed
        await first.reset("backoff", "account:amina")
        assert (await second.attempt(backoff, "account:amina")).remaining == 1
    finally:
        await first.close()
        await second.close()


async def test_memory_backoff_waits_and_forgives() -> None:
    limiter = MemoryLimiter({})
    backoff = Backoff(free=1, base=0.2, cap=1.0, window=60)
    assert (await limiter.attempt(backoff, "ip:203.0.113.9")).allowed
    refused = await limiter.attempt(backoff, "ip:203.0.113.9")
    assert not refused.allowed and 0 < refused.reset_after <= 0.2
    await asyncio.sleep(0.25)
    assert (await limiter.attempt(backoff, "ip:203.0.113.9")).allowed
    assert not (await limiter.attempt(backoff, "ip:203.0.113.9")).allowed  # 0.4 s now
    await limiter.forgive("ip:203.0.113.9")
    await limiter.forgive("ip:203.0.113.9")
    assert (await limiter.attempt(backoff, "ip:203.0.113.9")).allowed


async def test_the_device_cookie_is_http_only_strict_and_secure_over_https(
        tmp_path: Path) -> None:
    async with running(tmp_path) as (app, client):
        amina = await register_and_login(client)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport,
                                     base_url="https://clinic.example.org") as secure:
            login = await secure.post("/api/auth/login", json={
                "email": amina["user"]["email"], "password": PASSWORD})
        cookie = login.headers["set-cookie"]
        assert cookie.startswith("hp_device=")
        for attribute in ("HttpOnly", "Path=/api/auth", "SameSite=strict", "Secure",
                          "Max-Age=15552000"):
            assert attribute in cookie, attribute
        plain = await client.post("/api/auth/login", json={
            "email": amina["user"]["email"], "password": PASSWORD})
        assert "Secure" not in plain.headers["set-cookie"]
        device = app.state.services.auth.devices.read(login.cookies["hp_device"])
        assert device is not None and device.knows(amina["user"]["id"])


async def test_a_named_shared_address_keeps_a_first_time_sign_in_going(
        tmp_path: Path) -> None:
    """Issue 32 result 10: after others' failed logins at a clinic's NAT address, a
    colleague signing in there for the first time gets 429, unless an administrator named
    the address shared; the account's own back-off holds either way."""
    for shared, expected in (([], 429), (["198.51.100.0/28"], 200)):
        async with running(tmp_path / str(expected), shared_addresses=shared) as (app, client):
            with_backoffs(app, address=Backoff(free=3, base=30.0, cap=60.0, window=600),
                          shared=Backoff(free=30, base=30.0, cap=60.0, window=600),
                          account=Backoff(free=3, base=30.0, cap=60.0, window=600))
            colleague = await register_and_login(client, email="wanjiru@clinic.example.org")
            async with at_address(client, "198.51.100.7") as clinic:
                for i in range(4):  # someone else's typos, on four accounts
                    await clinic.post("/api/auth/login", json={
                        "email": f"typo{i}@clinic.example.org", "password": "wrong"})
                first_time = await clinic.post("/api/auth/login", json={
                    "email": colleague["user"]["email"], "password": PASSWORD})
                assert first_time.status_code == expected, first_time.text
                if shared:  # guessing one account still meets that account's back-off
                    wrong = {"email": "typo0@clinic.example.org", "password": "guess"}
                    answers = [await clinic.post("/api/auth/login", json=wrong)
                               for _ in range(4)]
                    assert answers[-1].status_code == 429
