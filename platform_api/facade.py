"""The facade kit: declarative /api ⇄ FHIR mappings, a router factory, status tables.

A facade names one FHIR resource type, the pydantic models of its /api payloads (so the
OpenAPI document shows them), and two mapping functions:

- ``to_fhir(payload, ctx, existing)``: the FHIR resource for a payload; on update
  ``existing`` is the current resource and only the mapped elements change, so data the
  resource got elsewhere (FHIR clients, HL7v2) survives an /api update;
- ``from_fhir(resource)``: the /api view of a stored resource.

Writes go through the FHIR service (validation, versioning, indexing, events happen once).
The router factory builds list / create / get / update / delete routes with the envelope,
pagination and an access rule; routes that are not plain CRUD are small functions next to
the facade that use ``Facade.load`` / ``Facade.save`` and a :class:`StatusTable`.
"""

# No ``from __future__ import annotations`` here: the route functions built in
# ``Facade.routes`` annotate their bodies with the facade's own models, which FastAPI must
# see as classes, not as strings it cannot resolve from this module's globals.

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson
from fastapi import APIRouter, Depends, Request
from pydantic import BaseModel

from fhir_server.store import ResourceGone, ResourceNotFound, StoredResource, UnitOfWork
from platform_api.auth.dependencies import current_principal
from platform_api.auth.principal import Principal
from platform_api.envelope import (
    ApiError,
    Envelope,
    PageEnvelope,
    Pagination,
    conflict,
    created,
    forbidden,
    not_found,
    ok,
    pagination,
)
from platform_api.services import Services

JSON = dict[str, Any]


@dataclass(frozen=True, slots=True)
class MappingContext:
    """What a mapper may need besides the payload: who is calling, and the services."""

    principal: Principal
    services: Services
    extra: Mapping[str, Any] = field(default_factory=dict)


ToFhir = Callable[[JSON, MappingContext, JSON | None], JSON]
FromFhir = Callable[[JSON], JSON]
AccessRule = Callable[[Principal, JSON | None, Services], Awaitable[bool]]


@dataclass(frozen=True)
class StatusTable:
    """Allowed status moves of a resource; a refused move is a 409 INVALID_TRANSITION."""

    moves: Mapping[str, frozenset[str]]

    @classmethod
    def of(cls, **moves: Sequence[str]) -> "StatusTable":
        return cls({state.replace("_", "-"): frozenset(nxt) for state, nxt in moves.items()})

    def check(self, current: str, target: str) -> None:
        if target not in self.moves.get(current, frozenset()):
            allowed = ", ".join(sorted(self.moves.get(current, ()))) or "none"
            raise conflict("INVALID_TRANSITION",
                           f"Cannot move from {current!r} to {target!r} (allowed: {allowed})")


async def allow_all(principal: Principal, resource: JSON | None, services: Services) -> bool:
    return True


async def platform_admin_only(principal: Principal, resource: JSON | None,
                              services: Services) -> bool:
    return principal.is_platform_admin


@dataclass
class Access:
    read: AccessRule = allow_all
    write: AccessRule = allow_all
    list: AccessRule = allow_all


