"""MDM^T02 / MDM^T04 (document notification with content) → one transaction.

| v2 | FHIR | written as |
|---|---|---|
| PID (+PD1) | Patient | referenced, created when absent |
| PV1 | Encounter | referenced by visit number, created when absent |
| TXA + OBX | DocumentReference | conditional update on TXA-12: T04 updates what T02 created |
| (message) | Binary + Provenance | see ``provenance`` |

| v2 | DocumentReference | notes |
|---|---|---|
| TXA-12 | masterIdentifier | the match key |
| TXA-19 | status | table 0273: AV current, OB superseded, CA entered-in-error; else current |
| TXA-17 | docStatus | table 0271: AU / LA final, others preliminary |
| TXA-2 | type | table 0270 |
| TXA-4 (else TXA-6) | date | an instant: needs a time |
| TXA-9 / TXA-10 (else TXA-22) | author / authenticator | logical references |
| TXA-16 | content.attachment.title | unique document file name |
| OBX (TX, FT, ST) | content.attachment | lines joined, text/plain |
| OBX (ED Base64) | content.attachment | data and media type as sent |
| OBX (RP, HD) | content.attachment.url | a pointer to the document (HD: an OID) |
"""

from __future__ import annotations

import base64
from typing import Any

from hl7_gateway.parser import Segment
from hl7_gateway.v2_to_fhir.codes import mapped
from hl7_gateway.v2_to_fhir.context import MappingContext
from hl7_gateway.v2_to_fhir.datatypes import (
    codeable,
    ei_identifier,
    fhir_instant,
    first,
    practitioner_reference,
)
from hl7_gateway.v2_to_fhir.pid import add_patient, patient_match_identifier
from hl7_gateway.v2_to_fhir.pv1 import add_encounter

__all__ = ["map_mdm"]

JSON = dict[str, Any]
TEXT_TYPES = frozenset({"TX", "FT", "ST"})


def _text_attachment(lines: list[str], title: str | None) -> JSON:
    attachment: JSON = {"contentType": "text/plain; charset=utf-8",
                        "data": base64.b64encode("\n".join(lines).encode()).decode("ascii")}
    if title:
        attachment["title"] = title
    return {"attachment": attachment}


def _other_attachment(obx: Segment, kind: str) -> JSON | None:
    rep = first(obx, 5)
    if rep is None:
        return None
    if kind == "ED":
        data = rep.component(5).strip()
        if not data or rep.component(4).strip().upper() != "BASE64":
            return None
        attachment: JSON = {"data": data}
        media = "/".join(p for p in (rep.component(2).strip().lower(),
                                     rep.component(3).strip().lower()) if p)
        if "/" in media:
            attachment["contentType"] = media
    elif kind == "RP" and rep.component(1).strip():
        attachment = {"url": rep.component(1).strip()}
    elif kind == "HD" and rep.component(1).strip():
        value = rep.component(1).strip()
        attachment = {"url": value if ":" in value else f"urn:oid:{value}"}
    else:
        return None
    title = obx.component(3, 2).strip()
    if title:
        attachment["title"] = title
    return {"attachment": attachment}


def _content(ctx: MappingContext, title: str | None) -> list[JSON]:
    lines: list[str] = []
    others: list[JSON] = []
    for obx in ctx.message.segments("OBX"):
        kind = obx.component(2, 1).strip().upper()
        if kind in TEXT_TYPES:
            lines.extend(r.text.rstrip() for r in obx.repetitions(5))
            if not obx.repetitions(5):
                lines.append("")  # an empty TX line is a blank line of the document
        else:
            attachment = _other_attachment(obx, kind)
            if attachment is None and obx.raw_field(5).strip(obx.delimiters.component):
                ctx.warn(obx, 5, f"{kind} content cannot be stored as an attachment; skipped")
            elif attachment is not None:
                others.append(attachment)
    while lines and not lines[-1].strip():
        lines.pop()
    content = [_text_attachment(lines, title)] if any(line.strip() for line in lines) else []
    return content + others


def _document(txa: Segment, ctx: MappingContext, patient: JSON, encounter: JSON | None
              ) -> JSON:
    availability = txa.component(19, 1).strip()
    status = (mapped("document_availability", availability) if availability else None) \
        or "current"
    document: JSON = {"resourceType": "DocumentReference", "status": status,
                      "subject": patient}
    number = ei_identifier(first(txa, 12), ctx.sender, kind="document")
    if number:
        document["masterIdentifier"] = number
    completion = txa.component(17, 1).strip()
    doc_status = mapped("document_completion", completion) if completion else None
    if doc_status:
        document["docStatus"] = doc_status
    kind = codeable(first(txa, 2), ctx.sender, default_table="0270")
    if kind:
        document["type"] = kind
    for field_no in (4, 6):
        value = txa.component(field_no, 1).strip()
        instant = fhir_instant(value, ctx.default_tz) if value else None
        if instant:
            document["date"] = instant
            break
    authors = [a for rep in txa.repetitions(9) if (a := practitioner_reference(rep, ctx.sender))]
    if authors:
        document["author"] = authors
    authenticator = practitioner_reference(first(txa, 10), ctx.sender) or \
        practitioner_reference(first(txa, 22), ctx.sender)
    if authenticator:
        document["authenticator"] = authenticator
    if encounter is not None:
        document["context"] = {"encounter": [encounter]}
    title = txa.field(16).strip() or None
    content = _content(ctx, title)
    if not content:
        raise ctx.fail(txa, None, "the document has no content (no OBX with text or data)")
    document["content"] = content
    return document


def map_mdm(ctx: MappingContext) -> None:
    txa = ctx.message.segment("TXA")
    if txa is None:
        raise ctx.fail(None, None, f"MDM^{ctx.event} without a TXA segment", code=100)
    patient = add_patient(ctx, update=False)
    pid = ctx.message.segment("PID")
    assert pid is not None
    encounter = add_encounter(ctx, patient, patient_match_identifier(pid, ctx),
                              status="unknown", update=False)
    document = _document(txa, ctx, patient, encounter)
    number = document.get("masterIdentifier")
    key = {"system": number["system"], "value": number["value"]} if number else None
    ctx.builder.upsert(f"DocumentReference:{ctx.control_id}" if key is None else
                       f"DocumentReference:{key['system']}|{key['value']}", document, key)
