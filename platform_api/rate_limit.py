"""Rate limits: fixed windows per client and route class, in memory or in Redis.

A *class* groups routes that share a budget (``read``, ``write``, ``login``, ``mfa``,
...; the access table in :mod:`platform_api.access` names the class of every route). A
*client* is who spends it: ``user:<id>``, ``key:<id>`` (API key) or ``ip:<address>``.
Each (class, client) pair has a counter that starts with its first hit and lives for the
class's period; past ``requests`` hits in that window the answer is 429 with
``Retry-After`` (RFC 9110 section 10.2.3) until the window ends.

Two backends behind one interface, chosen by the ``redis_url`` setting:

- :class:`MemoryLimiter` (embedded default): a dict in this process, a few
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

# requests/period-in-seconds per class. Login and MFA are strict on purpose: they are
# what an attacker guesses against (NIST SP 800-63B 5.2.2 asks for throttling).
DEFAULT_LIMITS: dict[str, str] = {
    "read": "6000/60",  # authenticated GET, per user or API key (100/s)
    "write": "1200/60",  # authenticated POST/PUT/PATCH/DELETE, per user or API key (20/s)
    "public": "300/60",  # routes without credentials, per IP
    # public appointment booking, per IP: each one may register a patient and send an
    # e-mail to the address given
    "booking": "30/60",
    "webhook": "600/60",  # signed inbound notifications, per IP
    # login, registration, refresh, password reset, social login, MFA routes; per IP (a
    # clinic's staff may share one address: accounts are protected by login_failure)
    "login": "60/60",
    "mfa": "10/300",  # TOTP and recovery-code attempts, per account
    "login_failure": "10/900",  # wrong passwords for one account (then 429 until reset)
    "auth_failure": "60/60",  # requests refused with 401 (bad token or key), per IP
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
    async def ping(self) -> bool: ...
    async def close(self) -> None: ...


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

    async def ping(self) -> bool:
        return True

    async def close(self) -> None:
        self._windows.clear()

    def _sweep(self, now: float) -> None:
        for key in [k for k, w in self._windows.items() if w[0] <= now]:
            del self._windows[key]


# INCR and PEXPIRE in one step: the window starts with its first hit, and no process can
# see a counter without an expiry (which would never reset).
_HIT_SCRIPT = """
local count = redis.call('INCR', KEYS[1])
if count == 1 then redis.call('PEXPIRE', KEYS[1], ARGV[1]) end
local ttl = redis.call('PTTL', KEYS[1])
if ttl < 0 then redis.call('PEXPIRE', KEYS[1], ARGV[1]); ttl = tonumber(ARGV[1]) end
return {count, ttl}
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
