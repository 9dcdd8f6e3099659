"""Organizations area: facilities as FHIR Organization, membership as documents.

Mapping (/api → FHIR Organization):
    name → Organization.name
    type → Organization.type[0].text (e.g. "hospital", "clinic", "laboratory")
    phone, email → Organization.telecom (system phone / email)
    address → Organization.address[0].text
    country → Organization.address[0].country
    status → Organization.active (active ⇔ true)

Membership (who works where, with which ``ORG:<ROLE>``) is platform bookkeeping, kept in
the ``org_members`` documents (id ``<org_id>:<user_id>``); the creator of an organization
becomes its ``ORG:ADMIN``.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request
from pydantic import BaseModel, EmailStr, Field

from fhir_server.store.sqlite import now_instant
from platform_api.auth.dependencies import current_principal
from platform_api.auth.principal import Principal
from platform_api.envelope import Envelope, PageEnvelope, Pagination, created, ok, pagination
from platform_api.facade import Facade, MappingContext, require
from platform_api.services import Services

MEMBERS = "org_members"
ORG_ADMIN = "ORG:ADMIN"
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


def organization_to_fhir(payload: JSON, ctx: MappingContext, existing: JSON | None) -> JSON:
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
    resource="Organization", name="Organization",
    create_model=OrganizationCreate, view_model=OrganizationView,
    to_fhir=organization_to_fhir, from_fhir=organization_from_fhir,
)


async def membership(services: Services, org_id: str, user_id: str) -> JSON | None:
    return await services.store.get_document(MEMBERS, f"{org_id}:{user_id}")


async def require_member(services: Services, principal: Principal, org_id: str) -> JSON | None:
    """The caller's membership of ``org_id``; platform admins pass without one."""
    await organizations.load(services, org_id)  # 404 for an unknown organization
    member = await membership(services, org_id, principal.user_id)
    require(principal.is_platform_admin or member is not None,
            "You are not a member of this organization")
    return member


def member_document(org_id: str, user_id: str, role: str) -> JSON:
    return {"id": f"{org_id}:{user_id}", "organization_id": org_id, "user_id": user_id,
            "role": role, "joined_at": now_instant()}


router = APIRouter(prefix="/api/organizations", tags=["organizations"])


def _services(request: Request) -> Services:
    return request.app.state.services  # type: ignore[no-any-return]


@router.post("", status_code=201, response_model=Envelope[OrganizationView],
             summary="Create an organization (the caller becomes its ORG:ADMIN)")
async def create_organization(request: Request, body: OrganizationCreate,
                              principal: Principal = Depends(current_principal)) -> Any:
    services = _services(request)
    ctx = MappingContext(principal, services)
    async with services.store.unit_of_work() as uow:
        org = organizations.stage_new(uow, body.model_dump(exclude_none=True), ctx)
        member = member_document(org["id"], principal.user_id, ORG_ADMIN)
        uow.put_document(MEMBERS, member["id"], member)
        uow.emit("platform.organization.member_added",
                 {"organization_id": org["id"], "user_id": principal.user_id, "role": ORG_ADMIN},
                 source_service="organizations")
        await uow.commit()
    resource, _ = await organizations.load(services, org["id"])
    return created(organizations.view(resource))


@router.get("/{org_id}", response_model=Envelope[OrganizationView],
            summary="Get an organization")
async def get_organization(request: Request, org_id: str,
                           principal: Principal = Depends(current_principal)) -> Any:
    services = _services(request)
    resource, _ = await organizations.load(services, org_id)
    return ok(organizations.view(resource))


@router.get("/{org_id}/members", response_model=PageEnvelope[MemberView],
            summary="List the members of an organization")
async def list_members(request: Request, org_id: str, page: Pagination = Depends(pagination),
                       principal: Principal = Depends(current_principal)) -> Any:
    services = _services(request)
    await require_member(services, principal, org_id)
    where = {"organization_id": org_id}
    members = await services.store.find_documents(MEMBERS, where, limit=page.limit,
                                                  offset=page.offset, order_by="joined_at")
    total = await services.store.count_documents(MEMBERS, where)
    return page.respond([MemberView(**m).model_dump() for m in members], total)
