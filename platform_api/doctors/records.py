"""A doctor's FHIR records and their /api views: Practitioner, PractitionerRole(s) and
the VerificationResult of the doctor's credentials.

Mapping (/api → FHIR):

    user_id → Practitioner.identifier ``urn:healthplatform:user|<id>`` (one profile a user)
    title, first_name, last_name → Practitioner.name[use=official] (prefix, given, family)
    gender → Practitioner.gender
    phone, email → Practitioner.telecom (use work): **never** in public views
    license_number, license_authority → Practitioner.identifier (type v2-0203 MD,
        system ``urn:healthplatform:medical-license:<authority>``, assigner)
    city, country → Practitioner.address[use=work]
    languages → Practitioner.communication (BCP-47 codes, ``urn:ietf:bcp:47``)
    qualifications → Practitioner.qualification (code.text, issuer.display, period.start)
    photo_url → Practitioner.photo[0].url
    biography → Practitioner.extension ``urn:healthplatform:biography`` (valueMarkdown)
    published → Practitioner.meta.tag ``urn:healthplatform:published|<field>``: what the
        doctor shows the public (gender, languages, city, qualifications, biography,
        photo, organizations); the public search only filters on what is published
    verification → Practitioner.meta.tag ``urn:healthplatform:doctor-verification|
        pending|verified|rejected`` (what searches use; R4 VerificationResult has no
        status search parameter) and the VerificationResult itself: ``target`` the
        Practitioner, ``status`` in-process | validated | val-fail, ``statusDate``,
        ``validationType`` primary, ``validator[0].attestationSignature`` (the
        administrator who decided: ``who`` with their user identifier, ISO signature
        type "Verification Signature"), the reason of a rejection in the extension
        ``urn:healthplatform:verification-reason``
    specialties → PractitionerRole.specialty (SNOMED CT or local codes) of every one of
        the doctor's roles: the profile's own role (no organization) and one role per
        organization (``organization``, code ``doctor``, owned by the organization)

A doctor's Practitioner, profile role and VerificationResult belong to no organization:
the platform writes them on the doctor's behalf once the access policy let the doctor act
(a named elevation, recorded in the audit trail), platform administrators with their own
rights. Practitioners and PractitionerRoles are the directory every signed-in user reads
(the public views here too); a VerificationResult only platform administrators read, so
the private views (the doctor's, their colleagues') read it through an elevation.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Annotated, Any, Literal

import orjson
from pydantic import BaseModel, EmailStr, Field, HttpUrl

from fhir_server.access import READ, SEARCH, Access, Grant
from fhir_server.caller import CallerFhir
from fhir_server.clock import now_instant
from platform_api.fhir_values import coding, concept, local_id, reference, user_identifier
from platform_api.policy.subject import USER_SYSTEM
from platform_api.services import Services

JSON = dict[str, Any]
SNOMED = "http://snomed.info/sct"
BCP47 = "urn:ietf:bcp:47"
PUBLISHED_TAG = "urn:healthplatform:published"
VERIFICATION_TAG = "urn:healthplatform:doctor-verification"
BIOGRAPHY = "urn:healthplatform:biography"
REASON = "urn:healthplatform:verification-reason"
LICENSE_TYPE = concept("MD", "http://terminology.hl7.org/CodeSystem/v2-0203",
                       "Medical License number")
DOCTOR_ROLE = concept("doctor", "http://terminology.hl7.org/CodeSystem/practitioner-role",
                      "Doctor")
VERIFICATION_SIGNATURE = {"system": "urn:iso-astm:E1762-95:2013",
                          "code": "1.2.840.10065.1.12.1.5", "display": "Verification Signature"}
# /api verification status ⇄ VerificationResult.status
VERIFICATION = {"pending": "in-process", "verified": "validated", "rejected": "val-fail"}
VERIFICATION_OF = {fhir: api for api, fhir in VERIFICATION.items()}
PublishedField = Literal["gender", "languages", "city", "qualifications", "biography",
                         "photo", "organizations"]
DEFAULT_PUBLISHED: tuple[str, ...] = ("languages", "city", "qualifications", "biography",
                                      "photo", "organizations")
Language = Annotated[str, Field(pattern=r"^[a-z]{2,3}(-[A-Za-z0-9]{2,8})*$", examples=["sw"])]

# What anonymous callers of the public routes may read: the directory and the schedules
# (verification records only through the views here, which show a verified badge).
PUBLIC_TYPES = frozenset({"Practitioner", "PractitionerRole", "Organization", "Location",
                          "Schedule", "Slot", "HealthcareService"})


class PublicDirectory:
    """The access of an anonymous caller of the public doctor routes: read the directory
    and the schedules, write nothing."""

    def grants(self, action: str) -> tuple[Grant, ...] | None:
        return (Grant(PUBLIC_TYPES, relation="public"),) if action in (READ, SEARCH) else ()

    def describe(self) -> str:
        return "an anonymous caller"

    def explain(self, action: str, resource_type: str) -> str:
        return ""


PUBLIC: Access = PublicDirectory()


def public_fhir(services: Services) -> CallerFhir:
    return CallerFhir(services.fhir, PUBLIC)


# -- models -------------------------------------------------------------------------------------
class Specialty(BaseModel):
    code: str = Field(min_length=1, max_length=64, examples=["394579002"])
    system: str = Field(default=SNOMED, max_length=200)
    display: str | None = Field(default=None, max_length=200, examples=["Cardiology"])


class Qualification(BaseModel):
    title: str = Field(min_length=1, max_length=200, examples=["MBChB"])
    institution: str | None = Field(default=None, max_length=200,
                                    examples=["University of Nairobi"])
    year: int | None = Field(default=None, ge=1900, le=2100, examples=[2012])


class DoctorFields(BaseModel):
    title: str | None = Field(default=None, max_length=20, examples=["Dr."])
    gender: Literal["male", "female", "other", "unknown"] | None = None
    phone: str | None = Field(default=None, pattern=r"^\+[1-9]\d{6,14}$")
    email: EmailStr | None = None
    license_number: str | None = Field(default=None, min_length=1, max_length=64,
                                       examples=["A12345"])
    license_authority: str | None = Field(default=None, min_length=1, max_length=100,
                                          examples=["KMPDC"])
    specialties: list[Specialty] | None = Field(default=None, max_length=20)
    languages: list[Language] | None = Field(default=None, max_length=20,
                                             examples=[["sw", "en"]])
    city: str | None = Field(default=None, max_length=100, examples=["Nairobi"])
    country: str | None = Field(default=None, min_length=2, max_length=2, examples=["KE"])
    qualifications: list[Qualification] | None = Field(default=None, max_length=20)
    biography: str | None = Field(default=None, max_length=5000)
    photo_url: HttpUrl | None = None
    published: list[PublishedField] | None = Field(
        default=None, description="What the public profile shows besides the name and "
        "specialties (default: languages, city, qualifications, biography, photo, "
        "organizations)")


class DoctorCreate(DoctorFields):
    first_name: str = Field(min_length=1, max_length=100, examples=["Wanjiru"])
    last_name: str = Field(min_length=1, max_length=100, examples=["Kamau"])


class DoctorUpdate(DoctorFields):
    first_name: str | None = Field(default=None, min_length=1, max_length=100)
    last_name: str | None = Field(default=None, min_length=1, max_length=100)


class SpecialtyView(BaseModel):
    code: str | None
    system: str | None = None
    display: str | None = None


class QualificationView(BaseModel):
    title: str | None
    institution: str | None = None
    year: int | None = None


class OrganizationRef(BaseModel):
    id: str
    name: str | None = None
    city: str | None = None


class Verification(BaseModel):
    status: str = Field(description="pending | verified | rejected")
    reason: str | None = None
    decided_at: str | None = None


class PublicDoctorView(BaseModel):
    """What anyone may see: the name, the specialties, and what the doctor published."""

    id: str
    display_name: str
    title: str | None = None
    first_name: str | None = None
    last_name: str | None = None
    specialties: list[SpecialtyView] = []
    verified: bool = True
    gender: str | None = None
    languages: list[str] | None = None
    city: str | None = None
    country: str | None = None
    qualifications: list[QualificationView] | None = None
    biography: str | None = None
    photo_url: str | None = None
    organizations: list[OrganizationRef] | None = None


class DoctorView(BaseModel):
    """The whole profile: for the doctor, platform administrators and colleagues."""

    id: str
    user_id: str | None
    display_name: str
    title: str | None = None
    first_name: str | None = None
    last_name: str | None = None
    gender: str | None = None
    phone: str | None = None
    email: str | None = None
    license_number: str | None = None
    license_authority: str | None = None
    specialties: list[SpecialtyView] = []
    languages: list[str] = []
    city: str | None = None
    country: str | None = None
    qualifications: list[QualificationView] = []
    biography: str | None = None
    photo_url: str | None = None
    published: list[str] = []
    verification: Verification
    organizations: list[OrganizationRef] = []
    updated_at: str | None = None


# -- Practitioner ---------------------------------------------------------------------------------
def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "unknown"


def _tags(resource: JSON, system: str) -> list[str]:
    return [t["code"] for t in (resource.get("meta") or {}).get("tag") or []
            if t.get("system") == system and t.get("code")]


def with_tags(resource: JSON, system: str, codes: Iterable[str]) -> JSON:
    """``resource`` with exactly ``codes`` as its tags of ``system``."""
    meta = dict(resource.get("meta") or {})
    others = [t for t in meta.get("tag") or [] if t.get("system") != system]
    meta["tag"] = [*others, *({"system": system, "code": c} for c in codes)]
    return {**resource, "meta": meta}


def verification_status(practitioner: JSON) -> str:
    return next(iter(_tags(practitioner, VERIFICATION_TAG)), "pending")


def published(practitioner: JSON) -> list[str]:
    return _tags(practitioner, PUBLISHED_TAG)


def _name(practitioner: JSON) -> JSON:
    names = practitioner.get("name") or []
    return next((n for n in names if n.get("use") == "official"), names[0] if names else {})


def _set_identity(practitioner: JSON, payload: JSON) -> None:
    name = dict(_name(practitioner)) or {"use": "official"}
    if payload.get("first_name"):
        name["given"] = [payload["first_name"], *name.get("given", [])[1:]]
    if payload.get("last_name"):
        name["family"] = payload["last_name"]
    if "title" in payload:
        name.pop("prefix", None)
        if payload["title"]:
            name["prefix"] = [payload["title"]]
    others = [n for n in practitioner.get("name", []) if n.get("use") != "official"]
    practitioner["name"] = [name, *others]
    if payload.get("gender"):
        practitioner["gender"] = payload["gender"]


def _set_telecom(practitioner: JSON, payload: JSON) -> None:
    kept = [t for t in practitioner.get("telecom", []) if t.get("system") not in payload]
    added = [{"system": s, "value": str(payload[s]), "use": "work"}
             for s in ("phone", "email") if payload.get(s)]
    if kept or added:
        practitioner["telecom"] = [*kept, *added]
    else:
        practitioner.pop("telecom", None)


def _set_license(practitioner: JSON, payload: JSON) -> None:
    if "license_number" not in payload and "license_authority" not in payload:
        return
    current = license_of(practitioner)
    number = payload.get("license_number", current[0])
    authority = payload.get("license_authority", current[1]) or "unknown"
    kept = [i for i in practitioner.get("identifier", []) if coding(i.get("type")).get(
        "code") != "MD"]
    if number:
        kept.append({"use": "official", "type": LICENSE_TYPE,
                     "system": f"urn:healthplatform:medical-license:{_slug(authority)}",
                     "value": number, "assigner": {"display": authority}})
    practitioner["identifier"] = kept


def license_of(practitioner: JSON) -> tuple[str | None, str | None]:
    for identifier in practitioner.get("identifier", []):
        if coding(identifier.get("type")).get("code") == "MD":
            return identifier.get("value"), (identifier.get("assigner") or {}).get("display")
    return None, None


def _set_profile(practitioner: JSON, payload: JSON) -> None:
    if "city" in payload or "country" in payload:
        work = dict(next((a for a in practitioner.get("address", []) if a.get("use") ==
                          "work"), {"use": "work"}))
        for field in ("city", "country"):
            if field in payload:
                work.pop(field, None)
                if payload[field]:
                    work[field] = payload[field].upper() if field == "country" else \
                        payload[field]
        others = [a for a in practitioner.get("address", []) if a.get("use") != "work"]
        practitioner["address"] = [work, *others]
    if payload.get("languages") is not None:
        practitioner["communication"] = [concept(code, BCP47) for code in payload["languages"]]
    if payload.get("qualifications") is not None:
        practitioner["qualification"] = [_qualification(q) for q in payload["qualifications"]]
    if "photo_url" in payload:
        practitioner.pop("photo", None)
        if payload["photo_url"]:
            practitioner["photo"] = [{"url": str(payload["photo_url"])}]
    if "biography" in payload:
        extensions = [e for e in practitioner.get("extension", []) if e.get("url") != BIOGRAPHY]
        if payload["biography"]:
            extensions.append({"url": BIOGRAPHY, "valueMarkdown": payload["biography"]})
        practitioner["extension"] = extensions
        if not extensions:
            practitioner.pop("extension")


def _qualification(q: JSON) -> JSON:
    found: JSON = {"code": {"text": q["title"]}}
    if q.get("institution"):
        found["issuer"] = {"display": q["institution"]}
    if q.get("year"):
        found["period"] = {"start": str(q["year"])}
    return found


def practitioner_to_fhir(payload: JSON, existing: JSON | None, user_id: str | None) -> JSON:
    """A Practitioner with the payload's fields; on update only the fields sent change."""
    practitioner: JSON = orjson.loads(orjson.dumps(existing)) if existing else {
        "resourceType": "Practitioner", "active": True,
        "identifier": [user_identifier(user_id)] if user_id else []}
    if existing is None:
        practitioner = with_tags(practitioner, VERIFICATION_TAG, ["pending"])
        practitioner = with_tags(practitioner, PUBLISHED_TAG, DEFAULT_PUBLISHED)
    if payload.get("published") is not None:
        practitioner = with_tags(practitioner, PUBLISHED_TAG, sorted(set(payload["published"])))
    _set_identity(practitioner, payload)
    _set_telecom(practitioner, payload)
    _set_license(practitioner, payload)
    _set_profile(practitioner, payload)
    if not practitioner.get("identifier"):
        practitioner.pop("identifier", None)
    return practitioner


