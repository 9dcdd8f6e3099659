"""The facade kit: an /api area declares how its payloads map to FHIR; the kit writes the
routes.

A :class:`Facade` declares, for one FHIR resource type:

- the pydantic models of its payloads (``create``, ``update``, ``view``, and ``query``
  for list filters), so the OpenAPI document shows them;
- ``to_fhir(payload, ctx, existing)``: the FHIR resource for a payload (on update
  ``existing`` is the current resource and only the mapped elements change, so what the
  resource got elsewhere — FHIR clients, HL7v2 — survives an /api update), and
  ``from_fhir(resource)``: the /api view of a stored resource;
- ``scope``: a parent path parameter (``org_id``, ``patient_id``) that narrows every list
  and get to that organization or patient, checks the caller may work there, and marks
  what is created in it (:class:`OrganizationScope`, :class:`PatientScope`);
- ``fixed`` search criteria every list and get carries (``category=laboratory``), the
  list's default ``sort``, and the ``query`` model whose fields map to FHIR search
  parameters (``Annotated[str | None, SearchParam("subject", "Patient/{}")]``);
- ``unique``: the criteria a create must not match (a 409 with its code);
- ``statuses``: a :class:`StatusTable`; ``facade.action("cancel", to="revoked")`` mounts
  ``POST /{id}/cancel``, refused with 409 ``INVALID_TRANSITION`` when the table has no
  such move;
- ``events``: the domain events its creates, updates, deletes and moves emit, in the same
  unit of work as the write (the FHIR resource events come with every write anyway);
- ``alongside``: what a create, update or delete brings with it in the same unit of work
  (a clinical record's note, the members of a vital-signs panel, a Provenance): called
  with a :class:`Write` before the resource itself is staged, it stages those and returns
  the resource to store (e.g. now pointing at them).

``facade.mount(router, prefix, ops=(...))`` mounts list / create / get / update / delete.
A route that is not CRUD is a small function decorated with ``facade.route(...)``: it
receives a typed :class:`ItemContext` (the caller, the services, the resource loaded and
checked for the caller, the request body, the unit of work) and returns the resource to
answer with.

Access: every route reads and writes through the caller's :class:`CallerFhir` (the
access policy, :mod:`platform_api.policy`): a list is **one** FHIR search with ``_count``,
``_sort``, ``_offset`` and ``_total=accurate`` carrying the caller's grants as criteria,
so ``meta.total`` counts exactly what the caller may see; a get is a read the policy
checks (403); a write is checked before it is staged; one unit of work per request, and
a create answers from what it committed.

Views are robust to records stored before validation caught their shape (a Patient whose
``name`` holds a list of lists): when ``from_fhir`` (or ``views``) fails on a page, the
page is rendered again from the resources without the elements the R4 schema refuses
(:func:`fhir_server.validation.without_invalid_elements`), and the record is logged.
"""

# No ``from __future__ import annotations``: the route functions built here annotate their
# parameters with the facade's own models, which FastAPI must see as classes.

import inspect
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import date
from typing import Annotated, Any, Generic, TypeVar

import orjson
from fastapi import APIRouter, Depends, Query, Request
from pydantic import BaseModel

from fhir_server.caller import CallerFhir, FhirUnit
from fhir_server.ids import new_id
from fhir_server.ownership import OWNER_SYSTEM, owner_labels, with_owners
from fhir_server.search.plan import MAX_OFFSET
from fhir_server.store import (
    ConditionChanged,
    DuplicateDocument,
    ResourceGone,
    ResourceNotFound,
    VersionConflict,
)
from fhir_server.validation import without_invalid_elements
from platform_api.auth.dependencies import current_principal
from platform_api.auth.principal import Principal
from platform_api.envelope import (
    ApiError,
    Envelope,
    ErrorEnvelope,
    PageEnvelope,
    Pagination,
    conflict,
    created,
    not_found,
    ok,
    pagination,
)
from platform_api.policy import API_DOOR, PolicyAccess, Target
from platform_api.services import Services

JSON = dict[str, Any]
Body = TypeVar("Body", bound=BaseModel)
log = logging.getLogger("healthplatform.facade")
# What a view function raises on an element of the wrong shape (a string where it reads
# an object, a list where it reads a string...).
VIEW_FAULTS = (AttributeError, KeyError, IndexError, TypeError, ValueError)


