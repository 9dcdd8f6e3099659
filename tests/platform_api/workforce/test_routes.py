"""The Workforce and training area as a whole (``platform_api.workforce`` and
``platform_api.training``): every operation the spec lists is served, documented with its
models, and refused without credentials (the signed leave webhook: without a signature)."""

from __future__ import annotations

from tests.platform_api.area_operations import (
    assert_credentials_needed,
    assert_served_and_documented,
)

AREA = "Workforce and training"


async def test_every_workforce_and_training_operation_is_served_and_documented(client):
    await assert_served_and_documented(client, AREA, 26)


async def test_every_workforce_and_training_route_needs_credentials(client):
    assert await assert_credentials_needed(client, AREA) == []
