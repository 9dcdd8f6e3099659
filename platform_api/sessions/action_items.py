"""Action items of a session: FHIR **Task** (a to-do for a member of the care team).

Mapping (/api field → Task element):

    description     → description
    patient_id      → for (Patient/<id>);  encounter_id → encounter
    organization_id → meta.security owner label (from the patient when there is one; an
                      item about no patient belongs to the organization given, or to the
                      caller's one organization)
    owner_id        → owner (identifier urn:healthplatform:user|<id>; default the caller)
    due_date        → restriction.period.end (when it should be done by)
    priority        → priority (routine | urgent | asap | stat)
    note_id         → focus (Composition/<id>: the note it came from)
    notes           → note[].text
    status          → status (table below); statusReason when cancelled
    (always)        → code urn:healthplatform:task-code#action-item, intent order,
                      requester the caller, authoredOn, lastModified;
                      executionPeriod.end when completed

Status table (FHIR Task statuses): requested → in-progress | on-hold | completed |
cancelled; in-progress → on-hold | completed | cancelled; on-hold → requested |
in-progress | cancelled; completed and cancelled are final (409 ``INVALID_TRANSITION``).
``DELETE`` cancels an item (status cancelled, kept with its history), it never erases it.
Extraction (:mod:`.extraction`) proposes follow-ups that become action items when
committed. Events ``platform.sessions.action_item_created``, ``…_updated``,
``…_completed``, ``…_cancelled`` (payload: the item's view).
"""

from __future__ import annotations

from datetime import date, datetime
from typing import Annotated, Any, Literal

import orjson
from fastapi import APIRouter
from pydantic import BaseModel, Field

from fhir_server.clock import now_instant
from fhir_server.ownership import owner_labels, with_owners
from platform_api.envelope import ApiError
from platform_api.facade import (
    ApiContext,
    Events,
    Facade,
    ItemContext,
    SearchParam,
    StatusTable,
    require_organization,
)
from platform_api.organizations import MEMBERS
from platform_api.sessions.common import (
    TASK_CODES,
    USER_SYSTEM,
    check_patient_and_encounter,
    concept,
    local_id,
    ref,
    user_of,
    user_reference,
)

JSON = dict[str, Any]
ACTION_ITEM = f"{TASK_CODES}|action-item"
ITEM_STATUS = StatusTable.of(
    requested=("in-progress", "on-hold", "completed", "cancelled"),
    in_progress=("on-hold", "completed", "cancelled"),
    on_hold=("requested", "in-progress", "cancelled"),
    completed=(),
    cancelled=(),
)
TOPIC = "platform.sessions.action_item_"
Priority = Literal["routine", "urgent", "asap", "stat"]
ItemStatus = Literal["requested", "in-progress", "on-hold", "completed", "cancelled"]


class ActionItemCreate(BaseModel):
    description: str = Field(min_length=1, max_length=2000,
                             examples=["Repeat haemoglobin in two weeks"])
    patient_id: str | None = Field(default=None, min_length=1, max_length=64)
    encounter_id: str | None = Field(default=None, min_length=1, max_length=64)
    organization_id: str | None = Field(default=None, min_length=1, max_length=64)
    owner_id: str | None = Field(default=None, min_length=1, max_length=64,
                                 description="The user who should do it (default: you)")
    due_date: date | datetime | None = None
    priority: Priority = "routine"
    note_id: str | None = Field(default=None, min_length=1, max_length=64)
    notes: str | None = Field(default=None, max_length=2000)


class ActionItemUpdate(BaseModel):
    description: str | None = Field(default=None, min_length=1, max_length=2000)
    owner_id: str | None = Field(default=None, min_length=1, max_length=64)
    due_date: date | datetime | None = None
    priority: Priority | None = None
    notes: str | None = Field(default=None, max_length=2000)
    status: ItemStatus | None = None


