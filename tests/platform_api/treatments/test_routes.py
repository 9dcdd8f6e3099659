"""The Treatments area as a whole: every operation the spec lists for it is served,
documented with its models, and refused without credentials."""

from __future__ import annotations

from tests.platform_api.area_operations import (
    assert_credentials_needed,
    assert_served_and_documented,
)


async def test_every_operation_of_the_area_is_served_and_documented(client):
    await assert_served_and_documented(client, "Treatments", 8)


async def test_every_route_of_the_area_needs_credentials(client):
    assert await assert_credentials_needed(client, "Treatments") == []
