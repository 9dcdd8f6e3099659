"""Patients area, prescriptions ⇄ FHIR MedicationRequest; what the checks found when it was
signed ⇄ DetectedIssue; the signature ⇄ Provenance.

Mapping (/api field → FHIR MedicationRequest):
    patient_id    → subject (Patient/<id>, the patient's name as display)
    medication    → medicationCodeableConcept.text, with ``rxcui`` as its RxNorm coding
    dosage        → dosageInstruction[0].doseAndRate[0].doseQuantity ("500 mg": value 500,
                    UCUM mg; "1 tablet": unit tablet) or doseRange ("1-2 tablets")
    frequency     → dosageInstruction[0].timing.code.text, with the v3-GTSAbbreviation code
                    and timing.repeat (frequency / period / periodUnit) of the known ones
                    (``FREQUENCIES``: OD, BD, TDS, QID, Q4H..., at night, weekly; "as needed"
                    is asNeededBoolean)
    duration      → timing.repeat.boundsDuration and dispenseRequest.expectedSupplyDuration
                    ("7 days": 7 d; days, weeks, months; "ongoing": no bound)
    instructions  → dosageInstruction[0].patientInstruction; dosageInstruction[0].text is
                    the whole sig ("500 mg three times daily for 7 days")
    refills       → dispenseRequest.numberOfRepeatsAllowed (default 0)
    quantity      → dispenseRequest.quantity (value and unit)
    encounter_id  → encounter; notes → note[0].text
    status        → status: draft on create; ``sign`` makes it active; moves follow
                    ``PRESCRIPTION_STATUS`` (cancel: from draft, active or on-hold; a
                    completed, stopped or cancelled prescription is final)
    (generated)   → identifier[type PLAC, system urn:healthplatform:prescription], the
                    prescription number a pharmacy quotes
    recorded_by   → recorder (who wrote the draft); signed_by → requester (who signed, the
                    prescriber responsible); signed_at → authoredOn (a prescription is
                    authored when signed)
    findings      → the DetectedIssues implicating it (code v3-ActCode DRG interaction,
                    ALGY allergy, DUPTHPY duplicate therapy; severity high / moderate /
                    low, ``detail`` the description, ``mitigation`` the prescriber's
                    override with its reason)

``POST /api/prescriptions/:id/sign`` (body ``{override_reason}``): only a doctor
(``ORG:DOCTOR``) of an organization owning the prescription signs (the access policy's
``prescription.sign``); the prescription checks of
:mod:`platform_api.prescription_checks` run first (drug-drug interactions, allergy
conflicts and duplicate therapy, registered by decision support at start-up); a high or
critical finding refuses
with 409 ``DRUG_INTERACTION`` (``error.details`` lists the findings) unless an
``override_reason`` is given. Signing writes, in one unit of work, the active
MedicationRequest, a DetectedIssue per finding and a Provenance carrying the signature
(type 1.2.840.10065.1.12.1.1 Author's Signature, agent type ``legal``).

Events: ``platform.prescription.created`` (``prescription_id``, ``patient_id``,
``medication``, ``rxcui``, ``status``, ``requested_by``), ``platform.prescription.signed``
(``prescription_id``, ``patient_id``, ``signed_by``, ``signed_at``, ``findings``,
``overridden``), ``platform.prescription.cancelled`` (the created payload).
"""

from __future__ import annotations

import re
import uuid
from typing import Annotated, Literal

from fastapi import APIRouter
from pydantic import BaseModel, Field

from fhir_server.clock import now_instant
from fhir_server.ids import new_id
from fhir_server.ownership import owner_labels
from platform_api.envelope import ApiError
from platform_api.facade import (
    ApiContext,
    Events,
    Facade,
    ItemContext,
    SearchParam,
    StatusTable,
    staged_body,
)
from platform_api.patients.shared import (
    JSON,
    RXNORM,
    MineQuery,
    code_in,
    coding,
    concept,
    concept_text,
    first_note,
    known_patient,
    local_id,
    mine,
    provenance,
    provenance_owners,
    quantity,
    source_service,
    subject_of,
    user_of,
    user_reference,
    versioned,
)
from platform_api.prescription_checks import refusing, run_checks

GTS = "http://terminology.hl7.org/CodeSystem/v3-GTSAbbreviation"
ACT_CODE = "http://terminology.hl7.org/CodeSystem/v3-ActCode"
# What kind of check found it → DetectedIssue.code (v3-ActCode DetectedIssue codes).
ISSUE_CODES = {"interaction": concept(ACT_CODE, "DRG", "Drug Interaction Alert"),
               "allergy": concept(ACT_CODE, "ALGY", "Allergy Alert"),
               "duplicate-therapy": concept(ACT_CODE, "DUPTHPY", "Duplicate Therapy Alert"),
               "check-failed": concept(ACT_CODE, "DRG", "Drug Interaction Alert")}
