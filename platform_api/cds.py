"""Clinical decision support area: CDS Hooks for EHRs and the /api/cds routes for app
clients, over the services of :mod:`cds_hooks`.

**CDS Hooks 2.0** (plain CDS Hooks JSON, not the /api envelope; errors are an
OperationOutcome naming the field):

- ``GET /cds-services``: discovery (public);
- ``POST /cds-services/{id}`` and ``POST /cds-hooks/{hook}`` (every service of the hook):
  the request is validated (:mod:`cds_hooks.models`), prefetch the client left out is
  resolved (:mod:`cds_hooks.prefetch`) and the services answer cards;
- ``POST /cds-services/{id}/feedback``: stored (:mod:`cds_hooks.feedback`).

Who may call: a CDS client's JWT (:mod:`cds_hooks.auth`, issuers of
``HEALTHPLATFORM_CDS_CLIENTS``), a platform access token (an app acting for its user),
or nobody when ``HEALTHPLATFORM_CDS_ALLOW_ANONYMOUS`` (local testing). Where prefetch
comes from: the request's ``fhirServer`` — this server's own /fhir is read in-process
with the access its ``fhirAuthorization`` token grants, another server over HTTP with
that token (for CDS clients only: an app user's call may not make this server fetch a
URL of its choosing) — else this store as the caller may see it (a user's grants; a client's
configured organizations, read-only); with none of those, missing prefetch is a 412.

**/api/cds** (the envelope):

- ``POST /api/cds/drug-interactions/check``: ``medications: [{name, rxcui}]`` (and
  optionally ``patient_id``: also against that patient's current medications) →
  ``interactions: [{severity, description, drugs, recommendation}]``;
- ``POST /api/cds/drug-interactions`` (platform administrators): upsert an entry of the
  interaction table, validated; stored as a FHIR **PlanDefinition** (mapping in
  :mod:`cds_hooks.interactions`), versioned; event ``platform.cds.interaction_changed``;
- ``POST /api/cds/early-warning-score``: NEWS2 of posted ``vitals`` or of a patient's
  latest vital-sign Observations (``patient_id``, read as the caller);
- ``POST /api/cds/panic-values/check``: ``results: [{code, value, unit}]`` against the
  panic table;
- ``GET/POST /api/cds/adverse-events``: FHIR **AdverseEvent** (mapping below);
- ``GET /api/cds/patient-risk?patient_id=``: the patient's NEWS2, active critical-result
  Flags, interactions among current medications and adverse events in one answer;
- ``GET /api/cds/feedback`` and ``GET /api/cds/feedback/summary`` (platform
  administrators): the CDS Hooks feedback received, and each service's acceptance rate.

**Panic values on every stored result**: a handler of ``platform.fhir.resource_created``
/ ``_updated`` checks each Observation (whoever wrote it: the HL7v2 gateway, /fhir, a
facade) and raises a Flag plus ``platform.cds.panic_value``
(:mod:`cds_hooks.panic_values`); idempotent: the flag's identifier is the result's, so a
redelivered event writes nothing.

AdverseEvent mapping (/api → FHIR R4)::

    patient_id        → subject (Patient/<id>)
    event, event_code → event.text, event.coding[SNOMED CT]
    actuality         → actuality (actual | potential)
    seriousness       → seriousness (adverse-event-seriousness: Non-serious, Serious,
                        SeriousResultsInDeath, ...)
    severity          → severity (adverse-event-severity: mild | moderate | severe)
    outcome           → outcome (adverse-event-outcome: resolved | recovering | ongoing |
                        resolvedWithSequelae | fatal | unknown)
    date              → date (when it happened); recorded_at → recordedDate
    encounter_id      → encounter
    suspect_entities  → suspectEntity[]: instance (a reference, or a contained Medication
                        coded with the RxNorm code, or a display), causality[].assessment
                        (adverse-event-causality-assess)
    recorded_by       → recorder.identifier (urn:healthplatform:user|<user id>)
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any, Literal

import httpx
import orjson
from fastapi import APIRouter, Depends, Query, Request
from pydantic import BaseModel, Field, model_validator

from cds_hooks import catalogue, feedback, news2
from cds_hooks.auth import ClientAccess, ClientVerifier
from cds_hooks.interactions import (
    ENTRY_SYSTEM,
    InteractionEntry,
    InteractionKnowledge,
    current_medications,
    entry_from_plan_definition,
    entry_to_plan_definition,
    seed_entries,
)
from cds_hooks.medications import RXNORM, vocabulary
from cds_hooks.models import (
    CdsError,
    CdsResponse,
    Discovery,
    FeedbackRequest,
    HookRequest,
    parse_feedback,
    parse_request,
)
from cds_hooks.panic_values import (
    FLAG_DETAIL,
    PanicTable,
    critical_flags,
    flag_critical_results,
    panic_table,
)
from cds_hooks.prefetch import FhirSource, RemoteSource, StoreSource, UnavailableSource
from fhir_server.access import Access
from fhir_server.caller import CallerFhir
from fhir_server.clock import now_instant
from platform_api import cds_prescribing
from platform_api.envelope import (
    ApiError,
    Envelope,
    JSONResponse,
    PageEnvelope,
    Pagination,
    conflict,
    created,
    ok,
    pagination,
)
from platform_api.facade import (
    ApiContext,
    Events,
    Facade,
    SearchParam,
    api_context,
    require_patient,
    staged_body,
)
from platform_api.policy import FHIR_DOOR
from platform_api.services import Services, request_services

JSON = dict[str, Any]
RUNTIME = "cds_runtime"
USER_SYSTEM = "urn:healthplatform:user"
SNOMED = "http://snomed.info/sct"
RESOURCE_EVENTS = ("platform.fhir.resource_created", "platform.fhir.resource_updated")


# -- the runtime: clients, HTTP, the invoker -------------------------------------------------------
@dataclass
class CdsRuntime:
    verifier: ClientVerifier
    http: httpx.AsyncClient
    invoker: catalogue.Invoker
    panic: PanicTable
    knowledge: InteractionKnowledge

    async def close(self) -> None:
        await self.http.aclose()
        await self.verifier.replay.close()


def cds_runtime(services: Services) -> CdsRuntime:
    runtime = services.extras.get(RUNTIME)
    if runtime is None:
        settings = services.settings
        http = httpx.AsyncClient(timeout=settings.cds_fhir_timeout_seconds)
        # One table for every check, whoever checks: the stored entries (PlanDefinitions,
        # definitions everyone may read) are read with the platform's rights.
        knowledge = InteractionKnowledge(services.policy.elevate(
            "cds: read the stored drug-interaction entries (PlanDefinitions)"))
        runtime = CdsRuntime(
            ClientVerifier.from_settings(settings.cds_clients, http,
                                         redis_url=settings.redis_url,
                                         cache_seconds=settings.cds_jwks_cache_seconds),
            http, catalogue.Invoker(knowledge, timedelta(
                hours=settings.cds_vitals_max_age_hours)),
            panic_table(settings.cds_panic_values_file), knowledge)
        services.extras[RUNTIME] = runtime
    return runtime  # type: ignore[no-any-return]


async def start_cds(services: Services) -> CdsRuntime:
    """At startup: the runtime, the prescription checks (interactions, allergies,
    duplicate therapy: :mod:`platform_api.cds_prescribing`) and the panic-value check of
    every stored Observation."""
    runtime = cds_runtime(services)
    cds_prescribing.install()
    # A background component: whoever wrote the result, the platform flags it.
    fhir = services.policy.elevate("cds panic values: read each stored Observation and "
                                   "write its critical-result Flag")

    async def check_result(event: JSON) -> None:
        payload = event.get("payload") or {}
        if payload.get("resourceType") != "Observation":
            return
        observation = await fhir.find_json("Observation", str(payload.get("id")))
        if observation is None:
            return
        await flag_critical_results(fhir, observation, runtime.panic,
                                    updated=event.get("topic") == RESOURCE_EVENTS[1])

    for topic in RESOURCE_EVENTS:
        services.bus.subscribe(topic, check_result)
    return runtime


# -- CDS Hooks: who is calling, where prefetch comes from ---------------------------------------
@dataclass
class CdsCaller:
    name: str
    access: Access | None  # what it may read from this store when no fhirServer is given
    # Whether this server may fetch prefetch from another FHIR server for it: CDS clients
    # (and anonymous local testing) name their own; an app user may not make this server
    # call arbitrary URLs (server-side request forgery).
    remote_fhir: bool = True


async def authenticate(request: Request, services: Services, runtime: CdsRuntime
                       ) -> CdsCaller:
    header = request.headers.get("authorization")
    if header is None:
        if services.settings.cds_allow_anonymous:
            return CdsCaller("anonymous", None)
        raise CdsError(401, "A CDS client's JWT is required (Authorization: Bearer <JWT>)",
                       headers={"WWW-Authenticate": "Bearer"})
    scheme, _, token = header.partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        raise CdsError(401, "Authorization must be 'Bearer <JWT>'",
                       headers={"WWW-Authenticate": "Bearer"})
    peeked = None if token.startswith("v4.") else runtime.verifier.peek(token)
    if peeked is not None:
        # the configured public URL only, never one built from the request's Host
        audiences = [services.settings.public_base_url + request.url.path]
        verified = await runtime.verifier.verify(token, audiences, peeked)
        client = verified.client
        return CdsCaller(client.iss, ClientAccess(client) if client.organizations else None)
    principal = await _platform_principal(services, token)
    return CdsCaller(principal.user_id, await services.policy.access(principal, FHIR_DOOR),
                     remote_fhir=False)


async def _platform_principal(services: Services, token: str) -> Any:
    try:
        return await services.auth.authenticate(token)
    except ApiError as exc:
        raise CdsError(401, f"The bearer token is neither a trusted CDS client's JWT nor a "
                       f"valid access token: {exc.message}",
                       headers={"WWW-Authenticate": 'Bearer error="invalid_token"'}) from None


def _this_fhir_server(url: str, request: Request, services: Services) -> bool:
    return url.rstrip("/") == services.settings.public_base_url + "/fhir"


async def prefetch_source(request: Request, services: Services, runtime: CdsRuntime,
                          caller: CdsCaller, hook: HookRequest) -> FhirSource | None:
    authorization = hook.fhirAuthorization
    token = authorization.access_token if authorization else None
    if hook.fhirServer is not None:
        if not _this_fhir_server(hook.fhirServer, request, services):
            if not caller.remote_fhir:
                return UnavailableSource("an app's call may only name this server's FHIR "
                                         "API as fhirServer")
            return RemoteSource(runtime.http, hook.fhirServer, token)
        if token is None:
            return UnavailableSource("this server's FHIR API needs fhirAuthorization")
        try:
            principal = await services.auth.authenticate(token)
        except ApiError as exc:
            return UnavailableSource(f"fhirAuthorization.access_token: {exc.message}")
        access = await services.policy.access(principal, FHIR_DOOR)
        return StoreSource(CallerFhir(services.fhir, access))
    if caller.access is not None:
        return StoreSource(CallerFhir(services.fhir, caller.access))
    return None


# -- CDS Hooks routes ----------------------------------------------------------------------------
hooks_router = APIRouter(tags=["cds-hooks"])
_HOOK_BODY = {"requestBody": {"required": True, "content": {
    "application/json": {"schema": HookRequest.model_json_schema()}}}}
_FEEDBACK_BODY = {"requestBody": {"required": True, "content": {
    "application/json": {"schema": FeedbackRequest.model_json_schema()}}}}
_OUTCOME = {"application/json": {"schema": {
    "type": "object", "description": "A FHIR OperationOutcome",
    "properties": {"resourceType": {"const": "OperationOutcome"},
                   "issue": {"type": "array", "items": {"type": "object"}}},
    "required": ["resourceType", "issue"]}}}
_ERRORS: dict[int | str, dict[str, Any]] = {
    status: {"description": description, "content": _OUTCOME} for status, description in (
        (400, "Invalid request (an OperationOutcome naming the field)"),
        (401, "No trusted CDS client JWT"),
        (404, "No such service"),
        (412, "Prefetch data missing and not obtainable"))}


async def _json_body(request: Request) -> Any:
    try:
        return orjson.loads(await request.body())
    except orjson.JSONDecodeError as exc:
        raise CdsError(400, f"The body is not JSON: {exc}") from None


async def _answer(request: Request, hook: str | None, service_id: str | None) -> JSONResponse:
    services = request_services(request)
    runtime = cds_runtime(services)
    try:
        caller = await authenticate(request, services, runtime)
        if hook is not None and not catalogue.for_hook(hook):
            raise CdsError(404, f"No CDS service answers the hook {hook!r}")
        if service_id is not None:
            catalogue.known(service_id)
        hook_request, context = parse_request(await _json_body(request), hook)
        chosen = [catalogue.service(service_id, hook_request.hook)] if service_id \
            else catalogue.for_hook(hook_request.hook)
        source = await prefetch_source(request, services, runtime, caller, hook_request)
        response = await runtime.invoker.invoke(chosen, hook_request, context, source)
    except CdsError as exc:
        return JSONResponse(exc.outcome(), status_code=exc.status, headers=exc.headers)
    return JSONResponse(response.as_json())


@hooks_router.get("/cds-services", response_model=Discovery, response_model_exclude_none=True,
                  summary="CDS Hooks discovery: the CDS services of this server")
async def discover() -> Any:
    return JSONResponse(catalogue.discovery().model_dump(exclude_none=True))


@hooks_router.post("/cds-services/{service_id}", response_model=CdsResponse,
                   response_model_exclude_none=True, responses=_ERRORS,
                   openapi_extra=_HOOK_BODY, summary="Call a CDS service (CDS Hooks 2.0)")
async def call_service(service_id: str, request: Request) -> Any:
    return await _answer(request, None, service_id)


@hooks_router.post("/cds-hooks/{hook_id}", response_model=CdsResponse,
                   response_model_exclude_none=True, responses=_ERRORS,
                   openapi_extra=_HOOK_BODY,
                   summary="Invoke a hook: every CDS service of that hook answers")
async def call_hook(hook_id: str, request: Request) -> Any:
    return await _answer(request, hook_id, None)


class FeedbackReceipt(BaseModel):
    received: int


@hooks_router.post("/cds-services/{service_id}/feedback", response_model=FeedbackReceipt,
                   responses=_ERRORS, openapi_extra=_FEEDBACK_BODY,
                   summary="Feedback on a service's cards (accepted, overridden)")
async def give_feedback(service_id: str, request: Request) -> Any:
    services = request_services(request)
    try:
        caller = await authenticate(request, services, cds_runtime(services))
        catalogue.known(service_id)
        given = parse_feedback(await _json_body(request))
        ids = await feedback.record(services.store, service_id, given, caller.name)
    except CdsError as exc:
        return JSONResponse(exc.outcome(), status_code=exc.status, headers=exc.headers)
    return JSONResponse({"received": len(ids)})


# -- /api/cds: drug interactions ----------------------------------------------------------------
router = APIRouter(tags=["cds"])
PATIENT_ID = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9\-.]{1,64}$")


class MedicationIn(BaseModel):
    name: str = Field(min_length=1, max_length=200, examples=["Warfarin Sodium 5 MG Oral Tablet"])
    rxcui: str | None = Field(default=None, pattern=r"^\d{1,10}$", examples=["855332"])


class InteractionCheck(BaseModel):
    medications: list[MedicationIn] = Field(min_length=1, max_length=50)
    patient_id: str | None = Field(default=None, min_length=1, max_length=64,
                                   description="Also check against this patient's "
                                   "active medications")


class InteractionView(BaseModel):
    severity: str
    description: str
    drugs: list[str]
    recommendation: str
    key: str
    title: str
    source: str
    version: str


class IngredientView(BaseModel):
    rxcui: str
    name: str


class CheckedMedication(BaseModel):
    name: str
    rxcui: str | None
    ingredients: list[IngredientView]
    classes: list[str]
    recognised: bool


class InteractionCheckView(BaseModel):
    interactions: list[InteractionView]
    medications: list[CheckedMedication]
    current_medications: list[str] = []


def _checked(medication: Any) -> JSON:
    vocab = vocabulary()
    return {"name": medication.name, "rxcui": medication.rxcui,
            "ingredients": [{"rxcui": i, "name": vocab.ingredient_name(i)}
                            for i in sorted(medication.ingredients)],
            "classes": sorted(medication.classes), "recognised": bool(medication.ingredients)}


@router.post("/api/cds/drug-interactions/check", response_model=Envelope[InteractionCheckView],
             summary="Check medications for drug-drug interactions")
async def check_interactions(body: InteractionCheck, ctx: ApiContext = Depends(api_context)
                             ) -> Any:
    vocab = vocabulary()
    drafts = [vocab.medication(None, name=m.name, rxcui=m.rxcui, draft=True)
              for m in body.medications]
    current = []
    if body.patient_id is not None:
        await require_patient(ctx, body.patient_id)
        current = await current_medications(ctx.fhir, body.patient_id)
    table = await cds_runtime(ctx.services).knowledge.table()
    findings = table.find(drafts, current)
    return ok({"interactions": [f.as_dict() for f in findings],
               "medications": [_checked(m) for m in drafts],
               "current_medications": [m.name for m in current]})


class InteractionEntryView(InteractionEntry):
    id: str | None = Field(description="The PlanDefinition holding it (stored entries)")
    origin: Literal["seed", "stored"]
    updated_at: str | None = None


def _entry_view(entry: InteractionEntry, plan: JSON | None) -> JSON:
    return {**entry.model_dump(), "id": plan["id"] if plan else None,
            "origin": "stored" if plan else "seed",
            "updated_at": (plan or {}).get("meta", {}).get("lastUpdated")}


@router.post("/api/cds/drug-interactions", response_model=Envelope[InteractionEntryView],
             summary="Add or change an entry of the interaction table (administrators)")
async def upsert_interaction(body: InteractionEntry, ctx: ApiContext = Depends(api_context)
                             ) -> Any:
    stored = await ctx.fhir.search("PlanDefinition", [("identifier",
                                                        f"{ENTRY_SYSTEM}|{body.key}")])
    current = stored[0] if stored else None
    seed = next((e for e in seed_entries() if e.key == body.key), None)
    previous = entry_from_plan_definition(current).version if current else \
        seed.version if seed else "0"
    entry = body.model_copy(update={"version": str(int(previous) + 1)})
    plan = entry_to_plan_definition(entry, now_instant())
    unit = ctx.unit()
    async with unit:
        if current is None:  # two administrators adding the same key at once: one wins
            staged = await unit.create(plan, expected_type="PlanDefinition", if_none_exist=[
                ("identifier", f"{ENTRY_SYSTEM}|{entry.key}")])
        else:
            staged = await unit.update({**plan, "id": current["id"]},
                                       if_match=int(current["meta"]["versionId"]))
        payload = {"key": entry.key, "version": entry.version, "severity": entry.severity,
                   "status": entry.status, "changed_by": ctx.principal.user_id}
        unit.after_writes(lambda staging: None if staged.existing else staging.emit(
            "platform.cds.interaction_changed", {**payload, "plan_definition_id": staged.id},
            source_service="cds"))
        await unit.commit()
    if staged.existing:
        raise conflict("ENTRY_CHANGED", f"The entry {entry.key!r} was added meanwhile; send "
                       "the change again")
    view = _entry_view(entry, staged_body(staged))
    return created(view) if current is None else ok(view)


@router.get("/api/cds/drug-interactions", response_model=PageEnvelope[InteractionEntryView],
            summary="The interaction table: the shipped entries and those administrators "
                    "added or changed")
async def list_interactions(
        status: Annotated[Literal["active", "retired"] | None, Query()] = None,
        page: Pagination = Depends(pagination), ctx: ApiContext = Depends(api_context)) -> Any:
    """The table a check uses (seed overlaid with the stored PlanDefinitions, by key)."""
    plans = {entry_from_plan_definition(p).key: p
             for p in await cds_runtime(ctx.services).knowledge.stored_plans()}
    table = await cds_runtime(ctx.services).knowledge.table()
    entries = sorted((e for e in table.entries if status is None or e.status == status),
                     key=lambda e: e.key)
    chosen = entries[page.offset:page.offset + page.limit]
    return page.respond([_entry_view(e, plans.get(e.key)) for e in chosen], len(entries))


# -- /api/cds: early warning score ---------------------------------------------------------------
class VitalsIn(BaseModel):
    respiration_rate: float | None = Field(default=None, ge=0, le=100, examples=[22])
    spo2: float | None = Field(default=None, ge=0, le=100, examples=[94])
    on_oxygen: bool | None = Field(default=None, description="Supplemental oxygen given")
    systolic_bp: float | None = Field(default=None, ge=0, le=400, examples=[104])
    pulse: float | None = Field(default=None, ge=0, le=350, examples=[112])
    consciousness: news2.Consciousness | None = Field(default=None, examples=["alert"])
    temperature: float | None = Field(default=None, ge=20, le=45, examples=[38.4])


class EarlyWarningRequest(BaseModel):
    vitals: VitalsIn | None = None
    patient_id: str | None = Field(default=None, min_length=1, max_length=64)
    spo2_scale: Literal[1, 2] | None = Field(default=None, description="SpO2 scale 2 for a "
                                             "prescribed target of 88-92%; default: scale 2 "
                                             "when the patient's record says so, else 1")

    @model_validator(mode="after")
    def _one_of(self) -> EarlyWarningRequest:
        if (self.vitals is None) == (self.patient_id is None):
            raise ValueError("send either vitals or patient_id")
        return self


class SubScoreView(BaseModel):
    value: Any
    score: int


class EarlyWarningView(BaseModel):
    score: int | None = Field(description="NEWS2 total; null while a parameter is missing")
    partial_total: int
    complete: bool
    missing: list[str]
    spo2_scale: int
    subscores: dict[str, SubScoreView]
    risk: str | None = Field(description="low | low-medium | medium | high")
    monitoring: str | None
    response: str | None
    based_on: str
    patient_id: str | None = None
    observations: list[str] = []
    measured_at: str | None = None


async def patient_news2(ctx: ApiContext, patient_id: str, scale: int | None = None) -> JSON:
    """NEWS2 of the patient's recent vital signs, read as the caller."""
    now = datetime.now(UTC)
    max_age = timedelta(hours=ctx.services.settings.cds_vitals_max_age_hours)
    since = (now - max_age).strftime("%Y-%m-%dT%H:%M:%SZ")
    observations = await ctx.fhir.search("Observation", [
        ("subject", f"Patient/{patient_id}"), ("category", "vital-signs"),
        ("date", f"ge{since}"), ("_sort", "-date")])
    vitals = news2.vitals_from_observations(observations, now=now, max_age=max_age)
    if scale is None:
        codes = news2.tables()["scale_2_conditions"]["codes"]
        scale = news2.spo2_scale(await ctx.fhir.search("Condition", [
            ("subject", f"Patient/{patient_id}"), ("code", ",".join(codes))]))
    return {**news2.score(vitals, scale).as_dict(), "patient_id": patient_id,
            "observations": vitals.based_on, "measured_at": vitals.measured_at}