@dataclass
class Facade:
    resource: str
    create_model: type[BaseModel]
    view_model: type[BaseModel]
    to_fhir: ToFhir
    from_fhir: FromFhir
    update_model: type[BaseModel] | None = None
    access: Access = field(default_factory=Access)
    name: str = ""

    def __post_init__(self) -> None:
        self.name = self.name or self.resource

    # -- building blocks for custom routes -------------------------------------------
    async def load(self, services: Services, resource_id: str) -> tuple[JSON, StoredResource]:
        try:
            stored = await services.fhir.read(self.resource, resource_id)
        except (ResourceNotFound, ResourceGone):
            raise not_found(self.name) from None
        return orjson.loads(stored.body), stored

    def view(self, resource: JSON) -> JSON:
        return self.from_fhir(resource)

    def stage_new(self, uow: UnitOfWork, payload: JSON, ctx: MappingContext) -> JSON:
        """Stage the create of the resource for ``payload``; returns the FHIR resource with
        its assigned id (meta is filled in at commit)."""
        resource = self.to_fhir(payload, ctx, None)
        staged = ctx.services.fhir.stage_create(uow, resource)
        resource["id"] = staged.id
        return resource

    async def create(self, payload: JSON, ctx: MappingContext) -> JSON:
        async with ctx.services.store.unit_of_work() as uow:
            staged = ctx.services.fhir.stage_create(uow, self.to_fhir(payload, ctx, None))
            await uow.commit()
        assert staged.result is not None
        return self.view(orjson.loads(staged.result.body))

    async def save(self, resource: JSON, stored: StoredResource, services: Services) -> JSON:
        """Store a changed resource, refusing if someone else changed it meanwhile."""
        async with services.store.unit_of_work() as uow:
            staged = services.fhir.stage_update(uow, resource, if_match=stored.version)
            await uow.commit()
        assert staged.result is not None
        return orjson.loads(staged.result.body)  # type: ignore[no-any-return]

    async def update(self, resource_id: str, payload: JSON, ctx: MappingContext) -> JSON:
        current, stored = await self.load(ctx.services, resource_id)
        if not await self.access.write(ctx.principal, current, ctx.services):
            raise forbidden()
        changed = self.to_fhir(payload, ctx, current)
        return self.view(await self.save(changed, stored, ctx.services))

    # -- router factory ----------------------------------------------------------------
    def routes(self, prefix: str, ops: Sequence[str] = ("list", "create", "get", "update",
                                                      "delete"),
               *, tags: Sequence[str] = (), update_method: str = "PUT") -> APIRouter:
        router = APIRouter(prefix=prefix, tags=list(tags) or [self.name])
        facade = self
        create_model = self.create_model
        update_model = self.update_model or self.create_model
        view_env = Envelope[self.view_model]  # type: ignore[name-defined]
        page_env = PageEnvelope[self.view_model]  # type: ignore[name-defined]

        def services_of(request: Request) -> Services:
            return request.app.state.services  # type: ignore[no-any-return]

        if "list" in ops:
            @router.get("", response_model=page_env, summary=f"List {self.name} records")
            async def list_route(request: Request, page: Pagination = Depends(pagination),
                                 principal: Principal = Depends(current_principal)) -> Any:
                services = services_of(request)
                if not await facade.access.list(principal, None, services):
                    raise forbidden()
                found, total = await services.store.list_ids(
                    facade.resource, count=page.limit, offset=page.offset)
                return page.respond([facade.view(orjson.loads(s.body)) for s in found], total)

        if "create" in ops:
            @router.post("", status_code=201, response_model=view_env,
                         summary=f"Create a {self.name}")
            async def create_route(request: Request, body: create_model,  # type: ignore[valid-type]
                                   principal: Principal = Depends(current_principal)) -> Any:
                payload: BaseModel = body
                services = services_of(request)
                if not await facade.access.write(principal, None, services):
                    raise forbidden()
                ctx = MappingContext(principal, services)
                return created(await facade.create(payload.model_dump(exclude_unset=True), ctx))

        if "get" in ops:
            @router.get("/{resource_id}", response_model=view_env,
                        summary=f"Get a {self.name}")
            async def get_route(request: Request, resource_id: str,
                                principal: Principal = Depends(current_principal)) -> Any:
                services = services_of(request)
                resource, _ = await facade.load(services, resource_id)
                if not await facade.access.read(principal, resource, services):
                    raise forbidden()
                return ok(facade.view(resource))

        if "update" in ops:
            @router.api_route("/{resource_id}", methods=[update_method], response_model=view_env,
                              summary=f"Update a {self.name}")
            async def update_route(request: Request, resource_id: str,
                                   body: update_model,  # type: ignore[valid-type]
                                   principal: Principal = Depends(current_principal)) -> Any:
                payload: BaseModel = body
                ctx = MappingContext(principal, services_of(request))
                return ok(await facade.update(resource_id,
                                              payload.model_dump(exclude_unset=True), ctx))

        if "delete" in ops:
            @router.delete("/{resource_id}", summary=f"Delete a {self.name}")
            async def delete_route(request: Request, resource_id: str,
                                   principal: Principal = Depends(current_principal)) -> Any:
                services = services_of(request)
                resource, stored = await facade.load(services, resource_id)
                if not await facade.access.write(principal, resource, services):
                    raise forbidden()
                await services.fhir.delete(facade.resource, resource_id,
                                           if_match=stored.version)
                return ok({"id": resource_id, "deleted": True})

        return router


def require(condition: bool, message: str = "You do not have permission to do this") -> None:
    if not condition:
        raise ApiError(403, "FORBIDDEN", message)
