"""A CodeSystem indexed for the terminology operations: its concepts by code, their
hierarchy, properties and designations.

The hierarchy comes from nested ``concept`` elements and from the ``parent`` /
``child`` / ``subsumedBy`` properties (v3 code systems use both). Filters are the R4
filter operators (``=``, ``is-a``, ``descendent-of``, ``is-not-a``, ``regex``, ``in``,
``not-in``, ``generalizes``, ``exists``) on ``concept``, ``code``, ``display`` or a
property the CodeSystem defines.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

FILTER_OPERATORS = ("=", "is-a", "descendent-of", "is-not-a", "regex", "in", "not-in",
                    "generalizes", "exists")
PARENT_PROPERTIES = ("parent", "subsumedBy")


class FilterError(ValueError):
    """A filter the code system cannot apply (unknown property or operator)."""


@dataclass(slots=True)
class Concept:
    code: str
    display: str | None
    definition: str | None
    designations: list[dict[str, Any]]
    properties: list[dict[str, Any]]
    parents: set[str] = field(default_factory=set)
    children: set[str] = field(default_factory=set)

    def property_values(self, name: str) -> list[Any]:
        return [_property_value(p) for p in self.properties if p.get("code") == name]

    @property
    def inactive(self) -> bool:
        for prop in self.properties:
            if prop.get("code") == "status" and prop.get("valueCode") in ("retired",
                                                                          "inactive"):
                return True
            if prop.get("code") == "inactive" and prop.get("valueBoolean") is True:
                return True
        return False

    @property
    def abstract(self) -> bool:
        return any(p.get("code") in ("notSelectable", "abstract")
                   and p.get("valueBoolean") is True for p in self.properties)


def _property_value(prop: dict[str, Any]) -> Any:
    for key, value in prop.items():
        if key.startswith("value"):
            return value
    return None


class CodeSystemIndex:
    """One CodeSystem (see the module docstring)."""

    def __init__(self, resource: dict[str, Any]):
        self.resource = resource
        self.url: str = str(resource.get("url", ""))
        self.version: str | None = resource.get("version")
        self.name: str = str(resource.get("name") or resource.get("title") or self.url)
        self.content: str = str(resource.get("content", "complete"))
        self.case_sensitive: bool = bool(resource.get("caseSensitive", True))
        self.supplements: str | None = resource.get("supplements")
        self.value_set: str | None = resource.get("valueSet")
        self.property_types = {p.get("code"): p.get("type")
                               for p in resource.get("property") or () if p.get("code")}
        self.concepts: dict[str, Concept] = {}
        self._folded: dict[str, str] | None = None
        self._add(resource.get("concept") or (), None)
        for concept in list(self.concepts.values()):
            for name in PARENT_PROPERTIES:
                for parent in concept.property_values(name):
                    if isinstance(parent, str) and parent in self.concepts:
                        concept.parents.add(parent)
                        self.concepts[parent].children.add(concept.code)
            for child in concept.property_values("child"):
                if isinstance(child, str) and child in self.concepts:
                    concept.children.add(child)
                    self.concepts[child].parents.add(concept.code)

    def _add(self, concepts: Iterable[dict[str, Any]], parent: str | None) -> None:
        for item in concepts:
            code = item.get("code")
            if not isinstance(code, str):
                continue
            concept = self.concepts.get(code)
            if concept is None:
                concept = self.concepts[code] = Concept(
                    code, item.get("display"), item.get("definition"),
                    list(item.get("designation") or ()), list(item.get("property") or ()))
            if parent is not None:
                concept.parents.add(parent)
                self.concepts[parent].children.add(code)
            self._add(item.get("concept") or (), code)

    @property
    def complete(self) -> bool:
        return self.content == "complete"

    def lookup(self, code: str) -> Concept | None:
        concept = self.concepts.get(code)
        if concept is None and not self.case_sensitive:
            if self._folded is None:
                self._folded = {c.lower(): c for c in self.concepts}
            real = self._folded.get(code.lower())
            concept = self.concepts.get(real) if real is not None else None
        return concept

    def ancestors(self, code: str) -> set[str]:
        return self._closure(code, lambda concept: concept.parents)

    def descendants(self, code: str) -> set[str]:
        return self._closure(code, lambda concept: concept.children)

    def _closure(self, code: str, next_of: Callable[[Concept], Iterable[str]]) -> set[str]:
        """Every code reached from ``code`` by ``next_of`` (parents or children)."""
        found: set[str] = set()
        pending = [code]
        while pending:
            concept = self.concepts.get(pending.pop())
            if concept is None:
                continue
            for other in next_of(concept):
                if other not in found:
                    found.add(other)
                    pending.append(other)
        return found

    def subsumes(self, code_a: str, code_b: str) -> str:
        """The $subsumes outcome of A and B: equivalent | subsumes | subsumed-by |
        not-subsumed."""
        a, b = self.lookup(code_a), self.lookup(code_b)
        if a is None or b is None:
            raise KeyError(code_a if a is None else code_b)
        if a.code == b.code:
            return "equivalent"
        if a.code in self.ancestors(b.code):
            return "subsumes"
        if b.code in self.ancestors(a.code):
            return "subsumed-by"
        return "not-subsumed"

    def filter(self, prop: str, op: str, value: str) -> Iterator[Concept]:
        """The concepts that pass one compose filter."""
        if op not in FILTER_OPERATORS:
            raise FilterError(f"the filter operator '{op}' is not known")
        if prop == "concept" or (prop == "code" and op in ("is-a", "descendent-of",
                                                            "is-not-a", "generalizes")):
            yield from self._hierarchy_filter(op, value)
            return
        if op == "regex":
            pattern = re.compile(value)
            for concept in self.concepts.values():
                text = concept.code if prop == "code" else (
                    concept.display if prop == "display" else None)
                candidates = [text] if text is not None else concept.property_values(prop)
                if any(isinstance(v, str) and pattern.fullmatch(v) for v in candidates):
                    yield concept
            return
        if prop not in ("code", "display") and prop not in self.property_types \
                and prop not in PARENT_PROPERTIES and prop != "child":
            if not any(p.get("code") == prop for c in self.concepts.values()
                       for p in c.properties):
                raise FilterError(f"the code system {self.url} has no property '{prop}'")
        wanted = {v.strip() for v in value.split(",")} if op in ("in", "not-in") else {value}
        for concept in self.concepts.values():
            if prop == "code":
                values: list[Any] = [concept.code]
            elif prop == "display":
                values = [concept.display]
            else:
                values = concept.property_values(prop)
            texts = {_text(v) for v in values}
            if op == "exists":
                if (value == "true") == bool(values):
                    yield concept
            elif op in ("=", "in"):
                if texts & wanted:
                    yield concept
            elif op == "not-in" and not texts & wanted:
                yield concept

    def _hierarchy_filter(self, op: str, value: str) -> Iterator[Concept]:
        if op == "=":
            concept = self.lookup(value)
            if concept is not None:
                yield concept
            return
        if op in ("in", "not-in"):
            wanted = {v.strip() for v in value.split(",")}
            for concept in self.concepts.values():
                if (concept.code in wanted) == (op == "in"):
                    yield concept
            return
        if op == "regex":
            pattern = re.compile(value)
            yield from (c for c in self.concepts.values() if pattern.fullmatch(c.code))
            return
        root = self.lookup(value)
        below = self.descendants(root.code) if root is not None else set()
        if op == "is-a":
            codes = below | ({root.code} if root is not None else set())
        elif op == "descendent-of":
            codes = below
        elif op == "generalizes":
            codes = (self.ancestors(root.code) | {root.code}) if root is not None else set()
        elif op == "is-not-a":
            excluded = below | ({root.code} if root is not None else set())
            codes = set(self.concepts) - excluded
        else:
            raise FilterError(f"the operator '{op}' does not apply to the concept hierarchy")
        for code in codes:
            yield self.concepts[code]


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict):  # valueCoding
        return str(value.get("code"))
    return str(value)
