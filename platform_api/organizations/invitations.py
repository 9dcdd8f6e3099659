"""Invitations to join an organization: e-mailed, single-use, expiring, revocable.

An invitation is platform bookkeeping (document ``org_invitations``: ``id``,
``organization_id``, ``email``, ``role``, ``status`` pending | accepted | revoked,
``invited_by``, ``created_at``, ``expires_at``, ``accepted_by``, ``token_id``; for a
doctor invited by their profile also ``doctor_id`` and ``user_id``, the account); its link
carries a single-use token kept only as its SHA-256 (the auth area's one-time tokens,
purpose ``org-invitation``, :mod:`platform_api.auth.one_time`): a copy of the database
holds nothing that can be redeemed.

- ``POST /api/organizations/:org_id/invitations`` (``{email, role}``, the organization's
  ``ORG:ADMIN``): e-mails ``<web app>/invitations/accept?token=inv_…`` through the
  platform's SMTP mailer; the link works for ``HEALTHPLATFORM_INVITATION_TTL_SECONDS``
  (7 days). Refused with 409 ``ALREADY_MEMBER`` (the address's account is a member) or
  ``INVITATION_PENDING`` (one is already waiting); 503 ``EMAIL_DISABLED`` when no SMTP
  server is configured, 502 ``EMAIL_NOT_SENT`` when it refused the message (the
  invitation is then revoked).
- ``POST /api/organizations/invitations/accept`` (``{token}``): by the account whose
  e-mail was invited, or the doctor's own account for a doctor's invitation (403
  ``INVITATION_FOR_ANOTHER_ACCOUNT`` otherwise: the policy's ``invitation.accept``);
  creates the membership with the invited role, marks the token used (two accepts at
  once: one wins) and emits ``platform.organization.member_added`` (on which the Doctors
  area gives a member with a doctor profile their PractitionerRole at the
  organization). An unknown, used, expired or revoked token is 400
  ``INVALID_INVITATION``.
- ``DELETE /api/organizations/:org_id/invitations/:id``: revokes a pending invitation
  (its token is marked used: the link is dead at once); 409 ``INVITATION_NOT_PENDING``.
- ``GET /api/organizations/:org_id/invitations``: the organization's invitations, newest
  first (a pending one past its expiry shows ``expired``).

A doctor is invited by their profile (``POST /api/doctors/:id/organizations``,
:mod:`platform_api.doctors.profiles`, through :func:`send_invitation`): the invitation
goes to the e-mail address of the doctor's account, and its views never show that
address (``email`` is null, ``doctor_id`` says whom it invites): the organization learns
it only when the doctor accepts and becomes a member. Sending, listing and revoking are
the organization's ``ORG:ADMIN``\\ s' (the policy's ``organization.manage``).
"""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter, Depends
from pydantic import BaseModel, EmailStr, Field

from fhir_server.caller import FhirUnit
from fhir_server.ids import new_id
from platform_api.auth import users
from platform_api.auth.one_time import TOKENS, Purpose, invalid, token_hash
from platform_api.auth.tokens import parse_rfc3339, rfc3339
from platform_api.envelope import (
    ApiError,
    Envelope,
    PageEnvelope,
    Pagination,
    conflict,
    created,
    not_found,
    ok,
    pagination,
)
from platform_api.facade import ApiContext, api_context, require_organization
from platform_api.organizations.members import (
    MemberView,
    OrgRole,
    change_members,
    documents_page,
    find_member,
    member_document,
    member_view,
    stage_addition,
)

JSON = dict[str, Any]
INVITATIONS = "org_invitations"
ORG_INVITATION = Purpose("org-invitation", "inv_", "INVALID_INVITATION")
INVITATION_SENT = "platform.organization.invitation_sent"
INVITATION_REVOKED = "platform.organization.invitation_revoked"
PENDING, ACCEPTED, REVOKED, EXPIRED = "pending", "accepted", "revoked", "expired"


class InvitationCreate(BaseModel):
    email: EmailStr = Field(examples=["achieng.otieno@kibera-clinic.example.org"])
    role: OrgRole = Field(examples=["ORG:DOCTOR"])


class InvitationView(BaseModel):
    id: str
    organization_id: str
    email: str | None = Field(description="The address invited; null for a doctor invited "
                              "by their profile (see doctor_id)")
    doctor_id: str | None = Field(default=None, description="The doctor profile invited")
    role: str
    status: str
    invited_by: str
    created_at: str
    expires_at: str
    accepted_by: str | None = None
    email_sent: bool | None = None


