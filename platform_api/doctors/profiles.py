"""Doctor profiles: creating and changing them, their verification by platform
administrators, and the organizations a doctor practises at.

- ``POST /api/doctors``: the caller's own profile (409 ``PROFILE_EXISTS``: one per user;
  a user who registered as DOCTOR already has one, made from
  ``platform.auth.user_created``). It starts ``pending`` verification and is linked at
  once to the organizations the user is a member of.
- ``GET /api/doctors/me``; ``PUT /api/doctors/:id`` (the doctor, or a platform
  administrator; only the fields sent change). A rejected profile that is changed goes
  back to ``pending``, and so does a verified one whose licence changes.
- ``GET /api/doctors/pending`` and ``PATCH /api/doctors/:id/verify`` (platform
  administrators): ``{decision: approve | reject, reason}``; a rejection needs its
  reason (422), an approval a licence number (409 ``INCOMPLETE_PROFILE``). Moves:
  pending → verified | rejected; rejected → verified | pending; verified → rejected |
  pending; others are 409 ``INVALID_TRANSITION``. Only verified doctors are public.
- ``POST /api/doctors/:id/organizations`` (``{organization_id}``): an ``ORG:ADMIN`` of
  that organization (or a platform administrator) adds the doctor (the doctor's account
  becomes an ``ORG:DOCTOR`` member, ``platform.organization.member_added``), or the
  doctor links themselves to an organization they are already a member of; either way
  a PractitionerRole for the organization (409 ``ALREADY_LINKED``).
- ``DELETE /api/doctors/:id/organizations/:org_id``: the doctor leaves (or an
  ``ORG:ADMIN`` of it, or a platform administrator, removes them): the role goes, and an
  ``ORG:DOCTOR`` membership with it (``platform.organization.member_removed``).
- ``GET /api/organizations/:org_id/doctors``: the organization's doctors, for its
  members (one search over its PractitionerRoles, including the Practitioners).

Events: ``platform.doctors.profile_created``, ``…profile_updated`` (``doctor_id``,
``user_id``), ``…verification_decided`` (``doctor_id``, ``user_id``, ``status``,
``reason``, ``decided_by``), ``…organization_linked`` / ``…organization_unlinked``
(``doctor_id``, ``organization_id``).
"""

from __future__ import annotations

from typing import Any, Literal

from fastapi import APIRouter, Depends
from pydantic import BaseModel, Field

from fhir_server.access import SYSTEM
from fhir_server.caller import FhirUnit
from fhir_server.store import StoreError
from platform_api.auth.users import COLLECTION as USERS
from platform_api.doctors.records import (
    VERIFICATION_TAG,
    DoctorCreate,
    DoctorUpdate,
    DoctorView,
    decided,
    license_of,
    platform_fhir,
    practitioner_of_user,
    practitioner_role,
    practitioner_to_fhir,
    render,
    roles_of,
    specialties_concepts,
    user_of,
    verification_result,
    verification_status,
    with_tags,
)
from platform_api.envelope import (
    ApiError,
    Envelope,
    ErrorEnvelope,
    PageEnvelope,
    Pagination,
    conflict,
    created,
    forbidden,
    not_found,
    ok,
    pagination,
)
from platform_api.facade import (
    ApiContext,
    OrganizationScope,
    StatusTable,
    api_context,
    create_unique,
    is_duplicate,
    require_member,
    search_page,
    until_stable,
)
from platform_api.fhir_values import local_id
from platform_api.organizations.members import (
    MEMBERS,
    change_members,
    find_member,
    member_document,
    stage_addition,
    stage_removal,
)
from platform_api.policy.roles import ORG_ADMIN, ORG_DOCTOR
from platform_api.policy.subject import USER_SYSTEM
from platform_api.services import Services

JSON = dict[str, Any]
SOURCE = "doctors"
PROFILE_CREATED = "platform.doctors.profile_created"
PROFILE_UPDATED = "platform.doctors.profile_updated"
VERIFICATION_DECIDED = "platform.doctors.verification_decided"
LINKED = "platform.doctors.organization_linked"
UNLINKED = "platform.doctors.organization_unlinked"
VERIFICATION_MOVES = StatusTable.of(pending=("verified", "rejected"),
                                    rejected=("verified", "pending"),
                                    verified=("rejected", "pending"))


class VerifyRequest(BaseModel):
    decision: Literal["approve", "reject"]
    reason: str | None = Field(default=None, max_length=1000,
                               examples=["The licence number is not on the KMPDC register"])


class LinkRequest(BaseModel):
    organization_id: str = Field(min_length=1, max_length=64)


