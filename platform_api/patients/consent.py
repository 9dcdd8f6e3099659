"""Patients area, consent: a patient's permission to share their record ⇄ FHIR Consent,
which the access policy reads (``platform_api.policy``: the *consent* relation).

Mapping (/api field → FHIR Consent):
    patient_id       → patient (Patient/<id>) and performer[0] (the patient grants)
    status           → status: proposed (requested by a clinician), active (granted or
                       approved), rejected (a request declined), inactive (revoked); moves
                       by ``CONSENT_STATUS``
    grantee_type,    → provision.actor[0]: role v3-ParticipationType IRCP (information
      grantee_id       recipient), reference Organization/<id> or Practitioner/<id>
    purpose          → provision.purpose[0] (v3-ActReason: TREAT treatment, ETREAT
                       emergency treatment, HPAYMT payment, HOPERAT operations, HRESCH
                       research)
    expires_at       → provision.period.end (the policy ignores a consent past its end);
                       granted_at → provision.period.start and dateTime
    note             → policyRule.text (an R4 Consent has no note)
    requested_by     → extension urn:healthplatform:extension:consent-requested-by
                       (valueReference to the requesting user)
    (fixed)          → scope consentscope#patient-privacy, category LOINC 59284-0 Patient
                       Consent, policyRule v3-ActCode#OPTIN, provision.type permit

Routes and who may use them (rules next to each route, on top of the resource policy):

- ``POST /api/consent/grant``: a patient grants access to their own record (their profile,
  the Patient with their user identifier) to an organization or a practitioner: active at
  once (written as the patient, whom the policy lets write Consents in their record);
- ``POST /api/consent/request``: a member of an organization whose role may create a
  Consent (``ORG:ADMIN``, ``ORG:DOCTOR``, ``ORG:RECEPTIONIST``) asks a patient for access
  for that organization: a proposed Consent owned by that organization (so its members
  follow the request) and visible to the patient; as the clinic may not see the patient
  yet, the platform's writer records it (see ``shared``);
- ``POST /api/consent/:id/approve`` and ``/revoke``: the patient (or a platform
  administrator); approving makes a request active; revoking makes an active consent
  inactive (its period ends now), or declines a request (rejected);
- ``GET /api/consent`` lists the caller's consents (as a patient: theirs; as a clinician:
  those naming their organizations or practitioner records; ``patient_id`` for a
  patient's); ``GET /api/consent/:id`` one of them.

A Consent written in this process drops every cached access subject, so a revocation (or
an approval) takes effect from the next request; other processes follow within the
policy's cache time (5 s). Events: ``platform.consent.requested``, ``.granted`` (a grant
or an approval), ``.revoked`` (``consent_id``, ``patient_id``, ``grantee``, ``status``,
``by``).
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends
from pydantic import BaseModel, Field

from fhir_server.access import CREATE
from fhir_server.caller import CallerFhir
from fhir_server.clock import now_instant
from fhir_server.ownership import with_owners
from platform_api.envelope import ApiError, Envelope, conflict, created, forbidden, not_found
from platform_api.facade import (
    ApiContext,
    Facade,
    ItemContext,
    SearchParam,
    StatusTable,
    api_context,
    require_patient,
    staged_body,
)
from platform_api.patients.shared import (
    JSON,
    LOINC,
    MineQuery,
    concept,
    fhir_datetime,
    local_id,
    mine,
    patient_reference,
    platform_fhir,
    source_service,
    user_of,
    user_reference,
)
from platform_api.policy.roles import types_for

PARTICIPATION = "http://terminology.hl7.org/CodeSystem/v3-ParticipationType"
ACT_REASON = "http://terminology.hl7.org/CodeSystem/v3-ActReason"
REQUESTED_BY = "urn:healthplatform:extension:consent-requested-by"
CONSENT_STATUS = StatusTable.of(
    draft=("proposed", "active", "rejected"),
    proposed=("active", "rejected"),
    active=("inactive",),
    rejected=(),
    inactive=(),
)
PURPOSES = {"treatment": ("TREAT", "treatment"),
            "emergency": ("ETREAT", "Emergency Treatment"),
            "payment": ("HPAYMT", "healthcare payment"),
            "operations": ("HOPERAT", "healthcare operations"),
            "research": ("HRESCH", "healthcare research")}
Purpose = Literal["treatment", "emergency", "payment", "operations", "research"]
ConsentStatus = Literal["proposed", "active", "rejected", "inactive"]
GRANTEE_TYPES = {"organization": "Organization", "practitioner": "Practitioner"}


class GrantRequest(BaseModel):
    grantee_type: Literal["organization", "practitioner"] = Field(examples=["organization"])
    grantee_id: str = Field(min_length=1, max_length=64)
    purpose: Purpose = "treatment"
    expires_at: datetime | None = None
    note: str | None = Field(default=None, max_length=1000)


class ConsentRequest(BaseModel):
    patient_id: str = Field(min_length=1, max_length=64)
    organization_id: str | None = Field(default=None, max_length=64,
                                        description="Which of your organizations asks "
                                                    "(default: your only one)")
    purpose: Purpose = "treatment"
    expires_at: datetime | None = None
    note: str | None = Field(default=None, max_length=1000,
                             examples=["Referral for a cardiology review"])


class ConsentView(BaseModel):
    id: str
    patient_id: str | None = None
    patient_name: str | None = None
    status: str
    grantee_type: str | None = None
    grantee_id: str | None = None
    grantee_name: str | None = None
    purpose: str | None = None
    note: str | None = None
    requested_by: str | None = None
    granted_at: str | None = None
    expires_at: str | None = None
    updated_at: str | None = None


class ConsentQuery(MineQuery):
    patient_id: Annotated[str | None, SearchParam("patient", "Patient/{}")] = Field(
        None, max_length=64, description="A patient's consents (default: yours)")
    status: Annotated[ConsentStatus | None, SearchParam("status")] = None


# -- mapping ------------------------------------------------------------------------------------
def consent_resource(patient: JSON, grantee: JSON, status: str, purpose: str,
                     expires_at: datetime | None, note: str | None) -> JSON:
    when = now_instant()
    code, display = PURPOSES[purpose]
    provision: JSON = {
        "type": "permit",
        "actor": [{"role": concept(PARTICIPATION, "IRCP", "information recipient"),
                   "reference": {"reference": f"{grantee['resourceType']}/{grantee['id']}",
                                 "display": _name_of(grantee)}}],
        "purpose": [{"system": ACT_REASON, "code": code, "display": display}],
    }
    period: JSON = {}
    if status == "active":
        period["start"] = when
    if expires_at is not None:
        period["end"] = fhir_datetime(expires_at)
    if period:
        provision["period"] = period
    consent: JSON = {
        "resourceType": "Consent", "status": status,
        "scope": concept("http://terminology.hl7.org/CodeSystem/consentscope",
                         "patient-privacy", "Privacy Consent"),
        "category": [concept(LOINC, "59284-0", "Patient Consent")],
        "patient": patient_reference(patient), "dateTime": when,
        "performer": [patient_reference(patient)],
        "policyRule": {**concept("http://terminology.hl7.org/CodeSystem/v3-ActCode", "OPTIN",
                                 "opt-in"), **({"text": note} if note else {})},
        "provision": provision,
    }
    return consent


def _name_of(resource: JSON) -> str:
    name = resource.get("name")
    if isinstance(name, str):
        return name
    for part in name or []:
        text = part.get("text") or " ".join([*part.get("given", []), part.get("family", "")])
        if text.strip():
            return str(text.strip())
    return f"{resource['resourceType']}/{resource['id']}"


def grantee_of(consent: JSON) -> JSON:
    actor = ((consent.get("provision") or {}).get("actor") or [{}])[0]
    return actor.get("reference") or {}  # type: ignore[no-any-return]


def consent_view(consent: JSON) -> JSON:
    grantee = grantee_of(consent)
    kind, _, grantee_id = (grantee.get("reference") or "").partition("/")
    provision = consent.get("provision") or {}
    period = provision.get("period") or {}
    purpose_code = ((provision.get("purpose") or [{}])[0]).get("code")
    requester = next((e.get("valueReference") for e in consent.get("extension") or []
                      if e.get("url") == REQUESTED_BY), None)
    return ConsentView(
        id=consent["id"], patient_id=local_id(consent.get("patient"), "Patient"),
        patient_name=(consent.get("patient") or {}).get("display"), status=consent["status"],
        grantee_type=next((k for k, v in GRANTEE_TYPES.items() if v == kind), None),
        grantee_id=grantee_id or None, grantee_name=grantee.get("display"),
        purpose=next((k for k, (c, _d) in PURPOSES.items() if c == purpose_code), None),
        note=(consent.get("policyRule") or {}).get("text"), requested_by=user_of(requester),
        granted_at=period.get("start"), expires_at=period.get("end"),
        updated_at=(consent.get("meta") or {}).get("lastUpdated"),
    ).model_dump()


async def _grantee(ctx: ApiContext, kind: str, grantee_id: str) -> JSON:
    grantee = await ctx.services.fhir.find_json(GRANTEE_TYPES[kind], grantee_id)
    if grantee is None:
        raise ApiError(422, "VALIDATION_ERROR", f"grantee_id: no {kind} {grantee_id!r}",
                       field="grantee_id")
    return grantee


def _naming_me(ctx: ApiContext) -> list[tuple[str, str]]:
    """A clinician's consents: those naming their organizations or practitioner records."""
    subject = ctx.access.subject
    actors = [f"Organization/{o}" for o in sorted(subject.memberships)] + [
        f"Practitioner/{p}" for p in sorted(subject.practitioner_ids)]
    return [("actor", ",".join(actors) or "Organization/none")]


