"""Syndromes of encounters, from what the record says about each: the Encounter's
``reasonCode`` and class, the Conditions of the encounter (``Condition.encounter``, and
``Encounter.diagnosis``) and its Observations (vital signs).

A **sign** (``data/syndromes.json``) is present when a text (reason, diagnosis text or
display) holds one of its words and no negation comes before it in the same clause
("no fever", "denies cough"), when a diagnosis is coded with one of its ICD-10 codes (a
prefix: ``A09`` covers ``A09.0``) or SNOMED CT concepts, when a vital sign passes its
limit (temperature 38 °C or more, °F converted), or when the encounter's class is one it
names (inpatient for SARI). A **syndrome** is present when all its signs are.

:func:`daily_counts` counts, per facility (the encounter's owning organization) and
syndrome, the encounters of each day (the day the encounter began); one FHIR search as
the caller, with the conditions and observations brought by ``_revinclude``.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import date
from functools import cache
from typing import Any

from fhir_server.ownership import owner_labels
from platform_api.facade import ApiContext
from platform_api.public_health.knowledge import Sign, negations, signs, syndromes
from platform_api.public_health.reporting import owned_by, search_days
from platform_api.sessions.common import local_id

JSON = dict[str, Any]
ICD10_SYSTEMS = frozenset({"http://hl7.org/fhir/sid/icd-10", "http://hl7.org/fhir/sid/icd-10-cm"})
SNOMED = "http://snomed.info/sct"
LOINC = "http://loinc.org"
FAHRENHEIT = frozenset({"[degF]", "degF", "°F", "F"})
CLAUSE = re.compile(r"[.;,:!?\n]| but | however ")


@dataclass
class Findings:
    """What an encounter's record says, as the signs read it."""

    texts: list[str] = field(default_factory=list)
    icd10: set[str] = field(default_factory=set)
    snomed: set[str] = field(default_factory=set)
    vitals: list[tuple[str, float, str]] = field(default_factory=list)  # LOINC, value, unit
    classes: set[str] = field(default_factory=set)


def _concept(findings: Findings, concept: JSON | None) -> None:
    if not isinstance(concept, dict):
        return
    if concept.get("text"):
        findings.texts.append(str(concept["text"]))
    for c in concept.get("coding") or []:
        if c.get("display"):
            findings.texts.append(str(c["display"]))
        code = str(c.get("code") or "")
        if c.get("system") in ICD10_SYSTEMS and code:
            findings.icd10.add(code.upper())
        elif c.get("system") == SNOMED and code:
            findings.snomed.add(code)


def _vital(findings: Findings, code: JSON | None, quantity: JSON | None) -> None:
    value = (quantity or {}).get("value")
    if not isinstance(value, int | float):
        return
    unit = str((quantity or {}).get("code") or (quantity or {}).get("unit") or "")
    for c in (code or {}).get("coding") or []:
        if c.get("system") == LOINC and c.get("code"):
            findings.vitals.append((str(c["code"]), float(value), unit))


def findings_of(encounter: JSON, conditions: list[JSON], observations: list[JSON]
                ) -> Findings:
    found = Findings()
    klass = encounter.get("class") or {}
    if klass.get("code"):
        found.classes.add(str(klass["code"]))
    for reason in encounter.get("reasonCode") or []:
        _concept(found, reason)
    for condition in conditions:
        _concept(found, condition.get("code"))
        for evidence in condition.get("evidence") or []:
            for concept in evidence.get("code") or []:
                _concept(found, concept)
    for observation in observations:
        _vital(found, observation.get("code"), observation.get("valueQuantity"))
        for component in observation.get("component") or []:
            _vital(found, component.get("code"), component.get("valueQuantity"))
        if isinstance(observation.get("valueString"), str):
            found.texts.append(observation["valueString"])
    return found


@cache
def _pattern(word: str) -> re.Pattern[str]:
    return re.compile(r"\b" + re.escape(word))


def _negated(before: str) -> bool:
    clause = CLAUSE.split(before)[-1].split()
    recent = " ".join(clause[-4:])
    return any(re.search(r"\b" + re.escape(n) + r"\b", recent) for n in negations())


