"""Workforce area: members, shift types and coverage, rosters generated with OR-Tools
CP-SAT, swaps, approved leave's effect on rosters, fairness (spec: Endpoints, Workforce
and training).

One module per part, each stating its FHIR mapping (or why it keeps documents):

- :mod:`~.members`: the organization's staff as rostering sees them (PractitionerRole);
- :mod:`~.shift_types`: shift types with their coverage requirements (documents);
- :mod:`~.rosters`: rosters, their generation, approval, publication and gaps
  (documents), over :mod:`~.rules` (the hard rules) and :mod:`~.solver` (CP-SAT);
- :mod:`~.swaps`: shift swaps checked against the hard rules (documents);
- :mod:`~.leave`: approved leave removes the member from their shifts;
- :mod:`~.fairness`: nights, weekends, holidays and hours per member; Gini coefficients.

``router`` mounts them all; ``start(services)`` subscribes the leave handler.
"""

from __future__ import annotations

from fastapi import APIRouter

from platform_api.services import Services
from platform_api.workforce import fairness, leave, members, rosters, shift_types, swaps

router = APIRouter()
for _part in (members, shift_types, rosters, swaps):
    router.include_router(_part.router)
fairness.mount(router)


def start(services: Services) -> None:
    """At startup, before the bus relays: approved leave updates rosters."""
    leave.start(services)


__all__ = ["router", "start"]
