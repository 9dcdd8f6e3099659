"""The access policy: one for /api and /fhir.

Two layers, both data:

- **routes** (:mod:`platform_api.access`, generated from the spec's operation list): who
  may call a route at all (public, signed in, platform administrators), which API-key
  scope it needs, its rate-limit class. Enforced by one middleware in front of every
  route;
- **resources** (this package): which FHIR resources a caller may read, create, update
  or delete, whichever door it comes through: a role → permission table
  (:mod:`~platform_api.policy.roles`) and named relations
  (:mod:`~platform_api.policy.grants`: platform administrator, member of the owning
  organization, self, consent, everyone), compiled per request into grants that the FHIR
  server applies to every interaction, every entry of a bundle, every search (as
  criteria, never by filtering results afterwards) and every /api facade.

``Policy.access(principal, door)`` is what a request handler asks for; SMART scopes join
as one more narrowing of the same grants (types, the launch patient's compartment, token
constraints: :mod:`~platform_api.policy.smart`).

Workflow actions (sign, dispense, book, add a member, ...) are decided by
``Policy.authorize(access, action, target)`` from the rules of
:mod:`~platform_api.policy.actions`; the platform writes what a caller may not through the
one named elevation, ``Policy.elevate(reason, on_behalf_of)``
(:mod:`~platform_api.policy.elevation`). Both tell their listeners (the audit trail):
every refusal and every elevation is recorded.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from fhir_server.access import READ, Access
from fhir_server.caller import CallerFhir
from fhir_server.service import FhirService
from fhir_server.smart_scopes import ScopeUniverse
from fhir_server.store import ResourceStore
from platform_api.auth.principal import Principal, SmartAuthorization
from platform_api.envelope import ApiError
from platform_api.policy.actions import (
    ORGANIZATION_INACTIVE,
    Relation,
    Role,
    Target,
    organizations_where,
    rule,
)
from platform_api.policy.elevation import Elevation, ElevationListener, Elevator
from platform_api.policy.grants import PolicyAccess, TypeFilter
from platform_api.policy.roles import ORG_ROLES
from platform_api.policy.smart import (
    SmartNarrowing,
    backend_subject,
    narrowing_of,
    shared_types,
)
from platform_api.policy.subject import SUBJECT_TYPES, USER_SYSTEM, Subject, SubjectLoader

FHIR_DOOR, API_DOOR = "fhir", "api"
JSON = dict[str, Any]

__all__ = ["API_DOOR", "FHIR_DOOR", "ORG_ROLES", "Elevation", "Policy", "PolicyAccess",
           "Refusal", "Subject", "Target"]


class Refusal:
    """A workflow action the policy refused: who, what, and the refusal said."""

    __slots__ = ("action", "message", "principal")

    def __init__(self, principal: Principal, action: str, message: str):
        self.principal, self.action, self.message = principal, action, message


RefusalListener = Callable[[Refusal], None]


def _key_scopes(principal: Principal) -> TypeFilter:
    """An API key's ``<Type>:read`` / ``<Type>:write`` scopes as a type filter."""
    from platform_api.access import scope_granted

    scopes = principal.scopes

    def allowed(resource_type: str, action: str) -> bool:
        verb = "read" if action == READ else "write"
        return scope_granted(scopes, f"{resource_type}:{verb}")
    return allowed


