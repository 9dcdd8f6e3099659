"""SMART scopes in the access policy: one more narrowing of the same grants.

A SMART app's token (``Principal.smart``) reaches what its user's relations reach
(memberships, own record, consents, the directory; never platform administrator powers,
as an API key), narrowed by its scopes (:mod:`fhir_server.smart_scopes`):

- ``user/`` scopes: the types they name, with their granular constraints;
- ``patient/`` scopes: the same, confined to the launch patient's compartment; outside it
  only the directory and the definitions (Practitioner, Organization, Medication...),
  which hold no patient's data;
- ``system/`` scopes (backend services clients, no user): the client acts as an
  administrator of the organization it was registered for (the ``ORG:ADMIN`` row of the
  role table, for resources that organization owns, and the directory and definitions
  as any signed-in user), or on the whole platform when a platform administrator
  registered it so; its scopes narrow that.

``.r`` (read, vread, instance history) and ``.s`` (searches, type and system history)
narrow the ``read`` and ``search`` actions separately.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass

from fhir_server.access import Grant
from fhir_server.smart_scopes import (
    PATIENT,
    SYSTEM_CONTEXTS,
    USER_CONTEXTS,
    ScopeSet,
    ScopeUniverse,
    narrow,
    narrowings,
    needed_scope,
)
from platform_api.auth.principal import Principal, SmartAuthorization
from platform_api.policy.roles import CATEGORIES
from platform_api.policy.subject import Subject

# What a patient/ scope reaches outside the patient's compartment: no patient's data.
SHARED_CATEGORIES = ("directory", "definitions")
BACKEND_ROLE = "ORG:ADMIN"


def shared_types() -> frozenset[str]:
    return frozenset().union(*(CATEGORIES[c] for c in SHARED_CATEGORIES))


@dataclass(frozen=True, slots=True)
class SmartNarrowing:
    """A SMART token's scopes as a :class:`~platform_api.policy.grants.Narrowing`."""

    scopes: ScopeSet
    contexts: frozenset[str]
    patient: str | None
    universe: ScopeUniverse

    @property
    def key(self) -> Hashable:
        return ("smart", self.scopes.names, self.contexts, self.patient)

    def narrow(self, grants: list[Grant], action: str) -> list[Grant]:
        return narrow(grants, narrowings(self.scopes, action, self.contexts, self.patient,
                                         self.universe))

    def explain(self, action: str, resource_type: str) -> str:
        if not self.scopes.allows(self.contexts, action, resource_type):
            contexts = sorted(self.contexts, key=lambda c: (c != PATIENT, c))
            return (f" (its scopes do not include "
                    f"{needed_scope(contexts, action, resource_type)})")
        if not self.scopes.allows(self.contexts - {PATIENT}, action, resource_type) and \
                resource_type in self.universe.compartment_types:
            patient = f"Patient/{self.patient}" if self.patient else "no patient"
            return f" (its patient/ scopes reach only the compartment of {patient})"
        return " (outside what its scopes' constraints or its user's access allow)"


def narrowing_of(smart: SmartAuthorization, universe: ScopeUniverse) -> SmartNarrowing:
    contexts = SYSTEM_CONTEXTS if smart.backend else USER_CONTEXTS
    return SmartNarrowing(smart.scopes, contexts, smart.patient, universe)


def backend_subject(principal: Principal) -> Subject:
    """The subject of a backend services client (module docstring)."""
    smart = principal.smart
    assert smart is not None and smart.backend
    memberships = {smart.organization: BACKEND_ROLE} if smart.organization else {}
    return Subject(principal, memberships, platform_wide=smart.platform_wide)


__all__ = ["SmartNarrowing", "backend_subject", "narrowing_of", "shared_types"]
