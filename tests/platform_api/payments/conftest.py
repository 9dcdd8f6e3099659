"""Fixtures of the payments tests: both providers' stand-ins served locally, the app
configured to use them (its public base URL is HTTPS, as providers require of callback
URLs), and a client whose requests arrive over HTTPS for the callbacks."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from platform_api.settings import Settings
from tests.conftest import make_settings
from tests.platform_api.payments.stand_ins import RequestToPayStandIn, StkPushStandIn, serving

PUBLIC_BASE = "https://api.kliniki.example"


@pytest.fixture
async def stk() -> AsyncIterator[StkPushStandIn]:
    stand_in = StkPushStandIn()
    async with serving(stand_in) as url:
        stand_in.url = url  # type: ignore[attr-defined]
        yield stand_in


@pytest.fixture
async def momo() -> AsyncIterator[RequestToPayStandIn]:
    stand_in = RequestToPayStandIn()
    async with serving(stand_in) as url:
        stand_in.url = url  # type: ignore[attr-defined]
        yield stand_in


def provider_settings(stk: StkPushStandIn, momo: RequestToPayStandIn) -> dict[str, Any]:
    return {
        "base_url": PUBLIC_BASE,
        "mobile_money_a_base_url": stk.url,  # type: ignore[attr-defined]
        "mobile_money_a_consumer_key": stk.key, "mobile_money_a_consumer_secret": stk.secret,
        "mobile_money_a_shortcode": stk.shortcode, "mobile_money_a_passkey": stk.passkey,
        "mobile_money_b_base_url": momo.url,  # type: ignore[attr-defined]
        "mobile_money_b_api_user": momo.user, "mobile_money_b_api_key": momo.key,
        "mobile_money_b_subscription_key": momo.subscription_key,
        "mobile_money_sweep_interval_seconds": 0,
    }


@pytest.fixture
def settings(tmp_path: Path, stk: StkPushStandIn, momo: RequestToPayStandIn) -> Settings:
    return make_settings(tmp_path, **provider_settings(stk, momo))


@pytest.fixture
async def secure(app: Any) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False,
                                    client=("196.201.214.200", 443))
    async with httpx.AsyncClient(transport=transport, base_url="https://testserver") as c:
        yield c