class AcceptInvitation(BaseModel):
    token: str = Field(min_length=1, max_length=256)


def invitation_view(invitation: JSON, **extra: Any) -> JSON:
    status = invitation["status"]
    if status == PENDING and parse_rfc3339(invitation["expires_at"]) <= time.time():
        status = EXPIRED
    fields = {k: v for k, v in invitation.items() if k in InvitationView.model_fields}
    if invitation.get("doctor_id"):  # the doctor's address is theirs to give, on accepting
        fields["email"] = None
    return InvitationView.model_validate({**fields, "status": status, **extra}).model_dump()


router = APIRouter(prefix="/api/organizations", tags=["organizations"])


@router.get("/{org_id}/invitations", response_model=PageEnvelope[InvitationView],
            summary="List an organization's invitations, newest first")
async def list_invitations(org_id: str, page: Pagination = Depends(pagination),
                           ctx: ApiContext = Depends(api_context)) -> Any:
    await require_organization(ctx, org_id, "organization.manage")
    found, total = await documents_page(ctx, INVITATIONS, {"organization_id": org_id}, page,
                                        "created_at", descending=True)
    return page.respond([invitation_view(i) for i in found], total)


async def _check_invitable(ctx: ApiContext, org_id: str, email: str, who: str) -> None:
    """409 when ``email``'s account is a member already or an invitation to it waits
    (``who``: how the refusal names the invitee)."""
    account = await ctx.services.auth.find_user_by_email(email)
    if account is not None and await find_member(ctx, org_id, account["id"]) is not None:
        raise conflict("ALREADY_MEMBER", f"Already a member of this organization: {who}")
    waiting = await ctx.services.store.find_documents(
        INVITATIONS, {"organization_id": org_id, "email": email, "status": PENDING}, limit=20)
    if any(invitation_view(i)["status"] == PENDING for i in waiting):
        raise conflict("INVITATION_PENDING", f"An invitation to {who} is already waiting; "
                       "revoke it to send another")


@router.post("/{org_id}/invitations", status_code=201, response_model=Envelope[InvitationView],
             summary="Invite someone by e-mail to join the organization with a role")
async def invite(org_id: str, body: InvitationCreate,
                 ctx: ApiContext = Depends(api_context)) -> Any:
    await require_organization(ctx, org_id, "organization.manage")
    return created(await send_invitation(ctx, org_id, str(body.email), body.role))


async def send_invitation(ctx: ApiContext, org_id: str, email: str, role: str, *,
                          doctor_id: str | None = None, user_id: str | None = None) -> JSON:
    """Store an invitation to ``email`` and mail its link (the caller may manage
    ``org_id``: checked by the route); its view. ``doctor_id``/``user_id``: a doctor
    invited by their profile, whose account alone may accept and whose address the views
    do not show."""
    services, email = ctx.services, users.normalize_email(email)
    mailer = services.auth.mailer
    if not mailer.enabled:
        raise ApiError(503, "EMAIL_DISABLED", "Invitations are sent by e-mail, and no SMTP "
                       "server is configured (HEALTHPLATFORM_SMTP_HOST)")
    await _check_invitable(ctx, org_id, email, "this doctor" if doctor_id else email)
    ttl, now = services.settings.invitation_ttl_seconds, time.time()
    invitation: JSON = {
        "id": new_id(), "organization_id": org_id, "email": email, "role": role,
        "status": PENDING, "invited_by": ctx.principal.user_id, "created_at": rfc3339(now),
        "expires_at": rfc3339(now + ttl), "accepted_by": None,
        **({"doctor_id": doctor_id, "user_id": user_id} if doctor_id else {})}
    unit = ctx.unit()
    async with unit:
        token = services.auth.one_time.stage(unit.uow, ORG_INVITATION, "", ttl,
                                             invitation_id=invitation["id"], email=email)
        invitation["token_id"] = token_hash(token)
        unit.put_document(INVITATIONS, invitation["id"], invitation)
        unit.emit(INVITATION_SENT, {k: invitation[k] for k in (
            "organization_id", "email", "role", "invited_by")} | {
            "invitation_id": invitation["id"], "doctor_id": doctor_id},
            source_service="organizations")
        await unit.commit()
    # Organizations are directory entries any signed-in user may read.
    organization = await ctx.fhir.read_json("Organization", org_id)
    if not await mailer.send(email, *_message(ctx, organization, role, token, ttl)):
        await _revoke(ctx, invitation)
        raise ApiError(502, "EMAIL_NOT_SENT", "The mail server did not take the invitation; "
                       "it was withdrawn, try again later")
    return invitation_view(invitation, email_sent=True)


