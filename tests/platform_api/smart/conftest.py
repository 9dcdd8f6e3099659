"""Fixtures of the SMART tests: the clinic and a public app registered by an
administrator."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from platform_api.settings import Settings
from tests.conftest import make_settings
from tests.platform_api.smart.support import Browser, Clinic, make_clinic, register


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    """Public URLs are HEALTHPLATFORM_BASE_URL (never the request's Host): the test
    client's base."""
    return make_settings(tmp_path, base_url="http://testserver")


@pytest.fixture
async def clinic(app: Any, client: httpx.AsyncClient) -> Clinic:
    return await make_clinic(app, client)


@pytest.fixture
async def public_app(client: httpx.AsyncClient, clinic: Clinic) -> dict[str, Any]:
    return await register(client, clinic.platform_admin["headers"])


@pytest.fixture
def browser(client: httpx.AsyncClient) -> Browser:
    return Browser(client)