PLAC = concept("http://terminology.hl7.org/CodeSystem/v2-0203", "PLAC", "Placer Identifier")
NUMBER_SYSTEM = "urn:healthplatform:prescription"
SIGNATURE_TYPE = coding("urn:iso-astm:E1762-95:2013", "1.2.840.10065.1.12.1.1",
                        "Author's Signature")
PRESCRIPTION_STATUS = StatusTable.of(
    draft=("active", "cancelled", "entered-in-error"),
    active=("on-hold", "completed", "stopped", "cancelled"),
    on_hold=("active", "stopped", "cancelled"),
    completed=(),
    stopped=(),
    cancelled=(),
    entered_in_error=(),
)
PrescriptionStatus = Literal["draft", "active", "on-hold", "completed", "stopped", "cancelled",
                             "entered-in-error"]
# frequency (lower case) → (GTS code, times, period, period unit)
FREQUENCIES: dict[str, tuple[str, int, float, str]] = {
    **dict.fromkeys(("od", "qd", "once daily", "daily", "once a day"), ("QD", 1, 1, "d")),
    **dict.fromkeys(("bd", "bid", "twice daily", "twice a day"), ("BID", 2, 1, "d")),
    **dict.fromkeys(("tds", "tid", "three times daily", "three times a day"),
                    ("TID", 3, 1, "d")),
    **dict.fromkeys(("qid", "qds", "four times daily", "four times a day"),
                    ("QID", 4, 1, "d")),
    **{f"q{h}h": (f"Q{h}H", 1, h, "h") for h in (1, 2, 3, 4, 6, 8)},
    **{f"every {h} hours": (f"Q{h}H", 1, h, "h") for h in (2, 3, 4, 6, 8)},
    "q12h": ("BID", 1, 12, "h"), "every 12 hours": ("BID", 1, 12, "h"),
    **dict.fromkeys(("nocte", "at night", "at bedtime", "qhs"), ("BED", 1, 1, "d")),
    **dict.fromkeys(("mane", "in the morning"), ("AM", 1, 1, "d")),
    **dict.fromkeys(("weekly", "once weekly", "once a week"), ("WK", 1, 1, "wk")),
    "monthly": ("MO", 1, 1, "mo"),
}
AS_NEEDED = frozenset({"prn", "as needed", "when required"})
# Dose units written → UCUM codes (other units, e.g. tablet, stay as written).
UCUM_DOSE = {"mg": "mg", "g": "g", "mcg": "ug", "µg": "ug", "ug": "ug", "ml": "mL",
             "l": "L", "iu": "[iU]", "units": "[iU]", "mmol": "mmol"}
DURATION_UNITS = {"d": "d", "day": "d", "days": "d", "wk": "wk", "week": "wk", "weeks": "wk",
                  "mo": "mo", "month": "mo", "months": "mo"}
ONGOING = frozenset({"ongoing", "continuous", "long-term", "indefinite"})
DOSE = re.compile(r"^\s*(\d+(?:\.\d+)?)(?:\s*-\s*(\d+(?:\.\d+)?))?\s*([^\d\s][\w\[\]/%µ ]*?)\s*$")
DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]+)\s*$")


class PrescriptionCreate(BaseModel):
    patient_id: str = Field(min_length=1, max_length=64)
    medication: str = Field(min_length=1, max_length=200,
                            examples=["Amoxicillin 500 mg oral capsule"])
    dosage: str = Field(min_length=1, max_length=50, examples=["500 mg"])
    frequency: str = Field(min_length=1, max_length=50, examples=["three times daily"])
    duration: str = Field(min_length=1, max_length=50, examples=["7 days"])
    instructions: str = Field(min_length=1, max_length=1000, examples=["Take after meals"])
    rxcui: str | None = Field(default=None, pattern=r"^\d{1,10}$", examples=["308182"],
                              description="RxNorm concept of the medication")
    refills: int = Field(default=0, ge=0, le=11)
    quantity: float | None = Field(default=None, gt=0, examples=[21])
    quantity_unit: str | None = Field(default=None, max_length=40, examples=["capsule"])
    encounter_id: str | None = Field(default=None, max_length=64)
    notes: str | None = Field(default=None, max_length=2000)


