"""Workflow actions of the organization areas (organizations, facilities, members,
invitations, attendance, messaging), of the doctors' profiles and organizations, and of
the workforce and training areas: who may do each (see :mod:`platform_api.policy.actions`).

``organization.work-in`` (membership) and ``organization.manage`` (the organization's
``ORG:ADMIN``) are the two every area uses; the others name one action each, with the
refusal the area has always answered.
"""

from __future__ import annotations

from platform_api.policy.actions import (
    ADMIN,
    SELF_PRACTITIONER,
    SELF_USER,
    Relation,
    Rule,
    role,
)
from platform_api.policy.roles import ORG_ADMIN, ORG_DOCTOR, ORG_LAB

# The organization's administrators (and platform administrators).
MANAGERS: tuple[Relation, ...] = (ADMIN, role(ORG_ADMIN))
# What a member does for themselves, and the organization's administrators for anyone.
SELF_OR_MANAGERS: tuple[Relation, ...] = (*MANAGERS, SELF_USER)

RULES: dict[str, Rule] = {
    "organization.work-in": Rule(
        (ADMIN, role()), "You are not a member of this organization",
        summary="read and write an organization's records through its /api paths"),
    "organization.manage": Rule(
        MANAGERS,
        "Only the organization's administrators (ORG:ADMIN) may do this",
        summary="manage an organization: its members, invitations, settings"),
    # -- facilities ---------------------------------------------------------------------
    "organization.list-inactive": Rule(
        (ADMIN,), "Only platform administrators list suspended or closed organizations",
        summary="list suspended and closed organizations in the directory"),
    "organization.suspend": Rule(
        (ADMIN,), "Only platform administrators suspend or reactivate an organization; "
        "its ORG:ADMIN may close it",
        summary="suspend an organization, or reactivate it"),
    "organization.close": Rule(
        MANAGERS, "Only platform administrators and the organization's ORG:ADMIN close "
        "an organization",
        summary="close an organization for good"),
    # -- members and invitations ----------------------------------------------------------
    "member.remove": Rule(
        SELF_OR_MANAGERS, "Only the organization's administrators (ORG:ADMIN) remove "
        "members; a member may leave",
        summary="remove a member from an organization, or leave it"),
    "invitation.accept": Rule(
        (SELF_USER,), "This invitation was sent to another e-mail address: sign in with "
        "that address's account", code="INVITATION_FOR_ANOTHER_ACCOUNT",
        summary="accept an invitation to join an organization (a doctor joins one so)"),
    # -- attendance and messaging ---------------------------------------------------------
    "attendance.keep": Rule(
        (role(),), "Only the organization's members keep attendance and ask for leave",
        summary="clock in and out at an organization, ask it for leave"),
    "conversation.read-any": Rule(
        (ADMIN,), "Only platform administrators read conversations they take no part in",
        summary="read an organization's conversations one takes no part in"),
    # -- doctors ----------------------------------------------------------------------------
    "doctor.create-profile": Rule(
        (SELF_USER,), "A doctor profile is created by its own account",
        summary="create one's own doctor profile (pending verification)"),
    "doctor.view-profile": Rule(
        (ADMIN, SELF_PRACTITIONER, role(of="of an organization the doctor practises at")),
        "Only the doctor, their colleagues and platform administrators see a doctor's "
        "whole profile",
        summary="see a doctor's whole profile: contact details, licence, verification"),
    "doctor.verify": Rule(
        (ADMIN,), "Only platform administrators verify doctors' credentials",
        summary="approve or reject a doctor's credentials; list those pending"),
    "doctor.edit-profile": Rule(
        (ADMIN, SELF_PRACTITIONER),
        "Only the doctor and platform administrators change this profile",
        summary="change a doctor profile"),
    "doctor.leave-organization": Rule(
        (*MANAGERS, SELF_PRACTITIONER), "Only the doctor, the organization's ORG:ADMIN or "
        "a platform administrator removes a doctor from it",
        summary="end a doctor's practice at an organization (leave, or remove them)"),
    "diagnostic-report.sign": Rule(
        (role(ORG_DOCTOR, ORG_LAB, of="of the report's organization"),),
        "Only a doctor or the laboratory (ORG:DOCTOR, ORG:LAB) of the report's "
        "organization signs it",
        summary="sign a diagnostic report (final)"),
    # -- workforce --------------------------------------------------------------------------
    "workforce.manage": Rule(
        MANAGERS, "Only the organization's administrators (ORG:ADMIN) manage its "
        "workforce and rosters",
        summary="manage an organization's workforce: members, shift types, rosters, "
                "courses; see everyone's fairness"),
    "roster.read-unpublished": Rule(
        MANAGERS, "Draft and approved rosters are for the organization's administrators",
        summary="see a roster before it is published"),
    "shift.offer": Rule(
        SELF_OR_MANAGERS, "You may offer only your own shifts",
        summary="offer a shift of a published roster for a swap"),
    "shift.take": Rule(
        (SELF_USER,), "This shift was offered to a colleague",
        summary="accept a swap offered to oneself (or to anyone)"),
    # -- training ---------------------------------------------------------------------------
    "training.enrol": Rule(
        SELF_OR_MANAGERS, "Only the organization's administrators enrol others",
        summary="enrol a member in a course, and record their progress"),
    "training.read-enrolments": Rule(
        SELF_OR_MANAGERS, "You see your own enrolments only",
        summary="see a member's enrolments"),
    "training.answer": Rule(
        (SELF_USER,), "Only the enrolled member answers their assessment",
        summary="submit an attempt at a course's assessment"),
    "training.credits": Rule(
        SELF_OR_MANAGERS, "You see and record your own credits only",
        summary="see and record a member's CME credits and assessment attempts"),
}
