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

Where paths overlap, the route naming more fixed segments wins (``_history``,
``_search``, ``$everything``, ``metadata`` before the parameterized routes that would
swallow them), and a path that such a route names is answered by it alone: a method it
does not take is a 405 with ``Allow`` (``DELETE /metadata``), never a parameterized
route's (a conditional delete of the type "metadata").
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
from fhir_server.interactions.capabilities import (
    capabilities,
    capability_statement,
    summary_statement,
)
from fhir_server.interactions.codesystem_lookup import codesystem_lookup
from fhir_server.interactions.codesystem_subsumes import codesystem_subsumes
from fhir_server.interactions.codesystem_validate_code import codesystem_validate_code
from fhir_server.interactions.conceptmap_translate import conceptmap_translate
from fhir_server.interactions.context import CALLER, FhirContext
from fhir_server.interactions.create import create
from fhir_server.interactions.delete import conditional_delete, delete
from fhir_server.interactions.everything import everything
from fhir_server.interactions.export import (
    BULK_EXPORTS,
    cancel_export,
    export_file,
    export_group,
    export_patients,
    export_status,
    export_system,
)
from fhir_server.interactions.history import history
from fhir_server.interactions.match import match
from fhir_server.interactions.patch import conditional_patch, patch
from fhir_server.interactions.read import read
from fhir_server.interactions.search_compartment import search_compartment
from fhir_server.interactions.search_system import search_system
from fhir_server.interactions.search_type import search_type
from fhir_server.interactions.subscription import (
    SUBSCRIPTIONS,
    binding_token,
    subscription_status,
    subscriptions_status,
)
from fhir_server.interactions.transaction import transaction_or_batch
from fhir_server.interactions.update import conditional_update, update
from fhir_server.interactions.validate import validate
from fhir_server.interactions.valueset_expand import valueset_expand
from fhir_server.interactions.valueset_validate_code import valueset_validate_code
from fhir_server.interactions.view_export import (
    cancel_export as cancel_view_export,
)
from fhir_server.interactions.view_export import (
    export_result as view_export_result,
)
from fhir_server.interactions.view_export import (
    export_status as view_export_status,
)
from fhir_server.interactions.view_export import export_views
from fhir_server.interactions.view_run import run_instance, run_type
from fhir_server.interactions.vread import vread
from fhir_server.openapi import describe_routes
from fhir_server.search.registry import SearchRegistry, builtin_registry
from fhir_server.validation import is_resource_type

TYPE_INTERACTIONS = (
    "read", "vread", "update", "patch", "delete", "history-instance", "history-type",
    "create", "search-type",
)
SYSTEM_INTERACTIONS = ("transaction", "batch", "search-system", "history-system")
Authorize = Callable[[Request], Awaitable[Access]]
Handler = Callable[..., Awaitable[Response]]


@dataclass(frozen=True, slots=True)
class FhirRoute:
    """A FHIR interaction at a path below /fhir, and what it answers (the OpenAPI document
    is made from these, ``fhir_server.openapi``): ``body`` the request body it takes
    (``resource``, ``bundle``, ``patch``, ``form``, ``validate`` or none), ``ok`` its
    success statuses and ``returns`` their body (a resource type, or ``resource``), and
    ``errors`` the statuses it refuses with itself (an OperationOutcome; the access layer
    adds 401, 403 and 429)."""

    method: str
    path: str  # below /fhir; "" is the base itself
    summary: str
    handler: Handler  # handler(ctx, request, **path_params)
    public: bool = False
    body: str = ""
    ok: tuple[int, ...] = (200,)
    returns: str = "Bundle"
    errors: tuple[int, ...] = ()


