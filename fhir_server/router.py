"""The FHIR REST API at ``/fhir``: one table of routes → interactions.

``fhir_server`` knows nothing of the platform's auth: the app passes ``authorize``, an
async callable that raises when the request carries no valid credentials and otherwise
answers the caller's :class:`~fhir_server.access.Access` (the platform's policy). Every
route but ``/metadata`` runs it before its interaction and keeps the caller-bound service
on the request (``FhirContext.caller``).

Why plain Starlette routes instead of FastAPI's: every FHIR handler takes the request and
returns a ready response, so FastAPI's dependency solving and its route matching through
every /api route cost a large share of a read (measured: about half of the in-process
time of ``GET /fhir/Patient/{id}``) and buy nothing. The routes are mounted ahead of the
/api routes; ``openapi_paths`` describes the same table for the OpenAPI document.

Below ``/fhir`` one ``FhirDispatch`` route matches by segments instead of a Starlette
``Router`` trying every route's regular expression in turn (a read is the 15th route:
that scan was a third of the in-process time of ``GET /fhir/Patient/{id}``).

Order matters where paths overlap: fixed segments (``_history``, ``_search``,
``$everything``) are declared before the parameterized routes that would swallow them.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from starlette.datastructures import URLPath
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Match, Route
from starlette.types import Receive, Scope, Send

from fhir_server.access import Access
from fhir_server.caller import CallerFhir
from fhir_server.interactions.capabilities import capabilities, capability_statement
from fhir_server.interactions.context import CALLER, FhirContext
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
from fhir_server.interactions.validate import validate
from fhir_server.interactions.vread import vread

TYPE_INTERACTIONS = (
    "read", "vread", "update", "patch", "delete", "history-instance", "history-type",
    "create", "search-type",
)
SYSTEM_INTERACTIONS = ("transaction", "batch", "search-system", "history-system")
Authorize = Callable[[Request], Awaitable[Access]]
Handler = Callable[..., Awaitable[Response]]


@dataclass(frozen=True, slots=True)
class FhirRoute:
    method: str
    path: str  # below /fhir; "" is the base itself
    summary: str
    handler: Handler  # handler(ctx, request, **path_params)
    public: bool = False
    body: bool = False  # takes a FHIR JSON body (for the OpenAPI document)


async def _metadata(ctx: FhirContext, request: Request) -> Response:
    registry = await ctx.service.refresh_registry()
    cache: dict[tuple[str, str], dict[str, Any]] = ctx.extras.setdefault(
        "capability_statements", {})
    base = ctx.fhir_base(request)
    key = (registry.version, base)
    if key not in cache:
        if len(cache) > 64:  # many Host names: bounded
            cache.clear()
        cache[key] = capability_statement(
            base, TYPE_INTERACTIONS, SYSTEM_INTERACTIONS, registry,
            security=None if ctx.security is None else ctx.security(base))
    return await capabilities(ctx, request, cache[key])


ROUTES: tuple[FhirRoute, ...] = (
    FhirRoute("GET", "/metadata", "capabilities: the CapabilityStatement", _metadata,
              public=True),
    # -- system level
    FhirRoute("GET", "", "search-system", search_system),
    FhirRoute("POST", "", "transaction / batch (a Bundle)", transaction_or_batch, body=True),
    FhirRoute("POST", "/_search", "search-system (POST)", search_system),
    FhirRoute("GET", "/_history", "history-system", history),
    # -- type level
    FhirRoute("POST", "/{resource_type}/$validate", "$validate (nothing is stored)", validate,
              body=True),
    FhirRoute("POST", "/{resource_type}/{resource_id}/$validate",
              "$validate for an existing resource (mode=update / delete)", validate,
              body=True),
    FhirRoute("GET", "/{resource_type}", "search-type", search_type),
    FhirRoute("POST", "/{resource_type}/_search", "search-type (POST)", search_type),
    FhirRoute("GET", "/{resource_type}/_history", "history-type", history),
    FhirRoute("POST", "/{resource_type}", "create (If-None-Exist: conditional create)",
              create, body=True),
    FhirRoute("PUT", "/{resource_type}", "conditional update", conditional_update, body=True),
    FhirRoute("PATCH", "/{resource_type}", "conditional patch (JSON Patch)",
              conditional_patch, body=True),
    FhirRoute("DELETE", "/{resource_type}", "conditional delete", conditional_delete),
    # -- instance level
    FhirRoute("GET", "/{resource_type}/{resource_id}", "read", read),
    FhirRoute("PUT", "/{resource_type}/{resource_id}", "update (or create with this id)",
              update, body=True),
    FhirRoute("PATCH", "/{resource_type}/{resource_id}", "patch (JSON Patch)", patch,
              body=True),
    FhirRoute("DELETE", "/{resource_type}/{resource_id}", "delete", delete),
    FhirRoute("GET", "/{resource_type}/{resource_id}/_history", "history-instance", history),
    FhirRoute("GET", "/Patient/{patient_id}/$everything", "Patient/$everything", everything),
    FhirRoute("GET", "/{compartment_type}/{owner_id}/{resource_type}", "search-compartment",
              search_compartment),
    FhirRoute("GET", "/{resource_type}/{resource_id}/_history/{version_id}", "vread", vread),
)


def _endpoint(ctx: FhirContext, route: FhirRoute, authorize: Authorize
              ) -> Callable[[Request], Awaitable[Response]]:
    handler = route.handler
    if route.public:
        async def public_endpoint(request: Request) -> Response:
            return await handler(ctx, request, **request.path_params)
        return public_endpoint

    async def guarded_endpoint(request: Request) -> Response:
        access = await authorize(request)
        request.scope.setdefault("state", {})[CALLER] = CallerFhir(ctx.service, access)
        return await handler(ctx, request, **request.path_params)
    return guarded_endpoint


def build_fhir_routes(ctx: FhirContext, authorize: Authorize) -> list[BaseRoute]:
    """The routes to put first in the app: ``/fhir`` itself and the dispatch below it."""
    base: list[BaseRoute] = [
        Route("/fhir", _endpoint(ctx, route, authorize), methods=[route.method],
              name=f"fhir {route.summary}", include_in_schema=False)
        for route in ROUTES if route.path == ""]
    below = [(route, _endpoint(ctx, route, authorize)) for route in ROUTES if route.path]
    return [*base, FhirDispatch(below)]


# A route below /fhir as (method, segments, endpoint): a segment is its literal text, or
# None where the path has a parameter (whose name is in ``names``).
_Compiled = tuple[str, tuple[str | None, ...], tuple[str, ...],
                  Callable[[Request], Awaitable[Response]]]


def below_fhir(path: str) -> bool:
    """Whether the FHIR API answers ``path``: everything below ``/fhir/`` but the
    well-known URIs (RFC 8615, e.g. SMART's ``/fhir/.well-known/smart-configuration``),
    which are not FHIR interactions and are left to the app's other routes."""
    return path.startswith(FhirDispatch.PREFIX) and not path.startswith(WELL_KNOWN)


WELL_KNOWN = "/fhir/.well-known/"


class FhirDispatch(BaseRoute):
    """Every route below ``/fhir``: matched by their segments, first declared first."""

    PREFIX = "/fhir/"

    def __init__(self, routes: list[tuple[FhirRoute, Callable[[Request], Awaitable[Response]]]]):
        self._by_length: dict[int, list[_Compiled]] = {}
        for route, endpoint in routes:
            parts = route.path.strip("/").split("/")
            segments = tuple(None if p.startswith("{") else p for p in parts)
            names = tuple(p[1:-1] for p in parts if p.startswith("{"))
            self._by_length.setdefault(len(parts), []).append(
                (route.method, segments, names, endpoint))

    def matches(self, scope: Scope) -> tuple[Match, Scope]:
        if scope["type"] == "http" and below_fhir(scope["path"]):
            return Match.FULL, {}
        return Match.NONE, {}

    def url_path_for(self, name: str, /, **path_params: Any) -> URLPath:
        from starlette.routing import NoMatchFound
        raise NoMatchFound(name, path_params)

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        parts = scope["path"][len(self.PREFIX):].rstrip("/").split("/")
        allowed: list[str] = []
        for method, segments, names, endpoint in self._by_length.get(len(parts), ()):
            params = _bind(segments, names, parts)
            if params is None:
                continue
            if method != scope["method"]:
                allowed.append(method)
                continue
            scope["path_params"] = params
            request = Request(scope, receive, send)
            response = await endpoint(request)
            await response(scope, receive, send)
            return
        if allowed:
            raise HTTPException(405, headers={"Allow": ", ".join(dict.fromkeys(allowed))})
        raise HTTPException(404)


def _bind(segments: tuple[str | None, ...], names: tuple[str, ...], parts: list[str]
          ) -> dict[str, str] | None:
    """The path parameters when ``parts`` fit ``segments`` (a parameter takes any
    non-empty segment), else None."""
    values = []
    for segment, part in zip(segments, parts, strict=True):
        if not part:
            return None
        if segment is None:
            values.append(part)
        elif segment != part:
            return None
    return dict(zip(names, values, strict=True))


def openapi_paths() -> dict[str, dict[str, Any]]:
    """The OpenAPI description of ``ROUTES`` (they are not FastAPI routes)."""
    paths: dict[str, dict[str, Any]] = {}
    fhir_json = {"application/fhir+json": {"schema": {"type": "object"}}}
    for route in ROUTES:
        path = "/fhir" + route.path
        params = [
            {"name": name, "in": "path", "required": True, "schema": {"type": "string"}}
            for name in _path_params(route.path)
        ]
        operation: dict[str, Any] = {
            "tags": ["fhir"],
            "summary": route.summary,
            "operationId": f"fhir_{route.method.lower()}_{_slug(route.path)}",
            "parameters": params,
            "responses": {
                "200": {"description": "FHIR resource or Bundle", "content": fhir_json},
                "4XX": {"description": "OperationOutcome naming what was wrong",
                        "content": fhir_json},
            },
        }
        if route.body:
            operation["requestBody"] = {"required": True, "content": fhir_json}
        if not route.public:
            operation["security"] = [{"PASETO": []}]
        paths.setdefault(path, {})[route.method.lower()] = operation
    return paths


def _path_params(path: str) -> list[str]:
    return [part[1:-1] for part in path.split("/") if part.startswith("{")]


def _slug(path: str) -> str:
    cleaned = "".join(c if c.isalnum() else "_" for c in path).strip("_")
    return cleaned or "base"
