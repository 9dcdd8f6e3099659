"""A FHIR search of AuditEvent as a query of the audit log.

:func:`log_query` turns a :class:`~fhir_server.search.plan.SearchPlan` of ``AuditEvent``
(parsed as any search is, the caller's grants in ``plan.access``) into a
:class:`LogQuery` that each log adapter runs: groups of keys (OR inside a group, AND
between groups; see :mod:`fhir_server.audit_log.entry`), ``recorded`` / ``logged``
ranges, ``action`` and ``outcome`` values, ids, and the access filter as alternatives of
key groups. The log indexes what the audit searches need, not every AuditEvent
parameter: a parameter it does not index is a 400 naming the ones it does (never an
answer that silently ignored a criterion).

Grants compile like any search's (:mod:`fhir_server.access`): an owner label is the key
``_security=<org>|urn:healthplatform:organization``, a patient the key
``patient=Patient/<id>``; a grant for other types than AuditEvent does not apply; one
with identifiers or token filters the log cannot check admits nothing (fail closed).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from fhir_server.audit_log.entry import UNKEYED_SYSTEMS, token_key
from fhir_server.search.plan import (
    AccessGrant,
    Clause,
    Cursor,
    RangeCriterion,
    ReferenceCriterion,
    SearchPlan,
    TokenCriterion,
)
from fhir_server.store.port import InvalidSearch

RESOURCE_TYPE = "AuditEvent"
REFERENCE_PARAMS = ("agent", "entity", "patient")
KEY_TOKENS = ("subtype", "_security")
COLUMN_TOKENS = ("action", "outcome", "type")
SEARCHED = ("_id", "_lastUpdated", "date", "action", "outcome", "type", "subtype", "agent",
            "agent:identifier", "entity", "entity:identifier", "patient", "_security")
SORTS = {"date": "recorded", "_lastUpdated": "logged"}


class Prefix(str):
    """A group member matching every key that starts with it (a token searched by its
    code alone: ``subtype=read|`` matches ``subtype=read|<any system>``)."""

    __slots__ = ()

    @property
    def end(self) -> str:
        """The first key past every key with this prefix."""
        return self + "\U0010ffff"


@dataclass(slots=True)
class Range:
    column: str  # recorded | logged
    low: str | None = None  # inclusive
    high: str | None = None  # exclusive


@dataclass(slots=True)
class LogQuery:
    """What an adapter runs; every condition set must hold (``access`` None: no filter;
    an empty ``access``: nothing is admitted)."""

    groups: list[tuple[str, ...]] = field(default_factory=list)
    excluded: list[tuple[str, ...]] = field(default_factory=list)  # :not on keys
    ranges: list[Range] = field(default_factory=list)
    # ``(column, values, negate)``: action / outcome in (or not in) values
    columns: list[tuple[str, tuple[str, ...], bool]] = field(default_factory=list)
    ids: list[tuple[str, ...]] = field(default_factory=list)
    access: list[list[tuple[str, ...]]] | None = None
    order: str = "recorded"  # recorded | logged | id
    descending: bool = False
    count: int = 20
    offset: int = 0
    cursor: Cursor | None = None
    total: bool = False
    nothing: bool = False  # a criterion no entry can meet

    @property
    def driver(self) -> tuple[str, ...] | None:
        """The key group to walk in date order (the most selective kind first)."""
        groups = [*self.groups, *(self.access[0] if self.access and len(self.access) == 1
                                  else [])]
        for prefix in ("entity", "patient", "agent", "subtype", "type", "_security"):
            for group in groups:
                if group and all(k.startswith(prefix) for k in group):
                    return group
        return groups[0] if groups else None


def unsupported(name: str, why: str) -> InvalidSearch:
    return InvalidSearch(f"{name}: {why}; the audit log searches AuditEvent by "
                         f"{', '.join(SEARCHED)}")


def log_query(plan: SearchPlan) -> LogQuery:
    if plan.includes or plan.revincludes:
        raise unsupported("_include", "the audit log answers AuditEvents alone")
    if plan.compartment is not None:
        query = LogQuery(groups=[(f"patient=Patient/{plan.compartment.owner_id}",)]) \
            if plan.compartment.owner_type == "Patient" else LogQuery(nothing=True)
    else:
        query = LogQuery()
    for clause in plan.clauses:
        _clause(query, clause)
    query.access = _access(plan.access)
    if len(plan.sort) > 1:
        raise unsupported("_sort", "one sort key only")
    if plan.sort:
        key = plan.sort[0]
        if key.param not in (*SORTS, "_id"):
            raise unsupported(f"_sort={key.param}", "not a sort the log keeps")
        query.order = SORTS.get(key.param, "id")
        query.descending = key.descending
    query.count, query.offset, query.cursor = plan.count, plan.offset, plan.cursor
    query.total = plan.total == "accurate" or plan.summary == "count"
    return query


def _clause(query: LogQuery, clause: Clause) -> None:
    name = clause.param + (f":{clause.modifier}" if clause.modifier else "")
    if clause.missing is not None:
        raise unsupported(f"{name}:missing", "not kept by the log")
    if clause.param == "_id":
        ids = tuple(str(c.code) for c in clause.criteria)
        if clause.negate:
            raise unsupported("_id:not", "not kept by the log")
        query.ids.append(ids)
    elif clause.param in ("date", "_lastUpdated"):
        if len(clause.criteria) != 1:
            raise unsupported(clause.param, "one value per date parameter (repeat it "
                              "for a range: date=ge...&date=lt...)")
        query.ranges.append(_range(SORTS[clause.param], clause.criteria[0], clause.param))
    elif clause.param in COLUMN_TOKENS and clause.modifier in (None, "not"):
        if clause.param == "type":  # code|system, as keys are written
            values = tuple(_column_token(c, name) for c in clause.criteria)
        else:
            values = tuple(_code(c, name) for c in clause.criteria)
        query.columns.append((clause.param, values, clause.negate))
    elif clause.param in KEY_TOKENS and clause.modifier in (None, "not"):
        keys = tuple(_token_key(clause.param, c, name) for c in clause.criteria)
        (query.excluded if clause.negate else query.groups).append(keys)
    elif clause.param in REFERENCE_PARAMS and clause.modifier in (None, "identifier",
                                                                  "Patient"):
        if clause.modifier == "identifier":
            if clause.param == "patient":
                raise unsupported(name, "not kept by the log")
            if any(c.system in UNKEYED_SYSTEMS for c in clause.criteria
                   if isinstance(c, TokenCriterion)):
                raise unsupported(name, "request ids are not kept as keys (find the "
                                  "request's events by its time, caller or resource)")
            keys = tuple(_token_key(f"{clause.param}:identifier", c, name)
                         for c in clause.criteria)
        else:
            keys = tuple(_reference_key(clause.param, c, name) for c in clause.criteria)
        query.groups.append(keys)
    else:
        raise unsupported(name, "not kept by the log")


def _code(criterion: Any, name: str) -> str:
    if not isinstance(criterion, TokenCriterion) or criterion.code is None \
            or criterion.text is not None:
        raise unsupported(name, "give a code")
    return criterion.code


def _token_key(param: str, criterion: Any, name: str) -> str:
    """``system|code`` and ``|code`` are one key; ``code`` the keys it starts."""
    code = _code(criterion, name)
    if criterion.system is not None or criterion.no_system:
        return token_key(param, code, criterion.system)
    return Prefix(token_key(param, code, None))


def _column_token(criterion: Any, name: str) -> str:
    code = _code(criterion, name)
    if criterion.system is not None or criterion.no_system:
        return f"{code}|{criterion.system or ''}"
    return Prefix(f"{code}|")


def _reference_key(param: str, criterion: Any, name: str) -> str:
    if not isinstance(criterion, ReferenceCriterion) or criterion.url is not None \
            or criterion.resource_type is None or criterion.id is None:
        raise unsupported(name, "give a local reference Type/id")
    if param == "patient" and criterion.resource_type != "Patient":
        raise unsupported(name, "a patient is a Patient/id")
    return f"{param}={criterion.resource_type}/{criterion.id}"


def _range(column: str, criterion: RangeCriterion, name: str) -> Range:
    lo, hi = criterion.lo, criterion.hi
    # an instant in the log is a point: compared with the value's precision range
    bounds = {"eq": (lo, hi), "ap": (lo, hi), "ge": (lo, None), "gt": (hi, None),
              "sa": (hi, None), "lt": (None, lo), "eb": (None, lo), "le": (None, hi)}
    if criterion.prefix not in bounds:
        raise unsupported(f"{name}={criterion.prefix}", "not a prefix the log compares")
    low, high = bounds[criterion.prefix]
    return Range(column, low, high)


def _access(grants: tuple[AccessGrant, ...] | None) -> list[list[tuple[str, ...]]] | None:
    """The plan's access filter as alternatives (OR) of key groups (AND of ORs)."""
    if grants is None:
        return None
    alternatives: list[list[tuple[str, ...]]] = []
    for grant in grants:
        if not grant.covers(RESOURCE_TYPE):
            continue
        if grant.identifiers is not None or grant.tokens is not None:
            continue  # AuditEvent has no identifier; token filters are not kept: none
        groups: list[tuple[str, ...]] = []
        if grant.owners is not None:
            groups.append(tuple(_token_key("_security", o, "_security")
                                for o in grant.owners))
        if grant.patients is not None:
            groups.append(tuple(f"patient=Patient/{p}" for p in grant.patients))
        if not groups:
            return None  # a grant of every AuditEvent
        alternatives.append(groups)
    return alternatives