# -- the context every route gets ----------------------------------------------------------
@dataclass
class ApiContext:
    """Who is calling and what they may reach: the request, the principal, the services,
    and the FHIR service bound to the caller's access."""

    request: Request
    principal: Principal
    services: Services
    access: PolicyAccess
    fhir: CallerFhir
    _unit: FhirUnit | None = None

    @property
    def path(self) -> Mapping[str, str]:
        return self.request.path_params  # type: ignore[no-any-return]

    def unit(self) -> FhirUnit:
        """The request's unit of work (one per request)."""
        if self._unit is None:
            self._unit = self.fhir.unit()
        return self._unit

    async def insert_once(self, collection: str, document: JSON, *, unique: tuple[str, str],
                          event: tuple[str, JSON, str], refusal: tuple[str, str]) -> None:
        """Store ``document`` (an /api document, not FHIR) and its ``event`` (topic,
        payload, source), once: ``unique`` is (collection, key) of a key document the
        store refuses to insert twice, so two requests at once cannot both store it; the
        loser gets a 409 with ``refusal`` (code, message)."""
        key_collection, key = unique
        topic, payload, source = event
        unit = self.unit()
        async with unit:
            unit.insert_document(key_collection, key, {"id": key, "document": document["id"]})
            unit.put_document(collection, document["id"], document)
            unit.emit(topic, payload, source_service=source)
            try:
                await unit.commit()
            except DuplicateDocument:
                raise conflict(*refusal) from None

    # -- workflow actions: decided by the policy (platform_api.policy.actions) -------------
    def authorize(self, action: str, organizations: Iterable[str] | str | None = None, *,
                  patient_id: str | None = None, user_id: str | None = None,
                  practitioner_id: str | None = None) -> None:
        """403 (recorded) unless the policy's rule for ``action`` admits the caller on
        this target."""
        self.services.policy.authorize(self.access, action, Target.of(
            organizations, patient_id=patient_id, user_id=user_id,
            practitioner_id=practitioner_id))

    def may(self, action: str, organizations: Iterable[str] | str | None = None, *,
            patient_id: str | None = None, user_id: str | None = None,
            practitioner_id: str | None = None) -> bool:
        """Whether the policy's rule for ``action`` admits the caller (no refusal)."""
        return self.services.policy.decide(self.access, action, Target.of(
            organizations, patient_id=patient_id, user_id=user_id,
            practitioner_id=practitioner_id)) is not None

    def organizations_for(self, action: str) -> frozenset[str] | None:
        """The organizations where the caller may do ``action`` (None: everywhere, a
        platform administrator), e.g. what a list is narrowed to."""
        return self.services.policy.organizations_for(self.access, action)

    def elevate(self, reason: str) -> CallerFhir:
        """The platform's own rights for a side effect of an action the policy permitted
        this caller (``"<action>: <what it writes>"``; recorded with the caller)."""
        return self.services.policy.elevate(reason, self.principal)

    def elevate_unit(self, unit: FhirUnit, reason: str) -> FhirUnit:
        """``unit`` going on with the platform's own rights for ``reason`` (recorded with
        the caller): what it stages commits with the caller's own writes."""
        return unit.acting_as(self.services.policy.elevated_access(reason, self.principal))

    def with_access(self, access: PolicyAccess) -> "ApiContext":
        """This context acting with ``access`` (``PolicyAccess.adopting``: a membership
        the same unit of work creates)."""
        return ApiContext(self.request, self.principal, self.services, access,
                          CallerFhir(self.services.fhir, access))


async def api_context(request: Request, principal: Principal = Depends(current_principal)
                      ) -> ApiContext:
    """FastAPI dependency: the :class:`ApiContext` of an /api request."""
    services: Services = request.app.state.services
    access = await services.policy.access(principal, API_DOOR)
    return ApiContext(request, principal, services, access, CallerFhir(services.fhir, access))


@dataclass
class ItemContext(ApiContext, Generic[Body]):
    """An :class:`ApiContext` for one resource: loaded, checked for the caller, with the
    route's request body."""

    resource: JSON = field(default_factory=dict)
    body: Body | None = None

    @property
    def id(self) -> str:
        return str(self.resource["id"])

    async def save(self, resource: JSON, *, event: str | None = None,
                   payload: JSON | None = None,
                   alongside: Callable[[FhirUnit, JSON], Awaitable[JSON]] | None = None
                   ) -> JSON:
        """Store the changed resource (against the version loaded: a concurrent change is
        a 412), with ``event`` in the same unit of work, after ``alongside(unit,
        resource)`` staged what the change brings with it (it returns the resource to
        store); the stored resource."""
        unit = self.unit()
        version = int(self.resource.get("meta", {}).get("versionId", "0")) or None
        async with unit:
            if alongside is not None:
                resource = await alongside(unit, resource)
            staged = await unit.update(resource, if_match=version)
            if event is not None:
                unit.emit(event, payload or {}, source_service=_service_name(self.request))
            await unit.commit()
        assert staged.result is not None
        return orjson.loads(staged.result.body)  # type: ignore[no-any-return]


def _service_name(request: Request) -> str:
    route = request.scope.get("route")
    tags = getattr(route, "tags", None) or ["api"]
    return str(tags[0])


# -- scopes ------------------------------------------------------------------------------------
class Scope:
    """A parent path parameter that narrows a facade's routes (see the module docstring)."""

    param: str = ""

    async def enter(self, ctx: ApiContext, value: str) -> None:
        """Refuse (404/403) a caller who may not work in this scope."""

    def criteria(self, value: str) -> list[tuple[str, str]]:
        return []

    def stamp(self, resource: JSON, value: str) -> JSON:
        """Mark a resource created in the scope."""
        return resource

    def contains(self, ctx: ApiContext, resource: JSON, value: str) -> bool:
        return True


