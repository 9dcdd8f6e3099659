"""The clinic the public-health tests work in (tests/platform_api/clinic.py), and a
stand-in DHIS2 over real HTTP that the app is configured to push to (HTTP Basic)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import make_settings
from tests.platform_api.clinic import clinic  # noqa: F401  (the fixture)
from tests.platform_api.public_health.dhis2_standin import Dhis2StandIn
from tests.stand_ins import serving


@pytest.fixture
async def dhis2() -> AsyncIterator[tuple[Dhis2StandIn, str]]:
    stand_in = Dhis2StandIn()
    async with serving(stand_in.app()) as url:
        yield stand_in, url


@pytest.fixture
def settings(tmp_path: Path, dhis2: tuple[Dhis2StandIn, str]) -> Any:
    stand_in, url = dhis2
    return make_settings(tmp_path, hmis_url=url, hmis_username=stand_in.username,
                         hmis_password=stand_in.password)
