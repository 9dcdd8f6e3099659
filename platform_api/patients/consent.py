"""Patients area, consent: a patient's permission to share their record ⇄ FHIR Consent,
which the access policy reads (``platform_api.policy``: the *consent* relation); a
clinic's request for that permission ⇄ a pending request document addressed to the
patient.

Mapping (/api field → FHIR Consent):
    patient_id       → patient (Patient/<id>) and performer[0] (the patient grants)
    status           → status: active (granted, or a request accepted), inactive
                       (revoked); moves by ``CONSENT_STATUS`` (a Consent a FHIR client
                       wrote as proposed is approved or declined like a request)
    grantee_type,    → provision.actor[0]: role v3-ParticipationType IRCP (information
      grantee_id       recipient), reference Organization/<id> or Practitioner/<id>
    purpose          → provision.purpose[0] (v3-ActReason: TREAT treatment, ETREAT
                       emergency treatment, HPAYMT payment, HOPERAT operations, HRESCH
                       research)
    expires_at       → provision.period.end (the policy ignores a consent past its end);
                       granted_at → provision.period.start and dateTime
    note             → policyRule.text (an R4 Consent has no note)
    requested_by     → extension urn:healthplatform:extension:consent-requested-by
                       (valueReference to the requesting user; an accepted request)
    (fixed)          → scope consentscope#patient-privacy, category LOINC 59284-0 Patient
                       Consent, policyRule v3-ActCode#OPTIN, provision.type permit

**Asking for consent.** A clinic asking a patient for access does not know the patient
yet: it may not see their record, and the answer must not tell it more than it knew
(who the patient is, whether the id exists, which clinic holds them). So:

1. ``POST /api/consent/request`` (``consent.request``: a member of the asking
   organization whose role may create a Consent, ``ORG:ADMIN``, ``ORG:DOCTOR``,
   ``ORG:RECEPTIONIST``) stores a **request document** (collection
   ``consent_requests``: the patient id as given, the organization, who asked, purpose,
   note, expiry; status ``proposed``), nothing in any FHIR record. It answers 201 with
   the request as a consent ``proposed`` naming only what the asker gave or may see (the
   patient id it sent, its own organization; never the patient's name), the same for a
   patient id that exists and one that does not, so the route cannot be used to probe;
   a second request of the organization for the same patient id while one is open is
   409 ``CONSENT_EXISTS`` (as is a request when a consent the asker can see is active).
2. The patient finds it among their consents (``GET /api/consent``, status ``proposed``;
   ``consent.follow-request``: the patient it is addressed to, members of the asking
   organization, platform administrators) and decides (``consent.decide``: the patient,
   or a platform administrator):
   ``POST /api/consent/:id/approve`` writes the active Consent **as the patient** (their
   own write in their own record, with the request's id, purpose, note, expiry and who
   asked) and removes the request, in one unit of work; ``POST /api/consent/:id/revoke``
   declines it (the request stays, ``rejected``, so the clinic learns the answer).
3. Only then can the clinic see the patient (their name included), as any consent allows.

Other routes: ``POST /api/consent/grant``: a patient grants access to their own record
(their profile, the Patient with their user identifier) to an organization or a
practitioner, active at once; ``POST /api/consent/:id/revoke`` of an active consent ends it
(inactive, its period ends now); ``GET /api/consent`` lists the caller's consents and
requests (as a patient: theirs; as a clinician: those naming their organizations or
practitioner records, and their organizations' requests; ``patient_id`` for a patient's
the caller may see), requests first; ``GET /api/consent/:id`` one of them.

A Consent written in this process drops every cached access subject, so a revocation (or
an acceptance) takes effect from the next request; other processes follow within the
policy's cache time (5 s). Events: ``platform.consent.requested``, ``.granted`` (a grant
or an acceptance), ``.revoked`` (a revocation or a declined request) (``consent_id``,
``patient_id``, ``grantee``, ``status``, ``by``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any, Literal

import orjson
from fastapi import APIRouter, Depends, Query
from pydantic import BaseModel, Field

from fhir_server.clock import now_instant
from fhir_server.ids import new_id
from fhir_server.search.plan import MAX_OFFSET
from platform_api.envelope import (
    ApiError,
    Envelope,
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
    Facade,
    ItemContext,
    StatusTable,
    api_context,
    conflict_responses,
    require_patient,
    staged_body,
    until_stable,
)
from platform_api.patients.shared import (
    JSON,
    LOINC,
    NO_PATIENT,
    ROLE_HELP,
    USER_SYSTEM,
    Role,
    concept,
    fhir_datetime,
    local_id,
    patient_reference,
    role_of,
    source_service,
    user_of,
)

PARTICIPATION = "http://terminology.hl7.org/CodeSystem/v3-ParticipationType"
ACT_REASON = "http://terminology.hl7.org/CodeSystem/v3-ActReason"
REQUESTED_BY = "urn:healthplatform:extension:consent-requested-by"
# Requests waiting for (or declined by) the patient, and the key that keeps one open
# request per organization and patient id (the store refuses a second key document).
REQUESTS, OPEN_REQUESTS = "consent_requests", "consent_request_keys"
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
ID = r"^[A-Za-z0-9\-.]{1,64}$"
EXISTS = ("CONSENT_EXISTS", "A consent for this grantee is already active or waiting for "
          "the patient's approval")


class GrantRequest(BaseModel):
    grantee_type: Literal["organization", "practitioner"] = Field(examples=["organization"])
    grantee_id: str = Field(min_length=1, max_length=64)
    purpose: Purpose = "treatment"
    expires_at: datetime | None = None
    note: str | None = Field(default=None, max_length=1000)


class ConsentRequest(BaseModel):
    patient_id: str = Field(min_length=1, max_length=64, pattern=ID)
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


# -- mapping ------------------------------------------------------------------------------------
def consent_resource(patient: JSON, grantee: JSON, status: str, purpose: str,
                     expires_at: datetime | str | None, note: str | None) -> JSON:
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


def request_view(request: JSON) -> JSON:
    """A pending (or declined) request, as a consent: what the asker gave, its own
    organization; never the patient's name (see the module docstring)."""
    return ConsentView(
        id=request["id"], patient_id=request["patient_id"], status=request["status"],
        grantee_type="organization", grantee_id=request["organization_id"],
        grantee_name=request.get("organization_name"), purpose=request["purpose"],
        note=request.get("note"), requested_by=request["requested_by"],
        expires_at=request.get("expires_at"),
        updated_at=request.get("decided_at") or request["requested_at"],
    ).model_dump()


