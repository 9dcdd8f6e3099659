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
        base = self.base_url or str(request.base_url).rstrip("/")
        return f"{base}/fhir"

    def location(self, request: Request, resource_type: str, resource_id: str,
                 version: int) -> str:
        return f"{self.fhir_base(request)}/{resource_type}/{resource_id}/_history/{version}"
