"""Value sets: expansion (``$expand``) and membership (``$validate-code``, bindings).

A ValueSet's ``compose`` is interpreted as R4 ValueSet 4.9.5 says: each ``include`` takes
the listed concepts of a system, or those passing all its filters, or the whole system,
intersected with the value sets it imports; ``exclude`` removes the same way. A
pre-computed ``expansion`` is used when there is no compose.

Content the server does not hold (SNOMED CT, LOINC...) cannot be enumerated: an include
of such a system is kept as "any code of that system" and membership there is unknown
(``None``), except for the systems defined by a grammar (:mod:`.grammars`), whose codes
are checked by syntax. An expansion that would need such content is refused
(:class:`ExpansionError`), as a terminology server does.

Members are computed once per value set and kept until the content changes (the
:class:`ValueSetEngine` lives as long as the content it reads).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

from fhir_server.terminology.codesystems import CodeSystemIndex, Concept, FilterError
from fhir_server.terminology.grammars import GRAMMAR_SYSTEMS, grammar_check

MAX_EXPANSION = 10_000  # codes: a bigger expansion is refused as too costly


class TerminologySource(Protocol):
    def code_system(self, url: str, version: str | None = None) -> CodeSystemIndex | None: ...
    def value_set(self, url: str, version: str | None = None) -> dict[str, Any] | None: ...


class ExpansionError(Exception):
    """A value set that cannot be expanded; ``code`` is the OperationOutcome IssueType."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code


@dataclass(frozen=True, slots=True)
class Entry:
    system: str
    code: str
    display: str | None = None
    version: str | None = None
    designations: tuple[dict[str, Any], ...] = ()
    abstract: bool = False
    inactive: bool = False

    def to_json(self, designations: bool = False) -> dict[str, Any]:
        item: dict[str, Any] = {"system": self.system, "code": self.code}
        if self.version:
            item["version"] = self.version
        if self.display is not None:
            item["display"] = self.display
        if self.abstract:
            item["abstract"] = True
        if self.inactive:
            item["inactive"] = True
        if designations and self.designations:
            item["designation"] = list(self.designations)
        return item


@dataclass(frozen=True, slots=True)
class Membership:
    result: bool | None  # None: cannot be told with the content the server holds
    message: str = ""
    display: str | None = None
    system: str | None = None


@dataclass(slots=True)
class Members:
    """What a value set holds: enumerated codes, and systems it takes whole or in part
    without the server being able to list them."""

    codes: dict[str, dict[str, Entry]] = field(default_factory=dict)
    open_systems: set[str] = field(default_factory=set)  # any code (unknown system)
    partial_systems: set[str] = field(default_factory=set)  # some codes, not listable
    notes: list[str] = field(default_factory=list)

    def add(self, entry: Entry) -> None:
        self.codes.setdefault(entry.system, {})[entry.code] = entry

    def entries(self) -> list[Entry]:
        return [entry for codes in self.codes.values() for entry in codes.values()]

    @property
    def enumerable(self) -> bool:
        return not self.open_systems and not self.partial_systems


def _canonical(url: str) -> tuple[str, str | None]:
    base, _, version = url.partition("|")
    return base, version or None


