"""A patient's treatment: FHIR **CarePlan** instantiated from a treatment protocol.

Mapping (/api field → CarePlan element):

    patient_id      → subject (Patient/<id>);  owners: the patient's, as the writer acts
    protocol_id     → instantiatesCanonical (the protocol's url|version), meta.tag
                      urn:healthplatform:instantiated-from|<PlanDefinition id> (how a
                      protocol knows it is in use)
    title           → title (the protocol's);  notes → note[].text
    start_date      → period.start;  end_date → period.end (the last step's end; none
                      when a step never ends)
    status          → status (table below);  reason → extension status-reason (why the
                      last move was made: R4's CarePlan has no statusReason)
    activities[]    → activity[] (one per protocol step, element id = the step's id):
      kind          → detail.kind (MedicationRequest, ServiceRequest, Appointment,
                      CommunicationRequest for medication, test, visit, counselling)
      title         → detail.code.text
      code          → detail.productCodeableConcept (medicines) or detail.code.coding
      instructions  → detail.description
      start, end    → detail.scheduledTiming: repeat.boundsPeriod (a course), or event
                      (a single event on that date); the repeat as the protocol's
      status        → detail.status (scheduled → in-progress | completed | cancelled;
                      in-progress → on-hold | completed | cancelled; on-hold →
                      in-progress | cancelled)
      notes         → progress[] (text, time; authorReference the user)
    progress        → computed: activities completed of those not cancelled, the
                      percentage, days elapsed of the treatment's days
    (always)        → category urn:healthplatform:careplan-category#treatment, intent
                      plan, created, author (the user who started it)

Status table: draft → active | revoked; active → on-hold | completed | revoked; on-hold
→ active | completed | revoked; completed and revoked are final (409
``INVALID_TRANSITION``). Revoking cancels the activities not finished. Activities change
only while the treatment is active (409 ``TREATMENT_NOT_ACTIVE``); the start date only
while it is a draft (the schedule is computed again). Only an active protocol starts a
treatment (409 ``PROTOCOL_NOT_ACTIVE``).

Events ``platform.treatments.patient_treatment_created`` / ``_status_changed`` /
``_progressed`` (payload: ``treatment_id``, ``patient_id``, ``protocol_id``, ``status``,
``previous_status``, ``progress``).
"""

from __future__ import annotations

from datetime import date
from typing import Annotated, Any, Literal

import orjson
from fastapi import APIRouter
from pydantic import BaseModel, Field

from fhir_server.clock import now_instant
from fhir_server.ownership import owner_labels
from platform_api.envelope import ApiError, conflict
from platform_api.facade import (
    ApiContext,
    Events,
    Facade,
    ItemContext,
    PatientScope,
    SearchParam,
    StatusTable,
    require_patient,
)
from platform_api.treatments.protocols import (
    USE_TAG,
    Coding,
    Repeat,
    Step,
    action_to_step,
    canonical,
    protocols,
    timings,
)
from platform_api.treatments.schedule import Scheduled, schedule, treatment_end

JSON = dict[str, Any]
USER_SYSTEM = "urn:healthplatform:user"
CATEGORY_SYSTEM = "urn:healthplatform:careplan-category"
STATUS_REASON = "urn:healthplatform:extension:status-reason"
TREATMENT = f"{CATEGORY_SYSTEM}|treatment"
TOPIC = "platform.treatments.patient_treatment_"
TREATMENT_STATUS = StatusTable.of(
    draft=("active", "revoked"), active=("on-hold", "completed", "revoked"),
    on_hold=("active", "completed", "revoked"), completed=(), revoked=())
ACTIVITY_STATUS = StatusTable.of(
    scheduled=("in-progress", "completed", "cancelled"),
    in_progress=("on-hold", "completed", "cancelled"),
    on_hold=("in-progress", "cancelled"), completed=(), cancelled=())
DETAIL_KINDS = {"medication": "MedicationRequest", "test": "ServiceRequest",
                "visit": "Appointment", "counselling": "CommunicationRequest"}
STEP_KIND = {v: k for k, v in DETAIL_KINDS.items()}
TreatmentStatus = Literal["draft", "active", "on-hold", "completed", "revoked"]
ActivityStatus = Literal["scheduled", "in-progress", "on-hold", "completed", "cancelled"]
UNFINISHED = ("scheduled", "in-progress", "on-hold")


class TreatmentCreate(BaseModel):
    patient_id: str = Field(min_length=1, max_length=64)
    protocol_id: str = Field(min_length=1, max_length=64)
    start_date: date | None = Field(default=None, description="Default: today")
    status: Literal["draft", "active"] = "draft"
    notes: str | None = Field(default=None, max_length=2000)


