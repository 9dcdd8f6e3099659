"""POST /api/workforce/webhooks/leave-approved: an HR system's signed approval is
published as platform.workforce.leave_approved with the payload agreed between areas."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from tests.platform_api.webhooks.conftest import (
    LEAVE_SECRET,
    dead_letters,
    nothing_kept,
    recorder,
)
from tests.platform_api.webhooks.signing import body_of, standard_headers

PATH = "/api/workforce/webhooks/leave-approved"
LEAVE = {"leave_request_id": "LR-2026-118", "organization_id": "0193a5c4-org-kibera",
         "user_id": "0193a5c4-user-njeri", "start": "2026-12-01", "end": "2026-12-05",
         "type": "annual", "approved_by": "0193a5c4-user-kamau"}


async def send(secure: Any, payload: Any, webhook_id: str, **signing: Any) -> Any:
    body = body_of(payload)
    return await secure.post(PATH, content=body, headers=standard_headers(
        body, webhook_id, **{"secret": LEAVE_SECRET, **signing}))


async def test_an_approval_is_published_for_the_rosters(app, secure):
    rosters = recorder(app, "platform.workforce.leave_approved", "rosters")
    response = await send(secure, LEAVE, "msg_hr_0001")
    assert response.status_code == 200
    await app.state.services.bus.drain()
    [event] = rosters
    assert event["payload"] == LEAVE
    assert event["source_service"] == "webhooks"
    timed = {**LEAVE, "leave_request_id": "LR-2026-119", "start": "2026-12-01T08:00:00+03:00",
             "end": "2026-12-01T17:00:00+03:00", "type": "compassionate"}
    await send(secure, timed, "msg_hr_0002")
    await app.state.services.bus.drain()
    assert rosters[1]["payload"]["start"] == "2026-12-01T08:00:00+03:00"


async def test_a_redelivered_approval_is_published_once(app, secure):
    rosters = recorder(app, "platform.workforce.leave_approved", "rosters")
    await send(secure, LEAVE, "msg_hr_0003")
    again = await send(secure, LEAVE, "msg_hr_0003")
    assert again.json()["data"]["duplicate"] is True
    await app.state.services.bus.drain()
    assert len(rosters) == 1


@pytest.mark.parametrize(("change", "error"), [
    ({"end": "2026-11-28"}, "Value error, end is before start"),
    ({"start": "next monday"}, "start.date: Input should be a valid date"),
    ({"user_id": None}, "user_id:"),
])
async def test_an_approval_that_is_not_one_becomes_a_dead_letter(app, secure, change, error):
    rosters = recorder(app, "platform.workforce.leave_approved", "rosters")
    payload = {**LEAVE, **change}
    assert (await send(secure, payload, "msg_hr_bad")).status_code == 200
    [entry] = await dead_letters(app)
    assert error in entry["error"]
    assert entry["topic"] == "platform.webhook.leave_approved"
    assert entry["original_payload"] == body_of(payload).decode()
    assert rosters == []


async def test_unsigned_wrongly_signed_or_stale_approvals_are_401(app, secure, published):
    body = body_of(LEAVE)
    for headers in ({}, standard_headers(body, "m1"),  # the e-mail secret, not HR's
                    standard_headers(body, "m2", secret=LEAVE_SECRET,
                                     age=timedelta(minutes=-6))):  # from the future
        assert (await secure.post(PATH, content=body, headers=headers)).status_code == 401
    assert await nothing_kept(app, published)
