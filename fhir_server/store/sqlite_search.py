"""SQLite compilation of search plans: every search becomes indexed SQL over ``idx_*``.

Each clause of a :class:`~fhir_server.search.plan.SearchPlan` compiles to two forms:

- a *source* (``SELECT rid FROM idx_token x WHERE x.type=? AND x.param=? AND x.code=?``)
  that can drive the query through its lookup index, and
- a *check* (``EXISTS (... WHERE x.rid = <rid> AND ...)``) evaluated per candidate through
  the ``(rid, param)`` index.

A tiny cost-based planner counts sources' matches up to :data:`ESTIMATE_CAP` (cheap: an
index range walk), most-likely-selective first (ids and references before tokens before
dates), stops at one small enough to drive (:data:`DRIVE_NOW`), and drives from the most
selective; every other clause becomes a check. A large source that cannot stream in rid
order (a date or quantity range) does not drive: the type is walked in rid order with
every clause as a check, which fills a page after a few rows instead of sorting them all.

Results are ordered by ``rid`` (write order) unless ``_sort`` says otherwise, and pages
are *keyset* pages: the cursor holds the sort tuple of the last row, so a page link stays
valid while data changes, and new or deleted resources neither repeat nor skip others
(unlike OFFSET). A resource whose sort value itself changes between two pages can move
across the cursor, as in any keyset paging.

Sorting: small result sets (≤ :data:`ESTIMATE_CAP`) are sorted in full with the keys
computed per row (ascending sorts use a resource's lowest value, descending its highest,
missing values last). Large ones with one sort key stream from the sort column's index
(``(type, param, hi, rid)`` for ``-date``) with the clauses as checks, so
``Observation?_sort=-date&_count=50`` reads 50 index entries, not a million rows.

A search that would still scan too much is stopped by SQLite's progress handler and
reported as :class:`~fhir_server.store.port.SearchTooCostly` (a 400 with a clear message)
instead of running into a client's time-out; chains, ``_has`` and includes are capped the
same way.
"""

from __future__ import annotations

import itertools
import sqlite3
from collections.abc import Callable, Iterator, Sequence
from collections.abc import Set as AbstractSet
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import orjson

from fhir_server.search.dates import approximate
from fhir_server.search.matching import plain_token_plan, system_matches
from fhir_server.search.plan import (
    AccessGrant,
    ChainCriterion,
    Clause,
    CompositeCriterion,
    Cursor,
    HasCriterion,
    Include,
    RangeCriterion,
    ReferenceCriterion,
    SearchPlan,
    SortKey,
    StringCriterion,
    TextCriterion,
    TokenCriterion,
    UriCriterion,
)
from fhir_server.store import includes as includes_module
from fhir_server.store.port import InvalidSearch, SearchPage, SearchTooCostly, StoredResource

ESTIMATE_CAP = 2000  # matches counted per clause to choose the driving one
DRIVE_NOW = 100  # a clause matching at most this many drives without estimating more
_PRIORITY = {"reference": 0, "id": 0, "token": 1, "string": 2, "uri": 2, "composite": 2,
             "number": 3, "quantity": 3, "text": 3, "date": 4, "lastUpdated": 4}
MATERIALIZE_MAX = 20000  # beyond this a multi-key sort is refused (no index can stream it)
# SQLite virtual-machine instructions one search may run (about 1-2 s of work here).
SEARCH_BUDGET = 150_000_000
_BUDGET_STEP = 10_000

TABLE_OF = {
    "string": "idx_string", "token": "idx_token", "date": "idx_date", "number": "idx_number",
    "quantity": "idx_quantity", "reference": "idx_reference", "uri": "idx_uri",
    "composite": "idx_composite",
}
_TOP = "\U0010ffff"  # sorts after every other character: the upper bound of a prefix range

SQL = tuple[str, list[Any]]


@dataclass
class Source:
    """A FROM/WHERE producing candidate rids; ``rid`` is the column expression."""

    from_sql: str
    where: str
    args: list[Any]
    rid: str

    def select(self, column: str | None = None) -> SQL:
        return f"SELECT {column or self.rid} FROM {self.from_sql} WHERE {self.where}", self.args


@dataclass
class Compiled:
    source: Source | None  # None: this clause can only check candidates
    check: Callable[[str], SQL]  # rid expression → boolean SQL
    estimate: int | None = None
    # Clauses are estimated most-likely-selective first (0: an id or a reference) and the
    # planner stops once one is small enough to drive: counting the others costs more
    # than checking them.
    priority: int = 2
    countable: bool = True  # counting its source is cheap (not a chain or _has)
    # Its source yields rids in order from the index (one code, one reference target):
    # it can stream a page however many match. Otherwise a large source would have to be
    # sorted in full, and scanning the type in rid order with checks is cheaper.
    ordered: bool = False


def _in(column: str, values: Sequence[Any]) -> SQL:
    if len(values) == 1:
        return f"{column} = ?", [values[0]]
    return f"{column} IN ({','.join('?' * len(values))})", list(values)


def _types(column: str, types: Sequence[str], all_types: bool = False) -> SQL:
    return ("1", []) if all_types else _in(column, types)


# --- criterion conditions on an index row (alias x) ---------------------------------------

def _string_cond(c: StringCriterion, col: str = "x.value", exact: str = "x.exact") -> SQL:
    if c.mode == "exact":
        return f"{exact} = ?", [c.value]
    if c.mode == "contains":
        return f"instr({col}, ?) > 0", [c.value]
    if c.mode == "phonetic":  # the stored value is the name part's code
        return f"{col} = ?", [c.value]
    return f"{col} >= ? AND {col} < ?", [c.value, c.value + _TOP]


def _token_cond(c: TokenCriterion, system: str = "x.system", code: str = "x.code",
                text: str = "x.text") -> SQL:
    if c.text is not None:
        return f"instr({text}, ?) > 0", [c.text]
    parts, args = [], []
    if c.code is not None:
        parts.append(f"{code} = ?")
        args.append(c.code)
    if c.system is not None:
        parts.append(f"{system} = ?")
        args.append(c.system)
    elif c.no_system:
        parts.append(f"{system} IS NULL")
    return " AND ".join(parts) or "1", args


