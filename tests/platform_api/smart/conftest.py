"""Fixtures of the SMART tests: the clinic and a public app registered by an
administrator."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.platform_api.smart.support import Browser, Clinic, make_clinic, register


@pytest.fixture
async def clinic(app: Any, client: httpx.AsyncClient) -> Clinic:
    return await make_clinic(app, client)


@pytest.fixture
async def public_app(client: httpx.AsyncClient, clinic: Clinic) -> dict[str, Any]:
    return await register(client, clinic.platform_admin["headers"])


@pytest.fixture
def browser(client: httpx.AsyncClient) -> Browser:
    return Browser(client)
