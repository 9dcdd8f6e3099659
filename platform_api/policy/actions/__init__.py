"""Who may do each workflow action of the /api areas: relations, as data.

CRUD is decided by the role table and the grants (:mod:`platform_api.policy.grants`);
a *workflow action* (sign, dispense, book, transmit, add a member, request consent, link
records, ...) is decided here. Each action is a named :class:`Rule`: the relations any
one of which lets the caller act (HAPI's rule list, Medplum's AccessPolicy as data), the
refusal to answer otherwise, and the code of that refusal. The areas' rules live beside
this module, one module per area (``actions/prescribing.py``, ...), and are merged into
:data:`RULES`; an area asks ``await ctx.authorize("prescription.sign",
organizations=owners)`` and never decides access itself.

A relation is a small frozen value with a ``holds(subject, target)`` and a ``text`` (the
README's table of workflow actions is rendered from them):

- :class:`PlatformAdmin`: SUPER:ADMIN / APP:ADMIN signed in as themselves (never an API
  key, never a SMART app);
- :class:`Role`: one of these ``ORG:<ROLE>``\\ s (any role when none is named) in one of
  the organizations the action is in (the resource's owners, the organization in the
  path, the pharmacy an e-prescription was sent to ...);
- :class:`AnyRole`: one of these roles in some organization (a clinician, wherever);
- :class:`PatientSelf`: the patient the action is about is the caller's own Patient
  record (never one the master patient index linked to it);
- :class:`UserSelf`: the account the action is about is the caller's;
- :class:`PractitionerSelf`: the Practitioner record the action is about is the caller's.

A :class:`Target` carries what the relations look at. Deny by default: an action with no
rule is refused (and :func:`rule` raises, so a test catches a misspelt name), and a
relation that finds nothing in the target admits nothing.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol

from platform_api.policy.subject import Subject

FORBIDDEN = "FORBIDDEN"
ORGANIZATION_INACTIVE = "ORGANIZATION_INACTIVE"


@dataclass(frozen=True, slots=True)
class Target:
    """What a workflow action is about, as far as the relations need to know."""

    organizations: frozenset[str] = frozenset()
    patient_id: str | None = None
    user_id: str | None = None
    practitioner_id: str | None = None

    @classmethod
    def of(cls, organizations: Iterable[str] | str | None = None, *,
           patient_id: str | None = None, user_id: str | None = None,
           practitioner_id: str | None = None) -> Target:
        if isinstance(organizations, str):
            organizations = (organizations,)
        return cls(frozenset(o for o in organizations or () if o), patient_id, user_id,
                   practitioner_id)


class Relation(Protocol):
    @property
    def text(self) -> str: ...

    def holds(self, subject: Subject, target: Target) -> bool: ...


@dataclass(frozen=True, slots=True)
class PlatformAdmin:
    text: str = "a platform administrator"

    def holds(self, subject: Subject, target: Target) -> bool:
        return subject.unrestricted


def _roles_text(roles: frozenset[str], where: str) -> str:
    named = " or ".join(f"`{r}`" for r in sorted(roles)) if roles else "any role"
    return f"{named} {where}"


@dataclass(frozen=True, slots=True)
class Role:
    """One of ``roles`` (any role when empty) in one of the target's organizations."""

    roles: frozenset[str] = frozenset()
    of: str = "of the organization"

    def holds(self, subject: Subject, target: Target) -> bool:
        return any((role := subject.memberships.get(org)) is not None
                   and (not self.roles or role in self.roles)
                   for org in target.organizations)

    @property
    def text(self) -> str:
        return _roles_text(self.roles, self.of)


@dataclass(frozen=True, slots=True)
class AnyRole:
    """One of ``roles`` in any organization the caller is an active member of."""

    roles: frozenset[str] = frozenset()

    def holds(self, subject: Subject, target: Target) -> bool:
        return any(not self.roles or role in self.roles
                   for role in subject.memberships.values())

    @property
    def text(self) -> str:
        return _roles_text(self.roles, "in any organization")


