"""Patients area: /api patient profiles ⇄ FHIR Patient.

Mapping (/api field → FHIR Patient element):
    first_name     → name[use=official].given[0]
    last_name      → name[use=official].family
    date_of_birth  → birthDate
    gender         → gender (administrative-gender: male | female | other | unknown)
    phone          → telecom[system=phone, use=mobile].value
    email          → telecom[system=email].value
    address        → address[use=home]: line, city, district, country (ISO 3166 alpha-2,
                     upper case); an update sending ``address`` replaces it (null removes)
    mrn (org)      → identifier[type=MR, system=urn:healthplatform:organization:<org>:mrn]
    organization   → managingOrganization (the organization that registered the patient)
    created_at     → meta.lastUpdated of version 1 (the history: one question for a page)
    updated_at     → meta.lastUpdated

Who a record belongs to is in the record itself, so there are no side documents:

- a user's own profile (``POST /api/patients``) is the Patient carrying their identifier
  ``urn:healthplatform:user|<user id>`` (one per user: a second create is 409
  ``PROFILE_EXISTS``); it belongs to no organization, and the access policy's *self*
  relation gives the user their record and its compartment;
- a patient an organization registers (``POST /api/organizations/:org_id/patients``) is
  owned by it (``meta.security`` ``urn:healthplatform:organization|<org id>``, see
  ``fhir_server.ownership``) with the organization's MRN as an identifier (unique in the
  organization: 409 ``MRN_TAKEN``; generated when absent, ``MRN`` + 7 digits from the
  organization's counter document, written in the create's unit of work); its members
  reach it as their role allows, the organization's lists are searches on that label.
"""

from __future__ import annotations

from datetime import date
from typing import Annotated, Any, Literal

import orjson
from fastapi import APIRouter, Depends, Query
from pydantic import BaseModel, EmailStr, Field, field_validator

from platform_api.envelope import (
    Envelope,
    ErrorEnvelope,
    PageEnvelope,
    Pagination,
    not_found,
    ok,
    pagination,
)
from platform_api.facade import (
    ApiContext,
    Facade,
    OrganizationScope,
    Unique,
    Write,
    api_context,
)

JSON = dict[str, Any]
USER_SYSTEM = "urn:healthplatform:user"
PHONE = r"^\+[1-9]\d{6,14}$"
MRN_TYPE = {"coding": [{"system": "http://terminology.hl7.org/CodeSystem/v2-0203",
                        "code": "MR", "display": "Medical record number"}]}
Gender = Literal["male", "female", "other", "unknown"]


# Server-assigned MRNs: each organization's counter document, and a key document per
# number drawn (the store refuses a second one: the guard against two drawing at once).
MRN_COUNTERS, MRN_CLAIMS = "mrn_counters", "mrn_claims"
MRN_NUMBER = "_mrn_number"  # the number drawn, handed from prepare to _claim_mrn


def mrn_system(org_id: str) -> str:
    return f"urn:healthplatform:organization:{org_id}:mrn"


class Address(BaseModel):
    """The patient's home address (FHIR ``Patient.address``, use home)."""

    line: list[str] = Field(default=[], max_length=4, examples=[["Plot 12, Ngong Road"]])
    city: str | None = Field(default=None, min_length=1, max_length=100,
                             examples=["Nairobi"])
    district: str | None = Field(default=None, min_length=1, max_length=100,
                                 examples=["Kibra"])
    country: str | None = Field(default=None, pattern=r"^[A-Za-z]{2}$", examples=["KE"],
                                description="ISO 3166-1 alpha-2 code")

    @field_validator("line")
    @classmethod
    def _lines(cls, lines: list[str]) -> list[str]:
        if any(not line.strip() or len(line) > 200 for line in lines):
            raise ValueError("each line is 1 to 200 characters")
        return lines


class PatientCreate(BaseModel):
    first_name: str = Field(min_length=1, max_length=100, examples=["Amina"])
    last_name: str = Field(min_length=1, max_length=100, examples=["Odhiambo"])
    date_of_birth: date = Field(examples=["1988-04-12"])
    gender: Gender = Field(examples=["female"])
    phone: str | None = Field(default=None, pattern=PHONE, examples=["+254712345678"])
    email: EmailStr | None = None
    address: Address | None = None