class Policy:
    """Builds each request's :class:`~fhir_server.access.Access`."""

    def __init__(self, fhir: FhirService, store: ResourceStore, *, ttl: float = 5.0):
        self.fhir = fhir
        self.subjects = SubjectLoader(fhir, store, ttl=ttl)
        fhir.add_write_listener(self.resources_written)
        self._universe: tuple[str, ScopeUniverse] | None = None
        self._backends: dict[Principal, Subject] = {}
        self._narrowings: dict[SmartAuthorization, SmartNarrowing] = {}
        self.elevator = Elevator(fhir)
        self.refusal_listeners: list[RefusalListener] = []

    # -- workflow actions ----------------------------------------------------------------
    def decide(self, access: PolicyAccess, action: str, target: Target) -> Relation | None:
        """The relation that lets the caller do ``action`` on ``target`` (None: refused)."""
        return rule(action).admits(access.subject, target)

    def authorize(self, access: PolicyAccess, action: str, target: Target) -> Relation:
        """The relation that lets the caller act, or a 403 with the action's refusal
        (recorded); ``ORGANIZATION_INACTIVE`` when the caller's role is in an organization
        that is suspended or closed."""
        found = rule(action)
        relation = found.admits(access.subject, target)
        if relation is not None:
            return relation
        code, message = found.code, found.refusal
        if any(isinstance(r, Role) for r in found.relations) and \
                not target.organizations.isdisjoint(access.subject.suspended):
            code, message = ORGANIZATION_INACTIVE, (
                "This organization is suspended or closed: its data cannot be reached "
                "until it is reactivated")
        refusal = Refusal(access.subject.principal, action, message)
        for listener in self.refusal_listeners:
            listener(refusal)
        raise ApiError(403, code, message)

    def organizations_for(self, access: PolicyAccess, action: str) -> frozenset[str] | None:
        """The organizations where the caller may do ``action`` (None: everywhere)."""
        return organizations_where(access.subject, action)

    def elevate(self, reason: str, on_behalf_of: Principal | None = None) -> CallerFhir:
        """The platform's own rights for ``reason`` (see :mod:`.elevation`)."""
        return self.elevator.elevate(reason, on_behalf_of)

    def elevated_access(self, reason: str, on_behalf_of: Principal | None = None
                        ) -> Access:
        """The system's access itself, for ``reason`` (recorded): for a unit that goes on
        (``unit.acting_as(...)``) or a component built with an access."""
        return self.elevator.elevated_access(reason, on_behalf_of)

    def add_elevation_listener(self, listener: ElevationListener) -> None:
        self.elevator.listeners.append(listener)

    def add_refusal_listener(self, listener: RefusalListener) -> None:
        self.refusal_listeners.append(listener)

    async def subject(self, principal: Principal) -> Subject:
        return await self.subjects.subject(principal)

    async def access(self, principal: Principal, door: str = API_DOOR) -> PolicyAccess:
        """The access of ``principal`` on a request through ``door``: on /fhir an API key
        is also held to its per-type scopes and a SMART token to its scopes; on /api the
        access table already checked the route's scope (and refuses SMART tokens)."""
        if principal.smart is not None:
            return await self._smart_access(principal)
        subject = await self.subjects.subject(principal)
        type_filter = _key_scopes(principal) if (
            door == FHIR_DOOR and principal.kind == "api_key") else None
        return PolicyAccess(subject, type_filter)

    async def _smart_access(self, principal: Principal) -> PolicyAccess:
        smart = principal.smart
        assert smart is not None
        if smart.backend:
            # No user to load: the subject is the registration's, kept while the principal
            # (cached per token by the auth service) is the same.
            subject = self._backends.get(principal)
            if subject is None:
                if len(self._backends) > 10_000:
                    self._backends.clear()
                subject = self._backends[principal] = backend_subject(principal)
        else:
            subject = await self.subjects.subject(principal)
        universe = self.scope_universe()
        narrowing = self._narrowings.get(smart)
        if narrowing is None or narrowing.universe is not universe:
            if len(self._narrowings) > 10_000:
                self._narrowings.clear()
            narrowing = self._narrowings[smart] = narrowing_of(smart, universe)
        return PolicyAccess(subject, narrowing=narrowing)

    def scope_universe(self) -> ScopeUniverse:
        """What SMART scopes are matched against, for the registry in use."""
        registry = self.fhir.registry
        if self._universe is None or self._universe[0] != registry.version:
            compartment = frozenset({"Patient", *registry.compartment_types("Patient")})
            self._universe = (registry.version, ScopeUniverse(
                compartment, shared_types() - compartment, self.fhir.token_param))
        return self._universe[1]

    def membership_changed(self, user_id: str) -> None:
        self.subjects.invalidate(user_id)

    def resources_written(self, resources: Sequence[JSON]) -> None:
        """Writes committed in this process that change what someone may see, from the
        next request: a Consent (whoever it names), an Organization (its status decides
        whether its members reach its data), a user's own Patient or Practitioner record
        (that user)."""
        for resource in resources:
            kind = resource.get("resourceType")
            # An organization suspended, closed or reactivated: its members' subjects
            # change (they are few writes; every subject is dropped, as for a Consent).
            if kind in ("Consent", "Organization"):
                self.subjects.invalidate()
                return
            if kind in SUBJECT_TYPES:
                for identifier in resource.get("identifier") or []:
                    if isinstance(identifier, dict) and identifier.get("system") == \
                            USER_SYSTEM and isinstance(identifier.get("value"), str):
                        self.subjects.invalidate(identifier["value"])


