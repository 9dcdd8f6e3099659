"""The master patient index at run time: the index of every Patient, the clusters it forms
and keeps, and the links people make and undo.

**Index.** :class:`Mpi` keeps a :class:`~platform_api.mpi.matching.PatientIndex` of every
Patient in the store (records merged away included: a new record is compared with every
record of a cluster, not only its golden one), with each one's owners (organizations)
and links. It catches up with the store before each use (``sync``: one search for the
Patients changed since it last looked, ``_lastUpdated`` ascending), so a process sees
what another wrote.

**Background comparison.** Every new, changed or deleted Patient (whatever wrote it:
/api, /fhir, HL7v2) comes as ``platform.fhir.resource_*`` on the bus; the consumers
``mpi_compare_*`` *reconcile* its neighbourhood: the records reached from it through
certain pairs and existing links (:meth:`~platform_api.mpi.linkage.Linker.neighbourhood`)
are clustered afresh (:meth:`~platform_api.mpi.linkage.Linker.cluster`, with people's
decisions as constraints), and :func:`~platform_api.mpi.reconcile.plan_changes` says what
to write: links of records that joined, left or changed golden record, decisions, and
candidates for review. As clustering does not depend on the order records arrive in, a
population gives the same clusters however it was loaded. Automatic links stay within
one organization unless ``mpi_auto_link_across_organizations``: across organizations a
certain pair is a candidate for review.

**People's decisions** (link by hand, accept or reject a candidate, undo a link) are
written with the reconciliation they cause, in one unit of work: both Patients (or the
whole cluster's), the decisions, an AuditEvent (DCM 110110 Patient Record) and an event
each. ``seealso`` links (both records stay in use) are pairs only, outside clusters.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from dataclasses import replace
from typing import Any

from fhir_server.caller import CallerFhir
from fhir_server.ownership import intrinsic_owners, owner_labels
from fhir_server.store import ConditionChanged, DuplicateDocument, VersionConflict
from platform_api.envelope import ApiError, conflict, not_found
from platform_api.mpi.decisions import (
    ACTIONS,
    MATCHER,
    MATCHES,
    STATUSES,
    TOPICS,
    Decider,
    audit_event,
    event_payload,
    moved,
    new_decision,
    pair_id,
    scores,
)
from platform_api.mpi.demographics import Demographics, demographics
from platform_api.mpi.linkage import Linker, Pair, Rules
from platform_api.mpi.matching import Model, PatientIndex
from platform_api.mpi.reconcile import (
    Changes,
    constraints_of,
    linked_ids,
    managed_links,
    plan_changes,
    replaced_by,
)
from platform_api.services import Services

log = logging.getLogger("healthplatform.mpi")
JSON = dict[str, Any]
EXTRAS_KEY = "mpi"
CONSUMER = "mpi_compare"
SERVICE = "mpi"
OTHER_SIDE = {"replaced-by": "replaces", "seealso": "seealso"}
ATTEMPTS = 3  # a reconciliation meeting a Patient changed meanwhile starts again
LARGE_NEIGHBOURHOOD = 60


class Mpi:
    def __init__(self, services: Services):
        self.services = services
        settings = services.settings
        self.settings = settings
        self.model = Model.from_table(settings.mpi_model, settings.mpi_prior)
        self.rules = Rules(settings.mpi_link_threshold, settings.mpi_review_threshold,
                           settings.mpi_possible_threshold,
                           settings.mpi_auto_link_across_organizations,
                           settings.mpi_auto_link)
        self.index = PatientIndex()
        self.links: dict[str, dict[str, str]] = {}  # Patient id → its managed links
        self._synced: str | None = None
        self._seen_at_mark: set[str] = set()
        self._sync_lock = asyncio.Lock()
        self._reconcile_lock = asyncio.Lock()
        self.system = services.policy.elevate(
            "patient index: read every Patient to match, and write the links it decides")
        if not (settings.mpi_possible_threshold <= settings.mpi_review_threshold
                <= settings.mpi_link_threshold):
            raise ValueError("MPI thresholds: possible <= review <= link")

    # -- the index --------------------------------------------------------------------------
    def demographics(self, patient: JSON) -> Demographics:
        return demographics(patient, self.settings.mpi_national_id_systems,
                            self.settings.mpi_default_region)

    def file(self, patient: JSON) -> None:
        pid = str(patient["id"])
        self.index.put(pid, self.demographics(patient),
                       owner_labels(patient) or intrinsic_owners(patient))
        self.links[pid] = managed_links(patient)

    def forget(self, patient_id: str) -> None:
        self.index.remove(patient_id)
        self.links.pop(patient_id, None)

    async def sync(self) -> None:
        """Catch up with the Patients written since the last look."""
        async with self._sync_lock:
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

    def linker(self) -> Linker:
        return Linker(self.index, self.model, self.rules)

    def golden_of(self, patient_id: str) -> str:
        """The record in use for ``patient_id``: its golden record when merged away."""
        seen = {patient_id}
        current = patient_id
        while True:
            nxt = next((o for o, t in self.links.get(current, {}).items()
                        if t == "replaced-by"), None)
            if nxt is None or nxt in seen:
                return current
            seen.add(nxt)
            current = nxt

    def cluster_of(self, patient_id: str) -> set[str]:
        golden = self.golden_of(patient_id)
        return {golden, *(o for o, t in self.links.get(golden, {}).items() if t == "replaces")}

    async def match(self, query: Demographics, *, limit: int = 20,
                    threshold: float | None = None) -> list[Pair]:
        """The records matching ``query``, best first; a record merged away answers as
        its golden record (with its own score), each record once."""
        await self.sync()
        floor = self.settings.mpi_possible_threshold if threshold is None else threshold
        found = self.linker().match(query, threshold=floor, limit=limit * 3)
        answered: dict[str, Pair] = {}
        for pair in found:
            golden = self.golden_of(pair.ids[1])
            if golden not in answered and golden in self.index:
                answered[golden] = replace(pair, ids=("", golden),
                                           scored=replace(pair.scored, id=golden))
        return list(answered.values())[:limit]

    # -- the background comparison --------------------------------------------------------------
    async def on_patient_event(self, event: JSON) -> None:
        payload = event.get("payload") or {}
        if payload.get("resourceType") != "Patient":
            return
        patient_id = str(payload.get("id"))
        if event.get("topic", "").endswith("resource_deleted"):
            await self.sync()
            cluster = self.cluster_of(patient_id) - {patient_id}
            self.forget(patient_id)
            if cluster:
                await self.reconcile(cluster)
            return
        await self.compare(patient_id)

    async def compare(self, patient_id: str) -> None:
        """Re-form the clusters around this Patient (see the module docstring)."""
        await self.sync()
        patient = await self.system.find_json("Patient", patient_id)
        if patient is None:
            cluster = self.cluster_of(patient_id) - {patient_id}
            self.forget(patient_id)
            if cluster:
                await self.reconcile(cluster)
            return
        self.file(patient)
        await self.reconcile({patient_id})

    async def reconcile(self, seeds: Iterable[str], *, caller: CallerFhir | None = None,
                        decided: Iterable[JSON] = (), decider: Decider = MATCHER
                        ) -> dict[str, JSON]:
        """Cluster the neighbourhood of ``seeds`` afresh and write what changed, with a
        person's ``decided`` decisions; the decisions written, by id."""
        seeds, decided = set(seeds), list(decided)
        for attempt in range(ATTEMPTS):
            await self.sync()
            async with self._reconcile_lock:
                changes = await self._changes(seeds, decided, decider)
                try:
                    await self._write(caller or self.system, changes)
                except (VersionConflict, ConditionChanged, DuplicateDocument):
                    if attempt + 1 == ATTEMPTS:
                        raise conflict("PATIENT_CHANGED", "A patient changed while being "
                                       "linked; try again") from None
                    continue
            return {i: doc for i, (doc, _, _) in changes.decisions.items()}
        return {}

    async def _changes(self, seeds: set[str], decided: list[JSON], decider: Decider
                       ) -> Changes:
        linker = self.linker()
        reached, pairs = linker.neighbourhood(
            seeds, lambda pid: list(self.links.get(pid, {})))
        if len(reached) > LARGE_NEIGHBOURHOOD:
            log.warning("MPI neighbourhood of %d records around %s", len(reached),
                        sorted(seeds)[:3])
        patients: dict[str, JSON] = {}
        for pid in sorted(reached):
            patient = await self.system.find_json("Patient", pid)
            if patient is None:
                self.forget(pid)
                continue
            patients[pid] = patient
        reached &= set(patients)
        reviewable = [p.ids for p in pairs if p.scored.probability >= self.rules.review_threshold]
        stored = await self._decisions(sorted(reached), reviewable)
        existing = {**stored, **{d["id"]: d for d in decided}}
        constraints = constraints_of(existing.values(), patients)
        ends = reached | {i for pair in reviewable for i in pair}
        created = await self.services.store.created_instants("Patient", sorted(ends))
        plan = linker.cluster(reached, pairs, constraints, created)
        return plan_changes(plan, linker, patients, stored, created, decided=decided,
                            decider=decider)

    async def _decisions(self, ids: list[str], more: Iterable[tuple[str, str]]
                         ) -> dict[str, JSON]:
        """The decisions of the pairs among ``ids``, and of the pairs ``more``."""
        wanted = {pair_id(a, b) for i, a in enumerate(ids) for b in ids[i + 1:]}
        wanted |= {pair_id(a, b) for a, b in more}
        found = {}
        for doc_id in sorted(wanted):
            doc = await self.services.store.get_document(MATCHES, doc_id)
            if doc is not None:
                found[doc_id] = doc
        return found

    async def _write(self, caller: CallerFhir, changes: Changes) -> None:
        if not changes.patients and not changes.decisions:
            return
        unit = caller.unit()
        async with unit:
            for patient in changes.patients.values():
                await unit.update(patient, if_match=int(patient["meta"]["versionId"]))
            for doc, new, decider in changes.decisions.values():
                (unit.insert_document if new else unit.put_document)(MATCHES, doc["id"], doc)
                action = ACTIONS.get(doc["status"])
                if action is not None:
                    await unit.create(audit_event(doc, action, decider,
                                                  self.settings.service_name))
                unit.emit(TOPICS[doc["status"]], event_payload(doc), source_service=SERVICE)
            await unit.commit()
        for pid in changes.patients:
            fresh = await self.system.find_json("Patient", pid)
            if fresh is not None:
                self.file(fresh)

    # -- people's decisions ------------------------------------------------------------------
    async def link(self, caller: CallerFhir, golden_id: str, other_id: str, link_type: str,
                   decider: Decider, *, reason: str | None = None,
                   decision: JSON | None = None) -> JSON:
        """Link two Patients by hand (``replaced-by``: ``other`` is merged into
        ``golden``'s cluster; ``seealso``: both stay in use); the decision stored."""
        if golden_id == other_id:
            raise ApiError(422, "VALIDATION_ERROR", "A patient cannot be linked to itself",
                           field="other_patient_id")
        golden, other = await _patient(caller, golden_id), await _patient(caller, other_id)
        await self.sync()
        if other_id in linked_ids(golden) or golden_id in linked_ids(other) or (
                link_type == "replaced-by" and other_id in self.cluster_of(golden_id)):
            raise conflict("ALREADY_LINKED", "These patients are already linked")
        if link_type == "replaced-by" and replaced_by(golden) is not None:
            raise conflict("GOLDEN_RECORD_REPLACED", "The golden record has itself been "
                           "replaced: link to the record that replaced it")
        pair = self.linker().pair(golden_id, other_id) if {golden_id, other_id} <= set(
            self.index.records) else None
        stored = decision or await self.services.store.get_document(
            MATCHES, pair_id(golden_id, other_id))
        if stored is not None:
            record = moved(stored, "linked", decider, reason, golden_id=golden_id,
                           other_id=other_id, link_type=link_type, source="manual")
        else:
            record = new_decision(golden_id, other_id, pair, "linked", link_type,
                                  source="manual", decider=decider, reason=reason)
        if link_type == "seealso":
            await self._pair_write(caller, [(golden, other_id, "seealso"),
                                            (other, golden_id, "seealso")], record,
                                   stored is None, decider)
            return record
        written = await self.reconcile({golden_id, other_id}, caller=caller,
                                       decided=[record], decider=decider)
        return written.get(record["id"], record)

    async def unlink(self, caller: CallerFhir, decision: JSON, decider: Decider,
                     reason: str | None) -> JSON:
        """Undo a link: the pair is kept apart from now on, its records' links are
        removed and what the link changed on them (``active``) put back."""
        STATUSES.check(decision["status"], "unlinked")
        golden = await _patient(caller, decision["golden_id"])
        other = await _patient(caller, decision["other_id"])
        record = moved(decision, "unlinked", decider, reason)
        if decision.get("link_type") == "seealso":
            await self._pair_write(caller, [(golden, other["id"], None),
                                            (other, golden["id"], None)], record, False,
                                   decider)
            return record
        written = await self.reconcile(set(decision["patient_ids"]), caller=caller,
                                       decided=[record], decider=decider)
        return written.get(record["id"], record)

    async def review(self, caller: CallerFhir, decision: JSON, accept: bool,
                     decider: Decider, reason: str | None, link_type: str) -> JSON:
        if decision["status"] != "candidate":
            raise conflict("NOT_A_CANDIDATE", f"This match is {decision['status']}, not a "
                           "candidate waiting for review")
        if accept:
            return await self.link(caller, decision["golden_id"], decision["other_id"],
                                   link_type, decider, reason=reason, decision=decision)
        for pid in decision["patient_ids"]:
            await _patient(caller, pid)
        record = moved(decision, "rejected", decider, reason)
        written = await self.reconcile(set(decision["patient_ids"]), caller=caller,
                                       decided=[record], decider=decider)
        return written.get(record["id"], record)

    async def _pair_write(self, caller: CallerFhir, sides: list[tuple[JSON, str, str | None]],
                          record: JSON, new: bool, decider: Decider) -> None:
        """A ``seealso`` link written or removed on both Patients, with its decision."""
        changes = Changes()
        for patient, other, kind in sides:
            links = [link for link in patient.get("link") or []
                     if (link.get("other") or {}).get("reference") != f"Patient/{other}"]
            if kind is not None:
                links.append({"other": {"reference": f"Patient/{other}"}, "type": kind})
            body = {k: v for k, v in patient.items() if k != "link"}
            if links:
                body["link"] = links
            changes.patients[str(patient["id"])] = body
        changes.decide(record, new, decider)
        try:
            await self._write(caller, changes)
        except (VersionConflict, ConditionChanged):
            raise conflict("PATIENT_CHANGED", "A patient changed while being linked; try "
                           "again") from None

    async def decision(self, match_id: str) -> JSON:
        found = await self.services.store.get_document(MATCHES, match_id)
        if found is None:
            raise not_found("Match")
        return found


async def _patient(caller: CallerFhir, patient_id: str) -> JSON:
    patient = await caller.find_json("Patient", patient_id)
    if patient is None:
        raise not_found(f"Patient {patient_id}")
    return patient


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


__all__ = ["MATCHES", "Decider", "Mpi", "mpi_of", "pair_id", "scores", "start"]
