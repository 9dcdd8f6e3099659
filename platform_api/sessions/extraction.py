"""Extraction: a transcript turned into proposed FHIR resources, reviewed by a clinician,
committed in one transaction.

An extraction is a FHIR **Task** (code urn:healthplatform:task-code#extraction, intent
proposal, ``for`` the patient, ``encounter``, ``focus`` the transcript's
DocumentReference when there is one) whose proposals are **contained** resources, each
named by an ``output`` (``valueReference`` ``#p<n>``) carrying the extensions
urn:healthplatform:extension:evidence (complex: ``start``, ``end`` character offsets in
the text, ``text``), ``…:negated``, ``…:uncertain``, ``…:decision`` (proposed | accepted
| rejected) and, once committed, ``…:committed-as`` (the resource written). The text
analysed is kept in ``input`` (``text``), so the offsets stay meaningful after the
transcript is corrected. Status: ready (awaiting review) → completed (committed).

What each finding proposes (``subject``/``patient`` the patient, ``encounter`` set):

- vital sign → **Observation** (status final, category vital-signs, LOINC code, UCUM
  ``valueQuantity``; blood pressure as the 85354-9 panel with systolic 8480-6 and
  diastolic 8462-4 components);
- medication → **MedicationStatement** (RxNorm ingredient, ``dosage.text`` as said;
  status active, or not-taken when negated: "stopped taking ibuprofen");
- allergy → **AllergyIntolerance** (SNOMED CT substance or RxNorm; verificationStatus
  confirmed, or refuted when negated: "denies allergy to sulfa"; "no known drug
  allergies" as SNOMED 409137002);
- problem → **Condition** (problem-list-item, SNOMED CT and ICD-10; confirmed,
  provisional when uncertain, refuted when negated);
- follow-up → an action item (**Task** code action-item, owner the clinician committing,
  ``restriction.period.end`` the due date, ``focus`` the transcript).

``POST /api/sessions/extractions`` takes ``transcript_id`` (a completed transcript) or
``patient_id`` + ``text``; ``extractor`` chooses the engine: ``rules`` (the default,
:class:`~.extractor.RuleExtractor`) or ``model`` (:mod:`.model_extractor`: a language
model behind an OpenAI-compatible API, its findings kept only where their evidence is in
the text). ``POST …/:id/commit`` with the ids to ``accept``
writes those proposals and the updated extraction in ONE FHIR transaction
(``fhir_server.transactions.process_bundle``, with the caller's access: a proposal the
caller may not write fails the whole commit), event
``platform.sessions.extraction_committed`` (extraction_id, patient_id, accepted,
rejected, created: ["Observation/…", …]) in the same commit. A committed extraction is
not committed again (409 ``ALREADY_COMMITTED``).
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

import orjson
from fastapi import APIRouter, Depends
from pydantic import BaseModel, Field, model_validator

from fhir_server.clock import now_instant
from fhir_server.transactions import process_bundle
from platform_api.envelope import ApiError, Envelope, conflict, created
from platform_api.facade import ApiContext, Facade, ItemContext, api_context
from platform_api.sessions.common import (
    EXTENSION,
    TASK_CODES,
    USER_SYSTEM,
    check_patient_and_encounter,
    concept,
    local_id,
    ref,
    user_reference,
)
from platform_api.sessions.extractor import Extractor, Finding, RuleExtractor

JSON = dict[str, Any]
EXTRACTION = f"{TASK_CODES}|extraction"
COMMITTED = "platform.sessions.extraction_committed"
CREATED = "platform.sessions.extraction_created"
OBSERVATION_CATEGORY = "http://terminology.hl7.org/CodeSystem/observation-category"
ALLERGY_CLINICAL = "http://terminology.hl7.org/CodeSystem/allergyintolerance-clinical"
ALLERGY_VERIFICATION = "http://terminology.hl7.org/CodeSystem/allergyintolerance-verification"
CONDITION_CLINICAL = "http://terminology.hl7.org/CodeSystem/condition-clinical"
CONDITION_VERIFICATION = "http://terminology.hl7.org/CodeSystem/condition-ver-status"
CONDITION_CATEGORY = "http://terminology.hl7.org/CodeSystem/condition-category"
UCUM = "http://unitsofmeasure.org"
RULES = RuleExtractor()


class ExtractionCreate(BaseModel):
    transcript_id: str | None = Field(default=None, min_length=1, max_length=64)
    patient_id: str | None = Field(default=None, min_length=1, max_length=64)
    encounter_id: str | None = Field(default=None, min_length=1, max_length=64)
    text: str | None = Field(default=None, min_length=1, max_length=200_000)
    extractor: Literal["rules", "model"] = Field(
        default="rules", description="rules (deterministic, the default) or model (the "
        "language model the server is configured with)")

    @model_validator(mode="after")
    def one_source(self) -> ExtractionCreate:
        if self.transcript_id is None and (self.patient_id is None or self.text is None):
            raise ValueError("give a transcript_id, or a patient_id with the text")
        return self


class CommitRequest(BaseModel):
    accept: list[str] = Field(max_length=1000, description="Ids of the proposals to write; "
                              "the others are recorded as rejected")


class EvidenceView(BaseModel):
    start: int
    end: int
    text: str


class ProposalView(BaseModel):
    id: str
    kind: str = Field(description="vital-sign | medication | allergy | problem | follow-up")
    display: str | None = None
    evidence: EvidenceView
    negated: bool = False
    uncertain: bool = False
    decision: str = Field(description="proposed | accepted | rejected")
    committed_as: str | None = None
    resource: JSON


class ExtractionView(BaseModel):
    id: str
    status: str = Field(description="proposed | committed")
    transcript_id: str | None = None
    patient_id: str | None = None
    encounter_id: str | None = None
    extractor: str | None = None
    text: str | None = None
    proposals: list[ProposalView] = []
    created_by: str | None = None
    created_at: str | None = None
    committed_at: str | None = None


# --- findings → proposed resources ---------------------------------------------------------------


def _codes(finding: Finding, text: str | None = None) -> JSON:
    found: JSON = {"coding": [{"system": s, "code": c, "display": d}
                              for s, c, d in finding.codes]}
    if text:
        found["text"] = text
    return found


def _quantity(value: JSON) -> JSON:
    return {"value": value["value"], "unit": value["unit_display"], "system": UCUM,
            "code": value["unit"]}


def propose(finding: Finding, patient: JSON, encounter: JSON | None, focus: JSON | None,
            owner: JSON, now: str) -> JSON:
    """The FHIR resource a finding proposes (module docstring)."""
    resource = _PROPOSERS[finding.kind](finding, patient, now, focus, owner)
    if encounter is not None:  # MedicationStatement names it context
        resource["context" if resource["resourceType"] == "MedicationStatement"
                 else "encounter"] = encounter
    return resource


def _observation(finding: Finding, patient: JSON, now: str, *_: Any) -> JSON:
    observation: JSON = {
        "resourceType": "Observation", "status": "final",
        "category": [concept(OBSERVATION_CATEGORY, "vital-signs", "Vital Signs")],
        "code": _codes(finding, finding.display.capitalize()), "subject": patient,
        "effectiveDateTime": now}
    if "components" in finding.details:
        observation["component"] = [
            {"code": concept("http://loinc.org", c["loinc"], c["display"]),
             "valueQuantity": _quantity(c)} for c in finding.details["components"]]
    else:
        observation["valueQuantity"] = _quantity(finding.details["value"])
    return observation


def _medication(finding: Finding, patient: JSON, now: str, *_: Any) -> JSON:
    statement: JSON = {"resourceType": "MedicationStatement",
                       "status": "not-taken" if finding.negated else "active",
                       "medicationCodeableConcept": _codes(finding, finding.evidence.text),
                       "subject": patient, "dateAsserted": now}
    if finding.details.get("dosage"):
        statement["dosage"] = [{"text": finding.details["dosage"]}]
    return statement


def _allergy(finding: Finding, patient: JSON, now: str, *_: Any) -> JSON:
    refuted = finding.negated
    return {"resourceType": "AllergyIntolerance",
            "clinicalStatus": concept(ALLERGY_CLINICAL, "inactive" if refuted else "active"),
            "verificationStatus": concept(ALLERGY_VERIFICATION,
                                          "refuted" if refuted else "confirmed"),
            "category": [finding.details.get("category", "medication")],
            "code": _codes(finding, finding.evidence.text), "patient": patient,
            "recordedDate": now}


def _condition(finding: Finding, patient: JSON, now: str, *_: Any) -> JSON:
    verification = "refuted" if finding.negated else (
        "provisional" if finding.uncertain else "confirmed")
    return {"resourceType": "Condition",
            "clinicalStatus": concept(CONDITION_CLINICAL,
                                      "inactive" if finding.negated else "active"),
            "verificationStatus": concept(CONDITION_VERIFICATION, verification),
            "category": [concept(CONDITION_CATEGORY, "problem-list-item", "Problem List Item")],
            "code": _codes(finding, finding.evidence.text), "subject": patient,
            "recordedDate": now}


def _follow_up(finding: Finding, patient: JSON, now: str, focus: JSON | None, owner: JSON
               ) -> JSON:
    due = (datetime.now(UTC) + timedelta(days=finding.details["due_in_days"])).date()
    task: JSON = {"resourceType": "Task", "status": "requested", "intent": "order",
                  "code": concept(TASK_CODES, "action-item", "Action item"),
                  "description": finding.display, "for": patient, "authoredOn": now,
                  "lastModified": now, "requester": owner,
                  "owner": {"identifier": owner["identifier"]},
                  "restriction": {"period": {"end": due.isoformat()}}}
    if focus is not None:
        task["focus"] = focus
    return task


_PROPOSERS = {"vital-sign": _observation, "medication": _medication, "allergy": _allergy,
              "problem": _condition, "follow-up": _follow_up}


def _ext(name: str, kind: str, value: Any) -> JSON:
    return {"url": EXTENSION + name, kind: value}


def extraction_task(findings: list[Finding], text: str, patient_id: str,
                    encounter_id: str | None, transcript_id: str | None, extractor: Extractor,
                    requester: JSON) -> JSON:
    now = now_instant()
    patient = ref("Patient", patient_id)
    encounter = ref("Encounter", encounter_id) if encounter_id else None
    focus = ref("DocumentReference", transcript_id) if transcript_id else None
    contained, outputs = [], []
    for number, finding in enumerate(findings, start=1):
        resource = {"id": f"p{number}", **propose(finding, patient, encounter, focus,
                                                   requester, now)}
        contained.append(resource)
        evidence = finding.evidence
        outputs.append({
            "type": concept(TASK_CODES, finding.kind, text=finding.display),
            "valueReference": {"reference": f"#p{number}"},
            "extension": [
                {"url": EXTENSION + "evidence", "extension": [
                    _ext("start", "valueInteger", evidence.start) | {"url": "start"},
                    _ext("end", "valueInteger", evidence.end) | {"url": "end"},
                    _ext("text", "valueString", evidence.text) | {"url": "text"}]},
                _ext("negated", "valueBoolean", finding.negated),
                _ext("uncertain", "valueBoolean", finding.uncertain),
                _ext("decision", "valueCode", "proposed")]})
    task: JSON = {
        "resourceType": "Task", "status": "ready", "intent": "proposal",
        "code": concept(TASK_CODES, "extraction", "Extraction of structured data"),
        "for": patient, "authoredOn": now, "lastModified": now, "requester": requester,
        "input": [{"type": {"text": "text"}, "valueString": text},
                  {"type": {"text": "extractor"},
                   "valueString": f"{extractor.name} {extractor.version}"}]}
    if contained:
        task["contained"], task["output"] = contained, outputs
    if encounter is not None:
        task["encounter"] = encounter
    if focus is not None:
        task["focus"] = focus
    return task


# --- views ----------------------------------------------------------------------------------------


def _ext_value(element: JSON, name: str) -> Any:
    for ext in element.get("extension") or []:
        if ext.get("url") == EXTENSION + name:
            if name == "evidence":
                return {e["url"]: next(v for k, v in e.items() if k.startswith("value"))
                        for e in ext.get("extension") or []}
            return next((v for k, v in ext.items() if k.startswith("value")), None)
    return None


def _input(task: JSON, name: str) -> Any:
    for item in task.get("input") or []:
        if (item.get("type") or {}).get("text") == name:
            return item.get("valueString")
    return None


def proposals_of(task: JSON) -> list[JSON]:
    contained = {r["id"]: r for r in task.get("contained") or []}
    found = []
    for output in task.get("output") or []:
        target = (output.get("valueReference") or {}).get("reference", "")
        if not target.startswith("#") or target[1:] not in contained:
            continue
        kind = ((output.get("type") or {}).get("coding") or [{}])[0].get("code")
        committed = _ext_value(output, "committed-as")
        found.append({
            "id": target[1:], "kind": kind, "display": (output.get("type") or {}).get("text"),
            "evidence": _ext_value(output, "evidence"),
            "negated": bool(_ext_value(output, "negated")),
            "uncertain": bool(_ext_value(output, "uncertain")),
            "decision": _ext_value(output, "decision") or "proposed",
            "committed_as": (committed or {}).get("reference"),
            "resource": contained[target[1:]]})
    return found


def extraction_view(task: JSON) -> JSON:
    requester = (task.get("requester") or {}).get("identifier") or {}
    return ExtractionView(
        id=task["id"], status="committed" if task.get("status") == "completed" else "proposed",
        transcript_id=local_id(task.get("focus"), "DocumentReference"),
        patient_id=local_id(task.get("for"), "Patient"),
        encounter_id=local_id(task.get("encounter"), "Encounter"),
        extractor=_input(task, "extractor"), text=_input(task, "text"),
        proposals=[ProposalView.model_validate(p) for p in proposals_of(task)],
        created_by=requester.get("value") if requester.get("system") == USER_SYSTEM else None,
        created_at=task.get("authoredOn"),
        committed_at=(task.get("executionPeriod") or {}).get("end"),
    ).model_dump()


def _refuse(payload: JSON, ctx: ApiContext, existing: JSON | None) -> JSON:
    raise AssertionError("extractions are created by create_extraction")


extractions = Facade(
    resource="Task", name="Extraction", create=ExtractionCreate, view=ExtractionView,
    to_fhir=_refuse, from_fhir=extraction_view, fixed=(("code", EXTRACTION),),
    tags=["sessions"],
    summaries={"get": "An extraction: the proposed resources with their evidence"},
)
router = APIRouter(tags=["sessions"])
extractions.mount(router, "/api/sessions/extractions", ops=("get",))


def _extractor(ctx: ApiContext, name: str) -> Extractor:
    if name == "rules":
        return RULES
    settings = ctx.services.settings
    if not settings.extraction_model_url:
        raise ApiError(422, "PROVIDER_NOT_CONFIGURED", "No extraction model is configured "
                       "on this server", field="extractor")
    from platform_api.sessions.model_extractor import ModelExtractor

    return ModelExtractor(settings)


@router.post("/api/sessions/extractions", status_code=201,
             response_model=Envelope[ExtractionView],
             summary="Extract proposed FHIR resources (vital signs, medications, allergies, "
                     "problems, follow-ups) from a transcript, each with its evidence")
async def create_extraction(body: ExtractionCreate, ctx: ApiContext = Depends(api_context)
                            ) -> Any:
    text, patient_id, encounter_id = body.text, body.patient_id, body.encounter_id
    if body.transcript_id is not None:
        from platform_api.sessions.transcripts import transcript_view, transcripts

        view = transcript_view(await transcripts.load(ctx, body.transcript_id))
        if view["status"] not in ("completed", "corrected") or not view["text"]:
            raise conflict("TRANSCRIPT_NOT_READY", "The transcript has no text yet")
        text = text or view["text"]
        patient_id, encounter_id = view["patient_id"], encounter_id or view["encounter_id"]
    assert text is not None and patient_id is not None
    await check_patient_and_encounter(ctx, {"patient_id": patient_id,
                                            "encounter_id": encounter_id})
    extractor = _extractor(ctx, body.extractor)
    findings = await extractor.propose(text)
    task = extraction_task(findings, text, patient_id, encounter_id, body.transcript_id,
                           extractor, user_reference(ctx.principal))
    unit = ctx.unit()
    async with unit:
        staged = await unit.create(task)
        unit.emit(CREATED, {"extraction_id": staged.id, "patient_id": patient_id,
                            "transcript_id": body.transcript_id, "proposals": len(findings)},
                  source_service="sessions")
        await unit.commit()
    return created(extraction_view(orjson.loads(staged.result.body)))  # type: ignore[union-attr]


@extractions.route("POST", "/{resource_id}/commit", body=CommitRequest,
                   summary="Write the accepted proposals (and record the rejected ones) in "
                           "one FHIR transaction")
async def commit_extraction(ctx: ItemContext[CommitRequest]) -> JSON:
    task = ctx.resource
    if task.get("status") == "completed":
        raise conflict("ALREADY_COMMITTED", "This extraction was committed already")
    proposals = {p["id"]: p for p in proposals_of(task)}
    accepted = list(dict.fromkeys(ctx.body.accept if ctx.body else []))
    unknown = [p for p in accepted if p not in proposals]
    if unknown:
        raise ApiError(422, "UNKNOWN_PROPOSAL", f"No proposal {unknown[0]!r} in this "
                       "extraction", field="accept")
    bundle = _transaction(task, accepted, ctx)
    patient_id = local_id(task.get("for"), "Patient")

    def announce(staging: Any, written: Any) -> None:
        staging.emit(COMMITTED, {
            "extraction_id": ctx.id, "patient_id": patient_id, "accepted": accepted,
            "rejected": [p for p in proposals if p not in accepted],
            "created": list(written[:len(accepted)])}, source_service="sessions")

    await process_bundle(ctx.services.fhir, bundle, access=ctx.access,
                         base_url=ctx.services.settings.public_base_url, on_commit=announce)
    return await ctx.fhir.read_json("Task", ctx.id)


def _transaction(task: JSON, accepted: list[str], ctx: ItemContext[Any]) -> JSON:
    """The transaction: a POST per accepted proposal, then the extraction itself (PUT,
    If-Match its version) completed, with each output's decision and what it became."""
    contained = {r["id"]: r for r in task.get("contained") or []}
    urls = {p: f"urn:uuid:{uuid.uuid4()}" for p in accepted}
    entries = []
    for proposal in accepted:
        resource = {k: v for k, v in contained[proposal].items() if k != "id"}
        entries.append({"fullUrl": urls[proposal], "resource": resource,
                        "request": {"method": "POST", "url": resource["resourceType"]}})
    done = orjson.loads(orjson.dumps(task))
    now = now_instant()
    for output in done.get("output") or []:
        proposal = (output.get("valueReference") or {}).get("reference", "")[1:]
        kept = [e for e in output.get("extension") or []
                if e.get("url") not in (EXTENSION + "decision", EXTENSION + "committed-as")]
        kept.append(_ext("decision", "valueCode",
                         "accepted" if proposal in urls else "rejected"))
        if proposal in urls:
            kept.append(_ext("committed-as", "valueReference", {"reference": urls[proposal]}))
        output["extension"] = kept
    done.update(status="completed", lastModified=now, owner=user_reference(ctx.principal),
                executionPeriod={"start": task.get("authoredOn", now), "end": now})
    version = (task.get("meta") or {}).get("versionId")
    entries.append({"fullUrl": f"Task/{task['id']}", "resource": done,
                    "request": {"method": "PUT", "url": f"Task/{task['id']}",
                                **({"ifMatch": f'W/"{version}"'} if version else {})}})
    return {"resourceType": "Bundle", "type": "transaction", "entry": entries}


__all__ = ["RULES", "ExtractionView", "extractions", "propose", "router"]