MEMBERS = "org_members"


@dataclass
class OrganizationScope(Scope):
    """``/api/organizations/{org_id}/...``: the organization's own resources (owner label
    ``_security=urn:healthplatform:organization|<org_id>``), for its members and platform
    administrators; what is created there is owned by it."""

    param: str = "org_id"

    async def enter(self, ctx: ApiContext, value: str) -> None:
        await require_organization(ctx, value)

    def criteria(self, value: str) -> list[tuple[str, str]]:
        return [("_security", f"{OWNER_SYSTEM}|{value}")]

    def stamp(self, resource: JSON, value: str) -> JSON:
        return with_owners(resource, owner_labels(resource) | {value})

    def contains(self, ctx: ApiContext, resource: JSON, value: str) -> bool:
        return value in owner_labels(resource)


@dataclass
class PatientScope(Scope):
    """``/api/patients/{patient_id}/...``: one patient's records, reached through the
    reference parameter ``search`` (``subject``, ``patient``); the caller must be able
    to see the patient."""

    search: str = "subject"
    param: str = "patient_id"

    async def enter(self, ctx: ApiContext, value: str) -> None:
        await require_patient(ctx, value)

    def criteria(self, value: str) -> list[tuple[str, str]]:
        return [(self.search, f"Patient/{value}")]

    def contains(self, ctx: ApiContext, resource: JSON, value: str) -> bool:
        return value in ctx.fhir.patients_of(resource)


async def require_organization(ctx: ApiContext, org_id: str,
                               action: str = "organization.work-in") -> None:
    """404 for an unknown organization; 403 unless the policy lets the caller do
    ``action`` in it."""
    # Organizations are directory entries any signed-in user may read.
    if await ctx.fhir.find_json("Organization", org_id) is None:
        raise not_found("Organization")
    ctx.authorize(action, org_id)


async def require_patient(ctx: ApiContext, patient_id: str) -> JSON:
    """The patient, when the caller may see it (404 unknown, 403 not theirs to see)."""
    patient = await ctx.fhir.find_json("Patient", patient_id)
    if patient is None:
        raise not_found("Patient")
    return patient


async def visible_patient(ctx: ApiContext, payload: JSON) -> JSON:
    """A facade's ``prepare``: a create whose ``patient_id`` the caller may not see is
    refused (404 unknown, 403 not theirs to see) before anything is mapped."""
    await require_patient(ctx, payload["patient_id"])
    return payload


# -- one page of a list ------------------------------------------------------------------------
@dataclass
class FoundPage:
    resources: list[JSON]
    total: int
    included: list[JSON] = field(default_factory=list)


async def search_page(fhir: CallerFhir, resource_type: str | Sequence[str],
                      params: Sequence[tuple[str, str]], page: Pagination) -> FoundPage:
    """One page of a list as ONE FHIR search over what ``fhir``'s caller may see:
    ``_count``/``_offset`` from the page, the exact total, and what the search's
    ``_include``/``_revinclude`` brought (for the page's views)."""
    if page.offset + page.limit > MAX_OFFSET:
        raise ApiError(422, "VALIDATION_ERROR", f"page is too deep: at most "
                       f"{MAX_OFFSET} items can be paged through; narrow the list",
                       field="page")
    types = [resource_type] if isinstance(resource_type, str) else list(resource_type)
    plan = await fhir.parse(types, params, strict=True)
    plan.count, plan.offset, plan.total = page.limit, page.offset, "accurate"
    result = await fhir.search_page(plan)
    return FoundPage([orjson.loads(s.body) for s in result.resources], result.total or 0,
                     [orjson.loads(s.body) for s in result.included])


# -- creates that must be the first of their kind ----------------------------------------------
class Duplicate(Exception):
    """A create staged with :func:`create_unique` found a match: its unit of work fails."""


async def create_unique(unit: FhirUnit, resource: JSON, criteria: Sequence[tuple[str, str]],
                        **options: Any) -> Any:
    """Stage ``resource`` created only when the caller sees nothing matching ``criteria``
    (a conditional create, re-checked inside the commit); when something matches, the
    whole unit of work fails (its other writes depend on this one), and its commit raises
    a ``StoreError`` for which :func:`is_duplicate` is true."""
    staged = await unit.create(resource, if_none_exist=list(criteria), **options)

    def refuse_a_second(_staging: Any) -> None:
        if staged.existing:
            raise Duplicate(f"a {resource.get('resourceType')} matching {criteria} exists")
    unit.after_writes(refuse_a_second)
    return staged


def is_duplicate(error: BaseException) -> bool:
    return isinstance(error.__cause__, Duplicate)


# -- search parameters of list filters ---------------------------------------------------------
@dataclass(frozen=True)
class SearchParam:
    """Metadata of a ``query`` model field: the FHIR search parameter it becomes, with
    ``template`` formatting the value (``"Patient/{}"``; path parameters by name:
    ``"urn:x:{org_id}|{}"``)."""

    name: str
    template: str = "{}"


