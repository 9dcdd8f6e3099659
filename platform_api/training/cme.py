"""Continuing education credits (CME, CPD, CNE): earned by completing a course, or
recorded by hand with evidence; summarised per member and period against the required
total. Staff bookkeeping: documents.

``training_cme_credits``: ``id``, ``organization_id``, ``user_id``, ``activity``,
``credits``, ``credit_type``, ``earned_on`` (date), ``source`` course | manual,
``course_id`` and ``enrollment_id`` (course), ``evidence`` (manual: ``description``,
``url``, ``issuer``; required: 422 naming ``evidence``), ``recorded_by``, ``recorded_at``.
A course's credit has the id ``course-<enrollment id>`` and is staged with the
completion (:mod:`.enrollments`), so it is recorded once.

The summary counts credits earned between ``from`` and ``to`` (default: this calendar
year) against ``training_cme_required_credits_per_year`` prorated to the period's days.
Who: an ``ORG:ADMIN`` records for and sees every member; others record and see their
own. Event ``platform.training.cme_credit_recorded`` (the credit's view).
"""

from __future__ import annotations

from datetime import UTC, date, datetime
from typing import Any

from fastapi import APIRouter, Depends, Query
from pydantic import BaseModel, Field, HttpUrl, field_validator

from fhir_server.caller import FhirUnit
from fhir_server.clock import now_instant
from fhir_server.ids import new_id
from platform_api.envelope import (
    ApiError,
    Envelope,
    PageEnvelope,
    Pagination,
    created,
    pagination,
)
from platform_api.facade import ApiContext, api_context
from platform_api.organizations.members import MEMBERS
from platform_api.training.courses import CreditType, extension_value
from platform_api.workforce.common import organization

JSON = dict[str, Any]
CREDITS = "training_cme_credits"
SOURCE = "training"
RECORDED = "platform.training.cme_credit_recorded"
MAX_CREDITS = 10_000
MAX_MEMBERS = 5_000


class Evidence(BaseModel):
    description: str = Field(min_length=3, max_length=1000,
                             examples=["Certificate of attendance, KMA annual conference"])
    url: HttpUrl | None = None
    issuer: str | None = Field(default=None, max_length=200)


class CreditCreate(BaseModel):
    organization_id: str | None = Field(default=None, max_length=64)
    user_id: str | None = Field(default=None, max_length=64,
                                description="Whose credits (ORG:ADMIN; default: yours)")
    activity: str = Field(min_length=1, max_length=300, examples=["KMA annual conference"])
    credits: float = Field(gt=0, le=100)
    credit_type: CreditType = "CME"
    earned_on: date
    evidence: Evidence

    @field_validator("earned_on")
    @classmethod
    def _not_ahead(cls, earned_on: date) -> date:
        if earned_on > datetime.now(UTC).date():
            raise ValueError("credits are recorded once earned, not ahead")
        return earned_on


class CreditView(BaseModel):
    id: str
    organization_id: str
    user_id: str
    activity: str
    credits: float
    credit_type: str
    earned_on: str
    source: str
    course_id: str | None = None
    enrollment_id: str | None = None
    evidence: JSON | None = None
    recorded_by: str | None = None
    recorded_at: str


class CreditSummary(BaseModel):
    user_id: str
    name: str | None = None
    start: str
    end: str
    credits: float
    required: float
    remaining: float
    met: bool
    by_type: dict[str, float]


def credit_view(credit: JSON) -> JSON:
    return CreditView.model_validate(credit).model_dump(mode="json")


def stage_course_credit(unit: FhirUnit, enrollment: JSON, course: JSON) -> None:
    """The credits of a completed course, in the completion's unit of work."""
    credits = float(extension_value(course, "cme-credits") or 0)
    if credits <= 0:
        return
    credit = {"id": f"course-{enrollment['id']}", "organization_id": enrollment["organization_id"],
              "user_id": enrollment["user_id"], "activity": course.get("title", "Course"),
              "credits": credits, "credit_type": extension_value(course, "credit-type") or "CME",
              "earned_on": (enrollment.get("completed_at") or now_instant())[:10],
              "source": "course", "course_id": course["id"], "enrollment_id": enrollment["id"],
              "evidence": None, "recorded_by": None, "recorded_at": now_instant()}
    unit.put_document(CREDITS, credit["id"], credit)
    unit.emit(RECORDED, credit_view(credit), source_service=SOURCE)


def whose(ctx: ApiContext, org_id: str, user_id: str | None) -> str | None:
    """The member a request is about: anyone for an ORG:ADMIN (None: everyone), else the
    caller (403 for someone else: the policy's ``training.credits``)."""
    if user_id is not None:
        ctx.authorize("training.credits", org_id, user_id=user_id)
        return user_id
    return None if ctx.may("training.credits", org_id) else ctx.principal.user_id