class Finding(BaseModel):
    kind: str = Field(default="interaction",
                      description="interaction | allergy | duplicate-therapy | check-failed")
    severity: str
    description: str
    drugs: list[str] = []
    recommendation: str | None = None


class PrescriptionView(BaseModel):
    id: str
    patient_id: str | None = None
    medication: str | None = None
    rxcui: str | None = None
    dosage: str | None = None
    frequency: str | None = None
    duration: str | None = None
    instructions: str | None = None
    refills: int = 0
    quantity: float | None = None
    quantity_unit: str | None = None
    status: str
    prescription_number: str | None = None
    recorded_by: str | None = None
    signed_by: str | None = None
    signed_at: str | None = None
    findings: list[Finding] = []
    override_reason: str | None = None
    encounter_id: str | None = None
    notes: str | None = None
    updated_at: str | None = None


class PrescriptionQuery(MineQuery):
    patient_id: Annotated[str | None, SearchParam("subject", "Patient/{}")] = Field(
        None, max_length=64, description="A patient's prescriptions (default: your own)")
    status: Annotated[PrescriptionStatus | None, SearchParam("status")] = None


class SignRequest(BaseModel):
    override_reason: str | None = Field(
        default=None, min_length=3, max_length=1000,
        examples=["Benefit outweighs the bleeding risk; INR monitored weekly"])


# -- the sig ----------------------------------------------------------------------------------
def _invalid(field: str, message: str) -> ApiError:
    return ApiError(422, "VALIDATION_ERROR", f"{field}: {message}", field=field)


def dose_and_rate(dosage: str) -> JSON:
    """``doseAndRate[0]`` of an /api dosage ("500 mg", "1 tablet", "1-2 tablets")."""
    found = DOSE.match(dosage)
    if found is None:
        raise _invalid("dosage", "write an amount and its unit, e.g. '500 mg' or '1 tablet'")
    low, high, unit = float(found[1]), found[2], found[3].strip()
    ucum = UCUM_DOSE.get(unit.lower())

    def amount(value: float) -> JSON:
        number = int(value) if value.is_integer() else value
        return quantity(number, unit, ucum) if ucum else {"value": number, "unit": unit}
    if high is None:
        return {"doseQuantity": amount(low)}
    return {"doseRange": {"low": amount(low), "high": amount(float(high))}}


def timing(frequency: str, duration: str) -> tuple[JSON, JSON | None, bool]:
    """(timing, the bound as a Duration or None, as needed) of a frequency and duration."""
    known = FREQUENCIES.get(frequency.strip().lower())
    found: JSON = {"code": {"text": frequency}}
    if known:
        code, times, period, unit = known
        found["code"]["coding"] = [coding(GTS, code)]
        found["repeat"] = {"frequency": times, "period": period, "periodUnit": unit}
    bound = None
    if duration.strip().lower() not in ONGOING:
        parsed = DURATION.match(duration)
        bound_unit = DURATION_UNITS.get(parsed[2].lower()) if parsed else None
        if parsed is None or bound_unit is None:
            raise _invalid("duration", "write a number of days, weeks or months, e.g. "
                                       "'7 days', or 'ongoing'")
        value = float(parsed[1])
        bound = quantity(int(value) if value.is_integer() else value, parsed[2], bound_unit)
        found.setdefault("repeat", {})["boundsDuration"] = bound
    return found, bound, frequency.strip().lower() in AS_NEEDED


def prescription_to_fhir(payload: JSON, ctx: ApiContext, existing: JSON | None) -> JSON:
    when, bound, as_needed = timing(payload["frequency"], payload["duration"])
    medication: JSON = {"text": payload["medication"]}
    if payload.get("rxcui"):
        medication["coding"] = [coding(RXNORM, payload["rxcui"], payload["medication"])]
    sig = f"{payload['dosage']} {payload['frequency']} for {payload['duration']}"
    dosage: JSON = {"text": sig, "patientInstruction": payload["instructions"],
                    "timing": when, "doseAndRate": [dose_and_rate(payload["dosage"])]}
    if as_needed:
        dosage["asNeededBoolean"] = True
    dispense: JSON = {"numberOfRepeatsAllowed": payload.get("refills", 0)}
    if bound is not None:
        dispense["expectedSupplyDuration"] = bound
    if payload.get("quantity"):
        dispense["quantity"] = {"value": payload["quantity"],
                                "unit": payload.get("quantity_unit") or "unit"}
    request: JSON = {
        "resourceType": "MedicationRequest", "status": "draft", "intent": "order",
        "identifier": [{"type": PLAC, "system": NUMBER_SYSTEM,
                        "value": "RX" + uuid.uuid4().hex[:10].upper()}],
        "medicationCodeableConcept": medication, "subject": subject_of(payload),
        "recorder": user_reference(ctx.principal),
        "requester": user_reference(ctx.principal),
        "dosageInstruction": [dosage], "dispenseRequest": dispense,
    }
    if payload.get("encounter_id"):
        request["encounter"] = {"reference": f"Encounter/{payload['encounter_id']}"}
    if payload.get("notes"):
        request["note"] = [{"text": payload["notes"]}]
    return request


