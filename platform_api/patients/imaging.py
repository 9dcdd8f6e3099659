"""Patients area, imaging orders ⇄ FHIR ServiceRequest (category imaging).

Mapping (/api field → FHIR ServiceRequest):
    patient_id      → subject (Patient/<id>)
    procedure       → code.text, with ``procedure_code`` / ``system`` as code.coding[0]
                      (LOINC by default, e.g. 36643-5 XR Chest 2 Views)
    modality        → orderDetail[0] (DICOM modality, DCM: CR, CT, DX, MG, MR, NM, PT,
                      RF, US, XA)
    body_site       → bodySite[0].text
    reason          → reasonCode[0].text (the clinical question)
    priority        → priority (routine | urgent | asap | stat)
    notes           → note[0].text
    status          → status, moved by the lab orders' status table (draft → active |
                      revoked; active → on-hold | completed | revoked; on-hold → active |
                      revoked; completed and revoked are final)
    (generated) accession/placer number → identifier[type PLAC, system
                      urn:healthplatform:imaging-order]
    requested_by    → requester (the user); created_at → authoredOn
    category        → SNOMED CT 363679005 Imaging (fixed: a lab order is not an imaging
                      order)
    study_ids, report_ids → the ImagingStudy (``basedOn``) and DiagnosticReport
                      (``basedOn``) resources that answer the order

``POST /api/imaging/:id/cancel`` moves it to revoked (409 INVALID_TRANSITION once
completed or revoked). Lists: without ``patient_id`` the caller's own orders (see
``shared``), newest first.
"""

from __future__ import annotations

import uuid
from typing import Annotated, Literal

from fastapi import APIRouter
from pydantic import BaseModel, Field

from fhir_server.clock import now_instant
from platform_api.facade import ApiContext, Facade, SearchParam
from platform_api.labs import ORDER_STATUS, OrderStatus, Priority
from platform_api.patients.shared import (
    JSON,
    LOINC,
    SNOMED,
    MineQuery,
    coding,
    concept,
    concept_text,
    first_coding,
    first_note,
    known_patient,
    local_id,
    mine,
    subject_of,
    user_of,
    user_reference,
)

DCM = "http://dicom.nema.org/resources/ontology/DCM"
PLAC = concept("http://terminology.hl7.org/CodeSystem/v2-0203", "PLAC", "Placer Identifier")
ORDER_SYSTEM = "urn:healthplatform:imaging-order"
IMAGING = ("363679005", "Imaging")
MODALITIES = {"CR": "Computed Radiography", "CT": "Computed Tomography",
              "DX": "Digital Radiography", "MG": "Mammography", "MR": "Magnetic Resonance",
              "NM": "Nuclear Medicine", "PT": "Positron emission tomography",
              "RF": "Radio Fluoroscopy", "US": "Ultrasound", "XA": "X-Ray Angiography"}
Modality = Literal["CR", "CT", "DX", "MG", "MR", "NM", "PT", "RF", "US", "XA"]


class ImagingOrderCreate(BaseModel):
    patient_id: str = Field(min_length=1, max_length=64)
    procedure: str = Field(min_length=1, max_length=200, examples=["Chest X-ray, 2 views"])
    procedure_code: str | None = Field(default=None, max_length=64, examples=["36643-5"])
    system: str = Field(default=LOINC, max_length=200)
    modality: Modality = Field(examples=["DX"])
    body_site: str | None = Field(default=None, max_length=200, examples=["Chest"])
    reason: str | None = Field(default=None, max_length=1000,
                               examples=["Productive cough for 3 weeks; rule out TB"])
    priority: Priority = "routine"
    notes: str | None = Field(default=None, max_length=2000)


class ImagingOrderView(BaseModel):
    id: str
    patient_id: str | None = None
    procedure: str | None = None
    procedure_code: str | None = None
    modality: str | None = None
    body_site: str | None = None
    reason: str | None = None
    priority: str | None = None
    notes: str | None = None
    status: str
    placer_order_number: str | None = None
    requested_by: str | None = None
    created_at: str | None = None
    updated_at: str | None = None
    study_ids: list[str] = []
    report_ids: list[str] = []


class ImagingQuery(MineQuery):
    patient_id: Annotated[str | None, SearchParam("subject", "Patient/{}")] = Field(
        None, max_length=64, description="A patient's imaging orders (default: your own)")
    status: Annotated[OrderStatus | None, SearchParam("status")] = None


