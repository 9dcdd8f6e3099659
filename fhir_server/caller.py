"""The FHIR service as one caller sees it: every read, search and write checked against
that caller's :class:`~fhir_server.access.Access`.

Every door reaches the store through a :class:`CallerFhir`: the /fhir interactions and
the bundle engine with the access the platform built for the request, the /api facades
likewise, the HL7v2 gateway and the platform's own bookkeeping with
:data:`~fhir_server.access.SYSTEM`.

- **Reads** (read, vread, instance history) check the resource against the caller's read
  grants: :class:`~fhir_server.access.AccessDenied` (403) when none admits it.
- **Searches** carry the search grants as criteria (``SearchPlan.access``): the store
  returns only what the caller may see, includes, chains and ``_has`` included; so do
  type and system history and the conditions of conditional interactions (a caller
  cannot probe, match or overwrite what it cannot see).
- **Writes** go through a :class:`FhirUnit` (one unit of work): each resource is
  validated, its owners are settled (:mod:`fhir_server.ownership`), the current version
  must be admitted by the caller's update (or delete) grants, the new one by its create
  (or update) grants, and every patient the resource is about must be visible to the
  caller; then it is staged, with its resource event, and committed all or nothing.

For a restricted caller an update or delete is staged against the version it checked
(``If-Match`` implied), so a concurrent change can never slip in unchecked; when one
does happen the unit fails with ``ConditionChanged`` (not the 412 of an ``If-Match`` the
client never sent), and the one-shot writes here, like transactions, check and write
again. Within a process, one-shot writes of one resource take turns (a lock per
resource), so only writers in other processes can make them try again.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any, NoReturn

import orjson

from fhir_server.access import (
    CREATE,
    DELETE,
    READ,
    SEARCH,
    UPDATE,
    Access,
    AccessDenied,
    admits,
    may_touch_type,
    permits,
    split_token,
    writable_owners,
)
from fhir_server.ids import new_id
from fhir_server.outcome import FhirError
from fhir_server.ownership import OWNER_SYSTEM, settle_owners, with_owners
from fhir_server.search.plan import MAX_COUNT, AccessGrant, SearchPlan, TokenCriterion
from fhir_server.service import MAX_SEARCH_RESULTS, FhirService
from fhir_server.store import (
    Condition,
    ConditionChanged,
    HistoryPage,
    MultipleMatches,
    ResourceGone,
    ResourceNotFound,
    SearchPage,
    StoredResource,
    VersionConflict,
)
from fhir_server.store.port import StagedWrite, Staging
from fhir_server.validation import check_id

JSON = dict[str, Any]
Params = Sequence[tuple[str, str]]
MAX_CONDITIONAL_DELETE = 100  # resources one conditional delete may remove
CONDITION_RETRIES = 3  # a condition that changed under us is resolved again this often


class CallerFhir:
    """Reads, searches and units of work of one caller (see the module docstring)."""

    def __init__(self, service: FhirService, access: Access):
        self.service = service
        self.access = access
        self._plan_access: dict[str, tuple[AccessGrant, ...] | None] = {}

    # -- the caller's grants as search criteria ------------------------------------------
    def plan_access(self, action: str = SEARCH) -> tuple[AccessGrant, ...] | None:
        if action not in self._plan_access:
            self._plan_access[action] = compile_access(self.service, self.access, action)
        return self._plan_access[action]

    def restrict(self, plan: SearchPlan) -> SearchPlan:
        """``plan`` limited to what the caller may search (a type it may never see is a
        403 naming it, not an empty result)."""
        if self.access.grants(SEARCH) is not None:
            searched = [t for t in plan.resource_types
                        if may_touch_type(self.access, SEARCH, t)]
            if not searched:
                first = plan.resource_types[0] if plan.resource_types else "Resource"
                raise AccessDenied(f"{self._who()} may not search "
                                   f"{', '.join(plan.resource_types[:3])} resources"
                                   f"{self.access.explain(SEARCH, first)}")
            if not plan.all_types and len(searched) != len(plan.resource_types):
                plan.resource_types = tuple(searched)
        plan.access = self.plan_access(SEARCH)
        return plan

    def _who(self) -> str:
        return self.access.describe().capitalize()

    def patients_of(self, resource: JSON) -> frozenset[str]:
        return self.service.compartments.patients_of(resource)

    def tokens_of(self, resource: JSON, param: str) -> frozenset[tuple[str | None, str | None]]:
        return self.service.tokens_of(resource, param)

    def admitted(self, action: str, resource: JSON) -> bool:
        """Whether the caller's ``action`` grants admit ``resource``."""
        return permits(self.access, action, resource, self._patients_once(resource),
                       self.tokens_of)

    def _patients_once(self, resource: JSON) -> Callable[[JSON], frozenset[str]]:
        """``patients_of`` computing ``resource``'s compartments once, however many
        grants ask (a SMART patient scope confines several of them)."""
        found: list[frozenset[str]] = []

        def patients_of(candidate: JSON) -> frozenset[str]:
            if candidate is not resource:
                return self.patients_of(candidate)
            if not found:
                found.append(self.patients_of(resource))
            return found[0]
        return patients_of

    # -- reads -------------------------------------------------------------------------------
    def check_read(self, stored: StoredResource) -> None:
        """403 unless the caller may read this version."""
        grants = self.access.grants(READ)
        if grants is None or stored.deleted:
            return
        resource = orjson.loads(stored.body)
        patients_of = self._patients_once(resource)
        if not any(admits(g, resource, patients_of, self.tokens_of) for g in grants):
            message = (f"{self._who()} may not read {stored.resource_type}/{stored.id}"
                       f"{self.access.explain(READ, stored.resource_type)}")
            if self.service.access_listeners:
                self.service.accessed(self.access, READ, (stored,), message)
            raise AccessDenied(message)

    async def read(self, resource_type: str, resource_id: str, version: int | None = None
                   ) -> StoredResource:
        stored = await self.service.read(resource_type, resource_id, version)
        self.check_read(stored)
        if self.service.access_listeners:
            self.service.accessed(self.access, READ, (stored,))
        return stored

    async def read_json(self, resource_type: str, resource_id: str) -> JSON:
        return orjson.loads((await self.read(resource_type, resource_id)).body)  # type: ignore[no-any-return]

    async def find_json(self, resource_type: str, resource_id: str) -> JSON | None:
        """The current resource, ``None`` when unknown or deleted; 403 when the caller may
        not see it."""
        try:
            return await self.read_json(resource_type, resource_id)
        except (ResourceNotFound, ResourceGone):
            return None

    async def check_history(self, resource_type: str, resource_id: str) -> None:
        """An instance's history is the caller's to read when its latest version with
        content is (a deleted resource: the version before the tombstone)."""
        if self.access.grants(READ) is None:
            return
        page = await self.service.store.history(resource_type, resource_id, count=2)
        latest = next((e for e in page.entries if not e.deleted), None)
        if latest is not None:
            self.check_read(latest)

    async def history(self, resource_type: str | None, resource_id: str | None, *,
                      since: str | None = None, at_or_before: str | None = None,
                      count: int = 50, before_seq: int | None = None) -> HistoryPage:
        """Versions newest first; of an instance (checked by ``check_history``), else of
        the resources of a type, or of every type, that the caller may read."""
        if resource_id is None and resource_type is not None and not may_touch_type(
                self.access, SEARCH, resource_type):
            raise AccessDenied(f"{self._who()} may not search {resource_type} resources"
                               f"{self.access.explain(SEARCH, resource_type)}")
        access = None if resource_id is not None else self.plan_access(SEARCH)
        return await self.service.store.history(
            resource_type, resource_id, since=since, at_or_before=at_or_before, count=count,
            before_seq=before_seq, access=access)

    # -- searches ------------------------------------------------------------------------
    async def parse(self, resource_types: Sequence[str], params: Params, *,
                    strict: bool = False, base_url: str = "", all_types: bool = False
                    ) -> SearchPlan:
        plan = await self.service.parse(resource_types, params, strict=strict,
                                        base_url=base_url, all_types=all_types)
        return self.restrict(plan)

    async def search_page(self, plan: SearchPlan) -> SearchPage:
        if plan.access is None:
            self.restrict(plan)
        page = await self.service.search_page(plan)
        if self.service.access_listeners and (page.resources or page.included):
            self.service.accessed(self.access, SEARCH, [*page.resources, *page.included])
        return page

    async def search(self, resource_type: str, params: Params, *, included: bool = False
                     ) -> list[JSON]:
        """Every match the caller may see, as dicts, all pages (at most
        ``MAX_SEARCH_RESULTS``), and with ``included`` what the search's ``_include`` and
        ``_revinclude`` added; unknown parameters are an error here."""
        self.service.check_type(resource_type)
        plan = await self.parse([resource_type], params, strict=True)
        plan.count = MAX_COUNT
        found: list[JSON] = []
        while True:
            page = await self.search_page(plan)
            found += [orjson.loads(s.body) for s in page.resources]
            if included:
                found += [orjson.loads(s.body) for s in page.included]
            if page.next is None or len(found) >= MAX_SEARCH_RESULTS:
                return found[:MAX_SEARCH_RESULTS]
            plan.cursor = page.next

    async def condition(self, resource_type: str, params: Params) -> SearchPlan:
        """The plan of a conditional interaction's criteria, over what the caller may see."""
        if not params:
            raise FhirError.of(400, "invalid", "A conditional request needs search criteria")
        self.service.check_type(resource_type)
        return await self.parse([resource_type], params, strict=True)

    async def match_ids(self, resource_type: str, params: Params, limit: int) -> list[str]:
        plan = await self.condition(resource_type, params)
        return await self.service.match_plan(plan, limit)

    # -- writes --------------------------------------------------------------------------
    def unit(self) -> FhirUnit:
        return FhirUnit(self)

    async def create(self, resource: JSON, *, expected_type: str | None = None,
                     if_none_exist: Params | None = None) -> tuple[StoredResource, bool]:
        """``POST [type]`` (with ``If-None-Exist``: conditional create, R4 3.1.0.8.1);
        returns (stored, created). The condition is checked inside the commit, so two
        identical requests at once create one resource."""
        if expected_type is not None:
            self.service.check_type(expected_type)
        await self.service.refresh_registry()
        async with self.unit() as unit:
            staged = await unit.create(resource, expected_type=expected_type,
                                       if_none_exist=if_none_exist)
            await unit.commit()
        assert staged.result is not None
        return staged.result, not staged.existing

    async def update(self, resource_type: str, resource_id: str, resource: JSON, *,
                     if_match: int | None = None) -> tuple[StoredResource, bool]:
        """``PUT [type]/[id]`` (or create with the client's id); returns (stored, created)."""
        self.service.check_type(resource_type)
        check_id(resource_id)
        await self.service.refresh_registry()
        if isinstance(resource, dict) and resource.get("resourceType") == resource_type:
            body_id = resource.get("id")
            if body_id is None:
                raise FhirError.of(400, "required", "The resource in an update must carry "
                                   "its id", f"{resource_type}.id")
            if body_id != resource_id:
                raise FhirError.of(400, "invalid", f"The body's id {body_id!r} does not "
                                   f"match the URL's id {resource_id!r}", f"{resource_type}.id")
        staged = await self._one_write(
            (resource_type, resource_id),
            lambda unit: unit.update(resource, if_match=if_match, expected_type=resource_type))
        assert staged.result is not None
        return staged.result, staged.created

    async def conditional_update(self, resource_type: str, criteria: Params, resource: JSON,
                                 *, if_match: int | None = None
                                 ) -> tuple[StoredResource, bool]:
        """``PUT [type]?criteria`` (R4 3.1.0.4.3) over what the caller may see: no match
        creates (with the body's id when it has one), one match is updated (a different
        body id is a 400), several are a 412. Returns (stored, created)."""
        self.service.check_type(resource_type)
        if isinstance(resource, dict) and resource.get("id") is not None:
            check_id(str(resource["id"]))
        plan = await self.condition(resource_type, criteria)
        for _attempt in range(CONDITION_RETRIES):
            ids = await self.service.match_plan(plan, limit=2)
            if len(ids) > 1:
                raise MultipleMatches(resource_type, len(ids))
            body = dict(resource) if isinstance(resource, dict) else resource
            if ids and isinstance(body, dict):
                if body.get("id") not in (None, ids[0]):
                    raise FhirError.of(400, "invalid",
                                       f"The body's id {body['id']!r} is not the id of the "
                                       f"matching resource {ids[0]!r}", f"{resource_type}.id")
                body["id"] = ids[0]
            elif isinstance(body, dict):
                body["id"] = body.get("id") or new_id()
            try:
                async with self.unit() as unit:
                    staged = await unit.update(body, if_match=if_match,
                                               expected_type=resource_type,
                                               condition=Condition(plan, tuple(ids)))
                    await unit.commit()
            except ConditionChanged:
                continue
            assert staged.result is not None
            return staged.result, staged.created
        raise _kept_changing()

    async def patch(self, resource_type: str, resource_id: str, operations: Any, *,
                    if_match: int | None = None) -> StoredResource:
        """Apply a JSON Patch (RFC 6902) to the current version and store the result."""
        await self.service.refresh_registry()
        staged = await self._one_write(
            (resource_type, resource_id),
            lambda unit: unit.patch(resource_type, resource_id, operations, if_match=if_match))
        assert staged.result is not None
        return staged.result

    async def delete(self, resource_type: str, resource_id: str, *,
                     if_match: int | None = None) -> StoredResource:
        staged = await self._one_write(
            (resource_type, resource_id),
            lambda unit: unit.delete(resource_type, resource_id, if_match=if_match))
        assert staged.result is not None
        return staged.result

    async def _one_write(self, key: tuple[str, str],
                         stage: Callable[[FhirUnit], Awaitable[StagedWrite]]) -> StagedWrite:
        """Stage and commit one write of the resource ``key``, in turn with this process's
        other writes of it, again (checked again) when another process changed it."""
        async with self.service.resource_lock(*key):
            for _attempt in range(CONDITION_RETRIES):
                try:
                    async with self.unit() as unit:
                        staged = await stage(unit)
                        await unit.commit()
                except ConditionChanged:
                    continue
                return staged
        raise _kept_changing()

    async def conditional_delete(self, resource_type: str, criteria: Params
                                 ) -> list[StoredResource]:
        """``DELETE [type]?criteria``: every match the caller may see (up to
        MAX_CONDITIONAL_DELETE) in one commit; the tombstones (none when nothing matched)."""
        ids = await self.match_ids(resource_type, criteria, limit=MAX_CONDITIONAL_DELETE + 1)
        if len(ids) > MAX_CONDITIONAL_DELETE:
            raise FhirError.of(412, "too-costly",
                               f"More than {MAX_CONDITIONAL_DELETE} {resource_type} resources "
                               "match; narrow the criteria")
        for _attempt in range(CONDITION_RETRIES):
            try:
                async with self.unit() as unit:
                    staged = [await unit.delete(resource_type, i) for i in ids]
                    await unit.commit()
            except ConditionChanged:
                continue
            return [s.result for s in staged if s.result is not None]
        raise _kept_changing()


