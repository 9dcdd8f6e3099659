"""Attendance (clock-in, clock-out, the day's sheet) and leave requests of an
organization's members.

Both are workforce bookkeeping, not health data: documents.

- ``attendance`` (one per shift: ``id``, ``organization_id``, ``user_id``, ``date`` (the
  UTC day of the clock-in), ``clock_in``, ``clock_out``, ``minutes``) and
  ``attendance_open`` (id ``<org_id>:<user_id>``, the shift in progress). Clocking in
  inserts the open-shift document, so a second clock-in while one is open is refused by
  the store itself (409 ``ALREADY_CLOCKED_IN``), in any number of processes; clocking
  out deletes it and inserts ``attendance_closed/<shift id>`` (two clock-outs at once:
  one wins, the other is 409 ``NOT_CLOCKED_IN``). A shift counts for the day it started.
  ``GET /api/attendance/today`` is the caller's day sheet in an organization (their
  shifts and the day's total, an open shift counted up to now) or, with ``all=true``
  and for the organization's ``ORG:ADMIN``, every member who clocked in today.
- ``leave_requests`` (``id``, ``organization_id``, ``user_id``, ``type``, ``start``,
  ``end`` (dates, inclusive), ``days``, ``reason``, ``status`` pending | approved,
  ``requested_at``, ``approved_by``, ``approved_at``): a member asks for leave (409
  ``LEAVE_OVERLAPS`` when it overlaps one of their pending or approved leaves); an
  ``ORG:ADMIN`` of the organization approves it (409 ``INVALID_TRANSITION`` unless
  pending; a decision is inserted once, ``leave_decisions/<id>``).

Which organization: ``organization_id`` in the body or query, or the caller's only
organization when they belong to one. Events: ``platform.attendance.clocked_in`` /
``clocked_out`` (``shift_id``, ``organization_id``, ``user_id``, ``clock_in``,
``clock_out``, ``minutes``), ``platform.workforce.leave_requested`` and
``platform.workforce.leave_approved`` with the payload agreed with the Workforce area:
``{leave_request_id, organization_id, user_id, start, end, type, approved_by}`` (dates
ISO 8601).
"""

from __future__ import annotations

from datetime import UTC, date, datetime
from typing import Any, Literal

from fastapi import APIRouter, Depends, Query
from pydantic import BaseModel, Field, ValidationInfo, field_validator

from fhir_server.caller import FhirUnit
from fhir_server.clock import now_instant
from fhir_server.ids import new_id
from fhir_server.store import DuplicateDocument
from platform_api.envelope import ApiError, Envelope, conflict, created, not_found, ok
from platform_api.facade import ApiContext, api_context, require_organization
from platform_api.organizations.members import MEMBERS

JSON = dict[str, Any]
SHIFTS, OPEN_SHIFTS, CLOSED_SHIFTS = "attendance", "attendance_open", "attendance_closed"
LEAVE_REQUESTS, LEAVE_DECISIONS = "leave_requests", "leave_decisions"
CLOCKED_IN, CLOCKED_OUT = "platform.attendance.clocked_in", "platform.attendance.clocked_out"
LEAVE_REQUESTED = "platform.workforce.leave_requested"
LEAVE_APPROVED = "platform.workforce.leave_approved"
MAX_SHIFTS_A_DAY = 5000
MAX_LEAVE_DAYS = 366
LeaveType = Literal["annual", "sick", "maternity", "paternity", "compassionate", "study",
                    "unpaid"]


class ClockRequest(BaseModel):
    organization_id: str | None = Field(default=None, max_length=64, description="Default: "
                                        "the caller's only organization")


class ShiftView(BaseModel):
    id: str
    organization_id: str
    user_id: str
    date: str
    clock_in: str
    clock_out: str | None = None
    minutes: int | None = None


class MemberDay(BaseModel):
    user_id: str
    name: str | None = None
    clocked_in: bool
    shifts: list[ShiftView]
    total_minutes: int


class DaySheet(BaseModel):
    date: str
    organization_id: str
    members: list[MemberDay]
    total_minutes: int


class LeaveCreate(BaseModel):
    organization_id: str | None = Field(default=None, max_length=64)
    type: LeaveType = Field(examples=["annual"])
    start: date = Field(examples=["2026-12-21"])
    end: date = Field(examples=["2026-12-31"])
    reason: str | None = Field(default=None, max_length=1000)

    @field_validator("end")
    @classmethod
    def _ordered(cls, end: date, info: ValidationInfo) -> date:
        start = info.data.get("start")
        if start is not None and end < start:
            raise ValueError("the leave ends before it starts")
        if start is not None and (end - start).days + 1 > MAX_LEAVE_DAYS:
            raise ValueError(f"a leave request covers at most {MAX_LEAVE_DAYS} days")
        return end


