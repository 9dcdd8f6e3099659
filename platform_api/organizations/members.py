"""Members of an organization: who works where, with which ``ORG:<ROLE>``.

Membership is platform bookkeeping, not health data: one ``org_members`` document per
member (id ``<org_id>:<user_id>``: ``organization_id``, ``user_id``, ``role``,
``joined_at``, and the member's name and e-mail as they were when they joined). The
access policy reads these documents to know whose organizations a caller acts for
(:mod:`platform_api.policy.subject`), so every change here drops the member's cached
subject at once.

Rules (data, next to the routes):

- roles are the policy's ``ORG:<ROLE>``\\ s (``platform_api.policy.roles.ORG_ROLES``);
- an organization keeps at least one ``ORG:ADMIN``: demoting or removing the last one is
  409 ``LAST_ADMIN``;
- the organization's ``ORG:ADMIN``\\ s (and platform administrators) change roles and
  remove members; a member may remove themselves (leave). The access policy decides
  (``organization.manage``, ``member.remove``: :mod:`platform_api.policy.actions`).

Concurrent changes of one organization's members take turns: each change inserts the
next entry of the organization's membership log (``org_membership_log``, id
``<org_id>:<n>``) in the unit of work of the change; two changes that read the same
``n`` cannot both insert it, so the loser reads the members again (two administrators
demoting each other at once cannot leave the organization without one). The log is
also the record of who changed what.

Events: ``platform.organization.member_added`` (``organization_id``, ``user_id``,
``role``), ``platform.organization.member_role_changed`` (``…``, ``previous_role``,
``changed_by``), ``platform.organization.member_removed`` (``organization_id``,
``user_id``, ``role``, ``removed_by``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Literal

from fastapi import APIRouter, Depends
from pydantic import BaseModel, Field

from fhir_server.caller import FhirUnit
from fhir_server.clock import now_instant
from fhir_server.store import DuplicateDocument
from platform_api.envelope import (
    ApiError,
    Envelope,
    PageEnvelope,
    Pagination,
    conflict,
    not_found,
    ok,
    pagination,
)
from platform_api.facade import ApiContext, api_context, require_organization
from platform_api.policy.roles import ORG_ADMIN, ORG_ROLES

JSON = dict[str, Any]
MEMBERS = "org_members"
MEMBERSHIP_LOG = "org_membership_log"
MEMBERSHIP_VERSIONS = "org_membership_versions"
MEMBER_ADDED = "platform.organization.member_added"
MEMBER_ROLE_CHANGED = "platform.organization.member_role_changed"
MEMBER_REMOVED = "platform.organization.member_removed"
SOURCE = "organizations"
CHANGE_ATTEMPTS = 5
OrgRole = Literal["ORG:ADMIN", "ORG:DOCTOR", "ORG:NURSE", "ORG:LAB", "ORG:PHARMACIST",
                  "ORG:RECEPTIONIST", "ORG:BILLING"]
assert set(OrgRole.__args__) == set(ORG_ROLES)  # type: ignore[attr-defined]


class MemberView(BaseModel):
    organization_id: str
    user_id: str
    role: str
    joined_at: str
    first_name: str | None = None
    last_name: str | None = None
    email: str | None = None


class RoleChange(BaseModel):
    role: OrgRole = Field(examples=["ORG:NURSE"])


def member_document(org_id: str, user_id: str, role: str, user: JSON | None = None) -> JSON:
    """A membership document (``user``: the account, for the name and e-mail shown)."""
    person = {k: (user or {}).get(k) for k in ("first_name", "last_name", "email")}
    return {"id": f"{org_id}:{user_id}", "organization_id": org_id, "user_id": user_id,
            "role": role, "joined_at": now_instant(), **person}


def member_view(member: JSON) -> JSON:
    return MemberView.model_validate(member).model_dump()


async def documents_page(ctx: ApiContext, collection: str, where: JSON, page: Pagination,
                         order_by: str, *, descending: bool = False) -> tuple[list[JSON], int]:
    """One page of bookkeeping documents, with their total."""
    store = ctx.services.store
    found = await store.find_documents(collection, where, limit=page.limit,
                                       offset=page.offset, order_by=order_by,
                                       descending=descending)
    return found, await store.count_documents(collection, where)


async def find_member(ctx: ApiContext, org_id: str, user_id: str) -> JSON | None:
    return await ctx.services.store.get_document(MEMBERS, f"{org_id}:{user_id}")


# -- changes, one at a time per organization ------------------------------------------------
async def change_members(ctx: ApiContext, org_id: str,
                         stage: Callable[[FhirUnit], Awaitable[JSON]]) -> JSON:
    """Run ``stage(unit)`` (it reads the members it needs, stages its documents and
    events, and returns the entry for the membership log) and commit it as the
    organization's next membership change; again when another change took that turn."""
    store = ctx.services.store
    for _attempt in range(CHANGE_ATTEMPTS):
        counter = await store.get_document(MEMBERSHIP_VERSIONS, org_id)
        turn = (counter or {}).get("version", 0) + 1
        unit = ctx.fhir.unit()  # a fresh unit of work for each attempt
        try:
            async with unit:
                entry = await stage(unit)
                unit.insert_document(MEMBERSHIP_LOG, f"{org_id}:{turn}", {
                    "id": f"{org_id}:{turn}", "organization_id": org_id, "turn": turn,
                    "by": ctx.principal.user_id, "at": now_instant(), **entry})
                unit.put_document(MEMBERSHIP_VERSIONS, org_id, {"id": org_id, "version": turn})
                await unit.commit()
        except DuplicateDocument:
            if await store.get_document(MEMBERSHIP_LOG, f"{org_id}:{turn}") is None:
                raise  # a duplicate of something else (the member itself): the caller's
            continue
        return entry
    raise ApiError(409, "CONFLICT", "The organization's members kept changing; retry")


