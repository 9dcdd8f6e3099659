"""Finding the stored Encounter of a stay an ADT names by no identifier.

An ADT without a visit number (PV1-19) or an admit date/time (PV1-44) still belongs to a
stay: the A01, A08 and A03 of one admission must update one Encounter, not create three.
The mapper marks such an Encounter with a :class:`~hl7_gateway.v2_to_fhir.bundle.StayMatch`
(the rule is in ``hl7_gateway.v2_to_fhir.pv1``); before the transaction this module looks
the stay up among the patient's stored Encounters:

1. the patient (PID-3) must be stored, and only once; otherwise the stay is new;
2. the patient's Encounters in one of the statuses the event applies to;
3. of those, the most recently updated one at the PV1-3 location (any of its locations:
   a patient back on a ward of the same stay is still in that stay); with no location in
   the message, one at no location;
4. else, for events about a stay already begun, the most recently updated of them
   wherever it is.

A stay found becomes a version-checked update of that Encounter, the message's elements
laid over it as for merged updates (``hl7_gateway.merge``), except a status ``unknown``
(an A08 that cannot tell) which leaves the stay's status as it is; none found, the
Encounter is created. Two messages about one patient are serialised by the gateway (the Patient's
identifier is a lock key), and a concurrent write is caught by the version check.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from hl7_gateway.merge import Search, merge_into
from hl7_gateway.v2_to_fhir.bundle import Entry, StayMatch, identifier_token

__all__ = ["find_stay", "resolve_stays"]

JSON = dict[str, Any]


def _updated(resource: JSON) -> str:
    return str((resource.get("meta") or {}).get("lastUpdated", ""))


def _places(encounter: JSON) -> set[str]:
    return {str((place.get("location") or {}).get("reference", ""))
            for place in encounter.get("location", [])}


async def find_stay(match: StayMatch, search: Search) -> JSON | None:
    """The stored Encounter of the stay ``match`` describes, or None (a new stay)."""
    patients = await search("Patient", [("identifier", identifier_token(match.patient))])
    if len(patients) != 1:
        return None
    candidates = await search("Encounter", [("subject", f"Patient/{patients[0]['id']}"),
                                            ("status", ",".join(match.statuses))])
    latest = sorted(candidates, key=_updated, reverse=True)
    if match.location is not None:
        places = await search("Location", [("identifier", identifier_token(match.location))])
        here = {f"Location/{place['id']}" for place in places}
        at_location = [e for e in latest if _places(e) & here]
    else:
        at_location = [e for e in latest if not _places(e)]
    if at_location:
        return at_location[0]
    if match.any_location and latest:
        return latest[0]
    return None


async def resolve_stays(entries: Iterable[Entry], search: Search) -> None:
    """Turn each Encounter marked with a stay into an update of the stored one, if found
    (mutates the entries)."""
    for entry in entries:
        if entry.stay is None:
            continue
        stored = await find_stay(entry.stay, search)
        if stored is None:
            continue
        unknown = entry.resource.get("status") == "unknown"
        merge_into(entry, stored)
        if unknown and stored.get("status"):
            entry.resource["status"] = stored["status"]
