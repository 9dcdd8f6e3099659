"""Claims of the revenue cycle: FHIR **Claim** (``use`` claim), from draft to paid, sent to
the payers' APIs (:mod:`.payers`) with their answers kept as **ClaimResponse**,
pre-authorizations (a Claim ``use`` preauthorization and its ClaimResponse) and eligibility
checks (**CoverageEligibilityRequest** → **CoverageEligibilityResponse**).

The mapping is the one of the organizations' billing (:mod:`platform_api.organizations.
billing`: a claim made there is a submitted claim here, and one made here is listed there):

    organization_id → provider (Organization/<id>) and the owner label
    patient_id → patient; insurer, policy_number → insurer (display) and
                 insurance[0].coverage: the patient's Coverage (found or recorded)
    type → type (claim-type); currency → every Money; diagnoses (ICD-10) → diagnosis[]
    items[] → item[] (productOrService, quantity, unitPrice, net = quantity x unit
              price, servicedDate); total → total (the sum, computed here)
    service_date → billablePeriod (start = end) and each item's servicedDate
    status → the stage below: Claim.status draft / active / cancelled, and the stage of
             an active claim as the tag ``urn:healthplatform:claim-stage``
    approved, paid, decision, disposition ← the latest ClaimResponse (request = the claim)

Status table: draft → submitted | cancelled; submitted → adjudicated | rejected |
cancelled; adjudicated → partially-paid | paid; partially-paid → paid; rejected, paid
and cancelled are final. Only a draft is edited (409 ``CLAIM_NOT_EDITABLE``); ``PUT``
with ``status: cancelled`` cancels. Submitting sends the claim to its payer: the claim
becomes submitted, then, from the payer's ClaimResponse, adjudicated (something approved),
rejected (nothing approved) and, with the payment the answer carries, partially paid
(less than billed) or paid. A payer that does not answer (504 ``PAYER_TIMEOUT``) or fails
(502) leaves the claim a draft: nothing was recorded, it can be sent again.

Who: the organization's financial roles (``ORG:ADMIN``, ``ORG:BILLING``) create, edit and
send; ``ORG:DOCTOR`` and ``ORG:RECEPTIONIST`` read; a patient reads their own claims.
Events: ``platform.rcm.claim_created``, ``claim_submitted``, ``claim_adjudicated``,
``claim_cancelled``, ``preauth_decided``, ``eligibility_checked``.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import date
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends
from pydantic import BaseModel, Field, ValidationError

from fhir_server.clock import now_instant
from fhir_server.ownership import OWNER_SYSTEM, owner_labels
from platform_api.envelope import (
    ApiError,
    Envelope,
    ErrorEnvelope,
    conflict,
    created,
    ok,
)
from platform_api.facade import (
    ApiContext,
    Facade,
    ItemContext,
    SearchParam,
    StatusTable,
    api_context,
    conflict_responses,
    require_organization,
    require_patient,
    staged_body,
)
from platform_api.fhir_values import amount_text, coding, decimal_of, local_id
from platform_api.organizations.billing import (
    CLAIM_STAGE,
    ClaimCreate,
    ClaimItem,
    ClaimType,
    Currency,
    LineItemView,
    claim_to_fhir,
    claim_view,
    coverage_for,
    insurer_key,
)
from platform_api.rcm.payers import (
    PayerClient,
    checked,
    decision_of,
    paid_of,
    payer_config,
    total_of,
)

JSON = dict[str, Any]
TOPIC = "platform.rcm."
SOURCE = "rcm"
CLAIM_STATUS = StatusTable.of(
    draft=("submitted", "cancelled"),
    submitted=("adjudicated", "rejected", "cancelled"),
    adjudicated=("partially-paid", "paid"),
    partially_paid=("paid",),
    rejected=(), paid=(), cancelled=(),
)
Stage = Literal["draft", "submitted", "adjudicated", "rejected", "partially-paid", "paid",
                "cancelled"]
FHIR_STATUS = {"draft": "draft", "cancelled": "cancelled"}  # every other stage: active
NOT_EDITABLE = {"CLAIM_NOT_EDITABLE": "the claim is no longer a draft"}
# How the routes that call a payer document its failures (OpenAPI).
PAYER_FAILURES: dict[int | str, dict[str, Any]] = {
    502: {"model": ErrorEnvelope, "description": "PAYER_UNAVAILABLE (the payer could not "
          "be reached or failed), PAYER_REFUSED (it refused, or answered an invalid "
          "resource): nothing was recorded"},
    504: {"model": ErrorEnvelope, "description": "PAYER_TIMEOUT: the payer did not answer "
          "in time; nothing was recorded, send again"}}


# -- models ---------------------------------------------------------------------------------------
class RcmClaimCreate(ClaimCreate):
    organization_id: str = Field(min_length=1, max_length=64,
                                 description="The provider: an organization you bill for")
    service_date: date = Field(examples=["2026-11-20"], description="When the services "
                               "were given")


Diagnosis = Annotated[str, Field(pattern=r"^[A-Z][0-9][0-9A-Z](\.[0-9A-Z]{1,4})?$")]


class RcmClaimUpdate(BaseModel):
    insurer: str | None = Field(default=None, min_length=1, max_length=200)
    policy_number: str | None = Field(default=None, min_length=1, max_length=64)
    type: ClaimType | None = None
    currency: Currency | None = None
    diagnoses: list[Diagnosis] | None = Field(default=None, max_length=25)
    items: list[ClaimItem] | None = Field(default=None, min_length=1, max_length=200)
    service_date: date | None = None
    status: Literal["cancelled"] | None = Field(default=None, description="cancelled: "
                                                "withdraw the claim (draft or submitted)")


class RcmClaimView(BaseModel):
    id: str
    number: str | None
    organization_id: str | None
    patient_id: str | None
    status: str = Field(description="draft | submitted | adjudicated | rejected | "
                        "partially-paid | paid | cancelled")
    type: str | None
    insurer: str | None
    coverage_id: str | None
    currency: str | None
    diagnoses: list[str]
    service_date: str | None
    items: list[LineItemView]
    total: str
    approved: str | None = Field(default=None, description="What the payer approved")
    paid: str | None = Field(default=None, description="What the payer paid with its "
                             "decision")
    decision: str | None = Field(default=None, description="approved | partial | "
                                 "rejected | pending")
    disposition: str | None = None
    claim_response_id: str | None = None
    pre_auth_ref: str | None = None
    created_at: str | None


class RcmClaimQuery(BaseModel):
    patient_id: Annotated[str | None, SearchParam("patient", "Patient/{}")] = Field(
        None, max_length=64)
    organization_id: Annotated[str | None, SearchParam("_security", OWNER_SYSTEM + "|{}")] = \
        Field(None, max_length=64)
    status: Stage | None = None


class EligibilityItem(BaseModel):
    code: str | None
    description: str | None
    allowed: str | None = Field(description="The benefit the payer allows for it")


class EligibilityView(BaseModel):
    id: str = Field(description="The CoverageEligibilityResponse")
    request_id: str
    claim_id: str
    coverage_id: str | None
    insurer: str | None
    eligible: bool
    disposition: str | None
    items: list[EligibilityItem]
    checked_at: str | None


class PreauthView(BaseModel):
    id: str = Field(description="The pre-authorization (a Claim, use preauthorization)")
    claim_id: str
    claim_response_id: str
    decision: str
    requested: str
    approved: str
    currency: str | None
    pre_auth_ref: str | None
    disposition: str | None


# -- mapping --------------------------------------------------------------------------------------
def stage_of(claim: JSON) -> str:
    """The claim's stage: its tag, or what its FHIR status says (a claim written elsewhere)."""
    for tag in (claim.get("meta") or {}).get("tag") or []:
        if isinstance(tag, dict) and tag.get("system") == CLAIM_STAGE and tag.get("code"):
            return str(tag["code"])
    return {"draft": "draft", "cancelled": "cancelled",
            "entered-in-error": "cancelled"}.get(claim.get("status", ""), "submitted")


