"""Token matching rules every store adapter applies the same way.

A token criterion (``system|code``, ``code``, ``|code``, ``system|``) compares a stored
token's system and code; R4 3.1.1.4.8. Adapters compile these rules into their queries;
they also match the conditions of conditional writes against what a unit of work staged
but has not stored yet (in memory, in the SQLite adapter's ``_PendingIndex``) — both must
say the same, so the rules live here once.
"""

from __future__ import annotations

from fhir_server.search.plan import Clause, SearchPlan, TokenCriterion


def plain_token_plan(plan: SearchPlan) -> bool:
    """One plain token clause (see ``plain_token``) on one resource type, with no access
    filter: what almost every conditional write carries, answered by one index lookup
    (a plan with an access filter goes through the adapter's full compilation)."""
    return (len(plan.resource_types) == 1 and not plan.all_types
            and plan.compartment is None and plan.access is None
            and len(plan.clauses) == 1 and plain_token(plan.clauses[0]))


def system_matches(c: TokenCriterion, system: str | None) -> bool:
    """Whether a stored token's system satisfies the criterion, given its code matched:
    ``system|code`` that system, ``code`` any system, ``|code`` none."""
    if c.system is not None:
        return system == c.system
    return system is None if c.no_system else True


def plain_token(clause: Clause) -> bool:
    """A token clause of codes compared for equality (``system|code``, ``code``,
    ``|code``), OR-ed: no modifier, ``:not``, ``:missing``, ``:text`` or ``system|``."""
    return (clause.type == "token" and not clause.modifier and not clause.negate
            and clause.missing is None and bool(clause.criteria)
            and all(c.code is not None and c.text is None for c in clause.criteria))