def _date_cond(c: RangeCriterion, lo: str = "x.lo", hi: str = "x.hi") -> SQL:
    s_lo, s_hi = c.lo, c.hi
    match c.prefix:
        case "eq":
            # lo < hi, so the redundant bounds give either index a closed range to seek.
            return (f"{lo} >= ? AND {lo} < ? AND {hi} <= ? AND {hi} > ?",
                    [s_lo, s_hi, s_hi, s_lo])
        case "ne":
            return f"NOT ({lo} >= ? AND {hi} <= ?)", [s_lo, s_hi]
        case "gt":
            return f"{hi} > ?", [s_hi]
        case "lt":
            return f"{lo} < ?", [s_lo]
        case "ge":
            return f"{hi} > ?", [s_lo]
        case "le":
            return f"{lo} < ?", [s_hi]
        case "sa":
            return f"{lo} >= ?", [s_hi]
        case "eb":
            return f"{hi} <= ?", [s_lo]
        case _:  # ap
            wide_lo, wide_hi = approximate(s_lo, s_hi)
            return f"{lo} < ? AND {hi} > ?", [wide_hi, wide_lo]


def _point_date_cond(c: RangeCriterion, column: str) -> SQL:
    """A date comparison where the stored value is an instant (``_lastUpdated``)."""
    match c.prefix:
        case "eq":
            return f"{column} >= ? AND {column} < ?", [c.lo, c.hi]
        case "ne":
            return f"NOT ({column} >= ? AND {column} < ?)", [c.lo, c.hi]
        case "gt" | "sa":
            return f"{column} >= ?", [c.hi]
        case "lt" | "eb":
            return f"{column} < ?", [c.lo]
        case "ge":
            return f"{column} >= ?", [c.lo]
        case "le":
            return f"{column} < ?", [c.hi]
        case _:
            wide_lo, wide_hi = approximate(c.lo, c.hi)
            return f"{column} >= ? AND {column} < ?", [wide_lo, wide_hi]


def _number_cond(prefix: str, value: float, s_lo: float, s_hi: float, lo: str = "x.lo",
                 hi: str = "x.hi") -> SQL:
    """A number comparison on a stored range [lo, hi); a stored point (a composite's
    quantity or number) passes its one column as both, which keeps every condition on
    that column, so the ``(type, param, code, lo)`` index seeks the range."""
    match prefix:
        case "eq":  # lo <= hi: the redundant bound closes the range on the lo index
            return f"{lo} >= ? AND {lo} < ? AND {hi} < ?", [s_lo, s_hi, s_hi]
        case "ne":
            return f"NOT ({lo} >= ? AND {hi} < ?)", [s_lo, s_hi]
        case "gt" | "sa":
            return f"{hi} > ?", [value]
        case "lt" | "eb":
            return f"{lo} < ?", [value]
        case "ge":
            return f"{hi} >= ?", [value]
        case "le":
            return f"{lo} <= ?", [value]
        case _:  # ap: within 10% of the value
            margin = abs(value) * 0.1
            return f"{lo} <= ? AND {hi} >= ?", [value + margin, value - margin]


def _quantity_cond(c: RangeCriterion) -> SQL:
    if c.canonical is not None:  # a UCUM unit: compare in its base unit
        unit, value, lo, hi = c.canonical
        sql, args = _number_cond(c.prefix, value, lo, hi, "x.nlo", "x.nhi")
        return f"x.ncode = ? AND {sql}", [unit, *args]
    sql, args = _number_cond(c.prefix, c.value, c.lo, c.hi)
    units: list[str] = []
    unit_args: list[Any] = []
    if c.code is not None:  # not convertible: the stored normalized code is the code sent
        units.append("x.ncode = ? AND x.code = ?")
        unit_args += [c.code, c.code]
    if c.system is not None:
        units.append("x.system = ?")
        unit_args.append(c.system)
    return " AND ".join([*units, sql]), [*unit_args, *args]


def _reference_cond(c: ReferenceCriterion) -> SQL:
    if c.url is not None:
        return "x.url = ?", [c.url]
    if c.resource_type is not None:
        return "x.target_id = ? AND x.target_type = ?", [c.id, c.resource_type]
    return "x.target_id = ?", [c.id]


def _uri_cond(c: UriCriterion) -> SQL:
    if c.mode == "below":
        return "x.value >= ? AND x.value < ?", [c.value, c.value + _TOP]
    if c.mode == "above":
        prefixes = [c.value[:i] for i in range(len(c.value), 0, -1)
                    if i == len(c.value) or c.value[i] == "/"]
        return _in("x.value", prefixes)
    return "x.value = ?", [c.value]


def _composite_cond(c: CompositeCriterion) -> SQL:
    head, head_args = _token_cond(c.head)
    tail: SQL
    match c.tail_type:
        case "token":
            tail = _token_cond(c.tail, "x.vsystem", "x.vcode", "x.vcode")
        case "quantity":
            number, args = _number_cond(c.tail.prefix, c.tail.value, c.tail.lo, c.tail.hi,
                                        "x.lo", "x.lo")
            units, unit_args = [number], list(args)
            if c.tail.code is not None:
                units.append("x.vcode = ?")
                unit_args.append(c.tail.code)
            if c.tail.system is not None:
                units.append("x.vsystem = ?")
                unit_args.append(c.tail.system)
            tail = " AND ".join(units), unit_args
        case "number":
            tail = _number_cond(c.tail.prefix, c.tail.value, c.tail.lo, c.tail.hi, "x.lo", "x.lo")
        case "date":
            tail = _date_cond(c.tail)
        case "string":
            tail = _string_cond(c.tail, "x.vcode", "x.vcode")
        case "reference":
            tail = ("x.vcode = ?" + (" AND x.vsystem = ?" if c.tail.resource_type else ""),
                    [c.tail.id or c.tail.url] + ([c.tail.resource_type]
                                                 if c.tail.resource_type else []))
        case _:
            tail = "x.vcode = ?", [c.tail.value]
    return f"{head} AND {tail[0]}", [*head_args, *tail[1]]


_CONDITIONS: dict[str, Callable[[Any], SQL]] = {
    "string": _string_cond, "token": _token_cond, "date": _date_cond,
    "number": lambda c: _number_cond(c.prefix, c.value, c.lo, c.hi),
    "quantity": _quantity_cond, "reference": _reference_cond, "uri": _uri_cond,
    "composite": _composite_cond,
}


def _alias(sql: str, alias: str) -> str:
    """Conditions are written on ``x``; nested subqueries need distinct aliases, so that an
    outer ``x.rid`` is never captured by an inner table of the same name."""
    return sql.replace("x.", f"{alias}.")


