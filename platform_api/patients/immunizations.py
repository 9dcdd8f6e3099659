"""Patients area, immunizations: doses given ⇄ FHIR Immunization; the patient's schedule ⇄
ImmunizationRecommendation, made from a schedule table kept as data; adverse events
following immunization (AEFI) ⇄ AdverseEvent.

**The schedule table** (``immunization_schedule.json``): series of doses seeded with the WHO
routine childhood schedule (BCG, hepatitis B birth dose, bOPV and IPV, DTP-HepB-Hib,
PCV, rotavirus, measles-rubella, yellow fever where it is endemic, HPV for girls), each
with its CVX vaccine code, the CVX codes that count for it, its target diseases (SNOMED
CT) and its doses (age due, latest age, ISO 8601 durations); ``countries`` adjust it to a
national schedule (a series' fields replaced, a series removed with ``null`` or added).

``POST /api/patients/:id/immunizations/generate`` (``{country}``; default: the patient's
address, else their organization's country, else the WHO schedule) writes the patient's
ImmunizationRecommendation (one per patient: identifier
``urn:healthplatform:immunization-schedule|<patient id>``):

    authority.display                     → the schedule used (WHO, or WHO + country)
    recommendation[].vaccineCode          → the series' CVX vaccine
    recommendation[].targetDisease        → SNOMED CT (one disease), else its text
    recommendation[].series, doseNumber-  → series key, dose number, doses in the series
      PositiveInt, seriesDosesPositiveInt
    recommendation[].dateCriterion        → LOINC 30980-7 date vaccine due, 59778-1 date
                                            overdue (due + 28 days), 59777-3 latest date
    recommendation[].forecastStatus       → immunization-recommendation-status due,
                                            overdue or complete, as of generation
    recommendation[].supportingImmunization → the Immunization that gave the dose

``POST .../immunizations/administer`` records an Immunization:

    vaccine_code (CVX), vaccine_name → vaccineCode
    occurrence (default now)         → occurrenceDateTime; recorded, primarySource true
    lot_number, expiration_date      → lotNumber, expirationDate
    site, route                      → site (v3-ActSite), route (v3-RouteOfAdministration)
    dose_ml                          → doseQuantity (mL)
    series, dose_number              → protocolApplied[0] (series, doseNumberPositiveInt,
                                       seriesDosesPositiveInt, targetDisease), the series
                                       found from the vaccine code when not given, the
                                       next dose not given by default
    performer                        → performer[0] (function AP, the user); notes → note

and marks the matching recommendation complete in the same unit of work.

``GET .../immunizations`` is the schedule as of today, dose by dose (given, due, overdue,
upcoming, expired: past the latest age, not given), with the doses given outside it;
``GET .../immunizations/missed`` the doses due and not given (overdue or expired). The
status is worked out on each request from the dates and the Immunizations found (FHIR
clients and HL7v2 VXU feeds write those too: matched by ``protocolApplied`` when present,
else by vaccine code, in date order).

``POST .../immunizations/aefi`` (an adverse event following immunization) records an
AdverseEvent (actuality actual; ``event`` the reaction, SNOMED CT when coded;
``subject``; ``date`` the onset; ``seriousness``, ``severity``, ``outcome`` in the
adverse-event code systems; ``suspectEntity.instance`` the Immunization; ``recorder``)
and appends a ``reaction`` to the Immunization; event
``platform.immunization.aefi_reported``.
"""

from __future__ import annotations

import calendar
import re
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from functools import cache
from importlib import resources
from typing import Any, Literal

import orjson
from fastapi import APIRouter, Depends
from pydantic import BaseModel, Field

from fhir_server.clock import now_instant
from fhir_server.ids import new_id
from platform_api.envelope import (
    ApiError,
    Envelope,
    PageEnvelope,
    Pagination,
    created,
    not_found,
    pagination,
)
from platform_api.facade import ApiContext, api_context, require_patient, staged_body
from platform_api.patients.shared import (
    JSON,
    LOINC,
    SNOMED,
    code_in,
    coding,
    concept,
    concept_text,
    fhir_datetime,
    first_note,
    local_id,
    patient_reference,
    source_service,
    user_of,
    user_reference,
)

