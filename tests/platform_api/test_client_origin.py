"""A request's client address and scheme: forwarded headers are believed only from the
trusted proxies (none by default), read from the right."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
from asgi_lifespan import LifespanManager

from platform_api.app import create_app
from platform_api.client_origin import ClientOrigin, TrustedProxies
from tests.conftest import make_settings, register_and_login

LB = "10.20.0.5"


def test_without_trusted_proxies_the_peer_is_the_client() -> None:
    proxies = TrustedProxies([])
    assert proxies.origin("127.0.0.1", "http", "203.0.113.7", "https") == \
        ClientOrigin("127.0.0.1", "http")


def test_a_trusted_proxy_is_believed_and_what_the_client_wrote_is_not() -> None:
    proxies = TrustedProxies(["10.20.0.0/24", "2001:db8::/32"])
    # The client wrote "198.51.100.1" itself; the proxy appended the address it saw.
    assert proxies.origin(LB, "http", "198.51.100.1, 203.0.113.7", "https") == \
        ClientOrigin("203.0.113.7", "https")
    # Two proxies of ours in a row: the first address that is not one of them.
    assert proxies.origin(LB, "http", "203.0.113.7, 10.20.0.9", None).address == "203.0.113.7"
    assert proxies.origin("2001:db8::1", "http", "[2001:db8:1::7]:443, 192.0.2.4:5060",
                          "HTTPS").address == "192.0.2.4"
    assert proxies.origin(LB, "http", "not-an-address", "gopher") == ClientOrigin(LB, "http")
    # An untrusted peer's headers are nobody's word.
    assert proxies.origin("192.0.2.99", "http", "203.0.113.7", "https") == \
        ClientOrigin("192.0.2.99", "http")


def test_a_wrong_entry_stops_the_start_with_a_clear_message(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="TRUSTED_PROXIES: 'loadbalancer'"):
        create_app(make_settings(tmp_path, trusted_proxies=["loadbalancer"]))


async def last_login_ip(tmp_path: Path, **settings: Any) -> str:
    app = create_app(make_settings(tmp_path, **settings))
    async with LifespanManager(app, startup_timeout=30):
        transport = httpx.ASGITransport(app=app, client=(LB, 50123))
        async with httpx.AsyncClient(transport=transport, base_url="https://hp.example",
                                     headers={"X-Forwarded-For": "203.0.113.7",
                                              "X-Forwarded-Proto": "https"}) as client:
            user = await register_and_login(client)
        login = await app.state.services.store.get_document("user_logins", user["user"]["id"])
        return str(login["last_login_ip"])


async def test_the_audit_trail_gets_the_forwarded_address_only_from_a_trusted_proxy(
        tmp_path: Path) -> None:
    assert await last_login_ip(tmp_path / "default") == LB
    assert await last_login_ip(tmp_path / "trusted", trusted_proxies=[LB]) == "203.0.113.7"
