"""Rate limits: fixed windows per client and route class, and growing delays after failed
logins; in memory or in Redis.

A *class* groups routes that share a budget (``read``, ``write``, ``login``,
``refresh``, ``register``, ...; the access table in :mod:`platform_api.access` names the
class of every route). A *client* is who spends it: ``user:<id>``, ``key:<id>`` (API
key), ``device:<id>`` (a browser or app that signed in before, by its device cookie) or
``ip:<address>``. Each (class, client) pair has a counter that starts with its first hit
and lives for the class's period; past ``requests`` hits in that window the answer is
429 with ``Retry-After`` (RFC 9110 section 10.2.3) until the window ends.

**Backoff** (NIST SP 800-63B 5.2.2, throttling without a lockout anyone can trigger):
failed logins are counted per *source* (:data:`BACKOFFS`): an account's failures from
unknown devices and addresses, an address's failures whatever the account, and the
failures of a known device or address on its account. The first ``free`` failures cost
nothing; after that each one makes the next attempt from that source wait, the wait
doubling from ``base`` up to ``cap`` seconds; the count is forgotten ``window`` seconds
after the last failure. An attempt is counted when it starts (so a burst of parallel
guesses cannot slip through before the first failure is recorded) and forgiven when it
succeeds. A known device or address is throttled only by its own failures, so an
attacker guessing elsewhere never stops the account's owner (see ``AuthService.login``).

Two backends behind one interface, chosen by the ``redis_url`` setting:

- :class:`MemoryLimiter` (embedded default): dicts in this process, a few
  microseconds per hit, nothing shared;
- :class:`RedisLimiter` (several processes sharing the work): one Lua script per hit,
  so increment, expiry and read are atomic and every process sees the same counts. When
  Redis cannot be reached the hit is counted in memory instead: limits keep holding per
  process rather than failing open or refusing everyone.

Defaults (``DEFAULT_LIMITS``) can be overridden per class with the ``rate_limits``
setting, e.g. ``HEALTHPLATFORM_RATE_LIMITS='{"read": "3000/60"}'``.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from platform_api.envelope import ApiError

log = logging.getLogger("healthplatform.rate_limit")

# requests/period-in-seconds per class. The sign-in routes have budgets of their own, so
# that no one kind of request (70 bad logins, a burst of registrations) uses up another's;
# per address unless the device cookie of an earlier sign-in names the device: a clinic's
# staff behind one NAT address keep signing in whatever someone else at that address does.
# Guessing passwords is throttled by BACKOFFS, not by these budgets.
DEFAULT_LIMITS: dict[str, str] = {
    "read": "6000/60",  # authenticated GET, per user or API key (100/s)
    "write": "1200/60",  # authenticated POST/PUT/PATCH/DELETE, per user or API key (20/s)
    "public": "300/60",  # routes without credentials, per IP
    # public appointment booking, per IP: each one may register a patient and send an
    # e-mail to the address given
    "booking": "30/60",
    "webhook": "600/60",  # signed inbound notifications, per IP
    "feedback": "10/3600",  # anonymous feedback, per IP
    "login": "120/60",  # password and social login, the MFA challenge
    "refresh": "600/60",  # token refresh (every app of a NAT refreshes every 15 minutes)
    "register": "60/3600",  # new accounts
    "recovery": "30/600",  # e-mail links: verify, forgot and reset password
    "mfa": "10/300",  # TOTP and recovery-code attempts, per account
    "auth_failure": "60/60",  # requests refused with 401 (bad token or key), per IP
}


@dataclass(frozen=True, slots=True)
class Backoff:
    """Growing delays after failures (module docstring)."""

    free: int  # failures that cost nothing
    base: float  # seconds of the first delay, doubled with each failure after it
    cap: float  # the longest delay
    window: float  # seconds after the last failure when the count is forgotten

    def delay(self, failures: int) -> float:
        """How long after the last failure the next attempt must wait."""
        if failures < self.free:
            return 0.0
        return min(self.base * 2.0 ** min(failures - self.free, 60), self.cap)


# The sources of failed logins (see AuthService.login). An account's guesses from unknown
# places: 5 free, then 1 s, 2 s, 4 s ... up to 15 minutes between guesses: 100 guesses
# take more than a day (NIST: at most 100 consecutive failures). An address: 20 free
# (a clinic's NAT), up to 5 minutes. A known device or address on its own account: 10
# free, up to 5 minutes, counted apart from everyone else's.
BACKOFFS: dict[str, Backoff] = {
    "account": Backoff(free=5, base=1.0, cap=900.0, window=24 * 3600.0),
    "address": Backoff(free=20, base=1.0, cap=300.0, window=3600.0),
    "known": Backoff(free=10, base=1.0, cap=300.0, window=3600.0),
    # An address an administrator named shared (HEALTHPLATFORM_SHARED_ADDRESSES: a
    # clinic's gateway): ten times the free failures and a minute at most, so one user's
    # typos do not stop a colleague's first sign-in there. Guessing one account from it
    # still meets that account's back-off, which never depends on the address.
    "shared": Backoff(free=200, base=1.0, cap=60.0, window=3600.0),
}


@dataclass(frozen=True, slots=True)
class Limit:
    requests: int
    period: float  # seconds

    @classmethod
    def parse(cls, text: str) -> Limit:
        """``"30/60"``: 30 requests per 60 seconds."""
        count, sep, seconds = text.partition("/")
        try:
            limit = cls(int(count), float(seconds))
        except ValueError:
            limit = cls(0, 0.0)
        if not sep or limit.requests < 1 or limit.period <= 0:
            raise ValueError(f"rate limit {text!r} must look like '<requests>/<seconds>'")
        return limit


@dataclass(slots=True)  # not frozen: one is made per request, and frozen init is slower
class Decision:
    allowed: bool
    limit: int
    remaining: int
    reset_after: float  # seconds until the window ends

    @property
    def retry_after(self) -> int:
        """Whole seconds for ``Retry-After`` (at least 1: 0 would invite a busy loop)."""
        return max(1, math.ceil(self.reset_after))

    def headers(self) -> dict[str, str]:
        # draft-ietf-httpapi-ratelimit-headers field names, plus Retry-After on refusal.
        headers = {
            "RateLimit-Limit": str(self.limit),
            "RateLimit-Remaining": str(self.remaining),
            "RateLimit-Reset": str(self.retry_after),
        }
        if not self.allowed:
            headers["Retry-After"] = str(self.retry_after)
        return headers

    def raw_headers(self) -> list[tuple[bytes, bytes]]:
        """``headers()`` of an allowed request as ASGI pairs, without a dict (hot path)."""
        return [(b"ratelimit-limit", b"%d" % self.limit),
                (b"ratelimit-remaining", b"%d" % self.remaining),
                (b"ratelimit-reset", b"%d" % self.retry_after)]


def rate_limited(decision: Decision, what: str = "requests") -> ApiError:
    return ApiError(
        429,
        "RATE_LIMITED",
        f"Too many {what}; retry after {decision.retry_after} s",
        headers=decision.headers(),
    )


class RateLimiter(Protocol):
    backend: str

    def limit_of(self, rule: str) -> Limit: ...
    async def hit(self, rule: str, client: str) -> Decision: ...
    async def peek(self, rule: str, client: str) -> Decision: ...
    async def reset(self, rule: str, client: str) -> None: ...
    async def attempt(self, backoff: Backoff, client: str) -> Decision: ...
    async def forgive(self, client: str) -> None: ...
    async def ping(self) -> bool: ...
    async def close(self) -> None: ...


def _backoff_decision(backoff: Backoff, allowed: bool, failures: int, wait: float
                      ) -> Decision:
    return Decision(allowed, backoff.free, max(0, backoff.free - failures), wait)


def parse_limits(overrides: Mapping[str, str]) -> dict[str, Limit]:
    merged = {**DEFAULT_LIMITS, **overrides}
    return {name: Limit.parse(text) for name, text in merged.items()}


class MemoryLimiter:
    """Counters in a dict: ``key -> [window end (monotonic), count]``."""

    backend = "memory"
    # Expired windows are swept when the dict passes this size, so memory stays bounded
    # by the number of clients active within the longest period.
    SWEEP_AT = 50_000

    def __init__(self, limits: Mapping[str, Limit]):
        self.limits = dict(limits)
        self._windows: dict[str, list[float]] = {}
        # backoff client -> [failures, monotonic time of the last one, forgotten after]
        self._failures: dict[str, list[float]] = {}

    def limit_of(self, rule: str) -> Limit:
        return self.limits[rule]

    async def hit(self, rule: str, client: str) -> Decision:
        return self.hit_now(rule, client)

    def hit_now(self, rule: str, client: str) -> Decision:
        """Synchronous hit: the hot path calls it without a coroutine."""
        limit = self.limits[rule]
        key = f"{rule}|{client}"
        now = time.monotonic()
        window = self._windows.get(key)
        if window is None or window[0] <= now:
            if len(self._windows) >= self.SWEEP_AT:
                self._sweep(now)
            window = self._windows[key] = [now + limit.period, 0.0]
        window[1] += 1
        count = int(window[1])
        return Decision(count <= limit.requests, limit.requests,
                        max(0, limit.requests - count), window[0] - now)

    async def peek(self, rule: str, client: str) -> Decision:
        limit = self.limits[rule]
        now = time.monotonic()
        window = self._windows.get(f"{rule}|{client}")
        if window is None or window[0] <= now:
            return Decision(True, limit.requests, limit.requests, limit.period)
        count = int(window[1])
        return Decision(count < limit.requests, limit.requests,
                        max(0, limit.requests - count), window[0] - now)

    async def reset(self, rule: str, client: str) -> None:
        self._windows.pop(f"{rule}|{client}", None)
        if rule == "backoff":
            self._failures.pop(client, None)

    async def attempt(self, backoff: Backoff, client: str) -> Decision:
        """Count an attempt from ``client`` as a failure until it is forgiven; refused
        (nothing counted) while the delay after its last failure runs."""
        now = time.monotonic()
        state = self._failures.get(client)
        if state is None or state[2] <= now:
            if len(self._failures) >= self.SWEEP_AT:
                self._sweep(now)
            state = [0.0, -math.inf, 0.0]
        failures = int(state[0])
        wait = state[1] + backoff.delay(failures) - now
        if wait > 0:
            return _backoff_decision(backoff, False, failures, wait)
        self._failures[client] = [failures + 1, now, now + backoff.window]
        return _backoff_decision(backoff, True, failures + 1, 0.0)

    async def forgive(self, client: str) -> None:
        """The attempt succeeded: it is no failure."""
        state = self._failures.get(client)
        if state is not None:
            state[0] = max(0.0, state[0] - 1)

    async def ping(self) -> bool:
        return True

    async def close(self) -> None:
        self._windows.clear()
        self._failures.clear()

    def _sweep(self, now: float) -> None:
        for key in [k for k, w in self._windows.items() if w[0] <= now]:
            del self._windows[key]
        for key in [k for k, f in self._failures.items() if f[2] <= now]:
            del self._failures[key]


# INCR and PEXPIRE in one step: the window starts with its first hit, and no process can
# see a counter without an expiry (which would never reset).
_HIT_SCRIPT = """
local count = redis.call('INCR', KEYS[1])
if count == 1 then redis.call('PEXPIRE', KEYS[1], ARGV[1]) end
local ttl = redis.call('PTTL', KEYS[1])
if ttl < 0 then redis.call('PEXPIRE', KEYS[1], ARGV[1]); ttl = tonumber(ARGV[1]) end
return {count, ttl}
"""


# A backoff attempt (see MemoryLimiter.attempt) in one step, on the Redis server's clock
# (the processes' clocks may differ): {allowed, failures, wait in ms}.
_ATTEMPT_SCRIPT = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local failures = tonumber(redis.call('HGET', KEYS[1], 'f') or '0')
local last = tonumber(redis.call('HGET', KEYS[1], 'l') or '0')
local free, base, cap = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local delay = 0
if failures >= free then delay = math.min(base * 2 ^ math.min(failures - free, 60), cap) end
if failures > 0 and last + delay > now then return {0, failures, last + delay - now} end
redis.call('HSET', KEYS[1], 'f', failures + 1, 'l', now)
redis.call('PEXPIRE', KEYS[1], ARGV[4])
return {1, failures + 1, 0}
"""
_FORGIVE_SCRIPT = """
if redis.call('HINCRBY', KEYS[1], 'f', -1) < 0 then redis.call('HSET', KEYS[1], 'f', 0) end
"""


