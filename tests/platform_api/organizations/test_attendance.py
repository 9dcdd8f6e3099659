"""Attendance (clock-in, clock-out, today's sheet) and leave requests approved by an
ORG:ADMIN, which emit platform.workforce.leave_approved with the agreed payload."""

from __future__ import annotations

import asyncio
from typing import Any

from platform_api.policy.roles import ORG_NURSE
from tests.conftest import add_member
from tests.platform_api.clinic import Clinic, refusal


async def clock(clinic: Clinic, who: str, action: str, org_id: str | None = None) -> Any:
    body = {"organization_id": org_id} if org_id else {}
    return await clinic.post(who, f"/api/attendance/clock-{action}", body)


async def test_a_member_clocks_in_and_out_once_at_a_time(clinic: Clinic):
    shift = await clock(clinic, "nurse", "in")
    assert shift.status_code == 201, shift.text
    assert shift.json()["data"]["organization_id"] == clinic.org_id
    assert shift.json()["data"]["clock_out"] is None
    assert refusal(await clock(clinic, "nurse", "in")) == (409, "ALREADY_CLOCKED_IN")
    out = await clock(clinic, "nurse", "out", clinic.org_id)
    assert out.status_code == 200 and out.json()["data"]["minutes"] == 0
    assert refusal(await clock(clinic, "nurse", "out")) == (409, "NOT_CLOCKED_IN")
    assert (await clock(clinic, "nurse", "in")).status_code == 201
    today = (await clinic.get("nurse", "/api/attendance/today")).json()["data"]
    [me] = today["members"]
    assert me["user_id"] == clinic.user_id("nurse") and me["clocked_in"] is True
    assert len(me["shifts"]) == 2 and me["name"] == "Nafula Wekesa"
    assert today["organization_id"] == clinic.org_id and today["total_minutes"] == 0


async def test_two_clock_ins_at_once_open_one_shift(clinic: Clinic):
    answers = await asyncio.gather(clock(clinic, "doctor", "in"), clock(clinic, "doctor", "in"))
    assert sorted(a.status_code for a in answers) == [201, 409]
    today = (await clinic.get("doctor", "/api/attendance/today")).json()["data"]
    assert len(today["members"][0]["shifts"]) == 1


async def test_the_organization_must_be_clear_and_the_caller_a_member(clinic: Clinic):
    await add_member(clinic.app, clinic.other_org_id, clinic.people["nurse"], ORG_NURSE)
    unclear = await clock(clinic, "nurse", "in")
    assert refusal(unclear) == (422, "VALIDATION_ERROR")
    assert unclear.json()["error"]["field"] == "organization_id"
    assert (await clock(clinic, "nurse", "in", clinic.other_org_id)).status_code == 201
    assert refusal(await clock(clinic, "stranger", "in", clinic.org_id)) == (403, "FORBIDDEN")
    assert refusal(await clock(clinic, "platform_admin", "in", clinic.org_id)) == (
        403, "FORBIDDEN")
    assert refusal(await clock(clinic, "nurse", "in", "nowhere")) == (404, "NOT_FOUND")


async def test_the_admin_sees_the_whole_organizations_day(clinic: Clinic):
    for who in ("nurse", "doctor", "receptionist"):
        await clock(clinic, who, "in")
    await clock(clinic, "receptionist", "out")
    sheet = (await clinic.get("admin", "/api/attendance/today", all="true")).json()["data"]
    present = {m["user_id"]: m["clocked_in"] for m in sheet["members"]}
    assert present == {clinic.user_id("nurse"): True, clinic.user_id("doctor"): True,
                       clinic.user_id("receptionist"): False}
    assert refusal(await clinic.get("nurse", "/api/attendance/today", all="true")) == (
        403, "FORBIDDEN")
    assert refusal(await clinic.get("other_admin", "/api/attendance/today", all="true",
                                    organization_id=clinic.org_id)) == (403, "FORBIDDEN")


async def ask_leave(clinic: Clinic, who: str, start: str, end: str, kind: str = "annual"
                    ) -> Any:
    return await clinic.post(who, "/api/leave-requests", {
        "type": kind, "start": start, "end": end, "reason": "Family visit in Kisumu"})


async def test_leave_is_requested_and_approved_by_an_org_admin(clinic: Clinic):
    approved_events = clinic.recorded("platform.workforce.leave_approved")
    asked = await ask_leave(clinic, "nurse", "2026-12-21", "2026-12-31")
    assert asked.status_code == 201, asked.text
    leave = asked.json()["data"]
    assert leave["status"] == "pending" and leave["days"] == 11
    approve = f"/api/organizations/{clinic.org_id}/leave-requests/{leave['id']}/approve"
    assert refusal(await clinic.post("doctor", approve)) == (403, "FORBIDDEN")
    assert refusal(await clinic.post("nurse", approve)) == (403, "FORBIDDEN")
    elsewhere = f"/api/organizations/{clinic.other_org_id}/leave-requests/{leave['id']}/approve"
    assert refusal(await clinic.post("other_admin", elsewhere)) == (404, "NOT_FOUND")
    done = await clinic.post("admin", approve)
    assert done.status_code == 200, done.text
    assert done.json()["data"]["status"] == "approved"
    assert done.json()["data"]["approved_by"] == clinic.user_id("admin")
    assert refusal(await clinic.post("admin", approve)) == (409, "INVALID_TRANSITION")
    await clinic.drain()
    [event] = approved_events
    assert event["payload"] == {
        "leave_request_id": leave["id"], "organization_id": clinic.org_id,
        "user_id": clinic.user_id("nurse"), "start": "2026-12-21", "end": "2026-12-31",
        "type": "annual", "approved_by": clinic.user_id("admin")}


async def test_leave_requests_are_checked(clinic: Clinic):
    assert (await ask_leave(clinic, "doctor", "2026-12-01", "2026-12-05")).status_code == 201
    assert refusal(await ask_leave(clinic, "doctor", "2026-12-05", "2026-12-08")) == (
        409, "LEAVE_OVERLAPS")
    backwards = await ask_leave(clinic, "doctor", "2026-12-10", "2026-12-09")
    assert refusal(backwards) == (422, "VALIDATION_ERROR")
    assert backwards.json()["error"]["field"] == "end"
    assert refusal(await ask_leave(clinic, "doctor", "2026-12-10", "2026-12-11", "holiday")
                   ) == (422, "VALIDATION_ERROR")
    assert refusal(await ask_leave(clinic, "stranger", "2026-12-10", "2026-12-11")) == (
        422, "VALIDATION_ERROR")
    missing = f"/api/organizations/{clinic.org_id}/leave-requests/nothing/approve"
    assert refusal(await clinic.post("admin", missing)) == (404, "NOT_FOUND")