def mentions(text: str, words: tuple[str, ...]) -> bool:
    """Whether ``text`` affirms one of ``words`` (an occurrence not negated)."""
    lowered = text.lower()
    for word in words:
        for match in _pattern(word).finditer(lowered):
            if not _negated(lowered[:match.start()]):
                return True
    return False


def _celsius(value: float, unit: str) -> float:
    return (value - 32) * 5 / 9 if unit in FAHRENHEIT else value


def has_sign(sign: Sign, findings: Findings) -> bool:
    if sign.encounter_class & findings.classes:
        return True
    if any(mentions(t, sign.words) for t in findings.texts):
        return True
    if any(code.startswith(prefix) for code in findings.icd10 for prefix in sign.icd10):
        return True
    if sign.snomed & findings.snomed:
        return True
    for loinc, value, unit in findings.vitals:
        for vital in sign.vitals:
            if loinc in vital.loinc:
                measured = _celsius(value, unit) if vital.unit == "Cel" else value
                if vital.holds(measured):
                    return True
    return False


def syndromes_of(findings: Findings) -> list[str]:
    """The codes of the syndromes ``findings`` show."""
    present = {name for name, sign in signs().items() if has_sign(sign, findings)}
    return [code for code, s in syndromes().items() if set(s.signs) <= present]


# -- counting ---------------------------------------------------------------------------------
def day_of(encounter: JSON) -> date | None:
    start = ((encounter.get("period") or {}).get("start")
             or (encounter.get("meta") or {}).get("lastUpdated"))
    try:
        return date.fromisoformat(str(start)[:10]) if start else None
    except ValueError:
        return None


def facility_of(encounter: JSON, asked: str | None = None) -> str | None:
    """The facility an encounter counts for: the one asked about when it owns the
    encounter, else its first owner, else its ``serviceProvider``."""
    owners = owner_labels(encounter)
    if asked in owners:
        return asked
    return min(owners) if owners else local_id(encounter.get("serviceProvider"),
                                               "Organization")


@dataclass
class DailyCounts:
    """Encounters per (facility, syndrome) and day, from ``start`` to ``end``."""

    start: date
    end: date
    counts: dict[tuple[str, str], list[int]] = field(default_factory=dict)
    facilities: set[str] = field(default_factory=set)

    @property
    def days(self) -> int:
        return (self.end - self.start).days + 1

    def series(self, facility: str, syndrome: str) -> list[int]:
        return self.counts.get((facility, syndrome)) or [0] * self.days


async def daily_counts(ctx: ApiContext, start: date, end: date, facility: str | None
                       ) -> DailyCounts:
    """The counts of ``facility``'s encounters (None: of every encounter the caller may
    see, per facility)."""
    found = await search_days(ctx, "Encounter", "date", start, end, [
        ("_revinclude", "Condition:encounter"), ("_revinclude", "Observation:encounter"),
        ("_include", "Encounter:diagnosis"), *owned_by(facility)])
    by_id = {(r["resourceType"], r["id"]): r for r in found}
    related: dict[str, dict[str, list[JSON]]] = defaultdict(
        lambda: {"Condition": [], "Observation": []})
    for resource in found:
        if resource["resourceType"] in ("Condition", "Observation"):
            encounter_id = local_id(resource.get("encounter"), "Encounter")
            if encounter_id:
                related[encounter_id][resource["resourceType"]].append(resource)
    result = DailyCounts(start, end)
    for (kind, encounter_id), encounter in by_id.items():
        day = day_of(encounter) if kind == "Encounter" else None
        counted = facility_of(encounter, facility) if day else None
        if day is None or counted is None or not start <= day <= end:
            continue
        result.facilities.add(counted)
        conditions = list(related[encounter_id]["Condition"])
        seen = {c["id"] for c in conditions}
        for diagnosis in encounter.get("diagnosis") or []:
            condition_id = local_id(diagnosis.get("condition"), "Condition")
            linked = by_id.get(("Condition", condition_id or ""))
            if linked is not None and linked["id"] not in seen:
                conditions.append(linked)
        findings = findings_of(encounter, conditions, related[encounter_id]["Observation"])
        for syndrome in syndromes_of(findings):
            series = result.counts.setdefault((counted, syndrome), [0] * result.days)
            series[(day - start).days] += 1
    return result
