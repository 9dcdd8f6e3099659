"""The FHIR REST API mounted at ``/fhir``: routes → interactions.

``fhir_server`` knows nothing of the platform's auth: the app passes ``authenticate``,
an async callable that raises when the request carries no valid credentials.

Order matters where paths overlap: fixed segments (``_history``, ``_search``,
``$everything``) are declared before the parameterized routes that would swallow them.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import APIRouter, Depends
from starlette.requests import Request
from starlette.responses import Response

from fhir_server.interactions.capabilities import capabilities, capability_statement
from fhir_server.interactions.context import FhirContext
from fhir_server.interactions.create import create
from fhir_server.interactions.delete import conditional_delete, delete
from fhir_server.interactions.everything import everything
from fhir_server.interactions.history import history
from fhir_server.interactions.patch import conditional_patch, patch
from fhir_server.interactions.read import read
from fhir_server.interactions.search_compartment import search_compartment
from fhir_server.interactions.search_system import search_system
from fhir_server.interactions.search_type import search_type
from fhir_server.interactions.transaction import transaction_or_batch
from fhir_server.interactions.update import conditional_update, update
from fhir_server.interactions.vread import vread

TYPE_INTERACTIONS = (
    "read", "vread", "update", "patch", "delete", "history-instance", "history-type",
    "create", "search-type",
)
SYSTEM_INTERACTIONS = ("transaction", "batch", "search-system", "history-system")
Authenticate = Callable[[Request], Awaitable[Any]]


def build_fhir_router(ctx: FhirContext, authenticate: Authenticate) -> APIRouter:
    # The prefix sits on these routers (not on the outer one) so that "/fhir" itself can be
    # a route: the system search and the transaction/batch endpoint.
    guarded = APIRouter(prefix="/fhir", dependencies=[Depends(authenticate)])
    public = APIRouter(prefix="/fhir")
    statements: dict[str, dict[str, Any]] = {}  # per registry version

    @public.get("/metadata", summary="CapabilityStatement", tags=["fhir"])
    async def metadata(request: Request) -> Response:
        registry = await ctx.service.refresh_registry()
        if registry.version not in statements:
            statements[registry.version] = capability_statement(
                ctx.fhir_base(request), TYPE_INTERACTIONS, SYSTEM_INTERACTIONS, registry)
        return await capabilities(ctx, request, statements[registry.version])

    # -- system level ---------------------------------------------------------------------
    @guarded.get("", summary="search-system", tags=["fhir"])
    async def search_system_get(request: Request) -> Response:
        return await search_system(ctx, request)

    @guarded.post("", summary="transaction / batch", tags=["fhir"])
    async def bundle_route(request: Request) -> Response:
        return await transaction_or_batch(ctx, request)

    @guarded.post("/_search", summary="search-system (POST)", tags=["fhir"])
    async def search_system_post(request: Request) -> Response:
        return await search_system(ctx, request)

    @guarded.get("/_history", summary="history-system", tags=["fhir"])
    async def history_system(request: Request) -> Response:
        return await history(ctx, request)

    # -- type level -----------------------------------------------------------------------
    @guarded.get("/{resource_type}", summary="search-type", tags=["fhir"])
    async def search_get(request: Request, resource_type: str) -> Response:
        return await search_type(ctx, request, resource_type)

    @guarded.post("/{resource_type}/_search", summary="search-type (POST)", tags=["fhir"])
    async def search_post(request: Request, resource_type: str) -> Response:
        return await search_type(ctx, request, resource_type)

    @guarded.get("/{resource_type}/_history", summary="history-type", tags=["fhir"])
    async def history_type(request: Request, resource_type: str) -> Response:
        return await history(ctx, request, resource_type)

    @guarded.post("/{resource_type}", summary="create (If-None-Exist: conditional)",
                  tags=["fhir"])
    async def create_route(request: Request, resource_type: str) -> Response:
        return await create(ctx, request, resource_type)

    @guarded.put("/{resource_type}", summary="conditional update", tags=["fhir"])
    async def conditional_update_route(request: Request, resource_type: str) -> Response:
        return await conditional_update(ctx, request, resource_type)

    @guarded.patch("/{resource_type}", summary="conditional patch", tags=["fhir"])
    async def conditional_patch_route(request: Request, resource_type: str) -> Response:
        return await conditional_patch(ctx, request, resource_type)

    @guarded.delete("/{resource_type}", summary="conditional delete", tags=["fhir"])
    async def conditional_delete_route(request: Request, resource_type: str) -> Response:
        return await conditional_delete(ctx, request, resource_type)

    # -- instance level -------------------------------------------------------------------
    @guarded.get("/{resource_type}/{resource_id}", summary="read", tags=["fhir"])
    async def read_route(request: Request, resource_type: str, resource_id: str) -> Response:
        return await read(ctx, request, resource_type, resource_id)

    @guarded.put("/{resource_type}/{resource_id}", summary="update", tags=["fhir"])
    async def update_route(request: Request, resource_type: str, resource_id: str) -> Response:
        return await update(ctx, request, resource_type, resource_id)

    @guarded.patch("/{resource_type}/{resource_id}", summary="patch", tags=["fhir"])
    async def patch_route(request: Request, resource_type: str, resource_id: str) -> Response:
        return await patch(ctx, request, resource_type, resource_id)

    @guarded.delete("/{resource_type}/{resource_id}", summary="delete", tags=["fhir"])
    async def delete_route(request: Request, resource_type: str, resource_id: str) -> Response:
        return await delete(ctx, request, resource_type, resource_id)

    @guarded.get("/{resource_type}/{resource_id}/_history", summary="history-instance",
                 tags=["fhir"])
    async def history_instance(request: Request, resource_type: str, resource_id: str
                               ) -> Response:
        return await history(ctx, request, resource_type, resource_id)

    @guarded.get("/Patient/{patient_id}/$everything", summary="Patient/$everything",
                 tags=["fhir"])
    async def everything_route(request: Request, patient_id: str) -> Response:
        return await everything(ctx, request, patient_id)

    @guarded.get("/{compartment_type}/{owner_id}/{resource_type}",
                 summary="search-compartment", tags=["fhir"])
    async def compartment_route(request: Request, compartment_type: str, owner_id: str,
                                resource_type: str) -> Response:
        return await search_compartment(ctx, request, compartment_type, owner_id,
                                        resource_type)

    @guarded.get("/{resource_type}/{resource_id}/_history/{version_id}", summary="vread",
                 tags=["fhir"])
    async def vread_route(request: Request, resource_type: str, resource_id: str,
                          version_id: str) -> Response:
        return await vread(ctx, request, resource_type, resource_id, version_id)

    router = APIRouter()
    router.include_router(public)
    router.include_router(guarded)
    return router
