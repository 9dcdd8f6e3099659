"""The insurance marketplace: the plans insurers offer (FHIR **InsurancePlan**), enrolment
in one (a **Coverage** for the patient, once the plan's eligibility rules are met) and the
caller's policies (their Coverages).

Plan (InsurancePlan, status active; insurers publish them through /fhir):

    name → name; insurer → ownedBy (display, and its id); type → type[0]
    period → period; coverage_areas → coverageArea[].display; networks → network[].display
    benefits → coverage[].benefit[] (type text, limit[0].value)
    options → plan[] (type code, premium: generalCost[0].cost, the monthly premium)
    eligibility → extension urn:healthplatform:insurance-plan-eligibility
                  (``minAge``, ``maxAge``: valueUnsignedInt; ``country``: valueCode, one
                  each allowed country)

Enrolment (/api → Coverage): status active; beneficiary = subscriber = the patient;
relationship self; payor the plan's insurer; class plan (value the plan's id, name its
name); identifier ``urn:healthplatform:insurance-plan:<plan id>|<member number>`` and
subscriberId the member number; period from the start date to the plan's end;
costToBeneficiary the option's premium (type text "premium"). Rules, each a 422
``NOT_ELIGIBLE`` naming the rule: the plan is active and its period covers the start, the
option exists, the patient's age at the start is within ``minAge``-``maxAge``, their
address country is an allowed one; a second active enrolment in the same plan is 409
``ALREADY_ENROLLED``.

Who enrols: a patient themselves (their own Patient record: the policy's
``insurance.enroll-self``; the Coverage is then owned by the insurer organization, written
for them through a named elevation), or an organization's financial staff for a patient
they see (owned by that organization: the policy checks the write).
Policies: the caller's own Coverages, or with ``patient_id`` a patient's the caller sees.
Event: ``platform.rcm.coverage_enrolled``.
"""

from __future__ import annotations

import uuid
from datetime import date
from decimal import Decimal
from typing import Annotated, Any

from fastapi import APIRouter, Depends
from pydantic import BaseModel, Field

from fhir_server.ownership import with_owners
from platform_api.envelope import ApiError, Envelope, conflict, created
from platform_api.facade import (
    ApiContext,
    Facade,
    SearchParam,
    api_context,
    require_organization,
    require_patient,
    staged_body,
)
from platform_api.fhir_values import amount_text, coding, decimal_of, local_id, money
from platform_api.patients.shared import NO_PATIENT

JSON = dict[str, Any]
ELIGIBILITY = "urn:healthplatform:insurance-plan-eligibility"
COVERAGE_CLASS = "http://terminology.hl7.org/CodeSystem/coverage-class"
ENROLLED = "platform.rcm.coverage_enrolled"


# -- plans ----------------------------------------------------------------------------------------
class PlanOption(BaseModel):
    type: str | None
    premium: str | None
    currency: str | None


class Benefit(BaseModel):
    coverage: str | None
    benefit: str | None
    limit: str | None


class PlanEligibility(BaseModel):
    min_age: int | None = None
    max_age: int | None = None
    countries: list[str] = Field(default_factory=list)


class PlanView(BaseModel):
    id: str
    name: str | None
    insurer: str | None
    insurer_id: str | None
    type: str | None
    status: str
    period_start: str | None
    period_end: str | None
    coverage_areas: list[str]
    networks: list[str]
    benefits: list[Benefit]
    options: list[PlanOption]
    eligibility: PlanEligibility


class PlanQuery(BaseModel):
    type: Annotated[str | None, SearchParam("type")] = Field(None, max_length=64)
    name: Annotated[str | None, SearchParam("name")] = Field(None, max_length=200)
    insurer_id: Annotated[str | None, SearchParam("owned-by", "Organization/{}")] = Field(
        None, max_length=64)


