"""The FHIR service: every write to the system of record goes through here.

It validates, assigns ids, extracts search-index values, and stages the write in a unit of
work, so versioning, indexing and events happen once, in one place, whether the caller is
the FHIR REST API, an /api facade or the HL7v2 gateway. It also owns the search-parameter
registry in use (built-ins plus the custom SearchParameters activated by the last
reindex) and parses searches into plans. Callers reach it through
:class:`fhir_server.caller.CallerFhir` (reads, searches and writes as one caller may make
them); batch and transaction bundles are :mod:`fhir_server.transactions`.
"""

from __future__ import annotations

import asyncio
import functools
import time
import weakref
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import orjson

from fhir_server.audit_log.source import AuditLogSource, append_only
from fhir_server.compartments import PatientCompartments
from fhir_server.conformance.enforcement import ProfilePolicy
from fhir_server.conformance.profiles import Conformance
from fhir_server.conformance.validator import Options
from fhir_server.ids import new_id
from fhir_server.outcome import FhirError
from fhir_server.patches import as_patch
from fhir_server.search.custom import REFRESH_SECONDS, active_registry, active_version
from fhir_server.search.extract import IndexExtractor, token_codes
from fhir_server.search.plan import MAX_COUNT, SearchError, SearchPlan, parse_search
from fhir_server.search.registry import SearchRegistry, builtin_registry
from fhir_server.store import (
    Condition,
    IndexRows,
    ResourceGone,
    ResourceNotFound,
    ResourceStore,
    SearchPage,
    StoredResource,
    UnitOfWork,
    VersionConflict,
)
from fhir_server.store.port import StagedWrite, Staging
from fhir_server.validation import is_resource_type, validate_resource

Indexer = Callable[[dict[str, Any]], IndexRows]
JSON = dict[str, Any]
MAX_SEARCH_RESULTS = 10_000  # FhirService.search() returns at most this many resources
# A resource whose JSON text is larger than this is validated and indexed in a worker
# thread (see FhirService.offloads). Measured here: a 36 KB Patient (1,000 names) took
# 9 ms to index, a 1.6 MB one (40,000 names) 0.3 s; a resource of a few KB, well under a
# millisecond, which a thread hand-off (~0.1 ms) would only slow down.
LARGE_RESOURCE_BYTES = 32 * 1024


RESOURCE_EVENTS = ("resource_created", "resource_updated", "resource_deleted")
# (access, interaction, resources, refusal): see FhirService.add_access_listener
AccessListener = Callable[[Any, str, Sequence[Any], str | None], None]
# hook(access, action, resource, unit) → the resource to store (see add_write_hook)
WriteHook = Callable[[Any, str, JSON, Any], Awaitable[JSON]]


