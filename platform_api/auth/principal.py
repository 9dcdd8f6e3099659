"""Who is calling: the principal that authentication produces and every route consumes."""

from __future__ import annotations

from dataclasses import dataclass, field

SUPER_ADMIN = "SUPER:ADMIN"
APP_ADMIN = "APP:ADMIN"
PLATFORM_ADMIN_ROLES = frozenset({SUPER_ADMIN, APP_ADMIN})


@dataclass(frozen=True, slots=True)
class Principal:
    """An authenticated caller: a user (PASETO token) or an API key.

    ``roles`` holds platform roles (``SUPER:ADMIN``, ``APP:ADMIN``) and the user's
    organization roles as ``ORG:<ROLE>``; organization membership itself lives in the
    ``org_members`` documents. ``scopes`` is empty for user tokens (roles decide) and
    holds ``<resource>:<action>`` strings for API keys.
    """

    user_id: str
    kind: str = "user"  # user | api_key
    email: str | None = None
    roles: frozenset[str] = field(default_factory=frozenset)
    scopes: frozenset[str] = field(default_factory=frozenset)
    token_id: str | None = None  # jti of the access token, or the API key id

    @property
    def is_platform_admin(self) -> bool:
        return bool(self.roles & PLATFORM_ADMIN_ROLES)

    @property
    def is_super_admin(self) -> bool:
        return SUPER_ADMIN in self.roles

    def has_role(self, role: str) -> bool:
        return role in self.roles
