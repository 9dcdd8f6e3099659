"""The OpenAPI description of the FHIR REST API, made from the route table
(``fhir_server.router.ROUTES``: each interaction's body, success statuses and refusals),
the search-parameter registry and the list of resource types.

- Search is described once per resource type (``GET /fhir/Patient``), with the
  parameters of its type (``family``, ``birthdate``...: the registry's, with their FHIR
  types and descriptions) besides those of every resource (``_id``, ``_lastUpdated``...)
  and the result parameters (``_count``, ``_sort``, ``_include``...); ``POST
  /fhir/Patient/_search`` has its form body with the same fields. The other methods of
  ``/fhir/Patient`` (create; conditional update, patch and delete, whose criteria are
  such parameters) are described there too. Each type has its tag.
- Other interactions keep ``{resource_type}`` (one of the resource types) and
  ``{resource_id}``. Described without the per-type paths (``per_type=False``), search
  documents the parameters every resource has, for the /api document's docs page.
- Every status an interaction answers is listed with its body: the resource, a Bundle,
  the CapabilityStatement, or an OperationOutcome for each refusal. FHIR bodies are not
  spelled out element by element (the R4 JSON Schema the server validates with is 3.6
  MB); each names its resource type and links to its definition.

Shared pieces (the common parameters, the bodies of refusals, the resource schemas) are
components referenced from every operation, which keeps the document small enough
(~1.3 MB) for the interactive docs.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Protocol

from fhir_server.search.registry import SearchRegistry
from fhir_server.validation import resource_types

JSON = dict[str, Any]
FHIR_JSON = "application/fhir+json"
TAG = "FHIR"
SPEC = "http://hl7.org/fhir/R4"

STATUS_TEXT = {
    200: "OK", 201: "Created", 202: "Accepted: the work goes on in the background",
    304: "Not Modified: the version the client holds is current",
    400: "Bad Request: a parameter or the body is not valid (the OperationOutcome names it)",
    401: "Unauthorized: no valid credentials (issue code login)",
    403: "Forbidden: the caller may not read or write this (issue code forbidden)",
    404: "Not Found: an unknown resource type, id or version",
    406: "Not Acceptable: only JSON is served (_format / Accept asked for XML)",
    409: "Conflict: a concurrent change, or the id is taken",
    410: "Gone: the resource is deleted",
    412: "Precondition Failed: a stale If-Match, or a condition matching several resources",
    413: "Payload Too Large: the body is over the server's limit",
    415: "Unsupported Media Type: the body is not FHIR JSON (PATCH: nor a patch format)",
    422: "Unprocessable Entity: the patch cannot apply to the resource",
    429: "Too Many Requests: retry after Retry-After seconds (issue code throttled)",
    500: "Internal Server Error: the operation failed (a bulk export: the OperationOutcome "
         "says why)",
    501: "Not Implemented: the operation is not offered by this server",
}
RESULT_PARAMETERS: tuple[tuple[str, str], ...] = (
    ("_count", "Results per page (at most 1000)"),
    ("_sort", "Sort keys, comma separated; '-' for descending (e.g. -date,_id)"),
    ("_offset", "Skip that many matches (at most 10,000); links then carry offsets"),
    ("_total", "none | estimate | accurate: whether and how Bundle.total is counted"),
    ("_summary", "true | text | data | count | false"),
    ("_elements", "Top-level elements to return, comma separated"),
    ("_include", "Type:param[:target] of references to include (:iterate to follow them)"),
    ("_revinclude", "Type:param of resources referring to the matches, to include"),
    ("_format", "json (XML is not served)"),
)


OPERATION_OUTCOME: JSON = {
    "type": "object", "required": ["resourceType", "issue"],
    "properties": {
        "resourceType": {"const": "OperationOutcome"},
        "issue": {"type": "array", "minItems": 1, "items": {
            "type": "object", "required": ["severity", "code"],
            "properties": {
                "severity": {"enum": ["fatal", "error", "warning", "information"]},
                "code": {"type": "string"}, "diagnostics": {"type": "string"},
                "expression": {"type": "array", "items": {"type": "string"}}}}}},
    "description": "What happened, each issue naming the element (expression)",
    "externalDocs": {"url": f"{SPEC}/operationoutcome.html"}}


SEARCH_ELSEWHERE = (
    "Besides those below, the search parameters of the type: listed for each type in the "
    "FHIR document by resource type (its own page of the docs) and in the "
    "CapabilityStatement (GET /fhir/metadata).")


class Route(Protocol):
    """What is described of a route (``fhir_server.router.FhirRoute``)."""

    @property
    def method(self) -> str: ...
    @property
    def path(self) -> str: ...
    @property
    def summary(self) -> str: ...
    @property
    def public(self) -> bool: ...
    @property
    def body(self) -> str: ...
    @property
    def ok(self) -> tuple[int, ...]: ...
    @property
    def returns(self) -> str: ...
    @property
    def errors(self) -> tuple[int, ...]: ...


def describe_routes(routes: Sequence[Route], registry: SearchRegistry, *,
                    per_type: bool = True) -> JSON:
    """``{"paths", "components", "tags"}`` of the FHIR API; without ``per_type`` the
    type-level interactions keep ``{resource_type}`` and search documents the parameters
    every type has (a document small enough to sit beside the /api one in the docs
    page, which takes ~4 s to render it instead of ~18 s)."""
    types = sorted(resource_types())
    paths: dict[str, JSON] = {}
    for route in routes:
        if per_type and _per_type(route):
            for resource_type in types:
                path = "/fhir/" + resource_type + route.path.removeprefix("/{resource_type}")
                paths.setdefault(path, {})[route.method.lower()] = _operation(
                    route, registry, resource_type)
        else:
            paths.setdefault("/fhir" + route.path, {})[route.method.lower()] = _operation(
                route, registry, None)
    tags: list[JSON] = [{"name": TAG, "description": "FHIR R4 REST API"}]
    if per_type:
        tags += [{"name": _tag(t), "externalDocs": {"url": _doc(t)}} for t in types]
    return {"paths": paths, "components": _components(types, registry), "tags": tags}


def _per_type(route: Route) -> bool:
    """Described once per type: the search and everything at its path (an OpenAPI path
    without a parameter, ``/fhir/Patient``, is matched before ``/fhir/{resource_type}``,
    so it must hold every method of that path) and the POST search with its form."""
    return route.path in ("/{resource_type}", "/{resource_type}/_search")


# -- one operation ---------------------------------------------------------------------------
def _operation(route: Route, registry: SearchRegistry, resource_type: str | None) -> JSON:
    operation: JSON = {
        "tags": [_tag(resource_type) if resource_type else TAG],
        "summary": route.summary,
        "operationId": _operation_id(route, resource_type),
        "parameters": [*_path_parameters(route, resource_type),
                       *_query_parameters(route, registry, resource_type)],
        "responses": _responses(route, resource_type),
    }
    if resource_type is None and route.returns == "Bundle" and _per_type(route):
        operation["description"] = SEARCH_ELSEWHERE  # the type's search, described once
    body = _request_body(route, registry, resource_type)
    if body is not None:
        operation["requestBody"] = body
    if not route.public:
        operation["security"] = [{"PASETO": []}, {"APIKey": []}]
    return operation


def _operation_id(route: Route, resource_type: str | None) -> str:
    path = route.path.replace("{resource_type}", resource_type or "type")
    cleaned = "".join(c if c.isalnum() else "_" for c in path).strip("_")
    return f"fhir_{route.method.lower()}_{cleaned or 'base'}"


def _path_parameters(route: Route, resource_type: str | None) -> list[JSON]:
    found = []
    for name in _path_params(route.path):
        if name == "resource_type" and resource_type is not None:
            continue  # described for this type: no parameter
        schema: JSON = {"type": "string"}
        if name == "resource_type":
            schema = {"$ref": "#/components/schemas/ResourceType"}
        elif name == "compartment_type":
            schema = {"type": "string", "enum": ["Patient"]}
        found.append({"name": name, "in": "path", "required": True, "schema": schema})
    return found


def _query_parameters(route: Route, registry: SearchRegistry, resource_type: str | None
                      ) -> list[JSON]:
    if route.path.endswith("/$export") and route.method == "GET":
        return [{"$ref": f"#/components/parameters/{name}"}
                for name in ("_outputFormat", "_type", "_since", "_typeFilter")]
    if route.path.endswith("$run") or route.path.endswith("$viewdefinition-run"):
        return [{"name": name, "in": "query", "schema": {"type": "string"},
                 "description": text} for name, text in RUN_PARAMETERS
                if route.method == "GET" and (name != "viewReference"
                                              or "{resource_id}" not in route.path)]
    if route.path.endswith("/$everything"):
        return [{"$ref": "#/components/parameters/_since"},
                {"$ref": "#/components/parameters/_type"},
                {"$ref": "#/components/parameters/_count"}]
    if route.returns == "Bundle" and route.method == "GET" and "_history" not in route.path:
        searched = resource_type or "Resource"
        system = [{"$ref": "#/components/parameters/_type"}] if route.path == "" else []
        own = [p for p in _searchable(registry, searched) if not p.code.startswith("_")]
        return [*system, *(_search_parameter(p) for p in own),
                *({"$ref": f"#/components/parameters/{p.code}"}
                  for p in _searchable(registry, "Resource")),
                *({"$ref": f"#/components/parameters/{name}"} for name, _ in
                  RESULT_PARAMETERS)]
    if "_history" in route.path:
        return [{"$ref": "#/components/parameters/_since"},
                {"$ref": "#/components/parameters/_at"},
                {"$ref": "#/components/parameters/_count"}]
    if route.path == "/{resource_type}" and route.method in ("PUT", "PATCH", "DELETE"):
        return [{"$ref": "#/components/parameters/criteria"}]
    if route.path == "/metadata":
        return [{"$ref": "#/components/parameters/_summary"},
                {"$ref": "#/components/parameters/_elements"}]
    return []


RUN_PARAMETERS = (
    ("_format", "json (default), ndjson, csv or parquet (or the Accept header)"),
    ("header", "csv: a header line (default true)"),
    ("_limit", "at most this many rows"),
    ("_since", "only resources changed after this instant"),
    ("patient", "only what is about this Patient (repeatable)"),
    ("group", "only what is about the members of this Group (repeatable)"),
    ("viewReference", "the stored ViewDefinition to run (ViewDefinition/[id] or its url)"),
)


def _searchable(registry: SearchRegistry, resource_type: str) -> list[Any]:
    return sorted((p for p in registry.params(resource_type).values() if p.searchable),
                  key=lambda p: p.code)


def _search_parameter(param: Any) -> JSON:
    """A search parameter as a query parameter (repeat it to AND, commas OR)."""
    described = f"{param.type}: {param.description}" if param.description else param.type
    return {"name": param.code, "in": "query", "description": described[:200],
            "schema": {"type": "string"}}


def _request_body(route: Route, registry: SearchRegistry, resource_type: str | None
                  ) -> JSON | None:
    kind = route.body
    if kind == "resource":
        return {"required": True, "content": {FHIR_JSON: {"schema": _resource(resource_type)}}}
    if kind == "bundle":
        return {"required": True, "content": {FHIR_JSON: {"schema": _resource("Bundle")}}}
    if kind == "validate":
        return {"required": True, "description": "The resource, or Parameters with "
                "resource, mode (create | update | delete) and profile",
                "content": {FHIR_JSON: {"schema": _resource(None)}}}
    if kind == "patch":
        return {"$ref": "#/components/requestBodies/Patch"}
    if kind == "parameters":
        return {"required": True, "description": "Parameters: the operation's parameters "
                "as in its GET form, each a valueString (valueInstant for _since)",
                "content": {FHIR_JSON: {"schema": _resource("Parameters")}}}
    if kind == "form":
        searched = resource_type or "Resource"
        fields = {p.code: {"type": "string"} for p in _searchable(registry, searched)}
        fields.update({name: {"type": "string", "description": text}
                       for name, text in RESULT_PARAMETERS})
        return {"required": False, "content": {"application/x-www-form-urlencoded": {
            "schema": {"type": "object", "properties": fields}}}}
    return None


def _responses(route: Route, resource_type: str | None) -> JSON:
    responses: JSON = {}
    for status in route.ok:
        if status == 304:
            responses["304"] = {"description": STATUS_TEXT[304]}
            continue
        responses[str(status)] = {"description": _success_text(route, status),
                                  "content": _success_content(route, resource_type)}
    for status in route.errors:
        responses[str(status)] = {"$ref": f"#/components/responses/Fhir{status}"}
    return responses


def _success_content(route: Route, resource_type: str | None) -> JSON:
    if route.returns == "manifest":  # Bulk Data: a plain JSON manifest (202: no body)
        return {"application/json": {"schema": {"type": "object", "description":
                "transactionTime, request, requiresAccessToken, output, error"}}}
    if route.returns == "ndjson":
        return {"application/fhir+ndjson": {"schema": {"type": "string", "description":
                "One resource per line"}}}
    if route.returns == "rows":  # SQL on FHIR $run: the view's rows as _format asks
        return {"application/json": {"schema": {"type": "array", "items": {
                    "type": "object", "description": "One row: column name → value"}}},
                "application/x-ndjson": {"schema": {"type": "string",
                                                    "description": "One row per line"}},
                "text/csv": {"schema": {"type": "string"}},
                "application/vnd.apache.parquet": {"schema": {"type": "string",
                                                              "format": "binary"}}}
    body = _resource(resource_type) if route.returns == "resource" else _resource(
        route.returns)
    return {FHIR_JSON: {"schema": body}}


def _success_text(route: Route, status: int) -> str:
    if route.returns == "resource" and route.method in ("POST", "PUT"):
        return {201: "Created: the resource as stored (Location, ETag); Prefer: return="
                     "minimal leaves the body empty, return=OperationOutcome gives one",
                200: "OK: the resource as stored (a conditional create that matched "
                     "answers the match)"}.get(status, STATUS_TEXT.get(status, "OK"))
    return STATUS_TEXT.get(status, "OK")


# -- shared components -----------------------------------------------------------------------
def _components(types: Iterable[str], registry: SearchRegistry) -> JSON:
    schemas: JSON = {
        "ResourceType": {"type": "string", "enum": list(types),
                         "description": "A FHIR R4 resource type"},
        "FhirResource": {"type": "object", "required": ["resourceType"],
                         "properties": {"resourceType": {"$ref":
                                                         "#/components/schemas/ResourceType"}},
                         "description": "A FHIR R4 resource (JSON)",
                         "externalDocs": {"url": f"{SPEC}/resourcelist.html"}},
    }
    for resource_type in types:
        schemas[f"Fhir{resource_type}"] = {
            "type": "object", "required": ["resourceType"],
            "properties": {"resourceType": {"const": resource_type}},
            "description": f"A FHIR R4 {resource_type}", "externalDocs": {
                "url": _doc(resource_type)}}
    schemas["FhirOperationOutcome"] = OPERATION_OUTCOME
    outcome = {"$ref": "#/components/schemas/FhirOperationOutcome"}
    responses = {f"Fhir{status}": {"description": text,
                                   "content": {FHIR_JSON: {"schema": outcome}}}
                 for status, text in STATUS_TEXT.items() if status >= 400}
    parameters: JSON = {name: {"name": name, "in": "query", "description": text,
                         "schema": {"type": "string"}}
                  for name, text in (*RESULT_PARAMETERS,
                                     ("_since", "Only what was written at or after"),
                                     ("_at", "The versions current at that instant"),
                                     ("_type", "Resource types, comma separated"),
                                     ("_outputFormat", "application/fhir+ndjson (the "
                                      "only format offered)"),
                                     ("_typeFilter", "Type?search: what of that type to "
                                      "export (repeatable: any of them)"))}
    # The parameters of every resource (_id, _lastUpdated, _tag...), described once.
    parameters.update({p.code: _search_parameter(p)
                       for p in _searchable(registry, "Resource")})
    parameters["criteria"] = {
        "name": "criteria", "in": "query", "required": True, "style": "form",
        "explode": True, "schema": {"type": "object", "additionalProperties":
                                    {"type": "string"}},
        "description": "Search parameters of the type (those of its search) selecting the "
                       "resource(s): one match, or every match for a delete"}
    patch_body = {"required": True, "description": "JSON Patch, JSON Merge Patch, or "
                  "FHIRPath Patch; a plain application/json object is a merge patch",
                  "content": {
                      "application/json-patch+json": {"schema": {"type": "array", "items": {
                          "type": "object", "required": ["op", "path"]}}},
                      "application/merge-patch+json": {"schema": {"type": "object"}},
                      FHIR_JSON: {"schema": {"$ref": "#/components/schemas/FhirParameters"}},
                      "application/json": {"schema": {"oneOf": [
                          {"type": "array"}, {"type": "object"}]}}}}
    return {"schemas": schemas, "responses": responses, "parameters": parameters,
            "requestBodies": {"Patch": patch_body}}


def _resource(resource_type: str | None) -> JSON:
    if resource_type is None:
        return {"$ref": "#/components/schemas/FhirResource"}
    return {"$ref": f"#/components/schemas/Fhir{resource_type}"}


def _tag(resource_type: str | None) -> str:
    return f"{TAG} {resource_type}" if resource_type else TAG


def _doc(resource_type: str) -> str:
    return f"{SPEC}/{resource_type.lower()}.html"


def _path_params(path: str) -> list[str]:
    return [part[1:-1] for part in path.split("/") if part.startswith("{")]
