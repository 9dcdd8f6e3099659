"""What the public-health reports share: who may see a facility's aggregate figures, the
reporting periods (DHIS2 weekly periods, ISO weeks), the facilities' organisation units,
the notifiable cases of a period, and DHIS2 pushes with their record.

Aggregates of a facility are for ``ORG:ADMIN``, ``ORG:DOCTOR`` and ``ORG:NURSE`` there
(they may read the diagnoses, encounters and vital signs they are counted from) and
platform administrators (the policy's :data:`AGGREGATES` rule); exports and pushes to the
HMIS for its ``ORG:ADMIN`` and platform administrators (:data:`HMIS`). Every count is a
FHIR search made as the caller.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date, timedelta
from typing import Any

from pydantic import BaseModel, Field

from fhir_server.clock import now_instant
from fhir_server.ownership import OWNER_SYSTEM
from fhir_server.service import MAX_SEARCH_RESULTS
from platform_api.envelope import ApiError, ErrorEnvelope
from platform_api.facade import ApiContext, require_organization
from platform_api.public_health.cases import CASE_CRITERIA, disease_named
from platform_api.public_health.dhis2 import Dhis2Client, HmisError, ImportSummary
from platform_api.public_health.knowledge import Disease, HmisMapping, hmis_mapping
from platform_api.public_health.views import rows

JSON = dict[str, Any]
# The policy's rules (platform_api.policy.actions.commerce) of who sees what.
AGGREGATES = "public-health.aggregates"
HMIS = "public-health.hmis"
PUSHES = "hmis_pushes"
PERIOD_PATTERN = r"^\d{4}W\d{1,2}$"


# -- who ----------------------------------------------------------------------------------
async def facility_for(ctx: ApiContext, org_id: str | None, action: str) -> str | None:
    """The facility a report is about: ``org_id`` (the policy's rule ``action`` must admit
    the caller there: 404 unknown, 403 otherwise), else the caller's one organization
    where it does; None for a platform administrator naming none (every facility)."""
    if org_id:
        await require_organization(ctx, org_id, action)
        return org_id
    where = ctx.organizations_for(action)
    if where is None:
        return None
    if len(where) == 1:
        return next(iter(where))
    if not where:
        ctx.authorize(action)  # refused, with the rule's refusal, recorded
    raise ApiError(422, "ORGANIZATION_REQUIRED", "Say which organization (org_id)",
                   field="org_id")


async def hmis_facility(ctx: ApiContext, org_id: str | None) -> str:
    """The facility an HMIS export or push is for (exactly one)."""
    found = await facility_for(ctx, org_id, HMIS)
    if found is None:
        raise ApiError(422, "ORGANIZATION_REQUIRED", "Say which organization (org_id)",
                       field="org_id")
    return found


def refusals(**said: str) -> dict[int | str, dict[str, Any]]:
    """Refusals a route answers beyond those every route documents, for the OpenAPI
    document: ``refusals(r404="...", r409="...")``."""
    return {int(k[1:]): {"model": ErrorEnvelope, "description": v} for k, v in said.items()}


NOT_FOUND_ORG = "NOT_FOUND: the organization named does not exist"
HMIS_REFUSALS = refusals(
    r404=NOT_FOUND_ORG,
    r409="ORG_UNIT_NOT_MAPPED: the organization has no HMIS organisation unit",
    r502="HMIS_UNREACHABLE, HMIS_AUTH_FAILED, HMIS_REJECTED: the HMIS could not be reached, "
         "refused the credentials or answered no import summary; HMIS_IMPORT_FAILED: it "
         "imported nothing (its conflicts in details)",
    r503="HMIS_NOT_CONFIGURED: no HMIS server is configured")


# -- when -----------------------------------------------------------------------------------
def last_complete_week(today: date | None = None) -> str:
    day = (today or date.today()) - timedelta(days=7)
    year, week, _ = day.isocalendar()
    return f"{year}W{week}"


MAX_DAYS = 366


def date_range(date_from: date | None, date_to: date | None, default_days: int
               ) -> tuple[date, date]:
    """A report's days: up to ``date_to`` (default today), from ``date_from`` (default
    ``default_days`` before); 422 naming ``date_from`` when reversed or longer than
    :data:`MAX_DAYS`."""
    end = date_to or date.today()
    start = date_from or end - timedelta(days=default_days - 1)
    if start > end:
        raise ApiError(422, "VALIDATION_ERROR", "date_from is after date_to",
                       field="date_from")
    if (end - start).days >= MAX_DAYS:
        raise ApiError(422, "VALIDATION_ERROR", f"At most {MAX_DAYS} days at once",
                       field="date_from")
    return start, end


def week_days(period: str, field: str = "period") -> tuple[date, date]:
    """Monday and Sunday of a DHIS2 weekly period (``2026W47``); 422 naming ``field`` for
    a week that does not exist or has not begun."""
    year, _, week = period.partition("W")
    try:
        monday = date.fromisocalendar(int(year), int(week), 1)
    except ValueError:
        raise ApiError(422, "VALIDATION_ERROR", f"{period!r} is not an ISO week",
                       field=field) from None
    if monday > date.today():
        raise ApiError(422, "VALIDATION_ERROR", f"The week {period} has not begun",
                       field=field)
    return monday, monday + timedelta(days=6)


def age_in_years(born: str | None, on: date) -> int | None:
    if not born or len(born) < 4:
        return None
    try:
        birth = date.fromisoformat(born if len(born) == 10 else f"{born[:4]}-07-01")
    except ValueError:
        return None
    return on.year - birth.year - ((on.month, on.day) < (birth.month, birth.day))


# -- what -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Case:
    """A notifiable case as the reports count it."""

    id: str
    disease: Disease
    onset: date
    facility: str | None
    died: bool
    age_years: int | None


async def search_days(ctx: ApiContext, resource_type: str, date_param: str, start: date,
                      end: date, criteria: list[tuple[str, str]]) -> list[JSON]:
    """Every ``resource_type`` the caller may see whose ``date_param`` falls from ``start``
    to ``end``, with what ``criteria``'s ``_include``/``_revinclude`` bring, each once.
    A search answers at most ``MAX_SEARCH_RESULTS`` resources: a range that fills it is
    searched again in halves, and a single day that still does is a 422 asking to narrow
    the question (never a silently short count)."""
    found = await ctx.fhir.search(resource_type, [
        (date_param, f"ge{start.isoformat()}"),
        (date_param, f"lt{(end + timedelta(days=1)).isoformat()}"), *criteria],
        included=True)
    if len(found) < MAX_SEARCH_RESULTS:
        return found
    if start == end:
        raise ApiError(422, "TOO_MANY_RECORDS", f"More than {MAX_SEARCH_RESULTS} records "
                       f"on {start.isoformat()}: name one facility (org_id)", field="org_id")
    middle = start + (end - start) // 2
    halves = [*await search_days(ctx, resource_type, date_param, start, middle, criteria),
              *await search_days(ctx, resource_type, date_param,
                                 middle + timedelta(days=1), end, criteria)]
    return list({(r["resourceType"], r["id"]): r for r in halves}.values())


async def cases_between(ctx: ApiContext, start: date, end: date,
                        criteria: list[tuple[str, str]] | None = None) -> list[Case]:
    """The counted (not discarded) notifiable cases the caller may see with onset from
    ``start`` to ``end``, with the patient's age at onset: the rows of the shipped
    ``notifiable_cases`` view (:mod:`.views`) over what one search as the caller finds."""
    found = await search_days(ctx, "Condition", "onset-date", start, end, [
        *CASE_CRITERIA, ("_include", "Condition:subject"), *(criteria or [])])
    born = {row["id"]: row["birth_date"] for row in rows("patient_birth_dates", found)}
    cases = []
    for row in rows("notifiable_cases", found):
        if row["classification"] == "discarded":
            continue
        disease = disease_named(row["disease"], row["icd10"])
        onset = _day(row["onset"])
        if disease is None or onset is None:
            continue
        cases.append(Case(row["id"], disease, onset, min(row["owners"], default=None),
                          row["outcome"] == "died",
                          age_in_years(born.get(row["patient"] or ""), onset)))
    return cases


def _day(instant: str | None) -> date | None:
    try:
        return date.fromisoformat(instant[:10]) if instant and len(instant) >= 10 else None
    except ValueError:
        return None


def owned_by(org_id: str | None) -> list[tuple[str, str]]:
    """Criteria of what ``org_id`` owns (none: everything the caller may see)."""
    return [("_security", f"{OWNER_SYSTEM}|{org_id}")] if org_id else []


# -- where (in the HMIS) -----------------------------------------------------------------------
def mapping(ctx: ApiContext) -> HmisMapping:
    return hmis_mapping(ctx.services.settings.hmis_mapping_file)


async def org_unit_of(ctx: ApiContext, org_id: str) -> str:
    """The facility's DHIS2 organisation unit: its Organization's identifier in the
    mapping's ``org_unit_system`` (409 ``ORG_UNIT_NOT_MAPPED`` without one)."""
    organization = await ctx.fhir.find_json("Organization", org_id)  # the directory
    system = mapping(ctx).org_unit_system
    for identifier in (organization or {}).get("identifier") or []:
        if identifier.get("system") == system and identifier.get("value"):
            return str(identifier["value"])
    raise ApiError(409, "ORG_UNIT_NOT_MAPPED", f"The organization has no HMIS organisation "
                   f"unit: give it an identifier with the system {system}")