# -- the writes ----------------------------------------------------------------------------------
async def stage_org_role(unit: FhirUnit, practitioner_id: str, org_id: str,
                         specialties: list[JSON]) -> Any:
    """Stage the doctor's role at ``org_id`` (owned by it), unless one exists."""
    role = OrganizationScope().stamp(practitioner_role(practitioner_id, specialties, org_id),
                                     org_id)
    return await unit.create(role, expected_type="PractitionerRole", if_none_exist=[
        ("practitioner", f"Practitioner/{practitioner_id}"),
        ("organization", f"Organization/{org_id}")])


async def create_profile(services: Services, user_id: str, payload: JSON, *,
                         also: Any = None) -> JSON | None:
    """Create the user's doctor profile: the Practitioner, its own role, a pending
    VerificationResult and a role at each organization the user is a member of, in one
    unit of work; ``None`` when the user has a profile already. ``also(unit)`` stages more
    (an event receipt)."""
    unit = platform_fhir(services).unit()
    practitioner = practitioner_to_fhir(payload, None, user_id)
    specialties = specialties_concepts(payload.get("specialties") or [])
    memberships = await services.store.find_documents(MEMBERS, {"user_id": user_id},
                                                      limit=1000)
    try:
        async with unit:
            staged = await create_unique(unit, practitioner, [
                ("identifier", f"{USER_SYSTEM}|{user_id}")], expected_type="Practitioner",
                ownerless=True)
            await unit.create(practitioner_role(staged.id, specialties),
                              expected_type="PractitionerRole", ownerless=True)
            await unit.create(verification_result(staged.id),
                              expected_type="VerificationResult", ownerless=True)
            for member in memberships:
                await stage_org_role(unit, staged.id, member["organization_id"], specialties)
            unit.emit(PROFILE_CREATED, {"doctor_id": staged.id, "user_id": user_id},
                      source_service=SOURCE)
            if also is not None:
                also(unit)
            await unit.commit()
    except StoreError as exc:
        if is_duplicate(exc):
            return None
        raise
    return await platform_fhir(services).read_json("Practitioner", staged.id)


async def load_doctor(ctx: ApiContext, doctor_id: str) -> JSON:
    found = await platform_fhir(ctx.services).find_json("Practitioner", doctor_id)
    if found is None:
        raise not_found("Doctor")
    return found


def require_self_or_admin(ctx: ApiContext, practitioner: JSON) -> None:
    if user_of(practitioner) != ctx.principal.user_id and not ctx.access.subject.unrestricted:
        raise forbidden("Only the doctor and platform administrators change this profile")


async def view_of(ctx: ApiContext, practitioner: JSON) -> JSON:
    return (await render(platform_fhir(ctx.services), [practitioner], public=False))[0]


def _version(resource: JSON) -> int:
    return int((resource.get("meta") or {}).get("versionId", "0"))


async def _verification_of(services: Services, practitioner_id: str) -> JSON | None:
    found = await platform_fhir(services).search("VerificationResult", [
        ("target", f"Practitioner/{practitioner_id}")])
    return found[0] if found else None


async def _save(ctx: ApiContext, practitioner: JSON, changed: JSON, *,
                verification: JSON | None = None, roles: list[JSON] | None = None,
                event: tuple[str, JSON]) -> JSON:
    """Write the Practitioner (against the version read), and with it the
    VerificationResult and roles given, as the platform, with ``event``."""
    unit = platform_fhir(ctx.services).unit()
    async with unit:
        staged = await unit.update(changed, if_match=_version(practitioner))
        if verification is not None:
            if verification.get("id"):
                await unit.update(verification, if_match=_version(verification))
            else:
                await unit.create(verification, expected_type="VerificationResult",
                                  ownerless=True)
        for role in roles or []:
            await unit.update(role, if_match=_version(role))
        unit.emit(event[0], event[1], source_service=SOURCE)
        await unit.commit()
    assert staged.result is not None
    return await platform_fhir(ctx.services).read_json("Practitioner", staged.id)


# -- routes ---------------------------------------------------------------------------------------
router = APIRouter(tags=["doctors"])


@router.post("/api/doctors", status_code=201, response_model=Envelope[DoctorView],
             summary="Create the caller's doctor profile (pending verification)")
async def create_doctor(body: DoctorCreate, ctx: ApiContext = Depends(api_context)) -> Any:
    payload = body.model_dump(exclude_unset=True, mode="json")
    stored = await create_profile(ctx.services, ctx.principal.user_id, payload)
    if stored is None:
        raise conflict("PROFILE_EXISTS", "You already have a doctor profile: change it with "
                       "PUT /api/doctors/:id")
    ctx.services.policy.membership_changed(ctx.principal.user_id)
    return created(await view_of(ctx, stored))