CVX = "http://hl7.org/fhir/sid/cvx"
FORECAST = "http://terminology.hl7.org/CodeSystem/immunization-recommendation-status"
SCHEDULE_SYSTEM = "urn:healthplatform:immunization-schedule"
ACT_SITE = "http://terminology.hl7.org/CodeSystem/v3-ActSite"
ROUTE = "http://terminology.hl7.org/CodeSystem/v3-RouteOfAdministration"
FUNCTION = "http://terminology.hl7.org/CodeSystem/v2-0443"
DUE, OVERDUE, LATEST = (("30980-7", "Date vaccine due"),
                        ("59778-1", "Date when overdue for immunization"),
                        ("59777-3", "Latest date to give immunization"))
OVERDUE_AFTER = timedelta(days=28)  # WHO's minimum interval between doses: then overdue
SITES = {"LA": "left arm", "RA": "right arm", "LT": "left thigh", "RT": "right thigh",
         "LD": "left deltoid", "RD": "right deltoid", "LVL": "left vastus lateralis",
         "RVL": "right vastus lateralis", "MOUTH": "mouth"}
ROUTES = {"IM": "Injection, intramuscular", "SC": "Injection, subcutaneous",
          "ID": "Injection, intradermal", "PO": "Swallow, oral",
          "NASINHLC": "Inhalation, nasal"}
DoseStatus = Literal["given", "due", "overdue", "upcoming", "expired"]


# -- the schedule table ---------------------------------------------------------------------
@dataclass(frozen=True)
class Dose:
    age: str  # ISO 8601 duration from birth
    latest: str | None = None


@dataclass(frozen=True)
class Series:
    key: str
    name: str
    vaccine: tuple[str, str]  # CVX code, display
    accepts: frozenset[str]
    diseases: tuple[tuple[str, str], ...]
    doses: tuple[Dose, ...]
    countries: frozenset[str] | None = None  # only there (yellow fever)
    sex: str | None = None


@cache
def schedule_table() -> JSON:
    text = resources.files("platform_api.patients").joinpath(
        "immunization_schedule.json").read_bytes()
    return orjson.loads(text)  # type: ignore[no-any-return]


def schedule_for(country: str | None) -> tuple[str, list[Series]]:
    """(the authority's name, the series) of the WHO schedule with ``country``'s entries."""
    table = schedule_table()
    merged: dict[str, Any] = {key: dict(s) for key, s in table["series"].items()}
    override = table["countries"].get(country or "") if country else None
    for key, change in ((override or {}).get("series") or {}).items():
        if change is None:
            merged.pop(key, None)
        else:
            merged[key] = {**merged.get(key, {}), **change}
    series = []
    for key, s in merged.items():
        countries = frozenset(s["countries"]) if s.get("countries") else None
        if countries is not None and (country or "") not in countries:
            continue
        series.append(Series(key, s["name"], tuple(s["vaccine"]), frozenset(s["accepts"]),
                             tuple(tuple(d) for d in s["diseases"]),
                             tuple(Dose(d["age"], d.get("latest")) for d in s["doses"]),
                             countries, s.get("sex")))
    authority = "WHO routine immunization schedule" + (
        f", {override['name']}" if override else "")
    return authority, series


@cache
def all_series() -> dict[str, Series]:
    """Every series of the table, whichever country it is used in (a dose given is
    matched to one of them)."""
    found: dict[str, Series] = {}
    for country in [None, *schedule_table()["countries"]]:
        for series in schedule_for(country)[1]:
            found.setdefault(series.key, series)
    return found


AGE = re.compile(r"^P(?:(\d+)Y)?(?:(\d+)M)?(?:(\d+)W)?(?:(\d+)D)?$")


def after(birth: date, age: str) -> date:
    """``birth`` plus an ISO 8601 duration of years, months, weeks and days."""
    found = AGE.match(age)
    if found is None:
        raise ValueError(f"not an age: {age!r}")
    years, months, weeks, days = (int(g or 0) for g in found.groups())
    month_index = birth.month - 1 + months + 12 * years
    year, month = birth.year + month_index // 12, month_index % 12 + 1
    day = min(birth.day, calendar.monthrange(year, month)[1])
    return date(year, month, day) + timedelta(weeks=weeks, days=days)


