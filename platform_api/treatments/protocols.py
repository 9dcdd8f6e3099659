"""Treatment protocols: FHIR **PlanDefinition** (type clinical-protocol), versioned.

Mapping (/api field → PlanDefinition element):

    code            → name, identifier urn:healthplatform:treatment-protocol|<code>, and
                      url urn:healthplatform:treatment-protocol:<code> (the canonical, the
                      same for every version)
    version         → version ("1", "2", …; a new version is a create with supersedes_id)
    title           → title;  description → description
    condition       → useContext (code focus, valueCodeableConcept: what it treats)
    status          → status (draft | active | retired)
    supersedes_id   → relatedArtifact (type predecessor, resource: the earlier version)
    organization_id → meta.security owner label (default: the writer's organization;
                      the shipped protocols belong to no organization)
    steps[]         → action[]:
      id            → action.id;  title → title;  instructions → textEquivalent
      kind          → code[0] (urn:healthplatform:treatment-step-kind: medication | test
                      | visit | counselling);  code → code[1] (ATC, LOINC, SNOMED CT…)
      after, offset → relatedAction (actionId, relationship after-end, offsetDuration);
                      an offset from the treatment's start: extension start-offset
      duration      → timingTiming.repeat.boundsDuration
      repeat        → timingTiming.repeat.frequency / period / periodUnit
    (always)        → type clinical-protocol, date (last change), publisher

Status table: draft → active | retired; active → retired; retired is final. Only an
active protocol starts a patient's treatment. A protocol **in use** (a CarePlan was
instantiated from this version) keeps its content: ``PATCH`` may only retire it (409
``PROTOCOL_IN_USE`` otherwise; a change is a new version: ``POST`` with
``supersedes_id``, which retires the earlier one in the same unit of work), and
``DELETE`` retires it instead of deleting it. Who writes is the access policy's
(definitions: an organization's ORG:ADMIN and doctors; everyone reads them).

Events ``platform.treatments.protocol_created`` / ``_updated`` / ``_retired`` /
``_deleted`` (payload: the protocol's view).
"""

from __future__ import annotations

import re
from datetime import date
from typing import Annotated, Any, Literal

import orjson
from fastapi import APIRouter, Depends
from pydantic import BaseModel, Field, model_validator

from fhir_server.access import UPDATE
from fhir_server.clock import now_instant
from fhir_server.ownership import owner_labels, with_owners
from platform_api.envelope import ApiError, Envelope, conflict, ok
from platform_api.facade import (
    ApiContext,
    Events,
    Facade,
    ItemContext,
    SearchParam,
    StatusTable,
    Unique,
    api_context,
    require_organization,
    until_stable,
)
from platform_api.services import Services
from platform_api.treatments.schedule import UNITS, ScheduleError, Span, StepTiming, schedule

JSON = dict[str, Any]
PROTOCOL_SYSTEM = "urn:healthplatform:treatment-protocol"
STEP_KINDS = "urn:healthplatform:treatment-step-kind"
START_OFFSET = "urn:healthplatform:extension:start-offset"
PLAN_TYPE = "http://terminology.hl7.org/CodeSystem/plan-definition-type"
CONTEXT_TYPE = "http://terminology.hl7.org/CodeSystem/usage-context-type"
UCUM = "http://unitsofmeasure.org"
PROTOCOL_TYPE = f"{PLAN_TYPE}|clinical-protocol"
TOPIC = "platform.treatments.protocol_"
PROTOCOL_STATUS = StatusTable.of(draft=("active", "retired"), active=("retired",),
                                 retired=())
SLUG = r"^[a-z0-9][a-z0-9-]{0,63}$"
StepKind = Literal["medication", "test", "visit", "counselling"]
Unit = Literal["d", "wk", "mo", "a"]
ProtocolStatus = Literal["draft", "active", "retired"]
IN_USE = {"PROTOCOL_IN_USE": "a patient's treatment was started from this version: only "
                             "retiring it is allowed (a change is a new version)"}