@router.get("/api/doctors/me", response_model=Envelope[DoctorView],
            summary="The caller's doctor profile",
            responses={404: {"model": ErrorEnvelope,
                             "description": "The caller has no doctor profile (yet)"}})
async def my_profile(ctx: ApiContext = Depends(api_context)) -> Any:
    found = await practitioner_of_user(ctx.services, ctx.principal.user_id)
    if found is None:
        raise not_found("Doctor profile")
    return ok(await view_of(ctx, found))


@router.get("/api/doctors/pending", response_model=PageEnvelope[DoctorView],
            summary="Doctor profiles waiting for verification, oldest first")
async def pending_doctors(page: Pagination = Depends(pagination),
                          ctx: ApiContext = Depends(api_context)) -> Any:
    fhir = platform_fhir(ctx.services)
    found = await search_page(fhir, "Practitioner", [
        ("_tag", f"{VERIFICATION_TAG}|pending"), ("_sort", "_lastUpdated")], page)
    return page.respond(await render(fhir, found.resources, public=False), found.total)


def _resubmitted(practitioner: JSON, payload: JSON) -> bool:
    """A rejected profile changed, or a verified one whose licence changed, is reviewed
    again."""
    status = verification_status(practitioner)
    if status == "rejected":
        return True
    return status == "verified" and (
        payload.get("license_number", license_of(practitioner)[0]) != license_of(
            practitioner)[0])


@router.put("/api/doctors/{doctor_id}", response_model=Envelope[DoctorView],
            summary="Change a doctor profile (the doctor, or a platform administrator)")
async def update_doctor(doctor_id: str, body: DoctorUpdate,
                        ctx: ApiContext = Depends(api_context)) -> Any:
    payload = body.model_dump(exclude_unset=True, mode="json")

    async def once() -> JSON:
        practitioner = await load_doctor(ctx, doctor_id)
        require_self_or_admin(ctx, practitioner)
        changed = practitioner_to_fhir(payload, practitioner, None)
        verification = None
        if _resubmitted(practitioner, payload):
            changed = with_tags(changed, VERIFICATION_TAG, ["pending"])
            verification = verification_result(doctor_id, await _verification_of(
                ctx.services, doctor_id))
        roles = []
        if payload.get("specialties") is not None:
            specialties = specialties_concepts(payload["specialties"])
            roles = [{**r, "specialty": specialties} for r in await roles_of(ctx.services,
                                                                              doctor_id)]
        return await _save(ctx, practitioner, changed, verification=verification,
                           roles=roles, event=(PROFILE_UPDATED, {
                               "doctor_id": doctor_id, "user_id": user_of(practitioner)}))
    return ok(await view_of(ctx, await until_stable(once)))


@router.patch("/api/doctors/{doctor_id}/verify", response_model=Envelope[DoctorView],
              summary="Approve or reject a doctor's credentials (platform administrators)")
async def verify_doctor(doctor_id: str, body: VerifyRequest,
                        ctx: ApiContext = Depends(api_context)) -> Any:
    if body.decision == "reject" and not body.reason:
        raise ApiError(422, "VALIDATION_ERROR", "reason: a rejection says why",
                       field="reason")
    target = "verified" if body.decision == "approve" else "rejected"

    async def once() -> JSON:
        practitioner = await load_doctor(ctx, doctor_id)
        VERIFICATION_MOVES.check(verification_status(practitioner), target)
        if target == "verified" and license_of(practitioner)[0] is None:
            raise conflict("INCOMPLETE_PROFILE", "The profile has no licence number to "
                           "verify")
        current = await _verification_of(ctx.services, doctor_id) or verification_result(
            doctor_id)
        result = decided(current, target, body.reason, ctx.principal.user_id,
                         ctx.principal.email or ctx.principal.user_id,
                         ctx.services.settings.service_name)
        return await _save(ctx, practitioner, with_tags(practitioner, VERIFICATION_TAG,
                                                        [target]),
                           verification=result, event=(VERIFICATION_DECIDED, {
                               "doctor_id": doctor_id, "user_id": user_of(practitioner),
                               "status": target, "reason": body.reason,
                               "decided_by": ctx.principal.user_id}))
    return ok(await view_of(ctx, await until_stable(once)))


# -- organizations ------------------------------------------------------------------------------
async def role_at(services: Services, doctor_id: str, org_id: str) -> JSON | None:
    found = await platform_fhir(services).search("PractitionerRole", [
        ("practitioner", f"Practitioner/{doctor_id}"), ("organization", f"Organization/{org_id}")])
    return found[0] if found else None


@router.post("/api/doctors/{doctor_id}/organizations", status_code=201,
             response_model=Envelope[DoctorView],
             summary="Add a doctor to an organization (its ORG:ADMIN), or join one you "
                     "are a member of (the doctor)")