def _or(parts: Sequence[SQL]) -> SQL:
    if len(parts) == 1:
        return parts[0]
    return " OR ".join(f"({p[0]})" for p in parts), [a for p in parts for a in p[1]]


def _fts_query(c: TextCriterion) -> str:
    terms = " AND ".join(f'"{t}"*' for t in c.terms)
    return f"{c.column} : ({terms})"


def _equality(clause: Clause, kind: str) -> bool:
    """One criterion comparing the lookup index's leading value column for equality."""
    if len(clause.criteria) != 1:
        return False
    criterion = clause.criteria[0]
    if kind == "token":
        return isinstance(criterion, TokenCriterion) and criterion.code is not None \
            and criterion.text is None
    if kind == "reference":
        return isinstance(criterion, ReferenceCriterion) and criterion.id is not None
    return False


def _inner_priority(inner: Compiled) -> int:
    """A chain or _has over a handful of resources (an identifier) is as selective as an
    id; over many, it is estimated last."""
    return 0 if (inner.estimate or 0) <= DRIVE_NOW else 5


# --- the compiler ------------------------------------------------------------------------

AccessCompiler = Callable[["Compiler", Sequence[AccessGrant], Sequence[str] | None],
                          "Compiled | None"]


class Compiler:
    """Compiles clauses for a set of resource types (every alias it writes is unique).

    With ``access`` (the plan's access filter), the targets of chains and ``_has`` are
    limited to what the caller may see, as the matches are: a caller cannot learn of a
    resource it may not read through a search it may run."""

    def __init__(self, conn: sqlite3.Connection, all_types: bool = False,
                 aliases: Iterator[int] | None = None,
                 access: Sequence[AccessGrant] | None = None,
                 access_compiler: AccessCompiler | None = None):
        self.conn = conn
        self.all_types = all_types
        self.aliases = aliases if aliases is not None else itertools.count(1)
        self.access = access
        self.access_compiler = access_compiler

    def restricted(self, types: Sequence[str] | None) -> Compiled | None:
        """The access filter over candidates of ``types`` (None: unrestricted)."""
        if self.access is None or self.access_compiler is None:
            return None
        return self.access_compiler(self, self.access, types)

    def alias(self, stem: str) -> str:
        return f"{stem}{next(self.aliases)}"

    def capped_count(self, source: Source, cap: int) -> int:
        sql, args = source.select()
        row = self.conn.execute(f"SELECT count(*) FROM ({sql} LIMIT ?)", [*args, cap + 1])
        return int(row.fetchone()[0])

    def clause(self, clause: Clause, types: Sequence[str]) -> Compiled:
        if clause.missing is not None:
            return self._missing(clause, types)
        handler = {
            "id": self._id, "lastUpdated": self._last_updated, "text": self._text,
            "has": self._has,
        }.get(clause.type)
        if handler is not None:
            return handler(clause, types)
        if clause.criteria and isinstance(clause.criteria[0], ChainCriterion):
            return self._chain(clause, types)
        return self._indexed(clause, types)

    # -- plain index clauses -------------------------------------------------------------
    def _indexed(self, clause: Clause, types: Sequence[str]) -> Compiled:
        params, kind = clause.index_params, clause.type
        if clause.modifier == "of-type":
            params = tuple(f"{p}:of-type" for p in params)
        if clause.modifier == "identifier":
            params, kind = tuple(f"{p}:identifier" for p in params), "token"
        table = TABLE_OF[kind]
        x = self.alias("x")
        cond, cond_args = _or([_CONDITIONS[kind](c) for c in clause.criteria])
        cond = _alias(cond, x)
        param_sql, param_args = _in(f"{x}.param", params)

        def check(rid: str) -> SQL:
            sql = (f"EXISTS (SELECT 1 FROM {table} {x} WHERE {x}.rid = {rid} AND {param_sql} "
                   f"AND ({cond}))")
            return (f"NOT {sql}" if clause.negate else sql), [*param_args, *cond_args]

        if clause.negate:
            return Compiled(None, check)
        type_sql, type_args = _types(f"{x}.type", types, self.all_types)
        source = Source(f"{table} {x}", f"{type_sql} AND {param_sql} AND ({cond})",
                        [*type_args, *param_args, *cond_args], f"{x}.rid")
        return Compiled(source, check, priority=_PRIORITY.get(kind, 2),
                        ordered=_equality(clause, kind) and len(params) == 1
                        and len(types) == 1)

    def _missing(self, clause: Clause, types: Sequence[str]) -> Compiled:
        table = TABLE_OF.get(clause.type)
        if table is None:  # _id, _lastUpdated: always present
            return Compiled(None, lambda rid: ("0" if clause.missing else "1", []))

        m = self.alias("m")
        param_sql, param_args = _in(f"{m}.param", clause.index_params)

        def check(rid: str) -> SQL:
            sql = f"EXISTS (SELECT 1 FROM {table} {m} WHERE {m}.rid = {rid} AND {param_sql})"
            return (f"NOT {sql}" if clause.missing else sql), param_args
        return Compiled(None, check)

    # -- resource columns ------------------------------------------------------------------
    def _id(self, clause: Clause, types: Sequence[str]) -> Compiled:
        ids = [c.code for c in clause.criteria if isinstance(c, TokenCriterion) and c.code]
        r = self.alias("r")
        cond, args = _in(f"{r}.id", ids)
        if clause.negate:
            return Compiled(None, lambda rid: (
                f"NOT EXISTS (SELECT 1 FROM resources {r} WHERE {r}.rid = {rid} AND {cond})",
                args))
        type_sql, type_args = _types(f"{r}.type", types, self.all_types)
        source = Source(f"resources {r}", f"{type_sql} AND {r}.deleted = 0 AND {cond}",
                        [*type_args, *args], f"{r}.rid")
        return Compiled(source, lambda rid: (
            f"EXISTS (SELECT 1 FROM resources {r} WHERE {r}.rid = {rid} AND {cond})", args),
            priority=0)

    def _last_updated(self, clause: Clause, types: Sequence[str]) -> Compiled:
        r = self.alias("r")
        cond, args = _or([_point_date_cond(c, f"{r}.last_updated") for c in clause.criteria])
        type_sql, type_args = _types(f"{r}.type", types, self.all_types)
        source = Source(f"resources {r}", f"{type_sql} AND {r}.deleted = 0 AND ({cond})",
                        [*type_args, *args], f"{r}.rid")
        return Compiled(source, lambda rid: (
            f"EXISTS (SELECT 1 FROM resources {r} WHERE {r}.rid = {rid} AND ({cond}))", args),
            priority=4)

    def _text(self, clause: Clause, types: Sequence[str]) -> Compiled:
        queries = [_fts_query(c) for c in clause.criteria]
        match = " OR ".join(f"({q})" for q in queries)
        inner = "SELECT rowid FROM idx_text WHERE idx_text MATCH ?"
        r = self.alias("r")
        type_sql, type_args = _types(f"{r}.type", types, self.all_types)
        source = Source(f"resources {r}",
                        f"{type_sql} AND {r}.deleted = 0 AND {r}.rid IN ({inner})",
                        [*type_args, match], f"{r}.rid")
        return Compiled(source, lambda rid: (f"{rid} IN ({inner})", [match]), priority=3)

    # -- chains and _has ---------------------------------------------------------------------
    def _inner(self, clause: Clause, types: Sequence[str]) -> tuple[Compiled, bool]:
        """Compile an inner clause (limited to what the caller may see); ``small`` when
        few enough resources match to list them."""
        inner = Compiler(self.conn, aliases=self.aliases, access=self.access,
                         access_compiler=self.access_compiler).clause(clause, types)
        allowed = self.restricted(types)
        if allowed is not None:
            inner = _both(inner, allowed)
        if inner.source is None:
            return inner, False
        inner.estimate = self.capped_count(inner.source, ESTIMATE_CAP)
        return inner, inner.estimate <= ESTIMATE_CAP

    def _chain(self, clause: Clause, types: Sequence[str]) -> Compiled:
        chain: ChainCriterion = clause.criteria[0]
        inner, small = self._inner(chain.clause, chain.target_types)
        x, t = self.alias("x"), self.alias("t")
        targets_sql, targets_args = _in(f"{x}.target_type", chain.target_types)
        param_sql, param_args = _in(f"{x}.param", clause.index_params)
        # Check form, correlated on the referenced resource: works however broad the
        # inner search is, and costs one lookup per candidate.
        target_check, target_args = inner.check(f"{t}.rid")
        correlated = (f"{targets_sql} AND EXISTS (SELECT 1 FROM resources {t} WHERE "
                      f"{t}.type = {x}.target_type AND {t}.id = {x}.target_id AND "
                      f"{t}.deleted = 0 AND {target_check})")

        def check(rid: str) -> SQL:
            return (f"EXISTS (SELECT 1 FROM idx_reference {x} WHERE {x}.rid = {rid} AND "
                    f"{param_sql} AND {correlated})",
                    [*param_args, *targets_args, *target_args])

        if not small or inner.source is None:
            return Compiled(None, check)  # too broad inside to list: check each candidate
        inner_sql, inner_args = inner.source.select()
        type_sql, type_args = _types(f"{x}.type", types, self.all_types)
        source = Source(
            f"idx_reference {x}",
            f"{x}.target_id IN (SELECT {t}.id FROM resources {t} WHERE {t}.rid IN "
            f"({inner_sql})) AND {type_sql} AND {param_sql} AND {targets_sql}",
            [*inner_args, *type_args, *param_args, *targets_args], f"{x}.rid")
        return Compiled(source, check, priority=_inner_priority(inner), countable=False)

    def _has(self, clause: Clause, types: Sequence[str]) -> Compiled:
        has: HasCriterion = clause.criteria[0]
        inner, small = self._inner(has.clause, (has.resource_type,))
        x, r = self.alias("x"), self.alias("r")
        pointed_sql, pointed_args = _in(f"{x}.target_type", types)
        inner_check, inner_args = inner.check(f"{x}.rid")
        # Check form: the references to this candidate (by its id), filtered by the inner
        # search; a few index lookups per candidate however many resources match inside.
        where = (f"{x}.type = ? AND {x}.param = ? AND {pointed_sql}")
        where_args = [has.resource_type, has.reference_param, *pointed_args]

        def check(rid: str) -> SQL:
            return (f"EXISTS (SELECT 1 FROM idx_reference {x} WHERE {x}.target_id = "
                    f"(SELECT {r}.id FROM resources {r} WHERE {r}.rid = {rid}) AND {where} "
                    f"AND {inner_check})", [*where_args, *inner_args])

        if not small or inner.source is None:
            return Compiled(None, check)  # too broad inside to list: check each candidate
        inner_sql, args = inner.source.select()
        type_sql, type_args = _types(f"{r}.type", types, self.all_types)
        source = Source(
            f"resources {r}",
            f"{type_sql} AND {r}.deleted = 0 AND {r}.id IN (SELECT {x}.target_id FROM "
            f"idx_reference {x} WHERE {where} AND {x}.rid IN ({inner_sql}))",
            [*type_args, *where_args, *args], f"{r}.rid")
        # At most one target per inner match: the inner count bounds this one, and counting
        # the set itself would evaluate the whole inner search again.
        return Compiled(source, check, estimate=inner.estimate, priority=_inner_priority(inner),
                        countable=False)

    # -- compartments --------------------------------------------------------------------------
    def compartment(self, plan: SearchPlan) -> Compiled:
        assert plan.compartment is not None
        comp = plan.compartment
        pairs = [(t, p) for t, params in comp.members.items() if t in plan.resource_types
                 for p in params] or [("", "")]  # nothing of these types can be a member
        x, r, c = self.alias("x"), self.alias("r"), self.alias("c")
        values = ",".join("(?, ?)" for _ in pairs)
        member = (f"{x}.target_id = ? AND {x}.target_type = ? AND ({x}.type, {x}.param) IN "
                  f"(VALUES {values})")
        member_args = [comp.owner_id, comp.owner_type, *[v for pair in pairs for v in pair]]
        owner, owner_args = "", []
        if comp.include_owner and comp.owner_type in plan.resource_types:
            owner = (f" UNION SELECT {r}.rid FROM resources {r} WHERE {r}.type = ? AND "
                     f"{r}.id = ? AND {r}.deleted = 0")
            owner_args = [comp.owner_type, comp.owner_id]
        source = Source(f"(SELECT {x}.rid AS rid FROM idx_reference {x} WHERE {member}{owner}) "
                        f"{c}", "1", [*member_args, *owner_args], f"{c}.rid")

        def check(rid: str) -> SQL:
            sql = (f"EXISTS (SELECT 1 FROM idx_reference {x} WHERE {x}.rid = {rid} AND "
                   f"{member})")
            if owner:
                sql = (f"({sql} OR EXISTS (SELECT 1 FROM resources {r} WHERE {r}.rid = {rid} "
                       f"AND {r}.type = ? AND {r}.id = ?))")
            return sql, [*member_args, *owner_args]
        return Compiled(source, check, priority=0)


