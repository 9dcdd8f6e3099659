"""What every interaction needs: the FHIR service and the server's base URL."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from starlette.requests import Request

from fhir_server.service import FhirService


@dataclass(frozen=True, slots=True)
class FhirContext:
    service: FhirService
    base_url: str = ""  # e.g. https://fhir.example.org (without /fhir); "" = from request
    extras: dict[str, Any] = field(default_factory=dict)  # per-app caches (capabilities)

    def fhir_base(self, request: Request) -> str:
        if self.base_url:
            return f"{self.base_url}/fhir"
        # Building request.base_url parses a URL on every call (measured ~15 µs a create);
        # the answer only depends on scheme, Host and root path, so it is remembered.
        scope = request.scope
        key = (scope.get("scheme"), request.headers.get("host"), scope.get("root_path"),
               scope.get("server"))
        bases: dict[Any, str] = self.extras.setdefault("fhir_bases", {})
        base = bases.get(key)
        if base is None:
            if len(bases) > 256:  # many Host names: a bounded cache, not a leak
                bases.clear()
            base = bases[key] = str(request.base_url).rstrip("/") + "/fhir"
        return base

    def location(self, request: Request, resource_type: str, resource_id: str,
                 version: int) -> str:
        return f"{self.fhir_base(request)}/{resource_type}/{resource_id}/_history/{version}"
