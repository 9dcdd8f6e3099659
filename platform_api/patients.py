"""Patients area: /api patient profiles ⇄ FHIR Patient.

Mapping (/api field → FHIR Patient element):
    first_name     → name[use=official].given[0]
    last_name      → name[use=official].family
    date_of_birth  → birthDate
    gender         → gender (administrative-gender: male | female | other | unknown)
    phone          → telecom[system=phone, use=mobile].value
    email          → telecom[system=email].value
    mrn (org)      → identifier[type=MR, system=urn:healthplatform:organization:<org>:mrn]
    organization   → managingOrganization (the first organization that registers the patient)
    user link      → identifier[system=urn:healthplatform:user].value (self-registered profile)

Bookkeeping documents: ``patient_profiles`` (user id → Patient id, one profile per user)
and ``org_patients`` (which organization registered which patient under which MRN).
"""

from __future__ import annotations

from datetime import date
from typing import Any, Literal

import orjson
from fastapi import APIRouter, Depends, Query, Request
from pydantic import BaseModel, EmailStr, Field

from fhir_server.store import StoreError
from fhir_server.store.sqlite import now_instant
from platform_api.auth.dependencies import current_principal
from platform_api.auth.principal import Principal
from platform_api.envelope import (
    Envelope,
    PageEnvelope,
    Pagination,
    conflict,
    created,
    forbidden,
    not_found,
    ok,
    pagination,
)
from platform_api.facade import Facade, MappingContext
from platform_api.organizations import membership, require_member
from platform_api.services import Services

JSON = dict[str, Any]
PROFILES = "patient_profiles"
ORG_PATIENTS = "org_patients"
USER_SYSTEM = "urn:healthplatform:user"
PHONE = r"^\+[1-9]\d{6,14}$"
Gender = Literal["male", "female", "other", "unknown"]


def mrn_system(org_id: str) -> str:
    return f"urn:healthplatform:organization:{org_id}:mrn"


class PatientCreate(BaseModel):
    first_name: str = Field(min_length=1, max_length=100, examples=["Amina"])
    last_name: str = Field(min_length=1, max_length=100, examples=["Odhiambo"])
    date_of_birth: date = Field(examples=["1988-04-12"])
    gender: Gender = Field(examples=["female"])
    phone: str | None = Field(default=None, pattern=PHONE, examples=["+254712345678"])
    email: EmailStr | None = None


class PatientUpdate(BaseModel):
    first_name: str | None = Field(default=None, min_length=1, max_length=100)
    last_name: str | None = Field(default=None, min_length=1, max_length=100)
    date_of_birth: date | None = None
    gender: Gender | None = None
    phone: str | None = Field(default=None, pattern=PHONE)
    email: EmailStr | None = None


class OrgPatientCreate(PatientCreate):
    mrn: str | None = Field(default=None, min_length=1, max_length=64,
                            description="Medical record number; generated when absent")


class PatientView(BaseModel):
    id: str
    first_name: str | None = None
    last_name: str | None = None
    date_of_birth: str | None = None
    gender: str | None = None
    phone: str | None = None
    email: str | None = None
    mrn: str | None = None
    organization_id: str | None = None
    created_at: str | None = None
    updated_at: str | None = None


def _official_name(patient: JSON) -> JSON:
    names = patient.setdefault("name", [])
    for name in names:
        if name.get("use") == "official":
            return name  # type: ignore[no-any-return]
    if names:
        return names[0]  # type: ignore[no-any-return]
    names.append({"use": "official"})
    return names[0]  # type: ignore[no-any-return]


def _set_telecom(patient: JSON, system: str, value: str | None, use: str | None) -> None:
    telecom = [t for t in patient.get("telecom", []) if t.get("system") != system]
    if value:
        entry = {"system": system, "value": value}
        if use:
            entry["use"] = use
        telecom.insert(0, entry)
    if telecom:
        patient["telecom"] = telecom
    else:
        patient.pop("telecom", None)


def patient_to_fhir(payload: JSON, ctx: MappingContext, existing: JSON | None) -> JSON:
    patient: JSON = orjson.loads(orjson.dumps(existing)) if existing else {
        "resourceType": "Patient", "active": True}
    if "first_name" in payload or "last_name" in payload:
        name = _official_name(patient)
        if payload.get("first_name"):
            given = name.get("given", [])
            name["given"] = [payload["first_name"], *given[1:]]
        if payload.get("last_name"):
            name["family"] = payload["last_name"]
    if payload.get("date_of_birth"):
        patient["birthDate"] = str(payload["date_of_birth"])
    if payload.get("gender"):
        patient["gender"] = payload["gender"]
    if "phone" in payload:
        _set_telecom(patient, "phone", payload["phone"], "mobile")
    if "email" in payload:
        _set_telecom(patient, "email", payload["email"] and str(payload["email"]), None)
    identifiers: list[JSON] = patient.get("identifier", [])
    if ctx.extra.get("user_id"):
        identifiers.append({"system": USER_SYSTEM, "value": ctx.extra["user_id"]})
    if ctx.extra.get("mrn") and ctx.extra.get("organization_id"):
        org_id = ctx.extra["organization_id"]
        identifiers.append({
            "use": "usual",
            "type": {"coding": [{"system": "http://terminology.hl7.org/CodeSystem/v2-0203",
                                 "code": "MR", "display": "Medical record number"}]},
            "system": mrn_system(org_id), "value": ctx.extra["mrn"],
            "assigner": {"reference": f"Organization/{org_id}"},
        })
        patient.setdefault("managingOrganization", {"reference": f"Organization/{org_id}"})
    if identifiers:
        patient["identifier"] = identifiers
    return patient


