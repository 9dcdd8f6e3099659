"""The one way the server makes HTTP requests of its own (the outbound guard).

Every integration that reaches an outside URL (SMART client key sets, Subscription
deliveries, payers, payment providers, DHIS2, cloud inference, supplier feeds, CDS
prefetch, cross-border exchange) gets its client here, so one policy decides where the
server may connect:

- the host is resolved here (the resolver is injectable, for tests) and *every* address it
  resolves to is checked at connect time, not when the URL was written: a name that later
  resolves to a private address is refused then. Refused: loopback, private, link-local,
  shared (100.64.0.0/10), reserved, unspecified and multicast addresses, the IPv4 inside
  IPv4-mapped, 6to4 and NAT64 IPv6 forms, and cloud metadata addresses;
- the connection goes to the checked address (TLS still names the host: SNI and
  certificate checks), so a second resolution cannot swap the address (DNS rebinding);
- no redirect is followed unless the caller asks, and then each hop is checked again;
- answers are capped in size and in total time;
- errors say only "could not use the answer of <url>" (:class:`OutboundError`): a caller
  who chose the URL must not learn a closed port from an open one (a port scanner).
  The precise reason is in ``OutboundError.reason``, for the server's own log.

``HEALTHPLATFORM_OUTBOUND_ALLOW`` (CIDRs and host names) opens the guard for a clinic's own
network; ``HEALTHPLATFORM_SUBSCRIPTION_ALLOW_PRIVATE_ENDPOINTS`` is kept as an alias that
opens loopback, private and link-local ranges to Subscription deliveries only (never the
metadata addresses).
"""

from __future__ import annotations

import asyncio
import errno
import ipaddress
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from typing import Any

import aiohttp
import httpx
from aiohttp.abc import AbstractResolver, ResolveResult

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
Resolver = Callable[[str, int], Awaitable[list[str]]]

# Cloud instance metadata services: AWS/GCP/Azure/OpenStack, AWS ECS, Alibaba, Oracle,
# AWS over IPv6. Refused even when an allow-list opens the private ranges around them.
METADATA = frozenset(ipaddress.ip_address(a) for a in (
    "169.254.169.254", "169.254.170.2", "100.100.100.200", "192.0.0.192", "fd00:ec2::254"))
SHARED = ipaddress.ip_network("100.64.0.0/10")  # RFC 6598 carrier-grade NAT
NAT64 = (ipaddress.ip_network("64:ff9b::/96"), ipaddress.ip_network("64:ff9b:1::/48"))
# What HEALTHPLATFORM_SUBSCRIPTION_ALLOW_PRIVATE_ENDPOINTS opens (as it always did).
PRIVATE_RANGES = tuple(ipaddress.ip_network(n) for n in (
    "127.0.0.0/8", "10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "169.254.0.0/16",
    "::1/128", "fc00::/7", "fe80::/10"))
DEFAULT_MAX_BYTES = 1024 * 1024
DEFAULT_TIMEOUT = 10.0
MAX_REDIRECTS = 5


class OutboundError(Exception):
    """A request the server made did not give a usable answer. ``str()`` is safe to show
    the caller who chose the URL; ``reason`` is for the server's log only."""

    def __init__(self, url: str, reason: str):
        super().__init__(f"could not use the answer of {url}")
        self.url, self.reason = url, reason


class OutboundRefused(OutboundError):
    """The guard refused the address (before connecting)."""


def embedded_ipv4(address: IPAddress) -> IPAddress:
    """The IPv4 address an IPv6 form carries (mapped, 6to4, NAT64), or ``address``."""
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return address.ipv4_mapped
        if address.sixtofour is not None:
            return address.sixtofour
        if any(address in net for net in NAT64):
            return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return address


class AddressPolicy:
    """Which addresses the server may connect to (module docstring)."""

    def __init__(self, allow: Iterable[str] = (), *, private: bool = False):
        self.networks: list[IPNetwork] = []
        self.names: set[str] = set()
        for entry in allow:
            try:
                self.networks.append(ipaddress.ip_network(entry.strip(), strict=False))
            except ValueError:
                self.names.add(entry.strip().lower().rstrip("."))
        self.private = private

    def allows_name(self, host: str) -> bool:
        return host.lower().rstrip(".") in self.names

    def refusal(self, text: str) -> str | None:
        """Why ``text`` (an address) may not be connected to, or None."""
        try:
            address: IPAddress = ipaddress.ip_address(text.split("%")[0])
        except ValueError:
            return f"{text!r} is not an address"
        inner = embedded_ipv4(address)
        for candidate in {address, inner}:
            if any(candidate in net for net in self.networks):
                return None
        if address in METADATA or inner in METADATA:
            return "a cloud metadata address"
        if self.private and any(inner in net for net in PRIVATE_RANGES):
            return None
        if inner in SHARED:
            return "a shared (carrier-grade NAT) address"
        if inner.is_multicast or inner.is_unspecified:
            return "a multicast or unspecified address"
        if not inner.is_global:
            return "a loopback, private, link-local or reserved address"
        return None

    def check(self, url: str, host: str, addresses: list[str]) -> None:
        """Refuse unless every address ``host`` resolved to is allowed."""
        if not addresses:
            raise OutboundRefused(url, f"{host} has no address")
        if self.allows_name(host):
            return
        for address in addresses:
            reason = self.refusal(address)
            if reason is not None:
                raise OutboundRefused(url, f"{host} resolves to {address}: {reason}")