class ValueSetEngine:
    """Expansion and membership over a :class:`TerminologySource`."""

    def __init__(self, source: TerminologySource):
        self.source = source
        self._members: dict[tuple[str, str | None], Members] = {}

    # -- members ----------------------------------------------------------------------
    def members_of(self, value_set: dict[str, Any], _seen: frozenset[str] = frozenset()
                   ) -> Members:
        url = str(value_set.get("url") or "")
        key = (url, value_set.get("version"))
        if url and key in self._members:
            return self._members[key]
        if url in _seen:
            raise ExpansionError("processing", f"the value set {url} imports itself")
        members = self._compute(value_set, _seen | {url})
        if url:
            self._members[key] = members
        return members

    def members_by_url(self, canonical: str, _seen: frozenset[str] = frozenset()
                       ) -> Members | None:
        url, version = _canonical(canonical)
        value_set = self.source.value_set(url, version)
        return None if value_set is None else self.members_of(value_set, _seen)

    def _compute(self, value_set: dict[str, Any], seen: frozenset[str]) -> Members:
        compose = value_set.get("compose")
        members = Members()
        if not compose:
            for item in _flatten((value_set.get("expansion") or {}).get("contains") or ()):
                if item.get("system") and item.get("code"):
                    members.add(Entry(item["system"], item["code"], item.get("display"),
                                      item.get("version"),
                                      tuple(item.get("designation") or ()),
                                      bool(item.get("abstract")),
                                      bool(item.get("inactive"))))
            return members
        inactive = compose.get("inactive", True)
        for include in compose.get("include") or ():
            self._include(members, include, seen, inactive)
        for exclude in compose.get("exclude") or ():
            removed = Members()
            self._include(removed, exclude, seen, True)
            for system, codes in removed.codes.items():
                for code in codes:
                    members.codes.get(system, {}).pop(code, None)
        return members

    def _include(self, members: Members, include: dict[str, Any], seen: frozenset[str],
                 inactive: bool) -> None:
        system = include.get("system")
        imported: list[Members] = []
        for canonical in include.get("valueSet") or ():
            found = self.members_by_url(canonical, seen)
            if found is None:
                members.notes.append(f"the value set {canonical} is not known")
                if system is None:
                    return
                continue
            imported.append(found)
        if system is None:
            # only imports: the intersection of the imported value sets
            if not imported:
                return
            first, *others = imported
            for entry in first.entries():
                if all(o.codes.get(entry.system, {}).get(entry.code) for o in others):
                    members.add(entry)
            for other in imported:
                members.open_systems |= other.open_systems
                members.partial_systems |= other.partial_systems
            return
        system_url, system_version = _canonical(str(system))
        version = include.get("version") or system_version
        candidates = self._system_part(members, system_url, version, include)
        if candidates is None:
            return
        for entry in candidates:
            if not inactive and entry.inactive:
                continue
            if all(o.codes.get(entry.system, {}).get(entry.code) or
                   entry.system in o.open_systems for o in imported):
                members.add(entry)

    def _system_part(self, members: Members, system: str, version: str | None,
                     include: dict[str, Any]) -> list[Entry] | None:
        code_system = self.source.code_system(system, version)
        concepts = include.get("concept")
        filters = include.get("filter")
        if concepts:
            entries = []
            for item in concepts:
                code = item.get("code")
                if not isinstance(code, str):
                    continue
                known = code_system.lookup(code) if code_system is not None else None
                display = item.get("display") or (known.display if known else None)
                designations = tuple(item.get("designation") or ()) or \
                    (tuple(known.designations) if known else ())
                if code_system is not None and code_system.complete and known is None:
                    members.notes.append(f"the code {code} is not in {system}")
                    continue
                entries.append(Entry(system, known.code if known else code, display,
                                     code_system.version if code_system else version,
                                     designations, bool(known and known.abstract),
                                     bool(known and known.inactive)))
            return entries
        if code_system is None or code_system.content not in ("complete", "fragment"):
            (members.partial_systems if filters else members.open_systems).add(system)
            return None
        selected: Iterable[Concept] = code_system.concepts.values()
        if filters:
            try:
                codes: set[str] | None = None
                for f in filters:
                    passed = {c.code for c in code_system.filter(
                        str(f.get("property")), str(f.get("op")), str(f.get("value", "")))}
                    codes = passed if codes is None else codes & passed
            except (FilterError, ValueError) as exc:
                members.partial_systems.add(system)
                members.notes.append(str(exc))
                return None
            selected = [code_system.concepts[c] for c in sorted(codes or ())]
        return [Entry(system, c.code, c.display, code_system.version, tuple(c.designations),
                      c.abstract, c.inactive) for c in selected]

    # -- membership -------------------------------------------------------------------
    def membership(self, canonical: str, system: str | None, code: str,
                   version: str | None = None) -> Membership:
        """Whether (system, code) is in the value set ``canonical``."""
        url, vs_version = _canonical(canonical)
        value_set = self.source.value_set(url, vs_version)
        if value_set is None:
            return Membership(None, f"the value set {canonical} is not known")
        try:
            members = self.members_of(value_set)
        except ExpansionError as exc:
            return Membership(None, str(exc))
        return self.member(members, system, code, version)

    def member(self, members: Members, system: str | None, code: str,
               version: str | None = None) -> Membership:
        if system is None:
            systems = [s for s, codes in members.codes.items() if code in codes]
            if len(systems) == 1:
                system = systems[0]
            elif not systems:
                candidates = set(members.codes) | members.open_systems | \
                    members.partial_systems
                if len(candidates) == 1:
                    system = next(iter(candidates))
                elif members.open_systems or members.partial_systems:
                    return Membership(None, f"the code '{code}' has no system, and the "
                                      "value set is not fully known")
                else:
                    return Membership(False, f"the code '{code}' is not in the value set")
            else:
                return Membership(False, f"the code '{code}' has no system, and several "
                                  "systems of the value set have it")
        entry = members.codes.get(system, {}).get(code)
        if entry is None and system in members.codes:
            folded = self._case_insensitive(system, code)
            entry = members.codes[system].get(folded) if folded else None
        if entry is not None:
            return Membership(True, display=entry.display, system=system)
        if system in members.open_systems:
            code_system = self.source.code_system(system)
            if code_system is not None and code_system.complete:
                concept = code_system.lookup(code)
                return Membership(concept is not None, "" if concept else
                                  f"the code '{code}' is not in {system}",
                                  concept.display if concept else None, system)
            if system in GRAMMAR_SYSTEMS:
                valid = grammar_check(system, code)
                return Membership(valid, "" if valid else
                                  f"'{code}' is not a valid code of {system}", system=system)
            return Membership(None, f"the code system {system} is not known to the server, "
                              "so the code cannot be checked", system=system)
        if system in members.partial_systems:
            return Membership(None, f"the value set takes part of {system}, which the "
                              "server cannot list, so the code cannot be checked",
                              system=system)
        return Membership(False, f"the code '{code}' from {system} is not in the value set",
                          system=system)

    def _case_insensitive(self, system: str, code: str) -> str | None:
        code_system = self.source.code_system(system)
        if code_system is None or code_system.case_sensitive:
            return None
        concept = code_system.lookup(code)
        return concept.code if concept else None

    # -- expansion --------------------------------------------------------------------
    def expand(self, value_set: dict[str, Any], *, text: str | None = None,
               active_only: bool = False, exclude_not_selectable: bool = False
               ) -> list[Entry]:
        """Every code of the value set (optionally those whose display or code contains
        ``text``), in a stable order; ExpansionError when it cannot be listed."""
        members = self.members_of(value_set)
        if not members.enumerable:
            systems = sorted(members.open_systems | members.partial_systems)
            raise ExpansionError("too-costly", "the value set cannot be expanded: it takes "
                                 f"codes from {', '.join(systems)}, which the server does "
                                 "not hold")
        entries = members.entries()
        if len(entries) > MAX_EXPANSION:
            raise ExpansionError("too-costly", f"the expansion has {len(entries)} codes, "
                                 f"more than the {MAX_EXPANSION} the server lists")
        if text:
            needle = text.lower()
            entries = [e for e in entries if needle in e.code.lower()
                       or (e.display is not None and needle in e.display.lower())]
        if active_only:
            entries = [e for e in entries if not e.inactive]
        if exclude_not_selectable:
            entries = [e for e in entries if not e.abstract]
        return entries


def _flatten(contains: Iterable[dict[str, Any]]) -> Iterable[dict[str, Any]]:
    for item in contains:
        yield item
        yield from _flatten(item.get("contains") or ())