class PatientUpdate(BaseModel):
    first_name: str | None = Field(default=None, min_length=1, max_length=100)
    last_name: str | None = Field(default=None, min_length=1, max_length=100)
    date_of_birth: date | None = None
    gender: Gender | None = None
    phone: str | None = Field(default=None, pattern=PHONE)
    email: EmailStr | None = None
    address: Address | None = Field(default=None, description="Replaces the home address "
                                    "(null removes it)")


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
    address: Address | None = None
    mrn: str | None = None
    organization_id: str | None = None
    created_at: str | None = None
    updated_at: str | None = None


# -- mapping ------------------------------------------------------------------------------------
def _official_name(patient: JSON) -> JSON:
    names = patient.setdefault("name", [])
    for name in names:
        if name.get("use") == "official":
            return name  # type: ignore[no-any-return]
    if not names:
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


def patient_to_fhir(payload: JSON, ctx: ApiContext | None, existing: JSON | None) -> JSON:
    """A Patient with the payload's fields; on update only the fields sent change."""
    patient: JSON = orjson.loads(orjson.dumps(existing)) if existing else {
        "resourceType": "Patient", "active": True}
    if "first_name" in payload or "last_name" in payload:
        name = _official_name(patient)
        if payload.get("first_name"):
            name["given"] = [payload["first_name"], *name.get("given", [])[1:]]
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
    if "address" in payload:
        _set_address(patient, payload["address"])
    return patient


def _set_address(patient: JSON, address: JSON | None) -> None:
    """Replace the home address (the first one when none says home); others stay."""
    addresses = list(patient.get("address") or [])
    home = next((i for i, a in enumerate(addresses) if a.get("use") == "home"),
                0 if addresses else None)
    if home is not None:
        addresses.pop(home)
    fhir = {"use": "home", **{k: v for k, v in (address or {}).items() if v}}
    if fhir.get("country"):
        fhir["country"] = fhir["country"].upper()
    if address and len(fhir) > 1:
        addresses.insert(0, fhir)
    if addresses:
        patient["address"] = addresses
    else:
        patient.pop("address", None)


def _address_view(patient: JSON) -> JSON | None:
    addresses = [a for a in patient.get("address") or [] if isinstance(a, dict)]
    home = next((a for a in addresses if a.get("use") == "home"),
                addresses[0] if addresses else None)
    if home is None:
        return None
    return {"line": home.get("line") or [], "city": home.get("city"),
            "district": home.get("district"), "country": home.get("country")}


def profile_to_fhir(payload: JSON, ctx: ApiContext, existing: JSON | None) -> JSON:
    patient = patient_to_fhir(payload, ctx, existing)
    if existing is None:
        patient["identifier"] = [{"system": USER_SYSTEM, "value": ctx.principal.user_id}]
    return patient


def org_patient_to_fhir(payload: JSON, ctx: ApiContext, existing: JSON | None) -> JSON:
    patient = patient_to_fhir(payload, ctx, existing)
    org_id = ctx.path["org_id"]
    patient.setdefault("identifier", []).append({
        "use": "usual", "type": MRN_TYPE, "system": mrn_system(org_id), "value": payload["mrn"],
        "assigner": {"reference": f"Organization/{org_id}"}})
    patient.setdefault("managingOrganization", {"reference": f"Organization/{org_id}"})
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
        "address": _address_view(patient),
        "mrn": mrn,
        "organization_id": organization_id or (managing.removeprefix("Organization/") or None),
        "created_at": None,
        "updated_at": patient.get("meta", {}).get("lastUpdated"),
    }


async def patient_views(ctx: ApiContext, patients: list[JSON]) -> list[JSON]:
    """Views with their creation instant: version 1's ``lastUpdated``, read from the
    history for the page's later versions in one store question.

    Why not an element in the Patient: FHIR R4 has no creation date in ``meta``, and an
    extension carrying one would repeat what the history already records, in a place
    every client that replaces the resource (PUT) could drop or change; the history
    cannot be rewritten."""
    org_id = ctx.path.get("org_id")
    views = [patient_from_fhir(p, org_id) for p in patients]
    later = [p["id"] for p in patients if p.get("meta", {}).get("versionId") != "1"]
    created = await ctx.services.store.created_instants("Patient", later) if later else {}
    for patient, view in zip(patients, views, strict=True):
        meta = patient.get("meta", {})
        view["created_at"] = meta.get("lastUpdated") if meta.get("versionId") == "1" \
            else created.get(patient["id"])
    return views


def _user_identifier(patient: JSON) -> list[tuple[str, str]]:
    own = next(i for i in patient["identifier"] if i.get("system") == USER_SYSTEM)
    return [("identifier", f"{USER_SYSTEM}|{own['value']}")]


