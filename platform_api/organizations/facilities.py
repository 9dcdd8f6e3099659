"""Organizations (facilities) as FHIR Organization, with their status.

Mapping (/api → FHIR Organization):
    name → Organization.name
    type → Organization.type[0].text (e.g. "hospital", "clinic", "laboratory")
    phone, email → Organization.telecom (system phone / email)
    address → Organization.address[0].text
    city → Organization.address[0].city
    country → Organization.address[0].country
    status → Organization.active (true only when active) and the tag
             ``urn:healthplatform:organization-status|<active|suspended|closed>``

Status moves (``PATCH /api/organizations/:id/status``): active → suspended | closed;
suspended → active | closed; closed is final. Platform administrators make every move;
an organization's own ``ORG:ADMIN`` may only close it. A suspended or closed
organization's members lose access to its data — /api and /fhir alike — until it is
reactivated: the access policy counts only memberships of active organizations
(:mod:`platform_api.policy.subject`).

An Organization owns itself (``meta.security`` ``urn:healthplatform:organization|<id>``,
see ``fhir_server.ownership``): its ``ORG:ADMIN`` members may change it (``PUT``); every
signed-in user may read it (the directory, ``GET /api/organizations``: active
organizations only, every status for platform administrators). ``GET
/api/organizations/me`` lists the caller's memberships with their roles, whatever the
organization's status.

The creator of an organization becomes its ``ORG:ADMIN`` in the same unit of work
(event ``platform.organization.member_added``). A status change emits
``platform.organization.status_changed`` (``organization_id``, ``status``,
``previous_status``, ``reason``, ``changed_by``).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends
from pydantic import BaseModel, EmailStr, Field

from fhir_server.ids import new_id
from platform_api.auth.users import COLLECTION as USERS
from platform_api.envelope import (
    Envelope,
    PageEnvelope,
    Pagination,
    created,
    pagination,
)
from platform_api.facade import (
    ApiContext,
    Events,
    Facade,
    ItemContext,
    SearchParam,
    StatusTable,
    api_context,
    staged_body,
)
from platform_api.organizations.members import (
    MEMBERS,
    MemberView,
    documents_page,
    member_document,
    member_view,
    stage_addition,
)
from platform_api.policy.roles import ORG_ADMIN

JSON = dict[str, Any]
STATUS_TAG = "urn:healthplatform:organization-status"
STATUS_CHANGED = "platform.organization.status_changed"
OrgStatus = Literal["active", "suspended", "closed"]
ORGANIZATION_STATUS = StatusTable.of(
    active=("suspended", "closed"),
    suspended=("active", "closed"),
    closed=(),
)
# The workflow action each move is (who may: platform_api.policy.actions.organizations):
# platform administrators make every allowed move; an organization's ORG:ADMIN only
# closes it.
MOVE_ACTIONS = {"active": "organization.suspend", "suspended": "organization.suspend",
                "closed": "organization.close"}


class OrganizationCreate(BaseModel):
    name: str = Field(min_length=1, max_length=200, examples=["Kibera Community Clinic"])
    type: str | None = Field(default=None, max_length=100, examples=["clinic"])
    phone: str | None = Field(default=None, pattern=r"^\+[1-9]\d{6,14}$")
    email: EmailStr | None = None
    address: str | None = Field(default=None, max_length=500)
    city: str | None = Field(default=None, max_length=100, examples=["Nairobi"])
    country: str | None = Field(default=None, min_length=2, max_length=2, examples=["KE"])


class OrganizationUpdate(BaseModel):
    name: str | None = Field(default=None, min_length=1, max_length=200)
    type: str | None = Field(default=None, max_length=100)
    phone: str | None = Field(default=None, pattern=r"^\+[1-9]\d{6,14}$")
    email: EmailStr | None = None
    address: str | None = Field(default=None, max_length=500)
    city: str | None = Field(default=None, max_length=100)
    country: str | None = Field(default=None, min_length=2, max_length=2)


class OrganizationView(OrganizationCreate):
    id: str
    status: str
    updated_at: str | None = None


class MyOrganizationView(BaseModel):
    organization: OrganizationView | None
    membership: MemberView


class OrganizationQuery(BaseModel):
    name: Annotated[str | None, SearchParam("name")] = Field(
        None, max_length=200, description="Name, or the start of a word of it")
    type: Annotated[str | None, SearchParam("type:text")] = Field(None, max_length=100)
    city: Annotated[str | None, SearchParam("address-city")] = Field(None, max_length=100)
    country: Annotated[str | None, SearchParam("address-country")] = Field(
        None, min_length=2, max_length=2)
    status: OrgStatus | None = Field(None, description="Platform administrators only: "
                                     "others see active organizations")


class StatusChange(BaseModel):
    status: OrgStatus
    reason: str | None = Field(default=None, max_length=1000,
                               examples=["Operating licence under review"])


# -- mapping ----------------------------------------------------------------------------------
def _set_telecom(org: JSON, payload: JSON) -> None:
    kept = [t for t in org.get("telecom", []) if t.get("system") not in payload
            or t.get("system") not in ("phone", "email")]
    added = [{"system": system, "value": str(payload[system]), "use": "work"}
             for system in ("phone", "email") if payload.get(system)]
    if kept or added:
        org["telecom"] = [*kept, *added]
    else:
        org.pop("telecom", None)


def organization_to_fhir(payload: JSON, ctx: ApiContext | None, existing: JSON | None
                         ) -> JSON:
    org: JSON = dict(existing) if existing else {"resourceType": "Organization",
                                                 "active": True}
    if existing is None:
        org = with_status(org, "active")
    if payload.get("name"):
        org["name"] = payload["name"]
    if payload.get("type") is not None:
        org["type"] = [{"text": payload["type"]}]
    _set_telecom(org, payload)
    if any(payload.get(k) for k in ("address", "city", "country")):
        address = dict((org.get("address") or [{}])[0])
        for field, element in (("address", "text"), ("city", "city")):
            if payload.get(field):
                address[element] = payload[field]
        if payload.get("country"):
            address["country"] = payload["country"].upper()
        org["address"] = [address, *(org.get("address") or [])[1:]]
    return org


def with_status(org: JSON, status: str) -> JSON:
    meta = dict(org.get("meta") or {})
    tags = [t for t in meta.get("tag") or [] if t.get("system") != STATUS_TAG]
    meta["tag"] = [*tags, {"system": STATUS_TAG, "code": status}]
    return {**org, "meta": meta, "active": status == "active"}


def organization_status(org: JSON) -> str:
    for tag in (org.get("meta") or {}).get("tag") or []:
        if tag.get("system") == STATUS_TAG and tag.get("code"):
            return str(tag["code"])
    return "active" if org.get("active", True) else "inactive"


def organization_from_fhir(org: JSON) -> JSON:
    telecom = {t.get("system"): t.get("value") for t in org.get("telecom", [])}
    address = (org.get("address") or [{}])[0]
    return {
        "id": org["id"],
        "name": org.get("name", ""),
        "type": (org.get("type") or [{}])[0].get("text"),
        "phone": telecom.get("phone"),
        "email": telecom.get("email"),
        "address": address.get("text"),
        "city": address.get("city"),
        "country": address.get("country"),
        "status": organization_status(org),
        "updated_at": org.get("meta", {}).get("lastUpdated"),
    }


def _directory_criteria(ctx: ApiContext, query: OrganizationQuery | None
                        ) -> list[tuple[str, str]]:
    """Active organizations for everyone; any status, or the one asked, for platform
    administrators."""
    wanted = query.status if query is not None else None
    if wanted not in (None, "active"):
        ctx.authorize("organization.list-inactive")
    elif not ctx.may("organization.list-inactive"):
        wanted = "active"
    if wanted == "active":
        return [("active", "true")]
    return [("_tag", f"{STATUS_TAG}|{wanted}")] if wanted else []


organizations = Facade(
    resource="Organization", name="Organization", create=OrganizationCreate,
    update=OrganizationUpdate, view=OrganizationView, query=OrganizationQuery,
    to_fhir=organization_to_fhir, from_fhir=organization_from_fhir,
    list_criteria=_directory_criteria, sort="name", statuses=ORGANIZATION_STATUS,
    events=Events(updated="platform.organization.updated"), tags=["organizations"],
    summaries={"get": "Get an organization",
               "list": "The directory of organizations (active ones; any status for "
                       "platform administrators)",
               "update": "Change an organization (its ORG:ADMIN; only the fields sent)"},
)

router = APIRouter(prefix="/api/organizations", tags=["organizations"])


@router.post("", status_code=201, response_model=Envelope[OrganizationView],
             summary="Create an organization (the caller becomes its ORG:ADMIN)")
async def create_organization(body: OrganizationCreate,
                              ctx: ApiContext = Depends(api_context)) -> Any:
    org_id = new_id()
    founder = ctx.with_access(ctx.access.adopting(org_id, ORG_ADMIN))
    account = await ctx.services.store.get_document(USERS, ctx.principal.user_id)
    unit = founder.unit()
    async with unit:
        staged = await unit.create(organization_to_fhir(body.model_dump(exclude_none=True),
                                                        founder, None),
                                   resource_id=org_id, expected_type="Organization")
        stage_addition(unit, member_document(org_id, ctx.principal.user_id, ORG_ADMIN,
                                             account))
        await unit.commit()
    ctx.services.policy.membership_changed(ctx.principal.user_id)
    return created(organization_from_fhir(staged_body(staged)))


@router.get("/me", response_model=PageEnvelope[MyOrganizationView],
            summary="The caller's organizations, with their role in each")
async def my_organizations(page: Pagination = Depends(pagination),
                           ctx: ApiContext = Depends(api_context)) -> Any:
    memberships, total = await documents_page(ctx, MEMBERS, {"user_id": ctx.principal.user_id},
                                              page, "joined_at")
    found = await ctx.fhir.search("Organization", [
        ("_id", ",".join(m["organization_id"] for m in memberships))]) if memberships else []
    by_id = {o["id"]: organization_from_fhir(o) for o in found}
    return page.respond([{"organization": by_id.get(m["organization_id"]),
                          "membership": member_view(m)} for m in memberships], total)


organizations.mount(router, "", ops=("list", "get", "update"))


@organizations.route("PATCH", "/{resource_id}/status", body=StatusChange,
                     summary="Suspend, reactivate or close an organization")
async def change_status(ctx: ItemContext[StatusChange]) -> JSON:
    """Platform administrators make every allowed move; the organization's ORG:ADMIN may
    close it. Members of a suspended or closed organization lose access to its data."""
    assert ctx.body is not None
    target, current = ctx.body.status, organization_status(ctx.resource)
    ctx.authorize(MOVE_ACTIONS[target], ctx.id)
    ORGANIZATION_STATUS.check(current, target)
    return await ctx.save(with_status(ctx.resource, target), event=STATUS_CHANGED, payload={
        "organization_id": ctx.id, "status": target, "previous_status": current,
        "reason": ctx.body.reason, "changed_by": ctx.principal.user_id})