def _open_for_same_grantee(consent: JSON) -> list[tuple[str, str]]:
    return [("patient", consent["patient"]["reference"]),
            ("actor", grantee_of(consent)["reference"]), ("status", "proposed,active")]


def _event(consent: JSON, by: str) -> JSON:
    return {"consent_id": consent["id"], "patient_id": local_id(consent.get("patient"),
                                                                "Patient"),
            "grantee": grantee_of(consent).get("reference"), "status": consent["status"],
            "by": by}



consents = Facade(
    resource="Consent", name="Consent", create=GrantRequest, view=ConsentView,
    query=ConsentQuery, from_fhir=consent_view,
    statuses=CONSENT_STATUS, list_criteria=mine("patient", clinician=_naming_me),
    sort="-_lastUpdated", tags=["consent"],
    summaries={"list": "Your consents (role=patient: the ones you gave; clinician: those "
                       "naming your organizations), or a patient's (patient_id)",
               "get": "A consent"},
)

router = APIRouter(tags=["consent"])
consents.mount(router, "/api/consent", ops=("list", "get"))


async def write_consent(ctx: ApiContext, fhir: CallerFhir, consent: JSON, topic: str) -> JSON:
    """Create ``consent`` unless one for the same patient and grantee is proposed or
    active (409 CONSENT_EXISTS), with ``topic`` in the same unit of work."""
    unit = fhir.unit()
    async with unit:
        staged = await unit.create(consent, expected_type="Consent",
                                   if_none_exist=_open_for_same_grantee(consent))
        unit.after_writes(lambda staging: None if staged.existing else staging.emit(
            topic, _event(staged_body(staged), ctx.principal.user_id),
            source_service=source_service("consent")))
        await unit.commit()
    if staged.existing:
        raise conflict("CONSENT_EXISTS", "A consent for this grantee is already active or "
                       "waiting for the patient's approval")
    return staged_body(staged)