@router.post("/api/cds/early-warning-score", response_model=Envelope[EarlyWarningView],
             summary="NEWS2 early warning score of posted vitals or of a patient")
async def early_warning_score(body: EarlyWarningRequest,
                              ctx: ApiContext = Depends(api_context)) -> Any:
    if body.patient_id is not None:
        await require_patient(ctx, body.patient_id)
        return ok(await patient_news2(ctx, body.patient_id, body.spo2_scale))
    assert body.vitals is not None
    vitals = news2.Vitals(**body.vitals.model_dump())
    return ok(news2.score(vitals, body.spo2_scale or 1).as_dict())


# -- /api/cds: panic values ----------------------------------------------------------------------
class ResultIn(BaseModel):
    code: str = Field(pattern=r"^\d{1,7}-\d$", description="LOINC code", examples=["2823-3"])
    value: float = Field(examples=[6.9])
    unit: str | None = Field(default=None, max_length=40, examples=["mmol/L"])


class PanicCheckRequest(BaseModel):
    results: list[ResultIn] = Field(min_length=1, max_length=200)


class PanicFindingView(BaseModel):
    code: str
    known: bool = Field(description="The table has limits for this code")
    display: str | None = None
    value: float
    unit: str | None = None
    critical: bool
    direction: str | None = Field(default=None, description="low | high")
    limit: float | None = None
    limit_unit: str | None = None
    comparable: bool = True
    low: float | None = None
    high: float | None = None