def with_stage(claim: JSON, stage: str) -> JSON:
    meta = dict(claim.get("meta") or {})
    tags = [t for t in meta.get("tag") or [] if not (isinstance(t, dict)
                                                    and t.get("system") == CLAIM_STAGE)]
    meta["tag"] = [*tags, {"system": CLAIM_STAGE, "code": stage}]
    return {**claim, "meta": meta, "status": FHIR_STATUS.get(stage, "active")}


def move(claim: JSON, target: str) -> JSON:
    CLAIM_STATUS.check(stage_of(claim), target)
    return with_stage(claim, target)


def rcm_claim_to_fhir(body: RcmClaimCreate, coverage_id: str) -> JSON:
    claim = claim_to_fhir(body, body.organization_id, coverage_id)
    day = body.service_date.isoformat()
    claim["billablePeriod"] = {"start": day, "end": day}
    for item in claim["item"]:
        item["servicedDate"] = day
    return with_stage(claim, "draft")


def claim_service_date(claim: JSON) -> str | None:
    return (claim.get("billablePeriod") or {}).get("start") or next(
        (i.get("servicedDate") for i in claim.get("item", []) if i.get("servicedDate")), None)


def rcm_claim_view(claim: JSON, response: JSON | None = None) -> JSON:
    base = claim_view(claim)
    base.pop("submitted_at", None)
    owners = sorted(owner_labels(claim))
    view: JSON = {**base, "status": stage_of(claim),
                  "organization_id": local_id(claim.get("provider"), "Organization")
                  or (owners[0] if owners else None),
                  "service_date": claim_service_date(claim),
                  "created_at": claim.get("created"),
                  "pre_auth_ref": next((r for i in claim.get("insurance", [])
                                        for r in i.get("preAuthRef") or []), None)}
    if response is not None:
        view.update(approved=amount_text(total_of(response, "benefit")),
                    paid=amount_text(paid_of(response)), decision=decision_of(response),
                    disposition=response.get("disposition"),
                    claim_response_id=response.get("id"))
    return RcmClaimView.model_validate(view).model_dump()