# -- models ----------------------------------------------------------------------------------
class GenerateRequest(BaseModel):
    country: str | None = Field(default=None, pattern="^[A-Z]{2}$", examples=["KE"],
                                description="Whose national schedule (default: the "
                                            "patient's country, else WHO's)")


class AdministerRequest(BaseModel):
    vaccine_code: str = Field(pattern=r"^\d{1,3}$", examples=["198"],
                              description="CVX code of the vaccine given")
    vaccine_name: str | None = Field(default=None, max_length=200)
    series: str | None = Field(default=None, max_length=40, examples=["penta"])
    dose_number: int | None = Field(default=None, ge=1, le=10)
    occurrence: datetime | None = None
    lot_number: str | None = Field(default=None, max_length=40, examples=["EJ1685"])
    expiration_date: date | None = None
    site: Literal["LA", "RA", "LT", "RT", "LD", "RD", "LVL", "RVL", "MOUTH"] | None = None
    route: Literal["IM", "SC", "ID", "PO", "NASINHLC"] | None = None
    dose_ml: float | None = Field(default=None, gt=0, le=5, examples=[0.5])
    notes: str | None = Field(default=None, max_length=1000)


class AefiRequest(BaseModel):
    immunization_id: str = Field(min_length=1, max_length=64)
    reaction: str = Field(min_length=1, max_length=200, examples=["Fever"])
    reaction_code: str | None = Field(default=None, pattern=r"^\d{6,18}$",
                                      examples=["386661006"], description="SNOMED CT")
    onset: datetime
    severity: Literal["mild", "moderate", "severe"]
    serious: bool = False
    outcome: Literal["resolved", "recovering", "ongoing", "resolvedWithSequelae", "fatal",
                     "unknown"] = "ongoing"


class ScheduleItemView(BaseModel):
    series: str | None = None
    series_name: str | None = None
    vaccine_code: str | None = None
    vaccine: str | None = None
    dose_number: int | None = None
    doses_in_series: int | None = None
    due_date: str | None = None
    overdue_date: str | None = None
    latest_date: str | None = None
    status: DoseStatus
    given_on: str | None = None
    immunization_id: str | None = None


class ImmunizationView(BaseModel):
    id: str
    patient_id: str | None = None
    vaccine_code: str | None = None
    vaccine: str | None = None
    series: str | None = None
    dose_number: int | None = None
    occurrence: str | None = None
    lot_number: str | None = None
    site: str | None = None
    route: str | None = None
    status: str
    performed_by: str | None = None
    notes: str | None = None
    reactions: int = 0


class ScheduleView(BaseModel):
    id: str
    patient_id: str
    authority: str | None = None
    generated_at: str | None = None
    doses: list[ScheduleItemView] = []


class AefiView(BaseModel):
    id: str
    patient_id: str | None = None
    immunization_id: str | None = None
    reaction: str | None = None
    onset: str | None = None
    severity: str | None = None
    serious: bool = False
    outcome: str | None = None
    recorded_by: str | None = None


# -- the recommendation -----------------------------------------------------------------------
def _criterion(code: tuple[str, str], value: date) -> JSON:
    return {"code": concept(LOINC, *code), "value": value.isoformat()}


def _diseases(series: Series) -> JSON:
    names = ", ".join(name for _code, name in series.diseases)
    if len(series.diseases) == 1:
        return concept(SNOMED, *series.diseases[0], names)
    return {"text": names}


