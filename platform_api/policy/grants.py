"""The relations of the access policy, and the grants they compile to for one caller.

A relation says why a caller may reach a resource. Each one compiles, for a
:class:`~platform_api.policy.subject.Subject` and an action, to
:class:`~fhir_server.access.Grant`\\ s, which the FHIR server uses both as a check on one
resource and as search criteria (see :mod:`fhir_server.access`):

- ``platform-admin``: SUPER:ADMIN and APP:ADMIN signed in as themselves: everything;
- ``member``: a member of the organization that owns the resource, for the resource
  types their ``ORG:<ROLE>`` allows (``roles.ROLE_PERMISSIONS``);
- ``self``: the caller's own Patient record and its compartment, as ``PATIENT`` allows;
- ``consent``: the compartment of a patient who consented to share with the caller's
  organization (or Practitioner record), as the caller's role there allows;
- ``everyone``: what any signed-in user may reach (directories, definitions).

Deny by default: what no relation grants, nobody but a platform administrator reaches.
An API key acts for its owner within its scopes (``<Type>:read``/``<Type>:write`` on
/fhir; on /api the route's own scope was checked by the access table) and never with its
owner's administrator powers. A SMART token narrows the same grants by its scopes (a
:class:`Narrowing`, see :mod:`platform_api.policy.smart`).

``search`` (searches, type and system history) is compiled from the ``read`` relations;
only a narrowing (SMART's ``.s`` vs ``.r``) tells the two apart.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass, field
from typing import Protocol

from fhir_server.access import ACTIONS, CREATE, READ, SEARCH, Grant
from fhir_server.validation import resource_types
from platform_api.policy.roles import EVERYONE, PATIENT, types_for
from platform_api.policy.subject import USER_SYSTEM, Subject

# Type-level limits on top of the relations (API-key scopes): a function of
# (resource type, action) → allowed.
TypeFilter = Callable[[str, str], bool]


class Narrowing(Protocol):
    """Limits on top of the relations that may also confine grants to compartments or
    token values (SMART scopes): each relation grant becomes the grants it lets through."""

    @property
    def key(self) -> Hashable:
        """What the narrowed grants depend on besides the subject (cache key)."""
        ...

    def narrow(self, grants: list[Grant], action: str) -> list[Grant]: ...

    def explain(self, action: str, resource_type: str) -> str:
        """What the narrowing lacks for ``action`` on the type (``""``: nothing)."""
        ...

_UNSET = object()
PLATFORM_ADMIN, MEMBER, SELF, CONSENT, EVERYONE_RELATION = (
    "platform-admin", "member", "self", "consent", "everyone")
# A practitioner consented to directly, with no organization role to go by, may read.
CONSENTED_PRACTITIONER_ACTIONS = frozenset({READ})


def _member(subject: Subject, action: str) -> list[Grant]:
    return [Grant(types, frozenset({org}), relation=MEMBER)
            for org, role in subject.memberships.items()
            if (types := types_for(role, action))]


def _self(subject: Subject, action: str) -> list[Grant]:
    """The user's own Patient record (the one carrying their user identifier, so they can
    create it) and, once it exists, its compartment."""
    types = types_for(PATIENT, action)
    smart = subject.principal.smart
    if not types or (smart is not None and smart.backend):  # a backend client has no record
        return []
    grants = []
    if "Patient" in types or action == CREATE:
        grants.append(Grant(frozenset({"Patient"}), identifiers=frozenset(
            {f"{USER_SYSTEM}|{subject.principal.user_id}"}), relation=SELF))
    # Without a record yet the grant admits nothing, but a search of its types answers
    # an empty result, not a refusal: the relation exists, the record does not.
    own = frozenset({subject.patient_id}) if subject.patient_id is not None else frozenset()
    # "Self" is the user's own Patient only: a Patient the master patient index linked to
    # it is in its compartment (Patient.link), but another person's record; it is reached
    # through what the user may read anyway, never through the link.
    grants.append(Grant(types - {"Patient"}, patients=own, relation=SELF))
    return grants


def _consent(subject: Subject, action: str) -> list[Grant]:
    grants = []
    for patient, granted_to in subject.consents.items():
        types: set[str] = set()
        for org in granted_to:
            if org:
                role = subject.memberships.get(org)
                types |= types_for(role, action) if role else set()
            elif action in CONSENTED_PRACTITIONER_ACTIONS:
                types |= {t for role in subject.memberships.values()
                          for t in types_for(role, action)} or types_for(PATIENT, action)
        if types:
            grants.append(Grant(frozenset(types), patients=frozenset({patient}),
                                relation=CONSENT))
    return grants


def _everyone(subject: Subject, action: str) -> list[Grant]:
    types = types_for(EVERYONE, action)
    return [Grant(types, relation=EVERYONE_RELATION)] if types else []


RELATIONS: tuple[tuple[str, Callable[[Subject, str], list[Grant]]], ...] = (
    (MEMBER, _member), (SELF, _self), (CONSENT, _consent), (EVERYONE_RELATION, _everyone),
)


def compile_grants(subject: Subject, action: str, type_filter: TypeFilter | None = None,
                   narrowing: Narrowing | None = None) -> tuple[Grant, ...] | None:
    """The caller's grants for ``action`` (``None``: unrestricted)."""
    relation_action = READ if action == SEARCH else action
    if subject.unrestricted and type_filter is None and narrowing is None:
        return None
    grants: list[Grant] = []
    if subject.unrestricted:  # an administrator under scopes: every type the scopes allow
        grants = [Grant(None, relation=PLATFORM_ADMIN)]
    else:
        for _name, relation in RELATIONS:
            grants += relation(subject, relation_action)
    if type_filter is not None:
        grants = [_narrowed(g, relation_action, type_filter) for g in grants]
    if narrowing is not None:
        grants = narrowing.narrow(grants, action)
    return _merged(g for g in grants if g.types is None or g.types)


