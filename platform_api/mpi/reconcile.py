"""What re-formed clusters change: the Patients' links and ``active`` flags, and the match
decisions (computed here, written by :mod:`.service` in one unit of work).

**Links are FHIR**, one star per cluster: each record merged away carries ``replaced-by``
its cluster's golden record and ``active: false`` (as an HL7 A40 merge leaves it); the
golden record carries ``replaces`` each of them. The index manages only these two link
types between records it holds: ``seealso`` and links to anything else stay as written.
No other resource is touched: a record merged away keeps its references, owners and
everything it said, so a link never moves data into another person's record and never
changes who may read it.

**Decisions**: each record merged away has a ``linked`` decision with its golden record
(``via`` names the pair it joined by when the two do not match directly;
``restore`` keeps its ``active`` from before). When a cluster is re-formed (its golden
record changed, a member no longer matches, a person undid a link or rejected a pair)
the matcher's decisions that no longer describe it become ``unlinked`` by the matcher,
and every record that is no longer merged away gets its links removed and its
``active`` back as it was: undoing a link restores both records. Pairs to review
become ``candidate`` decisions (a pair decided before is never proposed again).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from platform_api.mpi.decisions import (
    MATCHER,
    Decider,
    by_person,
    moved,
    new_decision,
    pair_id,
    scores,
)
from platform_api.mpi.linkage import Constraints, Linker, Plan

JSON = dict[str, Any]
MANAGED = ("replaced-by", "replaces")


def linked_ids(patient: JSON) -> dict[str, str]:
    """The Patients this one links to, with the link type."""
    found = {}
    for link in patient.get("link") or []:
        if not isinstance(link, dict):
            continue
        reference = str((link.get("other") or {}).get("reference") or "")
        if reference.startswith("Patient/"):
            found[reference.removeprefix("Patient/")] = str(link.get("type"))
    return found


def managed_links(patient: JSON) -> dict[str, str]:
    return {o: t for o, t in linked_ids(patient).items() if t in MANAGED}


def replaced_by(patient: JSON) -> str | None:
    return next((o for o, t in linked_ids(patient).items() if t == "replaced-by"), None)


@dataclass
class Changes:
    patients: dict[str, JSON] = field(default_factory=dict)  # id → the body to store
    decisions: dict[str, tuple[JSON, bool, Decider]] = field(default_factory=dict)
    # decision id → (document, new, who decided)

    def decide(self, doc: JSON, new: bool, decider: Decider) -> None:
        already = self.decisions.get(doc["id"])
        self.decisions[doc["id"]] = (doc, new or bool(already and already[1]), decider)


def constraints_of(decisions: Iterable[JSON], patients: Mapping[str, JSON]) -> Constraints:
    """People's decisions as constraints; a ``replaced-by`` link without a decision (a
    merge written outside the index, e.g. HL7 A40) binds like a person's link."""
    linked, apart, merged_away = set(), set(), set()
    known = set()
    for decision in decisions:
        pair = frozenset(decision["patient_ids"])
        known.add(pair)
        if decision["status"] == "linked" and decision.get("link_type") == "replaced-by" \
                and by_person(decision):
            linked.add(pair)
            merged_away.add(decision["other_id"])
        elif decision["status"] == "rejected" or (decision["status"] == "unlinked"
                                                  and by_person(decision)):
            apart.add(pair)
    for pid, patient in patients.items():
        target = replaced_by(patient)
        if target is not None and target in patients and frozenset((pid, target)) not in known:
            linked.add(frozenset((pid, target)))
            merged_away.add(pid)
    return Constraints(frozenset(linked), frozenset(apart), frozenset(merged_away))


def _restore_of(patient: JSON, decisions: Mapping[str, JSON]) -> JSON | None:
    """What a record merged away had before (from its current link's decision)."""
    golden = replaced_by(patient)
    if golden is None:
        return {"active": patient.get("active")}
    old = decisions.get(pair_id(golden, patient["id"]))
    return old.get("restore") if old else None


