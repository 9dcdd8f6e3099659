"""The FHIR REST API mounted at ``/fhir``: routes → interactions.

``fhir_server`` knows nothing of the platform's auth: the app passes ``authenticate``,
an async callable that raises when the request carries no valid credentials.
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
from fhir_server.interactions.delete import delete
from fhir_server.interactions.history import history
from fhir_server.interactions.patch import patch
from fhir_server.interactions.read import read
from fhir_server.interactions.search_type import SUPPORTED, search_type
from fhir_server.interactions.update import update
from fhir_server.interactions.vread import vread

TYPE_INTERACTIONS = (
    "read", "vread", "update", "patch", "delete", "history-instance", "history-type",
    "create", "search-type",
)
SYSTEM_INTERACTIONS = ("history-system",)
Authenticate = Callable[[Request], Awaitable[Any]]


def _search_params() -> dict[str, list[dict[str, str]]]:
    docs = {"_id": ("token", "Logical id of the resource"),
            "_lastUpdated": ("date", "When the resource version last changed")}
    return {"Resource": [
        {"name": name, "definition": f"http://hl7.org/fhir/SearchParameter/Resource{name[1:]}"
         if name != "_lastUpdated" else "http://hl7.org/fhir/SearchParameter/Resource-lastUpdated",
         "type": docs[name][0], "documentation": docs[name][1]}
        for name in sorted(SUPPORTED)
    ]}


def build_fhir_router(ctx: FhirContext, authenticate: Authenticate) -> APIRouter:
    guarded = APIRouter(dependencies=[Depends(authenticate)])
    public = APIRouter()
    statement: dict[str, Any] | None = None

    @public.get("/metadata", summary="CapabilityStatement", tags=["fhir"])
    async def metadata(request: Request) -> Response:
        nonlocal statement
        if statement is None:
            statement = capability_statement(ctx.fhir_base(request), TYPE_INTERACTIONS,
                                              SYSTEM_INTERACTIONS, _search_params())
        return await capabilities(ctx, request, statement)

    @guarded.get("/_history", summary="history-system", tags=["fhir"])
    async def history_system(request: Request) -> Response:
        return await history(ctx, request)

    @guarded.get("/{resource_type}", summary="search-type", tags=["fhir"])
    async def search_get(request: Request, resource_type: str) -> Response:
        return await search_type(ctx, request, resource_type)

    @guarded.post("/{resource_type}/_search", summary="search-type (POST)", tags=["fhir"])
    async def search_post(request: Request, resource_type: str) -> Response:
        return await search_type(ctx, request, resource_type)

    @guarded.get("/{resource_type}/_history", summary="history-type", tags=["fhir"])
    async def history_type(request: Request, resource_type: str) -> Response:
        return await history(ctx, request, resource_type)

    @guarded.post("/{resource_type}", summary="create", tags=["fhir"])
    async def create_route(request: Request, resource_type: str) -> Response:
        return await create(ctx, request, resource_type)

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

    @guarded.get("/{resource_type}/{resource_id}/_history/{version_id}", summary="vread",
                 tags=["fhir"])
    async def vread_route(request: Request, resource_type: str, resource_id: str,
                          version_id: str) -> Response:
        return await vread(ctx, request, resource_type, resource_id, version_id)

    router = APIRouter(prefix="/fhir")
    router.include_router(public)
    router.include_router(guarded)
    return router
