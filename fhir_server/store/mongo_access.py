"""MongoDB compilation of a plan's access filter (``SearchPlan.access``) into a query.

The filter is a disjunction of :class:`~fhir_server.search.plan.AccessGrant`\\ s (an
``$or``); each grant a conjunction of its types and of the index rows its conditions name,
exactly as the SQLite adapter reads them (:mod:`fhir_server.store.sqlite_access`):

- ``owners``: a ``_security`` token row ``urn:healthplatform:organization|<org>``;
- ``identifiers``: an ``identifier`` token row;
- ``patients``: a reference row from one of the compartment parameters of the resource's
  type to one of the Patients, or the resource being one of those Patients.

It is part of the query of the matches, of the included resources, of the targets of
chains and ``_has``, and of the resources whose history a caller reads: never a filter
applied to what was fetched. ``types`` are the types the candidates can have (the plan's
for its matches; ``None`` for included resources, of any type).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fhir_server.search.plan import AccessGrant, TokenCriterion

Filter = dict[str, Any]
_NOTHING: Filter = {"_id": {"$in": []}}


def _in(values: Sequence[str]) -> Any:
    return values[0] if len(values) == 1 else {"$in": list(values)}


def _token_rows(param: str, criteria: Sequence[TokenCriterion]) -> Filter:
    alternatives = []
    for c in criteria:
        row: Filter = {"code": c.code} if c.code is not None else {}
        if c.system is not None:
            row["system"] = c.system
        elif c.no_system:
            row["system"] = None
        alternatives.append(row)
    match: Filter = {"param": param}
    if len(alternatives) == 1:
        match.update(alternatives[0])
    else:
        match["$or"] = alternatives
    return {"ix.token": {"$elemMatch": match}}


def _patients(grant: AccessGrant, types: Sequence[str]) -> Filter | None:
    """In the compartment of one of the grant's patients (member types ``types``), or one
    of those Patients; None when nothing of these types can be."""
    assert grant.patients is not None
    patients = list(grant.patients)
    alternatives: list[Filter] = []
    for resource_type in types:
        params = grant.members.get(resource_type, ())
        if params and patients:
            alternatives.append({"type": resource_type, "ix.reference": {"$elemMatch": {
                "param": _in(params), "target_type": "Patient",
                "target_id": {"$in": patients}}}})
    if "Patient" in types and patients:
        alternatives.append({"type": "Patient", "id": {"$in": patients}})
    if not alternatives:
        return None
    return alternatives[0] if len(alternatives) == 1 else {"$or": alternatives}


def _grant(grant: AccessGrant, types: Sequence[str] | None) -> Filter | None:
    """What the grant admits among candidates of ``types``; ``None`` when it admits none
    of them, ``{}`` when it admits them all."""
    if types is not None:
        relevant: list[str] | None = [t for t in types if grant.covers(t)]
        if not relevant:
            return None
        typed = len(relevant) != len(types)
    else:
        relevant = None if grant.types is None else sorted(grant.types)
        typed = relevant is not None
    conditions: list[Filter] = []
    if typed and relevant is not None:
        conditions.append({"type": _in(relevant)})
    if grant.owners is not None:
        conditions.append(_token_rows("_security", grant.owners))
    if grant.identifiers is not None:
        conditions.append(_token_rows("identifier", grant.identifiers))
    if grant.patients is not None:
        members = relevant if relevant is not None else [*sorted(grant.members), "Patient"]
        found = _patients(grant, members)
        if found is None:
            return None
        conditions.append(found)
    if not conditions:
        return {}
    return conditions[0] if len(conditions) == 1 else {"$and": conditions}


def access_filter(grants: Sequence[AccessGrant], types: Sequence[str] | None) -> Filter | None:
    """The access filter over candidates of ``types`` (``None``: of any type); ``None``
    when it admits every one of them (nothing to add to the query)."""
    alternatives: list[Filter] = []
    for grant in grants:
        found = _grant(grant, types)
        if found is None:
            continue
        if not found:
            return None
        alternatives.append(found)
    if not alternatives:
        return dict(_NOTHING)
    return alternatives[0] if len(alternatives) == 1 else {"$or": alternatives}


__all__ = ["access_filter"]
