"""Helpers for tests that drive a real browser against a real HTTP server.

``run_server`` serves an ASGI app with uvicorn on a free 127.0.0.1 port in a background
thread; ``launch_chromium`` starts Debian's Chromium through Playwright (Playwright's
own browser builds are downloaded from the internet, which the CI machines cannot reach).
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import uvicorn

if TYPE_CHECKING:
    from playwright.sync_api import Browser, Playwright

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
SERVER_START_TIMEOUT_SECONDS = 15.0


@contextmanager
def run_server(app: Any) -> Iterator[str]:
    """Serve ``app`` on 127.0.0.1 until the block ends; yields its base URL.

    The socket is bound here, before uvicorn starts, so the port cannot be taken by
    someone else between choosing it and listening on it.
    """
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    # log_config=None leaves the test process's logging as it is.
    config = uvicorn.Config(app, log_config=None, access_log=False, lifespan="auto")
    server = uvicorn.Server(config)
    thread = threading.Thread(
        target=server.run, kwargs={"sockets": [sock]}, name=f"uvicorn-{port}", daemon=True
    )
    thread.start()
    try:
        deadline = time.monotonic() + SERVER_START_TIMEOUT_SECONDS
        while not server.started:
            if not thread.is_alive():
                raise RuntimeError("uvicorn stopped before it started serving; see its log")
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"uvicorn did not start within {SERVER_START_TIMEOUT_SECONDS} seconds"
                )
            time.sleep(0.01)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=SERVER_START_TIMEOUT_SECONDS)
        sock.close()


def launch_chromium(playwright: Playwright) -> Browser:
    """Launch Debian's Chromium headless, or skip the test when it is not installed."""
    if not CHROMIUM.exists():
        pytest.skip("Debian's chromium is not installed: apt-get install chromium")
    return playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)


@contextmanager
def chromium() -> Iterator[Browser]:
    """Debian's Chromium under Playwright for the length of the block (skips the test
    when it is not installed)."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = launch_chromium(playwright)
        try:
            yield browser
        finally:
            browser.close()
