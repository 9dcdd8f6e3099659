"""Organizations area: facilities as FHIR Organization, membership as documents.

Mapping (/api → FHIR Organization):
    name → Organization.name
    type → Organization.type[0].text (e.g. "hospital", "clinic", "laboratory")
    phone, email → Organization.telecom (system phone / email)
    address → Organization.address[0].text
    country → Organization.address[0].country
    status → Organization.active (active ⇔ true)

An Organization owns itself (``meta.security`` ``urn:healthplatform:organization|<id>``,
see ``fhir_server.ownership``): its ``ORG:ADMIN`` members may change it; every signed-in
user may read it (the directory).

Membership (who works where, with which ``ORG:<ROLE>``) is platform bookkeeping, kept in
the ``org_members`` documents (id ``<org_id>:<user_id>``); the access policy reads it to
know whose organizations a caller acts for. The creator of an organization becomes its
``ORG:ADMIN`` in the same unit of work (event ``platform.organization.member_added``).
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends
from pydantic import BaseModel, EmailStr, Field

from fhir_server.clock import now_instant
from fhir_server.ids import new_id
from platform_api.envelope import Envelope, PageEnvelope, Pagination, created, pagination
from platform_api.facade import ApiContext, Facade, api_context, require_member, staged_body
from platform_api.policy.roles import ORG_ADMIN

MEMBERS = "org_members"
JSON = dict[str, Any]


class OrganizationCreate(BaseModel):
    name: str = Field(min_length=1, max_length=200, examples=["Kibera Community Clinic"])
    type: str | None = Field(default=None, examples=["clinic"])
    phone: str | None = Field(default=None, pattern=r"^\+[1-9]\d{6,14}$")
    email: EmailStr | None = None
    address: str | None = None
    country: str | None = Field(default=None, min_length=2, max_length=2, examples=["KE"])


class OrganizationView(OrganizationCreate):
    id: str
    status: str
    updated_at: str | None = None


class MemberView(BaseModel):
    organization_id: str
    user_id: str
    role: str
    joined_at: str


def organization_to_fhir(payload: JSON, ctx: ApiContext | None, existing: JSON | None
                         ) -> JSON:
    org: JSON = dict(existing) if existing else {"resourceType": "Organization", "active": True}
    if "name" in payload:
        org["name"] = payload["name"]
    if payload.get("type") is not None:
        org["type"] = [{"text": payload["type"]}]
    telecom = [t for t in org.get("telecom", []) if t.get("system") not in ("phone", "email")
               or (t.get("system") == "phone" and "phone" not in payload)
               or (t.get("system") == "email" and "email" not in payload)]
    for system in ("phone", "email"):
        if payload.get(system):
            telecom.append({"system": system, "value": str(payload[system]), "use": "work"})
    if telecom:
        org["telecom"] = telecom
    if payload.get("address") or payload.get("country"):
        address = dict((org.get("address") or [{}])[0])
        if payload.get("address"):
            address["text"] = payload["address"]
        if payload.get("country"):
            address["country"] = payload["country"].upper()
        org["address"] = [address]
    return org


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
        "country": address.get("country"),
        "status": "active" if org.get("active", True) else "inactive",
        "updated_at": org.get("meta", {}).get("lastUpdated"),
    }


organizations = Facade(
    resource="Organization", name="Organization", create=OrganizationCreate,
    view=OrganizationView, to_fhir=organization_to_fhir, from_fhir=organization_from_fhir,
    tags=["organizations"], summaries={"get": "Get an organization"},
)


def member_document(org_id: str, user_id: str, role: str) -> JSON:
    return {"id": f"{org_id}:{user_id}", "organization_id": org_id, "user_id": user_id,
            "role": role, "joined_at": now_instant()}


router = APIRouter(prefix="/api/organizations", tags=["organizations"])


@router.post("", status_code=201, response_model=Envelope[OrganizationView],
             summary="Create an organization (the caller becomes its ORG:ADMIN)")
async def create_organization(body: OrganizationCreate,
                              ctx: ApiContext = Depends(api_context)) -> Any:
    org_id = new_id()
    founder = ctx.with_access(ctx.access.adopting(org_id, ORG_ADMIN))
    member = member_document(org_id, ctx.principal.user_id, ORG_ADMIN)
    unit = founder.unit()
    async with unit:
        staged = await unit.create(organization_to_fhir(body.model_dump(exclude_none=True),
                                                        founder, None),
                                   resource_id=org_id, expected_type="Organization")
        unit.put_document(MEMBERS, member["id"], member)
        unit.emit("platform.organization.member_added",
                  {"organization_id": org_id, "user_id": ctx.principal.user_id,
                   "role": ORG_ADMIN}, source_service="organizations")
        await unit.commit()
    ctx.services.policy.membership_changed(ctx.principal.user_id)
    return created(organizations.from_fhir(staged_body(staged)))


@router.get("/{org_id}/members", response_model=PageEnvelope[MemberView],
            summary="List the members of an organization")
async def list_members(org_id: str, page: Pagination = Depends(pagination),
                       ctx: ApiContext = Depends(api_context)) -> Any:
    await require_member(ctx, org_id)
    store = ctx.services.store
    where = {"organization_id": org_id}
    members = await store.find_documents(MEMBERS, where, limit=page.limit,
                                         offset=page.offset, order_by="joined_at")
    total = await store.count_documents(MEMBERS, where)
    return page.respond([MemberView(**m).model_dump() for m in members], total)


organizations.mount(router, "", ops=("get",))
