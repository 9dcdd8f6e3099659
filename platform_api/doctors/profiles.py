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
- ``POST /api/doctors/:id/organizations`` (``{organization_id}``; the spec's "join an
  organization"): an ``ORG:ADMIN`` of that organization (or a platform administrator)
  **invites** the doctor. The answer is 202 with the pending invitation (the
  organizations' invitation, :mod:`platform_api.organizations.invitations`: e-mailed to
  the doctor's account address, single-use, expiring, revocable by the organization);
  nothing about the doctor changes until the doctor accepts it (``POST
  /api/organizations/invitations/accept``, signed in as themselves): then they become an
  ``ORG:DOCTOR`` member (``platform.organization.member_added``) and, from that event, get
  their PractitionerRole at the organization (:mod:`.consumers`). The invitation's views
  never show the doctor's e-mail address. 409 ``ALREADY_LINKED`` (the doctor practises
  there), ``ALREADY_MEMBER``, ``INVITATION_PENDING``, ``DOCTOR_WITHOUT_ACCOUNT`` (a
  profile no account holds, which nobody could accept for); 503 ``EMAIL_DISABLED`` when
  no mail server is configured. *Changed* (issue 31): this route used to add the doctor
  at once, without their consent, and let a doctor link themselves to an organization
  they belonged to; a doctor now joins an organization only by accepting an invitation.
- ``DELETE /api/doctors/:id/organizations/:org_id``: the doctor leaves (or an
  ``ORG:ADMIN`` of it, or a platform administrator, removes them): the role goes, and an
  ``ORG:DOCTOR`` membership with it (``platform.organization.member_removed``).
- ``GET /api/organizations/:org_id/doctors``: the organization's doctors, for its
  members (one search over its PractitionerRoles, including the Practitioners).

Who may do each is the access policy's (``doctor.*`` and ``organization.manage`` in
:mod:`platform_api.policy.actions.organizations`). The doctor's own records belong to no
organization and only platform administrators write them, so what the doctor does to
their profile is written through named elevations once the policy let them act.

Events: ``platform.doctors.profile_created``, ``…profile_updated`` (``doctor_id``,
``user_id``), ``…verification_decided`` (``doctor_id``, ``user_id``, ``status``,
``reason``, ``decided_by``), ``…organization_linked`` / ``…organization_unlinked``
(``doctor_id``, ``organization_id``).
"""

from __future__ import annotations

from typing import Any, Literal

from fastapi import APIRouter, Depends
from pydantic import BaseModel, Field

from fhir_server.caller import CallerFhir, FhirUnit
from fhir_server.store import StoreError
from platform_api.auth.users import COLLECTION as USERS
from platform_api.doctors.records import (
    VERIFICATION_TAG,
    DoctorCreate,
    DoctorUpdate,
    DoctorView,
    decided,
    license_of,
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
    require_organization,
    search_page,
    until_stable,
)
from platform_api.fhir_values import local_id
from platform_api.organizations.invitations import InvitationView, send_invitation
from platform_api.organizations.members import (
    MEMBERS,
    change_members,
    find_member,
    stage_removal,
)
from platform_api.policy.roles import ORG_DOCTOR
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


async def create_profile(services: Services, fhir: CallerFhir, user_id: str, payload: JSON,
                         *, also: Any = None) -> JSON | None:
    """Create the user's doctor profile with ``fhir`` (an elevation: a doctor's records
    belong to no organization): the Practitioner, its own role, a pending
    VerificationResult and a role at each organization the user is a member of, in one
    unit of work; ``None`` when the user has a profile already. ``also(unit)`` stages more
    (an event receipt)."""
    unit = fhir.unit()
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
    return await fhir.read_json("Practitioner", staged.id)


async def load_doctor(ctx: ApiContext, doctor_id: str) -> JSON:
    # Practitioners are directory entries every signed-in user reads.
    found = await ctx.fhir.find_json("Practitioner", doctor_id)
    if found is None:
        raise not_found("Doctor")
    return found


async def view_of(ctx: ApiContext, practitioner: JSON) -> JSON:
    """The whole profile (its caller was let see it by the policy)."""
    return (await render(_profile_reader(ctx), [practitioner], public=False))[0]


def _profile_reader(ctx: ApiContext) -> CallerFhir:
    """What renders whole profiles: their VerificationResults (the decision and its
    reason) are platform administrators' records, shown to the doctor and colleagues."""
    return ctx.elevate("doctor.view-profile: read the doctors' VerificationResults for "
                       "their whole profiles")


