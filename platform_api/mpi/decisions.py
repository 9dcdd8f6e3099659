"""Match decisions: what the index and people decided about a pair of Patients.

A decision is a document (``mpi_matches``, one per pair of Patients, its id derived from
the pair): the two ids, the golden record and the other, the score, grade, weight, the
level of each field and which agreed, agreed in part (shown as such: a transposed birth
date is never "agreed") or disagreed, why a certain pair waits for review (``hold``),
status (candidate → linked | rejected; linked → unlinked; unlinked → linked; rejected →
linked), the link type, source (automatic | manual), who decided and when, what the
link changed on the record merged away (``restore``: its ``active`` before, put back when
the link is undone) and the history of it all.

A decision made by a person binds the index: a pair a person linked stays in one
cluster, one they rejected or unlinked is never linked again automatically, even
through other records. A decision the matcher made (``decided_by`` ``mpi-matcher``) is
re-evaluated whenever one of its records changes.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from platform_api.facade import StatusTable
from platform_api.mpi.linkage import Pair

JSON = dict[str, Any]
MATCHES = "mpi_matches"
PAIR_NAMESPACE = uuid.UUID("5b0f6c1e-4f5a-4c1b-9a39-2f1d6c7e8a10")
MATCHER_NAME = "mpi-matcher"

TOPIC_LINKED = "platform.mpi.patients_linked"
TOPIC_UNLINKED = "platform.mpi.patients_unlinked"
TOPIC_CANDIDATE = "platform.mpi.candidate_found"
TOPIC_REVIEWED = "platform.mpi.candidate_reviewed"
TOPICS = {"linked": TOPIC_LINKED, "unlinked": TOPIC_UNLINKED, "candidate": TOPIC_CANDIDATE,
          "rejected": TOPIC_REVIEWED}
ACTIONS = {"linked": "link", "unlinked": "unlink", "rejected": "review"}

# The moves of a match decision (a refused one is 409 INVALID_TRANSITION).
STATUSES = StatusTable.of(candidate=("linked", "rejected"), linked=("unlinked",),
                          unlinked=("linked",), rejected=("linked",))
LINK_TYPES = ("replaced-by", "seealso")
DCM = "http://dicom.nema.org/resources/ontology/DCM"
USER_SYSTEM = "urn:healthplatform:user"


def now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


def pair_id(a: str, b: str) -> str:
    return str(uuid.uuid5(PAIR_NAMESPACE, "|".join(sorted((a, b)))))


@dataclass(frozen=True)
class Decider:
    """Who decides: a person (their user id) or the matcher itself."""

    user_id: str | None
    email: str | None = None

    @property
    def name(self) -> str:
        return self.user_id or MATCHER_NAME


MATCHER = Decider(None)


def by_person(decision: JSON) -> bool:
    return decision.get("decided_by") not in (None, MATCHER_NAME)


def binds_together(decision: JSON) -> bool:
    """Whether a person linked (merged) the pair: it stays in one cluster."""
    return (decision["status"] == "linked" and decision.get("link_type") == "replaced-by"
            and by_person(decision))


def keeps_apart(decision: JSON) -> bool:
    """Whether a person rejected the pair or undid its link: never linked automatically."""
    return decision["status"] == "rejected" or (decision["status"] == "unlinked"
                                                and by_person(decision))


def scores(pair: Pair | None) -> JSON:
    """The decision fields a judged pair fills."""
    if pair is None:
        return {}
    scored = pair.scored
    return {"score": round(scored.probability, 6), "weight": round(scored.weight, 3),
            "grade": pair.grade, "agreed": list(scored.agreed),
            "partial": list(scored.partial), "disagreed": list(scored.disagreed),
            "levels": dict(scored.levels), "names_swapped": scored.names_swapped,
            "hold": pair.hold}


def new_decision(golden: str, other: str, pair: Pair | None, status: str,
                 link_type: str | None, *, source: str, decider: Decider = MATCHER,
                 reason: str | None = None) -> JSON:
    stamp = now()
    decision: JSON = {
        "id": pair_id(golden, other), "patient_ids": sorted((golden, other)),
        "golden_id": golden, "other_id": other, "status": status,
        "link_type": link_type, "source": source, "reason": reason,
        "score": None, "weight": None, "grade": None, "agreed": [], "partial": [],
        "disagreed": [], "levels": {}, "names_swapped": False, "hold": None,
        "via": None, "restore": None, "decided_by": None, "decided_at": None,
        "created_at": stamp, "updated_at": stamp,
        "history": [{"status": status, "by": decider.name, "at": stamp, "reason": reason}],
    }
    decision.update(scores(pair))
    if status != "candidate":
        decision.update(decided_by=decider.name, decided_at=stamp)
    return decision


def moved(decision: JSON, status: str, decider: Decider, reason: str | None, *,
          check: bool = True, **changes: Any) -> JSON:
    """The decision moved to ``status`` (a refused move is 409 INVALID_TRANSITION)."""
    if check:
        STATUSES.check(decision["status"], status)
    stamp = now()
    return {**decision, **changes, "status": status, "decided_by": decider.name,
            "decided_at": stamp, "updated_at": stamp, "reason": reason,
            "history": [*decision.get("history", []),
                        {"status": status, "by": decider.name, "at": stamp,
                         "reason": reason}]}


def event_payload(record: JSON) -> JSON:
    return {key: record.get(key) for key in ("id", "patient_ids", "golden_id", "other_id",
                                             "status", "link_type", "score", "grade",
                                             "source", "decided_by", "hold")}


def audit_event(record: JSON, action: str, decider: Decider, site: str) -> JSON:
    """The AuditEvent of a link, unlink or review: DCM 110110 Patient Record, both
    Patients as entities, the decider as agent (the matcher itself when automatic)."""
    who: JSON = ({"identifier": {"system": USER_SYSTEM, "value": decider.user_id}}
                 if decider.user_id else {"display": "MPI matcher"})
    if decider.email:
        who["display"] = decider.email
    return {
        "resourceType": "AuditEvent",
        "type": {"system": DCM, "code": "110110", "display": "Patient Record"},
        "subtype": [{"system": "urn:healthplatform:mpi", "code": action,
                     "display": f"MPI {action}"}],
        "action": "U" if action != "review" else "E",
        "recorded": now(),
        "outcome": "0",
        "outcomeDesc": f"MPI {action}: {record['status']} ({record.get('link_type') or '-'})"
                       f" score {record.get('score')}",
        "agent": [{"type": {"coding": [{
            "system": "http://terminology.hl7.org/CodeSystem/extra-security-role-type",
            "code": "humanuser" if decider.user_id else "dataprocessor"}]},
            "who": who, "requestor": True}],
        "source": {"site": site, "observer": {"display": f"{site} master patient index"}},
        "entity": [{"what": {"reference": f"Patient/{pid}"},
                    "type": {"system": "http://terminology.hl7.org/CodeSystem/audit-entity-type",
                             "code": "1", "display": "Person"},
                    "role": {"system": "http://terminology.hl7.org/CodeSystem/object-role",
                             "code": "1", "display": "Patient"}}
                   for pid in record["patient_ids"]],
    }