class ActivityChange(BaseModel):
    id: str = Field(min_length=1, max_length=64, description="The protocol step's id")
    status: ActivityStatus | None = None
    note: str | None = Field(default=None, min_length=1, max_length=2000)


class TreatmentUpdate(BaseModel):
    status: TreatmentStatus | None = None
    reason: str | None = Field(default=None, min_length=1, max_length=500)
    start_date: date | None = None
    notes: str | None = Field(default=None, max_length=2000)
    activities: list[ActivityChange] | None = Field(default=None, max_length=100)


class ProgressNote(BaseModel):
    text: str
    at: str | None = None
    by: str | None = None


class Activity(BaseModel):
    id: str
    title: str | None = None
    kind: str | None = None
    code: Coding | None = None
    instructions: str | None = None
    status: str
    start: str | None = None
    end: str | None = None
    repeat: Repeat | None = None
    notes: list[ProgressNote] = []


class Progress(BaseModel):
    activities: int = Field(description="Activities not cancelled")
    completed: int
    percent: float
    days_elapsed: int | None = None
    days_total: int | None = Field(None, description="None: open-ended")


class TreatmentView(BaseModel):
    id: str
    patient_id: str | None = None
    protocol_id: str | None = None
    protocol: str | None = Field(None, description="The protocol's url|version")
    title: str | None = None
    status: str
    status_reason: str | None = None
    start_date: str | None = None
    end_date: str | None = None
    organization_id: str | None = None
    notes: str | None = None
    activities: list[Activity] = []
    progress: Progress
    created_by: str | None = None
    created_at: str | None = None
    updated_at: str | None = None


class TreatmentQuery(BaseModel):
    status: Annotated[TreatmentStatus | None, SearchParam("status")] = None


# -- mapping --------------------------------------------------------------------------------
def _scheduled_timing(step: JSON, when: Scheduled) -> JSON:
    if when.end == when.start and not step.get("repeat"):
        return {"event": [when.start.isoformat()]}
    bounds: JSON = {"start": when.start.isoformat()}
    if when.end is not None:
        bounds["end"] = when.end.isoformat()
    repeat: JSON = {"boundsPeriod": bounds}
    if step.get("repeat"):
        every = step["repeat"]
        repeat.update(frequency=every["frequency"], period=every["period"],
                      periodUnit=every["unit"])
    return {"repeat": repeat}


def activity_of(step: JSON, when: Scheduled, instantiates: str) -> JSON:
    """A step as a CarePlan activity: what it is in ``detail.code`` (the step's title as
    its text, its clinical code unless it is a medicine's), the medicine in
    ``productCodeableConcept``, the instructions in ``description``."""
    coding = [{k: v for k, v in step["code"].items() if v is not None}] \
        if step.get("code") else []
    medicine = step["kind"] == "medication"
    detail: JSON = {"kind": DETAIL_KINDS[step["kind"]], "status": "scheduled",
                    "instantiatesCanonical": [instantiates],
                    "code": {"text": step["title"], **({"coding": coding}
                                                       if coding and not medicine else {})},
                    "scheduledTiming": _scheduled_timing(step, when)}
    if coding and medicine:
        detail["productCodeableConcept"] = {"coding": coding}
    if step.get("instructions"):
        detail["description"] = step["instructions"]
    return {"id": step["id"], "detail": detail}


def treatment_to_fhir(payload: JSON, ctx: ApiContext, existing: JSON | None) -> JSON:
    """A new CarePlan from the protocol ``prepare`` loaded (``payload["_protocol"]``)."""
    plan = payload["_protocol"]
    steps = {s["id"]: s for s in payload["_steps"]}
    dates: dict[str, Scheduled] = payload["_dates"]
    start: date = payload["start_date"]
    end = treatment_end(dates)
    instantiates = canonical(plan)
    care_plan: JSON = {
        "resourceType": "CarePlan", "status": payload.get("status", "draft"),
        "intent": "plan", "meta": {"tag": [{"system": USE_TAG, "code": plan["id"]}]},
        "instantiatesCanonical": [instantiates],
        "category": [{"coding": [{"system": CATEGORY_SYSTEM, "code": "treatment",
                                  "display": "Treatment protocol"}]}],
        "title": plan.get("title") or plan.get("name"),
        "subject": {"reference": f"Patient/{payload['patient_id']}"},
        "period": {"start": start.isoformat(), **({"end": end.isoformat()} if end else {})},
        "created": now_instant(),
        "author": {"identifier": {"system": USER_SYSTEM, "value": ctx.principal.user_id},
                   "display": ctx.principal.email or ctx.principal.user_id},
        "activity": [activity_of(steps[i], dates[i], instantiates) for i in steps],
    }
    if payload.get("notes"):
        care_plan["note"] = [{"text": payload["notes"], "time": now_instant()}]
    return care_plan