def _version(resource: JSON) -> int:
    return int((resource.get("meta") or {}).get("versionId", "0"))


async def _verification_of(fhir: CallerFhir, practitioner_id: str) -> JSON | None:
    found = await fhir.search("VerificationResult", [
        ("target", f"Practitioner/{practitioner_id}")])
    return found[0] if found else None


async def _save(fhir: CallerFhir, practitioner: JSON, changed: JSON, *,
                verification: JSON | None = None, roles: list[JSON] | None = None,
                event: tuple[str, JSON]) -> JSON:
    """Write the Practitioner (against the version read), and with it the
    VerificationResult and roles given, with ``fhir``, with ``event``."""
    unit = fhir.unit()
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
    return await fhir.read_json("Practitioner", staged.id)


# -- routes ---------------------------------------------------------------------------------------
router = APIRouter(tags=["doctors"])


@router.post("/api/doctors", status_code=201, response_model=Envelope[DoctorView],
             summary="Create the caller's doctor profile (pending verification)")
async def create_doctor(body: DoctorCreate, ctx: ApiContext = Depends(api_context)) -> Any:
    payload = body.model_dump(exclude_unset=True, mode="json")
    ctx.authorize("doctor.create-profile", user_id=ctx.principal.user_id)
    stored = await create_profile(ctx.services, ctx.elevate(
        "doctor.create-profile: the caller's Practitioner, its PractitionerRoles and a "
        "pending VerificationResult"), ctx.principal.user_id, payload)
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
    found = await practitioner_of_user(ctx.fhir, ctx.principal.user_id)
    if found is None:
        raise not_found("Doctor profile")
    ctx.authorize("doctor.view-profile", practitioner_id=found["id"])
    return ok(await view_of(ctx, found))


@router.get("/api/doctors/pending", response_model=PageEnvelope[DoctorView],
            summary="Doctor profiles waiting for verification, oldest first")
async def pending_doctors(page: Pagination = Depends(pagination),
                          ctx: ApiContext = Depends(api_context)) -> Any:
    ctx.authorize("doctor.verify")
    found = await search_page(ctx.fhir, "Practitioner", [
        ("_tag", f"{VERIFICATION_TAG}|pending"), ("_sort", "_lastUpdated")], page)
    return page.respond(await render(ctx.fhir, found.resources, public=False), found.total)


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
    await load_doctor(ctx, doctor_id)
    ctx.authorize("doctor.edit-profile", practitioner_id=doctor_id)
    fhir = ctx.elevate("doctor.edit-profile: the doctor's Practitioner, its roles' "
                       "specialties and the VerificationResult a resubmission reopens")

    async def once() -> JSON:
        practitioner = await load_doctor(ctx, doctor_id)
        changed = practitioner_to_fhir(payload, practitioner, None)
        verification = None
        if _resubmitted(practitioner, payload):
            changed = with_tags(changed, VERIFICATION_TAG, ["pending"])
            verification = verification_result(doctor_id, await _verification_of(
                fhir, doctor_id))
        roles = []
        if payload.get("specialties") is not None:
            specialties = specialties_concepts(payload["specialties"])
            roles = [{**r, "specialty": specialties} for r in await roles_of(fhir,
                                                                              doctor_id)]
        return await _save(fhir, practitioner, changed, verification=verification,
                           roles=roles, event=(PROFILE_UPDATED, {
                               "doctor_id": doctor_id, "user_id": user_of(practitioner)}))
    return ok(await view_of(ctx, await until_stable(once)))


@router.patch("/api/doctors/{doctor_id}/verify", response_model=Envelope[DoctorView],
              summary="Approve or reject a doctor's credentials (platform administrators)")
async def verify_doctor(doctor_id: str, body: VerifyRequest,
                        ctx: ApiContext = Depends(api_context)) -> Any:
    ctx.authorize("doctor.verify")
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
        current = await _verification_of(ctx.fhir, doctor_id) or verification_result(
            doctor_id)
        result = decided(current, target, body.reason, ctx.principal.user_id,
                         ctx.principal.email or ctx.principal.user_id,
                         ctx.services.settings.service_name)
        return await _save(ctx.fhir, practitioner, with_tags(practitioner, VERIFICATION_TAG,
                                                             [target]),
                           verification=result, event=(VERIFICATION_DECIDED, {
                               "doctor_id": doctor_id, "user_id": user_of(practitioner),
                               "status": target, "reason": body.reason,
                               "decided_by": ctx.principal.user_id}))
    saved = await until_stable(once)
    return ok((await render(ctx.fhir, [saved], public=False))[0])