def _both(first: Compiled, second: Compiled) -> Compiled:
    """Candidates matching both (the first's source, narrowed by the second's check)."""
    def check(rid: str) -> SQL:
        a, b = first.check(rid), second.check(rid)
        return f"({a[0]}) AND ({b[0]})", [*a[1], *b[1]]
    if first.source is None:
        return Compiled(None, check, priority=first.priority, countable=first.countable)
    source = first.source
    narrowed, narrow_args = second.check(source.rid)
    return Compiled(Source(source.from_sql, f"{source.where} AND {narrowed}",
                           [*source.args, *narrow_args], source.rid), check,
                    priority=first.priority, countable=first.countable, ordered=first.ordered)


# --- sort keys -----------------------------------------------------------------------------

_SORT_COLUMNS = {  # type → (table, ascending column, descending column, row filter)
    "date": ("idx_date", "{a}.lo", "{a}.hi", ""),
    "string": ("idx_string", "{a}.value", "{a}.value", ""),
    "token": ("idx_token", "{a}.code", "{a}.code", " AND {a}.code IS NOT NULL"),
    "uri": ("idx_uri", "{a}.value", "{a}.value", ""),
    "number": ("idx_number", "{a}.lo", "{a}.hi", ""),
    "quantity": ("idx_quantity", "{a}.lo", "{a}.hi", ""),
    "reference": ("idx_reference", "{a}.target_type || '/' || coalesce({a}.target_id, {a}.url)",
                  "{a}.target_type || '/' || coalesce({a}.target_id, {a}.url)", ""),
}
# Sort types whose index can stream a large result in order (see the module docstring).
_STREAMABLE = {"date", "string", "token", "uri", "id", "lastUpdated"}


