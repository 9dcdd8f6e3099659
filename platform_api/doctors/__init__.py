"""Doctors area: profiles, verification, the public directory, organizations, and the
clinicians' orders and results (spec: Endpoints, Doctors).

One module per part, each stating its FHIR mapping:

- :mod:`~.records`: a doctor as Practitioner, PractitionerRole(s) and VerificationResult,
  and their private and public views;
- :mod:`~.profiles`: creating and changing profiles, verification by platform
  administrators, the organizations a doctor practises at;
- :mod:`~.directory`: the public search, profiles and availability (Schedule and Slot);
- :mod:`~.consumers`: profiles made and linked from ``platform.auth.user_created`` and
  ``platform.organization.member_added`` / ``member_removed``;
- :mod:`~.orders`: service requests, diagnostic reports (sign) and imaging studies.

``router`` mounts them (the doctor's own static paths, ``/me``, ``/pending``,
``/search``, before ``/:id``); ``start(services)`` subscribes the consumers.
"""

from __future__ import annotations

from fastapi import APIRouter

from platform_api.doctors import consumers, directory, orders, profiles
from platform_api.services import Services

router = APIRouter()
for _part in (profiles, directory, orders):
    router.include_router(_part.router)


def start(services: Services) -> None:
    """At startup, before the bus relays: the event consumers."""
    consumers.start(services)


__all__ = ["router", "start"]