class Coding(BaseModel):
    system: str = Field(min_length=1, max_length=200, examples=["http://www.whocc.no/atc"])
    code: str = Field(min_length=1, max_length=100, examples=["J04AC01"])
    display: str | None = Field(default=None, max_length=200, examples=["isoniazid"])


class Duration(BaseModel):
    value: int = Field(ge=0, le=1200, examples=[2])
    unit: Unit = Field(examples=["mo"], description="d, wk, mo (calendar month) or a (year)")


class Repeat(BaseModel):
    frequency: int = Field(1, ge=1, le=24, description="times per period")
    period: int = Field(1, ge=1, le=365)
    unit: Unit = "d"


class Step(BaseModel):
    id: str = Field(pattern=SLUG, examples=["intensive-isoniazid"])
    title: str = Field(min_length=1, max_length=200)
    kind: StepKind
    code: Coding | None = None
    instructions: str | None = Field(default=None, max_length=2000)
    after: str | None = Field(default=None, pattern=SLUG,
                              description="Starts when this other step ends")
    offset: Duration | None = Field(default=None, description="Delay after the treatment's "
                                    "start (or after the end of `after`)")
    duration: Duration | None = Field(default=None, description="None: open-ended when it "
                                      "repeats, a single event when it does not")
    repeat: Repeat | None = None


def _check_steps(steps: list[Step]) -> list[Step]:
    seen: set[str] = set()
    for index, step in enumerate(steps):
        if step.id in seen:
            raise ValueError(f"steps[{index}].id {step.id!r} is used twice")
        seen.add(step.id)
    try:
        schedule(timings(steps), date(2000, 1, 1))
    except ScheduleError as error:
        raise ValueError(str(error)) from None
    return steps


class ProtocolCreate(BaseModel):
    code: str = Field(pattern=SLUG, examples=["tb-2hrze-4hr"])
    title: str = Field(min_length=1, max_length=200)
    description: str | None = Field(default=None, max_length=4000)
    condition: Coding | None = None
    status: Literal["draft", "active"] = "draft"
    organization_id: str | None = Field(default=None, min_length=1, max_length=64)
    supersedes_id: str | None = Field(default=None, min_length=1, max_length=64,
                                      description="The version this one replaces (retired)")
    steps: list[Step] = Field(min_length=1, max_length=100)

    @model_validator(mode="after")
    def _steps_hold(self) -> ProtocolCreate:
        _check_steps(self.steps)
        return self


class ProtocolUpdate(BaseModel):
    title: str | None = Field(default=None, min_length=1, max_length=200)
    description: str | None = Field(default=None, max_length=4000)
    condition: Coding | None = None
    status: ProtocolStatus | None = None
    steps: list[Step] | None = Field(default=None, min_length=1, max_length=100)

    @model_validator(mode="after")
    def _steps_hold(self) -> ProtocolUpdate:
        if self.steps is not None:
            _check_steps(self.steps)
        return self


class ProtocolView(BaseModel):
    id: str
    code: str | None = None
    url: str | None = None
    version: str | None = None
    title: str | None = None
    description: str | None = None
    condition: Coding | None = None
    status: str
    organization_id: str | None = None
    supersedes_id: str | None = None
    steps: list[Step] = []
    updated_at: str | None = None


class ProtocolQuery(BaseModel):
    code: Annotated[str | None, SearchParam("identifier", PROTOCOL_SYSTEM + "|{}")] = Field(
        None, max_length=64)
    status: Annotated[ProtocolStatus | None, SearchParam("status")] = None
    title: Annotated[str | None, SearchParam("title")] = Field(None, max_length=200,
                                                                description="Starts with")


class Removal(BaseModel):
    id: str
    deleted: bool
    retired: bool


def timings(steps: list[Step]) -> list[StepTiming]:
    return [StepTiming(s.id, s.after, _span(s.offset), _span(s.duration), s.repeat is not None)
            for s in steps]


def _span(duration: Duration | None) -> Span | None:
    return Span(duration.value, duration.unit) if duration is not None else None


