"""The one named elevation: the platform acting with more rights than its caller.

Some permitted actions have side effects their caller could not write alone: dispensing
updates the prescription a pharmacist may not edit, a booking made without an account
stores a contact nobody signed in as, the HL7 gateway writes what its interfaces send.
Those writes go through :meth:`Elevator.elevate`, which names its reason and hands back a
FHIR caller with the system's access (:data:`fhir_server.access.SYSTEM`). Every elevation
is told to the listeners (the clinical audit trail writes each as an AuditEvent naming
the caller, when there is one, and the reason), and no module outside the policy package
and the FHIR server imports the system access (``tests/test_policy_layers.py`` keeps it
so and lists every site that elevates).

Per-request elevations name the principal whose permitted action they serve; components
that work for the platform itself (the HL7 gateway, the master patient index, delivery
workers) elevate once when they start, with ``on_behalf_of=None``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from fhir_server.access import SYSTEM, Access
from fhir_server.caller import CallerFhir
from fhir_server.service import FhirService
from platform_api.auth.principal import Principal


@dataclass(frozen=True, slots=True)
class Elevation:
    reason: str
    principal: Principal | None  # whose permitted action it serves; None: the platform's


ElevationListener = Callable[[Elevation], None]


class Elevator:
    def __init__(self, fhir: FhirService):
        self.fhir = fhir
        self.listeners: list[ElevationListener] = []

    def elevated_access(self, reason: str, on_behalf_of: Principal | None = None) -> Access:
        """The system's access, for ``reason`` (recorded): for a unit of work that goes on
        as the caller (``unit.acting_as(...)``) or a component that takes an access."""
        if not reason.strip() or ":" not in reason:
            raise ValueError("an elevation names its reason as '<action>: <what it writes>'")
        elevation = Elevation(reason, on_behalf_of)
        for listener in self.listeners:
            listener(elevation)
        return SYSTEM

    def elevate(self, reason: str, on_behalf_of: Principal | None = None) -> CallerFhir:
        """The FHIR service with the system's access, for ``reason`` (recorded)."""
        return CallerFhir(self.fhir, self.elevated_access(reason, on_behalf_of))