class PanicCheckView(BaseModel):
    critical: bool
    results: list[PanicFindingView]
    source: str


@router.post("/api/cds/panic-values/check", response_model=Envelope[PanicCheckView],
             summary="Check lab results against the critical (panic) value table")
async def check_panic_values(body: PanicCheckRequest, ctx: ApiContext = Depends(api_context)
                             ) -> Any:
    table = cds_runtime(ctx.services).panic
    views = []
    for result in body.results:
        finding = table.check(result.code, result.value, result.unit)
        views.append({**finding.as_dict(), "known": True} if finding else {
            "code": result.code, "known": False, "value": result.value, "unit": result.unit,
            "critical": False})
    return ok({"critical": any(v["critical"] for v in views), "results": views,
               "source": table.source})


# -- /api/cds: adverse events --------------------------------------------------------------------
SERIOUSNESS = {
    "non-serious": "Non-serious", "serious": "Serious", "death": "SeriousResultsInDeath",
    "life-threatening": "SeriousIsLifeThreatening",
    "hospitalization": "SeriousResultsInHospitalization",
    "disability": "SeriousResultsInPersistentOrSignificantDisability",
    "congenital-anomaly": "SeriousResultsInCongenitalAnomaly",
    "requires-intervention": "SeriousRequiresPreventImpairment",
}
CAUSALITY = {"certain": "Certain", "probable": "Probably-Likely", "possible": "Possible",
             "unlikely": "Unlikely", "conditional": "Conditional-Classified",
             "unassessable": "Unassessable-Unclassifiable"}