class ActionItemView(BaseModel):
    id: str
    description: str | None = None
    patient_id: str | None = None
    encounter_id: str | None = None
    organization_id: str | None = None
    owner_id: str | None = None
    due_date: str | None = None
    priority: str | None = None
    status: str
    status_reason: str | None = None
    note_id: str | None = None
    notes: str | None = None
    created_by: str | None = None
    created_at: str | None = None
    completed_at: str | None = None
    updated_at: str | None = None


class ActionItemQuery(BaseModel):
    patient_id: Annotated[str | None, SearchParam("patient", "Patient/{}")] = Field(
        None, max_length=64)
    encounter_id: Annotated[str | None, SearchParam("encounter", "Encounter/{}")] = Field(
        None, max_length=64)
    owner_id: Annotated[str | None, SearchParam("owner:identifier", USER_SYSTEM + "|{}")] = \
        Field(None, max_length=64, description="A user id")
    status: Annotated[ItemStatus | None, SearchParam("status")] = None


def _when(value: Any) -> str:
    return value.isoformat() if isinstance(value, date | datetime) else str(value)


def item_to_fhir(payload: JSON, ctx: ApiContext, existing: JSON | None) -> JSON:
    now = now_instant()
    task: JSON = orjson.loads(orjson.dumps(existing)) if existing else {
        "resourceType": "Task", "status": "requested", "intent": "order",
        "code": concept(TASK_CODES, "action-item", "Action item"), "authoredOn": now,
        "requester": user_reference(ctx.principal),
        "owner": {"identifier": {"system": USER_SYSTEM, "value": ctx.principal.user_id}},
    }
    task["lastModified"] = now
    if payload.get("description"):
        task["description"] = payload["description"]
    if payload.get("patient_id"):
        task["for"] = ref("Patient", payload["patient_id"])
    if payload.get("encounter_id"):
        task["encounter"] = ref("Encounter", payload["encounter_id"])
    if payload.get("note_id"):
        task["focus"] = ref("Composition", payload["note_id"])
    if payload.get("owner_id"):
        task["owner"] = {"identifier": {"system": USER_SYSTEM, "value": payload["owner_id"]}}
    if payload.get("priority"):
        task["priority"] = payload["priority"]
    if "due_date" in payload:
        if payload["due_date"]:
            task["restriction"] = {"period": {"end": _when(payload["due_date"])}}
        else:
            task.pop("restriction", None)
    if "notes" in payload:
        if payload["notes"]:
            task["note"] = [{"text": payload["notes"], "time": now}]
        else:
            task.pop("note", None)
    if payload.get("organization_id") and not existing:
        task = with_owners(task, {payload["organization_id"]})
    return task


def item_view(task: JSON) -> JSON:
    owners = sorted(owner_labels(task))
    return ActionItemView(
        id=task["id"], description=task.get("description"),
        patient_id=local_id(task.get("for"), "Patient"),
        encounter_id=local_id(task.get("encounter"), "Encounter"),
        organization_id=owners[0] if owners else None, owner_id=user_of(task.get("owner")),
        due_date=((task.get("restriction") or {}).get("period") or {}).get("end"),
        priority=task.get("priority"), status=task["status"],
        status_reason=(task.get("statusReason") or {}).get("text"),
        note_id=local_id(task.get("focus"), "Composition"),
        notes=(task.get("note") or [{}])[0].get("text"),
        created_by=user_of(task.get("requester")), created_at=task.get("authoredOn"),
        completed_at=(task.get("executionPeriod") or {}).get("end"),
        updated_at=(task.get("meta") or {}).get("lastUpdated"),
    ).model_dump()