# -- roles and verification -----------------------------------------------------------------------
def specialties_concepts(specialties: Sequence[JSON]) -> list[JSON]:
    return [concept(s["code"], s.get("system") or SNOMED, s.get("display"))
            for s in specialties]


def practitioner_role(practitioner_id: str, specialties: Sequence[JSON],
                      organization_id: str | None = None) -> JSON:
    role: JSON = {"resourceType": "PractitionerRole", "active": True,
                  "practitioner": reference("Practitioner", practitioner_id),
                  "code": [DOCTOR_ROLE]}
    if specialties:
        role["specialty"] = list(specialties)
    if organization_id is not None:
        role["organization"] = reference("Organization", organization_id)
        role["period"] = {"start": now_instant()}
    return role


def verification_result(practitioner_id: str, existing: JSON | None = None) -> JSON:
    result: JSON = dict(existing) if existing else {
        "resourceType": "VerificationResult",
        "target": [reference("Practitioner", practitioner_id)],
        "targetLocation": ["Practitioner.identifier", "Practitioner.qualification"],
        "validationType": concept("primary", "http://terminology.hl7.org/CodeSystem/"
                                  "verificationresult-validation-type", "Primary Source"),
        "validationProcess": [{"text": "Review of the medical licence and qualifications"}]}
    return {**result, "status": "in-process", "statusDate": now_instant()}


