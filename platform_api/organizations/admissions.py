"""Admissions: inpatient stays as FHIR Encounter, with the history of their beds.

Mapping (/api → FHIR Encounter):
    patient_id → Encounter.subject (Patient/<id>)
    (scope) → Encounter.serviceProvider (Organization/<org_id>) and its owner label
    (always) → Encounter.class = v3-ActCode IMP (inpatient encounter)
    status → Encounter.status: in-progress while admitted, finished once discharged
    admitted_at / discharged_at → Encounter.period.start / .end
    reason → Encounter.reasonCode[0].text
    attending_practitioner_id → Encounter.participant[type ATND].individual
    bed history → Encounter.location[]: one entry per bed (Location/<bed>, physicalType
                  bd, period); the current bed's entry is ``active``, the earlier ones
                  ``completed``
    disposition → Encounter.hospitalization.dischargeDisposition (discharge-disposition
                  code system: home, alt-home, other-hcf, hosp, long, aadvice, exp, psy,
                  rehab, snf, oth)

The bed's occupancy is the bed Location's ``operationalStatus`` (v2-0116, see
:mod:`~platform_api.organizations.rooms`): admitting writes the Encounter and moves the
bed from free to occupied in one unit of work, the bed written under ``If-Match`` on the
version read as free. Two admissions racing for one bed (in one process or in several
sharing the store) cannot both commit: the store checks the version inside the commit,
so the second fails, reads the bed again, finds it occupied and answers 409
``BED_OCCUPIED``. A transfer frees the old bed and occupies the new one the same way; a
discharge frees the bed. A patient with an admission in progress in the organization
cannot be admitted again (409 ``ALREADY_ADMITTED``; a conditional create, re-checked
inside the commit). A bed being cleaned or closed is 409 ``BED_UNAVAILABLE``.

Who may admit, transfer and discharge: whoever the policy lets create and update the
organization's Encounters (``ORG:ADMIN``, ``ORG:DOCTOR``, ``ORG:NURSE``,
``ORG:RECEPTIONIST``) and see the patient. The bed is written by the platform on their
behalf (Location is directory data, which only ``ORG:ADMIN`` writes), in their unit of
work, through the policy's named elevation (recorded in the audit trail).

Events: ``platform.organization.patient_admitted``, ``…patient_transferred``,
``…patient_discharged`` (``admission_id``, ``organization_id``, ``patient_id``,
``bed_id``, and ``from_bed_id`` / ``disposition``).
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

import orjson
from fastapi import APIRouter, Depends
from pydantic import AwareDatetime, BaseModel, Field

from fhir_server.clock import now_instant
from fhir_server.ownership import OWNER_SYSTEM
from fhir_server.store import ResourceGone, ResourceNotFound, StoreError
from platform_api.envelope import Envelope, conflict, created, not_found
from platform_api.facade import (
    ApiContext,
    Facade,
    ItemContext,
    OrganizationScope,
    SearchParam,
    StatusTable,
    api_context,
    create_unique,
    is_duplicate,
    require_patient,
    staged_body,
    until_stable,
)
from platform_api.fhir_values import concept, local_id, reference
from platform_api.organizations.rooms import KIND_TAG, bed_status, with_bed_status

JSON = dict[str, Any]
ACT_CODE = "http://terminology.hl7.org/CodeSystem/v3-ActCode"
INPATIENT = {"system": ACT_CODE, "code": "IMP", "display": "inpatient encounter"}
ATTENDER = concept("ATND", "http://terminology.hl7.org/CodeSystem/v3-ParticipationType",
                   "attender")
BED_TYPE = concept("bd", "http://terminology.hl7.org/CodeSystem/location-physical-type",
                   "Bed")
DISPOSITIONS = {
    "home": "Home", "alt-home": "Alternative home", "other-hcf": "Other healthcare facility",
    "hosp": "Hospice", "long": "Long-term care", "aadvice": "Left against advice",
    "exp": "Expired", "psy": "Psychiatric hospital", "rehab": "Rehabilitation",
    "snf": "Skilled nursing facility", "oth": "Other",
}
DISPOSITION_SYSTEM = "http://terminology.hl7.org/CodeSystem/discharge-disposition"
ADMISSION_STATUS = StatusTable.of(in_progress=("finished",), finished=())
ADMITTED = "platform.organization.patient_admitted"
TRANSFERRED = "platform.organization.patient_transferred"
DISCHARGED = "platform.organization.patient_discharged"
Disposition = Literal["home", "alt-home", "other-hcf", "hosp", "long", "aadvice", "exp",
                      "psy", "rehab", "snf", "oth"]


class AdmissionCreate(BaseModel):
    patient_id: str = Field(min_length=1, max_length=64)
    bed_id: str = Field(min_length=1, max_length=64)
    reason: str | None = Field(default=None, max_length=1000,
                               examples=["Severe malaria with anaemia"])
    attending_practitioner_id: str | None = Field(default=None, max_length=64)
    admitted_at: AwareDatetime | None = None


class TransferRequest(BaseModel):
    bed_id: str = Field(min_length=1, max_length=64)
    reason: str | None = Field(default=None, max_length=1000)
    at: AwareDatetime | None = None


class DischargeRequest(BaseModel):
    disposition: Disposition = Field(examples=["home"])
    note: str | None = Field(default=None, max_length=2000)
    at: AwareDatetime | None = None


class BedStay(BaseModel):
    bed_id: str | None
    bed_name: str | None = None
    start: str | None = None
    end: str | None = None


class AdmissionView(BaseModel):
    id: str
    patient_id: str | None
    status: str
    bed_id: str | None = None
    bed_name: str | None = None
    admitted_at: str | None = None
    discharged_at: str | None = None
    reason: str | None = None
    attending_practitioner_id: str | None = None
    disposition: str | None = None
    beds: list[BedStay] = []
    updated_at: str | None = None


class AdmissionQuery(BaseModel):
    status: Annotated[Literal["in-progress", "finished"] | None, SearchParam("status")] = None
    patient_id: Annotated[str | None, SearchParam("subject", "Patient/{}")] = Field(
        None, max_length=64)


def _instant(value: datetime | None) -> str:
    return value.isoformat() if value is not None else now_instant()


def _stay(bed: JSON, start: str) -> JSON:
    return {"location": reference("Location", bed["id"], bed.get("name")), "status": "active",
            "physicalType": BED_TYPE, "period": {"start": start}}


def admission_from_fhir(encounter: JSON) -> JSON:
    stays = [BedStay(bed_id=local_id(s.get("location"), "Location"),
                     bed_name=(s.get("location") or {}).get("display"),
                     start=(s.get("period") or {}).get("start"),
                     end=(s.get("period") or {}).get("end"))
             for s in encounter.get("location", [])]
    current = next((s for s, raw in zip(stays, encounter.get("location", []), strict=True)
                    if raw.get("status") == "active"), None)
    attending = next((p.get("individual") for p in encounter.get("participant", [])
                      if any(c.get("code") == "ATND" for t in p.get("type", [])
                             for c in t.get("coding", []))), None)
    disposition = (encounter.get("hospitalization") or {}).get("dischargeDisposition")
    return AdmissionView(
        id=encounter["id"], patient_id=local_id(encounter.get("subject"), "Patient"),
        status=encounter.get("status", ""), bed_id=current.bed_id if current else None,
        bed_name=current.bed_name if current else None,
        admitted_at=(encounter.get("period") or {}).get("start"),
        discharged_at=(encounter.get("period") or {}).get("end"),
        reason=((encounter.get("reasonCode") or [{}])[0]).get("text"),
        attending_practitioner_id=local_id(attending, "Practitioner"),
        disposition=((disposition or {}).get("coding") or [{}])[0].get("code"),
        beds=stays, updated_at=(encounter.get("meta") or {}).get("lastUpdated"),
    ).model_dump()



admissions = Facade(
    resource="Encounter", name="Admission", create=AdmissionCreate, view=AdmissionView,
    query=AdmissionQuery, from_fhir=admission_from_fhir,
    scope=OrganizationScope(), fixed=[("class", f"{ACT_CODE}|IMP")], sort="-date",
    statuses=ADMISSION_STATUS, tags=["organizations"],
    summaries={"list": "List an organization's admissions (inpatient stays), newest first"},
)


# -- beds ----------------------------------------------------------------------------------------
async def _free_bed(ctx: ApiContext, org_id: str, bed_id: str) -> tuple[JSON, int]:
    """The bed with the version read (404 not a bed of the organization, 409 not free)."""
    try:
        stored = await ctx.fhir.read("Location", bed_id)
    except (ResourceNotFound, ResourceGone):
        raise not_found("Bed") from None
    bed: JSON = orjson.loads(stored.body)
    tags = {(t.get("system"), t.get("code")) for t in (bed.get("meta") or {}).get("tag", [])}
    if (KIND_TAG, "bed") not in tags or not OrganizationScope().contains(ctx, bed, org_id):
        raise not_found("Bed")
    status = bed_status(bed)
    if status == "occupied":
        raise conflict("BED_OCCUPIED", f"Bed {bed.get('name', bed_id)} is occupied")
    if status != "free" or bed.get("status", "active") != "active":
        raise conflict("BED_UNAVAILABLE", f"Bed {bed.get('name', bed_id)} is {status}")
    return bed, stored.version


async def _bed(ctx: ApiContext, bed_id: str | None) -> tuple[JSON, int] | None:
    if bed_id is None:
        return None
    try:  # beds are directory entries every signed-in user reads
        stored = await ctx.fhir.read("Location", bed_id)
    except (ResourceNotFound, ResourceGone):
        return None
    return orjson.loads(stored.body), stored.version


async def _commit(ctx: ApiContext, encounter: JSON, version: int | None,
                  beds: list[tuple[JSON, int, str]], event: str, payload: JSON) -> JSON:
    """Write the Encounter as the caller (a create when ``version`` is None: refused when
    the patient is already admitted) and the beds' new statuses as the platform, each
    bed under If-Match, with ``event``: one unit of work."""
    unit = ctx.fhir.unit()
    async with unit:
        if version is None:
            org_id = ctx.path["org_id"]
            staged = await create_unique(unit, encounter, [
                ("class", f"{ACT_CODE}|IMP"), ("status", "in-progress"),
                ("subject", encounter["subject"]["reference"]),
                ("_security", f"{OWNER_SYSTEM}|{org_id}")],
                expected_type="Encounter")
        else:
            staged = await unit.update(encounter, if_match=version)
        # Admitting is the Encounter's write, checked above as the caller's; the beds it
        # occupies and frees are the platform's bookkeeping, which a nurse may not write.
        platform = ctx.elevate_unit(unit, "admission: the occupancy status of the beds "
                                    "(Location) the stay takes and leaves")
        for bed, bed_version, status in beds:
            await platform.update(with_bed_status(bed, status), if_match=bed_version)
        unit.emit(event, {**payload, "admission_id": staged.id,
                          "organization_id": ctx.path["org_id"]},
                  source_service="organizations")
        try:
            await unit.commit()
        except StoreError as exc:
            if is_duplicate(exc):
                raise conflict("ALREADY_ADMITTED", "This patient is already admitted in "
                               "this organization: transfer or discharge them") from None
            raise
    return staged_body(staged)


# -- routes ---------------------------------------------------------------------------------------
router = APIRouter(tags=["organizations"])
ADMISSIONS = "/api/organizations/{org_id}/admissions"


@router.post(ADMISSIONS, status_code=201, response_model=Envelope[AdmissionView],
             summary="Admit a patient to a free bed")
async def admit(org_id: str, body: AdmissionCreate,
                ctx: ApiContext = Depends(api_context)) -> Any:
    await admissions.enter(ctx)
    await require_patient(ctx, body.patient_id)
    start = _instant(body.admitted_at)
    encounter: JSON = {
        "resourceType": "Encounter", "status": "in-progress", "class": INPATIENT,
        "subject": reference("Patient", body.patient_id),
        "serviceProvider": reference("Organization", org_id), "period": {"start": start}}
    if body.reason:
        encounter["reasonCode"] = [{"text": body.reason}]
    if body.attending_practitioner_id:
        encounter["participant"] = [{"type": [ATTENDER], "individual": reference(
            "Practitioner", body.attending_practitioner_id)}]

    async def once() -> JSON:
        bed, version = await _free_bed(ctx, org_id, body.bed_id)
        admission = OrganizationScope().stamp({**encounter, "location": [_stay(bed, start)]},
                                              org_id)
        return await _commit(ctx, admission, None, [(bed, version, "occupied")], ADMITTED,
                             {"patient_id": body.patient_id, "bed_id": bed["id"]})
    return created(admission_from_fhir(await until_stable(once)))


admissions.mount(router, ADMISSIONS, ops=("list", "get"))


def _current_stay(encounter: JSON) -> JSON | None:
    return next((s for s in encounter.get("location", []) if s.get("status") == "active"),
                None)


def _end_stay(encounter: JSON, at: str) -> tuple[JSON, str | None]:
    """The Encounter with its current bed's stay completed; that bed's id."""
    stays, left = [], None
    for stay in encounter.get("location", []):
        if stay.get("status") == "active":
            left = local_id(stay.get("location"), "Location")
            stay = {**stay, "status": "completed", "period": {**stay.get("period", {}),
                                                               "end": at}}
        stays.append(stay)
    return {**encounter, "location": stays}, left


def _require_in_progress(encounter: JSON) -> None:
    if encounter.get("status") != "in-progress":
        raise conflict("INVALID_TRANSITION", f"This admission is {encounter.get('status')}")


@admissions.route("POST", "/{resource_id}/transfer", body=TransferRequest,
                  summary="Move an admitted patient to another free bed")
async def transfer(ctx: ItemContext[TransferRequest]) -> JSON:
    assert ctx.body is not None
    encounter, at = ctx.resource, _instant(ctx.body.at)
    _require_in_progress(encounter)
    current = _current_stay(encounter)
    if current and local_id(current.get("location"), "Location") == ctx.body.bed_id:
        raise conflict("SAME_BED", "The patient is already in this bed")
    new_bed, new_version = await _free_bed(ctx, ctx.path["org_id"], ctx.body.bed_id)
    moved, left = _end_stay(encounter, at)
    moved["location"].append(_stay(new_bed, at))
    if ctx.body.reason:
        moved["reasonCode"] = [*moved.get("reasonCode", []), {"text": ctx.body.reason}]
    beds = [(new_bed, new_version, "occupied")]
    if (old := await _bed(ctx, left)) is not None:
        beds.append((old[0], old[1], "free"))
    return await _commit(ctx, moved, _version(encounter), beds, TRANSFERRED, {
        "patient_id": local_id(encounter.get("subject"), "Patient"),
        "bed_id": new_bed["id"], "from_bed_id": left})


@admissions.route("POST", "/{resource_id}/discharge", body=DischargeRequest,
                  summary="Discharge an admitted patient (frees the bed)")
async def discharge(ctx: ItemContext[DischargeRequest]) -> JSON:
    assert ctx.body is not None
    encounter, at = ctx.resource, _instant(ctx.body.at)
    ADMISSION_STATUS.check(encounter.get("status", ""), "finished")
    finished, left = _end_stay(encounter, at)
    code = ctx.body.disposition
    hospitalization = {**finished.get("hospitalization", {}), "dischargeDisposition": concept(
        code, DISPOSITION_SYSTEM, DISPOSITIONS[code], ctx.body.note)}
    finished = {**finished, "status": "finished", "hospitalization": hospitalization,
                "period": {**finished.get("period", {}), "end": at}}
    old = await _bed(ctx, left)
    return await _commit(ctx, finished, _version(encounter),
                         [(old[0], old[1], "free")] if old else [], DISCHARGED, {
        "patient_id": local_id(encounter.get("subject"), "Patient"), "bed_id": left,
        "disposition": code})


def _version(resource: JSON) -> int:
    return int((resource.get("meta") or {}).get("versionId", "0"))
