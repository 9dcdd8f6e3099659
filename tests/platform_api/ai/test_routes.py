"""The /api/ai operations as a whole: every one the spec lists is served, documented
with named models, and refused without credentials (model-info is public)."""

from __future__ import annotations

from platform_api.access_rules import OPERATIONS
from tests.platform_api.area_operations import (
    assert_credentials_needed,
    assert_served_and_documented,
)

AI = [op for op in OPERATIONS["Clinical decision support"] if op[1].startswith("/api/ai/")]


async def test_every_operation_is_served_and_documented(client):
    await assert_served_and_documented(client, AI, 11)


async def test_every_route_needs_credentials_but_model_info(client):
    assert await assert_credentials_needed(client, AI) == ["/api/ai/model-info"]
    assert (await client.get("/api/ai/model-info")).status_code == 200