def _open_key(organization_id: str, patient_id: str) -> str:
    return f"{organization_id}|{patient_id}"


async def _grantee(ctx: ApiContext, kind: str, grantee_id: str) -> JSON:
    grantee = await ctx.fhir.find_json(GRANTEE_TYPES[kind], grantee_id)  # the directory
    if grantee is None:
        raise ApiError(422, "VALIDATION_ERROR", f"grantee_id: no {kind} {grantee_id!r}",
                       field="grantee_id")
    return grantee


def _open_for_same_grantee(consent: JSON) -> list[tuple[str, str]]:
    return [("patient", consent["patient"]["reference"]),
            ("actor", grantee_of(consent)["reference"]), ("status", "proposed,active")]


def _event(consent: JSON, by: str) -> JSON:
    return {"consent_id": consent["id"], "patient_id": local_id(consent.get("patient"),
                                                                "Patient"),
            "grantee": grantee_of(consent).get("reference"), "status": consent["status"],
            "by": by}


def _request_event(request: JSON, by: str) -> JSON:
    return {"consent_id": request["id"], "patient_id": request["patient_id"],
            "grantee": f"Organization/{request['organization_id']}",
            "status": request["status"], "by": by}


# Loads and renders the Consents themselves (the routes below are written out: a consent
# id may also name a request document).
consents = Facade(resource="Consent", name="Consent", create=GrantRequest, view=ConsentView,
                  from_fhir=consent_view, statuses=CONSENT_STATUS, tags=["consent"])
router = APIRouter(tags=["consent"])


# -- the list: requests, then consents ----------------------------------------------------------
def _actors(ctx: ApiContext) -> list[str]:
    """A clinician's grantee references: their organizations and practitioner records."""
    organizations = ctx.organizations_for("organization.work-in") or frozenset()
    return [f"Organization/{o}" for o in sorted(organizations)] + [
        f"Practitioner/{p}" for p in sorted(ctx.access.subject.practitioner_ids)]