def recommendation(patient: JSON, country: str | None, today: date) -> JSON:
    birth = date.fromisoformat(patient["birthDate"][:10])
    authority, table = schedule_for(country)
    entries = []
    for series in table:
        if series.sex is not None and patient.get("gender") != series.sex:
            continue
        for number, dose in enumerate(series.doses, start=1):
            due = after(birth, dose.age)
            criteria = [_criterion(DUE, due), _criterion(OVERDUE, due + OVERDUE_AFTER)]
            if dose.latest:
                criteria.append(_criterion(LATEST, after(birth, dose.latest)))
            status = "due" if today < due + OVERDUE_AFTER else "overdue"
            entries.append({
                "vaccineCode": [concept(CVX, *series.vaccine)],
                "targetDisease": _diseases(series),
                "forecastStatus": concept(FORECAST, status, status.capitalize()),
                "dateCriterion": criteria, "description": series.name,
                "series": series.key, "doseNumberPositiveInt": number,
                "seriesDosesPositiveInt": len(series.doses),
            })
    return {
        "resourceType": "ImmunizationRecommendation",
        "identifier": [{"system": SCHEDULE_SYSTEM, "value": patient["id"]}],
        "patient": patient_reference(patient), "date": now_instant(),
        "authority": {"display": authority}, "recommendation": entries,
    }


def _dates(entry: JSON) -> dict[str, date]:
    found = {}
    for criterion in entry.get("dateCriterion") or []:
        code = code_in(criterion.get("code"), LOINC)
        if code and criterion.get("value"):
            found[code] = date.fromisoformat(criterion["value"][:10])
    return found


def _series_of(immunization: JSON, keys: list[str], accepts: dict[str, frozenset[str]]
               ) -> str | None:
    applied = (immunization.get("protocolApplied") or [{}])[0]
    if applied.get("series") in accepts:
        return applied["series"]  # type: ignore[no-any-return]
    code = code_in(immunization.get("vaccineCode"), CVX)
    return next((k for k in keys if code in accepts[k]), None)


def forecast(recommendation_: JSON | None, immunizations: list[JSON], today: date) -> list[JSON]:
    """Schedule items (see ``ScheduleItemView``), in the order of the recommendation, then
    the doses given outside it."""
    entries = (recommendation_ or {}).get("recommendation") or []
    keys = list(dict.fromkeys(e.get("series") for e in entries if e.get("series")))
    table = all_series()
    accepts = {k: table[k].accepts if k in table else frozenset() for k in keys}
    doses = {(e.get("series"), e.get("doseNumberPositiveInt")): _dates(e) for e in entries}
    given: dict[tuple[str, int], JSON] = {}
    outside: list[JSON] = []
    done = [i for i in immunizations if i.get("status") == "completed"]
    for immunization in sorted(done, key=lambda i: i.get("occurrenceDateTime") or ""):
        key = _series_of(immunization, keys, accepts)
        number = (immunization.get("protocolApplied") or [{}])[0].get("doseNumberPositiveInt")
        if key is not None and number is None:  # the first dose still open on that day
            on = date.fromisoformat((immunization.get("occurrenceDateTime") or "9999")[:10])
            number = next((n for (k, n), d in doses.items() if k == key
                           and (k, n) not in given and d.get(LATEST[0], on) >= on), None)
        if key is None or number is None or (key, number) in given:
            outside.append(immunization)
        else:
            given[(key, number)] = immunization
    items = []
    for entry in entries:
        key, number = entry.get("series"), entry.get("doseNumberPositiveInt")
        dates = _dates(entry)
        shot = given.pop((key, number), None) if key and number else None
        items.append(_item(entry, dates, shot, today))
    for immunization in [*given.values(), *outside]:
        items.append(ScheduleItemView(
            vaccine_code=code_in(immunization.get("vaccineCode"), CVX),
            vaccine=concept_text(immunization.get("vaccineCode")), status="given",
            given_on=immunization.get("occurrenceDateTime"),
            immunization_id=immunization["id"]).model_dump())
    return items