def eligibility_of(plan: JSON) -> JSON:
    rules: JSON = {"countries": []}
    for extension in plan.get("extension") or []:
        if extension.get("url") != ELIGIBILITY:
            continue
        for rule in extension.get("extension") or []:
            if rule.get("url") == "minAge":
                rules["min_age"] = rule.get("valueUnsignedInt")
            elif rule.get("url") == "maxAge":
                rules["max_age"] = rule.get("valueUnsignedInt")
            elif rule.get("url") == "country" and rule.get("valueCode"):
                rules["countries"].append(rule["valueCode"])
    return rules


def _option(option: JSON) -> JSON:
    cost = ((option.get("generalCost") or [{}])[0]).get("cost") or {}
    return {"type": coding(option.get("type")).get("code") or (option.get("type") or {}).get(
        "text"), "premium": amount_text(decimal_of(cost["value"])) if "value" in cost
        else None, "currency": cost.get("currency")}


def plan_view(plan: JSON) -> JSON:
    owner = plan.get("ownedBy") or {}
    return PlanView.model_validate({
        "id": plan["id"], "name": plan.get("name"), "insurer": owner.get("display"),
        "insurer_id": local_id(owner, "Organization"),
        "type": coding((plan.get("type") or [{}])[0]).get("code"),
        "status": plan.get("status", ""),
        "period_start": (plan.get("period") or {}).get("start"),
        "period_end": (plan.get("period") or {}).get("end"),
        "coverage_areas": [a.get("display") for a in plan.get("coverageArea", [])
                           if a.get("display")],
        "networks": [n.get("display") for n in plan.get("network", []) if n.get("display")],
        "benefits": [{"coverage": (c.get("type") or {}).get("text") or coding(
            c.get("type")).get("code"), "benefit": (b.get("type") or {}).get("text")
            or coding(b.get("type")).get("code"),
            "limit": _limit((b.get("limit") or [{}])[0].get("value"))}
            for c in plan.get("coverage", []) for b in c.get("benefit", [])],
        "options": [_option(o) for o in plan.get("plan", [])],
        "eligibility": eligibility_of(plan)}).model_dump()


def _limit(quantity: JSON | None) -> str | None:
    if not quantity or quantity.get("value") is None:
        return None
    unit = quantity.get("unit") or quantity.get("code") or ""
    return f"{Decimal(str(quantity['value'])).normalize()} {unit}".strip()



plans = Facade(
    resource="InsurancePlan", name="Insurance plan", create=PlanQuery, view=PlanView,
    query=PlanQuery, from_fhir=plan_view, fixed=(("status", "active"),),
    sort="name", tags=["rcm"],
    summaries={"list": "The insurance plans on offer (benefits, premiums, networks, "
                       "eligibility)"},
)


# -- enrolment and policies -----------------------------------------------------------------------
class EnrollRequest(BaseModel):
    plan_id: str = Field(min_length=1, max_length=64)
    patient_id: str | None = Field(default=None, min_length=1, max_length=64,
                                   description="Default: your own patient record")
    organization_id: str | None = Field(default=None, min_length=1, max_length=64,
                                        description="Staff enrolling a patient: the "
                                        "organization doing it")
    option: str | None = Field(default=None, max_length=64, description="One of the "
                               "plan's options (default: its first)")
    start: date | None = Field(default=None, description="Default: today")


class PolicyView(BaseModel):
    id: str
    member_number: str | None
    patient_id: str | None
    plan_id: str | None
    plan_name: str | None
    insurer: str | None
    option: str | None
    status: str
    start: str | None
    end: str | None
    premium: str | None
    currency: str | None


class PolicyQuery(BaseModel):
    patient_id: str | None = Field(None, max_length=64, description="A patient you may "
                                   "see (default: you)")
    status: Annotated[str | None, SearchParam("status")] = Field(
        None, pattern="^(active|cancelled|draft|entered-in-error)$")