def _period(start: date | None, end: date | None) -> tuple[date, date]:
    today = datetime.now(UTC).date()
    first, last = start or date(today.year, 1, 1), end or date(today.year, 12, 31)
    if last < first:
        raise ApiError(422, "VALIDATION_ERROR", "to: before from", field="to")
    return first, last


router = APIRouter(tags=["training"])


@router.post("/api/training/cme-credits", status_code=201, response_model=Envelope[CreditView],
             summary="Record credits earned elsewhere, with evidence")
async def record_credit(body: CreditCreate, ctx: ApiContext = Depends(api_context)) -> Any:
    org_id = await organization(ctx, body.organization_id)
    user_id = whose(ctx, org_id, body.user_id) or ctx.principal.user_id
    if await ctx.services.store.get_document(MEMBERS, f"{org_id}:{user_id}") is None:
        raise ApiError(422, "NOT_A_MEMBER", "user_id: not a member of the organization",
                       field="user_id")
    credit: JSON = {
        "id": new_id(), "organization_id": org_id, "user_id": user_id,
        "activity": body.activity, "credits": body.credits, "credit_type": body.credit_type,
        "earned_on": body.earned_on.isoformat(), "source": "manual", "course_id": None,
        "enrollment_id": None, "evidence": body.evidence.model_dump(mode="json"),
        "recorded_by": ctx.principal.user_id, "recorded_at": now_instant()}
    unit = ctx.unit()
    async with unit:
        unit.put_document(CREDITS, credit["id"], credit)
        unit.emit(RECORDED, credit_view(credit), source_service=SOURCE)
        await unit.commit()
    return created(credit_view(credit))


async def _credits(ctx: ApiContext, org_id: str, user_id: str | None, first: date,
                   last: date) -> list[JSON]:
    where = {"organization_id": org_id, **({"user_id": user_id} if user_id else {})}
    found = await ctx.services.store.find_documents(CREDITS, where, limit=MAX_CREDITS,
                                                    order_by="earned_on", descending=True)
    return [c for c in found if first.isoformat() <= c["earned_on"] <= last.isoformat()]


@router.get("/api/training/cme-credits", response_model=PageEnvelope[CreditView],
            summary="List credits (ORG:ADMIN: everyone's; others: their own)")
async def list_credits(organization_id: str | None = Query(None, max_length=64),
                       user_id: str | None = Query(None, max_length=64),
                       start: date | None = Query(None, alias="from"),
                       end: date | None = Query(None, alias="to"),
                       page: Pagination = Depends(pagination),
                       ctx: ApiContext = Depends(api_context)) -> Any:
    org_id = await organization(ctx, organization_id)
    first, last = _period(start or date.min, end or date.max)
    found = await _credits(ctx, org_id, whose(ctx, org_id, user_id), first, last)
    return page.respond([credit_view(c) for c in found[page.offset:page.offset + page.limit]],
                        len(found))


@router.get("/api/training/cme-credits/summary", response_model=PageEnvelope[CreditSummary],
            summary="Credits per member over a period against the required total")
async def credit_summary(organization_id: str | None = Query(None, max_length=64),
                         user_id: str | None = Query(None, max_length=64),
                         start: date | None = Query(None, alias="from",
                                                    description="Default: 1 January"),
                         end: date | None = Query(None, alias="to",
                                                  description="Default: 31 December"),
                         page: Pagination = Depends(pagination),
                         ctx: ApiContext = Depends(api_context)) -> Any:
    org_id = await organization(ctx, organization_id)
    first, last = _period(start, end)
    wanted = whose(ctx, org_id, user_id)
    members = await ctx.services.store.find_documents(
        MEMBERS, {"organization_id": org_id, **({"user_id": wanted} if wanted else {})},
        limit=MAX_MEMBERS, order_by="user_id")
    required = round(ctx.services.settings.training_cme_required_credits_per_year
                     * ((last - first).days + 1) / 365, 1)
    earned: dict[str, dict[str, float]] = {}
    for credit in await _credits(ctx, org_id, wanted, first, last):
        by_type = earned.setdefault(credit["user_id"], {})
        by_type[credit["credit_type"]] = by_type.get(credit["credit_type"], 0) + credit["credits"]
    rows = []
    for member in members:
        by_type = earned.get(member["user_id"], {})
        total = round(sum(by_type.values()), 2)
        name = " ".join(p for p in (member.get("first_name"), member.get("last_name")) if p)
        rows.append(CreditSummary(
            user_id=member["user_id"], name=name or None, start=first.isoformat(),
            end=last.isoformat(), credits=total, required=required,
            remaining=max(0.0, round(required - total, 2)), met=total >= required,
            by_type=by_type).model_dump())
    return page.respond(rows[page.offset:page.offset + page.limit], len(rows))
