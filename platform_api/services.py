"""The service container: everything a request handler needs, built once per process."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from starlette.requests import Request

from fhir_server.service import FhirService
from fhir_server.store import ResourceStore
from platform_api.settings import Settings

if TYPE_CHECKING:
    from platform_api.auth.service import AuthService
    from platform_api.events import EventBus
    from platform_api.policy import Policy


@dataclass
class Services:
    settings: Settings
    store: ResourceStore
    fhir: FhirService
    auth: AuthService
    bus: EventBus
    policy: Policy
    started_at: float = field(default_factory=time.time)
    extras: dict[str, Any] = field(default_factory=dict)


def services_of(app_state: Any) -> Services:
    return app_state.services  # type: ignore[no-any-return]


def request_services(request: Request) -> Services:
    """The app's services, for a route (``services = request_services(request)``)."""
    return request.app.state.services  # type: ignore[no-any-return]