async def _metadata(ctx: FhirContext, request: Request) -> Response:
    registry = await ctx.service.refresh_registry()
    conformance = await ctx.service.conformance.registry.refresh()
    cache: dict[tuple[str, str, Any], tuple[dict[str, Any], dict[str, Any]]] = \
        ctx.extras.setdefault("capability_statements", {})
    base = ctx.fhir_base(request)
    key = (registry.version, base, conformance.version)
    channels = ctx.extras.get(SUBSCRIPTIONS)
    if key not in cache:
        if len(cache) > 64:  # many Host names: bounded
            cache.clear()
        statement = capability_statement(
            base, TYPE_INTERACTIONS, SYSTEM_INTERACTIONS, registry,
            security=None if ctx.security is None else ctx.security(base),
            bulk_export=BULK_EXPORTS in ctx.extras,
            websocket=channels.websocket_url(base) if channels is not None else None,
            subscriptions=channels.documentation if channels is not None else None,
            profiles=conformance.supported_profiles())
        cache[key] = (statement, summary_statement(statement))
    return await capabilities(ctx, request, *cache[key])


# What interactions refuse, besides the access layer (an OperationOutcome each): a bad
# parameter or body 400, an unknown type or id 404, XML asked for 406, a deleted
# resource 410, a body over the limit 413, a body that is not FHIR JSON 415; writes also a
# conflict 409, a stale If-Match or an ambiguous condition 412, a patch that cannot apply
# 422.
READ_ERRORS = (400, 404, 406, 410)
SEARCH_ERRORS = (400, 404, 406)
WRITE_ERRORS = (400, 404, 406, 409, 412, 413, 415, 422)

# (path, summary, handler, what it answers) of the terminology operations, each at the
# type level and, but $lookup, for one stored resource.
TERMINOLOGY_ROUTES: tuple[tuple[str, str, Handler, str], ...] = (
    ("/CodeSystem/$lookup", "CodeSystem/$lookup: a code's display, designations and "
     "properties", codesystem_lookup, "Parameters"),
    ("/CodeSystem/$validate-code", "CodeSystem/$validate-code: is the code in the code "
     "system", codesystem_validate_code, "Parameters"),
    ("/CodeSystem/{resource_id}/$validate-code", "CodeSystem/[id]/$validate-code",
     codesystem_validate_code, "Parameters"),
    ("/CodeSystem/$subsumes", "CodeSystem/$subsumes: how two codes relate",
     codesystem_subsumes, "Parameters"),
    ("/CodeSystem/{resource_id}/$subsumes", "CodeSystem/[id]/$subsumes", codesystem_subsumes,
     "Parameters"),
    ("/ValueSet/$expand", "ValueSet/$expand: the codes of a value set (filter, paging)",
     valueset_expand, "ValueSet"),
    ("/ValueSet/{resource_id}/$expand", "ValueSet/[id]/$expand", valueset_expand,
     "ValueSet"),
    ("/ValueSet/$validate-code", "ValueSet/$validate-code: is the code in the value set",
     valueset_validate_code, "Parameters"),
    ("/ValueSet/{resource_id}/$validate-code", "ValueSet/[id]/$validate-code",
     valueset_validate_code, "Parameters"),
    ("/ConceptMap/$translate", "ConceptMap/$translate: a code in another code system",
     conceptmap_translate, "Parameters"),
    ("/ConceptMap/{resource_id}/$translate", "ConceptMap/[id]/$translate",
     conceptmap_translate, "Parameters"),
)