class RedisLimiter:
    """Counters in Redis (``redis.asyncio``), shared by every process of the service."""

    backend = "redis"

    def __init__(self, url: str, limits: Mapping[str, Limit], *, prefix: str = "hp:rl"):
        import redis.asyncio as redis_asyncio

        self.url, self.limits, self.prefix = url, dict(limits), prefix
        # Short timeouts: a slow Redis must not become a slow API; the fallback counts.
        self._redis: Any = redis_asyncio.Redis.from_url(
            url, socket_timeout=0.25, socket_connect_timeout=0.25
        )
        self._script: Any = self._redis.register_script(_HIT_SCRIPT)
        self._attempt: Any = self._redis.register_script(_ATTEMPT_SCRIPT)
        self._forgive: Any = self._redis.register_script(_FORGIVE_SCRIPT)
        self._fallback = MemoryLimiter(limits)
        self._warned_at = -math.inf

    def limit_of(self, rule: str) -> Limit:
        return self.limits[rule]

    def _key(self, rule: str, client: str) -> str:
        return f"{self.prefix}:{rule}:{client}"

    async def hit(self, rule: str, client: str) -> Decision:
        limit = self.limits[rule]
        try:
            count, ttl_ms = await self._script(
                keys=[self._key(rule, client)], args=[int(limit.period * 1000)]
            )
        except Exception as exc:  # any Redis failure: count here instead (see module doc)
            self._warn(exc)
            return self._fallback.hit_now(rule, client)
        count = int(count)
        return Decision(count <= limit.requests, limit.requests,
                        max(0, limit.requests - count), int(ttl_ms) / 1000)

    async def peek(self, rule: str, client: str) -> Decision:
        limit = self.limits[rule]
        key = self._key(rule, client)
        try:
            async with self._redis.pipeline(transaction=False) as pipe:
                raw, ttl_ms = await pipe.get(key).pttl(key).execute()
        except Exception as exc:  # as in hit()
            self._warn(exc)
            return await self._fallback.peek(rule, client)
        count = int(raw or 0)
        reset_after = int(ttl_ms) / 1000 if int(ttl_ms) > 0 else limit.period
        return Decision(count < limit.requests, limit.requests,
                        max(0, limit.requests - count), reset_after)

    async def reset(self, rule: str, client: str) -> None:
        await self._fallback.reset(rule, client)
        try:
            await self._redis.delete(self._key(rule, client))
        except Exception as exc:  # as in hit()
            self._warn(exc)

    async def attempt(self, backoff: Backoff, client: str) -> Decision:
        try:
            allowed, failures, wait_ms = await self._attempt(
                keys=[self._key("backoff", client)],
                args=[backoff.free, int(backoff.base * 1000), int(backoff.cap * 1000),
                      int(backoff.window * 1000)])
        except Exception as exc:  # as in hit()
            self._warn(exc)
            return await self._fallback.attempt(backoff, client)
        return _backoff_decision(backoff, bool(allowed), int(failures), int(wait_ms) / 1000)

    async def forgive(self, client: str) -> None:
        await self._fallback.forgive(client)
        key = self._key("backoff", client)
        try:
            if await self._redis.exists(key):
                await self._forgive(keys=[key])
        except Exception as exc:  # as in hit()
            self._warn(exc)

    async def ping(self) -> bool:
        try:
            return bool(await self._redis.ping())
        except Exception:  # health reports it; the reason is in the hit() warnings
            return False

    async def close(self) -> None:
        await self._redis.aclose()

    def _warn(self, exc: Exception) -> None:
        # Once a minute at most: an unreachable Redis fails every request.
        now = time.monotonic()
        if now - self._warned_at >= 60:
            self._warned_at = now
            log.warning("Redis rate limiter at %s failed (%s); counting in memory", self.url, exc)


def limiter_from_settings(redis_url: str, overrides: Mapping[str, str]) -> RateLimiter:
    limits = parse_limits(overrides)
    if redis_url:
        return RedisLimiter(redis_url, limits)
    return MemoryLimiter(limits)