# -- the dataValueSets format ------------------------------------------------------------------
class DataValue(BaseModel):
    """One value in DHIS2's own field names."""

    dataElement: str
    period: str
    orgUnit: str
    categoryOptionCombo: str
    value: str


class DataValueSet(BaseModel):
    dataSet: str
    period: str
    orgUnit: str
    dataValues: list[DataValue]


class PushRequest(BaseModel):
    period: str | None = Field(default=None, pattern=PERIOD_PATTERN, examples=["2026W47"],
                               description="A DHIS2 weekly period (ISO week); default the "
                                           "last complete week")
    org_id: str | None = Field(default=None, min_length=1, max_length=64,
                               description="The facility (default: your organization)")


class ImportCount(BaseModel):
    imported: int
    updated: int
    ignored: int
    deleted: int


class PushView(BaseModel):
    kind: str
    org_id: str
    org_unit: str
    period: str
    data_set: str
    data_values: int
    status: str
    description: str
    import_count: ImportCount
    conflicts: list[dict[str, Any]]
    pushed_at: str
    pushed_by: str
    pushes: int = Field(description="How many times this period was pushed")


async def push(ctx: ApiContext, kind: str, org_id: str, values: DataValueSet,
               topic: str) -> JSON:
    """Send ``values`` to the HMIS, record the import summary (the document
    ``hmis_pushes/<kind>:<org>:<period>``) and emit ``topic`` in one unit of work; 502
    with the HMIS's code when it could not be done, 502 ``HMIS_IMPORT_FAILED`` when DHIS2
    imported nothing (its conflicts in ``details``)."""
    try:
        summary = await Dhis2Client.from_settings(ctx.services.settings).import_data_values(
            values.model_dump())
    except HmisError as error:
        status = 503 if error.code == "HMIS_NOT_CONFIGURED" else 502
        raise ApiError(status, error.code, error.message) from None
    key = f"{kind}:{org_id}:{values.period}"
    before = await ctx.services.store.get_document(PUSHES, key)
    record = _record(ctx, kind, org_id, values, summary, (before or {}).get("pushes", 0) + 1)
    unit = ctx.unit()
    async with unit:
        unit.put_document(PUSHES, key, {"id": key, **record})
        unit.emit(topic, {k: record[k] for k in ("kind", "org_id", "period", "status",
                                                 "import_count", "data_values")},
                  source_service="public_health")
        await unit.commit()
    if summary.status == "ERROR":
        raise ApiError(502, "HMIS_IMPORT_FAILED", f"The HMIS imported nothing: "
                       f"{summary.description or 'see details'}", details=summary.conflicts)
    return record


def _record(ctx: ApiContext, kind: str, org_id: str, values: DataValueSet,
            summary: ImportSummary, pushes: int) -> JSON:
    return PushView(
        kind=kind, org_id=org_id, org_unit=values.orgUnit, period=values.period,
        data_set=values.dataSet, data_values=len(values.dataValues), status=summary.status,
        description=summary.description,
        import_count=ImportCount(**summary.import_count), conflicts=summary.conflicts,
        pushed_at=now_instant(), pushed_by=ctx.principal.user_id, pushes=pushes,
    ).model_dump()
