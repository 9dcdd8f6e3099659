"""Who is calling: the principal that authentication produces and every route consumes."""

from __future__ import annotations

from dataclasses import dataclass, field

from fhir_server.smart_scopes import ScopeSet

SUPER_ADMIN = "SUPER:ADMIN"
APP_ADMIN = "APP:ADMIN"
PLATFORM_ADMIN_ROLES = frozenset({SUPER_ADMIN, APP_ADMIN})


@dataclass(frozen=True, slots=True)
class SmartAuthorization:
    """What a SMART access token was granted (``platform_api.smart``): its client, its
    scopes and launch context; for a backend services client (``backend``, no user) the
    organization it acts for, or the whole platform when an administrator registered it
    so."""

    client_id: str
    scopes: ScopeSet
    patient: str | None = None
    encounter: str | None = None
    fhir_user: str | None = None
    backend: bool = False
    organization: str | None = None
    platform_wide: bool = False


@dataclass(frozen=True, slots=True)
class Principal:
    """An authenticated caller: a user (PASETO token), an API key, or a SMART app (a
    SMART access token: a user's app, or a backend services client with no user).

    ``roles`` holds platform roles (``SUPER:ADMIN``, ``APP:ADMIN``) and the user's
    organization roles as ``ORG:<ROLE>``; organization membership itself lives in the
    ``org_members`` documents. ``scopes`` is empty for user tokens (roles decide) and
    holds ``<resource>:<action>`` strings for API keys. A SMART principal (kind
    ``smart``) carries its grant in ``smart``; a backend client's ``user_id`` is
    ``client:<client_id>``.
    """

    user_id: str
    kind: str = "user"  # user | api_key | smart
    email: str | None = None
    roles: frozenset[str] = field(default_factory=frozenset)
    scopes: frozenset[str] = field(default_factory=frozenset)
    token_id: str | None = None  # jti of the access token, or the API key id
    smart: SmartAuthorization | None = None

    @property
    def is_platform_admin(self) -> bool:
        return bool(self.roles & PLATFORM_ADMIN_ROLES)

    @property
    def is_super_admin(self) -> bool:
        return SUPER_ADMIN in self.roles

    def has_role(self, role: str) -> bool:
        return role in self.roles
