"""The clinical audit trail: FHIR **AuditEvent** for every read and write of clinical
data, for events apps report, and the queries over them.

**Recorded by the platform.** The FHIR service tells its access listeners of every read,
search and write any caller made (and every refusal), whichever door it came through
(/fhir, bundles, /api): :class:`ClinicalAudit` notes those that touch clinical data (the
Patient and every type of its compartment, AuditEvent itself aside) together with who,
from where (the client's address and user agent) and when, and appends them to the audit
log (:mod:`fhir_server.audit_log`: its own file and writer, not the clinical store) in
batches (every ``HEALTHPLATFORM_CLINICAL_AUDIT_FLUSH_SECONDS`` or ``…_BATCH`` events),
building the log's entries itself (:meth:`ClinicalAudit.entries_of`), so a request pays
for a note in memory, not for a write (``bench/fhir_crud.py`` measures it); what one
request read (a patient, then the record) is one AuditEvent with several entities. A
process that dies loses at most the last second's notes. Workflow actions the policy
refused and its elevations are noted too. The platform's own work (the HL7 gateway,
workers) acts as the system and is not recorded here; auth events have their own trail
(:mod:`platform_api.audit`). The recorder also applies the log's retention
(``HEALTHPLATFORM_AUDIT_RETENTION_DAYS``: export, then purge).

Mapping (AuditEvent element ← what happened):

    type        DICOM 110110 Patient Record for an app's report; audit-event-type
                ``rest`` (RESTful Operation) for what the platform records
    subtype     restful-interaction read | search-type | create | update | delete, or the
                app's own code (urn:healthplatform:audit-subtype, e.g. print, export)
    action      C | R | U | D | E
    recorded    when (``occurred_at`` of a report is ``period.start``)
    outcome     0 success, 4 minor failure (a refusal), 8 serious, 12 major failure
    outcomeDesc the refusal's reason, or the report's description
    agent       who: the user (identifier urn:healthplatform:user|<id>, e-mail, humanuser),
                an API key (DCM 110150 Application) acting for its owner, or a SMART app
                (urn:healthplatform:smart-client|<client id>); ``network`` the client's
                address; ``purposeOfUse`` of a report (v3 PurposeOfUse, e.g. ETREAT)
    source      this service (security-source-type 4 Application Server), the request id
    entity      the resource (audit-entity-type 2 System Object, object-role 4 Domain
                Resource, its version in ``detail``) and each patient concerned (type 1
                Person, role 1 Patient); a search's query in ``entity.query``; the
                request's X-Request-ID (urn:healthplatform:request-id)
    meta.security  the organizations owning the resources: their ORG:ADMINs read it

Who reads the trail: the access policy's ``audit`` category (an organization's
ORG:ADMIN for what it owns; platform administrators everything). ``POST
/api/clinical/audit``: any signed-in user about a resource they may read (the agent is
always the caller: nobody records in another's name); event
``platform.clinical.audit_recorded``.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Annotated, Any, Literal, NamedTuple

import orjson
from fastapi import APIRouter, Depends
from pydantic import BaseModel, Field

from fhir_server.audit_log.entry import Entry, render, sortable, token_key
from fhir_server.audit_log.migration import move_stored_events
from fhir_server.audit_log.retention import Expired, expire
from fhir_server.clock import now_instant
from fhir_server.ids import new_id
from fhir_server.ownership import OWNER_SYSTEM, owner_labels, with_owners
from fhir_server.store import ResourceGone, ResourceNotFound, StoredResource
from fhir_server.validation import is_resource_type
from platform_api.audit import (
    API_KEY_SYSTEM,
    DCM,
    ENTITY_TYPE,
    OBJECT_ROLE,
    ROLE_TYPE,
    SERVICE_SYSTEM,
    SOURCE_TYPE,
)
from platform_api.auth.principal import Principal
from platform_api.client_origin import client_origin
from platform_api.envelope import ApiError, Envelope, created, not_found
from platform_api.facade import ApiContext, Facade, SearchParam, api_context
from platform_api.observability import request_id_var, request_scope_var
from platform_api.policy import Elevation, PolicyAccess, Refusal
from platform_api.services import Services
from platform_api.sessions.common import USER_SYSTEM, coding

log = logging.getLogger("healthplatform.clinical_audit")
JSON = dict[str, Any]
EVENT_TYPE = "http://terminology.hl7.org/CodeSystem/audit-event-type"
INTERACTION = "http://hl7.org/fhir/restful-interaction"
SUBTYPES = "urn:healthplatform:audit-subtype"
SMART_CLIENT = "urn:healthplatform:smart-client"
REQUEST_SYSTEM = "urn:healthplatform:request-id"
PURPOSE = "http://terminology.hl7.org/CodeSystem/v3-ActReason"
RECORDED = "platform.clinical.audit_recorded"
AUDIT = "sessions.clinical_audit"
ACTIONS = {"create": "C", "read": "R", "search": "R", "update": "U", "delete": "D"}
INTERACTIONS = {"search": "search-type"}
OUTCOMES = {"success": "0", "minor_failure": "4", "serious_failure": "8",
            "major_failure": "12"}
OUTCOME_NAMES = {code: name for name, code in OUTCOMES.items()}
ACTION_NAMES = {"C": "create", "R": "read", "U": "update", "D": "delete", "E": "execute"}
MAX_PATIENTS = 50  # patient entities of one event
MAX_ENTITIES = 100  # resource entities of one event (a transaction may write more)


# --- what a request leaves behind -----------------------------------------------------------


class Note(NamedTuple):
    """What a request leaves behind: a tuple (made in C; a frozen dataclass's fields are
    set one call each, and this is on every request's path)."""

    principal: Principal
    interaction: str
    resources: Sequence[Any]  # StoredResource, or a dict (a refused write)
    refusal: str | None
    recorded: float  # time.time(): formatted in the batch, not on the request's path
    address: str | None
    user_agent: str | None
    request_id: str | None
    description: str | None = None  # an elevation's reason


# The agent of the platform's own elevations (components working for no caller).
PLATFORM = Principal(user_id="platform", kind="platform")
ELEVATION = "elevation"


def _client() -> tuple[str | None, str | None]:
    """Where the request came from: the client's address (behind a trusted proxy, the
    one it forwarded: what the access log says too) and its user agent."""
    scope = request_scope_var.get()
    if scope is None:
        return None, None
    agent = next((v.decode("latin-1")[:200] for k, v in scope.get("headers") or ()
                  if k == b"user-agent"), None)
    return client_origin(scope).address, agent


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class _Instants:
    """``time.time()`` values as FHIR instants to the millisecond, the date and time of
    each second formatted once (the notes of a batch share a few seconds)."""

    def __init__(self) -> None:
        self._second = -1
        self._text = ""

    def __call__(self, moment: float) -> str:
        second = int(moment)
        if second != self._second:
            self._second = second
            self._text = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
        return f"{self._text}.{int((moment - second) * 1000):03d}Z"


def _type_of(resource: Any) -> str:
    if isinstance(resource, StoredResource):
        return resource.resource_type
    return str(resource.get("resourceType"))


class ClinicalAudit:
    """Notes clinical reads and writes on the request's path, writes them in batches."""

    def __init__(self, services: Services):
        self.services = services
        self.settings = services.settings
        self._notes: list[Note] = []
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._retention: asyncio.Task[None] | None = None
        self._migration: asyncio.Task[None] | None = None
        self._types: tuple[str, frozenset[str]] | None = None

    def clinical_types(self) -> frozenset[str]:
        registry = self.services.fhir.registry
        if self._types is None or self._types[0] != registry.version:
            types = {"Patient", *registry.compartment_types("Patient")} - {"AuditEvent"}
            self._types = (registry.version, frozenset(types))
        return self._types[1]

    # -- on the request's path -----------------------------------------------------------
    def note(self, access: Any, interaction: str, resources: Sequence[Any],
             refusal: str | None) -> None:
        if not isinstance(access, PolicyAccess):
            return  # the platform itself
        clinical = self.clinical_types()
        kept = [r for r in resources if _type_of(r) in clinical]
        if not kept:
            return
        address, agent = _client()
        self._notes.append(Note(access.subject.principal, interaction, kept, refusal,
                                time.time(), address, agent, request_id_var.get()))
        if len(self._notes) >= self.settings.clinical_audit_batch:
            self._wake.set()

    def refused(self, refusal: Refusal) -> None:
        """A workflow action the policy refused (an AuditEvent with outcome 4)."""
        address, agent = _client()
        self._notes.append(Note(refusal.principal, f"workflow:{refusal.action}", (),
                                refusal.message, time.time(), address, agent,
                                request_id_var.get()))

    def elevated(self, elevation: Elevation) -> None:
        """The platform acting with its own rights, for whom and why."""
        address, agent = _client()
        self._notes.append(Note(elevation.principal or PLATFORM, ELEVATION, (),
                                None, time.time(), address, agent, request_id_var.get(),
                                elevation.reason))

    # -- in the background -----------------------------------------------------------------

    def start(self) -> None:
        """Record (unless ``clinical_audit`` is off) and apply the log's retention."""
        if self.settings.clinical_audit:
            self.services.fhir.add_access_listener(self.note)
            self.services.policy.add_refusal_listener(self.refused)
            self.services.policy.add_elevation_listener(self.elevated)
            self._task = asyncio.create_task(self._run(), name="clinical-audit")
        if self.settings.audit_retention_days > 0:
            self._retention = asyncio.create_task(self._expire(), name="audit-retention")
        self._migration = asyncio.create_task(self._move(), name="audit-log-migration")

    async def _move(self) -> None:
        try:
            await move_stored_events(self.services.fhir)
        except Exception:
            log.exception("could not move the store's AuditEvents into the audit log")

    async def stop(self) -> None:
        for task in (self._task, self._retention, self._migration):
            if task is not None:
                task.cancel()
                try:
                    await task
                except asyncio.CancelledError:
                    pass
        self._task = self._retention = self._migration = None
        await self.flush()

    async def _run(self) -> None:
        while True:
            try:
                await asyncio.wait_for(self._wake.wait(),
                                       self.settings.clinical_audit_flush_seconds)
            except TimeoutError:
                pass
            self._wake.clear()
            try:
                await self.flush()
            except Exception:
                log.exception("could not write the clinical audit events")

    async def _expire(self) -> None:
        while True:
            try:
                await self.expire()
            except Exception:
                log.exception("could not apply the audit log's retention")
            await asyncio.sleep(self.settings.audit_retention_check_seconds)

    async def expire(self, now: datetime | None = None) -> Expired | None:
        """Export the AuditEvents past the retention to the archive, then remove them."""
        settings = self.settings
        archive = settings.audit_archive_dir or settings.data_dir / "audit-archive"
        return await expire(self.services.fhir, settings.audit_retention_days, archive, now)

    async def flush(self) -> int:
        """Write what was noted so far to the audit log; how many AuditEvents."""
        notes, self._notes = self._notes, []
        if not notes:
            return 0
        try:
            entries = self.entries_of(notes)
            await self.services.fhir.sources["AuditEvent"].log.append(entries)
        except Exception:
            self._notes[:0] = notes  # kept for the next pass: an audit record is not dropped
            raise
        return len(entries)

    def events_of(self, notes: Sequence[Note]) -> list[JSON]:
        """The AuditEvents of ``notes`` (as :meth:`entries_of` writes them)."""
        return [orjson.loads(render(e.id, e.logged, e.body)) for e in self.entries_of(notes)]

    def entries_of(self, notes: Sequence[Note]) -> list[Entry]:
        """One AuditEvent per request, interaction and outcome: the resources one /api
        request read (the patient, then the record) are the entities of one event. Built
        straight into the log's entries (their keys from what the notes say, the shared
        parts of the events made once a batch): the batch's cost is paid by the server
        beside the requests it records."""
        batch = _Batch(self.settings.service_name, self.services.fhir.compartments)
        groups: dict[tuple[Any, ...], tuple[Note, dict[tuple[Any, ...], Facts]]] = {}
        for note in notes:
            key: tuple[Any, ...] = (id(note),) if note.request_id is None else (
                note.request_id, note.principal.user_id, note.interaction, note.refusal,
                note.description)
            _first, resources = groups.setdefault(key, (note, {}))
            for resource in note.resources:
                facts = batch.facts(resource)
                resources.setdefault((facts.type, facts.id, facts.version), facts)
        logged = now_instant()
        return [self._entry(batch, note, list(resources.values()), logged)
                for note, resources in groups.values()]

    def _entry(self, batch: _Batch, note: Note, resources: list[Facts], logged: str
               ) -> Entry:
        search = note.interaction == "search"
        patients: list[str] = []
        owners: set[str] = set()
        refused_write = bool(note.refusal) and bool(note.resources) and isinstance(
            note.resources[0], dict)
        for resource in resources:
            owners |= resource.owners
            if refused_write:
                # A refused write: it names patients the writer may not see, and the event
                # is its own organization's to read; the resource entity says what it was.
                continue
            for patient_id in resource.patients:
                if patient_id not in patients:
                    patients.append(patient_id)
        keys: list[str] = []
        entities: list[JSON] = []
        if search:
            kinds = sorted({r.type for r in resources})
            entities.append({
                "type": SYSTEM_OBJECT, "role": QUERY_ROLE,
                "query": base64.b64encode(",".join(kinds).encode()).decode("ascii"),
                "description": f"{len(resources)} resources"})
        else:
            for resource in resources[:MAX_ENTITIES]:
                entity, entity_keys = batch.entity(resource)
                entities.append(entity)
                keys += entity_keys
        for patient_id in patients[:MAX_PATIENTS]:
            entity, entity_keys = batch.patient(patient_id)
            entities.append(entity)
            keys += entity_keys
        if note.request_id:  # in the event, not a key (fhir_server.audit_log.entry)
            entities.append(_request_entity(note.request_id))
        agents, agent_keys = batch.agents(note.principal, note.address, note.user_agent)
        kind, subtype, kind_keys = batch.kinds(note.interaction)
        outcome = "4" if note.refusal else "0"
        action = ACTIONS.get(note.interaction, "E")
        event: JSON = {"resourceType": "AuditEvent"}
        if owners:
            event["meta"], owner_keys = batch.owners(frozenset(owners))
            keys += owner_keys
        recorded = batch.instant(note.recorded)
        event.update(type=kind, subtype=[subtype], action=action, recorded=recorded,
                     outcome=outcome, agent=agents, source=batch.source, entity=entities)
        description = note.refusal or note.description
        if description:
            event["outcomeDesc"] = description[:1000]
        return Entry(batch.new_id(), sortable(recorded), logged, action, outcome,
                     batch.type_of(kind), tuple(dict.fromkeys([*keys, *agent_keys,
                                                               *kind_keys])),
                     orjson.dumps(event))


SYSTEM_OBJECT = coding(ENTITY_TYPE, "2", "System Object")
QUERY_ROLE = coding(OBJECT_ROLE, "24", "Query")
DOMAIN_RESOURCE = coding(OBJECT_ROLE, "4", "Domain Resource")
PERSON = coding(ENTITY_TYPE, "1", "Person")
PATIENT_ROLE = coding(OBJECT_ROLE, "1", "Patient")


@dataclass(frozen=True, slots=True)
class Facts:
    """What an event says of one resource it records."""

    type: str
    id: str
    version: Any
    owners: frozenset[str]
    patients: tuple[str, ...]  # sorted


class _Batch:
    """What the events of one batch share, made once: the facts of each resource version
    (read often within a second: a patient's record by the ward), the agents of each
    caller (and their keys), the type and subtype of each interaction, the source."""

    def __init__(self, service: str, compartments: Any):
        self.service = service
        self.compartments = compartments
        self.source = _source(service)
        self.instant = _Instants()
        self._agents: dict[tuple[Any, ...], tuple[list[JSON], list[str]]] = {}
        self._kinds: dict[str, tuple[JSON, JSON, list[str]]] = {}
        self._facts: dict[tuple[str, str, int], Facts] = {}
        self._entities: dict[tuple[str, str, Any], tuple[JSON, list[str]]] = {}
        self._patients: dict[str, tuple[JSON, list[str]]] = {}
        self._owners: dict[frozenset[str], tuple[JSON, list[str]]] = {}
        self._id, self._count = new_id(), 0

    def new_id(self) -> str:
        """The batch's id, then a number: unique, in order, and no UUID made per event."""
        self._count += 1
        return f"{self._id}-{self._count:x}"

    def type_of(self, kind: JSON) -> str:
        return f"{kind['code']}|{kind['system']}"

    def entity(self, resource: Facts) -> tuple[JSON, list[str]]:
        """The entity of a resource version and its keys (shared by the batch's events:
        they are written, never changed)."""
        key = (resource.type, resource.id, resource.version)
        found = self._entities.get(key)
        if found is None:
            reference = f"{resource.type}/{resource.id}"
            entity: JSON = {"what": {"reference": reference}, "type": SYSTEM_OBJECT,
                            "role": DOMAIN_RESOURCE}
            if resource.version:
                entity["detail"] = [{"type": "versionId", "valueString": str(resource.version)}]
            keys = [f"entity={reference}"]
            if resource.type == "Patient":
                keys.append(f"patient={reference}")
            found = self._entities[key] = (entity, keys)
        return found

    def patient(self, patient_id: str) -> tuple[JSON, list[str]]:
        found = self._patients.get(patient_id)
        if found is None:
            found = self._patients[patient_id] = (_patient_entity(patient_id), [
                f"entity=Patient/{patient_id}", f"patient=Patient/{patient_id}"])
        return found

    def owners(self, owners: frozenset[str]) -> tuple[JSON, list[str]]:
        found = self._owners.get(owners)
        if found is None:
            found = self._owners[owners] = (
                {"security": [{"system": OWNER_SYSTEM, "code": o} for o in sorted(owners)]},
                [token_key("_security", o, OWNER_SYSTEM) for o in sorted(owners)])
        return found

    def facts(self, resource: Any) -> Facts:
        if isinstance(resource, dict):  # a refused write: as it was sent
            return self._facts_of(resource)
        key = (resource.resource_type, resource.id, resource.version)
        found = self._facts.get(key)
        if found is None:
            found = self._facts[key] = self._facts_of(_content(resource))
        return found

    def _facts_of(self, content: JSON) -> Facts:
        version = content.get("_version") or (content.get("meta") or {}).get("versionId")
        return Facts(str(content.get("resourceType")), str(content.get("id")), version,
                     owner_labels(content), tuple(sorted(self.compartments.patients_of(
                         content))))

    def agents(self, principal: Principal, address: str | None, user_agent: str | None
               ) -> tuple[list[JSON], list[str]]:
        key = (principal.kind, principal.user_id, principal.email, principal.roles,
               principal.token_id, principal.smart.client_id if principal.smart else None,
               address, user_agent)
        found = self._agents.get(key)
        if found is None:
            agents = _agents(principal, address, user_agent)
            keys: list[str] = []
            for agent in agents:
                identifier = agent["who"]["identifier"]
                keys.append(token_key("agent:identifier", identifier["value"],
                                      identifier["system"]))
            found = self._agents[key] = (agents, keys)
        return found

    def kinds(self, interaction: str) -> tuple[JSON, JSON, list[str]]:
        found = self._kinds.get(interaction)
        if found is None:
            code = INTERACTIONS.get(interaction, interaction)
            restful = interaction in ACTIONS
            subtype = coding(INTERACTION, code, code) if restful else coding(
                SUBTYPES, code, code.replace(":", " "))
            kind = coding(EVENT_TYPE, "rest", "RESTful Operation") if restful else coding(
                DCM, "110113", "Security Alert")
            keys = [token_key("subtype", subtype["code"], subtype["system"])]
            found = self._kinds[interaction] = (kind, subtype, keys)
        return found


def _content(stored: StoredResource) -> JSON:
    if stored.deleted or not stored.body:
        return {"resourceType": stored.resource_type, "id": stored.id,
                "_version": stored.version}
    return orjson.loads(stored.body) | {"_version": stored.version}  # type: ignore[no-any-return]


def _resource_entity(resource: JSON) -> JSON:
    entity: JSON = {"what": {"reference": f"{resource.get('resourceType')}/"
                                          f"{resource.get('id')}"},
                    "type": SYSTEM_OBJECT, "role": DOMAIN_RESOURCE}
    version = resource.get("_version") or (resource.get("meta") or {}).get("versionId")
    if version:
        entity["detail"] = [{"type": "versionId", "valueString": str(version)}]
    return entity


def _patient_entity(patient_id: str) -> JSON:
    return {"what": {"reference": f"Patient/{patient_id}"}, "type": PERSON,
            "role": PATIENT_ROLE}


def _request_entity(request_id: str) -> JSON:
    """The X-Request-ID of the request, to find its log lines."""
    return {"what": {"identifier": {"system": REQUEST_SYSTEM, "value": request_id}},
            "type": SYSTEM_OBJECT, "description": "request"}


def _source(service: str) -> JSON:
    return {"site": service,
            "observer": {"identifier": {"system": SERVICE_SYSTEM, "value": "fhir"},
                         "display": f"{service} clinical data"},
            "type": [coding(SOURCE_TYPE, "4", "Application Server")]}


def _agents(principal: Principal, address: str | None, user_agent: str | None) -> list[JSON]:
    person: JSON = {
        "type": {"coding": [coding(ROLE_TYPE, "humanuser", "human user")]},
        "who": {"identifier": {"system": USER_SYSTEM, "value": principal.user_id},
                **({"display": principal.email} if principal.email else {})},
        "requestor": principal.kind == "user"}
    if principal.roles:
        person["role"] = [{"text": role} for role in sorted(principal.roles)]
    network = {"address": address, "type": "2"} if address else None
    if principal.kind == "user":
        if network:
            person["network"] = network
        if user_agent:
            person["name"] = user_agent
        return [person]
    if principal.kind == "platform":
        return [{"type": {"coding": [coding(DCM, "110150", "Application")]},
                 "who": {"identifier": {"system": SERVICE_SYSTEM, "value": "platform"},
                         "display": "the platform"}, "requestor": True}]
    if principal.kind == "api_key":
        who = {"identifier": {"system": API_KEY_SYSTEM, "value": principal.token_id or ""},
               "display": "API key"}
    else:
        client = principal.smart.client_id if principal.smart else ""
        who = {"identifier": {"system": SMART_CLIENT, "value": client}, "display": "SMART app"}
    application: JSON = {"type": {"coding": [coding(DCM, "110150", "Application")]},
                         "who": who, "requestor": True}
    if network:
        application["network"] = network
    return [application, person]


def audit_event(principal: Principal, *, kind: JSON, subtype: JSON, action: str,
                recorded: str, outcome: str, description: str | None, address: str | None,
                user_agent: str | None, request_id: str | None, entities: list[JSON],
                service: str, purpose: str | None = None, period_start: str | None = None
                ) -> JSON:
    source = _source(service)
    agents = _agents(principal, address, user_agent)
    if purpose:
        agents[0]["purposeOfUse"] = [{"coding": [coding(PURPOSE, purpose)]}]
    event: JSON = {"resourceType": "AuditEvent", "type": kind, "subtype": [subtype],
                   "action": action, "recorded": recorded, "outcome": outcome,
                   "agent": agents, "source": source, "entity": entities}
    if description:
        event["outcomeDesc"] = description[:1000]
    if period_start:
        event["period"] = {"start": period_start}
    if request_id:
        event["entity"] = [*entities, _request_entity(request_id)]
    return event


# --- the /api side ---------------------------------------------------------------------------


class AuditCreate(BaseModel):
    action: Literal["C", "R", "U", "D", "E"] = Field(description="C create, R read, U "
                                                     "update, D delete, E execute")
    resource_type: str = Field(min_length=1, max_length=64, examples=["Composition"])
    resource_id: str = Field(min_length=1, max_length=64)
    subtype: str | None = Field(default=None, pattern=r"^[a-z][a-z0-9-]{0,63}$",
                                examples=["print", "export", "break-glass"])
    outcome: Literal["success", "minor_failure", "serious_failure", "major_failure"] = \
        "success"
    description: str | None = Field(default=None, max_length=1000)
    purpose_of_use: str | None = Field(default=None, pattern=r"^[A-Z]{2,12}$",
                                       examples=["TREAT", "ETREAT"],
                                       description="v3 PurposeOfUse code")
    occurred_at: datetime | None = None


class EntityView(BaseModel):
    reference: str | None = None
    role: str | None = None
    version: str | None = None
    description: str | None = None


class AuditView(BaseModel):
    id: str
    recorded: str | None = None
    action: str | None = None
    action_name: str | None = None
    type: str | None = None
    subtype: str | None = None
    outcome: str | None = None
    outcome_code: str | None = None
    description: str | None = None
    user_id: str | None = None
    user_email: str | None = None
    agent_kind: str | None = Field(None, description="user | api_key | smart")
    client_id: str | None = None
    network_address: str | None = None
    purpose_of_use: str | None = None
    resource: str | None = None
    patient_ids: list[str] = []
    entities: list[EntityView] = []
    organization_ids: list[str] = []


def _agent_kind(application_system: str, has_person: bool) -> str | None:
    kinds = {API_KEY_SYSTEM: "api_key", SMART_CLIENT: "smart"}
    return kinds.get(application_system, "user" if has_person else None)


def audit_view(event: JSON) -> JSON:
    agents = event.get("agent") or []
    person: JSON = next((a for a in agents if ((a.get("who") or {}).get("identifier") or {})
                   .get("system") == USER_SYSTEM), {})
    application = next((a for a in agents if a is not person), None)
    app_id = ((application or {}).get("who") or {}).get("identifier") or {}
    network = next(((a.get("network") or {}).get("address") for a in agents
                    if a.get("network")), None)
    entities = []
    for entity in event.get("entity") or []:
        detail = {d.get("type"): d.get("valueString") for d in entity.get("detail") or []}
        entities.append(EntityView(
            reference=(entity.get("what") or {}).get("reference"),
            role=(entity.get("role") or {}).get("display"), version=detail.get("versionId"),
            description=entity.get("description")))
    patients = [e.reference.split("/", 1)[1] for e in entities
                if e.role == "Patient" and e.reference]
    resource = next((e.reference for e in entities if e.role != "Patient" and e.reference),
                    None)
    subtype = (event.get("subtype") or [{}])[0]
    purpose = ((agents[0] if agents else {}).get("purposeOfUse") or [{}])[0]
    return AuditView(
        id=event["id"], recorded=event.get("recorded"), action=event.get("action"),
        action_name=ACTION_NAMES.get(event.get("action", "")),
        type=(event.get("type") or {}).get("code"), subtype=subtype.get("code"),
        outcome=OUTCOME_NAMES.get(event.get("outcome", "")), outcome_code=event.get("outcome"),
        description=event.get("outcomeDesc"),
        user_id=((person.get("who") or {}).get("identifier") or {}).get("value"),
        user_email=(person.get("who") or {}).get("display"),
        agent_kind=_agent_kind(str(app_id.get("system")), bool(person)),
        client_id=app_id.get("value") if app_id.get("system") == SMART_CLIENT else None,
        network_address=network,
        purpose_of_use=((purpose.get("coding") or [{}])[0]).get("code"),
        resource=resource or (entities[0].reference if entities else None),
        patient_ids=patients, entities=entities,
        organization_ids=sorted(owner_labels(event)),
    ).model_dump()


class AuditQuery(BaseModel):
    date_from: datetime | None = Field(None, alias="from",
                                       description="Recorded at or after (ISO 8601)")
    date_to: datetime | None = Field(None, alias="to",
                                     description="Recorded at or before (ISO 8601)")
    action: Annotated[Literal["C", "R", "U", "D", "E"] | None, SearchParam("action")] = None
    outcome: Literal["success", "minor_failure", "serious_failure", "major_failure"] | None \
        = None
    user_id: Annotated[str | None, SearchParam("agent:identifier", USER_SYSTEM + "|{}")] = \
        Field(None, max_length=64)
    patient_id: Annotated[str | None, SearchParam("patient", "Patient/{}")] = Field(
        None, max_length=64)
    subtype: Annotated[str | None, SearchParam("subtype")] = Field(
        None, max_length=64, description="read, search-type, create, update, delete, or a "
        "reported code (print, export...)")


def _instant(moment: datetime) -> str:
    return (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).isoformat()


def _search_criteria(ctx: ApiContext, query: AuditQuery | None) -> list[tuple[str, str]]:
    """The criteria the query's fields cannot say by themselves: the outcome's code and
    the date range as FHIR instants."""
    if query is None:
        return []
    criteria = []
    if query.outcome is not None:
        criteria.append(("outcome", OUTCOMES[query.outcome]))
    if query.date_from is not None:
        criteria.append(("date", "ge" + _instant(query.date_from)))
    if query.date_to is not None:
        criteria.append(("date", "le" + _instant(query.date_to)))
    return criteria


def _of_resource(ctx: ApiContext, query: Any) -> list[tuple[str, str]]:
    kind, resource_id = ctx.path["resource_type"], ctx.path["resource_id"]
    if not is_resource_type(kind):
        raise ApiError(422, "VALIDATION_ERROR", f"{kind!r} is not a FHIR resource type",
                       field="resource_type")
    return [("entity", f"{kind}/{resource_id}")]


def _of_user(ctx: ApiContext, query: Any) -> list[tuple[str, str]]:
    return [("agent:identifier", f"{USER_SYSTEM}|{ctx.path['user_id']}")]


def _read_only(payload: JSON, ctx: ApiContext, existing: JSON | None) -> JSON:
    raise AssertionError("audit events are recorded by record_audit_event")


def _audit_facade(**more: Any) -> Facade:
    return Facade(resource="AuditEvent", name="Audit event", create=AuditCreate,
                  view=AuditView, to_fhir=_read_only, from_fhir=audit_view, sort="-date",
                  tags=["clinical audit"], **more)


search_audit = _audit_facade(query=AuditQuery, list_criteria=_search_criteria, summaries={
    "list": "Search the audit trail by date range, action, outcome, user, patient"})
resource_audit = _audit_facade(list_criteria=_of_resource, summaries={
    "list": "The audit trail of one resource"})
user_audit = _audit_facade(list_criteria=_of_user, summaries={
    "list": "What one user did (as far as the caller may see)"})
audit_events = _audit_facade(summaries={"get": "One audit event"})

router = APIRouter(tags=["clinical audit"])
# /search before /{id}: the router matches in order
search_audit.mount(router, "/api/clinical/audit/search", ops=("list",))
resource_audit.mount(router, "/api/clinical/audit/resource/{resource_type}/{resource_id}",
                     ops=("list",))
user_audit.mount(router, "/api/clinical/audit/user/{user_id}", ops=("list",))
audit_events.mount(router, "/api/clinical/audit", ops=("get",))


@router.post("/api/clinical/audit", status_code=201, response_model=Envelope[AuditView],
             summary="Record an audit event about a resource you may read (printing, "
                     "export, emergency access...); you are its agent")
async def record_audit_event(body: AuditCreate, ctx: ApiContext = Depends(api_context)
                             ) -> Any:
    if not is_resource_type(body.resource_type):
        raise ApiError(422, "VALIDATION_ERROR", f"{body.resource_type!r} is not a FHIR "
                       "resource type", field="resource_type")
    services = ctx.services
    try:
        stored = await services.fhir.read(body.resource_type, body.resource_id)
    except (ResourceNotFound, ResourceGone):
        raise not_found(body.resource_type) from None
    ctx.fhir.check_read(stored)  # 403 (and itself audited) when not the caller's to read
    resource = orjson.loads(stored.body) | {"_version": stored.version}
    address, agent = _client()
    subtype = coding(SUBTYPES, body.subtype, body.subtype) if body.subtype else coding(
        INTERACTION, ACTION_NAMES[body.action], ACTION_NAMES[body.action])
    patients = sorted(services.fhir.compartments.patients_of(resource))
    event = audit_event(
        ctx.principal, kind=coding(DCM, "110110", "Patient Record"), subtype=subtype,
        action=body.action, recorded=_now(), outcome=OUTCOMES[body.outcome],
        description=body.description, address=address, user_agent=agent,
        request_id=request_id_var.get(),
        entities=[_resource_entity(resource), *(_patient_entity(p) for p in patients)],
        service=services.settings.service_name, purpose=body.purpose_of_use,
        period_start=body.occurred_at.isoformat() if body.occurred_at else None)
    owners = owner_labels(resource) or (
        {resource["id"]} if resource.get("resourceType") == "Organization" else set())
    if owners:
        event = with_owners(event, owners)
    async with services.store.unit_of_work() as uow:
        staged = services.fhir.stage_create(uow, event)
        uow.emit(RECORDED, {"audit_event_id": staged.id, "action": body.action,
                            "resource": f"{body.resource_type}/{body.resource_id}",
                            "user_id": ctx.principal.user_id, "outcome": body.outcome},
                 source_service="clinical audit")
        await uow.commit()
    assert staged.result is not None
    return created(audit_view(orjson.loads(staged.result.body)))


def start_audit(services: Services) -> ClinicalAudit:
    recorder = ClinicalAudit(services)
    recorder.start()
    services.extras[AUDIT] = recorder
    return recorder


__all__ = ["OWNER_SYSTEM", "ClinicalAudit", "audit_event", "audit_view", "router",
           "start_audit"]