def _item(entry: JSON, dates: dict[str, date], shot: JSON | None, today: date) -> JSON:
    due, overdue, latest = (dates.get(c[0]) for c in (DUE, OVERDUE, LATEST))
    status: DoseStatus
    if shot is not None:
        status = "given"
    elif latest is not None and today > latest:
        status = "expired"
    elif overdue is not None and today >= overdue:
        status = "overdue"
    elif due is not None and today >= due:
        status = "due"
    else:
        status = "upcoming"
    vaccine = (entry.get("vaccineCode") or [None])[0]
    return ScheduleItemView(
        series=entry.get("series"), series_name=entry.get("description"),
        vaccine_code=code_in(vaccine, CVX), vaccine=concept_text(vaccine),
        dose_number=entry.get("doseNumberPositiveInt"),
        doses_in_series=entry.get("seriesDosesPositiveInt"),
        due_date=due.isoformat() if due else None,
        overdue_date=overdue.isoformat() if overdue else None,
        latest_date=latest.isoformat() if latest else None, status=status,
        given_on=(shot or {}).get("occurrenceDateTime"),
        immunization_id=(shot or {}).get("id")).model_dump()


# -- reading what is there ------------------------------------------------------------------------
async def _schedule_of(ctx: ApiContext, patient_id: str) -> JSON | None:
    found = await ctx.fhir.search("ImmunizationRecommendation", [
        ("identifier", f"{SCHEDULE_SYSTEM}|{patient_id}")])
    return found[0] if found else None


async def _immunizations_of(ctx: ApiContext, patient_id: str) -> list[JSON]:
    return await ctx.fhir.search("Immunization", [("patient", f"Patient/{patient_id}")])


async def _country_of(ctx: ApiContext, patient: JSON) -> str | None:
    for address in patient.get("address") or []:
        if address.get("country"):
            return str(address["country"]).upper()
    org_id = local_id(patient.get("managingOrganization"), "Organization")
    if org_id is not None:
        org = await ctx.fhir.find_json("Organization", org_id)  # the directory
        for address in (org or {}).get("address") or []:
            if address.get("country"):
                return str(address["country"]).upper()
    return None


def immunization_view(immunization: JSON) -> JSON:
    applied = (immunization.get("protocolApplied") or [{}])[0]
    performer = (immunization.get("performer") or [{}])[0].get("actor")
    return ImmunizationView(
        id=immunization["id"], patient_id=local_id(immunization.get("patient"), "Patient"),
        vaccine_code=code_in(immunization.get("vaccineCode"), CVX),
        vaccine=concept_text(immunization.get("vaccineCode")), series=applied.get("series"),
        dose_number=applied.get("doseNumberPositiveInt"),
        occurrence=immunization.get("occurrenceDateTime"),
        lot_number=immunization.get("lotNumber"),
        site=code_in(immunization.get("site"), ACT_SITE),
        route=code_in(immunization.get("route"), ROUTE), status=immunization["status"],
        performed_by=user_of(performer), notes=first_note(immunization),
        reactions=len(immunization.get("reaction") or []),
    ).model_dump()


router = APIRouter(prefix="/api/patients/{patient_id}/immunizations", tags=["immunizations"])


@router.get("", response_model=PageEnvelope[ScheduleItemView],
            summary="A patient's immunization schedule as of today, dose by dose")
async def schedule(patient_id: str, page: Pagination = Depends(pagination),
                   ctx: ApiContext = Depends(api_context)) -> Any:
    await require_patient(ctx, patient_id)
    items = forecast(await _schedule_of(ctx, patient_id),
                     await _immunizations_of(ctx, patient_id), date.today())
    return page.respond(items[page.offset:page.offset + page.limit], len(items))


@router.get("/missed", response_model=PageEnvelope[ScheduleItemView],
            summary="Doses due and not given (overdue, or past the latest age)")
async def missed(patient_id: str, page: Pagination = Depends(pagination),
                 ctx: ApiContext = Depends(api_context)) -> Any:
    await require_patient(ctx, patient_id)
    items = [i for i in forecast(await _schedule_of(ctx, patient_id),
                                 await _immunizations_of(ctx, patient_id), date.today())
             if i["status"] in ("overdue", "expired")]
    return page.respond(items[page.offset:page.offset + page.limit], len(items))


@router.post("/generate", status_code=201,
             response_model=Envelope[ScheduleView],
             summary="Write the patient's age-appropriate schedule (ImmunizationRecommendation)")