# -- mapping --------------------------------------------------------------------------------
def _duration(value: JSON) -> JSON:
    return {"value": value["value"], "unit": value["unit"], "system": UCUM,
            "code": value["unit"]}


def _concept(coding: JSON) -> JSON:
    return {"coding": [{k: v for k, v in coding.items() if v is not None}],
            **({"text": coding["display"]} if coding.get("display") else {})}


def step_to_action(step: JSON) -> JSON:
    action: JSON = {"id": step["id"], "title": step["title"],
                    "code": [{"coding": [{"system": STEP_KINDS, "code": step["kind"]}]}]}
    if step.get("code"):
        action["code"].append(_concept(step["code"]))
    if step.get("instructions"):
        action["textEquivalent"] = step["instructions"]
    if step.get("after"):
        related: JSON = {"actionId": step["after"], "relationship": "after-end"}
        if step.get("offset"):
            related["offsetDuration"] = _duration(step["offset"])
        action["relatedAction"] = [related]
    elif step.get("offset"):
        action["extension"] = [{"url": START_OFFSET,
                                "valueDuration": _duration(step["offset"])}]
    repeat: JSON = {}
    if step.get("duration"):
        repeat["boundsDuration"] = _duration(step["duration"])
    if step.get("repeat"):
        every = step["repeat"]
        repeat.update(frequency=every.get("frequency", 1), period=every.get("period", 1),
                      periodUnit=every.get("unit", "d"))
    if repeat:
        action["timingTiming"] = {"repeat": repeat}
    return action


def _span_json(duration: JSON | None) -> JSON | None:
    if not duration or duration.get("code", duration.get("unit")) not in UNITS:
        return None
    return {"value": int(duration["value"]), "unit": duration.get("code") or duration["unit"]}


def action_to_step(action: JSON) -> JSON:
    codes = action.get("code") or []
    kind = next((c["code"] for concept in codes for c in concept.get("coding") or []
                 if c.get("system") == STEP_KINDS), "medication")
    clinical = next((c for concept in codes for c in concept.get("coding") or []
                     if c.get("system") != STEP_KINDS), None)
    related = (action.get("relatedAction") or [{}])[0]
    repeat = (action.get("timingTiming") or {}).get("repeat") or {}
    offset = related.get("offsetDuration") or next(
        (e.get("valueDuration") for e in action.get("extension") or []
         if e.get("url") == START_OFFSET), None)
    return {
        "id": action.get("id"), "title": action.get("title") or "", "kind": kind,
        "code": {k: clinical.get(k) for k in ("system", "code", "display")} if clinical
        else None,
        "instructions": action.get("textEquivalent"), "after": related.get("actionId"),
        "offset": _span_json(offset), "duration": _span_json(repeat.get("boundsDuration")),
        "repeat": {"frequency": repeat.get("frequency", 1), "period": repeat.get("period", 1),
                   "unit": repeat.get("periodUnit", "d")} if "frequency" in repeat else None,
    }


def protocol_to_fhir(payload: JSON, ctx: ApiContext | None, existing: JSON | None) -> JSON:
    plan: JSON = orjson.loads(orjson.dumps(existing)) if existing else {
        "resourceType": "PlanDefinition", "status": payload.get("status", "draft"),
        "type": {"coding": [{"system": PLAN_TYPE, "code": "clinical-protocol",
                             "display": "Clinical Protocol"}]},
        "name": payload["code"], "url": f"{PROTOCOL_SYSTEM}:{payload['code']}",
        "identifier": [{"system": PROTOCOL_SYSTEM, "value": payload["code"]}],
        "version": str(payload.get("version", "1")), "publisher": "healthplatform",
    }
    plan["date"] = now_instant()
    if payload.get("title"):
        plan["title"] = payload["title"]
    if "description" in payload:
        if payload["description"]:
            plan["description"] = payload["description"]
        else:
            plan.pop("description", None)
    if payload.get("condition"):
        plan["useContext"] = [{"code": {"system": CONTEXT_TYPE, "code": "focus"},
                               "valueCodeableConcept": _concept(payload["condition"])}]
    if payload.get("steps"):
        plan["action"] = [step_to_action(s) for s in payload["steps"]]
    if payload.get("supersedes_id") and not existing:
        plan["relatedArtifact"] = [{"type": "predecessor",
                                    "resource": f"PlanDefinition/{payload['supersedes_id']}"}]
    if payload.get("organization_id") and not existing:
        plan = with_owners(plan, {payload["organization_id"]})
    return plan