class FhirService:
    """Validation, ids, index extraction, staging, the registry (module docstring).

    Every resource it stages emits a domain event in the same unit of work:
    ``<event_prefix>.resource_created`` / ``_updated`` / ``_deleted`` with
    ``resourceType``, ``id``, ``versionId`` and ``lastUpdated``; only writes that made a
    version do (not a conditional create that found its match, an update that changed
    nothing, a delete of what was already deleted)."""

    def __init__(self, store: ResourceStore, *, indexer: Indexer | None = None,
                 registry: SearchRegistry | None = None, strict_validation: bool = False,
                 event_prefix: str = "platform.fhir", profile_policy: ProfilePolicy | None = None,
                 validation_options: Options | None = None):
        self.store = store
        self.event_prefix = event_prefix
        self._staged_events: weakref.WeakKeyDictionary[UnitOfWork, list[StagedWrite]] = \
            weakref.WeakKeyDictionary()
        # Adds the fhir.resources model checks to the JSON Schema's (see validation.py).
        self.strict_validation = strict_validation
        self.registry = registry or builtin_registry()
        # An explicit indexer (tests, tools) is kept; otherwise the registry's extractor,
        # rebuilt whenever a reindex activates new definitions.
        self._own_indexer = indexer is None
        self.indexer: Indexer | None = indexer or IndexExtractor(self.registry)
        self.compartments = PatientCompartments(self.registry)
        self._registry_checked = 0.0
        self._write_listeners: list[Callable[[Sequence[JSON]], None]] = []
        self.access_listeners: list[AccessListener] = []
        self.write_hooks: dict[str, list[WriteHook]] = {}
        self._resource_locks: weakref.WeakValueDictionary[tuple[str, str], asyncio.Lock] = \
            weakref.WeakValueDictionary()
        # Profiles, terminology and the profile check of writes (fhir_server.conformance)
        self.conformance = Conformance(store, policy=profile_policy,
                                       options=validation_options)
        self.add_write_hook("StructureDefinition",
                            self.conformance.prepare_structure_definition)
        # Types served by a source of their own instead of the store: AuditEvent by the
        # store's audit log (fhir_server.audit_log), append-only.
        log = getattr(store, "audit_log", None)
        self.sources: dict[str, AuditLogSource] = {} if log is None else {
            "AuditEvent": AuditLogSource(log)}

    def resource_lock(self, resource_type: str, resource_id: str) -> asyncio.Lock:
        """A lock for writes of one resource in this process (see fhir_server.caller)."""
        key = (resource_type, resource_id)
        lock = self._resource_locks.get(key)
        if lock is None:
            lock = self._resource_locks[key] = asyncio.Lock()
        return lock

    def add_write_listener(self, callback: Callable[[Sequence[JSON]], None]) -> None:
        """``callback(resources)`` after each unit of work that wrote ``resources`` commits
        in this process (the access policy forgets what a Consent changed)."""
        self._write_listeners.append(callback)

    def add_write_hook(self, resource_type: str, hook: WriteHook) -> None:
        """``await hook(access, action, resource, unit)`` before each create or update of
        a ``resource_type`` is staged, before the caller's access is checked on what it
        answers (``action`` create | update; ``unit`` the
        :class:`~fhir_server.caller.FhirUnit`): it answers the resource to store (it may
        set what the server manages, e.g. a Subscription's status), may refuse it (a
        FhirError), and may stage documents in the same unit (what the platform must know
        of the write, committed with it)."""
        self.write_hooks.setdefault(resource_type, []).append(hook)

    def add_access_listener(self, callback: AccessListener) -> None:
        """``callback(access, interaction, resources, refusal)`` whenever a caller
        (:class:`~fhir_server.caller.CallerFhir`) read, searched or wrote resources, or
        was refused: ``interaction`` read | search | create | update | delete;
        ``resources`` the StoredResources read, found or written (dicts for a refused
        write); ``refusal`` the reason of a refusal, else None. Called on the request's
        path: it must only take note (the clinical audit trail batches its writes)."""
        self.access_listeners.append(callback)

    def accessed(self, access: Any, interaction: str, resources: Sequence[Any],
                 refusal: str | None = None) -> None:
        for callback in self.access_listeners:
            callback(access, interaction, resources, refusal)

    def committed(self, resources: Sequence[JSON]) -> None:
        for callback in self._write_listeners:
            callback(resources)

    # -- the registry in use -------------------------------------------------------------
    async def refresh_registry(self, *, force: bool = False) -> SearchRegistry:
        """Follow a reindex done by any process (checked at most every couple of seconds)."""
        now = time.monotonic()
        if not force and now - self._registry_checked < REFRESH_SECONDS:
            return self.registry
        self._registry_checked = now
        if await active_version(self.store) != self.registry.version:
            self.use_registry(await active_registry(self.store))
        return self.registry

    def use_registry(self, registry: SearchRegistry) -> None:
        self.registry = registry
        self.compartments = PatientCompartments(registry)
        if self._own_indexer:
            self.indexer = IndexExtractor(registry)

    # -- reads -----------------------------------------------------------------------
    async def read(self, resource_type: str, resource_id: str, version: int | None = None
                   ) -> StoredResource:
        self.check_type(resource_type)
        source = self.sources.get(resource_type)
        if source is not None:
            return await source.read(resource_id, version)
        return await self.store.read(resource_type, resource_id, version)

    def source_of(self, plan: SearchPlan) -> AuditLogSource | None:
        """The source answering ``plan`` instead of the store: a search of one type that
        has one."""
        if len(plan.resource_types) != 1 or plan.all_types:
            return None
        return self.sources.get(plan.resource_types[0])

    def check_rewritable(self, resource_type: str, interaction: str) -> None:
        """405 for an update or delete of an append-only type (AuditEvent)."""
        if resource_type in self.sources:
            raise append_only(resource_type, interaction)

    async def read_json(self, resource_type: str, resource_id: str) -> dict[str, Any]:
        return orjson.loads((await self.read(resource_type, resource_id)).body)  # type: ignore[no-any-return]

    async def find_json(self, resource_type: str, resource_id: str) -> dict[str, Any] | None:
        """The current resource as JSON, or None when unknown or deleted."""
        try:
            return await self.read_json(resource_type, resource_id)
        except (ResourceNotFound, ResourceGone):
            return None

    def check_type(self, resource_type: str) -> None:
        if not is_resource_type(resource_type):
            raise FhirError.of(404, "not-supported", f"Unknown resource type {resource_type!r}")

    def token_param(self, resource_type: str, code: str) -> bool:
        """Whether ``code`` is a token search parameter of the type whose values are
        indexed under its own name (not a union of others): what an access token filter
        (``fhir_server.access.TokenFilter``) may name."""
        param = self.registry.param(resource_type, code)
        return (param is not None and param.type == "token" and param.searchable
                and not param.union_of and param.expression is not None)

    def tokens_of(self, resource: JSON, code: str) -> frozenset[tuple[str | None, str | None]]:
        """(system, code) of the resource's values in the token parameter ``code``, as
        the index holds them (for the check form of a token filter)."""
        resource_type = resource.get("resourceType", "")
        if not self.token_param(resource_type, code):
            return frozenset()
        expression = self.registry.params(resource_type)[code].expression
        assert expression is not None
        evaluate = self.registry.evaluator(resource_type, expression)
        return token_codes(evaluate(resource)) if evaluate is not None else frozenset()

    # -- search ------------------------------------------------------------------------
    async def parse(self, resource_types: Sequence[str], params: Sequence[tuple[str, str]], *,
                    strict: bool = False, base_url: str = "", all_types: bool = False
                    ) -> SearchPlan:
        """Parse search parameters into a plan; a bad search is a 400 OperationOutcome."""
        registry = await self.refresh_registry()
        try:
            return parse_search(registry, resource_types, params, strict=strict,
                                base_url=base_url, all_types=all_types)
        except SearchError as exc:
            code = "not-supported" if "not supported" in str(exc) or "unknown" in str(exc) \
                else "invalid"
            raise FhirError.of(400, code, str(exc), *([exc.parameter] if exc.parameter else [])
                               ) from None

    async def search_page(self, plan: SearchPlan) -> SearchPage:
        source = self.source_of(plan)
        if source is not None:
            return await source.search(plan)
        return await self.store.search(plan)

    async def search(self, resource_type: str, params: list[tuple[str, str]]
                     ) -> list[dict[str, Any]]:
        """The current resources matching a search, as dicts (all pages, in order).

        ``await fhir.search("Patient", [("identifier", "sys|val")])``. Unknown parameters
        are an error here (a lookup that silently ignored its criteria would match
        everything).
        """
        self.check_type(resource_type)
        plan = await self.parse([resource_type], params, strict=True)
        plan.count = MAX_COUNT
        found: list[dict[str, Any]] = []
        while True:
            page = await self.search_page(plan)
            found += [orjson.loads(s.body) for s in page.resources]
            if page.next is None or len(found) >= MAX_SEARCH_RESULTS:
                return found[:MAX_SEARCH_RESULTS]
            plan.cursor = page.next

    async def match_ids(self, resource_type: str, params: Sequence[tuple[str, str]],
                        limit: int) -> list[str]:
        """Ids of up to ``limit`` resources matching a condition (conditional interactions
        and transaction references: strict, an unknown parameter is an error)."""
        if not params:
            raise FhirError.of(400, "invalid", "A conditional request needs search criteria")
        return await self.match_plan(await self.parse([resource_type], params, strict=True),
                                     limit)

    async def match_plan(self, plan: SearchPlan, limit: int) -> list[str]:
        """``match_ids`` for a plan already parsed (a transaction parses its conditions
        once and re-checks the same plan inside the commit)."""
        if self.source_of(plan) is not None:
            plan.count, plan.sort = limit, []
            return sorted(s.id for s in (await self.search_page(plan)).resources)
        return await self.store.match_ids(plan, limit)

    # -- the work of a write that may leave the event loop ----------------------------------
    @staticmethod
    def offloads(resource: Any) -> bool:
        """Whether ``resource`` is large enough (``LARGE_RESOURCE_BYTES``) for its
        validation and indexing to run in a worker thread: seconds of CPU on the event
        loop would hold every other request (``/healthz`` included) meanwhile; in a
        thread the loop keeps its turns. Costs a serialization (~1 µs a KB)."""
        try:
            return len(orjson.dumps(resource)) > LARGE_RESOURCE_BYTES
        except (orjson.JSONEncodeError, TypeError):
            return False  # not JSON the store could write: validation says why, at once

    async def validate(self, resource: Any, expected_type: str | None = None, *,
                       offload: bool = False) -> dict[str, Any]:
        """``validate_resource`` with this service's strictness; in a worker thread when
        ``offload``."""
        if offload:
            return await asyncio.to_thread(validate_resource, resource, expected_type,
                                           strict=self.strict_validation)
        return validate_resource(resource, expected_type, strict=self.strict_validation)

    async def index(self, resource: dict[str, Any], *, offload: bool = False
                    ) -> IndexRows | None:
        """The search-index rows of ``resource``; in a worker thread when ``offload``."""
        if offload and self.indexer is not None:
            return await asyncio.to_thread(self.indexer, resource)
        return self._index(resource)

    # -- staged writes: the building blocks of fhir_server.caller.FhirUnit --------------
    def stage_create(self, uow: UnitOfWork, resource: dict[str, Any], *,
                     resource_id: str | None = None, expected_type: str | None = None,
                     condition: Condition | None = None, validated: bool = False,
                     index: IndexRows | None = None) -> StagedWrite:
        """Validate (unless ``validated``) and stage a create with a server-assigned id
        (FHIR ignores a client id on POST). With a ``condition`` the commit creates only
        when nothing matches. ``index``: the rows of ``resource`` as it will be stored
        (id included), when the caller extracted them already."""
        if not validated:
            validate_resource(resource, expected_type, strict=self.strict_validation)
        source = self.sources.get(resource["resourceType"])
        if source is not None:  # appended to its log once the unit commits
            return source.stage_create(uow, resource, resource_id=resource_id,
                                       condition=condition)
        resource = dict(resource)
        resource["id"] = resource_id or new_id()
        return self._with_event(uow, uow.create(
            resource["resourceType"], resource["id"], resource,
            index=index if index is not None else self._index(resource),
            method="POST", condition=condition))

    def stage_update(self, uow: UnitOfWork, resource: dict[str, Any], *,
                     if_match: int | None = None, method: str = "PUT",
                     expected_type: str | None = None, condition: Condition | None = None,
                     validated: bool = False, index: IndexRows | None = None) -> StagedWrite:
        if not validated:
            validate_resource(resource, expected_type, strict=self.strict_validation)
        self.check_rewritable(resource["resourceType"], "update")
        resource_id = resource.get("id")
        if not isinstance(resource_id, str):
            raise FhirError.of(400, "required", "An update needs the resource id in the body",
                               f"{resource['resourceType']}.id")
        return self._with_event(uow, uow.update(
            resource["resourceType"], resource_id, resource, if_match=if_match,
            index=index if index is not None else self._index(resource), method=method,
            condition=condition))

    def stage_delete(self, uow: UnitOfWork, resource_type: str, resource_id: str, *,
                     if_match: int | None = None) -> StagedWrite:
        self.check_rewritable(resource_type, "delete")
        return self._with_event(uow, uow.delete(resource_type, resource_id, if_match=if_match))

    def _with_event(self, uow: UnitOfWork, staged: StagedWrite) -> StagedWrite:
        """Note ``staged`` for its resource event, emitted inside the commit once the write
        is applied (only then is it known whether it made a version)."""
        pending = self._staged_events.get(uow)
        if pending is None:
            pending = self._staged_events[uow] = []
            uow.after_writes(functools.partial(self._emit_resource_events, pending))
        pending.append(staged)
        return staged

    def _emit_resource_events(self, writes: list[StagedWrite], staging: Staging) -> None:
        for write in writes:
            result = write.result
            if result is None or write.existing or write.unchanged:
                continue
            kind = 2 if result.deleted else (0 if result.version == 1 else 1)
            staging.emit(f"{self.event_prefix}.{RESOURCE_EVENTS[kind]}", {
                "resourceType": result.resource_type, "id": result.id,
                "versionId": str(result.version), "lastUpdated": result.last_updated,
            }, source_service="fhir")

    def _index(self, resource: dict[str, Any]) -> IndexRows | None:
        return self.indexer(resource) if self.indexer is not None else None

    def apply_patch(self, current: StoredResource, operations: Any, *,
                    if_match: int | None = None) -> dict[str, Any]:
        """The current version with a patch applied (not stored): a
        :class:`~fhir_server.patches.Patch`, or a JSON Patch (RFC 6902) as its array of
        operations."""
        if if_match is not None and if_match != current.version:
            raise VersionConflict(current.resource_type, current.id, if_match, current.version)
        patched = as_patch(operations).apply(orjson.loads(current.body))
        if not isinstance(patched, dict) or patched.get("resourceType") != current.resource_type \
                or patched.get("id") != current.id:
            raise FhirError.of(422, "processing", "A patch may not change resourceType or id")
        return patched  # type: ignore[no-any-return]
