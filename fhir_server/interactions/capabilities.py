"""capabilities: ``GET [base]/metadata``, a CapabilityStatement generated from what the
router really mounts and what the search engine really supports."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from fhir_server.http import FhirResponse, check_format
from fhir_server.interactions.context import FhirContext
from fhir_server.store.sqlite import now_instant
from fhir_server.validation import resource_types

SOFTWARE_VERSION = "0.1.0"


def capability_statement(
    fhir_base: str,
    type_interactions: Sequence[str],
    system_interactions: Sequence[str],
    search_params: dict[str, list[dict[str, str]]],
) -> dict[str, Any]:
    resources = []
    for resource_type in sorted(resource_types()):
        resources.append({
            "type": resource_type,
            "profile": f"http://hl7.org/fhir/StructureDefinition/{resource_type}",
            "interaction": [{"code": code} for code in type_interactions],
            "versioning": "versioned-update",
            "readHistory": True,
            "updateCreate": True,
            "conditionalCreate": False,
            "conditionalRead": "full-support",
            "conditionalUpdate": False,
            "conditionalDelete": "not-supported",
            "searchParam": search_params.get(resource_type, search_params.get("Resource", [])),
        })
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
            "security": {
                "cors": True,
                "description": "Bearer access tokens (PASETO v4.public) from /api/auth/login",
            },
            "resource": resources,
            "interaction": [{"code": code} for code in system_interactions],
        }],
    }


async def capabilities(ctx: FhirContext, request: Request, statement: dict[str, Any]
                       ) -> Response:
    check_format(request)
    return FhirResponse(statement)