def _kept_changing() -> FhirError:
    return FhirError.of(409, "conflict", "The resource kept changing while it was being "
                        "written; retry")


def compile_access(service: FhirService, access: Access, action: str
                   ) -> tuple[AccessGrant, ...] | None:
    """A caller's grants for ``action`` as the search plan's access filter."""
    grants = access.grants(action)
    if grants is None:
        return None
    registry = service.registry
    compiled = []
    for grant in grants:
        members: dict[str, tuple[str, ...]] = {}
        if grant.patients is not None:
            types = grant.types if grant.types is not None else \
                registry.compartment_types("Patient")
            members = {t: params for t in sorted(types)
                       if (params := registry.compartment_params("Patient", t))}
        compiled.append(AccessGrant(
            grant.types,
            owners=None if grant.owners is None else tuple(
                TokenCriterion(OWNER_SYSTEM, code) for code in sorted(grant.owners)),
            identifiers=None if grant.identifiers is None else tuple(
                _identifier_token(i) for i in sorted(grant.identifiers)),
            patients=None if grant.patients is None else tuple(sorted(grant.patients)),
            members=members,
            tokens=None if grant.tokens is None else tuple(
                (f.param, tuple(_token_criterion(v) for v in sorted(f.values)))
                for f in grant.tokens)))
    return tuple(compiled)