async def responses_of(ctx: ApiContext, claim_ids: list[str]) -> dict[str, JSON]:
    """The latest ClaimResponse of each claim (one search)."""
    if not claim_ids:
        return {}
    found = await ctx.fhir.search("ClaimResponse", [
        ("request", ",".join(f"Claim/{i}" for i in claim_ids)), ("_sort", "created")])
    latest: dict[str, JSON] = {}
    for response in found:
        claim_id = local_id(response.get("request"), "Claim")
        if claim_id is not None:
            latest[claim_id] = response
    return latest


async def claim_views(ctx: ApiContext, claims: list[JSON]) -> list[JSON]:
    responses = await responses_of(ctx, [c["id"] for c in claims])
    return [rcm_claim_view(c, responses.get(c["id"])) for c in claims]


def _stage_criteria(ctx: ApiContext, query: Any) -> list[tuple[str, str]]:
    stage = getattr(query, "status", None)
    if stage is None:
        return []
    if stage in FHIR_STATUS:
        return [("status", FHIR_STATUS[stage])]
    return [("_tag", f"{CLAIM_STAGE}|{stage}")]



claims = Facade(
    resource="Claim", name="Claim", create=RcmClaimCreate, update=RcmClaimUpdate,
    view=RcmClaimView, query=RcmClaimQuery, from_fhir=rcm_claim_view,
    views=claim_views, fixed=(("use", "claim"),), statuses=CLAIM_STATUS, sort="-created",
    list_criteria=_stage_criteria, tags=["rcm"],
    summaries={"list": "List the claims you may see (patient, organization, status)",
               "get": "A claim with the payer's decision"},
)
router = APIRouter(tags=["rcm"])
PREFIX = "/api/rcm/claims"