def policy_view(coverage: JSON) -> JSON:
    plan_class: JSON = next((c for c in coverage.get("class", [])
                       if coding(c.get("type")).get("code") == "plan"), {})
    cost = next((c.get("valueMoney") for c in coverage.get("costToBeneficiary", [])
                 if (c.get("type") or {}).get("text") == "premium"), None)
    return PolicyView.model_validate({
        "id": coverage["id"], "member_number": coverage.get("subscriberId"),
        "patient_id": local_id(coverage.get("beneficiary"), "Patient"),
        "plan_id": plan_class.get("value"), "plan_name": plan_class.get("name"),
        "insurer": ((coverage.get("payor") or [{}])[0]).get("display"),
        "option": coding(coverage.get("type")).get("code"),
        "status": coverage.get("status", ""),
        "start": (coverage.get("period") or {}).get("start"),
        "end": (coverage.get("period") or {}).get("end"),
        "premium": amount_text(decimal_of(cost["value"])) if cost else None,
        "currency": cost.get("currency") if cost else None}).model_dump()


async def _whose(ctx: ApiContext, query: Any) -> list[tuple[str, str]]:
    patient_id = getattr(query, "patient_id", None)
    if patient_id:
        await require_patient(ctx, patient_id)
        return [("beneficiary", f"Patient/{patient_id}")]
    return [("beneficiary", f"Patient/{ctx.access.subject.patient_id or NO_PATIENT}")]


policies = Facade(
    resource="Coverage", name="Policy", create=EnrollRequest, view=PolicyView,
    query=PolicyQuery, from_fhir=policy_view,
    fixed=(("class-type", f"{COVERAGE_CLASS}|plan"),), list_criteria=_whose,
    tags=["rcm"], summaries={"list": "Your insurance policies (or a patient's you may see)"},
)


def _refuse(rule: str, message: str, field: str = "plan_id") -> ApiError:
    return ApiError(422, "NOT_ELIGIBLE", f"{rule}: {message}", field=field)


def check_eligibility(plan: JSON, patient: JSON, start: date, option: str | None) -> JSON:
    """The plan option the patient may join on ``start`` (or a refusal naming the rule)."""
    if plan.get("status") != "active":
        raise _refuse("plan_active", "this plan is not on offer")
    period = plan.get("period") or {}
    if (period.get("start") and start.isoformat() < period["start"][:10]) or \
            (period.get("end") and start.isoformat() > period["end"][:10]):
        raise _refuse("plan_period", "the plan does not run on the start date", "start")
    options = plan.get("plan") or [{}]
    chosen = options[0] if option is None else next(
        (o for o in options if _option(o)["type"] == option), None)
    if chosen is None:
        raise _refuse("plan_option", f"the plan has no option {option!r}", "option")
    rules = eligibility_of(plan)
    born = patient.get("birthDate")
    if rules.get("min_age") is not None or rules.get("max_age") is not None:
        if not born:
            raise _refuse("age", "the patient's date of birth is needed", "patient_id")
        birth = date.fromisoformat(born[:10]) if len(born) >= 10 else date(int(born[:4]), 1, 1)
        age = start.year - birth.year - ((start.month, start.day) < (birth.month, birth.day))
        if not (rules.get("min_age") or 0) <= age <= (rules.get("max_age") or 200):
            raise _refuse("age", f"the plan takes members aged {rules.get('min_age') or 0}"
                          f"-{rules.get('max_age') or 'any'}; the patient is {age}",
                          "patient_id")
    countries = {c.upper() for c in rules["countries"]}
    if countries:
        lives = {a["country"].upper() for a in patient.get("address", [])
                 if isinstance(a, dict) and a.get("country")}
        if not lives:
            raise _refuse("country", "the patient's address country is needed (the plan "
                          f"covers residents of {', '.join(sorted(countries))})",
                          "patient_id")
        if lives.isdisjoint(countries):
            raise _refuse("country", f"the plan covers residents of {', '.join(sorted(countries))}",
                          "patient_id")
    return chosen