ROUTES: tuple[FhirRoute, ...] = (
    FhirRoute("GET", "/metadata", "capabilities: the CapabilityStatement", _metadata,
              public=True, returns="CapabilityStatement", errors=(400, 406)),
    # -- system level
    FhirRoute("GET", "", "search-system", search_system, errors=(400, 406)),
    FhirRoute("POST", "", "transaction / batch (a Bundle)", transaction_or_batch,
              body="bundle", errors=(*WRITE_ERRORS, 410)),
    FhirRoute("POST", "/_search", "search-system (POST)", search_system, body="form",
              errors=(400, 406, 413)),
    FhirRoute("GET", "/_history", "history-system", history, errors=(400, 406)),
    # -- type level
    FhirRoute("POST", "/{resource_type}/$validate", "$validate (nothing is stored)", validate,
              body="validate", returns="OperationOutcome",
              errors=(400, 404, 406, 413, 415)),
    FhirRoute("POST", "/{resource_type}/{resource_id}/$validate",
              "$validate for an existing resource (mode=update / delete)", validate,
              body="validate", returns="OperationOutcome",
              errors=(400, 404, 406, 410, 413, 415)),
    FhirRoute("GET", "/{resource_type}", "search-type", search_type, errors=SEARCH_ERRORS),
    FhirRoute("POST", "/{resource_type}/_search", "search-type (POST)", search_type,
              body="form", errors=(*SEARCH_ERRORS, 413)),
    FhirRoute("GET", "/{resource_type}/_history", "history-type", history,
              errors=SEARCH_ERRORS),
    FhirRoute("POST", "/{resource_type}", "create (If-None-Exist: conditional create)",
              create, body="resource", ok=(201, 200), returns="resource",
              errors=WRITE_ERRORS),
    FhirRoute("PUT", "/{resource_type}", "conditional update", conditional_update,
              body="resource", ok=(200, 201), returns="resource", errors=WRITE_ERRORS),
    FhirRoute("PATCH", "/{resource_type}", "conditional patch", conditional_patch,
              body="patch", returns="resource", errors=WRITE_ERRORS),
    FhirRoute("DELETE", "/{resource_type}", "conditional delete", conditional_delete,
              returns="OperationOutcome", errors=(400, 404, 412)),
    # -- instance level
    FhirRoute("GET", "/{resource_type}/{resource_id}", "read", read, ok=(200, 304),
              returns="resource", errors=READ_ERRORS),
    FhirRoute("PUT", "/{resource_type}/{resource_id}", "update (or create with this id)",
              update, body="resource", ok=(200, 201), returns="resource",
              errors=WRITE_ERRORS),
    FhirRoute("PATCH", "/{resource_type}/{resource_id}", "patch", patch, body="patch",
              returns="resource", errors=(*WRITE_ERRORS, 410)),
    FhirRoute("DELETE", "/{resource_type}/{resource_id}", "delete", delete,
              returns="OperationOutcome", errors=(400, 404, 409, 412)),
    FhirRoute("GET", "/{resource_type}/{resource_id}/_history", "history-instance", history,
              errors=READ_ERRORS),
    FhirRoute("GET", "/Patient/{patient_id}/$everything", "Patient/$everything", everything,
              errors=READ_ERRORS),
    FhirRoute("POST", "/Patient/$match", "Patient/$match (IHE PDQm ITI-119)", match,
              body="validate", errors=(400, 406, 413, 415)),
    # -- bulk data export (FHIR Bulk Data Access IG 2.0)
    *(FhirRoute(method, path, f"$export ({level} level)", handler, ok=(202,),
                returns="OperationOutcome", errors=(400, 404, 406, 415, 429, 501),
                body="parameters" if method == "POST" else "")
      for path, level, handler in (("/$export", "system", export_system),
                                   ("/Patient/$export", "patient", export_patients),
                                   ("/Group/{group_id}/$export", "group", export_group))
      for method in ("GET", "POST")),
    FhirRoute("GET", "/$export-status/{job_id}", "$export status: 202 while running, then "
              "the manifest", export_status, ok=(200, 202), returns="manifest",
              errors=(404, 500)),
    FhirRoute("DELETE", "/$export-status/{job_id}", "$export cancel: stops it and removes "
              "its files", cancel_export, ok=(202,), returns="OperationOutcome",
              errors=(404,)),
    FhirRoute("GET", "/$export-file/{job_id}/{name}", "$export output file (NDJSON)",
              export_file, returns="ndjson", errors=(404,)),
    # -- SQL on FHIR v2: a view's rows, synchronously
    *(FhirRoute(method, path, f"$run ({level} level): a view's rows as json, ndjson, "
                "csv or parquet", handler, returns="rows",
                body="parameters" if method == "POST" else "",
                errors=(400, 403, 404, 406, 413, 415, 422))
      for path, level, handler in (("/ViewDefinition/$run", "type", run_type),
                                   ("/$viewdefinition-run", "system", run_type),
                                   ("/ViewDefinition/{resource_id}/$run", "instance",
                                    run_instance))
      for method in ("GET", "POST")),
    # -- SQL on FHIR v2: views' rows to files, asynchronously (on the Bulk export jobs)
    *(FhirRoute("POST", path, f"$viewdefinition-export ({level} level): views' rows to "
                "ndjson, csv, json or parquet files", export_views, ok=(202,),
                returns="Parameters", body="parameters",
                errors=(400, 403, 404, 406, 413, 415, 422, 429, 501))
      for path, level in (("/ViewDefinition/$viewdefinition-export", "type"),
                          ("/$viewdefinition-export", "system"))),
    FhirRoute("GET", "/$viewdefinition-export-status/{job_id}", "$viewdefinition-export "
              "status: 202 while running, then 303 to the result", view_export_status,
              ok=(202, 303), returns="Parameters", errors=(404,)),
    FhirRoute("DELETE", "/$viewdefinition-export-status/{job_id}", "$viewdefinition-export "
              "cancel: stops it and removes its files", cancel_view_export, ok=(202,),
              returns="OperationOutcome", errors=(404,)),
    FhirRoute("GET", "/$viewdefinition-export-result/{job_id}", "$viewdefinition-export "
              "result: each view's file locations", view_export_result, ok=(200, 202),
              returns="Parameters", errors=(404, 500)),
    # -- subscriptions (R5 backport operations)
    FhirRoute("GET", "/Subscription/{resource_id}/$status", "Subscription/$status: its "
              "SubscriptionStatus", subscription_status, errors=READ_ERRORS),
    FhirRoute("GET", "/Subscription/$status", "Subscription/$status at type level: the "
              "SubscriptionStatus of each Subscription named (id), else of every one the "
              "caller may read (status filters)", subscriptions_status, errors=READ_ERRORS),
    FhirRoute("POST", "/Subscription/$status", "Subscription/$status at type level, its "
              "id and status parameters in a Parameters body", subscriptions_status,
              body="parameters", errors=READ_ERRORS),
    FhirRoute("POST", "/Subscription/$get-ws-binding-token", "Subscription/"
              "$get-ws-binding-token: a token to bind a websocket", binding_token,
              body="parameters", returns="Parameters", errors=(400, 403, 404, 406, 501)),
    FhirRoute("POST", "/Subscription/{resource_id}/$get-ws-binding-token", "Subscription/"
              "$get-ws-binding-token for one subscription", binding_token,
              returns="Parameters", errors=(400, 403, 404, 406, 501)),
    # -- terminology (R4 operations over shipped and stored content)
    *(FhirRoute(method, path, summary, handler, body="parameters" if method == "POST" else "",
                returns=returns, errors=(400, 403, 404, 406, 410, 413, 415, 422))
      for path, summary, handler, returns in TERMINOLOGY_ROUTES
      for method in ("GET", "POST")),
    FhirRoute("GET", "/{compartment_type}/{owner_id}/{resource_type}", "search-compartment",
              search_compartment, errors=READ_ERRORS),
    FhirRoute("GET", "/{resource_type}/{resource_id}/_history/{version_id}", "vread", vread,
              returns="resource", errors=READ_ERRORS),
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


# A route below /fhir as (fixed, method, segments, names, endpoint): a segment is its
# literal text, or None where the path has a parameter (whose name is in ``names``);
# ``fixed`` counts the literal ones.
_Compiled = tuple[int, str, tuple[str | None, ...], tuple[str, ...],
                  Callable[[Request], Awaitable[Response]]]


def below_fhir(path: str) -> bool:
    """Whether the FHIR API answers ``path``: everything below ``/fhir/`` but the
    well-known URIs (RFC 8615, e.g. SMART's ``/fhir/.well-known/smart-configuration``),
    which are not FHIR interactions and are left to the app's other routes."""
    return path.startswith(FhirDispatch.PREFIX) and not path.startswith(WELL_KNOWN)


WELL_KNOWN = "/fhir/.well-known/"


class FhirDispatch(BaseRoute):
    """Every route below ``/fhir``: matched by their segments, the route with the most
    fixed segments first, then first declared first."""

    PREFIX = "/fhir/"

    def __init__(self, routes: list[tuple[FhirRoute, Callable[[Request], Awaitable[Response]]]]):
        self._by_length: dict[int, list[_Compiled]] = {}
        for route, endpoint in routes:
            parts = route.path.strip("/").split("/")
            segments = tuple(None if p.startswith("{") else p for p in parts)
            names = tuple(p[1:-1] for p in parts if p.startswith("{"))
            fixed = sum(segment is not None for segment in segments)
            self._by_length.setdefault(len(parts), []).append(
                (fixed, route.method, segments, names, endpoint))
        for compiled in self._by_length.values():
            compiled.sort(key=lambda c: c[0], reverse=True)  # stable: declared order kept

    def matches(self, scope: Scope) -> tuple[Match, Scope]:
        if scope["type"] == "http" and below_fhir(scope["path"]):
            return Match.FULL, {}
        return Match.NONE, {}

    def url_path_for(self, name: str, /, **path_params: Any) -> URLPath:
        from starlette.routing import NoMatchFound
        raise NoMatchFound(name, path_params)

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        parts = scope["path"][len(self.PREFIX):].rstrip("/").split("/")
        wanted = "GET" if scope["method"] == "HEAD" else scope["method"]
        allowed: list[str] = []
        best: int | None = None  # fixed segments of the first route whose path fits
        for fixed, method, segments, names, endpoint in self._by_length.get(len(parts), ()):
            if best is not None and fixed < best:
                break
            params = _bind(segments, names, parts)
            if params is None:
                continue
            best = fixed
            if method != wanted:
                if _names_types(params):
                    allowed.append(method)
                continue
            scope["path_params"] = params
            request = Request(scope, receive, send)
            response = await endpoint(request)
            await response(scope, receive, send)
            return
        if allowed:
            methods = list(dict.fromkeys(allowed))
            if "GET" in methods:
                methods.append("HEAD")
            allow = ", ".join([*methods, "OPTIONS"])
            if wanted == "OPTIONS":  # RFC 9110 9.3.7: what the target takes
                await Response(status_code=204, headers={"Allow": allow})(scope, receive, send)
                return
            raise HTTPException(405, headers={"Allow": allow})
        raise HTTPException(404)


def _names_types(params: dict[str, str]) -> bool:
    """Whether the path parameters that name a resource type name one: ``/metadata``
    is no ``/{resource_type}``, so the methods of those routes are not its methods."""
    return all(is_resource_type(value) for name, value in params.items()
               if name in ("resource_type", "compartment_type"))


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


def openapi_document(registry: SearchRegistry | None = None, *, per_type: bool = True
                     ) -> dict[str, Any]:
    """The OpenAPI description of ``ROUTES`` (they are not FastAPI routes): ``paths``,
    ``components`` and ``tags`` (``fhir_server.openapi``; ``per_type``: search and the
    type's other interactions described for each resource type)."""
    return describe_routes(ROUTES, registry or builtin_registry(), per_type=per_type)


def openapi_paths(registry: SearchRegistry | None = None, *, per_type: bool = True
                  ) -> dict[str, dict[str, Any]]:
    """The ``paths`` of :func:`openapi_document`."""
    return openapi_document(registry, per_type=per_type)["paths"]  # type: ignore[no-any-return]