async def _selection(ctx: ApiContext, patient_id: str | None, asked: Role | None
                     ) -> tuple[list[JSON], list[tuple[str, str]]]:
    """What the caller's list holds: the request documents (one ``where`` each) and the
    Consent search criteria."""
    every = ctx.may("records.list-all")
    followed = ctx.organizations_for("consent.follow-request") or frozenset()
    own = ctx.access.subject.patient_id
    if patient_id is not None:
        await require_patient(ctx, patient_id)  # 404 unknown, 403 not the caller's to see
        criteria = [("patient", f"Patient/{patient_id}")]
        if every or patient_id == own:
            return [{"patient_id": patient_id}], criteria
        return [{"patient_id": patient_id, "organization_id": o}
                for o in sorted(followed)], criteria
    role = role_of(ctx, asked)
    if role is None:
        return [{}], []
    if role == "patient":  # (a user without a profile has no requests: whatever id a
        # clinic typed, "none" included, it is not theirs)
        return ([{"patient_id": own}] if own else []), [
            ("patient", f"Patient/{own or NO_PATIENT}")]
    return ([{"organization_id": o} for o in sorted(followed)],
            [("actor", ",".join(_actors(ctx)) or "Organization/none")])


async def _documents_page(ctx: ApiContext, wheres: list[JSON], offset: int, limit: int
                          ) -> tuple[list[JSON], int]:
    """``limit`` request documents from ``offset`` across the ``wheres`` (newest first in
    each), and their total."""
    store = ctx.services.store
    counts = [await store.count_documents(REQUESTS, w) for w in wheres]
    found: list[JSON] = []
    for where, count in zip(wheres, counts, strict=True):
        if offset >= count:
            offset -= count
            continue
        if len(found) >= limit:
            break
        found += await store.find_documents(REQUESTS, where, limit=limit - len(found),
                                            offset=offset, order_by="requested_at",
                                            descending=True)
        offset = 0
    return found, sum(counts)


async def _consents_page(ctx: ApiContext, criteria: list[tuple[str, str]], offset: int,
                         limit: int) -> tuple[list[JSON], int]:
    """One FHIR search of the caller's Consents: ``limit`` from ``offset``, the total."""
    plan = await ctx.fhir.parse(["Consent"], [*criteria, ("_sort", "-_lastUpdated")],
                                strict=True)
    # A page that the requests filled still asks for one Consent: for the total.
    plan.count, plan.offset, plan.total = max(limit, 1), offset, "accurate"
    result = await ctx.fhir.search_page(plan)
    found = [orjson.loads(s.body) for s in result.resources][:limit]
    return found, result.total or 0


@router.get("/api/consent", response_model=PageEnvelope[ConsentView],
            summary="Your consents and consent requests (role=patient: yours; clinician: "
                    "those naming your organizations, and their requests), or a patient's "
                    "(patient_id); requests first")
async def list_consents(
        patient_id: str | None = Query(None, max_length=64,
                                       description="A patient's consents (default: yours)"),
        status: ConsentStatus | None = None,
        role: Role | None = Query(None, description=ROLE_HELP),
        page: Pagination = Depends(pagination), ctx: ApiContext = Depends(api_context)
) -> Any:
    if page.offset + page.limit > MAX_OFFSET:
        raise ApiError(422, "VALIDATION_ERROR", f"page is too deep: at most {MAX_OFFSET} "
                       "items can be paged through; narrow the list", field="page")
    wheres, criteria = await _selection(ctx, patient_id, role)
    if status is not None:
        criteria.append(("status", status))
        # a request is proposed (waiting) or rejected (declined); never active or inactive
        wheres = [{**w, "status": status} for w in wheres] if status in (
            "proposed", "rejected") else []
    requests, waiting = await _documents_page(ctx, wheres, page.offset, page.limit)
    skip = max(page.offset - waiting, 0)
    found, total = await _consents_page(ctx, criteria, skip, page.limit - len(requests))
    items = [request_view(r) for r in requests] + await consents.render(ctx, found)
    return page.respond(items, waiting + total)


