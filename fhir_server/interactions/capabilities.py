"""capabilities: ``GET [base]/metadata``, a CapabilityStatement generated from what the
router really mounts and what the search engine really supports: per type every
searchable parameter of the registry (custom ones after a reindex), the reference
parameters usable in ``_include``/``_revinclude``, conditional interactions, and the
system-level interactions (transaction, batch, search-system, history-system).

The whole statement is large (every parameter of 146 types, about 0.9 MB), so the
parameters a read takes apply (R4 3.1.0.1.6): ``_summary=true`` keeps the elements R4
marks as summary, nested ones included (per type its name, profile and operations:
about 3% of the size), ``_summary=text|data|false`` and ``_elements=a,b`` as for any
resource; a subset carries the ``SUBSETTED`` tag.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from fhir_server.added_types import structure
from fhir_server.clock import now_instant
from fhir_server.http import FhirResponse, check_format
from fhir_server.interactions.context import FhirContext
from fhir_server.outcome import FhirError
from fhir_server.patches import MEDIA_TYPES as PATCH_FORMATS
from fhir_server.search.registry import SearchRegistry
from fhir_server.search.summary import SUBSETTED, select_elements, summarize
from fhir_server.validation import resource_types

SOFTWARE_VERSION = "0.1.0"
VALIDATE = {"name": "validate",
            "definition": "http://hl7.org/fhir/OperationDefinition/Resource-validate"}

BULK_DATA = "http://hl7.org/fhir/uv/bulkdata/CapabilityStatement/bulk-data"
EXPORT = {"name": "export",
          "definition": "http://hl7.org/fhir/uv/bulkdata/OperationDefinition/export"}
BULK_LEVELS = {
    "Patient": {"name": "export", "definition":
                "http://hl7.org/fhir/uv/bulkdata/OperationDefinition/patient-export"},
    "Group": {"name": "export", "definition":
              "http://hl7.org/fhir/uv/bulkdata/OperationDefinition/group-export"},
}
# SQL on FHIR v2 (its OperationDefinitions' canonical URLs)
VIEW_RUN = {"name": "run",
            "definition": "http://sql-on-fhir.org/OperationDefinition/$viewdefinition-run"}
VIEW_EXPORT = {"name": "viewdefinition-export", "definition":
               "http://sql-on-fhir.org/OperationDefinition/$viewdefinition-export"}
WEBSOCKET = "http://hl7.org/fhir/StructureDefinition/capabilitystatement-websocket"
BACKPORT = "http://hl7.org/fhir/uv/subscriptions-backport/OperationDefinition"
OPERATION_BASE = "http://hl7.org/fhir/OperationDefinition"
# The terminology operations (fhir_server/interactions/codesystem_*, valueset_*,
# conceptmap_*), per type.
TERMINOLOGY_OPERATIONS: dict[str, list[dict[str, str]]] = {
    "CodeSystem": [{"name": name, "definition": f"{OPERATION_BASE}/CodeSystem-{name}"}
                   for name in ("lookup", "validate-code", "subsumes")],
    "ValueSet": [{"name": name, "definition": f"{OPERATION_BASE}/ValueSet-{name}"}
                 for name in ("expand", "validate-code")],
    "ConceptMap": [{"name": "translate",
                    "definition": f"{OPERATION_BASE}/ConceptMap-translate"}],
}
SUBSCRIPTION_OPERATIONS = [
    {"name": "status", "definition": f"{BACKPORT}/backport-subscription-status",
     "documentation": "Type level (GET or POST [base]/Subscription/$status: id and status "
                      "parameters, ORed; without id every Subscription the caller may read) "
                      "and instance level ([base]/Subscription/[id]/$status)"},
    {"name": "get-ws-binding-token",
     "definition": f"{BACKPORT}/backport-subscription-get-ws-binding-token"},
]


def search_params(registry: SearchRegistry, resource_type: str) -> list[dict[str, str]]:
    params = []
    for param in sorted(registry.params(resource_type).values(), key=lambda p: p.code):
        if not param.searchable:
            continue
        entry = {"name": param.code, "type": param.type}
        if param.url:
            entry["definition"] = param.url
        if param.description:
            entry["documentation"] = param.description
        params.append(entry)
    return params


def _resource(registry: SearchRegistry, resource_type: str,
              type_interactions: Sequence[str], profiles: Sequence[str] = ()
              ) -> dict[str, Any]:
    references = sorted(p.code for p in registry.params(resource_type).values()
                        if p.type == "reference")
    revinclude = sorted(f"{source}:{p.code}" for source, params in registry.by_type.items()
                        if source != "Resource" for p in params.values()
                        if p.type == "reference" and (not p.targets
                                                      or resource_type in p.targets))
    added = structure(resource_type)
    resource: dict[str, Any] = {
        "type": resource_type,
        "profile": added["url"] if added else
        f"http://hl7.org/fhir/StructureDefinition/{resource_type}",
        "interaction": [{"code": code} for code in type_interactions],
        "versioning": "versioned-update",
        "readHistory": True,
        "updateCreate": True,
        "conditionalCreate": True,
        "conditionalRead": "full-support",
        "conditionalUpdate": True,
        "conditionalDelete": "multiple",
        "referencePolicy": ["literal", "logical", "local"],
        "searchInclude": ["*", *(f"{resource_type}:{r}" for r in references)],
        "searchRevInclude": revinclude,
        "searchParam": search_params(registry, resource_type),
    }
    if profiles:  # the profiles $validate and the profile check of writes know
        resource["supportedProfile"] = list(profiles)
    resource["operation"] = [VALIDATE, *TERMINOLOGY_OPERATIONS.get(resource_type, ())]
    if resource_type == "ViewDefinition":
        resource["operation"] += [VIEW_RUN]
    if resource_type == "Patient":
        resource["operation"] += [{
            "name": "everything",
            "definition": "http://hl7.org/fhir/OperationDefinition/Patient-everything",
        }, {
            "name": "match",
            "definition": "http://hl7.org/fhir/OperationDefinition/Patient-match",
        }]
    return resource


def capability_statement(
    fhir_base: str,
    type_interactions: Sequence[str],
    system_interactions: Sequence[str],
    registry: SearchRegistry,
    security: dict[str, Any] | None = None,
    bulk_export: bool = False,
    websocket: str | None = None,
    subscriptions: str | None = None,
    profiles: Mapping[str, Sequence[str]] | None = None,
) -> dict[str, Any]:
    """The statement; ``websocket`` the subscriptions' websocket URL and ``subscriptions``
    what is offered of them (the Subscription entry's documentation), when offered;
    ``profiles`` the supported profiles per type."""
    profiles = profiles or {}
    resources = [_resource(registry, t, type_interactions, profiles.get(t, ()))
                 for t in sorted(resource_types())]
    operations: list[dict[str, str]] = [VALIDATE, {
        "name": "everything",
        "definition": "http://hl7.org/fhir/OperationDefinition/Patient-everything",
    }]
    operations.append({**VIEW_RUN, "name": "viewdefinition-run"})
    if bulk_export:
        operations += [EXPORT, VIEW_EXPORT]
        for resource in resources:
            if resource["type"] in BULK_LEVELS:
                resource["operation"].append(BULK_LEVELS[resource["type"]])
            if resource["type"] == "ViewDefinition":
                resource["operation"].append(VIEW_EXPORT)
    statement: dict[str, Any] = {
        "resourceType": "CapabilityStatement",
        "status": "active",
        "date": now_instant()[:10],
        "publisher": "healthplatform",
        "kind": "instance",
        "software": {"name": "healthplatform", "version": SOFTWARE_VERSION},
        "implementation": {"description": "healthplatform FHIR R4 server", "url": fhir_base},
        "fhirVersion": "4.0.1",
        "format": ["application/fhir+json", "json"],
        "patchFormat": list(PATCH_FORMATS),
        "rest": [{
            "mode": "server",
            "documentation": (
                "Search: every parameter type and modifier of R4 except terminology "
                "modifiers (:in, :not-in, :below/:above on tokens) and _contained; "
                "Bundle.total is given with _total=accurate|estimate, or when the result "
                "is small; paging links use a keyset _cursor."),
            "security": security or {
                "cors": True,
                "description": "Bearer access tokens (PASETO v4.public) from /api/auth/login",
            },
            "resource": resources,
            "interaction": [{"code": code} for code in system_interactions],
            "searchParam": [
                *search_params(registry, "Resource"),
                {"name": "_type", "type": "token",
                 "documentation": "Resource types a system search covers"},
            ],
            "operation": operations,
        }],
    }
    if bulk_export:
        statement["instantiates"] = [BULK_DATA]
    if websocket:
        statement["rest"][0]["extension"] = [{"url": WEBSOCKET, "valueUri": websocket}]
        for resource in resources:
            if resource["type"] == "Subscription":
                resource["operation"] += SUBSCRIPTION_OPERATIONS
                if subscriptions:
                    resource["documentation"] = subscriptions
    return statement


# The elements of CapabilityStatement that R4 marks isSummary (its StructureDefinition),
# as paths below the resource; a backbone element listed with children keeps only those.
SUMMARY_PATHS = frozenset({
    "id", "meta", "implicitRules", "url", "version", "name", "title", "status",
    "experimental", "date", "publisher", "contact", "useContext", "jurisdiction", "kind",
    "instantiates", "imports", "software", "software.name", "software.version",
    "software.releaseDate", "implementation", "implementation.description",
    "implementation.url", "implementation.custodian", "fhirVersion", "format",
    "patchFormat", "implementationGuide", "rest", "rest.mode", "rest.security",
    "rest.security.cors", "rest.security.service", "rest.resource", "rest.resource.type",
    "rest.resource.profile", "rest.resource.supportedProfile", "rest.resource.operation",
    "rest.resource.operation.name", "rest.resource.operation.definition", "rest.operation",
    "messaging", "messaging.supportedMessage", "messaging.supportedMessage.mode",
    "messaging.supportedMessage.definition", "document", "document.mode", "document.profile",
})
_PARENTS = frozenset(path.rsplit(".", 1)[0] for path in SUMMARY_PATHS if "." in path)


def summary_statement(statement: dict[str, Any]) -> dict[str, Any]:
    """``_summary=true``: the summary elements, at every depth, tagged SUBSETTED."""
    summary = _summary_of(statement, "")
    meta = dict(summary.get("meta") or {})
    meta["tag"] = [*(meta.get("tag") or []), SUBSETTED]
    return {"resourceType": statement["resourceType"], **summary, "meta": meta}


def _summary_of(node: dict[str, Any], path: str) -> dict[str, Any]:
    kept = {}
    for key, value in node.items():
        child = f"{path}.{key}" if path else key
        if child not in SUMMARY_PATHS:
            continue
        if child in _PARENTS:  # a backbone element: its own summary elements only
            value = [_summary_of(v, child) for v in value] if isinstance(value, list) \
                else _summary_of(value, child)
        kept[key] = value
    return kept


def statement_for(request: Request, statement: dict[str, Any], summary: dict[str, Any],
                  registry: SearchRegistry) -> dict[str, Any]:
    """The statement as the request's ``_summary`` / ``_elements`` ask for it."""
    params = request.query_params
    mode = params.get("_summary")
    elements = [e.strip() for e in params.get("_elements", "").split(",") if e.strip()]
    if mode in (None, "false"):
        return select_elements(statement, elements, registry) if elements else statement
    if mode == "true":
        return summary
    if mode in ("text", "data"):
        return summarize(statement, mode, registry)
    raise FhirError.of(400, "invalid", f"_summary={mode!r}: the capability statement "
                       "takes true, text, data or false", "_summary")


async def capabilities(ctx: FhirContext, request: Request, statement: dict[str, Any],
                       summary: dict[str, Any]) -> Response:
    check_format(request)
    return FhirResponse(statement_for(request, statement, summary, ctx.service.registry))