def _identifier_token(value: str) -> TokenCriterion:
    system, _, code = value.partition("|")
    return TokenCriterion(system or None, code, no_system=not system)


def _token_criterion(value: str) -> TokenCriterion:
    system, code, no_system = split_token(value)
    return TokenCriterion(system, code, no_system=no_system)


class FhirUnit:
    """One unit of work of FHIR writes by one caller (see the module docstring); used as
    ``async with caller.unit() as unit: ... await unit.commit()``. Documents and events
    staged on it commit atomically with the resources."""

    def __init__(self, caller: CallerFhir):
        self.caller = caller
        self.service = caller.service
        self.access = caller.access
        self.uow = self.service.store.unit_of_work()
        self._resources: dict[tuple[str, str], JSON | None] = {}  # staged or looked up
        self._implied: list[StagedWrite] = []  # writes pinned to the version checked
        # (action, write, what a delete removed), for the access listeners
        self._writes: list[tuple[str, StagedWrite, StoredResource | None]] = []

    def acting_as(self, access: Access) -> FhirUnit:
        """A unit staging into this one's unit of work with ``access``, committed (or
        rolled back) with it: what a checked change implies and its caller may not write
        directly (the bed an admission occupies, written by the platform once the caller
        may admit). Its writes are checked against ``access``; only this unit commits."""
        other = FhirUnit(CallerFhir(self.service, access))
        other.uow, other._resources, other._implied = self.uow, self._resources, self._implied
        return other

    async def __aenter__(self) -> FhirUnit:
        await self.uow.__aenter__()
        return self

    async def __aexit__(self, exc_type: object, *exc: object) -> None:
        await self.uow.__aexit__(exc_type, *exc)

    @property
    def restricted(self) -> bool:
        return any(self.access.grants(a) is not None for a in (CREATE, UPDATE, DELETE))

    # -- resources ---------------------------------------------------------------------
    async def create(self, resource: JSON, *, resource_id: str | None = None,
                     expected_type: str | None = None, if_none_exist: Params | None = None,
                     condition: Condition | None = None, ownerless: bool = False
                     ) -> StagedWrite:
        """Stage a create with a server-assigned id (or ``resource_id``); with
        ``if_none_exist`` criteria (or a ``condition`` already resolved) the commit creates
        only when the caller can see no match, and one visible match becomes the result
        (``existing``). ``ownerless``: owned by no organization on purpose (a user's own
        patient record), whatever the rules of :mod:`fhir_server.ownership` would give."""
        offload = self.service.offloads(resource)
        await self.service.validate(resource, expected_type, offload=offload)
        body = dict(resource)
        body["id"] = resource_id or new_id()
        if if_none_exist is not None:
            condition = Condition(await self.caller.condition(body["resourceType"],
                                                              if_none_exist))
        body = await self._authorized(CREATE, await self._hooked(CREATE, body), None,
                                      ownerless=ownerless)
        await self.service.conformance.check_write(body)
        staged = self.service.stage_create(
            self.uow, body, resource_id=body["id"], condition=condition, validated=True,
            index=await self.service.index(body, offload=offload))
        self._resources[(body["resourceType"], body["id"])] = body
        self._writes.append((CREATE, staged, None))
        return staged

    async def update(self, resource: JSON, *, if_match: int | None = None,
                     expected_type: str | None = None, condition: Condition | None = None,
                     method: str = "PUT") -> StagedWrite:
        """Stage an update of ``resource["id"]`` (a create when the id is new)."""
        offload = self.service.offloads(resource)
        await self.service.validate(resource, expected_type, offload=offload)
        resource_type, resource_id = resource["resourceType"], resource.get("id")
        self.service.check_rewritable(resource_type, "update")
        if not isinstance(resource_id, str):
            raise FhirError.of(400, "required", "An update needs the resource id in the body",
                               f"{resource_type}.id")
        current = await self.service.store.read_current(resource_type, resource_id)
        current_json = orjson.loads(current.body) if current and not current.deleted else None
        if current_json is not None:
            self._check(UPDATE, current_json, "change")
        action = UPDATE if current_json is not None else CREATE
        body = await self._authorized(action, await self._hooked(action, dict(resource)),
                                      current_json)
        await self.service.conformance.check_write(body)
        implied = if_match is None and current is not None and current_json is not None \
            and self.restricted
        staged = self.service.stage_update(
            self.uow, body, if_match=current.version if implied and current else if_match,
            condition=condition, method=method, validated=True,
            index=await self.service.index(body, offload=offload))
        if implied:
            self._implied.append(staged)
        self._resources[(resource_type, resource_id)] = body
        self._writes.append((UPDATE if current_json is not None else CREATE, staged, None))
        return staged

    async def patch(self, resource_type: str, resource_id: str, operations: Any, *,
                    if_match: int | None = None) -> StagedWrite:
        """Stage a JSON Patch of the current version (checked like an update)."""
        current = await self.service.read(resource_type, resource_id)
        patched = self.service.apply_patch(current, operations, if_match=if_match)
        return await self.update(patched, if_match=current.version, method="PATCH")

    async def delete(self, resource_type: str, resource_id: str, *,
                     if_match: int | None = None) -> StagedWrite:
        """Stage a delete (a versioned tombstone); deleting what is already deleted
        changes nothing; an id never used is a 404."""
        self.service.check_type(resource_type)
        self.service.check_rewritable(resource_type, "delete")
        current = await self.service.store.read_current(resource_type, resource_id)
        if current is None:
            raise ResourceNotFound(resource_type, resource_id)
        implied = False
        if not current.deleted:
            self._check(DELETE, orjson.loads(current.body), "delete")
            implied = if_match is None and self.restricted
        self._resources[(resource_type, resource_id)] = None
        staged = self.service.stage_delete(
            self.uow, resource_type, resource_id,
            if_match=current.version if implied else if_match)
        if implied:
            self._implied.append(staged)
        self._writes.append((DELETE, staged, None if current.deleted else current))
        return staged

    def expunge(self, resource_type: str, resource_id: str, *, history_only: bool = False
                ) -> StagedWrite:
        """Stage the erasure of stored versions for good (``UnitOfWork.expunge``): for
        unrestricted callers only (platform administrators, the system), as rewriting the
        past is no role's to do; whoever decides to erase checks its own rule first."""
        self.service.check_type(resource_type)
        if any(self.access.grants(a) is not None for a in (READ, DELETE)):
            raise AccessDenied(f"{self.caller._who()} may not erase the history of "
                               f"{resource_type}/{resource_id}")
        if not history_only:
            self._resources[(resource_type, resource_id)] = None
        return self.uow.expunge(resource_type, resource_id, history_only=history_only)

    # -- the checks ----------------------------------------------------------------------
    def _check(self, action: str, resource: JSON, verb: str) -> None:
        if not self.caller.admitted(action, resource):
            kind = str(resource.get("resourceType"))
            self._refused(action, resource, f"{self.caller._who()} may not {verb} "
                          f"{kind}/{resource.get('id')}{self.access.explain(action, kind)}")

    async def _authorized(self, action: str, resource: JSON, current: JSON | None, *,
                          ownerless: bool = False) -> JSON:
        """``resource`` with its owners settled, once the caller may write it as it will
        be stored (AccessDenied otherwise)."""
        resource_type = resource["resourceType"]
        patients = self.caller.patients_of(resource)
        writable = writable_owners(self.access, action, resource_type)
        grants = self.access.grants(action)
        if grants is not None and not may_touch_type(self.access, action, resource_type):
            raise AccessDenied(f"{self.caller._who()} may not {action} {resource_type} "
                               f"resources{self.access.explain(action, resource_type)}",
                               resource_type)
        settled = with_owners(resource, ()) if ownerless else await settle_owners(
            resource, current=current, patients=patients, lookup=self._patient,
            writable=writable)
        if grants is None:
            return settled

        def patients_of(candidate: JSON) -> frozenset[str]:
            return patients if candidate is settled else self.caller.patients_of(candidate)

        if not any(admits(g, settled, patients_of, self.caller.tokens_of) for g in grants):
            self._refused(
                action, settled,
                f"{self.caller._who()} may not {action} this {resource_type}: it would "
                "belong to an organization (meta.security) or patient you do not act for"
                f"{self.access.explain(action, resource_type)}",
                f"{resource_type}.meta.security")
        for patient_id in sorted(patients):
            patient = await self._patient(patient_id)
            if patient is not None and not self.caller.admitted(READ, patient):
                # No id in the text: it lands in the audit trail of the writer's own
                # organization, which must not learn another's patients from it.
                self._refused(action, settled, f"{self.caller._who()} may not write records "
                              "about a patient whose record you may not read")
        return settled

    async def _hooked(self, action: str, resource: JSON) -> JSON:
        """``resource`` as the service's write hooks of its type leave it (before the
        access check, which so judges what will be stored)."""
        for hook in self.service.write_hooks.get(resource["resourceType"], ()):
            resource = await hook(self.access, action, resource, self)
        return resource

    def _refused(self, action: str, resource: JSON, message: str, *expression: str
                 ) -> NoReturn:
        if self.service.access_listeners:
            self.service.accessed(self.access, action, (resource,), message)
        raise AccessDenied(message, *expression)

    async def _patient(self, patient_id: str) -> JSON | None:
        key = ("Patient", patient_id)
        if key not in self._resources:
            stored = await self.service.store.read_current("Patient", patient_id)
            self._resources[key] = (orjson.loads(stored.body)
                                    if stored is not None and not stored.deleted else None)
        return self._resources[key]

    # -- documents, events, commit ----------------------------------------------------------
    def put_document(self, collection: str, id: str, body: JSON) -> None:
        self.uow.put_document(collection, id, body)

    def insert_document(self, collection: str, id: str, body: JSON) -> None:
        self.uow.insert_document(collection, id, body)

    def delete_document(self, collection: str, id: str) -> None:
        self.uow.delete_document(collection, id)

    def emit(self, topic: str, payload: JSON, *, event_id: str | None = None,
             source_service: str = "fhir_server") -> str:
        return self.uow.emit(topic, payload, event_id=event_id, source_service=source_service)

    def after_writes(self, callback: Any) -> None:
        self.uow.after_writes(callback)

    async def commit(self) -> None:
        try:
            await self.uow.commit()
        except VersionConflict as exc:
            if any(exc.staged is s for s in self._implied):
                raise ConditionChanged(f"{exc}: changed while being written") from None
            raise
        written = [r for r in self._resources.values() if r is not None]
        if written:
            self.service.committed(written)
        self.service.conformance.written([kind for kind, _ in self._resources])
        if self.service.access_listeners:
            for action, staged, removed in self._writes:
                if staged.result is not None and not staged.existing:
                    # a delete is reported with the version it removed (the tombstone
                    # holds no content to say whose it was)
                    self.service.accessed(self.access, action, (removed or staged.result,))


__all__ = ["CallerFhir", "FhirUnit", "Staging", "compile_access"]
