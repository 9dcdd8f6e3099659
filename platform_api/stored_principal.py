"""A caller kept for later: who they are (to tell their work apart) and their access again.

Background work done for a client after its request has ended (a bulk export resumed
after a restart, a subscription's notifications) runs under that client's access **as it
is now**: :class:`PrincipalIdentity` keeps the principal (never a token or secret) and
rebuilds its access through the policy (roles, memberships and scopes re-read). A user
suspended or deleted, an API key revoked or a SMART client deactivated since then gets
no more (:meth:`PrincipalIdentity.load` refuses with a 403 FhirError).

Clients: a user (``user:<id>``), an API key (``api_key:<key id>``), a SMART client
(``smart:<client id>:<user>``; a backend services client has no user).
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from fhir_server.access import Access
from fhir_server.outcome import FhirError
from fhir_server.smart_scopes import ScopeSet
from platform_api.auth import api_keys, users
from platform_api.auth.principal import Principal, SmartAuthorization
from platform_api.policy import FHIR_DOOR
from platform_api.policy.grants import PolicyAccess
from platform_api.services import Services

JSON = dict[str, Any]


def principal_of(access: Access) -> Principal:
    if not isinstance(access, PolicyAccess):  # the system's own access is never a client
        raise FhirError.of(403, "forbidden", "Only a signed-in client may export")
    return access.subject.principal


class PrincipalIdentity:
    """:class:`fhir_server.bulk.jobs.ExportIdentity` from the platform's principals."""

    def __init__(self, services: Services):
        self.services = services

    def owner(self, access: Access) -> str:
        principal = principal_of(access)
        if principal.smart is not None:
            return f"smart:{principal.smart.client_id}:{principal.user_id}"
        if principal.kind == "api_key":
            return f"api_key:{principal.token_id}"
        return f"user:{principal.user_id}"

    def dump(self, access: Access) -> JSON:
        principal = principal_of(access)
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
