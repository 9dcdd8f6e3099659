"""Patients area, the care journey: a patient's timeline assembled from their FHIR
resources, and the journey events recorded through /api ⇄ FHIR Observation.

**The timeline** (``GET /api/patients/:id/journey``) is the patient's record in clinical
time, newest first, as the caller may see it: every kind of ``TIMELINE`` (visits,
vitals, observations, journey events, lab results, prescriptions, dispenses,
immunizations, procedures, diagnoses, allergies, orders, adverse events) is one FHIR
search of the patient's resources sorted by that kind's own date parameter (an Encounter
by its period, a MedicationRequest by ``authoredon``, a MedicationDispense by
``whenhandedover``...); the page is the merge of their heads, ``meta.total`` the sum of
their exact totals. Kinds the caller's role can never read are left out (a receptionist
sees visits, not results). ``kind`` narrows it to some kinds.

**A journey event** (``POST``: a referral, an admission, a milestone...) is an
Observation, as FHIR has no resource for "something that happened on the patient's
path" beyond those the timeline already reads:

    event_type   → code.coding[0] (urn:healthplatform:journey-event: registration,
                   referral, admission, transfer, discharge, diagnosis, treatment-started,
                   treatment-completed, follow-up, milestone, other)
    title        → code.text
    description  → valueString
    occurred_at  → effectiveDateTime (default: now)
    encounter_id → encounter; recorded_by → performer[0] (the user)
    (fixed)      → category urn:healthplatform:observation-category#care-journey, status
                   final, subject the patient

so FHIR clients read it like any observation (``Observation?category=
urn:healthplatform:observation-category|care-journey``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

import orjson
from fastapi import APIRouter, Depends, Query
from pydantic import BaseModel, Field

from fhir_server.access import READ, may_touch_type
from fhir_server.clock import now_instant
from fhir_server.search.plan import MAX_OFFSET
from platform_api.envelope import ApiError, PageEnvelope, Pagination, pagination
from platform_api.facade import ApiContext, Facade, PatientScope, api_context, require_patient
from platform_api.patients.shared import (
    JSON,
    LOINC,
    concept,
    concept_text,
    fhir_datetime,
    first_coding,
    user_of,
    user_reference,
)

CATEGORY_SYSTEM = "urn:healthplatform:observation-category"
EVENT_SYSTEM = "urn:healthplatform:journey-event"
JOURNEY = f"{CATEGORY_SYSTEM}|care-journey"
VITAL_SIGNS = "http://terminology.hl7.org/CodeSystem/observation-category|vital-signs"
EventType = Literal["registration", "referral", "admission", "transfer", "discharge",
                    "diagnosis", "treatment-started", "treatment-completed", "follow-up",
                    "milestone", "other"]


@dataclass(frozen=True)
class Kind:
    """One kind of timeline entry: a FHIR search of the patient's resources sorted by a
    date parameter, and how an entry reads."""

    key: str
    resource_type: str
    date_param: str
    dates: tuple[str, ...]  # elements holding its date, the first present wins
    what: str  # the element naming it (a CodeableConcept)
    criteria: tuple[tuple[str, str], ...] = ()
    patient_param: str = "patient"
    detail: Callable[[JSON], str | None] = lambda resource: None


def _value_text(observation: JSON) -> str | None:
    if "valueQuantity" in observation:
        q = observation["valueQuantity"]
        return f"{q.get('value')} {q.get('unit') or q.get('code') or ''}".strip()
    for key in ("valueString", "valueBoolean", "valueInteger"):
        if key in observation:
            return str(observation[key])
    return concept_text(observation.get("valueCodeableConcept"))


TIMELINE: tuple[Kind, ...] = (
    Kind("visit", "Encounter", "date", ("period.start",), "type",
         detail=lambda e: concept_text((e.get("reasonCode") or [None])[0])),
    Kind("vitals", "Observation", "date", ("effectiveDateTime",), "code",
         (("code", f"{LOINC}|85353-1"),)),
    Kind("observation", "Observation", "date",
         ("effectiveDateTime", "effectivePeriod.start", "issued"), "code",
         (("category:not", VITAL_SIGNS), ("category:not", JOURNEY)), detail=_value_text),
    Kind("journey_event", "Observation", "date", ("effectiveDateTime",), "code",
         (("category", JOURNEY),), detail=lambda o: o.get("valueString")),
    Kind("lab_result", "DiagnosticReport", "date", ("effectiveDateTime", "issued"), "code",
         detail=lambda r: r.get("conclusion")),
    Kind("prescription", "MedicationRequest", "authoredon", ("authoredOn",),
         "medicationCodeableConcept",
         detail=lambda r: ((r.get("dosageInstruction") or [{}])[0]).get("text")),
    Kind("dispense", "MedicationDispense", "whenhandedover", ("whenHandedOver",),
         "medicationCodeableConcept"),
    Kind("immunization", "Immunization", "date", ("occurrenceDateTime",), "vaccineCode"),
    Kind("procedure", "Procedure", "date", ("performedDateTime", "performedPeriod.start"),
         "code"),
    Kind("diagnosis", "Condition", "recorded-date", ("recordedDate", "onsetDateTime"),
         "code"),
    Kind("allergy", "AllergyIntolerance", "date", ("recordedDate",), "code"),
    Kind("order", "ServiceRequest", "authored", ("authoredOn",), "code"),
    Kind("adverse_event", "AdverseEvent", "date", ("date",), "event",
         patient_param="subject"),
)
KINDS = {k.key: k for k in TIMELINE}
KindName = Literal["visit", "vitals", "observation", "journey_event", "lab_result",
                   "prescription", "dispense", "immunization", "procedure", "diagnosis",
                   "allergy", "order", "adverse_event"]


class JourneyEventCreate(BaseModel):
    event_type: EventType = Field(examples=["referral"])
    title: str = Field(min_length=1, max_length=200,
                       examples=["Referred to Kenyatta National Hospital oncology clinic"])
    description: str | None = Field(default=None, max_length=4000)
    occurred_at: datetime | None = None
    encounter_id: str | None = Field(default=None, max_length=64)


class TimelineEntryView(BaseModel):
    id: str = Field(description="Type/id of the FHIR resource")
    kind: str
    resource_type: str
    resource_id: str
    date: str | None = None
    title: str | None = None
    detail: str | None = None
    status: str | None = None
    event_type: str | None = None
    recorded_by: str | None = None


# -- timeline entries ---------------------------------------------------------------------------
def _at(resource: JSON, path: str) -> Any:
    found: Any = resource
    for part in path.split("."):
        found = found.get(part) if isinstance(found, dict) else None
    return found


def _status(resource: JSON) -> str | None:
    status = resource.get("status")
    if isinstance(status, str):
        return status
    return first_coding(resource.get("clinicalStatus")).get("code")


def entry_view(kind: Kind, resource: JSON) -> JSON:
    date = next((v for path in kind.dates if (v := _at(resource, path))), None)
    what = resource.get(kind.what)
    what = what[0] if isinstance(what, list) and what else what
    performer = (resource.get("performer") or [None])[0]
    return TimelineEntryView(
        id=f"{resource['resourceType']}/{resource['id']}", kind=kind.key,
        resource_type=resource["resourceType"], resource_id=resource["id"],
        date=date or (resource.get("meta") or {}).get("lastUpdated"),
        title=concept_text(what) if isinstance(what, dict) else None,
        detail=kind.detail(resource), status=_status(resource),
        event_type=first_coding(resource.get("code")).get("code")
        if kind.key == "journey_event" else None,
        recorded_by=user_of(performer) if isinstance(performer, dict) else None,
    ).model_dump()


async def _head(ctx: ApiContext, kind: Kind, patient_id: str, count: int
                ) -> tuple[list[JSON], int]:
    """The first ``count`` resources of a kind, newest first, and how many there are."""
    params = [(kind.patient_param, f"Patient/{patient_id}"), *kind.criteria,
              ("_sort", f"-{kind.date_param}")]
    plan = await ctx.fhir.parse([kind.resource_type], params, strict=True)
    plan.count, plan.total = count, "accurate"
    page = await ctx.fhir.search_page(plan)
    return [orjson.loads(s.body) for s in page.resources], page.total or 0


async def timeline(ctx: ApiContext, patient_id: str, kinds: Sequence[Kind], page: Pagination
                   ) -> tuple[list[JSON], int]:
    """One page of the merged timeline and its total (see the module docstring)."""
    if page.offset + page.limit > MAX_OFFSET:
        raise ApiError(422, "VALIDATION_ERROR", f"page is too deep: at most {MAX_OFFSET} "
                       "entries can be paged through; narrow it with kind", field="page")
    entries: list[JSON] = []
    total = 0
    for kind in kinds:
        if not may_touch_type(ctx.access, READ, kind.resource_type):
            continue
        found, count = await _head(ctx, kind, patient_id, page.offset + page.limit)
        entries += [entry_view(kind, r) for r in found]
        total += count
    entries.sort(key=lambda e: e["date"] or "", reverse=True)
    return entries[page.offset:page.offset + page.limit], total


# -- journey events --------------------------------------------------------------------------
def journey_event_to_fhir(payload: JSON, ctx: ApiContext, existing: JSON | None) -> JSON:
    observation: JSON = {
        "resourceType": "Observation", "status": "final",
        "category": [concept(CATEGORY_SYSTEM, "care-journey", "Care journey")],
        "code": {"coding": [{"system": EVENT_SYSTEM, "code": payload["event_type"]}],
                 "text": payload["title"]},
        "subject": {"reference": f"Patient/{ctx.path['patient_id']}"},
        "effectiveDateTime": fhir_datetime(payload.get("occurred_at") or now_instant()),
        "performer": [user_reference(ctx.principal)],
    }
    if payload.get("description"):
        observation["valueString"] = payload["description"]
    if payload.get("encounter_id"):
        observation["encounter"] = {"reference": f"Encounter/{payload['encounter_id']}"}
    return observation


def journey_event_view(observation: JSON) -> JSON:
    return entry_view(KINDS["journey_event"], observation)


journey_events = Facade(
    resource="Observation", name="Journey event", create=JourneyEventCreate,
    view=TimelineEntryView, to_fhir=journey_event_to_fhir, from_fhir=journey_event_view,
    scope=PatientScope("subject"), fixed=[("category", JOURNEY)], tags=["journey"],
    summaries={"create": "Record a journey event (a referral, an admission, a milestone...)"},
)

router = APIRouter(tags=["journey"])
journey_events.mount(router, "/api/patients/{patient_id}/journey", ops=("create",))


@router.get("/api/patients/{patient_id}/journey", response_model=PageEnvelope[TimelineEntryView],
            summary="A patient's care timeline: visits, results, prescriptions, immunizations "
                    "and journey events, newest first")
async def patient_journey(
        patient_id: str,
        kind: list[KindName] | None = Query(None, description="Only these kinds of entries"),
        page: Pagination = Depends(pagination), ctx: ApiContext = Depends(api_context)) -> Any:
    await require_patient(ctx, patient_id)
    kinds = [KINDS[k] for k in kind] if kind else list(TIMELINE)
    entries, total = await timeline(ctx, patient_id, kinds, page)
    return page.respond(entries, total)