def _filter_params(query: BaseModel | None, path: Mapping[str, str]
                   ) -> list[tuple[str, str]]:
    if query is None:
        return []
    params = []
    for name, info in type(query).model_fields.items():
        value = getattr(query, name)
        target = next((m for m in info.metadata if isinstance(m, SearchParam)), None)
        if value is None or target is None:
            continue
        text = value if isinstance(value, str) else (
            value.isoformat() if isinstance(value, date) else  # datetime is a date too
            str(getattr(value, "value", value)))
        params.append((target.name, target.template.format(text, **path)))
    return params


# -- status tables ------------------------------------------------------------------------------
@dataclass(frozen=True)
class StatusTable:
    """Allowed status moves of a resource; a refused move is a 409 INVALID_TRANSITION."""

    moves: Mapping[str, frozenset[str]]
    element: str = "status"  # the FHIR element holding the status

    @classmethod
    def of(cls, element: str = "status", **moves: Sequence[str]) -> "StatusTable":
        return cls({state.replace("_", "-"): frozenset(nxt) for state, nxt in moves.items()},
                   element)

    def check(self, current: str, target: str) -> None:
        if target not in self.moves.get(current, frozenset()):
            allowed = ", ".join(sorted(self.moves.get(current, ()))) or "none"
            raise conflict("INVALID_TRANSITION",
                           f"Cannot move from {current!r} to {target!r} (allowed: {allowed})")

    def move(self, resource: JSON, target: str) -> JSON:
        current = str(resource.get(self.element, ""))
        self.check(current, target)
        return {**resource, self.element: target}


@dataclass(frozen=True)
class Unique:
    """What a create must not duplicate: the criteria (from the FHIR resource about to be
    created; none: nothing to compare it by) and the 409 code and message when a visible
    resource already matches."""

    criteria: Callable[[JSON], list[tuple[str, str]]]
    code: str
    message: str


@dataclass(frozen=True)
class Events:
    """Domain events of a facade: topics for created / updated / deleted, and the payload
    (from the stored resource's /api view, by default the view itself)."""

    created: str | None = None
    updated: str | None = None
    deleted: str | None = None
    payload: Callable[[JSON], JSON] | None = None


@dataclass
class Write:
    """A facade's write in progress, as ``alongside`` sees it: ``resource`` is what will be
    stored (its id set; on delete, the current version), ``payload`` the /api payload
    (None on delete), ``current`` the version it replaces (None on create)."""

    ctx: ApiContext
    unit: FhirUnit
    resource: JSON
    payload: JSON | None
    current: JSON | None

    @property
    def change(self) -> str:
        """created | updated | deleted"""
        if self.payload is None:
            return "deleted"
        return "created" if self.current is None else "updated"


ToFhir = Callable[[JSON, ApiContext, JSON | None], JSON]
FromFhir = Callable[[JSON], JSON]
Views = Callable[[ApiContext, list[JSON]], Awaitable[list[JSON]]]
ItemHandler = Callable[[ItemContext[Any]], Awaitable[JSON]]
Prepare = Callable[[ApiContext, JSON], Awaitable[JSON]]
# Criteria a list adds (may be a coroutine: e.g. it checks the patient named is visible).
ListCriteria = Callable[[ApiContext, Any],
                        list[tuple[str, str]] | Awaitable[list[tuple[str, str]]]]
Alongside = Callable[[Write], Awaitable[JSON]]


