"""SQLite compilation of a plan's access filter (``SearchPlan.access``).

The filter is a disjunction of :class:`~fhir_server.search.plan.AccessGrant`\\ s; each
grant is a conjunction of its type and of the index lookups its conditions name:

- ``owners``: a ``_security`` token row ``urn:healthplatform:organization|<org>``;
- ``identifiers``: an ``identifier`` token row;
- ``patients``: a reference row from one of the compartment parameters of the row's type
  to one of the Patients, or the row's resource being one of those Patients;
- ``tokens``: for each filter, a token row of its parameter matching one of its values.

It compiles like any clause (:class:`~fhir_server.store.sqlite_search.Compiled`): a
*check* on a candidate rid, used for the matches, the included resources, and the targets
of chains and ``_has``; and, for the matches, a *source* the planner may drive from when
every grant can list exactly its resources through one index (a patient reading their
own record starts from their compartment, not from the whole type). A driver's own check
is left out of the query, so a source is only offered when it is exact: limited to the
searched types, one condition per grant; and never for an organization's label, which
spans about every resource of its types (the planner counting it cost a sorted page 60%
more).

``types`` are the types the candidates can have: the plan's for its matches (a grant
covering all of them needs no type condition), ``None`` for included resources.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from fhir_server.search.plan import AccessGrant, TokenCriterion
from fhir_server.store.sqlite_search import (
    SQL,
    Compiled,
    Compiler,
    Source,
    _alias,
    _in,
    _or,
    _token_cond,
)

Check = Callable[[str], SQL]
_NOTHING: Check = lambda rid: ("0", [])  # noqa: E731


@dataclass
class _Condition:
    check: Check
    source: Source  # the rids satisfying it among the searched types


def _token_rows(compiler: Compiler, param: str, criteria: Sequence[TokenCriterion],
                types: Sequence[str] | None, typed_check: bool) -> _Condition:
    x = compiler.alias("a")
    cond, cond_args = _or([_token_cond(c) for c in criteria])
    match = f"{x}.param = ? AND ({_alias(cond, x)})"
    match_args = [param, *cond_args]
    type_sql, type_args = _in(f"{x}.type", types) if types is not None else ("1", [])
    check_sql, check_args = (f"{type_sql} AND {match}", [*type_args, *match_args]) \
        if typed_check else (match, match_args)

    def check(rid: str) -> SQL:
        return (f"EXISTS (SELECT 1 FROM idx_token {x} WHERE {x}.rid = {rid} AND {check_sql})",
                check_args)
    return _Condition(check, Source(f"idx_token {x}", f"{type_sql} AND {match}",
                                    [*type_args, *match_args], f"{x}.rid"))


def _patient_rows(compiler: Compiler, grant: AccessGrant, types: Sequence[str]
                  ) -> _Condition | None:
    """In the compartment of one of the grant's patients (member types ``types``), or one
    of those Patients."""
    assert grant.patients is not None
    pairs = [(t, p) for t in types for p in grant.members.get(t, ())]
    if not grant.patients or (not pairs and "Patient" not in types):
        return None  # no patient, or nothing of these types can be in a compartment
    x, r, c = compiler.alias("a"), compiler.alias("p"), compiler.alias("c")
    checks: list[SQL] = []
    selects: list[SQL] = []
    if pairs:
        ids_sql, ids_args = _in(f"{x}.target_id", list(grant.patients))
        values = ",".join("(?, ?)" for _ in pairs)
        member = (f"{ids_sql} AND {x}.target_type = 'Patient' AND ({x}.type, {x}.param) "
                  f"IN (VALUES {values})")
        args = [*ids_args, *[v for pair in pairs for v in pair]]
        checks.append((f"EXISTS (SELECT 1 FROM idx_reference {x} WHERE {x}.rid = {{rid}} "
                       f"AND {member})", args))
        selects.append((f"SELECT {x}.rid AS rid FROM idx_reference {x} WHERE {member}", args))
    if "Patient" in types:
        own_sql, own_args = _in(f"{r}.id", list(grant.patients))
        own = f"{r}.type = 'Patient' AND {own_sql} AND {r}.deleted = 0"
        checks.append((f"EXISTS (SELECT 1 FROM resources {r} WHERE {r}.rid = {{rid}} AND "
                       f"{own})", own_args))
        selects.append((f"SELECT {r}.rid AS rid FROM resources {r} WHERE {own}", own_args))

    def check(rid: str) -> SQL:
        sql, args = _or([(p.replace("{rid}", rid), a) for p, a in checks])
        return f"({sql})", args
    union = " UNION ".join(sql for sql, _ in selects)
    return _Condition(check, Source(f"({union}) {c}", "1",
                                    [a for _, args in selects for a in args], f"{c}.rid"))


def _of_types(compiler: Compiler, types: Sequence[str]) -> Check:
    t = compiler.alias("t")
    type_sql, type_args = _in(f"{t}.type", types)

    def check(rid: str) -> SQL:
        return (f"EXISTS (SELECT 1 FROM resources {t} WHERE {t}.rid = {rid} AND {type_sql})",
                type_args)
    return check


def _grant(compiler: Compiler, grant: AccessGrant, types: Sequence[str] | None
           ) -> tuple[Check, Source | None] | None:
    """The grant's check and its exact source among ``types``; ``None`` when it admits
    none of them. A check of ``None`` (first element) means: every candidate."""
    if types is not None:
        relevant: list[str] | None = [t for t in types if grant.covers(t)]
        if not relevant:
            return None
        typed_check = len(relevant) != len(types)
    else:
        relevant = None if grant.types is None else sorted(grant.types)
        typed_check = relevant is not None
    conditions: list[_Condition] = []
    if grant.owners is not None:
        conditions.append(_token_rows(compiler, "_security", grant.owners, relevant,
                                      typed_check))
    if grant.identifiers is not None:
        conditions.append(_token_rows(compiler, "identifier", grant.identifiers, relevant,
                                      typed_check))
    if grant.patients is not None:
        members = relevant if relevant is not None else [*sorted(grant.members), "Patient"]
        found = _patient_rows(compiler, grant, members)
        if found is None:
            return None
        conditions.append(found)
    for param, criteria in grant.tokens or ():
        if not criteria:
            return None
        conditions.append(_token_rows(compiler, param, criteria, relevant, typed_check))
    if not conditions:
        if relevant is None or not typed_check:
            return _ALL, None
        return _of_types(compiler, relevant), None
    checks = [c.check for c in conditions]

    def check(rid: str) -> SQL:
        parts = [c(rid) for c in checks]
        return "(" + " AND ".join(p[0] for p in parts) + ")", [a for p in parts for a in p[1]]
    return check, conditions[0].source if len(conditions) == 1 else None


def _ALL(rid: str) -> SQL:
    return "1", []


def compile_access(compiler: Compiler, grants: Sequence[AccessGrant],
                   types: Sequence[str] | None) -> Compiled | None:
    """The access filter over candidates of ``types`` (``None``: of any type); ``None``
    when it admits every one of them (nothing to check)."""
    checks: list[Check] = []
    sources: list[Source | None] = []
    for grant in grants:
        compiled = _grant(compiler, grant, types)
        if compiled is None:
            continue
        check, source = compiled
        if check is _ALL:
            return None
        checks.append(check)
        sources.append(source)
    if not checks:
        return Compiled(None, _NOTHING, priority=0)

    def any_grant(rid: str) -> SQL:
        sql, args = _or([c(rid) for c in checks])
        return f"({sql})", args
    if types is None or any(s is None for s in sources):
        return Compiled(None, any_grant)
    selects = [s.select(f"{s.rid} AS rid") for s in sources if s is not None]
    u = compiler.alias("u")
    source = Source(f"({' UNION '.join(sql for sql, _ in selects)}) {u}", "1",
                    [a for _, args in selects for a in args], f"{u}.rid")
    return Compiled(source, any_grant, priority=2)


__all__ = ["compile_access"]