def imaging_to_fhir(payload: JSON, ctx: ApiContext, existing: JSON | None) -> JSON:
    code: JSON = {"text": payload["procedure"]}
    if payload.get("procedure_code"):
        code["coding"] = [coding(payload.get("system") or LOINC, payload["procedure_code"],
                                 payload["procedure"])]
    order: JSON = {
        "resourceType": "ServiceRequest", "status": "active", "intent": "order",
        "category": [concept(SNOMED, *IMAGING)], "code": code,
        "orderDetail": [concept(DCM, payload["modality"], MODALITIES[payload["modality"]])],
        "priority": payload.get("priority", "routine"), "subject": subject_of(payload),
        "identifier": [{"type": PLAC, "system": ORDER_SYSTEM,
                        "value": "IMG" + uuid.uuid4().hex[:12].upper()}],
        "authoredOn": now_instant(), "requester": user_reference(ctx.principal),
    }
    if payload.get("body_site"):
        order["bodySite"] = [{"text": payload["body_site"]}]
    if payload.get("reason"):
        order["reasonCode"] = [{"text": payload["reason"]}]
    if payload.get("notes"):
        order["note"] = [{"text": payload["notes"]}]
    return order


def imaging_view(order: JSON, study_ids: list[str] | None = None,
                 report_ids: list[str] | None = None) -> JSON:
    placer = next((i.get("value") for i in order.get("identifier") or []
                   if i.get("system") == ORDER_SYSTEM), None)
    meta = order.get("meta") or {}
    return ImagingOrderView(
        id=order["id"], patient_id=local_id(order.get("subject"), "Patient"),
        procedure=concept_text(order.get("code")),
        procedure_code=first_coding(order.get("code")).get("code"),
        modality=first_coding((order.get("orderDetail") or [None])[0]).get("code"),
        body_site=concept_text((order.get("bodySite") or [None])[0]),
        reason=concept_text((order.get("reasonCode") or [None])[0]),
        priority=order.get("priority"), notes=first_note(order),
        status=order["status"], placer_order_number=placer,
        requested_by=user_of(order.get("requester")),
        created_at=order.get("authoredOn"), updated_at=meta.get("lastUpdated"),
        study_ids=study_ids or [], report_ids=report_ids or [],
    ).model_dump()


async def imaging_views(ctx: ApiContext, orders: list[JSON]) -> list[JSON]:
    """Views with the studies and reports answering each order: one search of the page
    with ``_revinclude`` of both."""
    if not orders:
        return []
    found = await ctx.fhir.search("ServiceRequest", [
        ("_id", ",".join(o["id"] for o in orders)),
        ("_revinclude", "ImagingStudy:basedon"), ("_revinclude", "DiagnosticReport:based-on")],
        included=True)
    answers: dict[tuple[str, str], list[str]] = {}
    for resource in found:
        if resource["resourceType"] in ("ImagingStudy", "DiagnosticReport"):
            for ref in resource.get("basedOn") or []:
                if (order_id := local_id(ref, "ServiceRequest")) is not None:
                    answers.setdefault((resource["resourceType"], order_id), []).append(
                        resource["id"])
    return [imaging_view(o, answers.get(("ImagingStudy", o["id"])),
                         answers.get(("DiagnosticReport", o["id"]))) for o in orders]


imaging_orders = Facade(
    resource="ServiceRequest", name="Imaging order", create=ImagingOrderCreate,
    view=ImagingOrderView, query=ImagingQuery, to_fhir=imaging_to_fhir,
    from_fhir=imaging_view, views=imaging_views, statuses=ORDER_STATUS,
    fixed=[("category", f"{SNOMED}|{IMAGING[0]}")], prepare=known_patient,
    list_criteria=mine("subject", "requester"), sort="-authored", tags=["imaging"],
    summaries={"create": "Order an imaging study (a FHIR ServiceRequest, category imaging)",
               "list": "Your imaging orders, or a patient's (patient_id), newest first",
               "get": "An imaging order, with the studies and reports answering it"},
)

router = APIRouter(tags=["imaging"])
imaging_orders.mount(router, "/api/imaging", ops=("list", "create", "get"))
imaging_orders.action("cancel", to="revoked", summary="Cancel an imaging order (status "
                                                      "revoked)")