async def system_resolver(host: str, port: int) -> list[str]:
    found = await asyncio.get_running_loop().getaddrinfo(
        host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(info[4][0]) for info in found))


def _literal(host: str) -> str | None:
    try:
        return str(ipaddress.ip_address(host.strip("[]")))
    except ValueError:
        return None


class Guard:
    """The policy plus the resolver: the addresses a URL may be reached at."""

    def __init__(self, policy: AddressPolicy, resolver: Resolver | None = None):
        self.policy, self.resolver = policy, resolver or system_resolver

    async def addresses(self, url: str, host: str, port: int) -> list[str]:
        literal = _literal(host)
        if literal is not None:
            found = [literal]
        else:
            try:
                found = await self.resolver(host, port)
            except (OSError, UnicodeError) as exc:
                raise OutboundError(url, f"{host} did not resolve: {exc}") from None
        self.policy.check(url, host, found)
        return found


# -- httpx --------------------------------------------------------------------------------
class _Capped(httpx.AsyncByteStream):
    """A response body that stops past ``limit`` bytes or the ``deadline``."""

    def __init__(self, inner: httpx.AsyncByteStream, url: str, limit: int, deadline: float):
        self.inner, self.url, self.limit, self.deadline = inner, url, limit, deadline

    async def __aiter__(self) -> AsyncIterator[bytes]:
        seen = 0
        iterator = self.inner.__aiter__()
        while True:
            remaining = self.deadline - time.monotonic()
            if remaining <= 0:
                raise OutboundError(self.url, "the answer took too long")
            try:
                async with asyncio.timeout(remaining):
                    chunk = await iterator.__anext__()
            except StopAsyncIteration:
                return
            except TimeoutError:
                raise OutboundError(self.url, "the answer took too long") from None
            seen += len(chunk)
            if seen > self.limit:
                raise OutboundError(self.url, f"the answer is larger than {self.limit} bytes")
            yield chunk

    async def aclose(self) -> None:
        await self.inner.aclose()


class GuardedTransport(httpx.AsyncBaseTransport):
    """Connects to the checked address of each request (each redirect hop included)."""

    def __init__(self, guard: Guard, *, max_bytes: int, total_seconds: float):
        self.guard, self.max_bytes, self.total_seconds = guard, max_bytes, total_seconds
        # one pool per host name: a TLS connection made for one name (SNI) is never
        # reused for another name at the same address
        self._pools: dict[str, httpx.AsyncHTTPTransport] = {}

    def _pool(self, host: str) -> httpx.AsyncHTTPTransport:
        pool = self._pools.get(host)
        if pool is None:
            if len(self._pools) >= 256:
                oldest = next(iter(self._pools))
                asyncio.get_running_loop().create_task(self._pools.pop(oldest).aclose())
            pool = self._pools[host] = httpx.AsyncHTTPTransport()
        return pool

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        url = str(request.url.copy_with(query=None))
        deadline = time.monotonic() + self.total_seconds
        host = request.url.host
        port = request.url.port or (443 if request.url.scheme == "https" else 80)
        if request.url.scheme not in ("http", "https"):
            raise OutboundRefused(url, "only http and https")
        addresses = await self.guard.addresses(url, host, port)
        request.url = request.url.copy_with(host=addresses[0])
        if request.url.scheme == "https":
            request.extensions = {**request.extensions, "sni_hostname": host}
        try:
            async with asyncio.timeout(self.total_seconds):
                response = await self._pool(host).handle_async_request(request)
        except TimeoutError:
            raise OutboundError(url, "no answer in time") from None
        length = response.headers.get("content-length", "")
        if length.isdigit() and int(length) > self.max_bytes:
            await response.aclose()
            raise OutboundError(url, f"the answer is larger than {self.max_bytes} bytes")
        assert isinstance(response.stream, httpx.AsyncByteStream)
        response.stream = _Capped(response.stream, url, self.max_bytes, deadline)
        return response

    async def aclose(self) -> None:
        for pool in self._pools.values():
            await pool.aclose()
        self._pools.clear()