# -- one consent or request -----------------------------------------------------------------------
async def _request(ctx: ApiContext, request_id: str, action: str) -> JSON | None:
    """The request document ``request_id``, once the caller may do ``action`` with it
    (None: no such request; the id may name a Consent)."""
    request = await ctx.services.store.get_document(REQUESTS, request_id)
    if request is None:
        return None
    ctx.authorize(action, request["organization_id"], patient_id=request["patient_id"])
    return request


@router.get("/api/consent/{consent_id}", response_model=Envelope[ConsentView],
            summary="A consent, or a consent request")
async def get_consent(consent_id: str, ctx: ApiContext = Depends(api_context)) -> Any:
    request = await _request(ctx, consent_id, "consent.follow-request")
    if request is not None:
        return ok(request_view(request))
    return ok(consent_view(await consents.load(ctx, consent_id)))


async def write_consent(ctx: ApiContext, consent: JSON, topic: str, *,
                        consent_id: str | None = None,
                        alongside: Callable[[Any], None] | None = None) -> JSON:
    """Create ``consent`` as the caller unless one for the same patient and grantee is
    proposed or active (409 CONSENT_EXISTS), with ``topic`` (and what ``alongside(unit)``
    stages) in the same unit of work."""
    unit = ctx.fhir.unit()
    async with unit:
        staged = await unit.create(consent, resource_id=consent_id, expected_type="Consent",
                                   if_none_exist=_open_for_same_grantee(consent))
        if alongside is not None:
            alongside(unit)
        unit.after_writes(lambda staging: None if staged.existing else staging.emit(
            topic, _event(staged_body(staged), ctx.principal.user_id),
            source_service=source_service("consent")))
        await unit.commit()
    if staged.existing:
        raise conflict(*EXISTS)
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
    stored = await write_consent(ctx, consent, "platform.consent.granted")
    return created(consent_view(stored))


# -- asking ---------------------------------------------------------------------------------------
async def _asking_organization(ctx: ApiContext, wanted: str | None) -> JSON:
    """The organization a clinician asks for: one of theirs whose role may ask."""
    if wanted is None:
        able = sorted(ctx.organizations_for("consent.request") or ())
        if len(able) != 1:
            raise ApiError(422, "VALIDATION_ERROR", "organization_id: say which of your "
                           "organizations asks" if able else "organization_id: you are in "
                           "no organization that may ask for consent",
                           field="organization_id")
        wanted = able[0]
    ctx.authorize("consent.request", wanted)
    organization = await ctx.fhir.find_json("Organization", wanted)  # the directory
    if organization is None:
        raise not_found("Organization")
    return organization


@router.post("/api/consent/request", status_code=201, response_model=Envelope[ConsentView],
             summary="Ask a patient for access to their record for your organization (held "
                     "for the patient until they accept it)")
async def request_consent(body: ConsentRequest, ctx: ApiContext = Depends(api_context)
                          ) -> Any:
    organization = await _asking_organization(ctx, body.organization_id)
    org_id = organization["id"]
    # An active consent the asker can see (a patient it may not see shows none here).
    if await ctx.fhir.search("Consent", [
            ("patient", f"Patient/{body.patient_id}"), ("actor", f"Organization/{org_id}"),
            ("status", "active")]):
        raise conflict(*EXISTS)
    request = {
        "id": new_id(), "patient_id": body.patient_id, "organization_id": org_id,
        "organization_name": _name_of(organization), "status": "proposed",
        "purpose": body.purpose, "note": body.note,
        "expires_at": fhir_datetime(body.expires_at) if body.expires_at else None,
        "requested_by": ctx.principal.user_id, "requested_at": now_instant(),
    }
    await ctx.insert_once(
        REQUESTS, request, unique=(OPEN_REQUESTS, _open_key(org_id, body.patient_id)),
        event=("platform.consent.requested", _request_event(request, ctx.principal.user_id),
               source_service("consent")), refusal=EXISTS)
    return created(request_view(request))


# -- deciding -------------------------------------------------------------------------------------
async def _decide(ctx: ApiContext, consent_id: str,
                  on_request: Callable[[JSON], Awaitable[JSON]],
                  on_consent: Callable[[ItemContext[Any]], Awaitable[JSON]]) -> Any:
    request = await _request(ctx, consent_id, "consent.decide")
    if request is not None:
        return ok(await on_request(request))

    async def once() -> JSON:
        consent = await consents.load(ctx, consent_id)
        ctx.authorize("consent.decide",
                      patient_id=local_id(consent.get("patient"), "Patient") or "")
        return await on_consent(ItemContext(ctx.request, ctx.principal, ctx.services,
                                            ctx.access, ctx.fhir, None, consent, None))
    return ok(consent_view(await until_stable(once)))