def plan_changes(plan: Plan, linker: Linker, patients: Mapping[str, JSON],
                 decisions: Mapping[str, JSON], created: Mapping[str, str], *,
                 decided: Iterable[JSON] = (), decider: Decider = MATCHER) -> Changes:
    """The writes that make ``patients`` and ``decisions`` (those of the pairs among
    them) say what ``plan`` says; ``decided``: a person's new decisions, written too."""
    changes = Changes()
    existing = dict(decisions)
    for doc in decided:
        changes.decide(doc, doc["id"] not in decisions, decider)
        existing[doc["id"]] = doc
    links: dict[str, dict[str, str]] = {pid: {} for pid in patients}
    active: dict[str, Any] = {}
    stars: set[str] = set()
    for cluster in plan.clusters:
        for member in sorted(cluster.members - {cluster.golden}):
            links[member][cluster.golden] = "replaced-by"
            links[cluster.golden][member] = "replaces"
            active[member] = False
            stars.add(pair_id(cluster.golden, member))
            _star_decision(changes, existing, plan, linker, cluster.golden, member,
                           patients[member])
    for pid, patient in patients.items():
        if pid not in active and replaced_by(patient) is not None:
            restore = _restore_of(patient, existing)
            if restore is not None:
                active[pid] = restore.get("active")
    _retire(changes, existing, stars, plan)
    _candidates(changes, existing, plan, created)
    for pid, patient in patients.items():
        body = _rewritten(patient, links[pid], active.get(pid, _KEEP))
        if body is not None:
            changes.patients[pid] = body
    return changes


_KEEP = object()


def _star_decision(changes: Changes, existing: dict[str, JSON], plan: Plan, linker: Linker,
                   golden: str, member: str, patient: JSON) -> None:
    doc_id = pair_id(golden, member)
    doc = existing.get(doc_id)
    pair = linker.pair(golden, member)
    joined = plan.joined_by.get(member)
    via = None if pair.automatic or joined is None else sorted(joined.ids)
    restore = _restore_of(patient, existing)
    roles = {"golden_id": golden, "other_id": member, "link_type": "replaced-by"}
    if doc is None:
        fresh = new_decision(golden, member, pair, "linked", "replaced-by",
                             source="automatic", reason="certain match" if via is None
                             else "in one cluster")
        fresh.update(via=via, restore=restore)
        changes.decide(fresh, True, MATCHER)
        existing[doc_id] = fresh
    elif doc["status"] == "linked":
        updated = {**doc, **roles, "restore": doc.get("restore") or restore}
        if updated != doc:
            changes.decide(updated, False, changes.decisions.get(doc_id, (doc, False,
                                                                          MATCHER))[2])
            existing[doc_id] = updated
    elif doc["status"] == "candidate" or (doc["status"] == "unlinked" and not by_person(doc)):
        relinked = {**moved(doc, "linked", MATCHER, "certain match" if via is None
                            else "in one cluster"), **roles, **scores(pair), "via": via,
                    "restore": restore, "source": "automatic"}
        changes.decide(relinked, False, MATCHER)
        existing[doc_id] = relinked


def _retire(changes: Changes, existing: dict[str, JSON], stars: set[str], plan: Plan) -> None:
    """The matcher's links that no longer describe a cluster become ``unlinked``."""
    where = {m: c.golden for c in plan.clusters for m in c.members}
    for doc_id, doc in list(existing.items()):
        if doc_id in stars or doc["status"] != "linked" or doc.get("link_type") != \
                "replaced-by" or by_person(doc):
            continue
        a, b = doc["patient_ids"]
        if a not in where or b not in where:
            continue
        reason = (f"cluster re-formed: both now linked to {where[a]}"
                  if where[a] == where[b] else "no longer matches")
        retired = moved(doc, "unlinked", MATCHER, reason)
        changes.decide(retired, False, MATCHER)
        existing[doc_id] = retired


def _candidates(changes: Changes, existing: dict[str, JSON], plan: Plan,
                created: Mapping[str, str]) -> None:
    for pair in plan.candidates:
        doc_id = pair_id(*pair.ids)
        if doc_id in existing:
            continue  # decided (or proposed) before: never again
        a, b = pair.ids
        golden, other = (b, a) if created.get(b, "~") < created.get(a, "~") else (a, b)
        proposal = new_decision(golden, other, pair, "candidate", None, source="automatic")
        changes.decide(proposal, True, MATCHER)
        existing[doc_id] = proposal


def _rewritten(patient: JSON, managed: Mapping[str, str], active: Any) -> JSON | None:
    """``patient`` with its managed links (and ``active``) as given, or None when that
    is what it says already."""
    kept = [link for link in patient.get("link") or [] if not (
        isinstance(link, dict) and linked_ids({"link": [link]}).get(
            str((link.get("other") or {}).get("reference", "")).removeprefix("Patient/"))
        in MANAGED)]
    wanted = kept + [{"other": {"reference": f"Patient/{other}"}, "type": kind}
                     for other, kind in sorted(managed.items())]
    body = dict(patient)
    if wanted:
        body["link"] = wanted
    else:
        body.pop("link", None)
    if active is not _KEEP:
        if active is None:
            body.pop("active", None)
        else:
            body["active"] = active
    if body.get("link") == patient.get("link") and body.get("active") == \
            patient.get("active") and ("active" in body) == ("active" in patient):
        return None
    return body