# -- views ------------------------------------------------------------------------------------
def _amount(found: JSON | None) -> str | None:
    if not found:
        return None
    value = found.get("value")
    return f"{value:g} {found.get('unit', '')}".strip() if isinstance(value, int | float) \
        else None


def _dosage_text(dosage: JSON) -> str | None:
    rate = (dosage.get("doseAndRate") or [{}])[0]
    if "doseRange" in rate:
        low, high = (_amount(rate["doseRange"].get(end)) for end in ("low", "high"))
        return f"{(low or '').split(' ')[0]}-{high}" if low and high else None
    return _amount(rate.get("doseQuantity"))


def finding_of(issue: JSON) -> JSON:
    code = next((c.get("code") for c in (issue.get("code") or {}).get("coding") or []), None)
    return {"kind": next((k for k, c in ISSUE_CODES.items() if c["coding"][0]["code"] == code),
                         "interaction"),
            "severity": issue.get("severity", "moderate"),
            "description": issue.get("detail") or concept_text(issue.get("code")) or "",
            "drugs": [detail.get("display", "") for evidence in issue.get("evidence") or []
                      for detail in evidence.get("detail") or []],
            "recommendation": next((concept_text(m.get("action")) for m in issue.get(
                "mitigation") or [] if not m.get("author")), None)}


def prescription_view(request: JSON, issues: list[JSON] | None = None) -> JSON:
    dosage = (request.get("dosageInstruction") or [{}])[0]
    repeat = (dosage.get("timing") or {}).get("repeat") or {}
    dispense = request.get("dispenseRequest") or {}
    signed = request.get("status") not in ("draft", "entered-in-error") and \
        request.get("authoredOn") is not None
    override = next((concept_text(m.get("action")) for i in issues or []
                     for m in i.get("mitigation") or [] if m.get("author")), None)
    return PrescriptionView(
        id=request["id"], patient_id=local_id(request.get("subject"), "Patient"),
        medication=concept_text(request.get("medicationCodeableConcept")),
        rxcui=code_in(request.get("medicationCodeableConcept"), RXNORM),
        dosage=_dosage_text(dosage),
        frequency=concept_text((dosage.get("timing") or {}).get("code")),
        duration=_amount(repeat.get("boundsDuration")) or (
            "ongoing" if dosage else None),
        instructions=dosage.get("patientInstruction"),
        refills=dispense.get("numberOfRepeatsAllowed", 0),
        quantity=(dispense.get("quantity") or {}).get("value"),
        quantity_unit=(dispense.get("quantity") or {}).get("unit"),
        status=request["status"],
        prescription_number=next((i.get("value") for i in request.get("identifier") or []
                                  if i.get("system") == NUMBER_SYSTEM), None),
        recorded_by=user_of(request.get("recorder")),
        signed_by=user_of(request.get("requester")) if signed else None,
        signed_at=request.get("authoredOn") if signed else None,
        findings=[Finding(**finding_of(i)) for i in issues or []],
        override_reason=override.removeprefix("Prescriber override: ") if override else None,
        encounter_id=local_id(request.get("encounter"), "Encounter"),
        notes=first_note(request),
        updated_at=(request.get("meta") or {}).get("lastUpdated"),
    ).model_dump()


async def prescription_views(ctx: ApiContext, requests: list[JSON]) -> list[JSON]:
    """Views with their findings: one search of the page with ``_revinclude`` of the
    DetectedIssues implicating them."""
    if not requests:
        return []
    found = await ctx.fhir.search("MedicationRequest", [
        ("_id", ",".join(r["id"] for r in requests)),
        ("_revinclude", "DetectedIssue:implicated")], included=True)
    issues: dict[str, list[JSON]] = {}
    for issue in (r for r in found if r["resourceType"] == "DetectedIssue"):
        for ref in issue.get("implicated") or []:
            if (request_id := local_id(ref, "MedicationRequest")) is not None:
                issues.setdefault(request_id, []).append(issue)
    return [prescription_view(r, issues.get(r["id"])) for r in requests]