class LeaveView(BaseModel):
    id: str
    organization_id: str
    user_id: str
    type: str
    start: str
    end: str
    days: int
    reason: str | None = None
    status: str
    requested_at: str
    approved_by: str | None = None
    approved_at: str | None = None


async def _organization(ctx: ApiContext, wanted: str | None) -> str:
    """The organization named, else the caller's only one; the caller must be a member
    (the policy's ``attendance.keep``)."""
    if wanted is None:
        mine = sorted(ctx.organizations_for("attendance.keep") or ())
        if len(mine) != 1:
            raise ApiError(422, "VALIDATION_ERROR", "organization_id: name the organization "
                           f"(you are a member of {len(mine)})", field="organization_id")
        wanted = mine[0]
    await require_organization(ctx, wanted, "attendance.keep")
    return wanted


def _minutes(start: str, end: str) -> int:
    return max(0, int((datetime.fromisoformat(end) - datetime.fromisoformat(start))
                      .total_seconds() // 60))


async def _commit(unit: FhirUnit, refusal: ApiError) -> None:
    """Commit a unit whose inserted document is the guard: a duplicate is ``refusal``."""
    try:
        await unit.commit()
    except DuplicateDocument:
        raise refusal from None


router = APIRouter(tags=["attendance"])


@router.post("/api/attendance/clock-in", status_code=201, response_model=Envelope[ShiftView],
             summary="Clock in at an organization (one open shift at a time)")
async def clock_in(body: ClockRequest, ctx: ApiContext = Depends(api_context)) -> Any:
    org_id, user_id, now = (await _organization(ctx, body.organization_id),
                            ctx.principal.user_id, now_instant())
    shift: JSON = {"id": new_id(), "organization_id": org_id, "user_id": user_id,
             "date": now[:10], "clock_in": now, "clock_out": None, "minutes": None}
    unit = ctx.unit()
    async with unit:
        unit.insert_document(OPEN_SHIFTS, f"{org_id}:{user_id}", {
            "id": f"{org_id}:{user_id}", "shift_id": shift["id"], "clock_in": now})
        unit.put_document(SHIFTS, shift["id"], shift)
        unit.emit(CLOCKED_IN, {"shift_id": shift["id"], "organization_id": org_id,
                               "user_id": user_id, "clock_in": now}, source_service="attendance")
        await _commit(unit, conflict("ALREADY_CLOCKED_IN", "You are already clocked in here: "
                                     "clock out first"))
    return created(ShiftView.model_validate(shift).model_dump())


@router.post("/api/attendance/clock-out", response_model=Envelope[ShiftView],
             summary="Clock out of the open shift")
async def clock_out(body: ClockRequest, ctx: ApiContext = Depends(api_context)) -> Any:
    org_id, user_id, now = (await _organization(ctx, body.organization_id),
                            ctx.principal.user_id, now_instant())
    store = ctx.services.store
    not_in = conflict("NOT_CLOCKED_IN", "You are not clocked in here")
    open_shift = await store.get_document(OPEN_SHIFTS, f"{org_id}:{user_id}")
    shift = await store.get_document(SHIFTS, open_shift["shift_id"]) if open_shift else None
    if open_shift is None or shift is None:
        raise not_in
    closed = {**shift, "clock_out": now, "minutes": _minutes(shift["clock_in"], now)}
    unit = ctx.unit()
    async with unit:
        unit.insert_document(CLOSED_SHIFTS, shift["id"], {"id": shift["id"], "at": now})
        unit.delete_document(OPEN_SHIFTS, open_shift["id"])
        unit.put_document(SHIFTS, shift["id"], closed)
        unit.emit(CLOCKED_OUT, {k: closed[k] for k in (
            "organization_id", "user_id", "clock_in", "clock_out", "minutes")} | {
            "shift_id": shift["id"]}, source_service="attendance")
        await _commit(unit, not_in)
    return ok(ShiftView.model_validate(closed).model_dump())


def _member_day(user_id: str, shifts: list[JSON], name: str | None, now: str) -> JSON:
    total = sum(s["minutes"] if s.get("clock_out") else _minutes(s["clock_in"], now)
                for s in shifts)
    return MemberDay(user_id=user_id, name=name,
                     clocked_in=any(s.get("clock_out") is None for s in shifts),
                     shifts=[ShiftView(**s) for s in sorted(shifts, key=lambda s: s["clock_in"])],
                     total_minutes=total).model_dump()


@router.get("/api/attendance/today", response_model=Envelope[DaySheet],
            summary="Today's attendance: the caller's, or the whole organization's "
                    "(ORG:ADMIN, all=true)")
async def today(organization_id: str | None = Query(None, max_length=64),
                everyone: bool = Query(False, alias="all",
                                       description="Every member (ORG:ADMIN only)"),
                ctx: ApiContext = Depends(api_context)) -> Any:
    if everyone and organization_id is not None:
        await require_organization(ctx, organization_id, "organization.manage")
        org_id = organization_id
    else:
        org_id = await _organization(ctx, organization_id)
        if everyone:
            ctx.authorize("organization.manage", org_id)
    now = now_instant()
    where = {"organization_id": org_id, "date": now[:10]}
    if not everyone:
        where["user_id"] = ctx.principal.user_id
    store = ctx.services.store
    shifts = await store.find_documents(SHIFTS, where, limit=MAX_SHIFTS_A_DAY)
    by_user: dict[str, list[JSON]] = {}
    for shift in shifts:
        by_user.setdefault(shift["user_id"], []).append(shift)
    if not everyone:
        by_user.setdefault(ctx.principal.user_id, [])
    members = []
    for user_id, theirs in sorted(by_user.items()):
        member = await store.get_document(MEMBERS, f"{org_id}:{user_id}") or {}
        name = " ".join(p for p in (member.get("first_name"), member.get("last_name")) if p)
        members.append(_member_day(user_id, theirs, name or None, now))
    return ok(DaySheet(date=now[:10], organization_id=org_id, members=[MemberDay(**m)
                                                                       for m in members],
                       total_minutes=sum(m["total_minutes"] for m in members)).model_dump())


# -- leave ----------------------------------------------------------------------------------------
def _overlaps(leave: JSON, start: date, end: date) -> bool:
    return leave["status"] in ("pending", "approved") and \
        date.fromisoformat(leave["start"]) <= end and start <= date.fromisoformat(leave["end"])


@router.post("/api/leave-requests", status_code=201, response_model=Envelope[LeaveView],
             summary="Ask for leave (approved by an ORG:ADMIN of the organization)")
async def request_leave(body: LeaveCreate, ctx: ApiContext = Depends(api_context)) -> Any:
    org_id, user_id = await _organization(ctx, body.organization_id), ctx.principal.user_id
    theirs = await ctx.services.store.find_documents(
        LEAVE_REQUESTS, {"organization_id": org_id, "user_id": user_id}, limit=1000)
    if any(_overlaps(leave, body.start, body.end) for leave in theirs):
        raise conflict("LEAVE_OVERLAPS", "This overlaps another of your leave requests")
    leave: JSON = {"id": new_id(), "organization_id": org_id, "user_id": user_id, "type": body.type,
             "start": body.start.isoformat(), "end": body.end.isoformat(),
             "days": (body.end - body.start).days + 1, "reason": body.reason,
             "status": "pending", "requested_at": now_instant(), "approved_by": None,
             "approved_at": None}
    unit = ctx.unit()
    async with unit:
        unit.put_document(LEAVE_REQUESTS, leave["id"], leave)
        unit.emit(LEAVE_REQUESTED, {"leave_request_id": leave["id"], **{k: leave[k] for k in (
            "organization_id", "user_id", "start", "end", "type")}},
            source_service="workforce")
        await unit.commit()
    return created(LeaveView.model_validate(leave).model_dump())


@router.post("/api/organizations/{org_id}/leave-requests/{leave_id}/approve",
             response_model=Envelope[LeaveView],
             summary="Approve a pending leave request (ORG:ADMIN)")
async def approve_leave(org_id: str, leave_id: str,
                        ctx: ApiContext = Depends(api_context)) -> Any:
    await require_organization(ctx, org_id, "organization.manage")
    leave = await ctx.services.store.get_document(LEAVE_REQUESTS, leave_id)
    if leave is None or leave["organization_id"] != org_id:
        raise not_found("Leave request")
    refused = conflict("INVALID_TRANSITION", f"This leave request is {leave['status']}")
    if leave["status"] != "pending":
        raise refused
    now = datetime.now(UTC).isoformat()
    approved = {**leave, "status": "approved", "approved_by": ctx.principal.user_id,
                "approved_at": now}
    unit = ctx.unit()
    async with unit:
        unit.insert_document(LEAVE_DECISIONS, leave_id, {"id": leave_id, "decision":
                                                         "approved", "at": now})
        unit.put_document(LEAVE_REQUESTS, leave_id, approved)
        unit.emit(LEAVE_APPROVED, {"leave_request_id": leave_id, **{k: leave[k] for k in (
            "organization_id", "user_id", "start", "end", "type")},
            "approved_by": ctx.principal.user_id}, source_service="workforce")
        await _commit(unit, conflict("INVALID_TRANSITION", "This leave request was decided "
                                     "meanwhile"))
    return ok(LeaveView.model_validate(approved).model_dump())
