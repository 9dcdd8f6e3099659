"""Shift types and the coverage they need: rostering configuration, kept as documents.

FHIR has no resource for "the early shift needs two senior nurses on weekdays" (a
Schedule is a bookable calendar of a patient-facing service, a Slot a bookable time):
shift types are an organization's bookkeeping, like its leave requests.

``workforce_shift_types`` (``id``, ``organization_id``, ``code`` (unique in the
organization: 409 ``SHIFT_TYPE_EXISTS``, guarded by the ``workforce_shift_type_codes``
document ``<org_id>:<code>`` the create inserts), ``name``, ``start``, ``end`` (wall-clock
``HH:MM``; an end not after the start crosses midnight), ``crosses_midnight``,
``minutes``, ``night`` (at least 3 h between 22:00 and 06:00), ``required_skills`` (every
member on the shift holds them all), ``coverage`` (rules: ``count`` members holding
``skill`` (none: anyone) on ``days`` (weekday names; none: every day)), ``created_at``,
``created_by``).

``GET /api/workforce/coverage-requirements`` reads the coverage per shift type and
weekday from them (one row per shift type, day and skill). The organization's
``ORG:ADMIN`` creates shift types; its members read them. Event
``platform.workforce.shift_type_created`` (payload: the view).
"""

from __future__ import annotations

from datetime import time
from typing import Any, Literal

from fastapi import APIRouter, Depends, Query
from pydantic import BaseModel, Field

from fhir_server.clock import now_instant
from fhir_server.ids import new_id
from platform_api.envelope import Envelope, PageEnvelope, Pagination, created, pagination
from platform_api.facade import ApiContext, api_context, conflict_responses
from platform_api.organizations.members import documents_page
from platform_api.workforce.common import (
    SHIFT_TYPE_CODES,
    SHIFT_TYPES,
    SOURCE,
    organization,
    shift_type_map,
)
from platform_api.workforce.members import Code
from platform_api.workforce.rules import WEEKDAYS, CoverageRule, ShiftType

JSON = dict[str, Any]
Weekday = Literal["mon", "tue", "wed", "thu", "fri", "sat", "sun"]
SHIFT_TYPE_CREATED = "platform.workforce.shift_type_created"


class Coverage(BaseModel):
    count: int = Field(ge=1, le=500, examples=[2])
    skill: Code | None = Field(default=None, description="None: any member",
                               examples=["senior"])
    days: list[Weekday] = Field(default_factory=list, description="None: every day",
                                examples=[["mon", "tue", "wed", "thu", "fri"]])


class ShiftTypeCreate(BaseModel):
    organization_id: str | None = Field(default=None, max_length=64)
    code: Code = Field(examples=["N"])
    name: str = Field(min_length=1, max_length=100, examples=["Night"])
    start: time = Field(examples=["22:00"])
    end: time = Field(examples=["07:30"], description="Not after start: the next day")
    required_skills: list[Code] = Field(default_factory=list, max_length=20)
    coverage: list[Coverage] = Field(min_length=1, max_length=50)


class ShiftTypeView(BaseModel):
    id: str
    organization_id: str
    code: str
    name: str
    start: str
    end: str
    crosses_midnight: bool
    minutes: int
    night: bool
    required_skills: list[str]
    coverage: list[Coverage]
    created_at: str
    created_by: str | None = None


class CoverageRequirement(BaseModel):
    shift_type_id: str
    shift_type_code: str
    day: str
    skill: str | None = None
    count: int


def shift_type(document: JSON) -> ShiftType:
    """The rostering rules' shift type of a stored document."""
    return ShiftType(document["id"], document["code"], time.fromisoformat(document["start"]),
                     time.fromisoformat(document["end"]),
                     frozenset(document.get("required_skills") or []))


def coverage_rules(document: JSON) -> list[CoverageRule]:
    return [CoverageRule(c["count"], c.get("skill"), frozenset(c.get("days") or []))
            for c in document.get("coverage") or []]


def coverage_rows(documents: list[JSON], day: str | None = None) -> list[JSON]:
    rows = []
    for document in documents:
        for weekday in WEEKDAYS:
            if day is not None and weekday != day:
                continue
            counts: dict[str | None, int] = {}
            for rule in coverage_rules(document):
                if not rule.days or weekday in rule.days:
                    counts[rule.skill] = counts.get(rule.skill, 0) + rule.count
            rows += [{"shift_type_id": document["id"], "shift_type_code": document["code"],
                      "day": weekday, "skill": skill, "count": count}
                     for skill, count in counts.items()]
    return rows


router = APIRouter(tags=["workforce"])


@router.post("/api/workforce/shift-types", status_code=201,
             response_model=Envelope[ShiftTypeView],
             responses=conflict_responses({"SHIFT_TYPE_EXISTS": "the organization has a "
                                           "shift type with this code"}),
             summary="Create a shift type with its coverage (ORG:ADMIN)")
async def create_shift_type(body: ShiftTypeCreate, ctx: ApiContext = Depends(api_context)
                            ) -> Any:
    org_id = await organization(ctx, body.organization_id)
    ctx.authorize("workforce.manage", org_id)
    document: JSON = {
        "id": new_id(), "organization_id": org_id, "code": body.code, "name": body.name,
        "start": body.start.strftime("%H:%M"), "end": body.end.strftime("%H:%M"),
        "required_skills": list(dict.fromkeys(body.required_skills)),
        "coverage": [c.model_dump() for c in body.coverage],
        "created_at": now_instant(), "created_by": ctx.principal.user_id}
    rules = shift_type(document)
    document |= {"crosses_midnight": rules.crosses_midnight, "minutes": rules.minutes,
                 "night": rules.night}
    await ctx.insert_once(
        SHIFT_TYPES, document, unique=(SHIFT_TYPE_CODES, f"{org_id}:{body.code}"),
        event=(SHIFT_TYPE_CREATED, document, SOURCE),
        refusal=("SHIFT_TYPE_EXISTS", f"The organization has a shift type {body.code!r}"))
    return created(ShiftTypeView.model_validate(document).model_dump(mode="json"))


@router.get("/api/workforce/shift-types", response_model=PageEnvelope[ShiftTypeView],
            summary="List an organization's shift types")
async def list_shift_types(organization_id: str | None = Query(None, max_length=64),
                           page: Pagination = Depends(pagination),
                           ctx: ApiContext = Depends(api_context)) -> Any:
    org_id = await organization(ctx, organization_id)
    found, total = await documents_page(ctx, SHIFT_TYPES, {"organization_id": org_id}, page,
                                        "code")
    return page.respond([ShiftTypeView.model_validate(d).model_dump(mode="json")
                         for d in found], total)


@router.get("/api/workforce/coverage-requirements",
            response_model=PageEnvelope[CoverageRequirement],
            summary="How many members of which skill each shift type needs, per weekday")
async def coverage_requirements(organization_id: str | None = Query(None, max_length=64),
                                shift_type_id: str | None = Query(None, max_length=64),
                                day: Weekday | None = Query(None),
                                page: Pagination = Depends(pagination),
                                ctx: ApiContext = Depends(api_context)) -> Any:
    org_id = await organization(ctx, organization_id)
    documents = sorted((await shift_type_map(ctx, org_id)).values(), key=lambda d: d["code"])
    if shift_type_id is not None:
        documents = [d for d in documents if d["id"] == shift_type_id]
    rows = coverage_rows(documents, day)
    return page.respond(rows[page.offset:page.offset + page.limit], len(rows))