TERMINOLOGY = "http://terminology.hl7.org/CodeSystem/"
Seriousness = Literal["non-serious", "serious", "death", "life-threatening", "hospitalization",
                      "disability", "congenital-anomaly", "requires-intervention"]
Causality = Literal["certain", "probable", "possible", "unlikely", "conditional",
                    "unassessable"]
Outcome = Literal["resolved", "recovering", "ongoing", "resolvedWithSequelae", "fatal",
                  "unknown"]
SUSPECT_REFERENCE = (r"^(Medication|MedicationAdministration|MedicationStatement|Immunization|"
                     r"Procedure|Substance|Device)/[A-Za-z0-9\-.]{1,64}$")
FHIR_DATE = r"^\d{4}-\d{2}-\d{2}(T\d{2}:\d{2}(:\d{2}(\.\d+)?)?(Z|[+-]\d{2}:\d{2}))?$"


class SuspectEntity(BaseModel):
    name: str = Field(min_length=1, max_length=200, examples=["Co-trimoxazole 960 mg tablet"])
    rxcui: str | None = Field(default=None, pattern=r"^\d{1,10}$")
    reference: str | None = Field(default=None, pattern=SUSPECT_REFERENCE,
                                  examples=["MedicationAdministration/4f1c"])
    causality: Causality | None = None