def decided(result: JSON, status: str, reason: str | None, decided_by: str,
            decider_name: str, validator: str) -> JSON:
    """The VerificationResult decided by an administrator."""
    when = now_instant()
    changed = {k: v for k, v in result.items() if k != "extension"}
    changed.update(status=VERIFICATION[status], statusDate=when, validator=[{
        "organization": {"display": validator},
        "attestationSignature": {"type": [VERIFICATION_SIGNATURE], "when": when,
                                 "who": {"identifier": user_identifier(decided_by),
                                         "display": decider_name}}}])
    if reason:
        changed["extension"] = [{"url": REASON, "valueString": reason}]
    return changed


# -- views ----------------------------------------------------------------------------------------
def _specialties(roles: Sequence[JSON]) -> list[JSON]:
    seen: dict[tuple[Any, Any], JSON] = {}
    for role in roles:
        for specialty in role.get("specialty", []):
            first = coding(specialty)
            seen.setdefault((first.get("system"), first.get("code")), {
                "code": first.get("code"), "system": first.get("system"),
                "display": first.get("display") or specialty.get("text")})
    return list(seen.values())


def _organizations(roles: Sequence[JSON], organizations: dict[str, JSON]) -> list[JSON]:
    found = []
    for role in roles:
        org_id = local_id(role.get("organization"), "Organization")
        if org_id is None:
            continue
        org = organizations.get(org_id, {})
        found.append({"id": org_id, "name": org.get("name"),
                      "city": ((org.get("address") or [{}])[0]).get("city")})
    return found