# -- create and edit ------------------------------------------------------------------------------
async def _coverage(ctx: ApiContext, body: ClaimCreate, org_id: str) -> str:
    """The patient's Coverage for the insurer's policy, found or recorded (as billing)."""
    coverage = coverage_for(body)
    coverage["meta"] = {"security": [{"system": OWNER_SYSTEM, "code": org_id}]}
    identifier = coverage["identifier"][0]
    stored, _created = await ctx.fhir.create(coverage, expected_type="Coverage", if_none_exist=[
        ("identifier", f"{identifier['system']}|{identifier['value']}"),
        ("beneficiary", f"Patient/{body.patient_id}")])
    return stored.id


def _event(claim: JSON, **extra: Any) -> JSON:
    return {"claim_id": claim["id"], "organization_id": local_id(claim.get("provider"),
                                                                 "Organization"),
            "patient_id": local_id(claim.get("patient"), "Patient"),
            "insurer": (claim.get("insurer") or {}).get("display"),
            "status": stage_of(claim),
            "total": amount_text(decimal_of((claim.get("total") or {}).get("value"))),
            "currency": (claim.get("total") or {}).get("currency"), **extra}


@router.post(PREFIX, status_code=201, response_model=Envelope[RcmClaimView],
             summary="Draft a claim (items priced, total computed; the patient's coverage "
                     "found or recorded)")
async def create_claim(body: RcmClaimCreate, ctx: ApiContext = Depends(api_context)) -> Any:
    await require_organization(ctx, body.organization_id)
    await require_patient(ctx, body.patient_id)
    coverage_id = await _coverage(ctx, body, body.organization_id)
    claim = rcm_claim_to_fhir(body, coverage_id)
    claim["meta"]["security"] = [{"system": OWNER_SYSTEM, "code": body.organization_id}]
    unit = ctx.unit()
    async with unit:
        staged = await unit.create(claim, expected_type="Claim")
        unit.after_writes(lambda staging: staging.emit(
            TOPIC + "claim_created", _event(staged_body(staged)), source_service=SOURCE))
        await unit.commit()
    return created(rcm_claim_view(staged_body(staged)))


claims.mount(router, PREFIX, ops=("list",))


@claims.route("PUT", "/{resource_id}", body=RcmClaimUpdate, conflicts={
    **NOT_EDITABLE, "INVALID_TRANSITION": "cancelling a claim that is past submission"},
    summary="Edit a draft claim (total recomputed), or cancel it with status: cancelled")
async def update_claim(ctx: ItemContext[RcmClaimUpdate]) -> JSON:
    assert ctx.body is not None
    changes = ctx.body.model_dump(exclude_unset=True)
    claim = ctx.resource
    if changes.pop("status", None) == "cancelled":
        cancelled = move(claim, "cancelled")
        return await ctx.save(cancelled, event=TOPIC + "claim_cancelled",
                              payload=_event(cancelled))
    if stage_of(claim) != "draft":
        raise conflict("CLAIM_NOT_EDITABLE", f"The claim is {stage_of(claim)}: only a "
                       "draft is edited")
    current = _as_create(claim, await coverage_of(ctx, claim))
    try:
        body = RcmClaimCreate.model_validate({**current, **{k: v for k, v in changes.items()
                                                            if v is not None}})
    except ValidationError as error:  # the stored draft lacks something the edit kept
        place = ".".join(str(p) for p in error.errors()[0]["loc"])
        raise ApiError(422, "VALIDATION_ERROR", f"{place}: {error.errors()[0]['msg']}",
                       field=place) from None
    coverage_id = local_id((claim.get("insurance") or [{}])[0].get("coverage"), "Coverage")
    if "insurer" in changes or "policy_number" in changes or coverage_id is None:
        coverage_id = await _coverage(ctx, body, body.organization_id)
    rebuilt = rcm_claim_to_fhir(body, coverage_id)
    kept: JSON = {k: claim[k] for k in ("id", "meta", "identifier", "created") if k in claim}
    return await ctx.save({**rebuilt, **kept})