@dataclass
class Facade:
    resource: str
    name: str
    create: type[BaseModel]
    view: type[BaseModel]
    from_fhir: FromFhir
    # None for a facade whose writes are its own routes (no generated create or update)
    to_fhir: ToFhir | None = None
    update: type[BaseModel] | None = None
    query: type[BaseModel] | None = None
    scope: Scope | None = None
    fixed: Sequence[tuple[str, str]] = ()
    sort: str = "-_lastUpdated"
    unique: Unique | None = None
    statuses: StatusTable | None = None
    events: Events = field(default_factory=Events)
    # Views of many resources at once, when a view needs more than the resource
    # (results with their observations): one query for the page, not one per item.
    views: Views | None = None
    # Fills in a create's payload before it is mapped (a generated number, a default).
    prepare: Prepare | None = None
    # Criteria a list adds from the caller and its filters (e.g. "my own orders").
    list_criteria: ListCriteria | None = None
    summaries: Mapping[str, str] = field(default_factory=dict)
    # Its creates belong to no organization (a user's own record), whoever writes them.
    ownerless: bool = False
    # More FHIR types the facade spans (a schedulable resource is a Practitioner, a
    # Location or a Device): lists search them all at once, a get reads the id in each.
    also: Sequence[str] = ()
    # Stages what a create, update or delete brings with it (see the module docstring).
    alongside: Alongside | None = None
    # A create whose unit of work fails on a duplicate document (a number ``prepare``
    # drew from a counter another request claimed first) is prepared and tried again,
    # in a new unit of work, up to this many times.
    retries: int = 0
    tags: Sequence[str] = ()
    _router: APIRouter | None = None
    _prefix: str = ""

    # -- building blocks ---------------------------------------------------------------------
    async def render(self, ctx: ApiContext, resources: list[JSON]) -> list[JSON]:
        """The views of ``resources``; those stored with wrongly shaped elements are
        shown without them (module docstring) rather than failing the request."""
        try:
            return await self._render(ctx, resources)
        except VIEW_FAULTS:
            sound = [without_invalid_elements(r) for r in resources]
            mended = [r for r, s in zip(resources, sound, strict=True) if r is not s]
            if not mended:
                raise  # a fault of the view itself, not of the records
            for resource in mended:
                log.warning("%s/%s is stored with elements FHIR R4 does not allow; its "
                            "/api view leaves them out", resource.get("resourceType"),
                            resource.get("id"))
            return await self._render(ctx, sound)

    async def _render(self, ctx: ApiContext, resources: list[JSON]) -> list[JSON]:
        if self.views is not None:
            return await self.views(ctx, resources)
        return [self.from_fhir(r) for r in resources]

    async def render_one(self, ctx: ApiContext, resource: JSON) -> JSON:
        return (await self.render(ctx, [resource]))[0]

    @property
    def types(self) -> list[str]:
        """The FHIR types the facade reads and writes (``resource`` first)."""
        return [self.resource, *self.also]

    def _scope_value(self, ctx: ApiContext) -> str | None:
        return ctx.path.get(self.scope.param) if self.scope is not None else None

    async def enter(self, ctx: ApiContext) -> None:
        value = self._scope_value(ctx)
        if self.scope is not None and value is not None:
            await self.scope.enter(ctx, value)

    async def load(self, ctx: ApiContext, resource_id: str) -> JSON:
        """The resource, read as the caller (404 unknown or outside the scope and the fixed
        criteria, 403 not the caller's to see)."""
        await self.enter(ctx)
        resource = None
        for resource_type in self.types:
            try:
                resource = await ctx.fhir.read_json(resource_type, resource_id)
                break
            except (ResourceNotFound, ResourceGone):
                continue
        if resource is None:
            raise not_found(self.name)
        value = self._scope_value(ctx)
        if (self.scope is not None and value is not None
                and not self.scope.contains(ctx, resource, value)) \
                or not _fixed_hold(resource, self.fixed, lambda r, p: _token_values(ctx, r, p)):
            raise not_found(self.name)
        return resource

    async def search(self, ctx: ApiContext, page: Pagination, extra: Sequence[tuple[str, str]]
                     = ()) -> tuple[list[JSON], int]:
        """One page of the caller's resources (scope, fixed criteria, ``extra``), with the
        exact total of what the caller may see."""
        await self.enter(ctx)
        value = self._scope_value(ctx)
        params = [*(self.scope.criteria(value) if self.scope and value else []),
                  *self.fixed, *extra, ("_sort", self.sort)]
        found = await search_page(ctx.fhir, self.types, params, page)
        return found.resources, found.total

    async def create_from(self, ctx: ApiContext, payload: JSON) -> JSON:
        """Map, stage, emit and commit a create in the request's unit of work; the stored
        resource (as committed: no re-read). With ``retries``, a duplicate document
        prepares and tries it again."""
        for attempt in range(self.retries + 1):
            try:
                return await self._create_once(ctx, payload)
            except DuplicateDocument:
                if attempt == self.retries:
                    raise
                ctx._unit = None  # that unit failed: the next try has its own
        raise AssertionError("unreachable")

    async def _create_once(self, ctx: ApiContext, payload: JSON) -> JSON:
        if self.prepare is not None:
            payload = await self.prepare(ctx, payload)
        resource = self._mapper()(payload, ctx, None)
        value = self._scope_value(ctx)
        if self.scope is not None and value is not None:
            resource = self.scope.stamp(resource, value)
        unit = ctx.unit()
        async with unit:
            if self.alongside is not None:
                resource = await self.alongside(Write(
                    ctx, unit, {**resource, "id": resource.get("id") or new_id()}, payload,
                    None))
            kind = resource.get("resourceType")
            staged = await unit.create(
                resource, resource_id=resource.get("id"),
                expected_type=kind if kind in self.types else self.resource,
                ownerless=self.ownerless,
                # no criteria: nothing to compare this resource by (e.g. an uncoded one)
                if_none_exist=(self.unique.criteria(resource) or None) if self.unique
                else None)
            if self.events.created:
                unit.after_writes(lambda staging: None if staged.existing else staging.emit(
                    self.events.created or "", self._event_payload(staged_body(staged)),
                    source_service=self._source()))
            await unit.commit()
        if staged.existing and self.unique is not None:
            raise conflict(self.unique.code, self.unique.message)
        return staged_body(staged)

    def _event_payload(self, resource: JSON) -> JSON:
        return self.events.payload(resource) if self.events.payload else self.from_fhir(resource)

    def _mapper(self) -> ToFhir:
        if self.to_fhir is None:
            raise TypeError(f"The {self.name} facade maps no payload to FHIR (to_fhir)")
        return self.to_fhir

    def _source(self) -> str:
        return (self.tags or [self.name.lower()])[0]

    async def update_from(self, ctx: ApiContext, resource_id: str, payload: JSON) -> JSON:
        async def once() -> JSON:
            current = await self.load(ctx, resource_id)
            changed = self._mapper()(payload, ctx, current)
            alongside = self.alongside

            async def along(unit: FhirUnit, resource: JSON) -> JSON:
                assert alongside is not None
                return await alongside(Write(ctx, unit, resource, payload, current))
            return await self._item(ctx, current, None).save(
                changed, event=self.events.updated,
                payload=self._event_payload({**changed, "id": resource_id}),
                alongside=along if alongside is not None else None)
        return await _until_stable(once)

    async def delete_one(self, ctx: ApiContext, resource_id: str) -> None:
        current = await self.load(ctx, resource_id)
        unit = ctx.unit()
        async with unit:
            if self.alongside is not None:
                await self.alongside(Write(ctx, unit, current, None, current))
            await unit.delete(current["resourceType"], resource_id,
                              if_match=int(current.get("meta", {}).get("versionId", 0)) or None)
            if self.events.deleted:
                unit.emit(self.events.deleted, self._event_payload(current),
                          source_service=self._source())
            await unit.commit()

    def _item(self, ctx: ApiContext, resource: JSON, body: BaseModel | None) -> ItemContext[Any]:
        return ItemContext(ctx.request, ctx.principal, ctx.services, ctx.access, ctx.fhir,
                           None, resource, body)

    # -- routes --------------------------------------------------------------------------------
    def mount(self, router: APIRouter, prefix: str,
              ops: Sequence[str] = ("list", "create", "get", "update", "delete"), *,
              update_method: str = "PUT") -> None:
        """Mount the CRUD routes ``ops`` under ``prefix``; ``facade.route`` and
        ``facade.action`` then add routes under the same prefix."""
        if self.to_fhir is None and {"create", "update"} & set(ops):
            raise TypeError(f"The {self.name} facade needs to_fhir to mount create/update")
        self._router, self._prefix = router, prefix
        said = {"list": f"List {self.name} records", "create": f"Create a {self.name}",
                "get": f"Get a {self.name}", "update": f"Update a {self.name}",
                "delete": f"Delete a {self.name}", **self.summaries}
        scope = _path_params(prefix)
        view_env, page_env = Envelope[self.view], PageEnvelope[self.view]  # type: ignore[name-defined]
        facade, query_model = self, self.query

        if "list" in ops:
            async def list_route(ctx: ApiContext = Depends(api_context),
                                 page: Pagination = Depends(pagination),
                                 query: Any = None, **path: str) -> Any:
                criteria = _filter_params(query, ctx.path)
                if facade.list_criteria is not None:
                    extra = facade.list_criteria(ctx, query)
                    criteria += await extra if inspect.isawaitable(extra) else extra
                found, total = await facade.search(ctx, page, criteria)
                return page.respond(await facade.render(ctx, found), total)
            _declare(list_route, scope, query=query_model)
            list_route.fhir_type = facade.resource  # type: ignore[attr-defined]
            router.add_api_route(prefix, list_route, methods=["GET"], response_model=page_env,
                                 summary=said["list"], tags=list(self.tags) or None)

        if "create" in ops:
            create_model = self.create

            async def create_route(body: Any, ctx: ApiContext = Depends(api_context),
                                   **path: str) -> Any:
                await facade.enter(ctx)
                stored = await facade.create_from(ctx, body.model_dump(exclude_unset=True))
                return created(await facade.render_one(ctx, stored))
            _declare(create_route, scope, body=create_model)
            conflicts = {self.unique.code: self.unique.message} if self.unique else {}
            create_route.fhir_type = facade.resource  # type: ignore[attr-defined]
            router.add_api_route(prefix, create_route, methods=["POST"], status_code=201,
                                 response_model=view_env, summary=said["create"],
                                 tags=list(self.tags) or None,
                                 responses=conflict_responses(conflicts))

        if "get" in ops:
            async def get_route(resource_id: str, ctx: ApiContext = Depends(api_context),
                                **path: str) -> Any:
                return ok(await facade.render_one(ctx, await facade.load(ctx, resource_id)))
            _declare(get_route, scope)
            get_route.fhir_type = facade.resource  # type: ignore[attr-defined]
            router.add_api_route(prefix + "/{resource_id}", get_route, methods=["GET"],
                                 response_model=view_env, summary=said["get"],
                                 tags=list(self.tags) or None)

        if "update" in ops:
            update_model = self.update or self.create

            async def update_route(resource_id: str, body: Any,
                                   ctx: ApiContext = Depends(api_context), **path: str) -> Any:
                saved = await facade.update_from(ctx, resource_id,
                                                 body.model_dump(exclude_unset=True))
                return ok(await facade.render_one(ctx, saved))
            _declare(update_route, scope, body=update_model)
            update_route.fhir_type = facade.resource  # type: ignore[attr-defined]
            router.add_api_route(prefix + "/{resource_id}", update_route,
                                 methods=[update_method], response_model=view_env,
                                 summary=said["update"], tags=list(self.tags) or None)

        if "delete" in ops:
            async def delete_route(resource_id: str, ctx: ApiContext = Depends(api_context),
                                   **path: str) -> Any:
                await facade.delete_one(ctx, resource_id)
                return ok({"id": resource_id, "deleted": True})
            _declare(delete_route, scope)
            delete_route.fhir_type = facade.resource  # type: ignore[attr-defined]
            router.add_api_route(prefix + "/{resource_id}", delete_route, methods=["DELETE"],
                                 summary=said["delete"], tags=list(self.tags) or None)

    def route(self, method: str, path: str, *, summary: str, body: type[BaseModel] | None
              = None, status_code: int = 200, load: bool = True,
              conflicts: Mapping[str, str] | None = None
              ) -> Callable[[ItemHandler], ItemHandler]:
        """Mount ``handler(ctx: ItemContext) -> resource`` at ``prefix + path`` (``path``
        names the item ``{resource_id}``, and may name more path parameters, read from
        ``ctx.path``); the answer is the view of what it returns. ``conflicts``: the 409
        codes the handler may answer and when, for the OpenAPI document (the other
        refusals are documented for every route)."""
        facade, router = self, self._mounted()
        scope = [*_path_params(self._prefix),
                 *(p for p in _path_params(path) if p != "resource_id")]

        def decorate(handler: ItemHandler) -> ItemHandler:
            async def endpoint(resource_id: str, request_body: Any = None,
                               ctx: ApiContext = Depends(api_context), **path: str) -> Any:
                async def once() -> JSON:
                    resource = (await facade.load(ctx, resource_id) if load
                                else {"id": resource_id})
                    return await handler(facade._item(ctx, resource, request_body))
                result = await _until_stable(once)
                return ok(await facade.render_one(ctx, result), status_code)
            _declare(endpoint, scope, body=body, body_name="request_body")
            endpoint.__name__ = handler.__name__
            endpoint.__doc__ = handler.__doc__
            endpoint.fhir_type = facade.resource  # type: ignore[attr-defined]
            router.add_api_route(self._prefix + path, endpoint, methods=[method],
                                 status_code=status_code,
                                 response_model=Envelope[self.view],  # type: ignore[name-defined]
                                 summary=summary, tags=list(self.tags) or None,
                                 responses=conflict_responses(conflicts or {}))
            return handler
        return decorate

    def action(self, name: str, *, to: str, summary: str, event: str | None = None,
               change: Callable[[JSON, ItemContext[Any]], JSON] | None = None) -> None:
        """``POST {prefix}/{resource_id}/{name}``: move the status to ``to`` through the
        status table (409 INVALID_TRANSITION when refused), apply ``change`` (e.g. record
        who signed), save, emit ``event``."""
        move = self._mover(name, lambda ctx: to, change, event)
        move.__name__ = f"{name}_{self.resource.lower()}"
        self.route("POST", "/{resource_id}/" + name, summary=summary,
                   conflicts=_TRANSITION_CONFLICT)(move)

    def status_route(self, method: str = "PUT", path: str = "/{resource_id}/status", *,
                     body: type[BaseModel], summary: str, event: str | None = None,
                     change: Callable[[JSON, ItemContext[Any]], JSON] | None = None
                     ) -> None:
        """``<method> {prefix}{path}`` with a body whose ``status`` field names the target:
        the move goes through the status table (409 INVALID_TRANSITION when refused),
        then ``change`` (e.g. record the reason), save, ``event``."""
        def target(ctx: ItemContext[Any]) -> str:
            status = getattr(ctx.body, "status", None)
            return str(getattr(status, "value", status))
        move = self._mover("status", target, change, event)
        move.__name__ = f"change_{self.resource.lower()}_status"
        self.route(method, path, summary=summary, body=body,
                   conflicts=_TRANSITION_CONFLICT)(move)

    def _mover(self, name: str, target: Callable[[ItemContext[Any]], str],
               change: Callable[[JSON, ItemContext[Any]], JSON] | None,
               event: str | None) -> ItemHandler:
        table = self.statuses
        if table is None:
            raise ValueError(f"{self.name} has no status table for the action {name!r}")

        async def move(ctx: ItemContext[Any]) -> JSON:
            moved = table.move(ctx.resource, target(ctx))
            if change is not None:
                moved = change(moved, ctx)
            return await ctx.save(moved, event=event, payload=self._event_payload(moved))
        return move

    def _mounted(self) -> APIRouter:
        if self._router is None:
            raise RuntimeError(f"mount the {self.name} facade before adding routes to it")
        return self._router