def _sort_key_sql(key: SortKey, rid: str) -> SQL:
    if key.type == "id":
        return f"(SELECT id FROM resources WHERE rid = {rid})", []
    if key.type == "lastUpdated":
        return f"(SELECT last_updated FROM resources WHERE rid = {rid})", []
    table, asc, desc, extra = _SORT_COLUMNS[key.type]
    column = f"max({desc})" if key.descending else f"min({asc})"
    param_sql, param_args = _in("s.param", key.index_params)
    return (f"(SELECT {column.format(a='s')} FROM {table} s WHERE s.rid = {rid} AND "
            f"{param_sql}{extra.format(a='s')})", param_args)


def _after(terms: Sequence[tuple[str, bool]], values: Sequence[Any], backwards: bool) -> SQL:
    """Strictly after ``values`` in the lexicographic order of ``terms`` (expr, descending)."""
    ors, args = [], []
    for i, (expr, descending) in enumerate(terms):
        op = ">" if descending == backwards else "<"
        equal = [f"{terms[j][0]} = ?" for j in range(i)]
        ors.append("(" + " AND ".join([*equal, f"{expr} {op} ?"]) + ")")
        args.extend([*values[:i], values[i]])
    return " OR ".join(ors), args


# --- the executor --------------------------------------------------------------------------


class SQLiteIncludes:
    """The primitives of :mod:`fhir_server.store.includes` on this adapter: rids as keys,
    each query under the searcher's budget."""

    def __init__(self, searcher: SQLiteSearch):
        self.searcher = searcher

    async def forward(self, plan: SearchPlan, includes: Sequence[Include],
                      frontier: Sequence[int]) -> list[int]:
        with self.searcher.budget():
            return self.searcher.forward(plan, includes, frontier)

    async def reverse(self, plan: SearchPlan, revincludes: Sequence[Include],
                      frontier: Sequence[int]) -> list[int]:
        with self.searcher.budget():
            return self.searcher.reverse(plan, revincludes, frontier)

    async def fetch(self, keys: Sequence[int]) -> list[StoredResource]:
        return [resource for _rid, resource in self.searcher.fetch(keys)]

@dataclass
class _Query:
    plan: SearchPlan
    compiled: list[Compiled]
    driver: Compiled | None = None
    exact_small: bool = False  # the driver's estimate is an exact count within the cap
    empty: bool = False