def _message(ctx: ApiContext, organization: JSON, role: str, token: str, ttl: int
             ) -> tuple[str, str]:
    settings = ctx.services.settings
    base = (settings.web_app_url or settings.public_base_url).rstrip("/")
    name, days = organization.get("name", "an organization"), max(1, round(ttl / 86400))
    inviter = ctx.principal.email or "An administrator"
    return (f"You are invited to join {name} on {settings.service_name}", (
        f"Hello,\n\n{inviter} invites you to join {name} on {settings.service_name} as "
        f"{role}.\n\nTo accept, sign in (or create an account) with this e-mail address "
        f"and open:\n\n{base}/invitations/accept?token={token}\n\n"
        f"The link works once, for {days} day{'s' if days != 1 else ''}. If you do not "
        "expect this invitation, ignore this message.\n"))


async def _revoke(ctx: ApiContext, invitation: JSON) -> JSON:
    store = ctx.services.store
    revoked = {**invitation, "status": REVOKED}
    token = await store.get_document(TOKENS, invitation["token_id"])
    async with store.unit_of_work() as uow:
        uow.put_document(INVITATIONS, invitation["id"], revoked)
        if token is not None and token.get("used_at") is None:  # the link dies at once
            uow.put_document(TOKENS, token["id"], {**token, "used_at": rfc3339(time.time())})
        uow.emit(INVITATION_REVOKED, {"invitation_id": invitation["id"],
                                      "organization_id": invitation["organization_id"],
                                      "revoked_by": ctx.principal.user_id},
                 source_service="organizations")
        await uow.commit()
    return revoked


@router.delete("/{org_id}/invitations/{invitation_id}", response_model=Envelope[InvitationView],
               summary="Revoke a pending invitation (its link stops working at once)")
async def revoke_invitation(org_id: str, invitation_id: str,
                            ctx: ApiContext = Depends(api_context)) -> Any:
    await require_organization(ctx, org_id, "organization.manage")
    invitation = await ctx.services.store.get_document(INVITATIONS, invitation_id)
    if invitation is None or invitation["organization_id"] != org_id:
        raise not_found("Invitation")
    if invitation["status"] != PENDING:
        raise conflict("INVITATION_NOT_PENDING", f"This invitation is {invitation['status']}")
    return ok(invitation_view(await _revoke(ctx, invitation)))


@router.post("/invitations/accept", response_model=Envelope[MemberView],
             summary="Accept an invitation (signed in with the invited e-mail address)")
async def accept_invitation(body: AcceptInvitation,
                            ctx: ApiContext = Depends(api_context)) -> Any:
    services = ctx.services
    token = await services.auth.one_time.find(ORG_INVITATION, body.token)
    invitation = await services.store.get_document(INVITATIONS, token["invitation_id"])
    if invitation is None or invitation["status"] != PENDING:
        raise invalid(ORG_INVITATION, "no longer valid")
    ctx.authorize("invitation.accept", user_id=await _invitee(ctx, invitation))
    account = await services.store.get_document(users.COLLECTION, ctx.principal.user_id)
    if account is None:
        raise invalid(ORG_INVITATION, "no longer valid")
    org_id = invitation["organization_id"]
    member = member_document(org_id, account["id"], invitation["role"], account)

    async def stage(unit: FhirUnit) -> JSON:
        if await find_member(ctx, org_id, account["id"]) is not None:
            raise conflict("ALREADY_MEMBER", "You are already a member of this organization")
        services.auth.one_time.stage_use(unit.uow, token)
        unit.put_document(INVITATIONS, invitation["id"], {
            **invitation, "status": ACCEPTED, "accepted_by": account["id"]})
        stage_addition(unit, member)
        return {"action": "added", "user_id": account["id"], "role": member["role"],
                "invitation_id": invitation["id"]}

    organization = await ctx.fhir.find_json("Organization", org_id)
    if organization is None or organization.get("active") is False:
        raise conflict("ORGANIZATION_INACTIVE", "This organization is suspended or closed")
    await change_members(ctx, org_id, stage)
    services.policy.membership_changed(account["id"])
    return ok(member_view(member))



async def _invitee(ctx: ApiContext, invitation: JSON) -> str | None:
    """The account an invitation is for: the doctor's own, or the one holding the invited
    address (None: no account has it yet)."""
    if invitation.get("user_id"):
        return str(invitation["user_id"])
    account = await ctx.services.auth.find_user_by_email(invitation["email"])
    return None if account is None else str(account["id"])
