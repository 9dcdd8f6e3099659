"""The deterministic extractor: findings (vital signs, medications, allergies, problems,
follow-ups) in a transcript's text, each with the span of text that is its evidence.

Everything it knows is data (``data/extraction.json``): the vital signs with their LOINC
codes, UCUM units, patterns and plausible ranges; medications as RxNorm ingredients with
their local names (paracetamol, cotrimoxazole...); problems as SNOMED CT with ICD-10;
allergens; and the trigger terms of a NegEx-style context detector. For each mention it
decides, within its clause (cut at termination terms such as "but", "however"):

- **negated**: a pre-negation trigger ("no", "denies", "no history of"...) among the
  ``window`` words before it, or a post-negation trigger ("ruled out"...) after it, unless
  the trigger is part of a pseudo-trigger ("no increase", "gram negative");
- **uncertain**: "possible", "suspected", "rule out"... before or after it;
- **about someone else**: "mother", "family history"... before it (the finding is
  dropped: a relative's diabetes is not the patient's problem).

A medication named in a sentence about allergies ("allergic to amoxicillin") is an
allergen there, not a medication taken. :class:`Extractor` is the interface a model-based
extractor implements too.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any, Protocol

DATA = Path(__file__).parent / "data" / "extraction.json"
RXNORM = "http://www.nlm.nih.gov/research/umls/rxnorm"
SNOMED = "http://snomed.info/sct"
ICD10 = "http://hl7.org/fhir/sid/icd-10"
# A clause: up to . ! ? ; or a line break, but not the dot inside a number (37.5).
_CLAUSE = re.compile(r"(?:[^.!?;\n]|(?<=\d)\.(?=\d))+")
_WORD = re.compile(r"[\w'-]+")


@dataclass(frozen=True, slots=True)
class Evidence:
    start: int
    end: int
    text: str


@dataclass
class Finding:
    kind: str  # vital-sign | medication | allergy | problem | follow-up
    display: str
    evidence: Evidence
    codes: list[tuple[str, str, str]] = field(default_factory=list)  # system, code, display
    negated: bool = False
    uncertain: bool = False
    details: dict[str, Any] = field(default_factory=dict)


class Extractor(Protocol):
    """An engine that finds what a text says (the rules here, or a model:
    :mod:`.model_extractor`)."""

    name: str
    version: str

    async def propose(self, text: str) -> list[Finding]: ...


@cache
def knowledge() -> dict[str, Any]:
    return json.loads(DATA.read_text(encoding="utf-8"))  # type: ignore[no-any-return]


def _phrase(terms: list[str]) -> re.Pattern[str]:
    ordered = sorted({t.lower() for t in terms}, key=len, reverse=True)
    return re.compile(r"\b(?:" + "|".join(re.escape(t) for t in ordered) + r")\b", re.I)


@dataclass(frozen=True)
class Clause:
    start: int
    text: str


def clauses(text: str) -> Iterator[Clause]:
    for found in _CLAUSE.finditer(text):
        yield Clause(found.start(), found.group(0))


class ContextRules:
    """The NegEx-style checks of the module docstring, over one clause."""

    def __init__(self, rules: dict[str, Any]):
        self.window = int(rules["window"])
        self.pre, self.post = _phrase(rules["pre"]), _phrase(rules["post"])
        self.pseudo, self.uncertain = _phrase(rules["pseudo"]), _phrase(rules["uncertain"])
        self.other = _phrase(rules["other_experiencer"])
        self.termination = _phrase(rules["termination"])

    def _before(self, clause: Clause, start: int) -> str:
        before = clause.text[:start - clause.start]
        cut = list(self.termination.finditer(before))
        if cut:
            before = before[cut[-1].end():]
        words = _WORD.findall(before)
        return " ".join(words[-self.window:])

    def _after(self, clause: Clause, end: int) -> str:
        after = clause.text[end - clause.start:]
        cut = self.termination.search(after)
        if cut:
            after = after[:cut.start()]
        return " ".join(_WORD.findall(after)[:self.window])

    def _triggered(self, pattern: re.Pattern[str], window: str) -> bool:
        cleaned = self.pseudo.sub(" ", window)
        return pattern.search(cleaned) is not None

    def negated(self, clause: Clause, start: int, end: int) -> bool:
        return self._triggered(self.pre, self._before(clause, start)) or \
            self._triggered(self.post, self._after(clause, end))

    def uncertain_at(self, clause: Clause, start: int, end: int) -> bool:
        return self._triggered(self.uncertain, self._before(clause, start)) or \
            self._triggered(self.uncertain, self._after(clause, end))

    def someone_else(self, clause: Clause, start: int) -> bool:
        return self.other.search(clause.text[:start - clause.start]) is not None


@dataclass(frozen=True)
class _Term:
    pattern: re.Pattern[str]
    entry: dict[str, Any]


def _terms(entries: list[dict[str, Any]], names: tuple[str, ...]) -> list[_Term]:
    found = []
    for entry in entries:
        words = [entry[n] for n in names if n in entry] + list(entry.get("synonyms", []))
        found.append(_Term(_phrase(words), entry))
    return found


class RuleExtractor:
    """The default extractor (module docstring)."""

    name = "rules"
    version = "1"

    def __init__(self, data: dict[str, Any] | None = None):
        data = data or knowledge()
        self.data = data
        self.context = ContextRules(data["negation"])
        self.vitals = [(re.compile(v["pattern"], re.I), v) for v in data["vitals"]]
        self.medications = _terms(data["medications"], ("name",))
        self.problems = _terms(data["problems"], ())
        self.allergens = _terms(data["allergens"], ())
        self.allergy_cue = _phrase(data["allergy_cues"])
        self.no_known = [(re.compile(n["pattern"], re.I), n) for n in data["no_known_allergy"]]
        follow = data["follow_up"]
        self.follow_up = re.compile(follow["pattern"], re.I)
        self.numbers, self.days = follow["numbers"], follow["days"]

    async def propose(self, text: str) -> list[Finding]:
        # patterns over a long transcript take milliseconds: off the event loop
        return await asyncio.to_thread(self.extract, text)

    def extract(self, text: str) -> list[Finding]:
        findings = [*self._vitals(text)]
        for clause in clauses(text):
            findings += self._in_clause(text, clause)
        return sorted(findings, key=lambda f: (f.evidence.start, f.kind))

    # -- vital signs ------------------------------------------------------------------------
    def _vitals(self, text: str) -> Iterator[Finding]:
        for pattern, vital in self.vitals:
            for found in pattern.finditer(text):
                values = [float(v) for v in found.groups() if v is not None]
                parts = vital.get("components") or [vital]
                if len(values) != len(parts) or not all(
                        p["low"] <= v <= p["high"] for p, v in zip(parts, values, strict=True)):
                    continue
                measured = [{"loinc": p["loinc"], "display": p["display"], "value": v,
                             "unit": p["unit"], "unit_display": p.get("unit_display",
                                                                      p["unit"])}
                            for p, v in zip(parts, values, strict=True)]
                codes = [("http://loinc.org", vital["loinc"], vital["display"])]
                if vital.get("also"):
                    codes.append(("http://loinc.org", vital["also"]["loinc"],
                                  vital["also"]["display"]))
                yield Finding("vital-sign", vital["name"], _evidence(text, found.span()),
                              codes, details={"components" if len(parts) > 1 else "value":
                                              measured if len(parts) > 1 else measured[0]})

    # -- mentions in a clause --------------------------------------------------------------------
    def _in_clause(self, text: str, clause: Clause) -> list[Finding]:
        found: list[Finding] = []
        about_allergy = self.allergy_cue.search(clause.text) is not None
        no_known = False
        for pattern, entry in self.no_known:
            if (match := pattern.search(clause.text)) is not None:
                no_known = True
                found.append(Finding("allergy", entry["display"], _evidence(
                    text, _shift(match.span(), clause.start)),
                    [(SNOMED, entry["code"], entry["display"])],
                    details={"no_known": True,
                             "category": entry.get("category", "medication")}))
                break
        if about_allergy and not no_known:
            found += self._allergies(text, clause)
        if not about_allergy:
            found += self._mentions(text, clause, self.medications, "medication")
        found += self._mentions(text, clause, self.problems, "problem",
                                skip_other_people=True)
        follow = self.follow_up.search(clause.text)
        if follow is not None:
            count = follow.group(1).lower()
            number = int(count) if count.isdigit() else self.numbers.get(count, 1)
            found.append(Finding("follow-up", clause.text.strip(), _evidence(
                text, (clause.start + len(clause.text) - len(clause.text.lstrip()),
                       clause.start + len(clause.text.rstrip()))),
                details={"due_in_days": number * self.days[follow.group(2).lower()]}))
        return found

    def _allergies(self, text: str, clause: Clause) -> list[Finding]:
        found = []
        for term in [*self.allergens, *self.medications]:
            for match in term.pattern.finditer(clause.text):
                start, end = _shift(match.span(), clause.start)
                entry = term.entry
                if "rxcui" in entry:
                    code, category = (RXNORM, entry["rxcui"], entry["name"]), "medication"
                else:
                    code, category = (entry["system"], entry["code"], entry["name"]), \
                        entry["category"]
                found.append(Finding("allergy", entry["name"], _evidence(text, (start, end)),
                                     [code], negated=self.context.negated(clause, start, end),
                                     details={"category": category}))
        return _without_overlaps(found)

    def _mentions(self, text: str, clause: Clause, terms: list[_Term], kind: str, *,
                  skip_other_people: bool = False) -> list[Finding]:
        found = []
        for term in terms:
            for match in term.pattern.finditer(clause.text):
                start, end = _shift(match.span(), clause.start)
                if skip_other_people and self.context.someone_else(clause, start):
                    continue
                entry = term.entry
                if kind == "medication":
                    codes = [(RXNORM, entry["rxcui"], entry["name"])]
                    details = {"dosage": _dosage(clause.text[end - clause.start:])}
                else:
                    codes = [(SNOMED, entry["snomed"], entry["name"]),
                             (ICD10, entry["icd10"], entry["name"])]
                    details = {}
                found.append(Finding(
                    kind, entry.get("name", ""), _evidence(text, (start, end)), codes,
                    negated=self.context.negated(clause, start, end),
                    uncertain=self.context.uncertain_at(clause, start, end), details=details))
        return _without_overlaps(found)


_DOSE = re.compile(r"^\s*((?:\d+(?:\.\d+)?\s*(?:mg|g|mcg|micrograms?|ml|units?|iu|tablets?|"
                   r"puffs?)\b)?[^,]{0,60})", re.I)


_NEXT_ITEM = re.compile(r"\b(?:and|with|plus|but|then)\b", re.I)


def _dosage(after: str) -> str | None:
    """The dose and frequency said right after a medication, up to the next item."""
    match = _DOSE.match(_NEXT_ITEM.split(after, maxsplit=1)[0])
    text = match.group(1).strip() if match else ""
    return text or None


def _shift(span: tuple[int, int], offset: int) -> tuple[int, int]:
    return span[0] + offset, span[1] + offset


def _evidence(text: str, span: tuple[int, int]) -> Evidence:
    return Evidence(span[0], span[1], text[span[0]:span[1]])


def _without_overlaps(findings: list[Finding]) -> list[Finding]:
    """Longest mention wins where two overlap ("type 2 diabetes" over "diabetes")."""
    kept: list[Finding] = []
    for finding in sorted(findings, key=lambda f: f.evidence.start - f.evidence.end):
        if not any(f.evidence.start < finding.evidence.end and
                   finding.evidence.start < f.evidence.end for f in kept):
            kept.append(finding)
    return kept


__all__ = ["Evidence", "Extractor", "Finding", "RuleExtractor", "knowledge"]