def _closing(unit: Any, request: JSON) -> None:
    """Stage the end of an open request: its key goes (the clinic may ask again)."""
    if request["status"] == "proposed":
        unit.delete_document(OPEN_REQUESTS, _open_key(request["organization_id"],
                                                      request["patient_id"]))


def forget_request(unit: Any, request: JSON) -> None:
    """Stage the removal of a request (and its key while open): accepted, or erased with
    the patient's record."""
    _closing(unit, request)
    unit.delete_document(REQUESTS, request["id"])


async def _accept(ctx: ApiContext, request: JSON) -> JSON:
    """The patient's own write: the Consent the request asked for, in place of it."""
    CONSENT_STATUS.check(request["status"], "active")
    patient = await require_patient(ctx, request["patient_id"])
    organization = await ctx.fhir.find_json("Organization", request["organization_id"])
    if organization is None:
        raise not_found("Organization")
    consent = consent_resource(patient, organization, "active", request["purpose"],
                               request.get("expires_at"), request.get("note"))
    consent["extension"] = [{"url": REQUESTED_BY, "valueReference": {
        "identifier": {"system": USER_SYSTEM, "value": request["requested_by"]}}}]

    return consent_view(await write_consent(
        ctx, consent, "platform.consent.granted", consent_id=request["id"],
        alongside=lambda unit: forget_request(unit, request)))


async def _decline(ctx: ApiContext, request: JSON) -> JSON:
    CONSENT_STATUS.check(request["status"], "rejected")
    declined = {**request, "status": "rejected", "decided_at": now_instant()}
    unit = ctx.unit()
    async with unit:
        _closing(unit, request)
        unit.put_document(REQUESTS, request["id"], declined)
        unit.emit("platform.consent.revoked", _request_event(declined, ctx.principal.user_id),
                  source_service=source_service("consent"))
        await unit.commit()
    return request_view(declined)


async def _approve_consent(ctx: ItemContext[Any]) -> JSON:
    consent = CONSENT_STATUS.move(ctx.resource, "active")
    when = now_instant()
    provision = dict(consent.get("provision") or {})
    provision["period"] = {**provision.get("period", {}), "start": when}
    approved = {**consent, "dateTime": when, "provision": provision}
    return await ctx.save(approved, event="platform.consent.granted",
                          payload=_event(approved, ctx.principal.user_id))


async def _revoke_consent(ctx: ItemContext[Any]) -> JSON:
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


_TRANSITIONS = conflict_responses({
    "CONSENT_EXISTS": "a consent for this grantee is already active",
    "INVALID_TRANSITION": "the consent (or request) was already decided"})


@router.post("/api/consent/{consent_id}/approve", response_model=Envelope[ConsentView],
             responses=_TRANSITIONS,
             summary="Accept a consent request (the patient): the consent becomes active")
async def approve(consent_id: str, ctx: ApiContext = Depends(api_context)) -> Any:
    return await _decide(ctx, consent_id, lambda r: _accept(ctx, r), _approve_consent)


@router.post("/api/consent/{consent_id}/revoke", response_model=Envelope[ConsentView],
             responses=_TRANSITIONS,
             summary="Revoke a consent, or decline a request (the patient)")
async def revoke(consent_id: str, ctx: ApiContext = Depends(api_context)) -> Any:
    return await _decide(ctx, consent_id, lambda r: _decline(ctx, r), _revoke_consent)


# API keys reach these as Consent data (``Consent:read`` / ``:write``, which
# ``consent:read`` also names), as they reach the facade kit's routes.
for _endpoint in (list_consents, get_consent, approve, revoke):
    _endpoint.fhir_type = "Consent"  # type: ignore[attr-defined]


__all__ = ["CONSENT_STATUS", "OPEN_REQUESTS", "REQUESTS", "ConsentView", "consent_view",
           "consents", "forget_request", "request_view", "router"]