class AdverseEventCreate(BaseModel):
    patient_id: str = Field(min_length=1, max_length=64)
    event: str = Field(min_length=1, max_length=500, examples=["Generalised maculopapular rash"])
    event_code: str | None = Field(default=None, pattern=r"^\d{6,18}$",
                                   description="SNOMED CT code", examples=["271807003"])
    actuality: Literal["actual", "potential"] = "actual"
    seriousness: Seriousness = "non-serious"
    severity: Literal["mild", "moderate", "severe"] | None = None
    outcome: Outcome | None = None
    date: str | None = Field(default=None, pattern=FHIR_DATE, examples=["2026-03-02T09:30:00Z"])
    encounter_id: str | None = Field(default=None, min_length=1, max_length=64)
    suspect_entities: list[SuspectEntity] = Field(default=[], max_length=20)


class AdverseEventView(BaseModel):
    id: str
    patient_id: str | None = None
    event: str | None = None
    event_code: str | None = None
    actuality: str
    seriousness: str | None = None
    severity: str | None = None
    outcome: str | None = None
    date: str | None = None
    recorded_at: str | None = None
    recorded_by: str | None = None
    encounter_id: str | None = None
    suspect_entities: list[SuspectEntity] = []


class AdverseEventQuery(BaseModel):
    patient_id: Annotated[str | None, SearchParam("subject", "Patient/{}")] = Field(
        None, max_length=64)
    seriousness: Annotated[Seriousness | None, SearchParam("seriousness")] = None