def _as_create(claim: JSON, coverage: JSON) -> JSON:
    """A stored draft as the create payload it came from (what a partial edit changes)."""
    view = claim_view(claim)
    return {"organization_id": local_id(claim.get("provider"), "Organization"),
            "patient_id": view["patient_id"], "insurer": view["insurer"] or "",
            "policy_number": coverage.get("subscriberId") or "",
            "type": view["type"] or "institutional", "currency": view["currency"],
            "diagnoses": view["diagnoses"], "service_date": claim_service_date(claim),
            "items": [{"description": i["description"] or "", "code": i["code"],
                       "system": coding(c.get("productOrService")).get("system"),
                       "quantity": i["quantity"], "unit_price": i["unit_price"]}
                      for i, c in zip(view["items"], claim.get("item", []), strict=True)]}


# -- the payer ------------------------------------------------------------------------------------
def payer_of(ctx: ApiContext, claim: JSON) -> PayerClient:
    name = (claim.get("insurer") or {}).get("display") or ""
    key = insurer_key(name)
    return PayerClient(key, payer_config(ctx.services.settings, key))


async def coverage_of(ctx: ApiContext, claim: JSON) -> JSON:
    coverage_id = local_id((claim.get("insurance") or [{}])[0].get("coverage"), "Coverage")
    coverage = await ctx.fhir.find_json("Coverage", coverage_id) if coverage_id else None
    if coverage is None:
        raise ApiError(422, "COVERAGE_REQUIRED", "The claim names no coverage",
                       field="policy_number")
    return coverage


def _for_payer(claim: JSON) -> JSON:
    """What is sent: the claim without our bookkeeping (owner labels, stage tag)."""
    return {k: v for k, v in claim.items() if k != "meta"}


# What a payer's answer holds that only means something on its own server (its ids, and
# references to its own resources); the references that matter are set to ours.
PAYER_LOCAL = ("id", "meta", "text", "contained", "insurance", "communicationRequest",
               "requestor", "insurer", "request", "patient")


def _response_for(answer: JSON, claim: JSON) -> JSON:
    """The payer's ClaimResponse as we keep it: about our claim, owned as the claim is."""
    response = {k: v for k, v in answer.items() if k not in PAYER_LOCAL}
    response.update(request={"reference": f"Claim/{claim['id']}"}, patient=claim["patient"],
                    insurer=claim["insurer"], requestor=claim.get("provider"),
                    meta={"security": [{"system": OWNER_SYSTEM, "code": o}
                                       for o in sorted(owner_labels(claim))]})
    return response


def adjudicated(claim: JSON, response: JSON) -> JSON:
    """The claim moved through the table by the payer's answer (see the docstring)."""
    decision = decision_of(response)
    if decision == "pending":
        return claim
    if decision == "rejected":
        return move(claim, "rejected")
    moved = move(claim, "adjudicated")
    paid = paid_of(response)
    if paid > 0:
        billed = decimal_of((claim.get("total") or {}).get("value"))
        moved = move(moved, "paid" if paid >= billed else "partially-paid")
    return moved


@dataclass
class PayerCall:
    """A claim about to go to its payer: loaded for the caller, in a stage that allows the
    call, the caller allowed to change it; with its coverage and its payer's client."""

    claim: JSON
    coverage: JSON
    payer: PayerClient


async def payer_call(ctx: ApiContext, claim_id: str, allowed: Callable[[str], None]
                     ) -> PayerCall:
    """Everything is checked before the payer is called (``allowed(stage)`` refuses)."""
    claim = await claims.load(ctx, claim_id)
    allowed(stage_of(claim))
    ctx.authorize("claim.send", owner_labels(claim))
    return PayerCall(claim, await coverage_of(ctx, claim), payer_of(ctx, claim))


