"""capabilities: ``GET [base]/metadata``, a CapabilityStatement generated from what the
router really mounts and what the search engine really supports: per type every
searchable parameter of the registry (custom ones after a reindex), the reference
parameters usable in ``_include``/``_revinclude``, conditional interactions, and the
system-level interactions (transaction, batch, search-system, history-system)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from fhir_server.clock import now_instant
from fhir_server.http import FhirResponse, check_format
from fhir_server.interactions.context import FhirContext
from fhir_server.search.registry import SearchRegistry
from fhir_server.validation import resource_types

SOFTWARE_VERSION = "0.1.0"
VALIDATE = {"name": "validate",
            "definition": "http://hl7.org/fhir/OperationDefinition/Resource-validate"}


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
              type_interactions: Sequence[str]) -> dict[str, Any]:
    references = sorted(p.code for p in registry.params(resource_type).values()
                        if p.type == "reference")
    revinclude = sorted(f"{source}:{p.code}" for source, params in registry.by_type.items()
                        if source != "Resource" for p in params.values()
                        if p.type == "reference" and (not p.targets
                                                      or resource_type in p.targets))
    resource: dict[str, Any] = {
        "type": resource_type,
        "profile": f"http://hl7.org/fhir/StructureDefinition/{resource_type}",
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
    resource["operation"] = [VALIDATE]
    if resource_type == "Patient":
        resource["operation"].append({
            "name": "everything",
            "definition": "http://hl7.org/fhir/OperationDefinition/Patient-everything",
        })
    return resource


def capability_statement(
    fhir_base: str,
    type_interactions: Sequence[str],
    system_interactions: Sequence[str],
    registry: SearchRegistry,
    security: dict[str, Any] | None = None,
) -> dict[str, Any]:
    resources = [_resource(registry, t, type_interactions) for t in sorted(resource_types())]
    return {
        "resourceType": "CapabilityStatement",
        "status": "active",
        "date": now_instant()[:10],
        "publisher": "healthplatform",
        "kind": "instance",
        "software": {"name": "healthplatform", "version": SOFTWARE_VERSION},
        "implementation": {"description": "healthplatform FHIR R4 server", "url": fhir_base},
        "fhirVersion": "4.0.1",
        "format": ["application/fhir+json", "json"],
        "patchFormat": ["application/json-patch+json"],
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
            "operation": [VALIDATE, {
                "name": "everything",
                "definition": "http://hl7.org/fhir/OperationDefinition/Patient-everything",
            }],
        }],
    }


async def capabilities(ctx: FhirContext, request: Request, statement: dict[str, Any]
                       ) -> Response:
    check_format(request)
    return FhirResponse(statement)