def _coded(system: str, code: str) -> JSON:
    return {"coding": [{"system": TERMINOLOGY + system, "code": code}]}


def _suspect(entity: JSON, index: int, contained: list[JSON]) -> JSON:
    if entity.get("reference"):
        instance: JSON = {"reference": entity["reference"], "display": entity["name"]}
    elif entity.get("rxcui"):
        medication_id = f"suspect-{index}"
        contained.append({"resourceType": "Medication", "id": medication_id, "code": {
            "coding": [{"system": RXNORM, "code": entity["rxcui"]}], "text": entity["name"]}})
        instance = {"reference": f"#{medication_id}", "display": entity["name"]}
    else:
        instance = {"display": entity["name"]}
    suspect: JSON = {"instance": instance}
    if entity.get("causality"):
        suspect["causality"] = [{"assessment": _coded(
            "adverse-event-causality-assess", CAUSALITY[entity["causality"]])}]
    return suspect


def adverse_event_to_fhir(payload: JSON, ctx: ApiContext, existing: JSON | None) -> JSON:
    event: JSON = {"text": payload["event"]}
    if payload.get("event_code"):
        event["coding"] = [{"system": SNOMED, "code": payload["event_code"]}]
    contained: list[JSON] = []
    resource: JSON = {
        "resourceType": "AdverseEvent", "actuality": payload.get("actuality", "actual"),
        "subject": {"reference": f"Patient/{payload['patient_id']}"}, "event": event,
        "seriousness": _coded("adverse-event-seriousness",
                              SERIOUSNESS[payload.get("seriousness", "non-serious")]),
        "recordedDate": now_instant(),
        "recorder": {"identifier": {"system": USER_SYSTEM, "value": ctx.principal.user_id},
                     "display": ctx.principal.email or ctx.principal.user_id},
        "suspectEntity": [_suspect(e, i, contained) for i, e in
                          enumerate(payload.get("suspect_entities") or [], 1)],
    }
    for element, system in (("severity", "adverse-event-severity"),
                            ("outcome", "adverse-event-outcome")):
        if payload.get(element):
            resource[element] = _coded(system, payload[element])
    if payload.get("date"):
        resource["date"] = payload["date"]
    if payload.get("encounter_id"):
        resource["encounter"] = {"reference": f"Encounter/{payload['encounter_id']}"}
    if contained:
        resource["contained"] = contained
    if not resource["suspectEntity"]:
        del resource["suspectEntity"]
    return resource


