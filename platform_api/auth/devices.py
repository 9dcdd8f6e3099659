"""Known devices: the browsers and apps that signed in to an account before.

A successful sign-in (password, social login or MFA challenge) sets the cookie
``hp_device`` (``HttpOnly``, ``SameSite=Strict``, ``Secure`` over HTTPS, path
``/api/auth``, 180 days): a random device id and the accounts (at most ten, latest
first) that signed in on it, sealed with the service's secret box (AES-256-GCM), so it
can be neither read nor forged. Sent back with a later sign-in, it makes the attempt
come from a *known device* of that account: it is throttled only by its own failures,
never by what an attacker guesses elsewhere (``AuthService.login``), and the sign-in
routes' budgets count it apart from its network address (``platform_api.access``).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from http.cookies import CookieError, SimpleCookie
from typing import Any

import orjson

from platform_api.auth.secretbox import SecretBox

COOKIE = "hp_device"
PATH = "/api/auth"
MAX_AGE = 180 * 24 * 3600
MAX_ACCOUNTS = 10
_CONTEXT = "device-cookie"


@dataclass(frozen=True, slots=True)
class KnownDevice:
    id: str
    users: tuple[str, ...]  # the accounts that signed in on it, latest first

    def knows(self, user_id: str) -> bool:
        return user_id in self.users


class DeviceCookies:
    def __init__(self, box: SecretBox):
        self._box = box

    def read(self, value: str | None) -> KnownDevice | None:
        """The device a cookie value names; None when absent, forged or too old."""
        if not value:
            return None
        value = value.strip('"')  # a client may send it back quoted
        try:
            data = orjson.loads(self._box.open(value + "=" * (-len(value) % 4), _CONTEXT))
            issued, device, users = float(data["t"]), str(data["d"]), data["u"]
        except (ValueError, KeyError, TypeError, orjson.JSONDecodeError):
            return None
        if time.time() - issued > MAX_AGE or not isinstance(users, list):
            return None
        return KnownDevice(device, tuple(str(u) for u in users))

    def signed_in(self, device: KnownDevice | None, user_id: str) -> str:
        """The cookie value after ``user_id`` signed in on ``device`` (a new device when
        None)."""
        device_id = device.id if device is not None else os.urandom(16).hex()
        users = [user_id, *(u for u in (device.users if device else ()) if u != user_id)]
        sealed = self._box.seal(orjson.dumps(
            {"d": device_id, "u": users[:MAX_ACCOUNTS], "t": time.time()}).decode(), _CONTEXT)
        # Without base64 padding: "=" is no cookie character, and a quoted value is one
        # more thing for clients to get wrong.
        return sealed.rstrip("=")


def cookie_value(headers: Any) -> str | None:
    """The device cookie among the ``Cookie`` header values of a request's raw headers."""
    for name, value in headers:
        if name == b"cookie" and COOKIE.encode() in value:
            jar: SimpleCookie = SimpleCookie()
            try:
                jar.load(value.decode("latin-1"))
            except CookieError:
                return None
            morsel = jar.get(COOKIE)
            return morsel.value if morsel is not None else None
    return None
