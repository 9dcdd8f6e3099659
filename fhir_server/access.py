"""What a caller may see and change: the port through which the platform's access policy
reaches every FHIR interaction.

The FHIR server knows nothing of users, roles, organizations, API keys or SMART scopes.
For each request the platform builds an :class:`Access` (``platform_api.policy``) whose
one question is: *which resources may this caller read, create, update or delete?* The
answer is a set of :class:`Grant`\\ s, each admitting resources of some types that carry
one of some owner labels and/or belong to some patients' compartments. The same grants
are used two ways, so a list can never show more than a read would allow:

- as a **check** on one resource (:func:`admits`): read, vread, history of an instance,
  the current and the new content of every write, each entry of a batch or transaction;
- as **search criteria** added to a plan (``SearchPlan.access``, compiled by each store
  adapter): searches, ``_include``/``_revinclude``, chains, ``_has``, compartment
  searches, ``$everything`` and type/system history return only what the grants admit.

Reading one resource (read, vread, instance history) and searching (searches, the
conditions of conditional interactions, type and system history) are separate actions,
``read`` and ``search``, because SMART scopes tell them apart (``.r`` and ``.s``); for
every other caller the two grant the same.

Deny by default: an :class:`Access` with no grant for an action admits nothing.
:data:`SYSTEM` (the HL7 gateway, housekeeping, the platform's own bookkeeping) admits
everything; it is never handed to a request.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from fhir_server.outcome import FhirError, Issue
from fhir_server.ownership import owner_labels

JSON = dict[str, Any]

READ, SEARCH, CREATE, UPDATE, DELETE = "read", "search", "create", "update", "delete"
ACTIONS = (READ, SEARCH, CREATE, UPDATE, DELETE)


@dataclass(frozen=True, slots=True)
class TokenFilter:
    """A resource has one of ``values`` in the token search parameter ``param`` (a SMART
    granular scope such as ``Observation.rs?category=<system>|laboratory``). Values are
    written as in a search: ``system|code``, ``code`` (any system) or ``|code`` (none)."""

    param: str
    values: frozenset[str]


def split_token(value: str) -> tuple[str | None, str, bool]:
    """``(system, code, no_system)`` of a token value as a search writes it."""
    system, bar, code = value.partition("|")
    if not bar:
        return None, value, False
    return (system or None), code, not system


@dataclass(frozen=True, slots=True)
class Grant:
    """One way a caller may reach resources.

    A resource matches when its type is one of ``types`` (``None``: any type) and, for
    each of the following that is set: it carries one of the ``owners`` labels
    (``meta.security``, see :mod:`fhir_server.ownership`); it is one of the Patients in
    ``patients`` or in one of their compartments; it has one of the ``identifiers``
    (``system|value``); it passes every one of the ``tokens`` filters. A grant with none
    of them admits every resource of its types.
    """

    types: frozenset[str] | None = None
    owners: frozenset[str] | None = None
    patients: frozenset[str] | None = None
    identifiers: frozenset[str] | None = None
    relation: str = ""  # the policy relation that produced it (for messages and tests)
    tokens: tuple[TokenFilter, ...] | None = None

    def covers(self, resource_type: str) -> bool:
        return self.types is None or resource_type in self.types


class Access(Protocol):
    """The access policy as one caller's request sees it."""

    def grants(self, action: str) -> tuple[Grant, ...] | None:
        """The grants for ``action`` (read, create, update, delete); ``None`` when the
        caller is unrestricted (platform administrators, the system itself)."""
        ...

    def describe(self) -> str:
        """Who the caller is, for refusal messages (never a secret)."""
        ...

    def explain(self, action: str, resource_type: str) -> str:
        """What the caller lacks for ``action`` on ``resource_type`` beyond what the
        refusal says (a SMART scope to name), appended to refusal messages; ``""`` when
        there is nothing to add."""
        ...


class AccessDenied(FhirError):
    """The caller may not do this: HTTP 403 with an OperationOutcome ``forbidden`` (the
    /api facades answer their envelope with code ``FORBIDDEN``)."""

    def __init__(self, message: str, *expression: str):
        super().__init__(403, Issue("error", "forbidden", message, expression))


