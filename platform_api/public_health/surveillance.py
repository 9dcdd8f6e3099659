"""Syndromic surveillance: ``GET /api/surveillance/syndromes``, ``GET
/api/surveillance/alerts`` and ``POST /api/surveillance/export/hmis``.

- **syndromes**: per facility and syndrome (:mod:`.syndromes`), the encounters of each day
  of the range (default the last 28 days), with the syndrome's definition; a paginated
  list (one item per facility and syndrome, every syndrome of a facility that had
  encounters);
- **alerts**: the CDC EARS C1, C2 and C3 statistics (:mod:`.ears`) of each day of the
  range (default the last 7 days) per facility and syndrome, on daily counts that reach
  back as far as C3 needs; only signals unless ``signals_only=false``; newest first;
- **export/hmis**: a week's encounters per syndrome as a DHIS2 ``dataValueSets``
  document (the mapping's ``syndromes`` data set and elements, the default category
  option combo), pushed to the HMIS like the case counts (:mod:`.reporting`; idempotent
  per period, event ``platform.surveillance.hmis_exported``) or, with ``dry_run``, only
  answered.

Who: the figures of a facility are for its ``ORG:ADMIN``, doctors and nurses, and for
platform administrators (who see every facility when they name none); the export for its
``ORG:ADMIN`` and platform administrators. The counts are a FHIR search as the caller.
"""

from __future__ import annotations

from datetime import date, timedelta
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Query
from pydantic import BaseModel, Field

from platform_api.envelope import ApiError, Envelope, PageEnvelope, Pagination, ok, pagination
from platform_api.facade import ApiContext, api_context
from platform_api.public_health import ears
from platform_api.public_health.knowledge import ears_parameters, syndromes
from platform_api.public_health.reporting import (
    AGGREGATES,
    HMIS_REFUSALS,
    NOT_FOUND_ORG,
    PERIOD_PATTERN,
    DataValue,
    DataValueSet,
    PushView,
    date_range,
    facility_for,
    hmis_facility,
    last_complete_week,
    mapping,
    org_unit_of,
    push,
    refusals,
    week_days,
)
from platform_api.public_health.syndromes import DailyCounts, daily_counts

router = APIRouter(tags=["surveillance"])
TOPIC = "platform.surveillance.hmis_exported"


class DayCount(BaseModel):
    date: str
    count: int


class SyndromeCounts(BaseModel):
    syndrome: str
    name: str
    definition: str
    org_id: str
    total: int
    daily: list[DayCount]


class AlertView(BaseModel):
    syndrome: str
    name: str
    org_id: str
    date: str
    count: int
    method: Literal["C1", "C2", "C3"]
    statistic: float
    threshold: float
    baseline_mean: float
    baseline_sd: float
    signal: bool


class SurveillanceExport(BaseModel):
    period: str | None = Field(default=None, pattern=PERIOD_PATTERN, examples=["2026W47"],
                               description="A DHIS2 weekly period; default the last "
                                           "complete week")
    org_id: str | None = Field(default=None, min_length=1, max_length=64)
    dry_run: bool = Field(default=False, description="Answer the document, send nothing")


class SurveillanceExportView(BaseModel):
    data_value_set: DataValueSet
    push: PushView | None = Field(description="DHIS2's import summary (none on a dry run)")


def _syndrome_filter(syndrome: str | None) -> list[str]:
    if syndrome is None:
        return list(syndromes())
    if syndrome not in syndromes():
        raise ApiError(422, "VALIDATION_ERROR", f"Unknown syndrome {syndrome!r} (known: "
                       f"{', '.join(syndromes())})", field="syndrome")
    return [syndrome]


async def _counts(ctx: ApiContext, org_id: str | None, start: date, end: date
                  ) -> tuple[DailyCounts, list[str]]:
    facility = await facility_for(ctx, org_id, AGGREGATES)
    counts = await daily_counts(ctx, start, end, facility)
    facilities = [facility] if facility else sorted(counts.facilities)
    return counts, facilities


Range = Annotated[date | None, Query()]
OrgId = Annotated[str | None, Query(max_length=64, description="The facility (default: "
                                    "your organization)")]
SyndromeCode = Annotated[str | None, Query(max_length=64)]


