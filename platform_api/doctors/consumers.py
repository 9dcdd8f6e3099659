"""What the Doctors area does on other areas' events (spec: Events, Internal event bus).

- ``platform.auth.user_created`` with ``registration_role`` DOCTOR: the user's doctor
  profile is created (Practitioner, its own role, a pending VerificationResult, a role at
  each organization they already belong to). The short envelope's payload carries no
  names: they are then read from the account.
- ``platform.organization.member_added``: a member who has a doctor profile is linked to
  the organization (a PractitionerRole owned by it): this is how a doctor who accepted
  an organization's invitation comes to practise there.
- ``platform.organization.member_removed``: the doctor's role at that organization goes.

Every handler is idempotent on the event id: its effect commits together with a receipt
(``event_receipts/<handler>:<event id>``), and an event already received is skipped; the
effects are idempotent by themselves too (conditional creates on the user identifier and
on practitioner + organization), so a redelivery of the same change under another id
changes nothing either. A handler that fails leaves a dead letter (the bus). The
consumers write with the platform's rights, elevated once when they are built (recorded
in the audit trail).
"""

from __future__ import annotations

from typing import Any

from fhir_server.caller import FhirUnit
from fhir_server.store import DuplicateDocument
from platform_api.auth.users import COLLECTION as USERS
from platform_api.doctors.profiles import (
    LINKED,
    SOURCE,
    UNLINKED,
    create_profile,
    role_at,
    stage_org_role,
)
from platform_api.doctors.records import practitioner_of_user, roles_of
from platform_api.events import Event
from platform_api.organizations.members import MEMBER_ADDED, MEMBER_REMOVED
from platform_api.services import Services

JSON = dict[str, Any]
RECEIPTS = "event_receipts"
USER_CREATED = "platform.auth.user_created"


def _receipt_id(handler: str, event: Event) -> str:
    return f"{handler}:{event['id']}"


def _stage_receipt(unit: FhirUnit, handler: str, event: Event) -> None:
    key = _receipt_id(handler, event)
    unit.insert_document(RECEIPTS, key, {"id": key, "topic": event["topic"]})


async def _received(services: Services, handler: str, event: Event) -> bool:
    return await services.store.get_document(RECEIPTS, _receipt_id(handler, event)) is not None


async def _commit(unit: FhirUnit) -> None:
    try:
        await unit.commit()
    except DuplicateDocument:  # the same event, delivered twice at once: the other did it
        return


class DoctorConsumers:
    def __init__(self, services: Services):
        self.services = services
        # The consumers work for the platform on events already decided (a registration,
        # an accepted invitation, a removal): elevated once, when they are built.
        self.fhir = services.policy.elevate(
            "doctors consumers: create a registered doctor's profile, and give or take "
            "their PractitionerRole at an organization as their membership comes or goes")

    async def user_created(self, event: Event) -> None:
        payload = event["payload"]
        if payload.get("registration_role") != "DOCTOR" or await _received(
                self.services, "doctors.user_created", event):
            return
        user_id = payload["user_id"]
        names = {k: payload[k] for k in ("first_name", "last_name") if payload.get(k)}
        if len(names) < 2:  # the short envelope: the names are the account's
            account = await self.services.store.get_document(USERS, user_id)
            if account is None:
                raise LookupError(f"user {user_id} of the event is not known")
            names = {k: account[k] for k in ("first_name", "last_name")}
        try:
            await create_profile(self.services, self.fhir, user_id, {
                **names, **({"email": payload["email"]} if payload.get("email") else {}),
                "title": "Dr."}, also=lambda unit: _stage_receipt(
                unit, "doctors.user_created", event))
        except DuplicateDocument:
            return
        self.services.policy.membership_changed(user_id)

    async def member_added(self, event: Event) -> None:
        payload = event["payload"]
        if await _received(self.services, "doctors.member_added", event):
            return
        practitioner = await practitioner_of_user(self.fhir, payload["user_id"])
        if practitioner is None:
            return
        org_id = payload["organization_id"]
        specialties = [s for r in await roles_of(self.fhir, practitioner["id"])
                       if r.get("organization") is None for s in r.get("specialty", [])]
        unit = self.fhir.unit()
        async with unit:
            staged = await stage_org_role(unit, practitioner["id"], org_id, specialties)
            unit.after_writes(lambda staging: None if staged.existing else staging.emit(
                LINKED, {"doctor_id": practitioner["id"], "organization_id": org_id},
                source_service=SOURCE))
            _stage_receipt(unit, "doctors.member_added", event)
            await _commit(unit)

    async def member_removed(self, event: Event) -> None:
        payload = event["payload"]
        if await _received(self.services, "doctors.member_removed", event):
            return
        practitioner = await practitioner_of_user(self.fhir, payload["user_id"])
        if practitioner is None:
            return
        org_id = payload["organization_id"]
        role = await role_at(self.fhir, practitioner["id"], org_id)
        unit = self.fhir.unit()
        async with unit:
            if role is not None:
                await unit.delete("PractitionerRole", role["id"])
                unit.emit(UNLINKED, {"doctor_id": practitioner["id"],
                                     "organization_id": org_id}, source_service=SOURCE)
            _stage_receipt(unit, "doctors.member_removed", event)
            await _commit(unit)


def start(services: Services) -> None:
    consumers = DoctorConsumers(services)
    services.bus.subscribe(USER_CREATED, consumers.user_created)
    services.bus.subscribe(MEMBER_ADDED, consumers.member_added)
    services.bus.subscribe(MEMBER_REMOVED, consumers.member_removed)