class Outbound:
    """Builds the guarded clients the integrations use."""

    def __init__(self, allow: Iterable[str] = (), *, resolver: Resolver | None = None,
                 allow_private: bool = False):
        self.allow = list(allow)
        self.resolver = resolver
        self.guard = Guard(AddressPolicy(self.allow, private=allow_private), resolver)

    @classmethod
    def from_settings(cls, settings: Any, *, resolver: Resolver | None = None,
                      allow_private: bool = False) -> Outbound:
        return cls(getattr(settings, "outbound_allow", ()), resolver=resolver,
                   allow_private=allow_private)

    def with_private(self) -> Outbound:
        """The same allow-list, loopback/private/link-local ranges opened too."""
        return Outbound(self.allow, resolver=self.resolver, allow_private=True)

    def client(self, *, timeout: float = DEFAULT_TIMEOUT, max_bytes: int = DEFAULT_MAX_BYTES,
               follow_redirects: bool = False, **options: Any) -> httpx.AsyncClient:
        """An httpx client whose every request (and redirect hop) is guarded."""
        transport = GuardedTransport(self.guard, max_bytes=max_bytes, total_seconds=timeout)
        return httpx.AsyncClient(transport=transport, timeout=timeout,
                                 follow_redirects=follow_redirects,
                                 max_redirects=MAX_REDIRECTS, **options)

    async def get_json(self, url: str, *, time_limit: float = DEFAULT_TIMEOUT,
                       max_bytes: int = DEFAULT_MAX_BYTES,
                       headers: dict[str, str] | None = None) -> tuple[Any, httpx.Headers]:
        """GET ``url`` and parse its JSON; any failure is one :class:`OutboundError`."""
        async with self.client(timeout=time_limit, max_bytes=max_bytes) as http:
            try:
                response = await http.get(url, headers={"Accept": "application/json",
                                                        **(headers or {})})
                response.raise_for_status()
                return response.json(), response.headers
            except OutboundError:
                raise
            except (httpx.HTTPError, ValueError) as exc:
                raise OutboundError(url, f"{type(exc).__name__}: {exc}") from None

    def session(self, *, timeout: float = DEFAULT_TIMEOUT, limit: int = 100,
                **options: Any) -> GuardedSession:
        """An aiohttp session (for high-rate deliveries) whose connections are guarded."""
        return GuardedSession(self.guard, timeout=timeout, limit=limit, **options)


def outbound_of(services: Any) -> Outbound:
    """The app's outbound client builder (one per app, built from its settings)."""
    found = services.extras.get("outbound")
    if found is None:
        found = services.extras["outbound"] = Outbound.from_settings(services.settings)
    return found  # type: ignore[no-any-return]


# -- aiohttp ------------------------------------------------------------------------------
class _GuardedResolver(AbstractResolver):
    """aiohttp asks this for every new connection: only checked addresses come back."""

    def __init__(self, guard: Guard):
        self.guard = guard

    async def resolve(self, host: str, port: int = 0,
                      family: socket.AddressFamily = socket.AF_INET) -> list[ResolveResult]:
        try:
            found = await self.guard.addresses(host, host, port)
        except OutboundError as exc:
            # aiohttp reports strerror: the reason reaches the server's log
            raise OSError(errno.EACCES, exc.reason) from None
        return [{"hostname": host, "host": a, "port": port,
                 "family": socket.AF_INET6 if ":" in a else socket.AF_INET,
                 "proto": 0, "flags": socket.AI_NUMERICHOST} for a in found]

    async def close(self) -> None:
        return None


class GuardedSession:
    """An aiohttp session: names go through the guarded resolver (at connect time);
    aiohttp connects to literal addresses without asking a resolver, so those are checked
    here. Redirects are never followed."""

    def __init__(self, guard: Guard, *, timeout: float, limit: int, **options: Any):
        self.guard = guard
        self.session = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=timeout),
            connector=aiohttp.TCPConnector(limit=limit, resolver=_GuardedResolver(guard),
                                           use_dns_cache=False),
            **options)

    async def request(self, method: str, url: str, *, max_bytes: int = DEFAULT_MAX_BYTES,
                      **options: Any) -> tuple[int, bytes]:
        """The status and (capped) body; any failure is one :class:`OutboundError`."""
        parsed = httpx.URL(url)
        if parsed.scheme not in ("http", "https"):
            raise OutboundRefused(url, "only http and https")
        literal = _literal(parsed.host)
        if literal is not None:
            self.guard.policy.check(url, parsed.host, [literal])
        try:
            async with self.session.request(method, url, allow_redirects=False,
                                            **options) as response:
                body = await response.content.read(max_bytes + 1)
                if len(body) > max_bytes:
                    raise OutboundError(url, f"the answer is larger than {max_bytes} bytes")
                return response.status, body
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise OutboundError(url, f"{type(exc).__name__}: {exc}") from None

    async def close(self) -> None:
        await self.session.close()


__all__ = [
    "METADATA",
    "AddressPolicy",
    "Guard",
    "GuardedSession",
    "GuardedTransport",
    "Outbound",
    "OutboundError",
    "OutboundRefused",
    "Resolver",
    "embedded_ipv4",
    "outbound_of",
    "system_resolver",
]