def created_payload(request: JSON) -> JSON:
    medication = request.get("medicationCodeableConcept")
    return {"prescription_id": request["id"],
            "patient_id": local_id(request.get("subject"), "Patient"),
            "medication": concept_text(medication), "rxcui": code_in(medication, RXNORM),
            "status": request.get("status"), "requested_by": user_of(request.get("recorder"))}


prescriptions = Facade(
    resource="MedicationRequest", name="Prescription", create=PrescriptionCreate,
    view=PrescriptionView, query=PrescriptionQuery, to_fhir=prescription_to_fhir,
    from_fhir=prescription_view, views=prescription_views, statuses=PRESCRIPTION_STATUS,
    prepare=known_patient, list_criteria=mine("subject", "requester"), sort="-_lastUpdated",
    events=Events(created="platform.prescription.created", payload=created_payload),
    tags=["prescriptions"],
    summaries={"create": "Write a prescription (a draft FHIR MedicationRequest)",
               "list": "Your prescriptions (role=patient / clinician), or a patient's "
                       "(patient_id)",
               "get": "A prescription, with what its checks found when it was signed"},
)

router = APIRouter(tags=["prescriptions"])
prescriptions.mount(router, "/api/prescriptions", ops=("list", "create", "get"))
prescriptions.action("cancel", to="cancelled", event="platform.prescription.cancelled",
                     summary="Cancel a prescription (while it is not completed)")


# -- signing ----------------------------------------------------------------------------------
def detected_issue(finding: JSON, request: JSON, ctx: ApiContext, when: str,
                   override_reason: str | None) -> JSON:
    severity = {"critical": "high", "high": "high", "moderate": "moderate"}.get(
        finding["severity"], "low")
    issue: JSON = {
        "resourceType": "DetectedIssue", "status": "final",
        "code": ISSUE_CODES.get(finding.get("kind", ""), ISSUE_CODES["interaction"]),
        "severity": severity,
        "patient": {"reference": request["subject"]["reference"]},
        "identifiedDateTime": when, "detail": finding["description"],
        "implicated": [{"reference": f"MedicationRequest/{request['id']}"}],
    }
    if finding["drugs"]:
        issue["evidence"] = [{"detail": [{"display": d} for d in finding["drugs"]]}]
    mitigation: list[JSON] = []
    if finding.get("recommendation"):
        mitigation.append({"action": {"text": finding["recommendation"]}})
    if override_reason:
        mitigation.append({"action": {"text": f"Prescriber override: {override_reason}"},
                           "date": when, "author": user_reference(ctx.principal)})
    if mitigation:
        issue["mitigation"] = mitigation
    return issue


@prescriptions.route("POST", "/{resource_id}/sign", body=SignRequest,
                     summary="Sign a prescription: its checks run, then it becomes active")
async def sign_prescription(ctx: ItemContext[SignRequest]) -> JSON:
    request = ctx.resource
    ctx.authorize("prescription.sign", owner_labels(request))
    PRESCRIPTION_STATUS.check(request["status"], "active")
    patient_id = local_id(request.get("subject"), "Patient") or ""
    findings = await run_checks(ctx.services, request, patient_id)
    override_reason = ctx.body.override_reason if ctx.body else None
    if refusing(findings) and not override_reason:
        raise ApiError(409, "DRUG_INTERACTION", "The prescription checks found: " + "; ".join(
            f"{f['severity']}: {f['description']}" for f in refusing(findings))
            + ". Change the prescription, or sign with an override_reason.", details=findings)
    when = now_instant()
    signed = {**request, "status": "active", "requester": user_reference(ctx.principal),
              "authoredOn": when}
    version = int(request["meta"]["versionId"])
    unit = ctx.unit()
    async with unit:
        for finding in findings:
            await unit.create(detected_issue(finding, request, ctx, when, override_reason))
        signature = {"type": [SIGNATURE_TYPE], "when": when,
                     "who": user_reference(ctx.principal)}
        record = provenance([versioned(request, version + 1)], "UPDATE", ctx.principal, when,
                            owners=provenance_owners(ctx, request), signature=signature,
                            reason=override_reason)
        record["agent"][0]["type"] = concept(
            "http://terminology.hl7.org/CodeSystem/provenance-participant-type", "legal",
            "Legal Authenticator")
        await unit.create({**record, "id": new_id()})
        staged = await unit.update(signed, if_match=version)
        unit.emit("platform.prescription.signed", {
            "prescription_id": request["id"], "patient_id": patient_id,
            "signed_by": ctx.principal.user_id, "signed_at": when,
            "findings": len(findings), "overridden": bool(override_reason and findings)},
            source_service=source_service("prescriptions"))
        await unit.commit()
    return staged_body(staged)

