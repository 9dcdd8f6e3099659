"""The Patients area as a whole (``platform_api.patients``): every operation the spec lists
for it is served, documented with its models, and refused without credentials."""

from __future__ import annotations

from tests.platform_api.area_operations import (
    assert_credentials_needed,
    assert_served_and_documented,
)


async def test_every_operation_of_the_area_is_served_and_documented(client):
    await assert_served_and_documented(client, "Patients", 65)


async def test_every_route_of_the_area_needs_credentials(client):
    # (the lab's HL7 ingest takes an HL7 message, not JSON; its own tests refuse it)
    assert await assert_credentials_needed(client, "Patients",
                                           skip=["/api/lab/hl7-ingest"]) == []
