"""The OpenAPI document (``/openapi.json``, the docs at ``/docs``): every documented
status and body is one the server sends.

FastAPI describes the /api routes from their models, but documents a 422
``HTTPValidationError`` the server never sends (its validation errors are the /api
envelope) and knows nothing of what the layers around the routes answer. This module
completes the document from the same data those layers run on, for every route, those
added later included:

- the access table (``platform_api.access``): a route for signed-in callers answers 401
  without credentials and 403 to a caller without the role or API-key scope; every
  route may answer 429 past its rate limit (with ``Retry-After``);
- the request: a JSON body may be malformed (400 ``INVALID_JSON``), sent without its
  content type (415), too large (413) or invalid (422 ``VALIDATION_ERROR`` naming the
  field), as may query parameters (422); a path parameter names something that may not
  exist (404);
- what a route declares itself (``responses=``: the facade kit's 409s, a handler's own
  refusals) is kept.

Errors of /api are the envelope (``ErrorEnvelope``); those of /fhir OperationOutcomes.
The /fhir paths come from the FHIR route table (``fhir_server.router.openapi_document``:
per-type search with the registry's parameters, the interactions' own statuses).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from fastapi import FastAPI

from fhir_server.router import openapi_document
from platform_api.access import ACCESS_TABLE, AUTHENTICATED, MFA_TOKEN, AccessControl, Rule
from platform_api.access import normalize as normalize_path
from platform_api.envelope import ErrorEnvelope, JSONResponse

JSON = dict[str, Any]
ERROR_ENVELOPE = "#/components/schemas/ErrorEnvelope"
FASTAPI_VALIDATION = "#/components/schemas/HTTPValidationError"

API_ERRORS = {
    400: "Bad Request (INVALID_JSON): the body is not valid JSON; the message says what is "
         "wrong and where (line, column)",
    401: "Unauthorized: no valid credentials (UNAUTHORIZED, or the reason the token or API "
         "key was refused)",
    403: "Forbidden (FORBIDDEN, INSUFFICIENT_SCOPE): the caller may not do this",
    404: "Not Found (NOT_FOUND): what the path names does not exist (or is not the "
         "caller's to see)",
    409: "Conflict: the code says which",
    413: "Payload Too Large (PAYLOAD_TOO_LARGE): the body is over the server's limit",
    415: "Unsupported Media Type (UNSUPPORTED_MEDIA_TYPE): send the body as JSON with "
         "Content-Type: application/json",
    422: "Validation Error (VALIDATION_ERROR): `field` names what is wrong",
    429: "Too Many Requests (RATE_LIMITED): retry after Retry-After seconds",
}
RETRY_AFTER = {"Retry-After": {"description": "Seconds to wait", "schema": {"type": "integer"}}}
WWW_AUTHENTICATE = {"WWW-Authenticate": {"schema": {"type": "string"}}}
JSON_TYPES = ("application/json",)


FHIR_DOCUMENT_URL = "/openapi/fhir.json"
FHIR_DOCS_URL = "/docs/fhir"  # its Swagger UI page


def install_openapi(app: FastAPI, table: Mapping[tuple[str, str], Rule] | None = None
                    ) -> None:
    """Serve the completed document at ``/openapi.json`` (the /api routes and the FHIR
    interactions) and the FHIR document by resource type at ``FHIR_DOCUMENT_URL``; each is
    built once, on its first request."""
    build = app.openapi
    rules = ACCESS_TABLE if table is None else table
    fhir_document: JSON = {}

    def openapi() -> JSON:
        if app.openapi_schema is None:
            app.openapi_schema = complete(build(), rules, _registry(app))
        return app.openapi_schema

    async def fhir_openapi() -> JSONResponse:
        if not fhir_document:
            fhir_document.update(fhir_by_type(openapi(), rules, _registry(app)))
        return JSONResponse(fhir_document)

    app.openapi = openapi  # type: ignore[method-assign]
    app.add_api_route(FHIR_DOCUMENT_URL, fhir_openapi, methods=["GET"],
                      include_in_schema=False)


def _registry(app: FastAPI) -> Any:
    services = getattr(app.state, "services", None)
    return services.fhir.registry if services is not None else None


def complete(schema: JSON, table: Mapping[tuple[str, str], Rule], registry: Any = None
             ) -> JSON:
    """``schema`` (FastAPI's) with the FHIR interactions (type-level ones once, for every
    type) and every refusal documented."""
    fhir = openapi_document(registry, per_type=False)
    _merge(schema, fhir)
    info = schema.setdefault("info", {})
    info["description"] = (f"{info.get('description', '')} The FHIR API with the search "
                           f"parameters of each resource type: {FHIR_DOCUMENT_URL} (browse "
                           f"it at {FHIR_DOCS_URL}).").strip()
    _add_model(schema["components"].setdefault("schemas", {}), ErrorEnvelope)
    _document_all(schema, table)
    for name in ("HTTPValidationError", "ValidationError"):  # FastAPI's, now unused
        _drop_unused(schema, name)
    return schema


def fhir_by_type(api: JSON, table: Mapping[tuple[str, str], Rule], registry: Any = None
                 ) -> JSON:
    """The FHIR REST API alone, search and the type-level interactions described for each
    resource type (its search parameters, its POST _search form), refusals included."""
    fhir = openapi_document(registry, per_type=True)
    schemes = api.get("components", {}).get("securitySchemes", {})
    document: JSON = {
        "openapi": api.get("openapi", "3.1.0"),
        "info": {"title": f"{api['info']['title']}: FHIR R4 by resource type",
                 "version": api["info"]["version"],
                 "description": "The FHIR REST API at /fhir with the search parameters of "
                                "every resource type (from the server's registry)."},
        "paths": {}, "components": {"securitySchemes": schemes}, "tags": []}
    _merge(document, fhir)
    _document_all(document, table)
    return document


def _merge(schema: JSON, fhir: JSON) -> None:
    components = schema.setdefault("components", {})
    for section, entries in fhir["components"].items():
        components.setdefault(section, {}).update(entries)
    schema["paths"] = {**schema.get("paths", {}), **fhir["paths"]}
    schema["tags"] = [*schema.get("tags", []), *fhir["tags"]]


def _document_all(schema: JSON, table: Mapping[tuple[str, str], Rule]) -> None:
    control = AccessControl(table)
    for path, item in schema["paths"].items():
        for method, operation in item.items():
            _document_refusals(path, method.upper(), operation, control)


# -- one operation ---------------------------------------------------------------------------
def _document_refusals(path: str, method: str, operation: JSON, control: AccessControl
                       ) -> None:
    fhir = path == "/fhir" or path.startswith("/fhir/")
    found = control.match(method, normalize_path(path))
    statuses = access_statuses(found[0] if found else None)
    if not fhir:
        statuses |= request_statuses(operation)
    responses: JSON = operation.setdefault("responses", {})
    for code in [c for c, r in responses.items() if _schema_ref(r) == FASTAPI_VALIDATION]:
        del responses[code]  # FastAPI's, never sent: the envelope below stands for it
    for status in sorted(statuses):
        if str(status) in responses:
            continue
        if fhir:
            responses[str(status)] = {"$ref": f"#/components/responses/Fhir{status}"}
        else:
            responses[str(status)] = api_error(status)
    operation["responses"] = dict(sorted(responses.items(), key=lambda kv: kv[0]))


def access_statuses(rule: Rule | None) -> set[int]:
    """What the access layer may answer on a route of this rule."""
    if rule is None:
        return set()
    if rule.access == AUTHENTICATED:
        return {401, 403, 429}
    if rule.access == MFA_TOKEN:
        return {401, 429}
    return {429}


def request_statuses(operation: JSON) -> set[int]:
    """What an /api request may be refused with before its handler runs."""
    statuses: set[int] = set()
    parameters = operation.get("parameters", [])
    if any(p.get("in") == "path" for p in parameters):
        statuses.add(404)
    if any(p.get("in") == "query" for p in parameters):
        statuses.add(422)
    body = operation.get("requestBody")
    if body is not None:
        statuses.add(413)
        if any(kind in JSON_TYPES for kind in body.get("content", {})):
            statuses |= {400, 415, 422}
    return statuses


def api_error(status: int) -> JSON:
    response: JSON = {"description": API_ERRORS.get(status, "Error"),
                      "content": {"application/json": {"schema": {"$ref": ERROR_ENVELOPE}}}}
    if status == 429:
        response["headers"] = RETRY_AFTER
    elif status == 401:
        response["headers"] = WWW_AUTHENTICATE
    return response


# -- helpers ---------------------------------------------------------------------------------
def _schema_ref(response: JSON) -> str | None:
    schema = response.get("content", {}).get("application/json", {}).get("schema", {})
    ref = schema.get("$ref")
    return ref if isinstance(ref, str) else None


def _add_model(schemas: JSON, model: Any) -> None:
    definition = model.model_json_schema(ref_template="#/components/schemas/{model}")
    for name, nested in definition.pop("$defs", {}).items():
        schemas.setdefault(name, nested)
    schemas.setdefault(model.__name__, definition)


def _drop_unused(schema: JSON, name: str) -> None:
    schemas = schema.get("components", {}).get("schemas", {})
    if name not in schemas:
        return
    definition = schemas.pop(name)
    if f'"#/components/schemas/{name}"' in json.dumps(schema):
        schemas[name] = definition  # still referenced