@router.post("/api/consent/grant", status_code=201, response_model=Envelope[ConsentView],
             summary="Grant an organization or a practitioner access to your record")
async def grant(body: GrantRequest, ctx: ApiContext = Depends(api_context)) -> Any:
    own = ctx.access.subject.patient_id
    if own is None:
        raise not_found("Patient profile")
    patient = await require_patient(ctx, own)
    grantee = await _grantee(ctx, body.grantee_type, body.grantee_id)
    consent = consent_resource(patient, grantee, "active", body.purpose, body.expires_at,
                               body.note)
    stored = await write_consent(ctx, ctx.fhir, consent, "platform.consent.granted")
    return created(consent_view(stored))


def _asking_organization(ctx: ApiContext, wanted: str | None) -> str:
    """The organization a clinician asks for: one of theirs whose role may ask."""
    subject = ctx.access.subject
    able = [o for o, role in subject.memberships.items()
            if "Consent" in types_for(role, CREATE)]
    if wanted is not None:
        if wanted not in able:
            raise forbidden("You may not ask for consent for this organization")
        return wanted
    if len(able) != 1:
        raise ApiError(422, "VALIDATION_ERROR", "organization_id: say which of your "
                       "organizations asks" if able else "organization_id: you are in no "
                       "organization that may ask for consent", field="organization_id")
    return able[0]