class SQLiteSearch:
    """Runs search plans on the store's connection (synchronously, like every call)."""

    def __init__(self, conn: sqlite3.Connection,
                 fetch: Callable[[Sequence[int]], list[tuple[int, StoredResource]]],
                 access_compiler: AccessCompiler | None = None):
        self.conn = conn
        self.fetch = fetch
        self.access_compiler = access_compiler

    @contextmanager
    def budget(self) -> Iterator[None]:
        steps = 0

        def tick() -> int:
            nonlocal steps
            steps += _BUDGET_STEP
            return 1 if steps > SEARCH_BUDGET else 0
        self.conn.set_progress_handler(tick, _BUDGET_STEP)
        try:
            yield
        except sqlite3.OperationalError as exc:
            if "interrupted" in str(exc):
                raise SearchTooCostly(
                    "The search would examine too many resources; add more selective "
                    "parameters") from None
            raise
        finally:
            self.conn.set_progress_handler(None, 0)

    # -- planning ----------------------------------------------------------------------------
    def prepare(self, plan: SearchPlan) -> _Query:
        compiler = Compiler(self.conn, plan.all_types, access=plan.access,
                            access_compiler=self.access_compiler)
        compiled = [compiler.clause(c, plan.resource_types) for c in plan.clauses]
        if plan.compartment is not None:
            compiled.append(compiler.compartment(plan))
        allowed = compiler.restricted(None if plan.all_types else plan.resource_types)
        if allowed is not None:
            compiled.append(allowed)
        query = _Query(plan, compiled)
        drivers: list[Compiled] = []
        for candidate in sorted((c for c in compiled if c.source is not None),
                                key=lambda c: c.priority):
            assert candidate.source is not None
            if candidate.estimate is None:
                candidate.estimate = compiler.capped_count(candidate.source, ESTIMATE_CAP)
            if candidate.estimate == 0:
                query.empty = True
                return query
            drivers.append(candidate)
            if candidate.estimate <= DRIVE_NOW:
                break
        if drivers:
            best = min(drivers, key=lambda c: c.estimate or 0)
            small = (best.estimate or 0) <= ESTIMATE_CAP
            if small or best.ordered:
                query.driver = best
                query.exact_small = small and best.countable
            return query
        # Every resource of the type(s) is a candidate: small tables are small results.
        query.exact_small = compiler.capped_count(self.base_source(plan),
                                                  ESTIMATE_CAP) <= ESTIMATE_CAP
        return query

    def base_source(self, plan: SearchPlan) -> Source:
        type_sql, type_args = _types("r.type", plan.resource_types, plan.all_types)
        return Source("resources r", f"{type_sql} AND r.deleted = 0", type_args, "r.rid")

    def _source_and_checks(self, query: _Query) -> tuple[Source, SQL]:
        source = (query.driver.source if query.driver is not None and query.driver.source
                  is not None else self.base_source(query.plan))
        return source, self._checks(query, source.rid, exclude=query.driver)

    @staticmethod
    def _checks(query: _Query, rid: str, exclude: Compiled | None = None) -> SQL:
        parts = [c.check(rid) for c in query.compiled if c is not exclude]
        if not parts:
            return "1", []
        return " AND ".join(p[0] for p in parts), [a for p in parts for a in p[1]]

    # -- entry points ----------------------------------------------------------------------
    def search(self, plan: SearchPlan) -> tuple[SearchPage, list[int]]:
        """One page of matches (the includes come after, see ``SQLiteIncludes``), with the
        rids of the page's resources."""
        with self.budget():
            query = self.prepare(plan)
            if query.empty:
                return SearchPage([], total=0 if plan.total != "none" else None), []
            if plan.count == 0 or plan.summary == "count":
                return SearchPage([], total=self.count(query)), []
            if plan.sort:
                rows, more = self._sorted_rows(query)
            else:
                rows, more = self._rid_rows(query)
            page = self._page(query, rows, more)
            page.total = self._total(query, page)
            return page, [r[-1] for r in rows]

    def match_ids(self, plan: SearchPlan, limit: int, hidden: AbstractSet[int] = frozenset()
                  ) -> list[str]:
        """Ids of up to ``limit`` current resources matching ``plan`` (conditionals),
        leaving out the resources whose rids are ``hidden``."""
        direct = _token_match(plan)
        if direct is not None:  # the usual condition: one index lookup, nothing to plan
            sql, args = direct
            hits = self.conn.execute(sql, [*args, limit + len(hidden)]).fetchall()
            return sorted(i for rid, i in hits if rid not in hidden)[:limit]
        with self.budget():
            query = self.prepare(plan)
            if query.empty:
                return []
            source, (checks, check_args) = self._source_and_checks(query)
            sql, args = source.select(f"DISTINCT {source.rid}")
            rows = self.conn.execute(f"{sql} AND {checks} LIMIT ?",
                                     [*args, *check_args, limit + len(hidden)])
            rids = [r[0] for r in rows if r[0] not in hidden][:limit]
        if not rids:
            return []
        found = self.conn.execute(
            f"SELECT id FROM resources WHERE rid IN ({','.join('?' * len(rids))})", rids)
        return sorted(r[0] for r in found)

    def match_ids_many(self, plans: Sequence[SearchPlan], limit: int) -> list[list[str]]:
        """``match_ids`` of each plan, in order. Plans of one plain token clause (what the
        conditional entries of a transaction or an HL7 message carry, a dozen or more at
        once) are answered together, a statement per ``_TRIPLES_PER_STATEMENT``; any
        other plan on its own."""
        answers: list[list[str] | None] = [None] * len(plans)
        plain = [(i, p) for i, p in enumerate(plans)
                 if plain_token_plan(p)]
        for start in range(0, len(plain), _TRIPLES_PER_STATEMENT):
            chunk = plain[start:start + _TRIPLES_PER_STATEMENT]
            triples = sorted({(p.resource_types[0], param, c.code)
                              for _i, p in chunk for param in p.clauses[0].index_params
                              for c in p.clauses[0].criteria})
            # A code shared by many resources (a condition on a common code) would bring
            # them all: past a few rows per condition, each is asked on its own (LIMIT).
            cap = len(triples) * (limit + 8)
            rows = self.conn.execute(f"{_TOKEN_TRIPLES} LIMIT ?",
                                     (orjson.dumps(triples).decode(), cap)).fetchall()
            if len(rows) >= cap:
                continue
            found: dict[tuple[str, str, str], list[tuple[str, str | None]]] = {}
            for resource_id, resource_type, param, system, code in rows:
                found.setdefault((resource_type, param, code), []).append(
                    (resource_id, system))
            for i, p in chunk:
                clause, resource_type = p.clauses[0], p.resource_types[0]
                hits = {resource_id for c in clause.criteria for param in clause.index_params
                        for resource_id, system in found.get((resource_type, param, c.code), ())
                        if system_matches(c, system)}
                answers[i] = sorted(hits)[:limit]
        return [answer if answer is not None else self.match_ids(plans[i], limit)
                for i, answer in enumerate(answers)]

    def count(self, query: _Query) -> int:
        if query.empty:
            return 0
        source, (checks, check_args) = self._source_and_checks(query)
        sql, args = source.select(f"DISTINCT {source.rid}")
        return int(self.conn.execute(f"SELECT count(*) FROM ({sql} AND {checks})",
                                     [*args, *check_args]).fetchone()[0])

    def _total(self, query: _Query, page: SearchPage) -> int | None:
        plan = query.plan
        if plan.total == "none":
            return None
        if plan.total in ("accurate", "estimate"):
            return self.count(query)
        if plan.cursor is None and page.next is None:
            return len(page.resources)  # the whole result is on this page
        if query.exact_small:
            return self.count(query)  # cheap: the driver holds at most ESTIMATE_CAP rows
        return None

    # -- default order: rid ----------------------------------------------------------------
    def _rid_rows(self, query: _Query) -> tuple[list[tuple[Any, ...]], bool]:
        plan = query.plan
        source, (checks, check_args) = self._source_and_checks(query)
        backwards = plan.cursor is not None and plan.cursor.backwards
        keyset, keyset_args = "1", list[Any]()
        if plan.cursor is not None:
            keyset, keyset_args = f"{source.rid} {'<' if backwards else '>'} ?", [
                plan.cursor.key[-1]]
        sql, args = source.select(f"DISTINCT {source.rid}")
        rows = self.conn.execute(
            f"{sql} AND {keyset} AND {checks} ORDER BY {source.rid} "
            f"{'DESC' if backwards else 'ASC'} LIMIT ? OFFSET ?",
            [*args, *keyset_args, *check_args, plan.count + 1, plan.offset]).fetchall()
        more = len(rows) > plan.count
        rows = rows[:plan.count]
        if backwards:
            rows.reverse()
        return [(r[0],) for r in rows], more

    # -- _sort --------------------------------------------------------------------------------
    def _sorted_rows(self, query: _Query) -> tuple[list[tuple[Any, ...]], bool]:
        plan = query.plan
        streamable = (len(plan.sort) == 1 and plan.sort[0].type in _STREAMABLE
                      and len(plan.sort[0].index_params) == 1
                      and (len(plan.resource_types) == 1 and not plan.all_types))
        if query.exact_small or not streamable:
            if not query.exact_small:
                source, (checks, check_args) = self._source_and_checks(query)
                sql, args = source.select(f"DISTINCT {source.rid}")
                big = self.conn.execute(f"SELECT count(*) FROM ({sql} AND {checks} LIMIT ?)",
                                        [*args, *check_args, MATERIALIZE_MAX + 1]).fetchone()[0]
                if big > MATERIALIZE_MAX:
                    raise InvalidSearch(
                        f"More than {MATERIALIZE_MAX} resources match; sorting that many by "
                        f"{', '.join(k.param for k in plan.sort)} needs more selective "
                        "parameters (or sort by one date, string or token parameter)")
            return self._materialized_sort(query)
        return self._streamed_sort(query)

    def _materialized_sort(self, query: _Query) -> tuple[list[tuple[Any, ...]], bool]:
        plan = query.plan
        source, (checks, check_args) = self._source_and_checks(query)
        sql, args = source.select(f"DISTINCT {source.rid}")
        keys = [_sort_key_sql(k, "m.rid") for k in plan.sort]
        key_columns = ", ".join(f"{k[0]} AS k{i}" for i, k in enumerate(keys))
        key_args = [a for k in keys for a in k[1]]
        terms: list[tuple[str, bool]] = []
        for i, key in enumerate(plan.sort):
            terms += [(f"(k{i} IS NULL)", False), (f"coalesce(k{i}, 0)", key.descending)]
        terms.append(("rid", plan.sort[0].descending))
        backwards = plan.cursor is not None and plan.cursor.backwards
        keyset, keyset_args = "1", list[Any]()
        if plan.cursor is not None:
            if len(plan.cursor.key) != len(terms):
                raise InvalidSearch("_cursor does not belong to this _sort")
            keyset, keyset_args = _after(terms, plan.cursor.key, backwards)
        order = ", ".join(f"{expr} {'DESC' if desc != backwards else 'ASC'}"
                          for expr, desc in terms)
        select = ", ".join(expr for expr, _ in terms)
        rows = self.conn.execute(
            f"WITH m(rid) AS ({sql} AND {checks}), "
            f"k AS (SELECT m.rid AS rid, {key_columns} FROM m) "
            f"SELECT {select} FROM k WHERE {keyset} ORDER BY {order} LIMIT ? OFFSET ?",
            [*args, *check_args, *key_args, *keyset_args, plan.count + 1,
             plan.offset]).fetchall()
        more = len(rows) > plan.count
        rows = rows[:plan.count]
        if backwards:
            rows.reverse()
        return [tuple(r) for r in rows], more

    def _streamed_sort(self, query: _Query) -> tuple[list[tuple[Any, ...]], bool]:
        """One sort key over a large result: walk the sort column's index in order."""
        plan = query.plan
        key = plan.sort[0]
        backwards = plan.cursor is not None and plan.cursor.backwards
        wanted = plan.offset + plan.count + 1
        phases = [0, 1]
        start_phase = 0
        if plan.cursor is not None:
            if len(plan.cursor.key) != 3:
                raise InvalidSearch("_cursor does not belong to this _sort")
            start_phase = int(plan.cursor.key[0])
        order = phases[start_phase:] if not backwards else phases[:start_phase + 1][::-1]
        rows: list[tuple[Any, ...]] = []
        for phase in order:
            cursor = plan.cursor.key if plan.cursor is not None and phase == start_phase \
                else None
            rows += self._stream_phase(query, key, phase, cursor, backwards, wanted - len(rows))
            if len(rows) >= wanted:
                break
        rows = rows[plan.offset:]
        more = len(rows) > plan.count
        rows = rows[:plan.count]
        if backwards:
            rows.reverse()
        return rows, more

    def _stream_phase(self, query: _Query, key: SortKey, phase: int,
                      cursor: Sequence[Any] | None, backwards: bool, limit: int
                      ) -> list[tuple[Any, ...]]:
        plan = query.plan
        descending = key.descending != backwards
        direction = "DESC" if descending else "ASC"
        op = "<" if descending else ">"
        resource_type = plan.resource_type
        if key.type in ("id", "lastUpdated"):
            if phase == 1:
                return []  # every resource has an id and a lastUpdated
            column = "r.id" if key.type == "id" else "r.last_updated"
            checks, check_args = self._checks(query, "r.rid")
            keyset, keyset_args = "1", list[Any]()
            if cursor is not None:
                keyset, keyset_args = f"({column}, r.rid) {op} (?, ?)", [cursor[1], cursor[2]]
            rows = self.conn.execute(
                f"SELECT r.rid, {column} FROM resources r WHERE r.type = ? AND r.deleted = 0 "
                f"AND {keyset} AND {checks} ORDER BY {column} {direction}, r.rid {direction} "
                "LIMIT ?", [resource_type, *keyset_args, *check_args, limit]).fetchall()
            return [(0, r[1], r[0]) for r in rows]
        table, asc, desc, extra_template = _SORT_COLUMNS[key.type]
        column = (desc if key.descending else asc).removeprefix("{a}.")
        extra = extra_template.format(a="s")
        if phase == 1:
            checks, check_args = self._checks(query, "r.rid")
            keyset, keyset_args = "1", list[Any]()
            if cursor is not None:
                keyset, keyset_args = f"r.rid {op} ?", [cursor[2]]
            rows = self.conn.execute(
                f"SELECT r.rid FROM resources r WHERE r.type = ? AND r.deleted = 0 AND {keyset} "
                f"AND NOT EXISTS (SELECT 1 FROM {table} s WHERE s.rid = r.rid AND s.param = ?"
                f"{extra}) AND {checks} ORDER BY r.rid {direction} LIMIT ?",
                [resource_type, *keyset_args, key.index_params[0], *check_args, limit]
            ).fetchall()
            return [(1, 0, r[0]) for r in rows]
        checks, check_args = self._checks(query, "x.rid")
        keyset, keyset_args = "1", list[Any]()
        if cursor is not None:
            keyset, keyset_args = f"(x.{column}, x.rid) {op} (?, ?)", [cursor[1], cursor[2]]
        better = ">" if key.descending else "<"
        # Keep each resource once, at its sort value (its highest for a descending sort).
        first = (f"NOT EXISTS (SELECT 1 FROM {table} s WHERE s.rid = x.rid AND s.param = x.param"
                 f"{extra} AND (s.{column} {better} x.{column} OR (s.{column} = x.{column} "
                 "AND s.rowid < x.rowid)))")
        rows = self.conn.execute(
            f"SELECT x.rid, x.{column} FROM {table} x WHERE x.type = ? AND x.param = ? "
            f"{extra_template.format(a='x')} AND {keyset} AND {first} AND {checks} "
            f"ORDER BY x.{column} {direction}, x.rid {direction} LIMIT ?",
            [resource_type, key.index_params[0], *keyset_args, *check_args, limit]).fetchall()
        return [(0, r[1], r[0]) for r in rows]

    # -- pages ------------------------------------------------------------------------------
    def _page(self, query: _Query, rows: list[tuple[Any, ...]], more: bool) -> SearchPage:
        plan = query.plan
        resources = [resource for _rid, resource in self.fetch([r[-1] for r in rows])]
        backwards = plan.cursor is not None and plan.cursor.backwards
        page = SearchPage(resources)
        if rows:
            last, first = tuple(rows[-1]), tuple(rows[0])
            # Paging backwards we came from the page after this one, so it has a next;
            # paging forwards from a cursor, there is a page before.
            if backwards or more:
                page.next = Cursor(last)
            if (backwards and more) or (plan.cursor is not None and not backwards):
                page.previous = Cursor(first, backwards=True)
        return page

    # -- _include / _revinclude -----------------------------------------------------------------
    # -- _include / _revinclude: the primitives of fhir_server.store.includes -----------
    def _allowed(self, plan: SearchPlan, rid: str) -> SQL:
        """The plan's access filter on an included resource (of any type)."""
        if plan.access is None or self.access_compiler is None:
            return "1", []
        compiled = self.access_compiler(Compiler(self.conn), plan.access, None)
        return compiled.check(rid) if compiled is not None else ("1", [])

    def forward(self, plan: SearchPlan, includes: Sequence[Include], frontier: Sequence[int]
                ) -> list[int]:
        if not includes or not frontier:
            return []
        rids: list[int] = []
        sources, source_args = _in("x.rid", frontier)
        allowed, allowed_args = self._allowed(plan, "t.rid")
        for include in includes:
            where = [sources, "x.type = ?", "x.target_id IS NOT NULL", allowed]
            args: list[Any] = [*source_args, include.source_type, *allowed_args]
            if include.param != "*":
                param_sql, param_args = _in("x.param", include.stored or (include.param,))
                where.append(param_sql)
                args += param_args
            if include.target_type:
                where.append("x.target_type = ?")
                args.append(include.target_type)
            rows = self.conn.execute(
                "SELECT DISTINCT t.rid FROM idx_reference x JOIN resources t "
                "ON t.type = x.target_type AND t.id = x.target_id "
                f"WHERE {' AND '.join(where)} AND t.deleted = 0 LIMIT ?",
                [*args, includes_module.MAX_INCLUDED + 1]).fetchall()
            rids += [r[0] for r in rows]
        return rids

    def reverse(self, plan: SearchPlan, revincludes: Sequence[Include],
                frontier: Sequence[int]) -> list[int]:
        if not revincludes or not frontier:
            return []
        where_rids, rid_args = _in("rid", frontier)
        targets = self.conn.execute(f"SELECT type, id FROM resources WHERE {where_rids}",
                                    rid_args).fetchall()
        rids: list[int] = []
        for include in revincludes:
            wanted = [(kind, rid) for kind, rid in targets
                      if include.target_type in (None, kind)]
            if not wanted:
                continue
            ids, id_args = _in("x.target_id", [rid for _kind, rid in wanted])
            kinds, kind_args = _in("x.target_type", sorted({kind for kind, _rid in wanted}))
            allowed, allowed_args = self._allowed(plan, "x.rid")
            where, args = [ids, kinds, "x.type = ?", allowed], [
                *id_args, *kind_args, include.source_type, *allowed_args]
            if include.param != "*":
                param_sql, param_args = _in("x.param", include.stored or (include.param,))
                where.append(param_sql)
                args += param_args
            rows = self.conn.execute(
                f"SELECT DISTINCT x.rid FROM idx_reference x WHERE {' AND '.join(where)} LIMIT ?",
                [*args, includes_module.MAX_INCLUDED + 1]).fetchall()
            rids += [r[0] for r in rows]
        return rids


