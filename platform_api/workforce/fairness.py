"""Fairness of rosters: per member the shifts, hours against contract, nights, weekends and
holidays worked over a period, and the Gini coefficient of the night and weekend load
across members (0: all carry the same; towards 1: a few carry it all).

Counted from the organization's published rosters (or one roster, whatever its status,
with ``roster_id``: a draft's fairness before approving it), over the days of the period
(``from``/``to``, default the rosters' own days). Members of the workforce who worked
nothing count (as zeros) in the coefficient.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import date
from typing import Any

from fastapi import Depends, Query
from pydantic import BaseModel

from platform_api.envelope import ApiError, Envelope, PageEnvelope, Pagination, ok, pagination
from platform_api.facade import ApiContext, api_context
from platform_api.workforce import rosters as roster_area
from platform_api.workforce.common import organization, shift_type_map
from platform_api.workforce.members import workforce_members

JSON = dict[str, Any]


def gini(values: Sequence[float]) -> float:
    """The Gini coefficient (mean absolute difference over twice the mean)."""
    n = len(values)
    total = sum(values)
    if n == 0 or total == 0:
        return 0.0
    ordered = sorted(values)
    weighted = sum((2 * (i + 1) - n - 1) * v for i, v in enumerate(ordered))
    return weighted / (n * total)


class MemberFairness(BaseModel):
    user_id: str
    name: str | None = None
    shifts: int
    hours: float
    contracted_hours: float
    hours_vs_contract: float
    nights: int
    weekends: int
    holidays: int


class GiniView(BaseModel):
    organization_id: str
    start: str | None
    end: str | None
    members: int
    nights_gini: float
    weekends_gini: float
    night_weekend_gini: float
    hours_gini: float


def tally(members: Sequence[JSON], rosters: Sequence[JSON], shift_types: dict[str, JSON],
          start: date | None, end: date | None) -> tuple[list[JSON], date | None, date | None]:
    """Per member (every workforce member, and anyone assigned), their load over the
    period; and the period's first and last day."""
    rows: dict[str, JSON] = {m["user_id"]: _row(m) for m in members}
    first = start or min((date.fromisoformat(r["start"]) for r in rosters), default=None)
    last = end or max((date.fromisoformat(r["end"]) for r in rosters), default=None)
    for roster in rosters:
        holidays = set(roster.get("holidays") or [])
        for a in roster.get("assignments") or []:
            day = date.fromisoformat(a["date"])
            if (first and day < first) or (last and day > last):
                continue
            row = rows.setdefault(a["user_id"], _row({"user_id": a["user_id"]}))
            shift_type = shift_types.get(a["shift_type_id"]) or {}
            row["shifts"] += 1
            row["hours"] += (shift_type.get("minutes") or 0) / 60
            row["nights"] += bool(shift_type.get("night"))
            row["weekends"] += day.weekday() >= 5
            row["holidays"] += a["date"] in holidays
    days = (last - first).days + 1 if first and last else 0
    for row in rows.values():
        row["contracted_hours"] = round(row.pop("weekly") * days / 7, 2)
        row["hours"] = round(row["hours"], 2)
        row["hours_vs_contract"] = round(row["hours"] - row["contracted_hours"], 2)
    return sorted(rows.values(), key=lambda r: r["user_id"]), first, last


def _row(member: JSON) -> JSON:
    return {"user_id": member["user_id"], "name": member.get("name"), "shifts": 0,
            "hours": 0.0, "weekly": member.get("contracted_hours") or 0, "nights": 0,
            "weekends": 0, "holidays": 0}


class Period(BaseModel):
    organization_id: str | None = None
    roster_id: str | None = None
    start: date | None = None
    end: date | None = None


def period(organization_id: str | None = Query(None, max_length=64),
           roster_id: str | None = Query(None, max_length=64,
                                         description="One roster, whatever its status"),
           start: date | None = Query(None, alias="from", description="First day counted"),
           end: date | None = Query(None, alias="to", description="Last day counted")
           ) -> Period:
    if start and end and end < start:
        raise ApiError(422, "VALIDATION_ERROR", "to: before from", field="to")
    return Period(organization_id=organization_id, roster_id=roster_id, start=start, end=end)


async def loads(ctx: ApiContext, wanted: Period) -> tuple[str, list[JSON], date | None,
                                                          date | None]:
    org_id = await organization(ctx, wanted.organization_id)
    if wanted.roster_id:
        chosen = [await roster_area.visible_roster(ctx, wanted.roster_id, org_id)]
    else:
        chosen = await roster_area.rosters_of(ctx, org_id, "published")
    members = [{"user_id": m["user_id"], "name": m.get("name"),
                "contracted_hours": m.get("contracted_hours")}
               for m in await workforce_members(ctx, org_id)]
    rows, first, last = tally(members, chosen, await shift_type_map(ctx, org_id),
                              wanted.start, wanted.end)
    return org_id, rows, first, last


def mount(router: Any) -> None:
    @router.get("/api/workforce/fairness", response_model=PageEnvelope[MemberFairness],
                summary="Fairness per member over a period: shifts, hours against contract, "
                        "nights, weekends, holidays (ORG:ADMIN: everyone; others: their own)")
    async def fairness(wanted: Period = Depends(period), page: Pagination = Depends(pagination),
                       ctx: ApiContext = Depends(api_context)) -> Any:
        org_id, rows, _first, _last = await loads(ctx, wanted)
        if not ctx.may("workforce.manage", org_id):
            rows = [r for r in rows if r["user_id"] == ctx.principal.user_id]
        return page.respond(rows[page.offset:page.offset + page.limit], len(rows))

    @router.get("/api/workforce/fairness/gini", response_model=Envelope[GiniView],
                summary="Gini coefficient of the night and weekend load across members")
    async def fairness_gini(wanted: Period = Depends(period),
                            ctx: ApiContext = Depends(api_context)) -> Any:
        org_id, rows, first, last = await loads(ctx, wanted)
        return ok(GiniView(
            organization_id=org_id, start=first.isoformat() if first else None,
            end=last.isoformat() if last else None, members=len(rows),
            nights_gini=round(gini([r["nights"] for r in rows]), 4),
            weekends_gini=round(gini([r["weekends"] for r in rows]), 4),
            night_weekend_gini=round(gini([r["nights"] + r["weekends"] for r in rows]), 4),
            hours_gini=round(gini([r["hours"] for r in rows]), 4)).model_dump())