def _code_of(concept: JSON | None) -> str | None:
    return ((concept or {}).get("coding") or [{}])[0].get("code")


def _local(reference: JSON | None, kind: str) -> str | None:
    ref = str((reference or {}).get("reference") or "")
    return ref[len(kind) + 1:] if ref.startswith(kind + "/") else None


def adverse_event_from_fhir(resource: JSON) -> JSON:
    contained = {f"#{c.get('id')}": c for c in resource.get("contained") or []}
    suspects: list[SuspectEntity] = []
    for suspect in resource.get("suspectEntity") or []:
        instance = suspect.get("instance") or {}
        ref = instance.get("reference")
        medication = contained.get(ref or "")
        causality = _code_of(((suspect.get("causality") or [{}])[0]).get("assessment"))
        suspects.append(SuspectEntity.model_construct(
            name=instance.get("display") or ref or "unnamed",
            rxcui=_code_of((medication or {}).get("code")),
            reference=ref if ref and not ref.startswith("#") else None,
            causality=next((k for k, v in CAUSALITY.items() if v == causality), None)))
    seriousness = _code_of(resource.get("seriousness"))
    return AdverseEventView(
        id=resource["id"], patient_id=_local(resource.get("subject"), "Patient"),
        event=(resource.get("event") or {}).get("text"),
        event_code=_code_of(resource.get("event")), actuality=resource["actuality"],
        seriousness=next((k for k, v in SERIOUSNESS.items() if v == seriousness), seriousness),
        severity=_code_of(resource.get("severity")), outcome=_code_of(resource.get("outcome")),
        date=resource.get("date"), recorded_at=resource.get("recordedDate"),
        recorded_by=((resource.get("recorder") or {}).get("identifier") or {}).get("value"),
        encounter_id=_local(resource.get("encounter"), "Encounter"),
        suspect_entities=suspects).model_dump()


async def _visible_patient(ctx: ApiContext, payload: JSON) -> JSON:
    await require_patient(ctx, payload["patient_id"])
    return payload