def patient_from_fhir(patient: JSON, organization_id: str | None = None) -> JSON:
    name = _official_name(orjson.loads(orjson.dumps(patient))) if patient.get("name") else {}
    telecom: JSON = {}
    for t in patient.get("telecom", []):
        telecom.setdefault(t.get("system"), t.get("value"))
    mrn = None
    for ident in patient.get("identifier", []):
        system = ident.get("system", "")
        if organization_id and system == mrn_system(organization_id):
            mrn = ident.get("value")
        elif organization_id is None and system.endswith(":mrn") and mrn is None:
            mrn = ident.get("value")
    managing = (patient.get("managingOrganization") or {}).get("reference", "")
    return {
        "id": patient["id"],
        "first_name": (name.get("given") or [None])[0],
        "last_name": name.get("family"),
        "date_of_birth": patient.get("birthDate"),
        "gender": patient.get("gender"),
        "phone": telecom.get("phone"),
        "email": telecom.get("email"),
        "mrn": mrn,
        "organization_id": organization_id or (managing.removeprefix("Organization/") or None),
        "created_at": None,
        "updated_at": patient.get("meta", {}).get("lastUpdated"),
    }


patients = Facade(
    resource="Patient", name="Patient",
    create_model=PatientCreate, update_model=PatientUpdate, view_model=PatientView,
    to_fhir=patient_to_fhir, from_fhir=patient_from_fhir,
)

router = APIRouter(tags=["patients"])


def _services(request: Request) -> Services:
    return request.app.state.services  # type: ignore[no-any-return]


async def can_access_patient(services: Services, principal: Principal, patient_id: str
                             ) -> bool:
    """Self (own profile), platform admins, and members of an organization that registered
    the patient."""
    if principal.is_platform_admin:
        return True
    profile = await services.store.get_document(PROFILES, principal.user_id)
    if profile is not None and profile["patient_id"] == patient_id:
        return True
    for link in await services.store.find_documents(ORG_PATIENTS, {"patient_id": patient_id},
                                                    limit=50):
        if await membership(services, link["organization_id"], principal.user_id):
            return True
    return False


async def _view(services: Services, patient_id: str, organization_id: str | None = None
                ) -> JSON:
    resource, _ = await patients.load(services, patient_id)
    view = patient_from_fhir(resource, organization_id)
    try:
        view["created_at"] = (await services.store.read("Patient", patient_id, 1)).last_updated
    except StoreError:
        view["created_at"] = None  # version 1 was a tombstone: the id was reused after a delete
    return view


@router.post("/api/patients", status_code=201, response_model=Envelope[PatientView],
             summary="Create the caller's patient profile")
async def create_profile(request: Request, body: PatientCreate,
                         principal: Principal = Depends(current_principal)) -> Any:
    services = _services(request)
    if await services.store.get_document(PROFILES, principal.user_id) is not None:
        raise conflict("PROFILE_EXISTS", "You already have a patient profile")
    ctx = MappingContext(principal, services, {"user_id": principal.user_id})
    async with services.store.unit_of_work() as uow:
        patient = patients.stage_new(uow, body.model_dump(exclude_none=True), ctx)
        # insert (not put): two concurrent creates for one user cannot both succeed.
        uow.insert_document(PROFILES, principal.user_id, {
            "id": principal.user_id, "user_id": principal.user_id, "patient_id": patient["id"]})
        await uow.commit()
    return created(await _view(services, patient["id"]))


@router.get("/api/patients/me", response_model=Envelope[PatientView],
            summary="The caller's patient profile")
async def my_profile(request: Request, principal: Principal = Depends(current_principal)
                     ) -> Any:
    services = _services(request)
    profile = await services.store.get_document(PROFILES, principal.user_id)
    if profile is None:
        raise not_found("Patient profile")
    return ok(await _view(services, profile["patient_id"]))


@router.get("/api/patients/{patient_id}", response_model=Envelope[PatientView],
            summary="Get a patient by id")
