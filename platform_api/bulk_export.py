"""Bulk Data export on this platform: who an export belongs to, and its access again later.

The export itself is :mod:`fhir_server.bulk` (kick-off, jobs, NDJSON files); this module
gives it the platform's side (:class:`PrincipalIdentity`):

- an export belongs to its **client**: a user (``user:<id>``), an API key
  (``api_key:<key id>``) or a SMART client (``smart:<client id>:<user>``; a backend
  services client has no user). One export per client at a time; only that client polls
  it and fetches its files (with a valid token or key each time, as any /fhir request);
- a job resumed after a restart runs under its client's access **as it is now** (the
  policy, from the stored principal: roles, memberships and scopes re-read): a user
  suspended or deleted, an API key revoked or a SMART client deactivated since the
  kick-off stops the export (it fails, saying so), and narrowed rights narrow what is
  still to come.

Settings: ``bulk_export_dir`` (default ``<data_dir>/bulk-exports``),
``bulk_export_retention_hours`` (how long finished exports' files are kept).
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from fhir_server.access import Access
from fhir_server.bulk.jobs import BulkExports
from fhir_server.outcome import FhirError
from fhir_server.smart_scopes import ScopeSet
from platform_api.auth import api_keys, users
from platform_api.auth.principal import Principal, SmartAuthorization
from platform_api.policy import FHIR_DOOR
from platform_api.policy.grants import PolicyAccess
from platform_api.services import Services

JSON = dict[str, Any]
EXTRAS_KEY = "bulk_exports"


def _principal(access: Access) -> Principal:
    if not isinstance(access, PolicyAccess):  # the system's own access is never a client
        raise FhirError.of(403, "forbidden", "Only a signed-in client may export")
    return access.subject.principal


class PrincipalIdentity:
    """:class:`fhir_server.bulk.jobs.ExportIdentity` from the platform's principals."""

    def __init__(self, services: Services):
        self.services = services

    def owner(self, access: Access) -> str:
        principal = _principal(access)
        if principal.smart is not None:
            return f"smart:{principal.smart.client_id}:{principal.user_id}"
        if principal.kind == "api_key":
            return f"api_key:{principal.token_id}"
        return f"user:{principal.user_id}"

    def dump(self, access: Access) -> JSON:
        principal = _principal(access)
        data: JSON = {"user_id": principal.user_id, "kind": principal.kind,
                "email": principal.email, "roles": sorted(principal.roles),
                "scopes": sorted(principal.scopes), "token_id": principal.token_id,
                "smart": None}
        if principal.smart is not None:
            data["smart"] = {**asdict(principal.smart), "scopes": str(principal.smart.scopes)}
        return data

    async def load(self, data: JSON) -> Access:
        smart = data.get("smart")
        principal = Principal(
            data["user_id"], data["kind"], data.get("email"), frozenset(data["roles"]),
            frozenset(data["scopes"]), data.get("token_id"),
            SmartAuthorization(**{**smart, "scopes": ScopeSet.parse(smart["scopes"])})
            if smart else None)
        await self._still_valid(principal)
        return await self.services.policy.access(principal, FHIR_DOOR)

    async def _still_valid(self, principal: Principal) -> None:
        store = self.services.store
        if principal.smart is not None:
            registry = self.services.extras["smart"].registry
            if await registry.active(principal.smart.client_id) is None:
                raise FhirError.of(403, "forbidden", "The SMART client that asked for this "
                                   "export is no longer active")
        if principal.kind == "api_key":
            key = await store.get_document(api_keys.KEYS, principal.token_id or "")
            if key is None or key.get("status") != api_keys.ACTIVE:
                raise FhirError.of(403, "forbidden", "The API key that asked for this "
                                   "export has been revoked")
        elif not (principal.smart is not None and principal.smart.backend):
            user = await store.get_document(users.COLLECTION, principal.user_id)
            if user is None or user.get("status") != users.ACTIVE:
                raise FhirError.of(403, "forbidden", "The account that asked for this "
                                   "export is no longer active")


def install(services: Services) -> BulkExports:
    """The platform's export jobs, in ``services.extras`` (started by the app)."""
    settings = services.settings
    jobs = services.extras[EXTRAS_KEY] = BulkExports(
        services.fhir, PrincipalIdentity(services),
        settings.bulk_export_dir or settings.data_dir / "bulk-exports",
        retention_seconds=settings.bulk_export_retention_hours * 3600)
    return jobs