async def generate(patient_id: str, body: GenerateRequest | None = None,
                   ctx: ApiContext = Depends(api_context)) -> Any:
    patient = await require_patient(ctx, patient_id)
    if not patient.get("birthDate"):
        raise ApiError(422, "VALIDATION_ERROR", "date_of_birth: the patient's date of birth is "
                       "needed to work out a schedule", field="date_of_birth")
    country = (body.country if body else None) or await _country_of(ctx, patient)
    written = recommendation(patient, country, date.today())
    current = await _schedule_of(ctx, patient_id)
    immunizations = await _immunizations_of(ctx, patient_id)
    given = {(i["series"], i["dose_number"]): i for i in forecast(
        written, immunizations, date.today()) if i["status"] == "given" and i["series"]}
    for entry in written["recommendation"]:
        shot = given.get((entry["series"], entry["doseNumberPositiveInt"]))
        if shot is not None:
            entry["forecastStatus"] = concept(FORECAST, "complete", "Complete")
            entry["supportingImmunization"] = [
                {"reference": f"Immunization/{shot['immunization_id']}"}]
    if current is not None:
        written["id"] = current["id"]
    unit = ctx.fhir.unit()
    async with unit:
        staged = await (unit.update(written) if current is not None else unit.create(written))
        await unit.commit()
    stored = staged_body(staged)
    return created(ScheduleView(
        id=stored["id"], patient_id=patient_id,
        authority=(stored.get("authority") or {}).get("display"),
        generated_at=stored.get("date"),
        doses=[ScheduleItemView(**i) for i in forecast(stored, immunizations, date.today())
               if i["series"]]).model_dump())


def immunization_to_fhir(body: AdministerRequest, patient: JSON, series: Series | None,
                         dose_number: int | None, ctx: ApiContext) -> JSON:
    known = series.vaccine if series and series.vaccine[0] == body.vaccine_code else None
    display = body.vaccine_name or (known[1] if known else None) or (
        series.name if series else None)
    immunization: JSON = {
        "resourceType": "Immunization", "status": "completed",
        "vaccineCode": {"coding": [coding(CVX, body.vaccine_code, display)],
                        **({"text": display} if display else {})},
        "patient": patient_reference(patient),
        "occurrenceDateTime": fhir_datetime(body.occurrence or now_instant()),
        "recorded": now_instant(), "primarySource": True,
        "performer": [{"function": concept(FUNCTION, "AP", "Administering Provider"),
                       "actor": user_reference(ctx.principal)}],
    }
    if body.lot_number:
        immunization["lotNumber"] = body.lot_number
    if body.expiration_date:
        immunization["expirationDate"] = body.expiration_date.isoformat()
    if body.site:
        immunization["site"] = concept(ACT_SITE, body.site, SITES[body.site])
    if body.route:
        immunization["route"] = concept(ROUTE, body.route, ROUTES[body.route])
    if body.dose_ml:
        immunization["doseQuantity"] = {"value": body.dose_ml, "unit": "mL",
                                        "system": "http://unitsofmeasure.org", "code": "mL"}
    if body.notes:
        immunization["note"] = [{"text": body.notes}]
    if series is not None and dose_number is not None:
        immunization["protocolApplied"] = [{
            "series": series.key, "doseNumberPositiveInt": dose_number,
            "seriesDosesPositiveInt": len(series.doses),
            "targetDisease": [concept(SNOMED, *d) for d in series.diseases]}]
    return immunization


@router.post("/administer", status_code=201,
             response_model=Envelope[ImmunizationView],
             summary="Record a vaccine dose given (a FHIR Immunization)")