def _common(practitioner: JSON, roles: Sequence[JSON], organizations: dict[str, JSON]) -> JSON:
    name = _name(practitioner)
    title = (name.get("prefix") or [None])[0]
    first, last = (name.get("given") or [None])[0], name.get("family")
    address: JSON = next((a for a in practitioner.get("address", [])
                          if a.get("use") == "work"), {})
    return {
        "id": practitioner["id"], "title": title, "first_name": first, "last_name": last,
        "display_name": " ".join(p for p in (title, first, last) if p) or practitioner["id"],
        "specialties": _specialties(roles), "gender": practitioner.get("gender"),
        "languages": [coding(c).get("code") for c in practitioner.get("communication", [])],
        "city": address.get("city"), "country": address.get("country"),
        "qualifications": [{"title": (q.get("code") or {}).get("text"),
                            "institution": (q.get("issuer") or {}).get("display"),
                            "year": int(str((q.get("period") or {}).get("start", "0"))[:4])
                            or None} for q in practitioner.get("qualification", [])],
        "biography": next((e.get("valueMarkdown") for e in practitioner.get("extension", [])
                           if e.get("url") == BIOGRAPHY), None),
        "photo_url": ((practitioner.get("photo") or [{}])[0]).get("url"),
        "organizations": _organizations(roles, organizations)}


