"""The clinic the public-health tests work in (tests/platform_api/clinic.py), and a
stand-in DHIS2 over real HTTP that the app is configured to push to (HTTP Basic)."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from tests.conftest import make_settings
from tests.platform_api.clinic import clinic  # noqa: F401  (the fixture)
from tests.platform_api.public_health.dhis2_standin import Dhis2StandIn


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
async def dhis2() -> AsyncIterator[tuple[Dhis2StandIn, str]]:
    stand_in = Dhis2StandIn()
    runner = web.AppRunner(stand_in.app())
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield stand_in, f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


@pytest.fixture
def settings(tmp_path: Path, dhis2: tuple[Dhis2StandIn, str]) -> Any:
    stand_in, url = dhis2
    return make_settings(tmp_path, hmis_url=url, hmis_username=stand_in.username,
                         hmis_password=stand_in.password)