async def administer(patient_id: str, body: AdministerRequest,
                     ctx: ApiContext = Depends(api_context)) -> Any:
    patient = await require_patient(ctx, patient_id)
    current = await _schedule_of(ctx, patient_id)
    table = all_series()
    if body.series is not None and body.series not in table:
        raise ApiError(422, "VALIDATION_ERROR", f"series: unknown series {body.series!r} "
                       f"(known: {', '.join(sorted(table))})", field="series")
    series = table.get(body.series or "") or next(
        (s for s in table.values() if body.vaccine_code in s.accepts), None)
    if series is None and body.vaccine_name is None:
        raise ApiError(422, "VALIDATION_ERROR", "vaccine_name: this CVX code is in no series "
                       "of the schedule; name the vaccine", field="vaccine_name")
    items = forecast(current, await _immunizations_of(ctx, patient_id), date.today())
    dose_number = body.dose_number
    if series is not None and dose_number is None:
        taken = {i["dose_number"] for i in items if i["series"] == series.key
                 and i["status"] == "given"}
        dose_number = next(n for n in range(1, len(series.doses) + 2) if n not in taken)
    immunization = {**immunization_to_fhir(body, patient, series, dose_number, ctx),
                    "id": new_id()}
    unit = ctx.fhir.unit()
    async with unit:
        staged = await unit.create(immunization, resource_id=immunization["id"])
        if current is not None and series is not None:
            updated = _completed(current, series.key, dose_number, immunization["id"])
            if updated is not None:
                await unit.update(updated)
        await unit.commit()
    return created(immunization_view(staged_body(staged)))


def _completed(schedule_: JSON, series: str, dose_number: int | None, immunization_id: str
               ) -> JSON | None:
    """The recommendation with that dose marked complete (None: no such dose in it)."""
    entries = []
    found = False
    for entry in schedule_.get("recommendation") or []:
        if entry.get("series") == series and entry.get("doseNumberPositiveInt") == dose_number:
            entry = {**entry, "forecastStatus": concept(FORECAST, "complete", "Complete"),
                     "supportingImmunization": [{"reference": f"Immunization/{immunization_id}"}]}
            found = True
        entries.append(entry)
    return {**schedule_, "recommendation": entries} if found else None


ADVERSE = "http://terminology.hl7.org/CodeSystem/"


@router.post("/aefi", status_code=201,
             response_model=Envelope[AefiView],
             summary="Report an adverse event following immunization (FHIR AdverseEvent)")
async def report_aefi(patient_id: str, body: AefiRequest,
                      ctx: ApiContext = Depends(api_context)) -> Any:
    patient = await require_patient(ctx, patient_id)
    immunization = await ctx.fhir.find_json("Immunization", body.immunization_id)
    if immunization is None or local_id(immunization.get("patient"), "Patient") != patient_id:
        raise not_found("Immunization")
    reaction: JSON = {"text": body.reaction}
    if body.reaction_code:
        reaction["coding"] = [coding(SNOMED, body.reaction_code, body.reaction)]
    serious = "Serious" if body.serious else "Non-serious"
    event: JSON = {
        "resourceType": "AdverseEvent", "id": new_id(), "actuality": "actual",
        "event": reaction, "subject": patient_reference(patient),
        "date": fhir_datetime(body.onset), "recordedDate": now_instant(),
        "seriousness": concept(ADVERSE + "adverse-event-seriousness", serious, serious),
        "severity": concept(ADVERSE + "adverse-event-severity", body.severity,
                            body.severity.capitalize()),
        "outcome": concept(ADVERSE + "adverse-event-outcome", body.outcome, body.outcome),
        "recorder": user_reference(ctx.principal),
        "suspectEntity": [{"instance": {"reference": f"Immunization/{immunization['id']}"}}],
    }
    reacted = {**immunization, "reaction": [*immunization.get("reaction", []), {
        "date": fhir_datetime(body.onset), "reported": True}]}
    unit = ctx.fhir.unit()
    async with unit:
        staged = await unit.create(event, resource_id=event["id"])
        await unit.update(reacted, if_match=int(immunization["meta"]["versionId"]))
        unit.emit("platform.immunization.aefi_reported", {
            "adverse_event_id": event["id"], "immunization_id": immunization["id"],
            "patient_id": patient_id, "vaccine_code": code_in(
                immunization.get("vaccineCode"), CVX), "reaction": body.reaction,
            "severity": body.severity, "serious": body.serious, "onset": event["date"]},
            source_service=source_service("immunizations"))
        await unit.commit()
    stored = staged_body(staged)
    return created(AefiView(
        id=stored["id"], patient_id=patient_id, immunization_id=immunization["id"],
        reaction=body.reaction, onset=stored["date"], severity=body.severity,
        serious=body.serious, outcome=body.outcome,
        recorded_by=ctx.principal.user_id).model_dump())