def payer_route(action: str, view: type[BaseModel], *, summary: str,
                conflicts: Mapping[str, str], status_code: int = 201
                ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """``POST /api/rcm/claims/{claim_id}/<action>``, documented with the payer's failures.
    Not a ``claims.route``: that one runs a load-change-save again when the claim changed
    meanwhile, which here would call the payer a second time."""
    return router.post(PREFIX + "/{claim_id}/" + action, status_code=status_code,
                       response_model=Envelope[view],  # type: ignore[valid-type]
                       responses={**conflict_responses(conflicts), **PAYER_FAILURES},
                       summary=summary)


def _draft_only(stage: str) -> None:
    if stage != "draft":
        raise conflict("CLAIM_NOT_EDITABLE", "Pre-authorization is asked before the claim "
                       "is sent")


def _not_cancelled(stage: str) -> None:
    if stage == "cancelled":
        raise conflict("CLAIM_NOT_EDITABLE", "The claim was cancelled")


@payer_route("submit", RcmClaimView, status_code=200,
             conflicts={"INVALID_TRANSITION": "the claim is not a draft"},
             summary="Send a draft claim to its payer; its decision (and payment) is "
                     "recorded")
async def submit_claim(claim_id: str, ctx: ApiContext = Depends(api_context)) -> Any:
    call = await payer_call(ctx, claim_id, lambda stage: CLAIM_STATUS.check(stage,
                                                                             "submitted"))
    claim, payer = call.claim, call.payer
    answer = await payer.submit(_for_payer(claim), call.coverage)
    response = checked(_response_for(answer, claim), "ClaimResponse", payer.config.name)
    submitted = move(claim, "submitted")
    final = adjudicated(submitted, response)
    unit = ctx.unit()
    async with unit:
        staged = await unit.create(response, expected_type="ClaimResponse")
        saved = await unit.update(final, if_match=int(claim["meta"]["versionId"]))
        unit.emit(TOPIC + "claim_submitted", _event(submitted), source_service=SOURCE)
        if final is not submitted:
            unit.emit(TOPIC + "claim_adjudicated", _event(final, **{
                "claim_response_id": staged.id, "decision": decision_of(response),
                "approved": amount_text(total_of(response, "benefit")),
                "paid": amount_text(paid_of(response))}), source_service=SOURCE)
        await unit.commit()
    return ok(rcm_claim_view(staged_body(saved), staged_body(staged)))


# -- pre-authorization and eligibility ------------------------------------------------------------
@payer_route("preauth", PreauthView, conflicts={"CLAIM_NOT_EDITABLE": "the claim was sent"},
             summary="Ask the payer to pre-authorize a draft claim's services")
async def preauthorize(claim_id: str, ctx: ApiContext = Depends(api_context)) -> Any:
    call = await payer_call(ctx, claim_id, _draft_only)
    claim, payer = call.claim, call.payer
    preauth = {k: v for k, v in claim.items() if k not in ("id", "meta")}
    preauth.update(use="preauthorization", status="active", created=now_instant(),
                   identifier=[{"system": (claim.get("identifier") or [{}])[0].get(
                       "system", "urn:healthplatform:preauth"),
                       "value": f"PA-{uuid.uuid4().hex[:10].upper()}"}],
                   related=[{"claim": {"reference": f"Claim/{claim['id']}"}}],
                   meta={"security": claim["meta"].get("security", [])})
    answer = await payer.submit(preauth, call.coverage)
    unit = ctx.unit()
    async with unit:
        staged_claim = await unit.create(preauth, expected_type="Claim")
        response = checked({**_response_for(answer, {**preauth, "id": staged_claim.id}),
                            "use": "preauthorization"}, "ClaimResponse", payer.config.name)
        staged = await unit.create(response, expected_type="ClaimResponse")
        decision = decision_of(response)
        reference = response.get("preAuthRef")
        if reference and decision in ("approved", "partial"):
            insurance = [dict(i) for i in claim.get("insurance", [])]
            insurance[0]["preAuthRef"] = [*insurance[0].get("preAuthRef", []), reference]
            await unit.update({**claim, "insurance": insurance},
                              if_match=int(claim["meta"]["versionId"]))
        view = PreauthView(
            id=staged_claim.id, claim_id=claim["id"], claim_response_id=staged.id,
            decision=decision, requested=amount_text(total_of(response, "submitted")),
            approved=amount_text(total_of(response, "benefit")),
            currency=(claim.get("total") or {}).get("currency"), pre_auth_ref=reference,
            disposition=response.get("disposition")).model_dump()
        unit.emit(TOPIC + "preauth_decided", {**view, "organization_id": local_id(
            claim.get("provider"), "Organization")}, source_service=SOURCE)
        await unit.commit()
    return created(view)


def eligibility_request(claim: JSON, coverage: JSON) -> JSON:
    return {
        "resourceType": "CoverageEligibilityRequest", "status": "active",
        "purpose": ["validation", "benefits"], "patient": claim["patient"],
        "servicedDate": claim_service_date(claim) or date.today().isoformat(),
        "created": now_instant(), "provider": claim.get("provider"),
        "insurer": claim["insurer"],
        "insurance": [{"focal": True, "coverage": {"reference": f"Coverage/{coverage['id']}"}}],
        "item": [{"productOrService": i.get("productOrService"),
                  "quantity": i.get("quantity"), "unitPrice": i.get("unitPrice")}
                 for i in claim.get("item", [])],
        "meta": {"security": claim["meta"].get("security", [])}}


def eligibility_view(response: JSON, request_id: str, claim_id: str) -> JSON:
    insurance = (response.get("insurance") or [{}])[0]
    items = []
    for item in insurance.get("item") or []:
        allowed = next((b.get("allowedMoney") for b in item.get("benefit") or []
                        if b.get("allowedMoney")), None)
        items.append({"code": coding(item.get("productOrService")).get("code"),
                      "description": (item.get("productOrService") or {}).get("text"),
                      "allowed": amount_text(decimal_of(allowed["value"])) if allowed
                      else None})
    return EligibilityView.model_validate({
        "id": response["id"], "request_id": request_id, "claim_id": claim_id,
        "coverage_id": local_id(insurance.get("coverage"), "Coverage"),
        "insurer": (response.get("insurer") or {}).get("display"),
        "eligible": bool(insurance.get("inforce")) and response.get("outcome") != "error",
        "disposition": response.get("disposition"), "items": items,
        "checked_at": response.get("created")}).model_dump()


@payer_route("eligibility", EligibilityView,
             conflicts={"CLAIM_NOT_EDITABLE": "the claim was cancelled"},
             summary="Ask the payer whether the claim's coverage is in force for its "
                     "services, and what it allows")
async def check_eligibility(claim_id: str, ctx: ApiContext = Depends(api_context)) -> Any:
    call = await payer_call(ctx, claim_id, _not_cancelled)
    claim, coverage, payer = call.claim, call.coverage, call.payer
    request = eligibility_request(claim, coverage)
    request_id = str(uuid.uuid4())
    answer = await payer.eligibility(
        {**{k: v for k, v in request.items() if k != "meta"}, "id": request_id}, coverage)
    unit = ctx.unit()
    async with unit:
        staged_request = await unit.create({**request, "id": request_id},
                                           resource_id=request_id,
                                           expected_type="CoverageEligibilityRequest")
        response = {k: v for k, v in answer.items() if k not in PAYER_LOCAL}
        response.update(request={"reference": f"CoverageEligibilityRequest/{request_id}"},
                        patient=claim["patient"], insurer=claim["insurer"],
                        meta=request["meta"], insurance=[
                            {**{k: v for k, v in i.items() if k != "coverage"},
                             "coverage": {"reference": f"Coverage/{coverage['id']}"}}
                            for i in answer.get("insurance") or []])
        checked(response, "CoverageEligibilityResponse", payer.config.name)
        staged = await unit.create(response, expected_type="CoverageEligibilityResponse")
        view = eligibility_view({**response, "id": staged.id}, staged_request.id, claim_id)
        unit.emit(TOPIC + "eligibility_checked", {**view, "organization_id": local_id(
            claim.get("provider"), "Organization")}, source_service=SOURCE)
        await unit.commit()
    return created(view)


# GET /api/rcm/claims/{id} on its own router: the app mounts it after the static paths
# (/api/rcm/claims/analytics/..., /fraud-flags, /reconciliation) it would otherwise shadow.
item_router = APIRouter(tags=["rcm"])
claims.mount(item_router, PREFIX, ops=("get",))

__all__ = ["CLAIM_STATUS", "RcmClaimView", "claims", "item_router", "rcm_claim_view",
           "responses_of", "router", "stage_of"]
