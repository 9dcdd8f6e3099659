"""Who sent a request, and over what: the one place that answers it.

:func:`client_origin` gives a request's client address and scheme. Behind a reverse
proxy the connection comes from the proxy, which says who its client was in
``X-Forwarded-For`` and how it was reached in ``X-Forwarded-Proto``; anyone can send
those headers, so they are believed only from the proxies listed in
``HEALTHPLATFORM_TRUSTED_PROXIES`` (addresses or networks, e.g. ``10.0.0.5`` or
``10.0.0.0/24``; empty by default: no one). Rate limits, lockout throttling, audit records
and access logs all take the address from here, so a client cannot spoof its address to
escape a limit or blame someone else in the audit trail.

With a trusted peer, ``X-Forwarded-For`` is read from the right (each proxy appends the
address it received from): the client is the first address that is not a trusted proxy,
so what a client wrote into the header itself (on the left) is never taken.
``X-Forwarded-Proto`` is taken from its first value (what the client used at the first
proxy), when it is ``http`` or ``https``. The server itself (uvicorn) is started with its
own forwarded-header handling off (``platform_api.cli``), so the peer seen here is the
real one.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any

from starlette.types import Scope

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


@dataclass(frozen=True, slots=True)
class ClientOrigin:
    address: str | None  # None: unknown (no peer, e.g. an in-process call)
    scheme: str  # "http" or "https"


class TrustedProxies:
    """The proxies whose forwarded headers are believed."""

    def __init__(self, entries: Sequence[str]):
        networks: list[IPNetwork] = []
        for entry in entries:
            try:
                networks.append(ipaddress.ip_network(entry.strip(), strict=False))
            except ValueError:
                raise ValueError(f"HEALTHPLATFORM_TRUSTED_PROXIES: {entry!r} is not an "
                                 "IP address or network (e.g. 10.0.0.5, 10.0.0.0/24)") from None
        self.networks = tuple(networks)

    def trusts(self, address: str | None) -> bool:
        ip = _ip(address)
        return ip is not None and any(ip in network for network in self.networks)

    def origin(self, peer: str | None, scheme: str, forwarded_for: str | None,
               forwarded_proto: str | None) -> ClientOrigin:
        if not self.networks or not self.trusts(peer):
            return ClientOrigin(peer, scheme)
        address = peer
        if forwarded_for:
            for hop in reversed([h.strip() for h in forwarded_for.split(",")]):
                ip = _ip(hop)
                if ip is None:
                    break  # not an address: keep the last one known
                address = str(ip)
                if not any(ip in network for network in self.networks):
                    break
        if forwarded_proto:
            first = forwarded_proto.split(",")[0].strip().lower()
            if first in ("http", "https"):
                scheme = first
        return ClientOrigin(address, scheme)


def _ip(address: str | None) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """An address as sent in a header or by the server: ``1.2.3.4``, ``1.2.3.4:5678``,
    ``2001:db8::1``, ``[2001:db8::1]:443``; None when it is none of those."""
    if not address:
        return None
    text = address.strip()
    if text.startswith("["):
        text = text[1:].partition("]")[0]
    elif text.count(":") == 1:
        text = text.partition(":")[0]
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None


@cache
def trusted_proxies(entries: tuple[str, ...]) -> TrustedProxies:
    return TrustedProxies(entries)


def client_origin(scope: Scope) -> ClientOrigin:
    """The client address and scheme of a request (module docstring), worked out once
    per request."""
    state = scope.get("state")
    if state is None:
        state = scope["state"] = {}
    found: ClientOrigin | None = state.get("client_origin")
    if found is None:
        found = state["client_origin"] = _origin(scope)
    return found


def _origin(scope: Scope) -> ClientOrigin:
    client = scope.get("client")
    peer = client[0] if client else None
    scheme = "https" if scope.get("scheme") in ("https", "wss") else "http"
    proxies = trusted_proxies(_configured(scope))
    if not proxies.networks:
        return ClientOrigin(peer, scheme)
    forwarded_for = forwarded_proto = None
    for name, value in scope["headers"]:
        if name == b"x-forwarded-for":  # several headers are one list (RFC 9110 5.3)
            text = value.decode("latin-1")
            forwarded_for = text if forwarded_for is None else f"{forwarded_for},{text}"
        elif name == b"x-forwarded-proto" and forwarded_proto is None:
            forwarded_proto = value.decode("latin-1")
    return proxies.origin(peer, scheme, forwarded_for, forwarded_proto)


def _configured(scope: Scope) -> tuple[str, ...]:
    """The trusted proxies of the app serving the request (none outside the platform's
    app, e.g. a bare ASGI app in a test)."""
    services: Any = getattr(getattr(scope.get("app"), "state", None), "services", None)
    return tuple(services.settings.trusted_proxies) if services is not None else ()