class _System:
    def grants(self, action: str) -> tuple[Grant, ...] | None:
        return None

    def describe(self) -> str:
        return "the system"

    def explain(self, action: str, resource_type: str) -> str:
        return ""


SYSTEM: Access = _System()

# Patient ids a resource belongs to (its Patient compartments); see fhir_server.compartments.
PatientsOf = Callable[[JSON], frozenset[str]]
# (system, code) of each value a resource has in a token search parameter.
TokensOf = Callable[[JSON, str], frozenset[tuple[str | None, str | None]]]


def admits(grant: Grant, resource: JSON, patients_of: PatientsOf,
           tokens_of: TokensOf | None = None) -> bool:
    """Whether ``grant`` admits ``resource`` (the check form of a grant). A grant with
    token filters admits nothing without ``tokens_of`` (fail closed)."""
    resource_type = resource.get("resourceType", "")
    if grant.types is not None and resource_type not in grant.types:
        return False
    if grant.owners is not None and grant.owners.isdisjoint(owner_labels(resource)):
        return False
    if grant.identifiers is not None and grant.identifiers.isdisjoint(identifiers(resource)):
        return False
    if grant.tokens is not None and not (tokens_of is not None and all(
            token_filter_admits(f, tokens_of(resource, f.param)) for f in grant.tokens)):
        return False
    if grant.patients is not None:
        if resource_type == "Patient" and resource.get("id") in grant.patients:
            return True
        return not grant.patients.isdisjoint(patients_of(resource))
    return True


def identifiers(resource: JSON) -> frozenset[str]:
    """``system|value`` of each of the resource's identifiers."""
    found = resource.get("identifier")
    if isinstance(found, dict):
        found = [found]
    if not isinstance(found, list):
        return frozenset()
    return frozenset(f"{i.get('system') or ''}|{i['value']}" for i in found
                     if isinstance(i, dict) and isinstance(i.get("value"), str))


def token_filter_admits(token_filter: TokenFilter,
                        values: frozenset[tuple[str | None, str | None]]) -> bool:
    """Whether one of a resource's token ``values`` matches one of the filter's (the
    search rules of R4 3.1.1.4.8: ``system|code``, ``code``, ``|code``)."""
    for value in token_filter.values:
        system, code, no_system = split_token(value)
        for found_system, found_code in values:
            if found_code != code:
                continue
            if (system is None and not no_system) or found_system == system or (
                    no_system and found_system is None):
                return True
    return False


def permits(access: Access, action: str, resource: JSON, patients_of: PatientsOf,
            tokens_of: TokensOf | None = None) -> bool:
    grants = access.grants(action)
    return grants is None or any(admits(g, resource, patients_of, tokens_of) for g in grants)


def may_touch_type(access: Access, action: str, resource_type: str) -> bool:
    """Whether any grant could admit a resource of this type (a type-level answer, for a
    clear 403 before searching a type the caller can never see)."""
    grants = access.grants(action)
    return grants is None or any(g.covers(resource_type) for g in grants)


def writable_owners(access: Access, action: str, resource_type: str) -> frozenset[str] | None:
    """The organizations this caller writes resources of this type for (what a new
    resource's inherited owners are narrowed to, see :mod:`fhir_server.ownership`).

    ``None`` when nothing narrows them: an unrestricted caller or grant, or a caller who
    writes for no organization (a patient in their own record: what they write belongs to
    whoever owns their record)."""
    grants = access.grants(action)
    if grants is None:
        return None
    owners: set[str] = set()
    for grant in grants:
        if not grant.covers(resource_type):
            continue
        if grant.owners is not None:
            owners |= grant.owners
        elif grant.patients is None and grant.identifiers is None and grant.tokens is None:
            return None
    return frozenset(owners) if owners else None


def types_granted(grants: Iterable[Grant]) -> frozenset[str] | None:
    """Every type some grant covers (``None``: any)."""
    found: set[str] = set()
    for grant in grants:
        if grant.types is None:
            return None
        found |= grant.types
    return frozenset(found)
