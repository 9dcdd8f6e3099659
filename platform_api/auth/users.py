"""User accounts as ``users`` documents, and the data tables that govern them.

Document: ``{id (uuid4), email (lower case, unique), password_hash (argon2id; ``None``
for an account made by social login until a password is set), first_name, last_name,
registration_role, roles, status, created_at, referral_code (unique), referred_by (the
referrer's user id or ``None``), email_verified}``. Users are platform bookkeeping, not
health data: a doctor's or patient's clinical identity lives in FHIR Practitioner/Patient
resources created by their areas (the doctors area reacts to
``platform.auth.user_created``).

``registration_role`` records what the person signed up as; it grants nothing.
``roles`` is what authorization reads: platform roles (``SUPER:ADMIN``,
``APP:ADMIN``), set only by administrators, and organization roles ``ORG:<ROLE>``,
set when a membership is added.
"""

from __future__ import annotations

import re
import secrets
import time
import uuid
from collections.abc import Iterable
from typing import Any, Literal, get_args

from platform_api.auth.errors import validation_error
from platform_api.auth.password_policy import MIN_LENGTH, check_new_password
from platform_api.auth.principal import APP_ADMIN, SUPER_ADMIN
from platform_api.auth.tokens import rfc3339

COLLECTION = "users"
UNIQUE_FIELDS = ("email", "referral_code")

# What a person may sign up as (spec: DOCTOR is allowed and triggers a doctor profile;
# the other values are not given there). ADMIN is set by create_admin only.
RegistrationRole = Literal[
    "PATIENT", "DOCTOR", "NURSE", "PHARMACIST", "LAB_TECHNICIAN", "ORG_ADMIN"
]
REGISTRATION_ROLES: tuple[str, ...] = get_args(RegistrationRole)
ADMIN_REGISTRATION_ROLE = "ADMIN"
ACTIVE, SUSPENDED = "active", "suspended"
STATUSES = (ACTIVE, SUSPENDED)

PLATFORM_ROLES = frozenset({SUPER_ADMIN, APP_ADMIN})
_ORG_ROLE = re.compile(r"^ORG:[A-Z][A-Z0-9_]*$")
# No 0/O or 1/I/L: codes are read aloud and typed from paper.
_REFERRAL_ALPHABET = "ABCDEFGHJKMNPQRSTUVWXYZ23456789"
REFERRAL_CODE_LENGTH = 8
MIN_PASSWORD_LENGTH = MIN_LENGTH

JSON = dict[str, Any]


def normalize_email(email: str) -> str:
    return email.strip().lower()


def check_email(email: str) -> str:
    """A light shape check for callers other than the routes (which use EmailStr)."""
    local, at, domain = normalize_email(email).rpartition("@")
    if not at or not local or "." not in domain or any(c.isspace() for c in email.strip()):
        raise validation_error("email", f"{email!r} is not an e-mail address")
    return normalize_email(email)


def check_password(password: str, context: Iterable[str] = ()) -> str:
    """A new password as NIST SP 800-63B 5.1.1.2 wants it (see ``password_policy``):
    long enough, not a common or breached one, not made of ``context`` (the account's
    e-mail address and names)."""
    return check_new_password(password, context)


def check_name(field: str, value: str) -> str:
    if not value.strip():
        raise validation_error(field, f"{field} must not be empty")
    return value.strip()


def new_referral_code() -> str:
    return "".join(secrets.choice(_REFERRAL_ALPHABET) for _ in range(REFERRAL_CODE_LENGTH))


def normalize_referral_code(code: str) -> str | None:
    """Upper case without spaces or dashes; ``None`` when it cannot be a code."""
    normalized = "".join(code.split()).replace("-", "").upper()
    if len(normalized) != REFERRAL_CODE_LENGTH or any(
        c not in _REFERRAL_ALPHABET for c in normalized
    ):
        return None
    return normalized


def check_registration_role(role: str) -> str:
    if role not in REGISTRATION_ROLES:
        raise validation_error(
            "registration_role", f"registration_role must be one of {', '.join(REGISTRATION_ROLES)}"
        )
    return role


def check_roles(roles: Iterable[str]) -> list[str]:
    """Platform roles or ``ORG:<ROLE>``; returns them sorted and de-duplicated."""
    checked = sorted(set(roles))
    for role in checked:
        if role not in PLATFORM_ROLES and not _ORG_ROLE.match(role):
            raise validation_error(
                "roles", f"unknown role {role!r}: use SUPER:ADMIN, APP:ADMIN or ORG:<ROLE>"
            )
    return checked


def check_status(status: str) -> str:
    if status not in STATUSES:
        raise validation_error("status", f"status must be one of {', '.join(STATUSES)}")
    return status


def new_user(
    *,
    email: str,
    password_hash: str | None,
    first_name: str,
    last_name: str,
    registration_role: str,
    roles: Iterable[str] = (),
    referred_by: str | None = None,
    email_verified: bool = False,
) -> JSON:
    return {
        "id": str(uuid.uuid4()),
        "email": check_email(email),
        "password_hash": password_hash,
        "first_name": check_name("first_name", first_name),
        "last_name": check_name("last_name", last_name),
        "registration_role": registration_role,
        "roles": check_roles(roles),
        "status": ACTIVE,
        "created_at": rfc3339(time.time()),
        "referral_code": new_referral_code(),
        "referred_by": referred_by,
        "email_verified": email_verified,
    }


def public_user(user: JSON) -> JSON:
    """The spec's User resource: id, email, first_name, last_name, registration_role."""
    return {k: user[k] for k in ("id", "email", "first_name", "last_name", "registration_role")}


def account_view(user: JSON) -> JSON:
    """The User plus what its owner and administrators see; never the password hash."""
    return {
        **public_user(user),
        "roles": list(user.get("roles", [])),
        "status": user["status"],
        "created_at": user["created_at"],
        "referral_code": user.get("referral_code"),
        "email_verified": bool(user.get("email_verified", False)),
    }


def referral_view(user: JSON) -> JSON:
    """What anyone holding a referral code may learn: who referred, as a person would
    say it on a flyer (first name and last initial), nothing that identifies further."""
    last = str(user.get("last_name", "")).strip()
    return {
        "code": user["referral_code"],
        "valid": True,
        "referrer": {
            "first_name": user["first_name"],
            "last_initial": f"{last[0]}." if last else None,
        },
    }


def created_event(user: JSON) -> JSON:
    """Payload of ``platform.auth.user_created`` (spec: Events)."""
    return {
        "user_id": user["id"],
        "email": user["email"],
        "first_name": user["first_name"],
        "last_name": user["last_name"],
        "registration_role": user["registration_role"],
    }
