"""The clinical knowledge base that answers ``POST /api/ai/diagnosis`` when no diagnosis
model is registered: WHO IMCI (children under 5) and IMAI (adolescents and adults)
danger signs and syndromes, as data in ``data/clinical_knowledge.json``.

The file declares its ``sources`` (citations), its ``findings`` (the names a caller may
post: signs as 1/0 or true/false, measurements in the stated unit) and its ``rules``:

    id, name, urgency (emergency | urgent | routine), action, source, section
    age_months  [from, to) the rule applies to (to null: no upper bound); absent: all ages
    all         conditions that must all hold
    any         conditions of which ``at_least`` (default 1) must hold
    unless      rules that, when they match, make this one redundant (the charts' "most
                severe classification first")

A condition is ``{finding, present: true}`` (a sign posted as non-zero) or
``{finding, op, value}`` (a measurement compared), with the ``text`` shown as evidence and
an optional ``age_months`` of its own (fast breathing thresholds differ by age). A finding
not posted is unknown, never taken as absent: a rule that needs it does not match, and the
findings the age group's rules use but were not posted are returned as ``missing``.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Mapping
from typing import Any, Literal

from pydantic import BaseModel

from platform_api.ai.common import data_file

JSON = dict[str, Any]
FILE = "clinical_knowledge.json"
OPS: dict[str, Callable[[float, float], bool]] = {
    ">=": operator.ge, ">": operator.gt, "<": operator.lt, "<=": operator.le}
URGENCY = {"emergency": 0, "urgent": 1, "routine": 2}


class Evidence(BaseModel):
    finding: str
    value: float
    criterion: str


class Source(BaseModel):
    key: str
    citation: str
    section: str
    url: str | None = None


class Suggestion(BaseModel):
    id: str
    name: str
    urgency: Literal["emergency", "urgent", "routine"]
    action: str
    evidence: list[Evidence]
    source: Source


def knowledge() -> JSON:
    return data_file(FILE)


def findings() -> dict[str, JSON]:
    return knowledge()["findings"]  # type: ignore[no-any-return]


def _in_ages(span: list[float | None] | None, age: float | None) -> bool | None:
    """Whether ``age`` is in ``span``; None when the span matters and the age is unknown."""
    if span is None:
        return True
    if age is None:
        return None
    low, high = span
    return (low is None or age >= low) and (high is None or age < high)


def _holds(condition: JSON, posted: Mapping[str, float], age: float | None
           ) -> Evidence | None:
    if not _in_ages(condition.get("age_months"), age):
        return None
    value = posted.get(condition["finding"])
    if value is None:
        return None
    matched = value != 0 if condition.get("present") else OPS[condition["op"]](
        value, condition["value"])
    return Evidence(finding=condition["finding"], value=value,
                    criterion=str(condition.get("text") or condition["finding"])
                    ) if matched else None


def _match(rule: JSON, posted: Mapping[str, float], age: float | None
           ) -> list[Evidence] | None:
    """The evidence when ``rule`` matches, else None."""
    if not _in_ages(rule.get("age_months"), age):
        return None
    evidence = []
    for condition in rule.get("all", []):
        found = _holds(condition, posted, age)
        if found is None:
            return None
        evidence.append(found)
    if rule.get("any"):
        hits = [e for c in rule["any"] if (e := _holds(c, posted, age)) is not None]
        if len(hits) < rule.get("at_least", 1):
            return None
        evidence.extend(hits)
    return evidence


def suggest(posted: Mapping[str, float], age_months: float | None
            ) -> tuple[list[Suggestion], list[str]]:
    """The classifications the findings meet, most urgent first (then the better
    supported), with their evidence and source; and the findings the rules of this age
    group use that were not posted."""
    base = knowledge()
    matched = {rule["id"]: (rule, evidence) for rule in base["rules"]
               if (evidence := _match(rule, posted, age_months)) is not None}
    kept = [(rule, evidence) for rule, evidence in matched.values()
            if not any(other in matched for other in rule.get("unless", []))]
    kept.sort(key=lambda pair: (URGENCY[pair[0]["urgency"]], -len(pair[1])))
    suggestions = [Suggestion(
        id=rule["id"], name=rule["name"], urgency=rule["urgency"], action=rule["action"],
        evidence=evidence, source=Source(key=rule["source"], section=rule["section"],
                                         **base["sources"][rule["source"]]))
        for rule, evidence in kept]
    used = dict.fromkeys(c["finding"] for rule in base["rules"]
                         if _in_ages(rule.get("age_months"), age_months) is not False
                         for c in [*rule.get("all", []), *rule.get("any", [])])
    return suggestions, [name for name in used if name not in posted]


__all__ = ["Evidence", "Source", "Suggestion", "findings", "knowledge", "suggest"]