@dataclass(frozen=True, slots=True)
class PatientSelf:
    text: str = "the patient themselves"

    def holds(self, subject: Subject, target: Target) -> bool:
        return target.patient_id is not None and target.patient_id == subject.patient_id


@dataclass(frozen=True, slots=True)
class UserSelf:
    text: str = "the account's own user"

    def holds(self, subject: Subject, target: Target) -> bool:
        return target.user_id is not None and target.user_id == subject.principal.user_id


@dataclass(frozen=True, slots=True)
class PractitionerSelf:
    text: str = "the practitioner themselves"

    def holds(self, subject: Subject, target: Target) -> bool:
        return target.practitioner_id is not None \
            and target.practitioner_id in subject.practitioner_ids


ADMIN = PlatformAdmin()
SELF_PATIENT = PatientSelf()
SELF_USER = UserSelf()
SELF_PRACTITIONER = PractitionerSelf()


def role(*roles: str, of: str = "of the organization") -> Role:
    return Role(frozenset(roles), of)


def any_role(*roles: str) -> AnyRole:
    return AnyRole(frozenset(roles))


@dataclass(frozen=True, slots=True)
class Rule:
    """Who may do one workflow action: any of ``relations``; otherwise 403 ``code`` with
    ``refusal``."""

    relations: tuple[Relation, ...]
    refusal: str
    code: str = FORBIDDEN
    summary: str = ""  # what the action is, for the README's table

    def admits(self, subject: Subject, target: Target) -> Relation | None:
        """The first relation that lets the caller act (None: refused)."""
        return next((r for r in self.relations if r.holds(subject, target)), None)

    def describe(self) -> str:
        return "; ".join(r.text for r in self.relations)


def _merged() -> dict[str, Rule]:
    from platform_api.policy.actions import areas

    rules: dict[str, Rule] = {}
    for module in areas.MODULES:
        for name, rule_ in module.RULES.items():
            if name in rules:
                raise ValueError(f"workflow action {name!r} is declared twice")
            rules[name] = rule_
    return rules


_RULES: dict[str, Rule] | None = None


def rules() -> Mapping[str, Rule]:
    """Every workflow action's rule, by name."""
    global _RULES
    if _RULES is None:
        _RULES = _merged()
    return _RULES


def rule(name: str) -> Rule:
    found = rules().get(name)
    if found is None:
        raise KeyError(f"no access rule for the workflow action {name!r}: declare it in "
                       "platform_api/policy/actions/")
    return found


def organizations_where(subject: Subject, name: str) -> frozenset[str] | None:
    """The organizations in which the caller may do ``name`` (None: any, for a caller a
    relation other than :class:`Role` admits everywhere, i.e. a platform administrator):
    what a list of such actions is narrowed to, as search criteria."""
    found = rule(name)
    if any(isinstance(r, PlatformAdmin) and r.holds(subject, Target()) for r in
           found.relations):
        return None
    return frozenset(org for org in subject.memberships
                     if found.admits(subject, Target.of(org)) is not None)


def render_actions() -> str:
    """The workflow actions as Markdown (the README's access section shows this)."""
    rows = ["| action | what it is | who may |", "|---|---|---|"]
    for name in sorted(rules()):
        found = rules()[name]
        rows.append(f"| `{name}` | {found.summary} | {found.describe()} |")
    return "\n".join(rows)


__all__ = [
    "ADMIN", "FORBIDDEN", "ORGANIZATION_INACTIVE", "SELF_PATIENT", "SELF_PRACTITIONER",
    "SELF_USER", "AnyRole", "PatientSelf", "PlatformAdmin", "PractitionerSelf",
    "Relation", "Role", "Rule", "Target", "UserSelf", "any_role", "organizations_where",
    "render_actions", "role", "rule", "rules",
]