async def link_organization(doctor_id: str, body: LinkRequest,
                            ctx: ApiContext = Depends(api_context)) -> Any:
    org_id = body.organization_id
    practitioner = await load_doctor(ctx, doctor_id)
    user_id = user_of(practitioner)
    role = await require_member(ctx, org_id) if not ctx.access.subject.unrestricted else None
    is_doctor = user_id is not None and user_id == ctx.principal.user_id
    if not (ctx.access.subject.unrestricted or role == ORG_ADMIN or (is_doctor and role)):
        raise forbidden("An organization's ORG:ADMIN adds doctors to it; a doctor joins an "
                        "organization they are a member of (ask for an invitation)")
    if await role_at(ctx.services, doctor_id, org_id) is not None:
        raise conflict("ALREADY_LINKED", "This doctor already practises at this organization")
    specialties = [s for r in await roles_of(ctx.services, doctor_id)
                   for s in r.get("specialty", [])][:20]
    member = await find_member(ctx, org_id, user_id) if user_id else None

    async def stage(unit: FhirUnit) -> JSON:
        await stage_org_role(unit.acting_as(SYSTEM), doctor_id, org_id, _unique(specialties))
        if user_id is not None and member is None:
            account = await ctx.services.store.get_document(USERS, user_id)
            stage_addition(unit, member_document(org_id, user_id, ORG_DOCTOR, account))
        unit.emit(LINKED, {"doctor_id": doctor_id, "organization_id": org_id},
                  source_service=SOURCE)
        return {"action": "doctor_linked", "user_id": user_id, "doctor_id": doctor_id}

    await _change_practice(ctx, org_id, user_id, stage)
    return created(await view_of(ctx, practitioner))


async def _change_practice(ctx: ApiContext, org_id: str, user_id: str | None,
                           stage: Any) -> None:
    """Commit a change of where the doctor practises as the organization's next
    membership change (it may add or remove the doctor's membership)."""
    await change_members(ctx, org_id, stage)
    if user_id is not None:
        ctx.services.policy.membership_changed(user_id)


def _unique(concepts: list[JSON]) -> list[JSON]:
    seen: dict[str, JSON] = {}
    for item in concepts:
        seen.setdefault(repr(sorted(item.items())), item)
    return list(seen.values())


@router.delete("/api/doctors/{doctor_id}/organizations/{org_id}",
               response_model=Envelope[DoctorView],
               summary="A doctor leaves an organization (or its ORG:ADMIN removes them)")
async def unlink_organization(doctor_id: str, org_id: str,
                              ctx: ApiContext = Depends(api_context)) -> Any:
    practitioner = await load_doctor(ctx, doctor_id)
    user_id = user_of(practitioner)
    if not ctx.access.subject.unrestricted and user_id != ctx.principal.user_id:
        if await require_member(ctx, org_id) != ORG_ADMIN:
            raise forbidden("Only the doctor, the organization's ORG:ADMIN or a platform "
                            "administrator removes a doctor from it")
    role = await role_at(ctx.services, doctor_id, org_id)
    if role is None:
        raise not_found("Doctor's role at this organization")
    member = await find_member(ctx, org_id, user_id) if user_id else None

    async def stage(unit: FhirUnit) -> JSON:
        await unit.acting_as(SYSTEM).delete("PractitionerRole", role["id"])
        if member is not None and member["role"] == ORG_DOCTOR:
            stage_removal(unit, member, ctx.principal.user_id)
        unit.emit(UNLINKED, {"doctor_id": doctor_id, "organization_id": org_id},
                  source_service=SOURCE)
        return {"action": "doctor_unlinked", "user_id": user_id, "doctor_id": doctor_id}

    await _change_practice(ctx, org_id, user_id, stage)
    return ok(await view_of(ctx, practitioner))


@router.get("/api/organizations/{org_id}/doctors", response_model=PageEnvelope[DoctorView],
            summary="The doctors practising at an organization (for its members)")
async def organization_doctors(org_id: str, page: Pagination = Depends(pagination),
                               ctx: ApiContext = Depends(api_context)) -> Any:
    await require_member(ctx, org_id)
    fhir = platform_fhir(ctx.services)
    found = await search_page(fhir, "PractitionerRole", [
        ("organization", f"Organization/{org_id}"), ("active", "true"),
        ("_include", "PractitionerRole:practitioner"), ("_sort", "_lastUpdated")], page)
    by_id = {p["id"]: p for p in found.included if p["resourceType"] == "Practitioner"}
    doctors = [by_id[d] for r in found.resources
               if (d := local_id(r.get("practitioner"), "Practitioner")) in by_id]
    return page.respond(await render(fhir, doctors, public=False), found.total)