PUBLIC_FIELDS = {"gender": ("gender",), "languages": ("languages",),
                 "city": ("city", "country"), "qualifications": ("qualifications",),
                 "biography": ("biography",), "photo": ("photo_url",),
                 "organizations": ("organizations",)}


def public_view(practitioner: JSON, roles: Sequence[JSON], organizations: dict[str, JSON]
                ) -> JSON:
    """Only the name, the specialties and what the doctor published: never contact
    details, identifiers or the licence."""
    common = _common(practitioner, roles, organizations)
    shown = set(published(practitioner))
    view = {k: common[k] for k in ("id", "display_name", "title", "first_name", "last_name",
                                   "specialties")}
    for choice, fields in PUBLIC_FIELDS.items():
        for field in fields:
            view[field] = common[field] if choice in shown else None
    return PublicDoctorView.model_validate(view).model_dump()


def doctor_view(practitioner: JSON, roles: Sequence[JSON], organizations: dict[str, JSON],
                result: JSON | None) -> JSON:
    telecom = {t.get("system"): t.get("value") for t in practitioner.get("telecom", [])}
    number, authority = license_of(practitioner)
    reason = next((e.get("valueString") for e in (result or {}).get("extension", [])
                   if e.get("url") == REASON), None)
    return DoctorView.model_validate({
        **_common(practitioner, roles, organizations), "user_id": user_of(practitioner),
        "phone": telecom.get("phone"), "email": telecom.get("email"),
        "license_number": number, "license_authority": authority,
        "published": published(practitioner),
        "verification": {"status": verification_status(practitioner), "reason": reason,
                         "decided_at": (result or {}).get("statusDate")
                         if result and result.get("status") != "in-process" else None},
        "updated_at": (practitioner.get("meta") or {}).get("lastUpdated")}).model_dump()