async def _prepare(ctx: ApiContext, payload: JSON) -> JSON:
    """The patient and encounter must be the caller's to see; an item about no patient
    needs an organization (given, or the caller's only one); its owner must be a member of
    an organization it belongs to."""
    organizations: list[str] = []
    if payload.get("patient_id"):
        await check_patient_and_encounter(ctx, payload)
        patient = await ctx.fhir.read_json("Patient", payload["patient_id"])
        mine = ctx.organizations_for("organization.work-in")  # None: anywhere (an admin)
        organizations = [o for o in sorted(owner_labels(patient))
                         if mine is None or o in mine]
    elif payload.get("encounter_id"):
        raise ApiError(422, "VALIDATION_ERROR", "An encounter needs its patient_id",
                       field="patient_id")
    if payload.get("organization_id"):
        await require_organization(ctx, payload["organization_id"])
        organizations = [payload["organization_id"]]
    elif not payload.get("patient_id"):
        memberships = sorted(ctx.organizations_for("organization.work-in") or ())
        if len(memberships) != 1:
            raise ApiError(422, "ORGANIZATION_REQUIRED", "Say which organization the item "
                           "belongs to", field="organization_id")
        organizations = memberships
    if payload.get("note_id") and await ctx.fhir.find_json("Composition",
                                                           payload["note_id"]) is None:
        raise ApiError(404, "NOT_FOUND", "Clinical note not found")
    await _check_owner(ctx, payload.get("owner_id"), organizations)
    return payload


async def _check_owner(ctx: ApiContext, owner_id: str | None, organizations: list[str]
                       ) -> None:
    if not owner_id or owner_id == ctx.principal.user_id or not organizations:
        return
    store = ctx.services.store
    for org_id in organizations:
        if await store.get_document(MEMBERS, f"{org_id}:{owner_id}") is not None:
            return
    raise ApiError(422, "OWNER_NOT_MEMBER", "The owner must be a member of the item's "
                   "organization", field="owner_id")


action_items = Facade(
    resource="Task", name="Action item", create=ActionItemCreate, update=ActionItemUpdate,
    view=ActionItemView, query=ActionItemQuery, to_fhir=item_to_fhir, from_fhir=item_view,
    fixed=(("code", ACTION_ITEM),), statuses=ITEM_STATUS, prepare=_prepare,
    events=Events(created=TOPIC + "created"), tags=["sessions"],
    summaries={"list": "List action items (filter by patient, encounter, owner, status)",
               "create": "Create an action item (a FHIR Task with owner and due date)",
               "get": "An action item"},
)
router = APIRouter(tags=["sessions"])
action_items.mount(router, "/api/sessions/action-items", ops=("list", "create", "get"))


def _moved(task: JSON, target: str, reason: str | None = None) -> JSON:
    moved = ITEM_STATUS.move(task, target)
    now = now_instant()
    if target in ("completed", "cancelled"):
        moved["executionPeriod"] = {**(moved.get("executionPeriod") or {}), "end": now}
    if reason:
        moved["statusReason"] = {"text": reason}
    return moved


@action_items.route("PATCH", "/{resource_id}", body=ActionItemUpdate,
                    summary="Change an action item (status moves follow the status table)")
async def update_item(ctx: ItemContext[ActionItemUpdate]) -> JSON:
    payload = ctx.body.model_dump(exclude_unset=True) if ctx.body else {}
    task = ctx.resource
    target = payload.pop("status", None)
    if payload.get("owner_id"):
        await _check_owner(ctx, payload["owner_id"], sorted(owner_labels(task)))
    if target is None and task["status"] in ("completed", "cancelled"):
        raise ApiError(409, "INVALID_TRANSITION", f"The item is {task['status']}")
    changed = item_to_fhir(payload, ctx, task)
    event = "updated"
    if target and target != task["status"]:
        changed = _moved(changed, target)
        event = target if target in ("completed", "cancelled") else "updated"
    return await ctx.save(changed, event=TOPIC + event, payload=item_view(
        {**changed, "meta": task.get("meta")}))


@action_items.route("DELETE", "/{resource_id}",
                    summary="Cancel an action item (it is kept, with status cancelled)")
async def cancel_item(ctx: ItemContext[Any]) -> JSON:
    cancelled = _moved(ctx.resource, "cancelled",
                       f"Cancelled by {ctx.principal.email or ctx.principal.user_id}")
    cancelled["lastModified"] = now_instant()
    return await ctx.save(cancelled, event=TOPIC + "cancelled",
                          payload=item_view({**cancelled, "meta": ctx.resource.get("meta")}))


__all__ = ["ACTION_ITEM", "ActionItemView", "action_items", "item_to_fhir", "router"]