def _activity_view(activity: JSON) -> JSON:
    detail = activity.get("detail") or {}
    timing = detail.get("scheduledTiming") or {}
    repeat = timing.get("repeat") or {}
    bounds = repeat.get("boundsPeriod") or {}
    events = timing.get("event") or []
    concept = detail.get("productCodeableConcept") or detail.get("code") or {}
    coding = (concept.get("coding") or [None])[0]
    return Activity(
        id=activity.get("id") or "", title=(detail.get("code") or {}).get("text"),
        kind=STEP_KIND.get(str(detail.get("kind"))),
        code=Coding(**coding) if coding else None, instructions=detail.get("description"),
        status=detail.get("status", "scheduled"),
        start=bounds.get("start") or (events[0] if events else None),
        end=bounds.get("end") if bounds else (events[-1] if events else None),
        repeat=Repeat(frequency=repeat["frequency"], period=repeat.get("period", 1),
                      unit=repeat.get("periodUnit", "d")) if "frequency" in repeat else None,
        notes=[ProgressNote(text=p.get("text", ""), at=p.get("time"),
                            by=((p.get("authorReference") or {}).get("identifier") or {})
                            .get("value")) for p in activity.get("progress") or []],
    ).model_dump()


def progress_of(care_plan: JSON, today: date | None = None) -> JSON:
    statuses = [(a.get("detail") or {}).get("status") for a in care_plan.get("activity") or []]
    counted = [s for s in statuses if s != "cancelled"]
    completed = counted.count("completed")
    period = care_plan.get("period") or {}
    start, end = period.get("start"), period.get("end")
    today = today or date.today()
    elapsed = None
    if start:
        elapsed = max(0, (min(today, date.fromisoformat(end)) if end else today).toordinal()
                      - date.fromisoformat(start).toordinal())
    total = (date.fromisoformat(end) - date.fromisoformat(start)).days if start and end \
        else None
    return Progress(activities=len(counted), completed=completed,
                    percent=round(100 * completed / len(counted), 1) if counted else 0.0,
                    days_elapsed=elapsed, days_total=total).model_dump()


def treatment_view(care_plan: JSON) -> JSON:
    owners = sorted(owner_labels(care_plan))
    tag = next((t.get("code") for t in (care_plan.get("meta") or {}).get("tag") or []
                if t.get("system") == USE_TAG), None)
    period = care_plan.get("period") or {}
    reason = next((e.get("valueString") for e in care_plan.get("extension") or []
                   if e.get("url") == STATUS_REASON), None)
    return TreatmentView(
        id=care_plan["id"],
        patient_id=(care_plan.get("subject") or {}).get("reference", "").removeprefix(
            "Patient/") or None,
        protocol_id=tag, protocol=(care_plan.get("instantiatesCanonical") or [None])[0],
        title=care_plan.get("title"), status=care_plan["status"], status_reason=reason,
        start_date=period.get("start"), end_date=period.get("end"),
        organization_id=owners[0] if owners else None,
        notes=(care_plan.get("note") or [{}])[0].get("text"),
        activities=[Activity(**_activity_view(a)) for a in care_plan.get("activity") or []],
        progress=Progress(**progress_of(care_plan)),
        created_by=((care_plan.get("author") or {}).get("identifier") or {}).get("value"),
        created_at=care_plan.get("created"),
        updated_at=(care_plan.get("meta") or {}).get("lastUpdated"),
    ).model_dump()


def _event(care_plan: JSON, previous: str | None = None) -> JSON:
    view = treatment_view(care_plan)
    return {"treatment_id": view["id"], "patient_id": view["patient_id"],
            "protocol_id": view["protocol_id"], "status": view["status"],
            "previous_status": previous, "progress": view["progress"]}


# -- create -------------------------------------------------------------------------------------
async def _prepare(ctx: ApiContext, payload: JSON) -> JSON:
    """The patient must be the caller's to see, the protocol active; its steps are
    placed in time from the start date."""
    await require_patient(ctx, payload["patient_id"])
    plan = await protocols.load(ctx, payload["protocol_id"])
    if plan["status"] != "active":
        raise conflict("PROTOCOL_NOT_ACTIVE", f"The protocol is {plan['status']}: only an "
                       "active protocol starts a treatment")
    return {**payload, **_placed(plan, payload.get("start_date") or date.today())}


def _placed(plan: JSON, start: date) -> JSON:
    steps = [Step(**action_to_step(a)) for a in plan.get("action") or []]
    return {"_protocol": plan, "_steps": [s.model_dump() for s in steps],
            "_dates": schedule(timings(steps), start), "start_date": start}