# -- organizations ------------------------------------------------------------------------------
async def role_at(fhir: CallerFhir, doctor_id: str, org_id: str) -> JSON | None:
    found = await fhir.search("PractitionerRole", [
        ("practitioner", f"Practitioner/{doctor_id}"), ("organization", f"Organization/{org_id}")])
    return found[0] if found else None


@router.post("/api/doctors/{doctor_id}/organizations", status_code=202,
             response_model=Envelope[InvitationView],
             summary="Invite a doctor to an organization (its ORG:ADMIN); the doctor joins "
                     "by accepting the invitation")
async def invite_doctor(doctor_id: str, body: LinkRequest,
                        ctx: ApiContext = Depends(api_context)) -> Any:
    org_id = body.organization_id
    practitioner = await load_doctor(ctx, doctor_id)
    await require_organization(ctx, org_id, "organization.manage")
    if await role_at(ctx.fhir, doctor_id, org_id) is not None:
        raise conflict("ALREADY_LINKED", "This doctor already practises at this organization")
    user_id = user_of(practitioner)
    account = await ctx.services.store.get_document(USERS, user_id) if user_id else None
    if account is None:
        raise conflict("DOCTOR_WITHOUT_ACCOUNT", "No account holds this doctor profile, so "
                       "nobody could accept an invitation for it")
    invitation = await send_invitation(ctx, org_id, account["email"], ORG_DOCTOR,
                                       doctor_id=doctor_id, user_id=account["id"])
    return ok(invitation, 202)


@router.delete("/api/doctors/{doctor_id}/organizations/{org_id}",
               response_model=Envelope[DoctorView],
               summary="A doctor leaves an organization (or its ORG:ADMIN removes them)")
async def unlink_organization(doctor_id: str, org_id: str,
                              ctx: ApiContext = Depends(api_context)) -> Any:
    practitioner = await load_doctor(ctx, doctor_id)
    user_id = user_of(practitioner)
    # Organizations are directory entries any signed-in user may read.
    if await ctx.fhir.find_json("Organization", org_id) is None:
        raise not_found("Organization")
    ctx.authorize("doctor.leave-organization", org_id, practitioner_id=doctor_id)
    role = await role_at(ctx.fhir, doctor_id, org_id)
    if role is None:
        raise not_found("Doctor's role at this organization")
    member = await find_member(ctx, org_id, user_id) if user_id else None

    async def stage(unit: FhirUnit) -> JSON:
        await ctx.elevate_unit(unit, "doctor.leave-organization: delete the doctor's "
                               "PractitionerRole at the organization").delete(
            "PractitionerRole", role["id"])
        if member is not None and member["role"] == ORG_DOCTOR:
            stage_removal(unit, member, ctx.principal.user_id)
        unit.emit(UNLINKED, {"doctor_id": doctor_id, "organization_id": org_id},
                  source_service=SOURCE)
        return {"action": "doctor_unlinked", "user_id": user_id, "doctor_id": doctor_id}

    await change_members(ctx, org_id, stage)
    if user_id is not None:
        ctx.services.policy.membership_changed(user_id)
    return ok(await view_of(ctx, practitioner))


@router.get("/api/organizations/{org_id}/doctors", response_model=PageEnvelope[DoctorView],
            summary="The doctors practising at an organization (for its members)")
async def organization_doctors(org_id: str, page: Pagination = Depends(pagination),
                               ctx: ApiContext = Depends(api_context)) -> Any:
    await require_organization(ctx, org_id, "doctor.view-profile")
    found = await search_page(ctx.fhir, "PractitionerRole", [
        ("organization", f"Organization/{org_id}"), ("active", "true"),
        ("_include", "PractitionerRole:practitioner"), ("_sort", "_lastUpdated")], page)
    by_id = {p["id"]: p for p in found.included if p["resourceType"] == "Practitioner"}
    doctors = [by_id[d] for r in found.resources
               if (d := local_id(r.get("practitioner"), "Practitioner")) in by_id]
    return page.respond(await render(_profile_reader(ctx), doctors, public=False),
                        found.total)