@router.get("/api/surveillance/syndromes", response_model=PageEnvelope[SyndromeCounts],
            responses=refusals(r404=NOT_FOUND_ORG),
            summary="Encounters per syndrome, facility and day (from encounter reasons, "
                    "diagnoses and vital signs)")
async def syndrome_counts(
    ctx: ApiContext = Depends(api_context), page: Pagination = Depends(pagination),
    date_from: Range = None, date_to: Range = None, org_id: OrgId = None,
    syndrome: SyndromeCode = None,
) -> Any:
    start, end = date_range(date_from, date_to, 28)
    wanted = _syndrome_filter(syndrome)
    counts, facilities = await _counts(ctx, org_id, start, end)
    known = syndromes()
    rows = []
    for facility in facilities:
        for code in wanted:
            series = counts.series(facility, code)
            rows.append(SyndromeCounts(
                syndrome=code, name=known[code].name, definition=known[code].definition,
                org_id=facility, total=sum(series),
                daily=[DayCount(date=(start + timedelta(days=i)).isoformat(), count=n)
                       for i, n in enumerate(series)]).model_dump())
    return page.respond(rows[page.offset:page.offset + page.limit], len(rows))


@router.get("/api/surveillance/alerts", response_model=PageEnvelope[AlertView],
            responses=refusals(r404=NOT_FOUND_ORG),
            summary="EARS C1, C2 and C3 alerts on daily syndrome counts per facility")
async def alerts(
    ctx: ApiContext = Depends(api_context), page: Pagination = Depends(pagination),
    date_from: Range = None, date_to: Range = None, org_id: OrgId = None,
    syndrome: SyndromeCode = None,
    method: Annotated[Literal["C1", "C2", "C3"] | None, Query()] = None,
    signals_only: Annotated[bool, Query(description="Only the days that signal")] = True,
) -> Any:
    start, end = date_range(date_from, date_to, 7)
    wanted = _syndrome_filter(syndrome)
    parameters = ears_parameters()
    history = ears.history_needed(parameters)
    counts, facilities = await _counts(ctx, org_id, start - timedelta(days=history), end)
    known = syndromes()
    rows = []
    for facility in facilities:
        for code in wanted:
            series = counts.series(facility, code)
            for t in range(history, len(series)):
                for found in ears.evaluate(series, t, parameters):
                    if (method and found.method != method) or (signals_only
                                                               and not found.signal):
                        continue
                    day = counts.start + timedelta(days=t)
                    rows.append(AlertView(
                        syndrome=code, name=known[code].name, org_id=facility,
                        date=day.isoformat(), count=found.count,
                        method=found.method,  # type: ignore[arg-type]
                        statistic=found.statistic, threshold=found.threshold,
                        baseline_mean=found.baseline_mean, baseline_sd=found.baseline_sd,
                        signal=found.signal).model_dump())
    rows.sort(key=lambda r: (r["date"], r["signal"]), reverse=True)
    return page.respond(rows[page.offset:page.offset + page.limit], len(rows))


@router.post("/api/surveillance/export/hmis", response_model=Envelope[SurveillanceExportView],
             responses=HMIS_REFUSALS,
             summary="A week's encounters per syndrome to the HMIS (DHIS2 dataValueSets); "
                     "idempotent per period; dry_run answers the document only")
async def export_to_hmis(body: SurveillanceExport, ctx: ApiContext = Depends(api_context)
                         ) -> Any:
    facility = await hmis_facility(ctx, body.org_id)
    period = body.period or last_complete_week()
    monday, sunday = week_days(period)
    org_unit = await org_unit_of(ctx, facility)
    counts = await daily_counts(ctx, monday, sunday, facility)
    m = mapping(ctx)
    values = DataValueSet(dataSet=m.syndromes_data_set, period=period, orgUnit=org_unit,
                          dataValues=[DataValue(
                              dataElement=element, period=period, orgUnit=org_unit,
                              categoryOptionCombo=m.default_category_option_combo,
                              value=str(sum(counts.series(facility, code))))
                              for code, element in m.syndrome_elements.items()])
    pushed = None if body.dry_run else PushView(
        **await push(ctx, "syndromes", facility, values, TOPIC))
    return ok(SurveillanceExportView(data_value_set=values, push=pushed).model_dump())
