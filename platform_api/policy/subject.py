"""Who a caller is, in the terms of the access policy's relations.

A :class:`Subject` is a principal (user token or API key) with what the relations need:
the organizations it is a member of with its ``ORG:<ROLE>`` in each (active ones only: a
suspended or closed organization's members reach none of its data), its own Patient
record (the *self* relation), its Practitioner records, and the patients who consented
to share their records with it or with one of its organizations.

Loading a subject asks the store a handful of indexed questions, so subjects are cached
per user for ``ttl`` seconds. A change made in this process (a membership, a Consent, a
user's Patient or Practitioner record) drops the cache at once, so a revoked consent or
a removed member is refused from the next request on; other processes see it within
``ttl`` seconds.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from fhir_server.service import FhirService
from fhir_server.store import ResourceStore
from platform_api.auth.principal import Principal

JSON = dict[str, Any]
MEMBERS = "org_members"
USER_SYSTEM = "urn:healthplatform:user"
# Resource types whose writes can change some subject (see Policy.resource_written).
SUBJECT_TYPES = frozenset({"Consent", "Organization", "Patient", "Practitioner"})
MAX_MEMBERSHIPS = 1000
MAX_CONSENTS = 1000


@dataclass(frozen=True, slots=True)
class Subject:
    principal: Principal
    memberships: Mapping[str, str] = field(default_factory=dict)  # organization id → role
    patient_id: str | None = None  # the user's own Patient record
    practitioner_ids: frozenset[str] = frozenset()
    # patient id → organization ids the consent names ("" where it names the user's
    # Practitioner record rather than one of its organizations)
    consents: Mapping[str, frozenset[str]] = field(default_factory=dict)
    # Grants compiled from these relations, by (action, scopes) (see policy.grants): a
    # subject lives as long as its cache entry, so each request reuses them.
    compiled: dict[Any, Any] = field(default_factory=dict, compare=False, repr=False)
    # A SMART backend services client an administrator registered for the whole platform.
    platform_wide: bool = False
    # Organizations the user is a member of that are suspended or closed (no access: the
    # refusal says why).
    suspended: frozenset[str] = frozenset()

    @property
    def unrestricted(self) -> bool:
        """Platform administrators signed in as themselves (an API key or a SMART app
        never is), and platform-wide backend services clients (narrowed by their
        scopes)."""
        return self.platform_wide or (self.principal.kind == "user"
                                      and self.principal.is_platform_admin)

    def role_in(self, organization_id: str) -> str | None:
        return self.memberships.get(organization_id)


def _consent_in_force(consent: JSON, now: str) -> bool:
    if consent.get("status") != "active":
        return False
    provision = consent.get("provision") or {}
    if provision.get("type", "permit") != "permit":
        return False
    period = provision.get("period") or {}
    start, end = period.get("start"), period.get("end")
    return (start is None or start <= now) and (end is None or now < end)


def _consent_actors(consent: JSON) -> set[str]:
    provision = consent.get("provision") or {}
    return {str((actor.get("reference") or {}).get("reference", ""))
            for actor in provision.get("actor") or [] if isinstance(actor, dict)}


def _patient_of(consent: JSON) -> str | None:
    ref = (consent.get("patient") or {}).get("reference", "")
    return ref.removeprefix("Patient/") if isinstance(ref, str) and ref.startswith(
        "Patient/") else None


class SubjectLoader:
    """Subjects by user id, cached (see the module docstring)."""

    def __init__(self, fhir: FhirService, store: ResourceStore, *, ttl: float = 5.0):
        self.fhir = fhir
        self.store = store
        self.ttl = ttl
        self._cache: dict[str, tuple[float, int, Subject]] = {}
        self._generation = 0

    def invalidate(self, user_id: str | None = None) -> None:
        """Forget one user's subject, or every subject (``None``)."""
        if user_id is None:
            self._generation += 1
            self._cache.clear()
        else:
            self._cache.pop(user_id, None)

    async def subject(self, principal: Principal) -> Subject:
        key = principal.user_id
        cached = self._cache.get(key)
        now = time.monotonic()
        if cached is not None and now - cached[0] < self.ttl \
                and cached[1] == self._generation:
            base = cached[2]
        else:
            generation = self._generation
            base = await self._load(principal)
            if generation == self._generation:
                if len(self._cache) > 10_000:
                    self._cache.clear()
                self._cache[key] = (now, generation, base)
        # The relations are the user's; the principal (token or key, its scopes) is this
        # request's.
        if base.principal != principal:  # another token of the user, or one of their keys
            # The compiled grants are the relations': shared by the user's principals
            # (keyed by what differs between them, see PolicyAccess.grants), so a user
            # with a session and a SMART app at once does not recompile on every request.
            base = Subject(principal, base.memberships, base.patient_id,
                           base.practitioner_ids, base.consents, base.compiled,
                           base.platform_wide, base.suspended)
            if len(self._cache) <= 10_000:
                self._cache[key] = (now if cached is None else cached[0], self._generation,
                                    base)
        return base

    async def _load(self, principal: Principal) -> Subject:
        user_id = principal.user_id
        members = await self.store.find_documents(MEMBERS, {"user_id": user_id},
                                                  limit=MAX_MEMBERSHIPS)
        memberships = {m["organization_id"]: m["role"] for m in members}
        suspended = frozenset(await self._inactive(memberships))
        for org in suspended:
            memberships.pop(org)
        token = f"{USER_SYSTEM}|{user_id}"
        patients = await self.fhir.match_ids("Patient", [("identifier", token)], limit=2)
        practitioners = await self.fhir.match_ids("Practitioner", [("identifier", token)],
                                                  limit=20)
        consents = await self._consents(memberships, practitioners)
        return Subject(principal, memberships, patients[0] if len(patients) == 1 else None,
                       frozenset(practitioners), consents, suspended=suspended)

    async def _inactive(self, memberships: Mapping[str, str]) -> list[str]:
        """The organizations among ``memberships`` that are not active (suspended or
        closed): their members lose access to their data until they are reactivated."""
        if not memberships:
            return []
        return await self.fhir.match_ids(
            "Organization", [("_id", ",".join(sorted(memberships))), ("active", "false")],
            limit=len(memberships))

    async def _consents(self, memberships: Mapping[str, str], practitioners: list[str]
                        ) -> dict[str, frozenset[str]]:
        actors = {f"Organization/{org}": org for org in memberships}
        actors.update({f"Practitioner/{p}": "" for p in practitioners})
        if not actors:
            return {}
        found = await self.fhir.search("Consent", [("actor", ",".join(sorted(actors))),
                                                   ("status", "active")])
        now = datetime.now(UTC).isoformat()
        granted: dict[str, set[str]] = {}
        for consent in found[:MAX_CONSENTS]:
            patient = _patient_of(consent)
            if patient is None or not _consent_in_force(consent, now):
                continue
            for actor in _consent_actors(consent) & actors.keys():
                granted.setdefault(patient, set()).add(actors[actor])
        return {p: frozenset(orgs) for p, orgs in granted.items()}
