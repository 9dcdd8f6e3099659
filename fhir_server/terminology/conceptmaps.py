"""ConceptMap translation (``$translate``, R4 ConceptMap 4.10.x).

A code is looked up in the groups of the map whose ``source`` system matches (all groups
when no system is given) and, when asked, whose ``target`` system matches; each
``element`` with that code gives its ``target``s with their equivalence. An unmapped
code falls back to the group's ``unmapped`` rule (``provided``: the same code;
``fixed``: the code named). With ``reverse``, targets are searched for the code instead
and their sources answered.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# Equivalences that mean "no match" (R4 ConceptMapEquivalence).
NOT_MATCHES = frozenset({"unmatched", "disjoint"})


@dataclass(frozen=True, slots=True)
class Match:
    equivalence: str
    system: str | None
    code: str | None
    display: str | None
    source: str  # the ConceptMap's url
    comment: str | None = None


def translate(concept_map: dict[str, Any], system: str | None, code: str,
              target_system: str | None = None, *, reverse: bool = False) -> list[Match]:
    url = str(concept_map.get("url", ""))
    matches: list[Match] = []
    for group in concept_map.get("group") or ():
        source_system, target = group.get("source"), group.get("target")
        if reverse:
            source_system, target = target, source_system
        if system is not None and source_system not in (None, system):
            continue
        if target_system is not None and target not in (None, target_system):
            continue
        found = False
        for element in group.get("element") or ():
            if reverse:
                for item in element.get("target") or ():
                    if item.get("code") == code:
                        found = True
                        matches.append(Match(_reverse(item.get("equivalence", "equivalent")),
                                             target, element.get("code"),
                                             element.get("display"), url,
                                             item.get("comment")))
                continue
            if element.get("code") != code:
                continue
            found = True
            for item in element.get("target") or ():
                matches.append(Match(item.get("equivalence", "equivalent"), target,
                                     item.get("code"), item.get("display"), url,
                                     item.get("comment")))
        if not found and not reverse:
            matches += _unmapped(group.get("unmapped") or {}, target, code, url)
    return matches


def _unmapped(rule: dict[str, Any], target: str | None, code: str, url: str) -> list[Match]:
    mode = rule.get("mode")
    if mode == "provided":
        return [Match("equal", target, code, None, url)]
    if mode == "fixed" and rule.get("code"):
        return [Match("equivalent", target, rule["code"], rule.get("display"), url)]
    return []


def _reverse(equivalence: str) -> str:
    return {"wider": "narrower", "narrower": "wider", "subsumes": "specializes",
            "specializes": "subsumes"}.get(equivalence, equivalence)


def is_match(match: Match) -> bool:
    return match.equivalence not in NOT_MATCHES and match.code is not None
