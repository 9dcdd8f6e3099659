"""The public-health dashboard, ``GET /api/public-health/dashboard`` (platform
administrators): the notifiable cases of a date range (onset), counted by disease,
epidemiological week (ISO week, DHIS2's weekly period), facility (the organization that
reported the case) and district (that organization's ``address.district``), cases and
deaths; discarded cases are not counted.

``format=json`` (default) answers the counts in the envelope; ``format=svg`` or ``png``
one chart of them (``chart=week | disease | facility | district``), drawn with
matplotlib off the event loop. Filters: ``disease``, ``org_id``, ``district``.
"""

from __future__ import annotations

import io
from collections import Counter
from collections.abc import Iterable
from datetime import date, timedelta
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Query
from pydantic import BaseModel
from starlette.concurrency import run_in_threadpool
from starlette.responses import Response

from platform_api.envelope import ApiError, Envelope, ok
from platform_api.facade import ApiContext, api_context
from platform_api.public_health.cases import epi_week
from platform_api.public_health.knowledge import diseases
from platform_api.public_health.reporting import Case, cases_between, date_range, owned_by

router = APIRouter(tags=["public-health"])
DEFAULT_DAYS = 12 * 7
Chart = Literal["week", "disease", "facility", "district"]
MEDIA = {"svg": "image/svg+xml", "png": "image/png"}
NO_DISTRICT = "(no district)"


class CountRow(BaseModel):
    key: str
    label: str
    cases: int
    deaths: int


class DashboardView(BaseModel):
    date_from: str
    date_to: str
    total: int
    deaths: int
    by_disease: list[CountRow]
    by_week: list[CountRow]
    by_facility: list[CountRow]
    by_district: list[CountRow]


def _rows(cases: Iterable[Case], key_of: Any, labels: dict[str, str],
          keys: Iterable[str] = ()) -> list[CountRow]:
    counted: Counter[str] = Counter({k: 0 for k in keys})
    died: Counter[str] = Counter()
    for case in cases:
        key = key_of(case)
        counted[key] += 1
        died[key] += case.died
    order = list(counted) if keys else sorted(counted, key=lambda k: (-counted[k], k))
    return [CountRow(key=k, label=labels.get(k, k), cases=counted[k], deaths=died[k])
            for k in order]


def _weeks(start: date, end: date) -> list[str]:
    weeks, day = [], start - timedelta(days=start.weekday())
    while day <= end:
        weeks.append(epi_week(day))
        day += timedelta(days=7)
    return weeks


async def _facilities(ctx: ApiContext, ids: set[str]) -> dict[str, tuple[str, str]]:
    """Organization id → (name, district)."""
    if not ids:
        return {}
    found = await ctx.fhir.search("Organization", [("_id", ",".join(sorted(ids)))])
    return {o["id"]: (o.get("name") or o["id"],
                      next((a.get("district") for a in o.get("address") or []
                            if a.get("district")), None) or NO_DISTRICT) for o in found}


def dashboard_counts(cases: list[Case], facilities: dict[str, tuple[str, str]],
                     start: date, end: date) -> DashboardView:
    known = diseases()
    district = {k: v[1] for k, v in facilities.items()}
    return DashboardView(
        date_from=start.isoformat(), date_to=end.isoformat(), total=len(cases),
        deaths=sum(c.died for c in cases),
        by_disease=_rows(cases, lambda c: c.disease.key,
                         {k: d.name for k, d in known.items()}),
        by_week=_rows(cases, lambda c: epi_week(c.onset), {}, _weeks(start, end)),
        by_facility=_rows(cases, lambda c: c.facility or "",
                          {k: v[0] for k, v in facilities.items()}),
        by_district=_rows(cases, lambda c: district.get(c.facility or "", NO_DISTRICT), {}))


def render_chart(rows: list[CountRow], title: str, image: str) -> bytes:
    """A bar chart of cases and deaths per row, as SVG or PNG."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    figure = Figure(figsize=(max(6.0, 0.45 * len(rows) + 2), 4.2), dpi=100)
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    positions = range(len(rows))
    axes.bar([p - 0.2 for p in positions], [r.cases for r in rows], 0.4, label="cases",
             color="#2b6cb0")
    axes.bar([p + 0.2 for p in positions], [r.deaths for r in rows], 0.4, label="deaths",
             color="#c53030")
    axes.set_xticks(list(positions), [r.label for r in rows], rotation=45, ha="right",
                    fontsize=8)
    axes.set_title(title)
    axes.set_ylabel("count")
    axes.yaxis.set_major_locator(MaxNLocator(integer=True))  # counts: whole numbers
    axes.legend()
    figure.tight_layout()
    buffer = io.BytesIO()
    figure.savefig(buffer, format=image, metadata={"Date": None} if image == "svg" else None)
    return buffer.getvalue()


@router.get("/api/public-health/dashboard", response_model=Envelope[DashboardView],
            summary="Notifiable cases by disease, epidemiological week, facility and "
                    "district (JSON, or one chart as SVG or PNG)",
            responses={200: {"content": {"image/svg+xml": {}, "image/png": {}},
                             "description": "The counts (JSON) or the chart asked for"}})
async def dashboard(
    ctx: ApiContext = Depends(api_context),
    date_from: Annotated[date | None, Query(description="Onset from (default: 12 weeks "
                                                        "before date_to)")] = None,
    date_to: Annotated[date | None, Query(description="Onset up to (default today)")] = None,
    disease: Annotated[str | None, Query(max_length=64)] = None,
    org_id: Annotated[str | None, Query(max_length=64)] = None,
    district: Annotated[str | None, Query(max_length=100)] = None,
    format: Annotated[Literal["json", "svg", "png"], Query()] = "json",
    chart: Annotated[Chart, Query()] = "week",
) -> Any:
    start, end = date_range(date_from, date_to, DEFAULT_DAYS)
    if disease is not None and disease not in diseases():
        raise ApiError(422, "VALIDATION_ERROR", f"Unknown disease {disease!r}",
                       field="disease")
    criteria = owned_by(org_id)
    if disease:
        from platform_api.public_health.cases import DISEASE_SYSTEM

        criteria.append(("code", f"{DISEASE_SYSTEM}|{disease}"))
    cases = await cases_between(ctx, start, end, criteria)
    facilities = await _facilities(ctx, {c.facility for c in cases if c.facility})
    if district is not None:
        cases = [c for c in cases
                 if facilities.get(c.facility or "", ("", NO_DISTRICT))[1] == district]
    view = dashboard_counts(cases, facilities, start, end)
    if format == "json":
        return ok(view.model_dump())
    rows = {"week": view.by_week, "disease": view.by_disease, "facility": view.by_facility,
            "district": view.by_district}[chart]
    title = f"Notifiable cases by {chart}, {start.isoformat()} to {end.isoformat()}"
    body = await run_in_threadpool(render_chart, rows, title, format)
    return Response(body, media_type=MEDIA[format],
                    headers={"Cache-Control": "no-store"})