def _narrowed(grant: Grant, action: str, allowed: TypeFilter) -> Grant:
    types = grant.types if grant.types is not None else resource_types()
    return Grant(frozenset(t for t in types if allowed(t, action)), grant.owners,
                 grant.patients, grant.identifiers, grant.relation, grant.tokens)


def _merged(grants: Iterable[Grant]) -> tuple[Grant, ...]:
    """Grants of one relation over the same types become one: a member of three
    organizations with the same role gets one grant owned by any of the three, a
    practitioner with forty consents one grant over forty compartments (one ``IN`` list
    to search instead of forty alternatives)."""
    by_owner: dict[tuple[frozenset[str] | None, str], set[str]] = {}
    by_patient: dict[tuple[frozenset[str] | None, str], set[str]] = {}
    kept: list[Grant] = []
    for grant in grants:
        key = (grant.types, grant.relation)
        if grant.identifiers is not None or grant.tokens is not None:
            if grant not in kept:
                kept.append(grant)
        elif grant.owners is not None and grant.patients is None:
            by_owner.setdefault(key, set()).update(grant.owners)
        elif grant.patients is not None and grant.owners is None:
            by_patient.setdefault(key, set()).update(grant.patients)
        elif grant not in kept:
            kept.append(grant)
    kept += [Grant(types, owners=frozenset(owners), relation=relation)
             for (types, relation), owners in by_owner.items()]
    kept += [Grant(types, patients=frozenset(patients), relation=relation)
             for (types, relation), patients in by_patient.items()]
    return tuple(kept)


@dataclass
class PolicyAccess:
    """:class:`fhir_server.access.Access` for one request: a subject's grants, computed
    once per action."""

    subject: Subject
    type_filter: TypeFilter | None = None
    narrowing: Narrowing | None = None
    _grants: dict[str, tuple[Grant, ...] | None] = field(default_factory=dict)

    def grants(self, action: str) -> tuple[Grant, ...] | None:
        found = self._grants.get(action, _UNSET)
        if found is _UNSET:
            if action not in ACTIONS:
                raise ValueError(f"unknown action {action!r}")
            if action == SEARCH and self.narrowing is None:
                found = self.grants(READ)  # the same grants: nothing tells them apart
            else:
                # Compiled once per subject (cached per user) and scopes, not per request;
                # the user's principals share the cache, so the key holds what tells them
                # apart: the kind of credential, administrator powers, scopes.
                principal = self.subject.principal
                key = (action, principal.kind, self.subject.unrestricted,
                       principal.scopes if self.type_filter else None,
                       None if self.narrowing is None else self.narrowing.key)
                found = self.subject.compiled.get(key, _UNSET)
                if found is _UNSET:
                    found = self.subject.compiled[key] = compile_grants(
                        self.subject, action, self.type_filter, self.narrowing)
            self._grants[action] = found
        return found  # type: ignore[return-value]

    def describe(self) -> str:
        kind = self.subject.principal.kind
        return {"api_key": "this API key", "smart": "this SMART token"}.get(kind, "you")

    def explain(self, action: str, resource_type: str) -> str:
        return "" if self.narrowing is None else self.narrowing.explain(action, resource_type)

    def adopting(self, organization_id: str, role: str) -> PolicyAccess:
        """This access as if the caller were already ``role`` of ``organization_id``
        (founding an organization, accepting an invitation: the membership commits in the
        same unit of work as what it lets the caller write)."""
        memberships = {**self.subject.memberships, organization_id: role}
        subject = Subject(self.subject.principal, memberships, self.subject.patient_id,
                          self.subject.practitioner_ids, self.subject.consents)
        # compiled afresh: a new subject
        return PolicyAccess(subject, self.type_filter, self.narrowing)