async def get_patient(request: Request, patient_id: str,
                      principal: Principal = Depends(current_principal)) -> Any:
    services = _services(request)
    await patients.load(services, patient_id)  # 404 before 403: ids are not secrets here
    if not await can_access_patient(services, principal, patient_id):
        raise forbidden("You may not see this patient")
    return ok(await _view(services, patient_id))


@router.post("/api/patients/{patient_id}", response_model=Envelope[PatientView],
             summary="Update a patient profile (only the fields sent change)")
async def update_patient(request: Request, patient_id: str, body: PatientUpdate,
                         principal: Principal = Depends(current_principal)) -> Any:
    services = _services(request)
    current, stored = await patients.load(services, patient_id)
    if not await can_access_patient(services, principal, patient_id):
        raise forbidden("You may not change this patient")
    ctx = MappingContext(principal, services)
    changed = patient_to_fhir(body.model_dump(exclude_unset=True), ctx, current)
    await patients.save(changed, stored, services)
    return ok(await _view(services, patient_id))


# -- organization context ------------------------------------------------------------

@router.get("/api/organizations/{org_id}/patients", response_model=PageEnvelope[PatientView],
            summary="List the patients registered by an organization")
async def list_org_patients(request: Request, org_id: str,
                            page: Pagination = Depends(pagination),
                            principal: Principal = Depends(current_principal)) -> Any:
    services = _services(request)
    await require_member(services, principal, org_id)
    where = {"organization_id": org_id}
    links = await services.store.find_documents(ORG_PATIENTS, where, limit=page.limit,
                                                offset=page.offset, order_by="registered_at")
    total = await services.store.count_documents(ORG_PATIENTS, where)
    views = []
    for link in links:
        resource = await services.fhir.find_json("Patient", link["patient_id"])
        if resource is not None:
            views.append(patient_from_fhir(resource, org_id))
    return page.respond(views, total)


@router.post("/api/organizations/{org_id}/patients", status_code=201,
             response_model=Envelope[PatientView],
             summary="Register a patient for an organization (MRN generated when absent)")
async def register_org_patient(request: Request, org_id: str, body: OrgPatientCreate,
                               principal: Principal = Depends(current_principal)) -> Any:
    services = _services(request)
    await require_member(services, principal, org_id)
    payload = body.model_dump(exclude_none=True)
    mrn = payload.pop("mrn", None) or await _next_mrn(services, org_id)
    if await services.store.find_documents(ORG_PATIENTS, {"organization_id": org_id,
                                                          "mrn": mrn}, limit=1):
        raise conflict("MRN_TAKEN", f"MRN {mrn} is already used in this organization")
    ctx = MappingContext(principal, services, {"organization_id": org_id, "mrn": mrn})
    async with services.store.unit_of_work() as uow:
        patient = patients.stage_new(uow, payload, ctx)
        uow.insert_document(ORG_PATIENTS, f"{org_id}:{mrn}", {
            "id": f"{org_id}:{mrn}", "organization_id": org_id, "patient_id": patient["id"],
            "mrn": mrn, "registered_at": now_instant(), "registered_by": principal.user_id})
        await uow.commit()
    return created(await _view(services, patient["id"], org_id))


@router.get("/api/organizations/{org_id}/patients/search",
            response_model=PageEnvelope[PatientView],
            summary="Find an organization's patient by medical record number")
async def search_org_patients(request: Request, org_id: str,
                              mrn: str = Query(min_length=1, description="Medical record number"),
                              page: Pagination = Depends(pagination),
                              principal: Principal = Depends(current_principal)) -> Any:
    services = _services(request)
    await require_member(services, principal, org_id)
    link = await services.store.get_document(ORG_PATIENTS, f"{org_id}:{mrn}")
    resource = await services.fhir.find_json("Patient", link["patient_id"]) if link else None
    found = [patient_from_fhir(resource, org_id)] if resource else []
    return page.respond(found if page.page == 1 else [], len(found))


@router.get("/api/organizations/{org_id}/patients/{patient_id}",
            response_model=Envelope[PatientView],
            summary="A patient in the context of an organization")
async def get_org_patient(request: Request, org_id: str, patient_id: str,
                          principal: Principal = Depends(current_principal)) -> Any:
    services = _services(request)
    await require_member(services, principal, org_id)
    links = await services.store.find_documents(
        ORG_PATIENTS, {"organization_id": org_id, "patient_id": patient_id}, limit=1)
    if not links:
        raise not_found("Patient")
    return ok(await _view(services, patient_id, org_id))


async def _next_mrn(services: Services, org_id: str) -> str:
    count = await services.store.count_documents(ORG_PATIENTS, {"organization_id": org_id})
    while True:
        count += 1
        mrn = f"MRN{count:07d}"
        if await services.store.get_document(ORG_PATIENTS, f"{org_id}:{mrn}") is None:
            return mrn
