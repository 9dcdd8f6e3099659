"""The master patient index at run time: the index of every Patient, the matches it finds,
and the links it writes.

**Index.** :class:`Mpi` keeps a :class:`~platform_api.mpi.matching.PatientIndex` of the
store's Patients in memory. It catches up with the store before each use (``sync``: one
search for the Patients changed since it last looked, ``_lastUpdated`` ascending), so a
process sees what another wrote; a deleted or vanished Patient leaves it when a lookup
meets it.

**Background comparison.** Every new or changed Patient (whatever wrote it: /api, /fhir,
HL7v2) comes as ``platform.fhir.resource_created`` / ``_updated`` on the bus; the
consumer ``mpi_compare`` matches it against the index: a pair at or above
``mpi_link_threshold`` is linked at once,
one between ``mpi_review_threshold`` and that becomes a candidate for review. The record
created first is the golden record (an event may be handled after a later duplicate was
stored). A pair that
has a decision (candidate, linked, rejected, unlinked) is never proposed again.

**Match decisions** are documents (``mpi_matches``, one per pair of Patients, its id
derived from the pair): the two ids, score, grade, the fields that agreed and disagreed,
status (candidate → linked | rejected; linked → unlinked; unlinked → linked), the link
type, the golden record, who decided and when, and their history. **Links are FHIR**:
``replaced-by`` on the record merged away and ``replaces`` on the golden record, or
``seealso`` both ways. Every link, unlink and review writes both Patients, the decision,
an AuditEvent (DCM 110110 Patient Record) and an event in one unit of work.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from fhir_server.access import SYSTEM
from fhir_server.caller import CallerFhir
from fhir_server.store import ConditionChanged, DuplicateDocument, VersionConflict
from platform_api.envelope import ApiError, conflict, not_found
from platform_api.facade import StatusTable
from platform_api.mpi.demographics import Demographics, demographics
from platform_api.mpi.matching import Model, PatientIndex, Scored
from platform_api.services import Services

log = logging.getLogger("healthplatform.mpi")
JSON = dict[str, Any]
MATCHES = "mpi_matches"
EXTRAS_KEY = "mpi"
CONSUMER = "mpi_compare"
PAIR_NAMESPACE = uuid.UUID("5b0f6c1e-4f5a-4c1b-9a39-2f1d6c7e8a10")
SERVICE = "mpi"

TOPIC_LINKED = "platform.mpi.patients_linked"
TOPIC_UNLINKED = "platform.mpi.patients_unlinked"
TOPIC_CANDIDATE = "platform.mpi.candidate_found"
TOPIC_REVIEWED = "platform.mpi.candidate_reviewed"

# The moves of a match decision (a refused one is 409 INVALID_TRANSITION).
STATUSES = StatusTable.of(candidate=("linked", "rejected"), linked=("unlinked",),
                          unlinked=("linked",), rejected=("linked",))
LINK_TYPES = ("replaced-by", "seealso")
OTHER_SIDE = {"replaced-by": "replaces", "seealso": "seealso"}
DCM = "http://dicom.nema.org/resources/ontology/DCM"
USER_SYSTEM = "urn:healthplatform:user"


def now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


def pair_id(a: str, b: str) -> str:
    return str(uuid.uuid5(PAIR_NAMESPACE, "|".join(sorted((a, b)))))


def linked_ids(patient: JSON) -> dict[str, str]:
    """The Patients this one links to, with the link type."""
    found = {}
    for link in patient.get("link") or []:
        reference = str((link.get("other") or {}).get("reference") or "")
        if reference.startswith("Patient/"):
            found[reference.removeprefix("Patient/")] = str(link.get("type"))
    return found


def is_replaced(patient: JSON) -> bool:
    return "replaced-by" in linked_ids(patient).values()


@dataclass(frozen=True)
class Decider:
    """Who decides: a person (their user id) or the matcher itself."""

    user_id: str | None
    email: str | None = None

    @property
    def name(self) -> str:
        return self.user_id or "mpi-matcher"


MATCHER = Decider(None)


class Mpi:
    def __init__(self, services: Services):
        self.services = services
        settings = services.settings
        self.settings = settings
        self.model = Model.from_table(settings.mpi_model, settings.mpi_prior)
        self.index = PatientIndex()
        self._synced: str | None = None
        self._seen_at_mark: set[str] = set()
        self._lock = asyncio.Lock()
        self.system = CallerFhir(services.fhir, SYSTEM)
        if not (settings.mpi_possible_threshold <= settings.mpi_review_threshold
                <= settings.mpi_link_threshold):
            raise ValueError("MPI thresholds: possible <= review <= link")

    # -- the index --------------------------------------------------------------------------
    def demographics(self, patient: JSON) -> Demographics:
        return demographics(patient, self.settings.mpi_national_id_systems,
                            self.settings.mpi_default_region)

    def file(self, patient: JSON) -> None:
        if patient.get("active") is False or is_replaced(patient):
            self.index.remove(str(patient["id"]))  # not a live candidate
        else:
            self.index.put(str(patient["id"]), self.demographics(patient))

    async def sync(self) -> None:
        """Catch up with the Patients written since the last look."""
        async with self._lock:
            while True:
                params = [("_sort", "_lastUpdated")]
                if self._synced:
                    params.append(("_lastUpdated", f"ge{self._synced}"))
                found = await self.system.search("Patient", params)
                fresh = [p for p in found if p["id"] not in self._seen_at_mark
                         or p["meta"]["lastUpdated"] != self._synced]
                for patient in fresh:
                    self.file(patient)
                if found:
                    mark = found[-1]["meta"]["lastUpdated"]
                    at_mark = {p["id"] for p in found if p["meta"]["lastUpdated"] == mark}
                    self._seen_at_mark = at_mark | (self._seen_at_mark
                                                    if mark == self._synced else set())
                    self._synced = mark
                if len(found) < 10_000 or not fresh:
                    return

    def grade(self, probability: float) -> str | None:
        s = self.settings
        if probability >= s.mpi_link_threshold:
            return "certain"
        if probability >= s.mpi_review_threshold:
            return "probable"
        if probability >= s.mpi_possible_threshold:
            return "possible"
        return None

    async def match(self, query: Demographics, *, limit: int = 20,
                    exclude: set[str] | None = None, threshold: float | None = None
                    ) -> list[Scored]:
        await self.sync()
        floor = self.settings.mpi_possible_threshold if threshold is None else threshold
        return self.index.match(self.model, query, threshold=floor, exclude=exclude or (),
                                limit=limit)

    # -- the background comparison --------------------------------------------------------------
    async def on_patient_event(self, event: JSON) -> None:
        payload = event.get("payload") or {}
        if payload.get("resourceType") != "Patient":
            return
        patient_id = str(payload.get("id"))
        if event.get("topic", "").endswith("resource_deleted"):
            self.index.remove(patient_id)
            return
        await self.compare(patient_id)

    async def compare(self, patient_id: str) -> None:
        """Link or propose what matches this Patient (see the module docstring)."""
        patient = await self.system.find_json("Patient", patient_id)
        if patient is None:
            self.index.remove(patient_id)
            return
        self.file(patient)
        if patient.get("active") is False or is_replaced(patient):
            return
        exclude = {patient_id, *linked_ids(patient)}
        found = await self.match(self.demographics(patient), exclude=exclude,
                                 threshold=self.settings.mpi_review_threshold, limit=10)
        for scored in found:
            if await self.services.store.get_document(
                    MATCHES, pair_id(patient_id, scored.id)) is not None:
                continue  # decided (or proposed) before: never again
            if await self.system.find_json("Patient", scored.id) is None:
                self.index.remove(scored.id)  # deleted through another process
                continue
            certain = scored.probability >= self.settings.mpi_link_threshold
            golden, other = await self.older_first(scored.id, patient_id)
            try:
                if certain and self.settings.mpi_auto_link:
                    await self.link(self.system, golden, other, "replaced-by",
                                    MATCHER, scored=scored, source="automatic")
                    if other == patient_id:
                        return  # merged away: no more candidates for it
                    continue
                await self.propose(golden, other, scored)
            except ApiError as refused:  # the other record changed meanwhile
                log.info("MPI left %s / %s: %s", patient_id, scored.id, refused.message)
            except DuplicateDocument:  # the other record's own comparison got there first
                continue

    async def older_first(self, a: str, b: str) -> tuple[str, str]:
        """The pair with the record created first (the golden record to be) first: events
        may be handled late, after a later duplicate was stored."""
        created = await self.services.store.created_instants("Patient", [a, b])
        return (b, a) if created.get(b, "~") < created.get(a, "~") else (a, b)

    async def propose(self, golden: str, other: str, scored: Scored) -> None:
        decision = self._decision(golden, other, scored, "candidate", None,
                                  source="automatic")
        unit = self.system.unit()
        async with unit:
            unit.insert_document(MATCHES, decision["id"], decision)
            unit.emit(TOPIC_CANDIDATE, _event_payload(decision), source_service=SERVICE)
            await unit.commit()

    def _decision(self, golden: str, other: str, scored: Scored | None, status: str,
                  link_type: str | None, *, source: str, decider: Decider = MATCHER,
                  reason: str | None = None) -> JSON:
        stamp = now()
        decision: JSON = {
            "id": pair_id(golden, other), "patient_ids": sorted((golden, other)),
            "golden_id": golden, "other_id": other, "status": status,
            "link_type": link_type, "source": source, "reason": reason,
            "score": None, "weight": None, "grade": None, "agreed": [], "disagreed": [],
            "levels": {}, "names_swapped": False, "decided_by": None, "decided_at": None,
            "created_at": stamp, "updated_at": stamp, "history": [],
        }
        if scored is not None:
            decision.update(score=round(scored.probability, 6),
                            weight=round(scored.weight, 3), grade=self.grade(scored.probability),
                            agreed=list(scored.agreed), disagreed=list(scored.disagreed),
                            levels=dict(scored.levels), names_swapped=scored.names_swapped)
        if status != "candidate":
            decision.update(decided_by=decider.name, decided_at=stamp)
        decision["history"] = [{"status": status, "by": decider.name, "at": stamp,
                                "reason": reason}]
        return decision

    async def score_pair(self, a: JSON, b: JSON) -> Scored:
        return self.model.score(str(b["id"]), self.demographics(a), self.demographics(b))

    # -- links ----------------------------------------------------------------------------
    async def link(self, caller: CallerFhir, golden_id: str, other_id: str, link_type: str,
                   decider: Decider, *, scored: Scored | None = None, source: str = "manual",
                   reason: str | None = None, decision: JSON | None = None) -> JSON:
        """Link two Patients (``replaced-by``: ``other`` is merged into ``golden``); the
        decision stored."""
        if golden_id == other_id:
            raise ApiError(422, "VALIDATION_ERROR", "A patient cannot be linked to itself",
                           field="other_patient_id")
        golden, other = await _patient(caller, golden_id), await _patient(caller, other_id)
        if other_id in linked_ids(golden) or golden_id in linked_ids(other):
            raise conflict("ALREADY_LINKED", "These patients are already linked")
        if link_type == "replaced-by" and is_replaced(golden):
            raise conflict("GOLDEN_RECORD_REPLACED", "The golden record has itself been "
                           "replaced: link to the record that replaced it")
        scored = scored or await self.score_pair(golden, other)
        stored = decision or await self.services.store.get_document(
            MATCHES, pair_id(golden_id, other_id))
        if stored is not None:
            record = self._moved(stored, "linked", decider, reason, golden_id=golden_id,
                                 other_id=other_id, link_type=link_type)
        else:
            record = self._decision(golden_id, other_id, scored, "linked", link_type,
                                    source=source, decider=decider, reason=reason)
        golden_links = [*(golden.get("link") or []),
                        {"other": {"reference": f"Patient/{other_id}"},
                         "type": OTHER_SIDE[link_type]}]
        other_links = [*(other.get("link") or []),
                       {"other": {"reference": f"Patient/{golden_id}"}, "type": link_type}]
        await self._write(caller, [(golden, golden_links), (other, other_links)], record,
                          TOPIC_LINKED, "link", decider, stored is None)
        return record

    async def unlink(self, caller: CallerFhir, decision: JSON, decider: Decider,
                     reason: str | None) -> JSON:
        STATUSES.check(decision["status"], "unlinked")
        golden = await _patient(caller, decision["golden_id"])
        other = await _patient(caller, decision["other_id"])
        record = self._moved(decision, "unlinked", decider, reason)
        await self._write(caller, [(golden, _without(golden, other["id"])),
                                   (other, _without(other, golden["id"]))],
                          record, TOPIC_UNLINKED, "unlink", decider, False)
        return record

    async def review(self, caller: CallerFhir, decision: JSON, accept: bool,
                     decider: Decider, reason: str | None, link_type: str) -> JSON:
        if decision["status"] != "candidate":
            raise conflict("NOT_A_CANDIDATE", f"This match is {decision['status']}, not a "
                           "candidate waiting for review")
        if accept:
            record = await self.link(caller, decision["golden_id"], decision["other_id"],
                                     link_type, decider, reason=reason, decision=decision)
        else:
            record = self._moved(decision, "rejected", decider, reason)
            await self._write(caller, [], record, TOPIC_REVIEWED, "review", decider, False)
            return record
        return record

    def _moved(self, decision: JSON, status: str, decider: Decider, reason: str | None,
               **changes: Any) -> JSON:
        STATUSES.check(decision["status"], status)
        stamp = now()
        return {**decision, **changes, "status": status, "decided_by": decider.name,
                "decided_at": stamp, "updated_at": stamp, "reason": reason,
                "history": [*decision.get("history", []),
                            {"status": status, "by": decider.name, "at": stamp,
                             "reason": reason}]}

    async def _write(self, caller: CallerFhir, patients: list[tuple[JSON, list[JSON]]],
                     record: JSON, topic: str, action: str, decider: Decider,
                     new: bool) -> None:
        unit = caller.unit()
        try:
            async with unit:
                for patient, links in patients:
                    changed = {k: v for k, v in patient.items() if k != "link"}
                    if links:
                        changed["link"] = links
                    await unit.update(changed, if_match=int(patient["meta"]["versionId"]))
                (unit.insert_document if new else unit.put_document)(
                    MATCHES, record["id"], record)
                await unit.create(audit_event(record, action, decider,
                                              self.settings.service_name))
                unit.emit(topic, _event_payload(record), source_service=SERVICE)
                await unit.commit()
        except (VersionConflict, ConditionChanged):
            raise conflict("PATIENT_CHANGED", "A patient changed while being linked; try "
                           "again") from None
        for patient, _ in patients:
            fresh = await self.system.find_json("Patient", str(patient["id"]))
            if fresh is not None:
                self.file(fresh)

    async def decision(self, match_id: str) -> JSON:
        found = await self.services.store.get_document(MATCHES, match_id)
        if found is None:
            raise not_found("Match")
        return found


def _without(patient: JSON, other_id: str) -> list[JSON]:
    return [link for link in patient.get("link") or []
            if (link.get("other") or {}).get("reference") != f"Patient/{other_id}"]


async def _patient(caller: CallerFhir, patient_id: str) -> JSON:
    patient = await caller.find_json("Patient", patient_id)
    if patient is None:
        raise not_found(f"Patient {patient_id}")
    return patient


def _event_payload(record: JSON) -> JSON:
    return {key: record[key] for key in ("id", "patient_ids", "golden_id", "other_id",
                                         "status", "link_type", "score", "grade", "source",
                                         "decided_by")}


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


def mpi_of(services: Services) -> Mpi:
    found = services.extras.get(EXTRAS_KEY)
    if found is None:
        found = services.extras[EXTRAS_KEY] = Mpi(services)
    return found  # type: ignore[no-any-return]


def start(services: Services) -> Mpi:
    """Subscribe the background comparison to the FHIR resource events (candidates are
    proposed even when ``mpi_auto_link`` is off)."""
    mpi = mpi_of(services)
    for topic in ("platform.fhir.resource_created", "platform.fhir.resource_updated",
                  "platform.fhir.resource_deleted"):
        services.bus.subscribe(topic, mpi.on_patient_event,
                               consumer=f"{CONSUMER}_{topic.rsplit('.', 1)[1]}")
    return mpi


__all__ = ["MATCHES", "Decider", "Mpi", "mpi_of", "pair_id", "start"]
