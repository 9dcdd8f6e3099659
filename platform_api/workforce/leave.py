"""What approved leave does to the workforce: ``platform.workforce.leave_approved`` (from
the Organizations area's approvals, or the signed HR webhook
:mod:`platform_api.webhooks.workforce`; payload ``{leave_request_id, organization_id,
user_id, start, end, type, approved_by}``).

- The member's PractitionerRole gains the leave as ``notAvailable`` (description
  ``<type> leave (<leave_request_id>)``), so FHIR clients and later generations see it.
- Every roster of the organization (draft, approved or published) loses the member's
  shifts that overlap the leave; its gaps are recomputed and saved as its next revision,
  with ``platform.workforce.leave_applied`` (``roster_id``, ``organization_id``,
  ``user_id``, ``leave_request_id``, ``removed`` (the shifts), ``gaps`` (all the roster's
  gaps now)) and, when the removal opened gaps, ``platform.workforce.coverage_gaps_found``
  (``cause`` leave).

The bus runs the durable consumer ``workforce_rosters`` once per event id; each effect is
idempotent by itself too (the leave already on the role, no shift left to remove), so the
same leave delivered under another id (the HR webhook after an approval in the platform)
changes nothing more. A leave of someone outside the workforce changes no roster.

The consumer works for the platform, after the approval was decided (by an ``ORG:ADMIN``
through the policy, or by the HR system's signed webhook): it writes the member's
PractitionerRole and the rosters with the platform's rights, elevated once when it is
built (a named elevation, recorded in the audit trail).
"""

from __future__ import annotations

from datetime import date, datetime, time, timedelta
from typing import Any

from platform_api.events import Event
from platform_api.organizations.attendance import LEAVE_APPROVED
from platform_api.services import Services
from platform_api.workforce.common import (
    ROSTERS,
    change_in_turn,
    shift_type_map,
)
from platform_api.workforce.members import MEMBER_SYSTEM
from platform_api.workforce.rosters import current_gaps, shift_type

JSON = dict[str, Any]
CONSUMER = "workforce_rosters"
TOPIC = "platform.workforce."
MAX_ROSTERS = 500


def leave_window(start: str, end: str) -> tuple[datetime, datetime]:
    """The instants a leave covers (date ends include their whole day); naive wall-clock
    times, as shifts are."""
    first = datetime.fromisoformat(start) if "T" in start else \
        datetime.combine(date.fromisoformat(start), time())
    last = datetime.fromisoformat(end) if "T" in end else \
        datetime.combine(date.fromisoformat(end) + timedelta(days=1), time())
    return first.replace(tzinfo=None), last.replace(tzinfo=None)


def fhir_when(value: str) -> str:
    """A FHIR dateTime of the leave's bound: a date stays a date (its whole day, as the
    members' unavailability reads it); a date-time without a time zone, which FHIR does
    not allow, becomes its whole day."""
    if "T" not in value:
        return value
    moment = datetime.fromisoformat(value)
    return value if moment.tzinfo is not None else moment.date().isoformat()


class LeaveConsumer:
    def __init__(self, services: Services):
        self.services = services
        self.fhir = services.policy.elevate(
            "workforce leave: mark approved leave on the member's PractitionerRole and "
            "take their shifts off the organization's rosters")

    async def leave_approved(self, event: Event) -> None:
        store, payload = self.services.store, event["payload"]
        org_id = payload["organization_id"]
        away = leave_window(str(payload["start"]), str(payload["end"]))
        if await self._mark_unavailable(payload, away):
            rosters = await store.find_documents(ROSTERS, {"organization_id": org_id},
                                                 limit=MAX_ROSTERS)
            types = await shift_type_map(None, org_id, services=self.services)
            for roster in rosters:
                if _overlaps(roster, away):
                    await self._apply(roster["id"], payload, away, types)

    async def _mark_unavailable(self, payload: JSON, away: tuple[datetime, datetime]) -> bool:
        """Add the leave to the member's workforce record; False when they have none."""
        fhir = self.fhir
        found = await fhir.search("PractitionerRole", [
            ("identifier", f"{MEMBER_SYSTEM}|{payload['organization_id']}:{payload['user_id']}")])
        if not found:
            return False
        role = found[0]
        said = f"{payload['type']} leave ({payload['leave_request_id']})"
        if any(n.get("description") == said for n in role.get("notAvailable") or []):
            return True
        role["notAvailable"] = [*(role.get("notAvailable") or []), {
            "description": said, "during": {"start": fhir_when(str(payload["start"])),
                                            "end": fhir_when(str(payload["end"]))}}]
        await fhir.update("PractitionerRole", role["id"], role,
                          if_match=int(role["meta"]["versionId"]))
        return True

    async def _apply(self, roster_id: str, payload: JSON, away: tuple[datetime, datetime],
                     types: dict[str, JSON]) -> None:
        user_id, org_id = payload["user_id"], payload["organization_id"]
        removed: list[JSON] = []

        async def change(roster: JSON) -> tuple[JSON, list[tuple[str, JSON]]]:
            removed.clear()
            kept = []
            for a in roster.get("assignments") or []:
                if a["user_id"] == user_id and a["shift_type_id"] in types:
                    start, end = shift_type(types[a["shift_type_id"]]).interval(
                        date.fromisoformat(a["date"]))
                    if start < away[1] and away[0] < end:
                        removed.append(a)
                        continue
                kept.append(a)
            if not removed:
                raise _Unchanged
            changed = {**roster, "assignments": kept}
            before = sum(g["missing"] for g in roster.get("gaps") or [])
            changed["gaps"] = current_gaps(changed, types)
            events = [(TOPIC + "leave_applied", {
                "roster_id": roster_id, "organization_id": org_id, "user_id": user_id,
                "leave_request_id": payload["leave_request_id"], "removed": list(removed),
                "gaps": changed["gaps"]})]
            if sum(g["missing"] for g in changed["gaps"]) > before:
                events.append((TOPIC + "coverage_gaps_found", {
                    "roster_id": roster_id, "organization_id": org_id, "cause": "leave",
                    "gaps": changed["gaps"]}))
            return changed, events

        try:
            await change_in_turn(self.services, self.fhir, roster_id, change)
        except _Unchanged:
            return


class _Unchanged(Exception):
    """The roster holds none of the member's shifts during the leave."""


def _overlaps(roster: JSON, away: tuple[datetime, datetime]) -> bool:
    first = datetime.combine(date.fromisoformat(roster["start"]), time())
    # a night shift of the last day ends the next morning
    last = datetime.combine(date.fromisoformat(roster["end"]) + timedelta(days=2), time())
    return first < away[1] and away[0] < last


def start(services: Services) -> None:
    services.bus.subscribe(LEAVE_APPROVED, LeaveConsumer(services).leave_approved,
                           consumer=CONSUMER)


__all__ = ["LeaveConsumer", "fhir_when", "leave_window", "start"]