adverse_events = Facade(
    resource="AdverseEvent", name="Adverse event", create=AdverseEventCreate,
    view=AdverseEventView, query=AdverseEventQuery, to_fhir=adverse_event_to_fhir,
    from_fhir=adverse_event_from_fhir, prepare=_visible_patient, sort="-_lastUpdated",
    events=Events(created="platform.cds.adverse_event_recorded"), tags=["cds"],
    summaries={"list": "Adverse events (all you may see, or one patient's)",
               "create": "Record an adverse event (FHIR AdverseEvent)"},
)
adverse_events.mount(router, "/api/cds/adverse-events", ops=("list", "create"))


# -- /api/cds: patient risk --------------------------------------------------------------------
class CriticalFlagView(BaseModel):
    id: str
    summary: str
    since: str | None = None
    observation: str | None = None


class PatientRiskView(BaseModel):
    patient_id: str
    level: Literal["low", "medium", "high"] = Field(
        description="high: NEWS2 high, an active critical result or a high/critical "
                    "interaction; medium: NEWS2 medium or low-medium, a moderate interaction "
                    "or a serious adverse event; else low")
    early_warning: EarlyWarningView
    critical_flags: list[CriticalFlagView]
    interaction_alerts: list[InteractionView]
    current_medications: list[str]
    adverse_events: list[AdverseEventView]


def _flag_view(flag: JSON) -> JSON:
    observation = next((e["valueReference"].get("reference") for e in flag.get("extension") or []
                        if e.get("url") == FLAG_DETAIL and e.get("valueReference")), None)
    return {"id": flag["id"], "summary": (flag.get("code") or {}).get("text") or "Critical result",
            "since": (flag.get("period") or {}).get("start"), "observation": observation}


def risk_level(warning: JSON, flags: list[JSON], interactions: list[JSON],
               events: list[JSON]) -> str:
    if warning.get("risk") == "high" or flags \
            or any(i["severity"] in ("critical", "high") for i in interactions):
        return "high"
    if warning.get("risk") in ("medium", "low-medium") or interactions \
            or any(e.get("seriousness") not in (None, "non-serious") for e in events):
        return "medium"
    return "low"


@router.get("/api/cds/patient-risk", response_model=Envelope[PatientRiskView],
            summary="A patient's warning score, critical results, interactions and "
                    "adverse events in one answer")
async def patient_risk(patient_id: Annotated[str, Query(min_length=1, max_length=64)],
                       ctx: ApiContext = Depends(api_context)) -> Any:
    await require_patient(ctx, patient_id)
    subject = f"Patient/{patient_id}"
    warning = await patient_news2(ctx, patient_id)
    flags = critical_flags(await ctx.fhir.search("Flag", [("subject", subject)]))
    current = await current_medications(ctx.fhir, patient_id)
    table = await cds_runtime(ctx.services).knowledge.table()
    interactions = [f.as_dict() for f in table.find(current)]
    events, _ = await adverse_events.search(ctx, Pagination(1, 20), [("subject", subject)])
    event_views = [adverse_event_from_fhir(e) for e in events]
    return ok({"patient_id": patient_id,
               "level": risk_level(warning, flags, interactions, event_views),
               "early_warning": warning, "critical_flags": [_flag_view(f) for f in flags],
               "interaction_alerts": interactions,
               "current_medications": [m.name for m in current],
               "adverse_events": event_views})


# -- /api/cds: feedback (administrators) ---------------------------------------------------------
class FeedbackSummaryView(BaseModel):
    service_id: str
    cards_with_feedback: int
    accepted: int
    overridden: int
    acceptance_rate: float | None = Field(description="accepted / cards with feedback")
    override_reasons: dict[str, Any]
    feedback_entries: int


class FeedbackEntryView(BaseModel):
    id: str
    service_id: str
    card: str
    outcome: str
    accepted_suggestions: list[str] = []
    override_system: str | None = None
    override_code: str | None = None
    override_display: str | None = None
    user_comment: str | None = None
    outcome_timestamp: str
    client: str
    received_at: str


@router.get("/api/cds/feedback/summary", response_model=Envelope[list[FeedbackSummaryView]],
            summary="Acceptance rate of each CDS service's cards (administrators)")
async def feedback_summary(ctx: ApiContext = Depends(api_context)) -> Any:
    ctx.authorize("cds.feedback.read")
    return ok(await feedback.summary(ctx.services.store, [s.id for s in catalogue.SERVICES]))


@router.get("/api/cds/feedback", response_model=PageEnvelope[FeedbackEntryView],
            summary="CDS Hooks feedback received, newest first (administrators)")
async def feedback_entries(
        service_id: Annotated[str | None, Query(max_length=64)] = None,
        page: Pagination = Depends(pagination), ctx: ApiContext = Depends(api_context)) -> Any:
    ctx.authorize("cds.feedback.read")
    found, total = await feedback.entries(ctx.services.store, service_id, limit=page.limit,
                                          offset=page.offset)
    return page.respond(found, total)
