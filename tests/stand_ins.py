"""Local stand-ins of outside services (a payer, DHIS2, a speech-to-text or inference
API, a national exchange) served over real HTTP on a free loopback port."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from aiohttp import web


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@asynccontextmanager
async def serving(app: web.Application) -> AsyncIterator[str]:
    """``app`` served on 127.0.0.1 for the duration; its base URL (no trailing slash)."""
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()