async def _other_admins(ctx: ApiContext, org_id: str, user_id: str) -> int:
    admins = await ctx.services.store.find_documents(
        MEMBERS, {"organization_id": org_id, "role": ORG_ADMIN}, limit=2)
    return sum(1 for a in admins if a["user_id"] != user_id)


async def _keep_an_admin(ctx: ApiContext, member: JSON, new_role: str | None) -> None:
    if member["role"] == ORG_ADMIN and new_role != ORG_ADMIN \
            and not await _other_admins(ctx, member["organization_id"], member["user_id"]):
        raise conflict("LAST_ADMIN", "An organization keeps at least one ORG:ADMIN: make "
                       "another member ORG:ADMIN first")


# -- routes -----------------------------------------------------------------------------------
router = APIRouter(prefix="/api/organizations", tags=["organizations"])


@router.get("/{org_id}/members", response_model=PageEnvelope[MemberView],
            summary="List the members of an organization")
async def list_members(org_id: str, page: Pagination = Depends(pagination),
                       ctx: ApiContext = Depends(api_context)) -> Any:
    await require_organization(ctx, org_id)
    members, total = await documents_page(ctx, MEMBERS, {"organization_id": org_id}, page,
                                          "joined_at")
    return page.respond([member_view(m) for m in members], total)


@router.patch("/{org_id}/members/{user_id}/role", response_model=Envelope[MemberView],
              summary="Change a member's role (an organization keeps one ORG:ADMIN)")
async def change_role(org_id: str, user_id: str, body: RoleChange,
                      ctx: ApiContext = Depends(api_context)) -> Any:
    await require_organization(ctx, org_id, "organization.manage")

    async def stage(unit: FhirUnit) -> JSON:
        member = await find_member(ctx, org_id, user_id)
        if member is None:
            raise not_found("Member")
        await _keep_an_admin(ctx, member, body.role)
        changed = {**member, "role": body.role}
        unit.put_document(MEMBERS, member["id"], changed)
        if member["role"] != body.role:
            unit.emit(MEMBER_ROLE_CHANGED, {
                "organization_id": org_id, "user_id": user_id, "role": body.role,
                "previous_role": member["role"], "changed_by": ctx.principal.user_id},
                source_service=SOURCE)
        return {"action": "role_changed", "user_id": user_id, "role": body.role,
                "previous_role": member["role"], "member": changed}

    entry = await change_members(ctx, org_id, stage)
    ctx.services.policy.membership_changed(user_id)
    return ok(member_view(entry["member"]))


@router.delete("/{org_id}/members/{user_id}", response_model=Envelope[MemberView],
               summary="Remove a member (administrators), or leave (the member)")
async def remove_member(org_id: str, user_id: str,
                        ctx: ApiContext = Depends(api_context)) -> Any:
    # Organizations are directory entries any signed-in user may read.
    if await ctx.fhir.find_json("Organization", org_id) is None:
        raise not_found("Organization")
    ctx.authorize("member.remove", org_id, user_id=user_id)

    async def stage(unit: FhirUnit) -> JSON:
        member = await find_member(ctx, org_id, user_id)
        if member is None:
            raise not_found("Member")
        await _keep_an_admin(ctx, member, None)
        stage_removal(unit, member, ctx.principal.user_id)
        return {"action": "removed", "user_id": user_id, "role": member["role"],
                "member": member}

    entry = await change_members(ctx, org_id, stage)
    ctx.services.policy.membership_changed(user_id)
    return ok(member_view(entry["member"]))


def stage_removal(unit: FhirUnit, member: JSON, removed_by: str) -> None:
    unit.delete_document(MEMBERS, member["id"])
    unit.emit(MEMBER_REMOVED, {
        "organization_id": member["organization_id"], "user_id": member["user_id"],
        "role": member["role"], "removed_by": removed_by}, source_service=SOURCE)


def stage_addition(unit: FhirUnit, member: JSON) -> None:
    """Insert the membership (a member already there makes the commit fail with
    DuplicateDocument) with its ``member_added`` event."""
    unit.insert_document(MEMBERS, member["id"], member)
    unit.emit(MEMBER_ADDED, {"organization_id": member["organization_id"],
                             "user_id": member["user_id"], "role": member["role"]},
              source_service=SOURCE)