def protocol_view(plan: JSON) -> JSON:
    owners = sorted(owner_labels(plan))
    focus = next((u.get("valueCodeableConcept") for u in plan.get("useContext") or []
                  if (u.get("code") or {}).get("code") == "focus"), None)
    condition = ((focus or {}).get("coding") or [None])[0]
    predecessor = next((a.get("resource", "") for a in plan.get("relatedArtifact") or []
                        if a.get("type") == "predecessor"), "")
    return ProtocolView(
        id=plan["id"], code=plan.get("name"), url=plan.get("url"),
        version=plan.get("version"), title=plan.get("title"),
        description=plan.get("description"),
        condition=Coding(**condition) if condition else None, status=plan["status"],
        organization_id=owners[0] if owners else None,
        supersedes_id=predecessor.removeprefix("PlanDefinition/") or None,
        steps=[Step(**action_to_step(a)) for a in plan.get("action") or []],
        updated_at=(plan.get("meta") or {}).get("lastUpdated"),
    ).model_dump()


def canonical(plan: JSON) -> str:
    """What a CarePlan instantiates: ``url|version``."""
    return f"{plan['url']}|{plan.get('version', '1')}"


# -- in use ---------------------------------------------------------------------------------
USE_TAG = "urn:healthplatform:instantiated-from"


async def in_use(ctx: ApiContext, plan: JSON) -> bool:
    """Whether any patient's treatment (a CarePlan tagged with this PlanDefinition's id)
    was started from this version, whoever may see it (the treatments may be another
    organization's). Asked for a caller who may change the protocol only: another's
    change is refused by the write itself, and learns nothing here."""
    if not ctx.fhir.admitted(UPDATE, plan):
        return False
    found = await ctx.elevate("treatment protocol change: look for any treatment started "
                              "from this version").match_ids(
        "CarePlan", [("_tag", f"{USE_TAG}|{plan['id']}")], 1)
    return bool(found)


# -- create -------------------------------------------------------------------------------------
async def _prepare(ctx: ApiContext, payload: JSON) -> JSON:
    """The organization named must be the caller's; a new version takes the code and the
    next version number of the one it supersedes."""
    if payload.get("organization_id"):
        await require_organization(ctx, payload["organization_id"])
    if payload.get("supersedes_id"):
        earlier = await protocols.load(ctx, payload["supersedes_id"])
        if earlier.get("name") != payload["code"]:
            raise ApiError(422, "VALIDATION_ERROR", f"A new version keeps the code "
                           f"{earlier.get('name')!r}", field="code")
        payload["version"] = _next_version(earlier.get("version"))
        if not payload.get("organization_id"):
            payload["organization_id"] = next(iter(sorted(owner_labels(earlier))), None)
    return payload


def _next_version(version: str | None) -> str:
    if re.fullmatch(r"\d+", version or ""):
        return str(int(version or "0") + 1)
    return f"{version or '1'}.1"


async def _retire_predecessor(write: Any) -> JSON:
    """A new version retires the one it supersedes (same unit of work)."""
    if write.change == "created" and write.payload.get("supersedes_id"):
        earlier = await write.ctx.fhir.read_json("PlanDefinition",
                                                 write.payload["supersedes_id"])
        if earlier["status"] != "retired":
            retired = {**earlier, "status": "retired", "date": now_instant()}
            await write.unit.update(retired, if_match=int(earlier["meta"]["versionId"]))
            write.unit.emit(TOPIC + "retired", protocol_view(retired),
                            source_service="treatments")
    return write.resource  # type: ignore[no-any-return]


