"""Headers every answer carries for the browser's and the proxies' sake, and the
connection after a failure.

- ``X-Content-Type-Options: nosniff`` on every answer: a browser takes the declared type
  (a FHIR resource is never run as a script or rendered as HTML);
- ``Cache-Control: no-store`` on answers carrying health data (``/fhir`` but its
  capability statement, ``/api``, ``/admin``) unless the route chose its own: no shared
  cache or browser disk keeps a patient's record;
- on HTML pages (``/docs``, the SMART sign-in pages): a Content Security Policy that
  loads nothing from elsewhere and runs no inline script (a page that needs one sets its
  own, naming the script's hash: see ``platform_api.docs``), and ``X-Frame-Options:
  DENY`` / ``frame-ancestors 'none'`` against clickjacking; what a page sets itself is
  kept;
- ``Connection: close`` on a 500: the server closes the connection after a request that
  failed inside the app; said in the answer, a keep-alive client opens a new one for its
  next request instead of sending it into a closed socket.

The ``Server`` banner is turned off where uvicorn is started (``platform_api.cli``).
Pure ASGI, outermost but for the request context: it sees every answer, those of the
error handlers included.
"""

from __future__ import annotations

import base64
import hashlib
import re

from starlette.responses import HTMLResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

DEFAULT_HTML_POLICY = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'")
NOSNIFF = (b"x-content-type-options", b"nosniff")
NO_STORE = (b"cache-control", b"no-store")
FRAME_DENY = (b"x-frame-options", b"DENY")
CLOSE = (b"connection", b"close")
# Paths whose answers carry health data (or accounts), and the one /fhir answer that does
# not: the capability statement, public and the same for everyone.
HEALTH_DATA_PREFIXES = ("/fhir", "/api/", "/admin/")
NOT_HEALTH_DATA = frozenset({"/fhir/metadata"})


_INLINE_SCRIPT = re.compile(rb"<script(?![^>]*\bsrc=)[^>]*>(.*?)</script>", re.S | re.I)


def allow_inline_scripts(page: HTMLResponse) -> HTMLResponse:
    """``page`` with a policy that runs its own inline scripts, named by their SHA-256
    (CSP Level 2 hash sources), and nothing else inline: a page built by a library
    (Swagger UI's) keeps working without ``'unsafe-inline'``."""
    hashes = " ".join(
        "'sha256-" + base64.b64encode(hashlib.sha256(script).digest()).decode() + "'"
        for script in _INLINE_SCRIPT.findall(bytes(page.body)))
    page.headers["Content-Security-Policy"] = DEFAULT_HTML_POLICY.replace(
        "script-src 'self'", f"script-src 'self' {hashes}".rstrip())
    return page


def carries_health_data(path: str) -> bool:
    return path.startswith(HEALTH_DATA_PREFIXES) and path not in NOT_HEALTH_DATA


class SecurityHeadersMiddleware:
    def __init__(self, app: ASGIApp, *, html_policy: str = DEFAULT_HTML_POLICY):
        self.app = app
        self.html_policy = (b"content-security-policy", html_policy.encode("latin-1"))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        private = carries_health_data(scope["path"])

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": self._headers(
                    message["status"], list(message.get("headers", ())), private)}
            await send(message)

        await self.app(scope, receive, send_with_headers)

    def _headers(self, status: int, headers: list[tuple[bytes, bytes]], private: bool
                 ) -> list[tuple[bytes, bytes]]:
        # ASGI header names are lower case (Starlette's responses write them so).
        cached = html = policy = framing = closing = sniffing = False
        for name, value in headers:
            if name == b"cache-control":
                cached = True
            elif name == b"content-type":
                html = value.startswith(b"text/html")
            elif name == b"content-security-policy":
                policy = True
            elif name == b"x-frame-options":
                framing = True
            elif name == b"connection":
                closing = True
            elif name == b"x-content-type-options":
                sniffing = True
        if not sniffing:
            headers.append(NOSNIFF)
        if private and not cached:
            headers.append(NO_STORE)
        if html:
            if not policy:
                headers.append(self.html_policy)
            if not framing:
                headers.append(FRAME_DENY)
        if status == 500 and not closing:
            headers.append(CLOSE)
        return headers