def _mrn_identifier(patient: JSON) -> list[tuple[str, str]]:
    mrn = next(i for i in patient["identifier"] if i.get("system", "").endswith(":mrn"))
    return [("identifier", f"{mrn['system']}|{mrn['value']}")]


profiles = Facade(
    resource="Patient", name="Patient", create=PatientCreate, update=PatientUpdate,
    view=PatientView, to_fhir=profile_to_fhir, from_fhir=patient_from_fhir,
    views=patient_views, ownerless=True, tags=["patients"],
    unique=Unique(_user_identifier, "PROFILE_EXISTS", "You already have a patient profile"),
    summaries={"create": "Create the caller's patient profile", "get": "Get a patient by id",
               "update": "Update a patient profile (only the fields sent change)"},
)


async def _next_mrn(ctx: ApiContext, payload: JSON) -> JSON:
    """The payload with an MRN: the one sent, else the organization's next number from its
    counter document (one read, never a count of its patients). The number is claimed in
    the create's unit of work (:func:`_claim_mrn`); a request that drew the same number
    at the same moment fails on the claim and draws again (the facade's ``retries``)."""
    if payload.get("mrn"):
        return payload
    org_id = ctx.path["org_id"]
    counter = await ctx.services.store.get_document(MRN_COUNTERS, org_id)
    number = int((counter or {}).get("last", 0))
    while True:  # numbers given by hand (or before the counter) are skipped
        number += 1
        mrn = f"MRN{number:07d}"
        taken = await ctx.fhir.match_ids("Patient", [("identifier",
                                                      f"{mrn_system(org_id)}|{mrn}")], 1)
        if not taken:
            return {**payload, "mrn": mrn, MRN_NUMBER: number}


async def _claim_mrn(write: Write) -> JSON:
    """Stage the counter's new value and the claim of the number drawn, which the store
    refuses twice (so two registrations cannot commit the same number)."""
    number = (write.payload or {}).get(MRN_NUMBER)
    if write.change == "created" and number is not None:
        org_id = write.ctx.path["org_id"]
        write.unit.insert_document(MRN_CLAIMS, f"{org_id}:{number}",
                                   {"id": f"{org_id}:{number}", "patient": write.resource["id"]})
        write.unit.put_document(MRN_COUNTERS, org_id, {"id": org_id, "last": number})
    return write.resource


org_patients = Facade(
    resource="Patient", name="Patient", create=OrgPatientCreate, view=PatientView,
    to_fhir=org_patient_to_fhir, from_fhir=patient_from_fhir, views=patient_views,
    scope=OrganizationScope(), prepare=_next_mrn, alongside=_claim_mrn, retries=50,
    tags=["patients"],
    unique=Unique(_mrn_identifier, "MRN_TAKEN", "This MRN is already used in this "
                  "organization"),
    summaries={"list": "List the patients registered by an organization",
               "create": "Register a patient for an organization (MRN generated when absent)",
               "get": "A patient in the context of an organization"},
)

router = APIRouter(tags=["patients"])


@router.get("/api/patients/me", response_model=Envelope[PatientView],
            summary="The caller's patient profile",
            responses={404: {"model": ErrorEnvelope,
                             "description": "The caller has no patient profile yet"}})
async def my_profile(ctx: ApiContext = Depends(api_context)) -> Any:
    found = await ctx.fhir.search("Patient", [
        ("identifier", f"{USER_SYSTEM}|{ctx.principal.user_id}")])
    if not found:
        raise not_found("Patient profile")
    return ok(await profiles.render_one(ctx, found[0]))


@router.get("/api/organizations/{org_id}/patients/search",
            response_model=PageEnvelope[PatientView],
            summary="Find an organization's patient by medical record number")
async def search_org_patients(
        org_id: str, mrn: Annotated[str, Query(min_length=1, description="Medical record "
                                                "number")],
        page: Pagination = Depends(pagination), ctx: ApiContext = Depends(api_context)) -> Any:
    found, total = await org_patients.search(ctx, page, [
        ("identifier", f"{mrn_system(org_id)}|{mrn}")])
    return page.respond(await org_patients.render(ctx, found), total)


profiles.mount(router, "/api/patients", ops=("create", "get", "update"), update_method="POST")
org_patients.mount(router, "/api/organizations/{org_id}/patients", ops=("list", "create", "get"))
