"""What every interaction needs: the FHIR service, the server's base URL, and the caller.

The router resolves each guarded request's :class:`~fhir_server.access.Access` before the
interaction runs and keeps the caller-bound service on the request
(:meth:`FhirContext.caller`): interactions read, search and write through it, so every
one of them goes through the access policy."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from starlette.requests import Request

from fhir_server.access import AccessDenied
from fhir_server.caller import CallerFhir
from fhir_server.service import FhirService

CALLER = "fhir_caller"  # request.state key of the caller-bound service


@dataclass(frozen=True, slots=True)
class FhirContext:
    service: FhirService
    base_url: str = ""  # e.g. https://fhir.example.org (without /fhir); "" = from request
    extras: dict[str, Any] = field(default_factory=dict)  # per-app caches (capabilities)
    # CapabilityStatement.rest.security for a FHIR base (the platform's SMART endpoints);
    # None: bearer tokens described in general terms.
    security: Callable[[str], dict[str, Any]] | None = None

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

    def caller(self, request: Request) -> CallerFhir:
        """The service as this request's caller sees it (set by the router)."""
        caller = request.scope.get("state", {}).get(CALLER)
        if caller is None:  # an interaction on a route the router did not guard
            raise AccessDenied("This request was not authorized")
        return caller  # type: ignore[no-any-return]

    def location(self, request: Request, resource_type: str, resource_id: str,
                 version: int) -> str:
        return f"{self.fhir_base(request)}/{resource_type}/{resource_id}/_history/{version}"