treatments = Facade(
    resource="CarePlan", name="Patient treatment", create=TreatmentCreate,
    update=TreatmentUpdate, view=TreatmentView, query=TreatmentQuery,
    to_fhir=treatment_to_fhir, from_fhir=treatment_view, fixed=(("category", TREATMENT),),
    statuses=TREATMENT_STATUS, prepare=_prepare,
    events=Events(created=TOPIC + "created", payload=_event), tags=["treatments"],
    summaries={"create": "Start a patient's treatment from a protocol (a CarePlan with "
                         "the protocol's steps as dated activities)"},
)
patient_treatments = Facade(
    resource="CarePlan", name="Patient treatment", create=TreatmentCreate,
    view=TreatmentView, query=TreatmentQuery, to_fhir=treatment_to_fhir,
    from_fhir=treatment_view, scope=PatientScope("subject"),
    fixed=(("category", TREATMENT),), sort="-date", tags=["treatments"],
    summaries={"list": "A patient's treatments (filter by status)"},
)
router = APIRouter(tags=["treatments"])
treatments.mount(router, "/api/patient-treatments", ops=("create",))
patient_treatments.mount(router, "/api/patients/{patient_id}/treatments", ops=("list",))


# -- change ---------------------------------------------------------------------------------------
@treatments.route("PATCH", "/{resource_id}", body=TreatmentUpdate, conflicts={
    "INVALID_TRANSITION": "the status table has no such move (treatment or activity)",
    "TREATMENT_NOT_ACTIVE": "activities change only while the treatment is active",
    "TREATMENT_NOT_DRAFT": "the start date changes only while the treatment is a draft"},
    summary="Move a treatment's status, record its activities' progress")
async def update_treatment(ctx: ItemContext[TreatmentUpdate]) -> JSON:
    body = ctx.body or TreatmentUpdate()
    current = ctx.resource
    care_plan: JSON = orjson.loads(orjson.dumps(current))
    if body.start_date is not None:
        care_plan = await _restart(ctx, care_plan, body.start_date)
    if body.activities:
        if current["status"] != "active":
            raise conflict("TREATMENT_NOT_ACTIVE", f"The treatment is {current['status']}: "
                           "its activities change only while it is active")
        _record_activities(ctx, care_plan, body.activities)
    if "notes" in body.model_fields_set:
        care_plan["note"] = [{"text": body.notes, "time": now_instant()}] if body.notes \
            else []
        if not care_plan["note"]:
            care_plan.pop("note")
    event = "progressed"
    if body.status is not None and body.status != current["status"]:
        care_plan = TREATMENT_STATUS.move(care_plan, body.status)
        care_plan["extension"] = [e for e in care_plan.get("extension") or []
                                  if e.get("url") != STATUS_REASON]
        if body.reason:
            care_plan["extension"].append({"url": STATUS_REASON, "valueString": body.reason})
        if not care_plan["extension"]:
            care_plan.pop("extension")
        if body.status == "revoked":
            for activity in care_plan.get("activity") or []:
                if activity["detail"].get("status") in UNFINISHED:
                    activity["detail"]["status"] = "cancelled"
        event = "status_changed"
    return await ctx.save(care_plan, event=TOPIC + event,
                          payload=_event({**care_plan, "meta": current.get("meta")},
                                         current["status"]))


async def _restart(ctx: ItemContext[Any], care_plan: JSON, start: date) -> JSON:
    if care_plan["status"] != "draft":
        raise conflict("TREATMENT_NOT_DRAFT", "The start date changes only while the "
                       "treatment is a draft")
    protocol_id = treatment_view(care_plan)["protocol_id"] or ""
    placed = _placed(await protocols.load(ctx, protocol_id), start)
    fresh = treatment_to_fhir({**placed, "patient_id": "", "status": "draft"}, ctx, None)
    care_plan["period"], care_plan["activity"] = fresh["period"], fresh["activity"]
    return care_plan


def _record_activities(ctx: ItemContext[Any], care_plan: JSON,
                       changes: list[ActivityChange]) -> None:
    by_id = {a.get("id"): a for a in care_plan.get("activity") or []}
    for index, change in enumerate(changes):
        activity = by_id.get(change.id)
        if activity is None:
            raise ApiError(422, "VALIDATION_ERROR", f"The treatment has no activity "
                           f"{change.id!r}", field=f"activities[{index}].id")
        if change.status is not None and change.status != activity["detail"]["status"]:
            activity["detail"] = ACTIVITY_STATUS.move(activity["detail"], change.status)
        if change.note:
            activity.setdefault("progress", []).append({
                "text": change.note, "time": now_instant(),
                "authorReference": {"identifier": {"system": USER_SYSTEM,
                                                   "value": ctx.principal.user_id}}})


__all__ = ["TREATMENT", "TreatmentView", "patient_treatments", "progress_of", "router",
           "treatment_view", "treatments"]
