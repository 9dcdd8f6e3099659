"""Workflow actions of the organization areas (organizations, facilities, members,
invitations, attendance, messaging): who may do each (see
:mod:`platform_api.policy.actions`)."""

from __future__ import annotations

from platform_api.policy.actions import ADMIN, Rule, role
from platform_api.policy.roles import ORG_ADMIN

RULES: dict[str, Rule] = {
    "organization.work-in": Rule(
        (ADMIN, role()), "You are not a member of this organization",
        summary="read and write an organization's records through its /api paths"),
    "organization.manage": Rule(
        (ADMIN, role(ORG_ADMIN)),
        "Only the organization's administrators (ORG:ADMIN) may do this",
        summary="manage an organization: its members, invitations, settings"),
}