def conflict_responses(conflicts: Mapping[str, str]) -> dict[int | str, dict[str, Any]]:
    """The 409 of a route in the OpenAPI document, its codes and when each is answered."""
    if not conflicts:
        return {}
    said = "; ".join(f"{code}: {when}" for code, when in conflicts.items())
    return {409: {"model": ErrorEnvelope, "description": f"Conflict ({said})"}}


SAVE_ATTEMPTS = 3
# How a refused status move is documented (OpenAPI) on the routes that make one.
_TRANSITION_CONFLICT = {"INVALID_TRANSITION": "the status table has no such move from the "
                                              "current status"}


async def _until_stable(once: Callable[[], Awaitable[JSON]]) -> JSON:
    """Run a load-change-save again when another writer changed the resource between the
    load and the save: an /api client sends no version, so what it asked is applied to
    the latest one (and checked again) rather than refused."""
    for attempt in range(SAVE_ATTEMPTS):
        try:
            return await once()
        except (VersionConflict, ConditionChanged):
            if attempt == SAVE_ATTEMPTS - 1:
                raise
    raise AssertionError("unreachable")


# For areas whose load-change-save is not one ``facade.route`` (several resources written
# together): the same retry when another writer got there first.
until_stable = _until_stable


def staged_body(staged: Any) -> JSON:
    assert staged.result is not None
    return orjson.loads(staged.result.body)  # type: ignore[no-any-return]


