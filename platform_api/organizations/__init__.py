"""Organizations area: facilities, members, invitations, rooms and beds, admissions,
billing, messaging, attendance and leave (spec: Endpoints, Organizations).

One module per part, each stating its FHIR mapping (or why it keeps documents):

- :mod:`~.facilities`: Organization, its status (active, suspended, closed), the
  directory and the caller's own organizations;
- :mod:`~.members`: memberships with their ``ORG:<ROLE>`` (documents), roles, removal,
  at least one ``ORG:ADMIN``;
- :mod:`~.invitations`: e-mailed, single-use, expiring invitations (documents);
- :mod:`~.rooms`: rooms and wards with their beds (Location);
- :mod:`~.admissions`: inpatient stays (Encounter) with the history of their beds;
- :mod:`~.billing`: invoices (Invoice), payments (PaymentReconciliation), claims (Claim);
- :mod:`~.messaging`: conversations and messages (Communication), live over SSE;
- :mod:`~.attendance`: clock-in/out and leave requests (documents).

``router`` mounts them all; ``start(services)`` wires what runs on events.
"""

from __future__ import annotations

from fastapi import APIRouter

from platform_api.organizations import (
    admissions,
    attendance,
    billing,
    facilities,
    invitations,
    members,
    messaging,
    rooms,
)
from platform_api.organizations.facilities import organizations
from platform_api.organizations.members import MEMBERS, member_document
from platform_api.services import Services

router = APIRouter()
# Invitations first: POST /api/organizations/invitations/accept is a static path.
for _part in (invitations, facilities, members, rooms, admissions, billing, messaging,
              attendance):
    router.include_router(_part.router)


def start(services: Services) -> None:
    """At startup, before the bus relays: the live message streams."""
    messaging.start(services)


__all__ = ["MEMBERS", "member_document", "organizations", "router", "start"]
