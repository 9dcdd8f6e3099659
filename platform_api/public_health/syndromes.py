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
the caller, with the conditions and observations brought by ``_revinclude``. What each
encounter, condition and observation says is read through the surveillance line lists,
ViewDefinitions shipped as data (``data/views/surveillance_*.json``, :mod:`.views`).
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import date
from functools import cache
from typing import Any

from platform_api.facade import ApiContext
from platform_api.public_health.knowledge import Sign, negations, signs, syndromes
from platform_api.public_health.reporting import owned_by, search_days
from platform_api.public_health.views import rows

JSON = dict[str, Any]
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


def _codes(findings: Findings, row: JSON) -> None:
    """What a row of the encounters' or conditions' line list says: texts and codes."""
    findings.texts += [str(text) for text in row["texts"] or () if text]
    findings.icd10.update(str(code).upper() for code in row["icd10"] or () if code)
    findings.snomed.update(str(code) for code in row["snomed"] or () if code)


def findings_from(encounter: JSON, conditions: list[JSON], observations: list[JSON]
                  ) -> Findings:
    """The findings of one encounter from the rows of the surveillance line lists
    (``data/views/surveillance_*.json``): its own, its conditions', its observations'."""
    found = Findings()
    if encounter["class"]:
        found.classes.add(str(encounter["class"]))
    _codes(found, encounter)
    for condition in conditions:
        _codes(found, condition)
    for observation in observations:
        if isinstance(observation["text"], str):
            found.texts.append(observation["text"])
        value = observation["value"]
        if isinstance(value, int | float) and not isinstance(value, bool):
            unit = str(observation["unit"] or observation["unit_text"] or "")
            found.vitals += [(str(code), float(value), unit)
                             for code in observation["loinc"] or () if code]
    return found


def findings_of(encounter: JSON, conditions: list[JSON], observations: list[JSON]
                ) -> Findings:
    """The findings of an encounter and its conditions and observations (resources)."""
    [row] = rows("surveillance_encounters", [encounter])
    return findings_from(row, rows("surveillance_conditions", conditions),
                         rows("surveillance_observations", observations))


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
    """The day an encounter counts on (a row of ``surveillance_encounters``): the day it
    began, else the day it was last updated."""
    start = encounter["start"] or encounter["last_updated"]
    try:
        return date.fromisoformat(str(start)[:10]) if start else None
    except ValueError:
        return None


def facility_of(encounter: JSON, asked: str | None = None) -> str | None:
    """The facility an encounter counts for: the one asked about when it owns the
    encounter, else its first owner, else its ``serviceProvider``."""
    owners = set(encounter["owners"] or ())
    if asked in owners:
        return asked
    return min(owners) if owners else encounter["service_provider"]


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
    see, per facility): one search as the caller, its resources turned into the rows of
    the surveillance line lists, the rows counted."""
    found = await search_days(ctx, "Encounter", "date", start, end, [
        ("_revinclude", "Condition:encounter"), ("_revinclude", "Observation:encounter"),
        ("_include", "Encounter:diagnosis"), *owned_by(facility)])
    unique = list({(r["resourceType"], r["id"]): r for r in found}.values())
    conditions = rows("surveillance_conditions", unique)
    by_id = {c["id"]: c for c in conditions}
    related: dict[str, dict[str, list[JSON]]] = defaultdict(
        lambda: {"conditions": [], "observations": []})
    for condition in conditions:
        if condition["encounter"]:
            related[condition["encounter"]]["conditions"].append(condition)
    for observation in rows("surveillance_observations", unique):
        if observation["encounter"]:
            related[observation["encounter"]]["observations"].append(observation)
    result = DailyCounts(start, end)
    for encounter in rows("surveillance_encounters", unique):
        day = day_of(encounter)
        counted = facility_of(encounter, facility) if day else None
        if day is None or counted is None or not start <= day <= end:
            continue
        result.facilities.add(counted)
        mine = related[encounter["id"]]
        linked = list(mine["conditions"])
        seen = {c["id"] for c in linked}
        linked += [by_id[d] for d in dict.fromkeys(encounter["diagnoses"] or ())
                   if d in by_id and d not in seen]
        findings = findings_from(encounter, linked, mine["observations"])
        for syndrome in syndromes_of(findings):
            series = result.counts.setdefault((counted, syndrome), [0] * result.days)
            series[(day - start).days] += 1
    return result
