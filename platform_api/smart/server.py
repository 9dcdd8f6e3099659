"""The SMART authorization server as a service of the app: its client registry, client
authentication, id_token keys, and the scope negotiation every grant goes through.

Built once per app (``SmartServer(services)``, started in the lifespan after the auth
service, whose ``smart_clients`` it answers) and reached by the routes as
:func:`smart_server`.

**What may be granted** (:meth:`SmartServer.grantable`) is the intersection of what the
client asked for, what it registered (its ``scope``: the most it may ever get), what
this server can enforce exactly (:func:`fhir_server.smart_scopes.enforceable`), and the
kind of grant: ``patient/`` and ``user/`` scopes, ``launch``, ``launch/patient``,
``launch/encounter``, ``openid``, ``fhirUser``, ``profile``, ``email``,
``online_access`` / ``offline_access`` (with the ``refresh_token`` grant) for apps a user
authorizes; ``system/`` scopes for backend services. What cannot be granted is left
out, never widened; the token response says what was granted.
"""

from __future__ import annotations

import asyncio
from typing import Any

from starlette.requests import Request

from fhir_server.caller import CallerFhir
from fhir_server.smart_scopes import (
    SYSTEM,
    ResourceScope,
    ScopeError,
    ScopeSet,
    enforceable,
    parse_resource_scope,
)
from fhir_server.validation import is_resource_type
from platform_api.auth.mfa import commit_code
from platform_api.auth.principal import Principal, SmartAuthorization
from platform_api.outbound import outbound_of
from platform_api.policy import FHIR_DOOR
from platform_api.services import Services
from platform_api.smart.client_auth import ClientAuthenticator, JwksCache
from platform_api.smart.clients import ClientRegistry
from platform_api.smart.keys import IdTokenKeys

JSON = dict[str, Any]
EXTRAS_KEY = "smart"
CONTEXT_SCOPES = ("launch", "launch/patient", "launch/encounter")
IDENTITY_SCOPES = ("openid", "fhirUser", "profile", "email")
REFRESH_SCOPES = ("online_access", "offline_access")
# Every scope the discovery document lists (resource scopes as the wildcards).
SCOPES_SUPPORTED = (
    *IDENTITY_SCOPES, *CONTEXT_SCOPES, *REFRESH_SCOPES,
    "patient/*.cruds", "user/*.cruds", "system/*.cruds",
    "patient/*.read", "patient/*.write", "user/*.read", "user/*.write",
    "system/*.read", "system/*.write")


class SmartServer:
    """The authorization server's state (module docstring)."""

    def __init__(self, services: Services):
        settings = services.settings
        self.services = services
        self.settings = settings
        self.registry = ClientRegistry(services.store, services.auth.recheck_seconds)
        self.jwks = JwksCache(outbound_of(services),
                              max_cache_seconds=settings.smart_jwks_max_cache_seconds,
                              timeout_seconds=settings.smart_jwks_timeout_seconds,
                              refetch_seconds=settings.smart_jwks_refetch_seconds,
                              max_bytes=settings.smart_jwks_max_bytes)
        self.clients = ClientAuthenticator(self.registry, self.jwks, services.store)
        self._id_keys: IdTokenKeys | None = None

    async def start(self) -> None:
        self._id_keys = await asyncio.to_thread(
            IdTokenKeys.load_or_create, self.settings.data_dir / "keys")
        self.services.auth.smart_clients = self.registry.standing

    async def stop(self) -> None:
        await self.jwks.close()

    @property
    def id_keys(self) -> IdTokenKeys:
        if self._id_keys is None:
            raise RuntimeError("SmartServer.start() has not been awaited")
        return self._id_keys

    async def redeem_second_factor(self, mfa_token: str, code: str) -> None:
        """Spend the TOTP or recovery ``code`` of a sign-in's MFA challenge (the pages
        sign users in as /api/auth/login does); ApiError when it is refused."""
        mfa = self.services.auth.mfa
        challenge = await mfa.find_challenge(mfa_token)
        async with self.services.store.unit_of_work() as uow:
            await mfa.stage_redeem(challenge, code, uow)
            await commit_code(uow)

    # -- scope negotiation -------------------------------------------------------------
    def grantable(self, requested: str, client: JSON, *, backend: bool) -> ScopeSet:
        """What of ``requested`` may be granted to ``client`` (module docstring)."""
        registered = ScopeSet.parse(client["scope"])
        universe = self.services.policy.scope_universe()
        refresh = "refresh_token" in client["grant_types"]
        kept: list[str] = []
        for name in dict.fromkeys(requested.split()):
            try:
                scope = parse_resource_scope(name)
            except ScopeError:
                continue  # malformed: not granted (IG: MAY be ignored)
            if scope is None:
                if not backend and name in registered and (
                        name in CONTEXT_SCOPES or name in IDENTITY_SCOPES
                        or (name in REFRESH_SCOPES and refresh)):
                    kept.append(name)
                continue
            if (scope.context == SYSTEM) == backend and _known_type(scope) and \
                    enforceable(scope, universe) and \
                    any(scope.within(allowed) for allowed in registered.resources):
                kept.append(name)
        if "fhirUser" in kept and "openid" not in kept:
            kept.remove("fhirUser")  # an id_token claim: only with openid
        return ScopeSet.parse(kept)


def _known_type(scope: ResourceScope) -> bool:
    return scope.resource_type == "*" or is_resource_type(scope.resource_type)


def smart_server(request: Request) -> SmartServer:
    services: Services = request.app.state.services
    return services.extras[EXTRAS_KEY]  # type: ignore[no-any-return]


async def as_app_of(services: Services, principal: Principal, client_id: str,
                    scope: str = "user/Patient.rs user/Encounter.rs") -> CallerFhir:
    """The FHIR service as ``principal``'s user would reach it through a SMART app with
    ``scope``: what a launch or a patient picker may offer is what the app's token will
    reach (never a platform administrator's powers, see platform_api.policy.smart)."""
    app = Principal(user_id=principal.user_id, kind="smart", email=principal.email,
                    roles=principal.roles, smart=SmartAuthorization(
                        client_id, ScopeSet.parse(scope)))
    return CallerFhir(services.fhir, await services.policy.access(app, FHIR_DOOR))