@router.post("/api/consent/request", status_code=201, response_model=Envelope[ConsentView],
             summary="Ask a patient for access to their record for your organization")
async def request_consent(body: ConsentRequest, ctx: ApiContext = Depends(api_context)
                          ) -> Any:
    org_id = _asking_organization(ctx, body.organization_id)
    patient = await ctx.services.fhir.find_json("Patient", body.patient_id)
    if patient is None:
        raise not_found("Patient")
    organization = await ctx.services.fhir.find_json("Organization", org_id)
    if organization is None:
        raise not_found("Organization")
    consent = consent_resource(patient, organization, "proposed", body.purpose,
                               body.expires_at, body.note)
    consent["extension"] = [{"url": REQUESTED_BY,
                             "valueReference": user_reference(ctx.principal)}]
    stored = await write_consent(ctx, platform_fhir(ctx), with_owners(consent, {org_id}),
                                 "platform.consent.requested")
    return created(consent_view(stored))


def _require_patient_self(ctx: ItemContext[Any]) -> None:
    subject = ctx.access.subject
    patient_id = local_id(ctx.resource.get("patient"), "Patient")
    if not subject.unrestricted and (patient_id is None or patient_id != subject.patient_id):
        raise forbidden("Only the patient may decide on their consent")


@consents.route("POST", "/{resource_id}/approve",
                summary="Approve a consent request (the patient)")
async def approve(ctx: ItemContext[Any]) -> JSON:
    _require_patient_self(ctx)
    consent = CONSENT_STATUS.move(ctx.resource, "active")
    when = now_instant()
    provision = dict(consent.get("provision") or {})
    provision["period"] = {**provision.get("period", {}), "start": when}
    approved = {**consent, "dateTime": when, "provision": provision}
    return await ctx.save(approved, event="platform.consent.granted",
                          payload=_event(approved, ctx.principal.user_id))


@consents.route("POST", "/{resource_id}/revoke",
                summary="Revoke a consent, or decline a request (the patient)")
async def revoke(ctx: ItemContext[Any]) -> JSON:
    _require_patient_self(ctx)
    current = ctx.resource
    target = "rejected" if current["status"] in ("proposed", "draft") else "inactive"
    consent = CONSENT_STATUS.move(current, target)
    when = now_instant()
    provision = dict(consent.get("provision") or {})
    if target == "inactive":
        provision["period"] = {**provision.get("period", {}), "end": when}
    revoked = {**consent, "dateTime": when, "provision": provision}
    return await ctx.save(revoked, event="platform.consent.revoked",
                          payload=_event(revoked, ctx.principal.user_id))

