"""MongoDB compilation of search plans: every clause becomes a query document.

A current resource is one document of the ``resources`` collection holding its
search-index values (see :mod:`fhir_server.store.mongo_layout`): ``ix.<kind>`` arrays of
rows named as :data:`fhir_server.store.index.FIELDS` names them. A clause compiles to a
filter on those arrays, its criteria OR-ed inside one ``$elemMatch`` so that the
parameter and the value match *the same* row:

- ``birthdate=ge1988`` → ``{"ix.date": {"$elemMatch": {"param": "birthdate",
  "hi": {"$gt": "1988-01-01T00:00:00.000000Z"}}}}`` (dates are half-open ranges of UTC
  instants as sortable text, so every prefix compares ranges: ``sa`` is ``lo >= hi of
  the value``, ``eb`` is ``hi <= lo of the value``, ``ap`` widens the value by 10% of its
  distance from now);
- numbers and quantities compare as ``Decimal128`` (exact, never a binary double);
- ``:not`` and ``:missing=true`` are ``$not: {$elemMatch: ...}``;
- chains and ``_has`` run their inner search first (through the caller's access filter),
  then match the references to, or from, what it found; an inner search matching more
  than :data:`MAX_INNER` resources is refused as too costly rather than shipped as a
  giant ``$in``.

The compiler performs no I/O itself: the inner searches of chains and ``_has`` go through
the ``inner`` callback the executor gives it (tests give a table), so the query documents
of any plan can be checked directly. The access filter compiles in
:mod:`fhir_server.store.mongo_access`.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Sequence
from decimal import Decimal
from typing import Any

from bson.decimal128 import Decimal128

from fhir_server.search.dates import approximate
from fhir_server.search.plan import (
    AccessGrant,
    ChainCriterion,
    Clause,
    CompositeCriterion,
    HasCriterion,
    RangeCriterion,
    ReferenceCriterion,
    SearchPlan,
    StringCriterion,
    TextCriterion,
    TokenCriterion,
    UriCriterion,
)
from fhir_server.search.values import normalize
from fhir_server.store.mongo_access import access_filter
from fhir_server.store.port import SearchTooCostly

Filter = dict[str, Any]
# (filter, projection) → the matching resource documents, at most MAX_INNER + 1
Inner = Callable[[Filter, Filter], Awaitable[list[dict[str, Any]]]]

MAX_INNER = 10_000  # resources an inner search (chain, _has) may match
_TOP = "\U0010ffff"  # sorts after every other character: the upper bound of a prefix range
NOTHING: Filter = {"_id": {"$in": []}}


def decimal(value: Any) -> Decimal128:
    """A search number as the exact decimal it was written as (floats through their
    shortest representation, which is the text they were parsed from)."""
    if isinstance(value, Decimal128):
        return value
    if isinstance(value, float):
        return Decimal128(repr(value))
    return Decimal128(Decimal(value))


def _row(kind: str, condition: Filter) -> Filter:
    return {f"ix.{kind}": {"$elemMatch": condition}}


def _params(params: Sequence[str]) -> Any:
    return params[0] if len(params) == 1 else {"$in": list(params)}


def _any(conditions: Sequence[Filter]) -> Filter:
    """Conditions on one row, OR-ed (merged into the row's match when there is one)."""
    if len(conditions) == 1:
        return dict(conditions[0])
    return {"$or": list(conditions)}


def _both(*filters: Filter) -> Filter:
    parts = [f for f in filters if f]
    if not parts:
        return {}
    if len(parts) == 1:
        return parts[0]
    return {"$and": parts}


# --- criterion conditions on one index row ------------------------------------------------

def string_condition(c: StringCriterion, value: str = "value", exact: str = "exact") -> Filter:
    if c.mode == "exact":
        return {exact: c.value}
    if c.mode == "contains":
        return {value: {"$regex": re.escape(c.value)}}
    if c.mode == "phonetic":  # the stored value is the name part's code
        return {value: c.value}
    return {value: {"$gte": c.value, "$lt": c.value + _TOP}}


def token_condition(c: TokenCriterion, system: str = "system", code: str = "code",
                    text: str = "text") -> Filter:
    if c.text is not None:
        return {text: {"$regex": re.escape(c.text)}}
    found: Filter = {}
    if c.code is not None:
        found[code] = c.code
    if c.system is not None:
        found[system] = c.system
    elif c.no_system:
        found[system] = None  # absent: a row without a system stores none
    return found


def date_condition(c: RangeCriterion, lo: str = "lo", hi: str = "hi") -> Filter:
    """A search date's range against a stored range ``[lo, hi)``."""
    s_lo, s_hi = c.lo, c.hi
    match c.prefix:
        case "eq":
            return {lo: {"$gte": s_lo}, hi: {"$lte": s_hi}}
        case "ne":
            return {"$or": [{lo: {"$lt": s_lo}}, {hi: {"$gt": s_hi}}]}
        case "gt":
            return {hi: {"$gt": s_hi}}
        case "lt":
            return {lo: {"$lt": s_lo}}
        case "ge":
            return {hi: {"$gt": s_lo}}
        case "le":
            return {lo: {"$lt": s_hi}}
        case "sa":
            return {lo: {"$gte": s_hi}}
        case "eb":
            return {hi: {"$lte": s_lo}}
        case _:  # ap
            wide_lo, wide_hi = approximate(s_lo, s_hi)
            return {lo: {"$lt": wide_hi}, hi: {"$gt": wide_lo}}


def point_date_condition(c: RangeCriterion, field: str) -> Filter:
    """A date comparison where the stored value is an instant (``_lastUpdated``)."""
    match c.prefix:
        case "eq":
            return {field: {"$gte": c.lo, "$lt": c.hi}}
        case "ne":
            return {"$or": [{field: {"$lt": c.lo}}, {field: {"$gte": c.hi}}]}
        case "gt" | "sa":
            return {field: {"$gte": c.hi}}
        case "lt" | "eb":
            return {field: {"$lt": c.lo}}
        case "ge":
            return {field: {"$gte": c.lo}}
        case "le":
            return {field: {"$lt": c.hi}}
        case _:
            wide_lo, wide_hi = approximate(c.lo, c.hi)
            return {field: {"$gte": wide_lo, "$lt": wide_hi}}


def _on(field: str, **ops: Any) -> Filter:
    return {field: {f"${op}": decimal(value) for op, value in ops.items()}}


def number_condition(prefix: str, value: float, s_lo: float, s_hi: float, lo: str = "lo",
                     hi: str = "hi") -> Filter:
    """A number against a stored range ``[lo, hi)``; a stored point (a composite's number
    or quantity) passes the same field as both."""
    match prefix:
        case "eq":
            if lo == hi:
                return _on(lo, gte=s_lo, lt=s_hi)
            return {**_on(lo, gte=s_lo), **_on(hi, lt=s_hi)}
        case "ne":
            return {"$or": [_on(lo, lt=s_lo), _on(hi, gte=s_hi)]}
        case "gt" | "sa":
            return _on(hi, gt=value)
        case "lt" | "eb":
            return _on(lo, lt=value)
        case "ge":
            return _on(hi, gte=value)
        case "le":
            return _on(lo, lte=value)
        case _:  # ap: within 10% of the value
            margin = abs(value) * 0.1
            if lo == hi:
                return _on(lo, lte=value + margin, gte=value - margin)
            return {**_on(lo, lte=value + margin), **_on(hi, gte=value - margin)}


def quantity_condition(c: RangeCriterion) -> Filter:
    if c.canonical is not None:  # a UCUM unit: compare in its base unit
        unit, value, lo, hi = c.canonical
        return {"ncode": unit, **number_condition(c.prefix, value, lo, hi, "nlo", "nhi")}
    found = number_condition(c.prefix, c.value, c.lo, c.hi)
    if c.code is not None:  # not convertible: the stored normalized code is the code sent
        found = {"ncode": c.code, "code": c.code, **found}
    if c.system is not None:
        found = {"system": c.system, **found}
    return found


def reference_condition(c: ReferenceCriterion) -> Filter:
    if c.url is not None:
        return {"url": c.url}
    if c.resource_type is not None:
        return {"target_id": c.id, "target_type": c.resource_type}
    return {"target_id": c.id}


def uri_condition(c: UriCriterion) -> Filter:
    if c.mode == "below":
        return {"value": {"$gte": c.value, "$lt": c.value + _TOP}}
    if c.mode == "above":
        prefixes = [c.value[:i] for i in range(len(c.value), 0, -1)
                    if i == len(c.value) or c.value[i] == "/"]
        return {"value": _params(prefixes)}
    return {"value": c.value}


def composite_condition(c: CompositeCriterion) -> Filter:
    head = token_condition(c.head)
    tail: Filter
    match c.tail_type:
        case "token":
            tail = token_condition(c.tail, "vsystem", "vcode", "vcode")
        case "quantity":
            tail = number_condition(c.tail.prefix, c.tail.value, c.tail.lo, c.tail.hi, "lo",
                                    "lo")
            if c.tail.code is not None:
                tail["vcode"] = c.tail.code
            if c.tail.system is not None:
                tail["vsystem"] = c.tail.system
        case "number":
            tail = number_condition(c.tail.prefix, c.tail.value, c.tail.lo, c.tail.hi, "lo",
                                    "lo")
        case "date":
            tail = date_condition(c.tail)
        case "string":
            tail = string_condition(c.tail, "vcode", "vcode")
        case "reference":
            tail = {"vcode": c.tail.id or c.tail.url}
            if c.tail.resource_type:
                tail["vsystem"] = c.tail.resource_type
        case _:
            tail = {"vcode": c.tail.value}
    return _merge_rows(head, tail)


def _merge_rows(first: Filter, second: Filter) -> Filter:
    """Both conditions on one row (an ``$or`` of each kept apart under ``$and``)."""
    if "$or" in first and "$or" in second:
        return {"$and": [first, second]}
    return {**first, **second}


CONDITIONS: dict[str, Callable[[Any], Filter]] = {
    "string": string_condition, "token": token_condition, "date": date_condition,
    "number": lambda c: number_condition(c.prefix, c.value, c.lo, c.hi),
    "quantity": quantity_condition, "reference": reference_condition, "uri": uri_condition,
    "composite": composite_condition,
}

WORD = re.compile(r"[^\W_]+")


def words(text: str) -> list[str]:
    """The distinct words of normalized text (what ``_text``/``_content`` terms match as
    prefixes), as the SQLite adapter's FTS5 tokenizer splits them."""
    return sorted(set(WORD.findall(normalize(text))))


# --- the compiler ------------------------------------------------------------------------

class QueryCompiler:
    """Compiles a plan's clauses into one filter on ``resources``.

    ``access`` (the plan's access filter) also limits the targets of chains and ``_has``:
    a caller cannot learn of a resource it may not read through a search it may run."""

    def __init__(self, inner: Inner, access: Sequence[AccessGrant] | None = None,
                 all_types: bool = False):
        self.inner = inner
        self.access = access
        self.all_types = all_types

    async def plan_filter(self, plan: SearchPlan) -> Filter:
        """Every match of ``plan``: its types, live, its clauses, compartment, access."""
        parts = [self.types_filter(plan.resource_types), {"deleted": False}]
        for clause in plan.clauses:
            parts.append(await self.clause(clause, plan.resource_types))
        if plan.compartment is not None:
            parts.append(compartment_filter(plan))
        allowed = self.allowed(None if plan.all_types else plan.resource_types)
        if allowed is not None:
            parts.append(allowed)
        return _both(*parts)

    def types_filter(self, types: Sequence[str]) -> Filter:
        if self.all_types:
            return {}
        return {"type": _params(types)}

    def allowed(self, types: Sequence[str] | None) -> Filter | None:
        if self.access is None:
            return None
        return access_filter(self.access, types)

    async def clause(self, clause: Clause, types: Sequence[str]) -> Filter:
        if clause.missing is not None:
            return missing_filter(clause)
        if clause.type == "id":
            ids = [c.code for c in clause.criteria if isinstance(c, TokenCriterion) and c.code]
            return {"id": {"$nin" if clause.negate else "$in": ids}}
        if clause.type == "lastUpdated":
            return _any([point_date_condition(c, "lastUpdated") for c in clause.criteria])
        if clause.type == "text":
            return _any([text_condition(c) for c in clause.criteria])
        if clause.type == "has":
            return await self._has(clause, types)
        if clause.criteria and isinstance(clause.criteria[0], ChainCriterion):
            return await self._chain(clause)
        return indexed_filter(clause)

    async def _inner_matches(self, clause: Clause, types: Sequence[str],
                             projection: Filter) -> list[dict[str, Any]]:
        inner = QueryCompiler(self.inner, self.access)
        found = _both({"type": _params(types)}, {"deleted": False},
                      await inner.clause(clause, types), self.allowed(types) or {})
        matches = await self.inner(found, projection)
        if len(matches) > MAX_INNER:
            raise SearchTooCostly(
                f"The chained or _has search on {clause.param} matches more than "
                f"{MAX_INNER} resources; add more selective parameters")
        return matches

    async def _chain(self, clause: Clause) -> Filter:
        chain: ChainCriterion = clause.criteria[0]
        targets = await self._inner_matches(chain.clause, chain.target_types, {"id": 1})
        if not targets:
            return NOTHING
        return _row("reference", {"param": _params(clause.index_params),
                                  "target_type": _params(chain.target_types),
                                  "target_id": {"$in": sorted({t["id"] for t in targets})}})

    async def _has(self, clause: Clause, types: Sequence[str]) -> Filter:
        has: HasCriterion = clause.criteria[0]
        sources = await self._inner_matches(has.clause, (has.resource_type,),
                                            {"ix.reference": 1})
        pointed = {row["target_id"] for source in sources
                   for row in source.get("ix", {}).get("reference", ())
                   if row.get("param") == has.reference_param
                   and row.get("target_type") in types and row.get("target_id")}
        if not pointed:
            return NOTHING
        return {"id": {"$in": sorted(pointed)}}


def indexed_filter(clause: Clause) -> Filter:
    """A clause on the index rows of its parameter's kind."""
    params, kind = clause.index_params, clause.type
    if clause.modifier == "of-type":
        params = tuple(f"{p}:of-type" for p in params)
    if clause.modifier == "identifier":
        params, kind = tuple(f"{p}:identifier" for p in params), "token"
    row = {"param": _params(params), **_any([CONDITIONS[kind](c) for c in clause.criteria])}
    if clause.negate:
        return {f"ix.{kind}": {"$not": {"$elemMatch": row}}}
    return _row(kind, row)


def missing_filter(clause: Clause) -> Filter:
    if clause.type in ("id", "lastUpdated"):  # always present
        return NOTHING if clause.missing else {}
    kind = clause.type if clause.type != "has" else "reference"
    present = {"param": _params(clause.index_params)}
    if clause.missing:
        return {f"ix.{kind}": {"$not": {"$elemMatch": present}}}
    return _row(kind, present)


def text_condition(c: TextCriterion) -> Filter:
    """Every term as a word prefix of the narrative (``_text``) or of all the resource's
    text (``_content``)."""
    field = f"ix.text.{c.column}"
    terms = [{field: {"$regex": "^" + re.escape(t)}} for t in c.terms]
    return terms[0] if len(terms) == 1 else {"$and": terms}


def compartment_filter(plan: SearchPlan) -> Filter:
    """Members of the plan's compartment (R4 3.1.1.1): resources whose compartment
    parameters for their type point at the owner; with ``include_owner`` the owner too."""
    comp = plan.compartment
    assert comp is not None
    members: list[Filter] = []
    for resource_type, params in comp.members.items():
        if resource_type in plan.resource_types and params:
            members.append({"type": resource_type, **_row("reference", {
                "param": _params(params), "target_type": comp.owner_type,
                "target_id": comp.owner_id})})
    if comp.include_owner and comp.owner_type in plan.resource_types:
        members.append({"type": comp.owner_type, "id": comp.owner_id})
    if not members:
        return NOTHING
    return members[0] if len(members) == 1 else {"$or": members}


__all__ = ["MAX_INNER", "NOTHING", "QueryCompiler", "compartment_filter", "decimal",
           "indexed_filter", "missing_filter", "words"]