TokenValues = Callable[[JSON, str], frozenset[tuple[str | None, str | None]] | None]


def _token_values(ctx: ApiContext, resource: JSON, param: str
                  ) -> frozenset[tuple[str | None, str | None]] | None:
    """The resource's values in the token search parameter ``param`` (None when ``param``
    is not one of its type's token parameters)."""
    if not ctx.fhir.service.token_param(str(resource.get("resourceType")), param):
        return None
    return ctx.fhir.tokens_of(resource, param)


def _fixed_hold(resource: JSON, fixed: Sequence[tuple[str, str]],
                tokens: TokenValues | None = None) -> bool:
    """A loaded resource must match the facade's fixed criteria on the elements they name
    (the common ``category``, ``code`` and ``intent`` codes, a comma meaning any of them,
    and with ``tokens`` any token search parameter of its type, e.g. ``type``); others are
    checked by the lists' searches only."""
    for param, value in fixed:
        wanted = {v.rsplit("|", 1)[-1] for v in value.split(",")}
        if param in ("category", "code"):
            concepts = resource.get(param) or []
            concepts = concepts if isinstance(concepts, list) else [concepts]
            codes = {c.get("code") for concept in concepts
                     for c in (concept.get("coding") or [])}
            if wanted.isdisjoint(codes):
                return False
        elif param in ("intent", "status") and resource.get(param) not in wanted:
            return False
        elif param == "_tag" and not _has_tag(resource, value):
            return False
        elif param not in ("category", "code", "intent", "status", "_tag") \
                and tokens is not None and (values := tokens(resource, param)) is not None \
                and not any(_token_matches(values, v) for v in value.split(",")):
            return False
    return True