def coverage_to_fhir(plan: JSON, patient_id: str, option: JSON, start: date) -> JSON:
    member = f"M-{uuid.uuid4().hex[:10].upper()}"
    cost = ((option.get("generalCost") or [{}])[0]).get("cost")
    insurer = plan.get("ownedBy") or {"display": plan.get("name")}
    coverage: JSON = {
        "resourceType": "Coverage", "status": "active",
        "identifier": [{"system": f"urn:healthplatform:insurance-plan:{plan['id']}",
                        "value": member}],
        "subscriberId": member, "subscriber": {"reference": f"Patient/{patient_id}"},
        "beneficiary": {"reference": f"Patient/{patient_id}"},
        "relationship": {"coding": [{"system": "http://terminology.hl7.org/CodeSystem/"
                                     "subscriber-relationship", "code": "self"}]},
        "period": {"start": start.isoformat(),
                   **({"end": plan["period"]["end"][:10]}
                      if (plan.get("period") or {}).get("end") else {})},
        "payor": [insurer],
        "class": [{"type": {"coding": [{"system": COVERAGE_CLASS, "code": "plan"}]},
                   "value": plan["id"], "name": plan.get("name") or plan["id"]}]}
    if option.get("type"):
        coverage["type"] = option["type"]
    if cost:
        coverage["costToBeneficiary"] = [{"type": {"text": "premium"},
                                          "valueMoney": money(decimal_of(cost.get("value")),
                                                              cost.get("currency", ""))}]
    return coverage


router = APIRouter(tags=["rcm"])
plans.mount(router, "/api/rcm/marketplace/plans", ops=("list",))
policies.mount(router, "/api/rcm/marketplace/policies", ops=("list",))


@router.post("/api/rcm/marketplace/enroll", status_code=201,
             response_model=Envelope[PolicyView],
             responses={409: {"description": "ALREADY_ENROLLED: an active policy of the "
                                             "plan exists for the patient"}},
             summary="Enrol a patient (yourself by default) in an insurance plan, once its "
                     "eligibility rules are met")
async def enroll(body: EnrollRequest, ctx: ApiContext = Depends(api_context)) -> Any:
    own = ctx.access.subject.patient_id
    patient_id = body.patient_id or own
    if patient_id is None:
        raise ApiError(422, "VALIDATION_ERROR", "patient_id: you have no patient record; "
                       "name the patient", field="patient_id")
    patient = await require_patient(ctx, patient_id)
    plan = await ctx.fhir.find_json("InsurancePlan", body.plan_id)
    if plan is None:
        raise ApiError(404, "NOT_FOUND", "Insurance plan not found")
    option = check_eligibility(plan, patient, body.start or date.today(), body.option)
    coverage = coverage_to_fhir(plan, patient_id, option, body.start or date.today())
    if patient_id == own and body.organization_id is None:
        # The patient's own coverage is the insurer's record, which the patient may not
        # write: the platform writes it for them.
        ctx.authorize("insurance.enroll-self", patient_id=patient_id)
        insurer = local_id(plan.get("ownedBy"), "Organization")
        writer = ctx.elevate("insurance enrolment: store the patient's own Coverage, "
                             "owned by the insurer")
        owners = {insurer} if insurer else set()
    else:
        if body.organization_id is None:
            raise ApiError(422, "VALIDATION_ERROR", "organization_id: say which "
                           "organization enrols the patient", field="organization_id")
        await require_organization(ctx, body.organization_id)
        writer, owners = ctx.fhir, {body.organization_id}
    unit = writer.unit()
    async with unit:
        staged = await unit.create(with_owners(coverage, owners), expected_type="Coverage",
                                   if_none_exist=[("beneficiary", f"Patient/{patient_id}"),
                                                  ("class-value", plan["id"]),
                                                  ("status", "active")])
        unit.after_writes(lambda staging: None if staged.existing else staging.emit(
            ENROLLED, {**policy_view(staged_body(staged)), "enrolled_by":
                       ctx.principal.user_id}, source_service="rcm"))
        await unit.commit()
    if staged.existing:
        raise conflict("ALREADY_ENROLLED", "The patient already holds an active policy of "
                       "this plan")
    return created(policy_view(staged_body(staged)))