def _token_match(plan: SearchPlan) -> SQL | None:
    """The query for a plan of one plain token clause (``identifier=system|value``,
    ``code=a,b``...) on one type, what almost every conditional write carries: rows of
    the token index joined to their resources, ``LIMIT ?`` left to bind. None for any
    other plan (planned as a search)."""
    if not plain_token_plan(plan):
        return None
    clause = plan.clauses[0]
    alternatives, args = [], []
    for c in clause.criteria:
        cond, cond_args = _token_cond(c)
        alternatives.append(f"({cond})")
        args.extend(cond_args)
    params = clause.index_params
    sql = ("SELECT DISTINCT r.rid, r.id FROM idx_token x JOIN resources r ON r.rid = x.rid "
           f"WHERE x.type = ? AND x.param IN ({', '.join('?' * len(params))}) "
           f"AND ({' OR '.join(alternatives)}) AND r.deleted = 0 LIMIT ?")
    return sql, [plan.resource_types[0], *params, *args]


# Token rows with their resource ids, for (type, param, code) triples listed as JSON:
# exact lookups in the (type, param, code) index, one statement for many conditions.
_TOKEN_TRIPLES = (
    "SELECT r.id, x.type, x.param, x.system, x.code "
    "FROM json_each(?) w JOIN idx_token x ON x.type = w.value ->> 0 "
    "AND x.param = w.value ->> 1 AND x.code = w.value ->> 2 "
    "JOIN resources r ON r.rid = x.rid WHERE r.deleted = 0")
# Conditions answered per statement (a transaction may carry thousands).
_TRIPLES_PER_STATEMENT = 500