protocols = Facade(
    resource="PlanDefinition", name="Treatment protocol", create=ProtocolCreate,
    update=ProtocolUpdate, view=ProtocolView, query=ProtocolQuery,
    to_fhir=protocol_to_fhir, from_fhir=protocol_view, fixed=(("type", PROTOCOL_TYPE),),
    sort="title", statuses=PROTOCOL_STATUS, prepare=_prepare, alongside=_retire_predecessor,
    unique=Unique(lambda plan: [("url", plan["url"]), ("version", plan["version"])],
                  "PROTOCOL_EXISTS", "this code already has this version (a new version "
                  "names the one it supersedes)"),
    events=Events(created=TOPIC + "created", deleted=TOPIC + "deleted"), tags=["treatments"],
    summaries={"list": "List treatment protocols (filter by code, status, title)",
               "create": "Create a treatment protocol, or a new version of one",
               "get": "A treatment protocol with its steps"},
)
router = APIRouter(tags=["treatments"])
protocols.mount(router, "/api/treatments", ops=("list", "create", "get"))


@protocols.route("PATCH", "/{resource_id}", body=ProtocolUpdate, conflicts={
    **IN_USE, "INVALID_TRANSITION": "the status table has no such move"},
    summary="Change a treatment protocol (in use: only retire it)")
async def update_protocol(ctx: ItemContext[ProtocolUpdate]) -> JSON:
    payload = ctx.body.model_dump(exclude_unset=True) if ctx.body else {}
    plan = ctx.resource
    target = payload.pop("status", None)
    if payload and (plan["status"] == "retired" or await in_use(ctx, plan)):
        raise conflict("PROTOCOL_IN_USE" if plan["status"] != "retired"
                       else "INVALID_TRANSITION",
                       "This version is in use or retired: only its status may change; "
                       "publish a new version (POST /api/treatments with supersedes_id)")
    changed = protocol_to_fhir(payload, ctx, plan)
    if target and target != plan["status"]:
        changed = PROTOCOL_STATUS.move(changed, target)
    event = "retired" if target == "retired" and plan["status"] != "retired" else "updated"
    return await ctx.save(changed, event=TOPIC + event,
                          payload=protocol_view({**changed, "meta": plan.get("meta")}))


@router.delete("/api/treatments/{resource_id}", response_model=Envelope[Removal],
               summary="Delete a treatment protocol (retired instead once in use)")
async def delete_protocol(resource_id: str, ctx: ApiContext = Depends(api_context)) -> Any:
    async def once() -> JSON:
        plan = await protocols.load(ctx, resource_id)
        if not await in_use(ctx, plan):
            await protocols.delete_one(ctx, resource_id)
            return {"id": resource_id, "deleted": True, "retired": False}
        if plan["status"] != "retired":
            item: ItemContext[Any] = ItemContext(ctx.request, ctx.principal, ctx.services,
                                                 ctx.access, ctx.fhir, None, plan, None)
            retired = {**plan, "status": "retired", "date": now_instant()}
            await item.save(retired, event=TOPIC + "retired",
                            payload=protocol_view(retired))
        return {"id": resource_id, "deleted": False, "retired": True}
    return ok(await until_stable(once))


async def seed(services: Services, protocols_json: list[JSON]) -> None:
    """Store the shipped protocols once (conditional creates on url and version: a
    restart, or another process, finds them there)."""
    fhir = services.policy.elevate("treatment protocols: store the shipped protocols")
    for payload in protocols_json:
        plan = protocol_to_fhir(ProtocolCreate(**payload).model_dump(exclude_unset=True),
                                None, None)
        plan["status"] = payload.get("status", "active")
        async with fhir.unit() as unit:
            await unit.create(plan, expected_type="PlanDefinition", ownerless=True,
                              if_none_exist=[("url", plan["url"]),
                                             ("version", plan["version"])])
            await unit.commit()


__all__ = ["IN_USE", "PROTOCOL_SYSTEM", "USE_TAG", "ProtocolCreate", "ProtocolView",
           "action_to_step", "canonical", "in_use", "protocol_view", "protocols", "router",
           "seed", "timings"]