async def render(fhir: CallerFhir, practitioners: Sequence[JSON], *, public: bool
                 ) -> list[JSON]:
    """Views of ``practitioners`` with their roles, organizations and verification: one
    search for the whole page (``_revinclude`` the roles and verification results,
    ``_include:iterate`` the roles' organizations), read with ``fhir``'s access."""
    if not practitioners:
        return []
    params = [("_id", ",".join(p["id"] for p in practitioners)), *VIEW_INCLUDES]
    if not public:
        params.append(("_revinclude", "VerificationResult:target"))
    return assemble(practitioners, await fhir.search("Practitioner", params, included=True),
                    public=public)


# What a search of Practitioners adds for their views: their roles and the roles'
# organizations (a list search carries these, so its page needs no second search).
VIEW_INCLUDES = (("_revinclude", "PractitionerRole:practitioner"),
                 ("_include:iterate", "PractitionerRole:organization"))


def assemble(practitioners: Sequence[JSON], found: Sequence[JSON], *, public: bool
             ) -> list[JSON]:
    """Views of ``practitioners`` from the roles, organizations and verification results
    among ``found``."""
    roles: dict[str, list[JSON]] = {}
    results: dict[str, JSON] = {}
    organizations = {r["id"]: r for r in found if r["resourceType"] == "Organization"}
    for resource in found:
        if resource["resourceType"] == "PractitionerRole":
            owner = local_id(resource.get("practitioner"), "Practitioner") or ""
            roles.setdefault(owner, []).append(resource)
        elif resource["resourceType"] == "VerificationResult":
            for target in resource.get("target", []):
                results[local_id(target, "Practitioner") or ""] = resource
    if public:
        return [public_view(p, roles.get(p["id"], []), organizations) for p in practitioners]
    return [doctor_view(p, roles.get(p["id"], []), organizations, results.get(p["id"]))
            for p in practitioners]


async def practitioner_of_user(fhir: CallerFhir, user_id: str) -> JSON | None:
    found = await fhir.search("Practitioner", [("identifier", f"{USER_SYSTEM}|{user_id}")])
    return found[0] if found else None


async def roles_of(fhir: CallerFhir, practitioner_id: str) -> list[JSON]:
    return await fhir.search("PractitionerRole", [
        ("practitioner", f"Practitioner/{practitioner_id}")])


def user_of(practitioner: JSON) -> str | None:
    return next((i.get("value") for i in practitioner.get("identifier", [])
                 if i.get("system") == USER_SYSTEM), None)
