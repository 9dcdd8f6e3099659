"""SMART App Launch scopes (IG 2.2, scopes-and-launch-context): parsed once, matched
against FHIR interactions, and turned into narrowings of the access policy's grants.

A resource scope is ``(patient|user|system)/(Type|*).<letters>[?param=value&...]``:

- letters are a subset of ``cruds`` in that order (``c`` create; ``r`` read, vread and
  instance history; ``u`` update and patch; ``d`` delete; ``s`` type, system and
  compartment search, type and system history); a request out of order (``.dus``) is not
  a scope and is never granted;
- v1 suffixes map to v2 letters: ``.read`` → ``rs``, ``.write`` → ``cud``, ``.*`` →
  ``cruds``;
- a granular constraint (``patient/Observation.rs?category=<system>|laboratory``) limits
  the scope to resources with one of the values (comma-separated, OR) in each token
  search parameter named (AND). Only token parameters of a named type are enforceable
  (:class:`~fhir_server.access.TokenFilter`); a scope with any other constraint
  (modifiers, chains, ``_filter``: experimental in the IG) is not a scope this server
  grants.

Every other scope (``launch``, ``launch/patient``, ``openid``, ``fhirUser``,
``offline_access``...) is kept as its text.

Scopes never widen access: :func:`narrow` intersects each grant the caller's relations
give (:mod:`fhir_server.access`) with what the scopes allow, per action:

- ``user/`` scopes: the types named, and the constraints;
- ``patient/`` scopes: the same, confined to the launch patient's compartment (a
  resource type in that compartment) or, for the types a patient scope may reach outside
  it (``shared_types``: directories and definitions, not patient data), unconfined;
  nothing else (a Binary, a Group) is reachable through a ``patient/`` scope;
- ``system/`` scopes: the types named, and the constraints (backend services clients).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from urllib.parse import parse_qsl

from fhir_server.access import CREATE, DELETE, READ, SEARCH, UPDATE, Grant, TokenFilter

PATIENT, USER, SYSTEM = "patient", "user", "system"
CONTEXTS = (PATIENT, USER, SYSTEM)
LETTERS = "cruds"
V1_SUFFIXES = {"read": "rs", "write": "cud", "*": "cruds"}
# The scope letter each action of the access policy needs.
ACTION_LETTERS = {READ: "r", SEARCH: "s", CREATE: "c", UPDATE: "u", DELETE: "d"}
_RESOURCE_SCOPE = re.compile(
    r"^(patient|user|system)/([A-Z][A-Za-z]*|\*)\.([a-z*]+)(?:\?(.+))?$")
# Which contexts a principal's scopes may use: a user's token never acts as a system.
USER_CONTEXTS = frozenset({PATIENT, USER})
SYSTEM_CONTEXTS = frozenset({SYSTEM})


class ScopeError(ValueError):
    """A scope that looks like a resource scope but is malformed."""


@dataclass(frozen=True, slots=True)
class ResourceScope:
    """One parsed resource scope."""

    context: str  # patient | user | system
    resource_type: str  # a FHIR type or "*"
    letters: str  # subset of "cruds", in that order
    constraints: tuple[tuple[str, tuple[str, ...]], ...] = ()  # (param, values OR-ed)
    text: str = ""  # as written (v1 or v2)

    def covers(self, resource_type: str) -> bool:
        return self.resource_type in ("*", resource_type)

    def allows(self, letter: str) -> bool:
        return letter in self.letters

    def within(self, other: ResourceScope) -> bool:
        """Whether this scope asks for nothing ``other`` does not give (refresh may only
        narrow): same context, a type ``other`` covers, its letters, and constraints at
        least as narrow."""
        return (self.context == other.context and other.covers(self.resource_type)
                and set(self.letters) <= set(other.letters)
                and (not other.constraints or self.constraints == other.constraints))


def parse_resource_scope(text: str) -> ResourceScope | None:
    """The resource scope ``text`` is, ``None`` when it is another kind of scope;
    :class:`ScopeError` when it is a malformed resource scope."""
    match = _RESOURCE_SCOPE.match(text)
    if match is None:
        if text.split("/", 1)[0] in CONTEXTS and "/" in text:
            raise ScopeError(f"{text!r} is not (patient|user|system)/(Type|*).(cruds)")
        return None
    context, resource_type, suffix, query = match.groups()
    letters = V1_SUFFIXES.get(suffix, suffix)
    if not letters or any(c not in LETTERS for c in letters) or "".join(
            c for c in LETTERS if c in letters) != letters or len(set(letters)) != len(letters):
        raise ScopeError(f"{text!r}: the permissions must be a subset of 'cruds' in that "
                         "order, or a v1 suffix (read, write, *)")
    constraints: list[tuple[str, tuple[str, ...]]] = []
    if query:
        pairs = parse_qsl(query, keep_blank_values=True, strict_parsing=False)
        if not pairs or any(not value for _, value in pairs):
            raise ScopeError(f"{text!r}: a constraint is param=value[&param=value]")
        constraints = sorted((param, tuple(sorted(value.split(",")))) for param, value in pairs)
    return ResourceScope(context, resource_type, letters, tuple(constraints), text)


@dataclass(frozen=True, slots=True)
class ScopeSet:
    """The scopes of one authorization, parsed once (``ScopeSet.parse``)."""

    names: tuple[str, ...]  # every scope, in order, without duplicates
    resources: tuple[ResourceScope, ...] = ()

    @classmethod
    def parse(cls, text: str | Iterable[str]) -> ScopeSet:
        """Parse a space-separated scope string; :class:`ScopeError` on a malformed
        resource scope."""
        names = tuple(dict.fromkeys(text.split() if isinstance(text, str) else text))
        resources = tuple(found for name in names
                          if (found := parse_resource_scope(name)) is not None)
        return cls(names, resources)

    def __contains__(self, name: object) -> bool:
        return name in self.names

    def __str__(self) -> str:
        return " ".join(self.names)

    @property
    def contexts(self) -> frozenset[str]:
        return frozenset(scope.context for scope in self.resources)

    def allows(self, contexts: frozenset[str], action: str, resource_type: str) -> bool:
        """Whether some scope of ``contexts`` allows ``action`` on the type at all."""
        letter = ACTION_LETTERS[action]
        return any(s.context in contexts and s.covers(resource_type) and s.allows(letter)
                   for s in self.resources)

    def within(self, other: ScopeSet) -> bool:
        """Whether every scope here is one ``other`` grants (a refresh's narrowing)."""
        for name in self.names:
            scope = parse_resource_scope(name)
            if scope is None:
                if name not in other.names:
                    return False
            elif not any(scope.within(granted) for granted in other.resources):
                return False
        return True


def needed_scope(contexts: Sequence[str], action: str, resource_type: str) -> str:
    """The scopes that would allow ``action`` on ``resource_type``, for a 403 message."""
    letter = ACTION_LETTERS[action]
    return " or ".join(f"{context}/{resource_type}.{letter}" for context in contexts)


# -- scopes as narrowings of grants -----------------------------------------------------
@dataclass(frozen=True, slots=True)
class Narrowing:
    """What one group of scopes lets through: these types (``None``: any), confined to
    these patients' compartments (``None``: not confined), with these token filters."""

    types: frozenset[str] | None
    patients: frozenset[str] | None = None
    tokens: tuple[TokenFilter, ...] | None = None


@dataclass(frozen=True, slots=True)
class ScopeUniverse:
    """What the server knows that narrowing needs: the types in the Patient compartment
    (Patient included), the types a ``patient/`` scope reaches outside it, and which
    token parameters a type has."""

    compartment_types: frozenset[str]
    shared_types: frozenset[str]
    token_param: Callable[[str, str], bool]


def narrowings(scopes: ScopeSet, action: str, contexts: frozenset[str], patient: str | None,
               universe: ScopeUniverse) -> list[Narrowing]:
    """The narrowings the scopes give for ``action`` (module docstring). Scopes with the
    same confinement and constraints are merged into one narrowing over their types."""
    letter = ACTION_LETTERS[action]
    grouped: dict[tuple[bool, tuple[TokenFilter, ...] | None], set[str] | None] = {}
    for scope in scopes.resources:
        if scope.context not in contexts or not scope.allows(letter):
            continue
        for confined, types in _scope_types(scope, universe):
            tokens = _token_filters(scope, types, universe)
            if tokens is None:
                continue  # a constraint this server cannot enforce admits nothing
            key = (confined, tokens or None)
            if types is None or (key in grouped and grouped[key] is None):
                grouped[key] = None
            else:
                existing = grouped.setdefault(key, set())
                assert existing is not None
                existing |= types
    confined_to = frozenset({patient}) if patient is not None else frozenset()
    return [Narrowing(None if types is None else frozenset(types),
                      confined_to if confined else None, tokens)
            for (confined, tokens), types in grouped.items()]


def _scope_types(scope: ResourceScope, universe: ScopeUniverse
                 ) -> list[tuple[bool, set[str] | None]]:
    """(confined to the patient's compartment, types) the scope reaches."""
    if scope.context != PATIENT:
        return [(False, None if scope.resource_type == "*" else {scope.resource_type})]
    if scope.resource_type == "*":
        return [(True, set(universe.compartment_types)), (False, set(universe.shared_types))]
    if scope.resource_type in universe.compartment_types:
        return [(True, {scope.resource_type})]
    if scope.resource_type in universe.shared_types:
        return [(False, {scope.resource_type})]
    return []


def _token_filters(scope: ResourceScope, types: set[str] | None, universe: ScopeUniverse
                   ) -> tuple[TokenFilter, ...] | None:
    """The scope's constraints as token filters (``()``: none); ``None`` when one cannot
    be enforced on every type it reaches (a wildcard type, or not a token parameter)."""
    if not scope.constraints:
        return ()
    if types is None or not types:
        return None
    if not all(universe.token_param(t, param) for t in types for param, _ in scope.constraints):
        return None
    return tuple(TokenFilter(param, frozenset(values)) for param, values in scope.constraints)


def enforceable(scope: ResourceScope, universe: ScopeUniverse) -> bool:
    """Whether the server can enforce ``scope`` exactly (what it may grant)."""
    if scope.resource_type == "*":
        return not scope.constraints
    reached = _scope_types(scope, universe)
    return bool(reached) and all(
        _token_filters(scope, types, universe) is not None for _, types in reached)


def narrow(grants: Iterable[Grant], narrowed_by: Sequence[Narrowing]) -> list[Grant]:
    """Each grant intersected with each narrowing (none: nothing is admitted)."""
    out: list[Grant] = []
    for grant in grants:
        for narrowing in narrowed_by:
            types = _intersect(grant.types, narrowing.types)
            if types is not None and not types:
                continue
            patients = _intersect(grant.patients, narrowing.patients)
            tokens = ((grant.tokens or ()) + (narrowing.tokens or ())) or None
            out.append(Grant(types, grant.owners, patients, grant.identifiers,
                             grant.relation, tokens))
    return out


def _intersect(first: frozenset[str] | None, second: frozenset[str] | None
               ) -> frozenset[str] | None:
    if first is None:
        return second
    if second is None:
        return first
    return first & second