def _token_matches(values: frozenset[tuple[str | None, str | None]], token: str) -> bool:
    """A ``system|code`` (or bare ``code``) search value against a resource's values."""
    system, bar, code = token.rpartition("|")
    return any(c == code and (not bar or s == (system or None)) for s, c in values)


def _has_tag(resource: JSON, token: str) -> bool:
    """``meta.tag`` holds ``system|code`` (``system|``: any code of the system)."""
    system, _, code = token.rpartition("|")
    return any(t.get("system") == system and (not code or t.get("code") == code)
               for t in (resource.get("meta") or {}).get("tag") or [] if isinstance(t, dict))


# -- building endpoint signatures --------------------------------------------------------------
def _path_params(prefix: str) -> list[str]:
    return [part[1:-1] for part in prefix.split("/") if part.startswith("{")]


def _declare(endpoint: Callable[..., Any], scope: Sequence[str], *,
             body: type[BaseModel] | None = None, body_name: str = "body",
             query: type[BaseModel] | None = None) -> None:
    """Give ``endpoint`` (which takes ``**path``) the signature FastAPI should see: the
    prefix's path parameters (documented, and read by the scope from the request), the
    body model, the query model of list filters."""
    signature = inspect.signature(endpoint)
    params = []
    for param in signature.parameters.values():
        if param.kind is inspect.Parameter.VAR_KEYWORD:
            continue
        if param.name == body_name:
            if body is None:
                continue
            param = param.replace(annotation=body, default=inspect.Parameter.empty)
        elif param.name == "query":
            if query is None:
                continue
            param = param.replace(annotation=Annotated[query, Query()],
                                  default=inspect.Parameter.empty)
        params.append(param.replace(kind=inspect.Parameter.KEYWORD_ONLY))
    path = [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, annotation=str)
            for name in scope]
    endpoint.__signature__ = signature.replace(  # type: ignore[attr-defined]
        parameters=[*path, *params])


__all__ = [
    "ApiContext", "Duplicate", "Events", "Facade", "FoundPage", "ItemContext",
    "ListCriteria", "OrganizationScope", "PatientScope", "Scope", "SearchParam",
    "StatusTable", "Unique", "Write", "api_context", "create_unique", "is_duplicate",
    "require_organization", "require_patient", "search_page", "staged_body",
    "until_stable", "visible_patient",
]
