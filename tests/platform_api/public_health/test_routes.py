"""Public health and surveillance as a whole: every operation the spec lists for them is
served, documented with named models, and refused without credentials."""

from __future__ import annotations

from platform_api.access_rules import OPERATIONS
from tests.platform_api.area_operations import (
    assert_credentials_needed,
    assert_served_and_documented,
)

OURS = ("/api/public-health/", "/api/surveillance/")
OPERATIONS_OF_AREA = [op for op in OPERATIONS["Clinical decision support"]
                      if op[1].startswith(OURS)]


async def test_every_operation_of_the_area_is_served_and_documented(client):
    served = await assert_served_and_documented(client, OPERATIONS_OF_AREA, 7)
    dashboard = served[("GET", "/api/public-health/dashboard")]["responses"]["200"]
    assert {"image/svg+xml", "image/png"} <= set(dashboard["content"])


async def test_every_route_of_the_area_needs_credentials(client):
    assert await assert_credentials_needed(client, OPERATIONS_OF_AREA) == []
