"""ORC + OBR → ServiceRequest and DiagnosticReport; the order groups of a message.

ServiceRequest (orders, and the order a result answers):

| v2 | ServiceRequest | notes |
|---|---|---|
| ORC-2 / OBR-2 | identifier (type PLAC) | the match key; links /api/labs orders |
| ORC-3 / OBR-3 | identifier (type FILL) | filler order number |
| ORC-4 | requisition | placer group number |
| ORC-5, else ORC-1 | status | table 0038 / 0119 → request-status |
| (fixed) | intent order | |
| OBR-4 | code | |
| TQ1-9, else OBR-5 | priority | table 0485 |
| ORC-9 | authoredOn | |
| ORC-12, else OBR-16 | requester | logical Practitioner reference |
| TQ1-7, else OBR-7 | occurrenceDateTime | |
| NTE after OBR | note | |

DiagnosticReport (results):

| v2 | DiagnosticReport | notes |
|---|---|---|
| OBR-3 (else ORC-3) | identifier (type FILL) | the match key: corrections update the report |
| OBR-2 | identifier (type PLAC) | |
| OBR-4 | code | |
| OBR-24 | category | table 0074; LAB when absent (this is the lab interface) |
| OBR-25 | status | table 0123 → diagnostic-report-status |
| OBR-7 / OBR-8 | effectiveDateTime / effectivePeriod | |
| OBR-22 | issued | |
| OBR-32 | resultsInterpreter | |
| (ServiceRequest, OBX, SPM) | basedOn / result / specimen | |

An order group is ``[ORC] OBR {NTE} [TQ1] {OBX {NTE}} {SPM {OBX}}``: OBX after an SPM
observe that specimen.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hl7_gateway.parser import Message, Repetition, Segment
from hl7_gateway.v2_to_fhir.codes import local_system, mapped, table_coding
from hl7_gateway.v2_to_fhir.context import MappingContext
from hl7_gateway.v2_to_fhir.datatypes import (
    codeable,
    ei_identifier,
    fhir_datetime,
    fhir_instant,
    first,
    practitioner_reference,
)
from hl7_gateway.v2_to_fhir.obx import following_notes

__all__ = [
    "OrderGroup",
    "diagnostic_report",
    "order_groups",
    "order_identifiers",
    "service_request",
]

JSON = dict[str, Any]
V2_0074 = "http://terminology.hl7.org/CodeSystem/v2-0074"
# Placer numbers issued by this platform's /api/labs carry this namespace id (EI-2).
PLATFORM_PLACER_NAMESPACE = "HEALTHPLATFORM"
PLATFORM_PLACER_SYSTEM = "urn:healthplatform:lab-order"


@dataclass
class OrderGroup:
    orc: Segment | None = None
    obr: Segment | None = None
    tq1: Segment | None = None
    observations: list[Segment] = field(default_factory=list)
    specimens: list[tuple[Segment, list[Segment]]] = field(default_factory=list)


def order_groups(message: Message) -> tuple[list[Segment], list[OrderGroup]]:
    """The OBX before any order (patient observations) and the order groups, in order."""
    loose: list[Segment] = []
    groups: list[OrderGroup] = []
    current: OrderGroup | None = None
    for seg in message:
        if seg.id == "ORC":
            current = OrderGroup(orc=seg)
            groups.append(current)
        elif seg.id == "OBR":
            if current is None or current.obr is not None:
                current = OrderGroup()
                groups.append(current)
            current.obr = seg
        elif current is None:
            if seg.id == "OBX":
                loose.append(seg)
        elif seg.id == "TQ1" and current.tq1 is None:
            current.tq1 = seg
        elif seg.id == "SPM":
            current.specimens.append((seg, []))
        elif seg.id == "OBX":
            if current.specimens:
                current.specimens[-1][1].append(seg)
            else:
                current.observations.append(seg)
    return loose, groups


def _ei(rep: Repetition | None, ctx: MappingContext, kind: str, type_code: str
        ) -> JSON | None:
    if rep is not None and kind == "placer" and \
            rep.component(2).strip().upper() == PLATFORM_PLACER_NAMESPACE:
        return {"type": {"coding": [table_coding("0203", "PLAC")]},
                "system": PLATFORM_PLACER_SYSTEM, "value": rep.component(1).strip()}
    return ei_identifier(rep, ctx.sender, kind=f"{kind}-order", type_code=type_code)


def order_identifiers(group: OrderGroup, ctx: MappingContext
                      ) -> tuple[JSON | None, JSON | None]:
    """(placer, filler) order numbers: ORC-2 / ORC-3, else OBR-2 / OBR-3."""
    placer = _ei(first(group.orc, 2), ctx, "placer", "PLAC") or \
        _ei(first(group.obr, 2), ctx, "placer", "PLAC")
    filler = _ei(first(group.obr, 3), ctx, "filler", "FILL") or \
        _ei(first(group.orc, 3), ctx, "filler", "FILL")
    return placer, filler


def _status(group: OrderGroup) -> str | None:
    if group.orc is None:
        return None
    order_status = group.orc.component(5, 1).strip()
    if order_status and (status := mapped("order_status", order_status)):
        return status
    control = group.orc.component(1, 1).strip()
    return mapped("order_control_status", control) if control else None


def _priority(group: OrderGroup) -> str | None:
    code = (group.tq1.component(9, 1) if group.tq1 is not None else "") or \
        (group.obr.component(5, 1) if group.obr is not None else "")
    return mapped("request_priority", code) if code.strip() else None


def _moment(seg: Segment | None, field_no: int, ctx: MappingContext) -> str | None:
    if seg is None:
        return None
    value = seg.component(field_no, 1).strip()
    if not value:
        return None
    moment = fhir_datetime(value, ctx.default_tz)
    if moment is None:
        ctx.warn(seg, field_no, f"{value!r} is not a valid date/time; dropped")
    return moment


def service_request(group: OrderGroup, ctx: MappingContext, subject: JSON, *,
                    default_status: str) -> JSON:
    placer, filler = order_identifiers(group, ctx)
    request: JSON = {"resourceType": "ServiceRequest",
                     "status": _status(group) or default_status, "intent": "order",
                     "subject": subject}
    identifiers = [i for i in (placer, filler) if i]
    if identifiers:
        request["identifier"] = identifiers
    group_number = _ei(first(group.orc, 4), ctx, "placer-group", "PGN")
    if group_number:
        request["requisition"] = group_number
    code = codeable(first(group.obr, 4), ctx.sender)
    if code:
        request["code"] = code
    priority = _priority(group)
    if priority:
        request["priority"] = priority
    authored = _moment(group.orc, 9, ctx)
    if authored:
        request["authoredOn"] = authored
    requester = practitioner_reference(first(group.orc, 12), ctx.sender) or \
        practitioner_reference(first(group.obr, 16), ctx.sender)
    if requester:
        request["requester"] = requester
    occurrence = _moment(group.tq1, 7, ctx) or _moment(group.obr, 7, ctx)
    if occurrence:
        request["occurrenceDateTime"] = occurrence
    notes = following_notes(ctx, group.obr) if group.obr is not None else []
    if notes:
        request["note"] = [{"text": n} for n in notes]
    return request


def _category(obr: Segment) -> JSON:
    section = obr.component(24, 1).strip()
    coding = table_coding("0074", section) if section else None
    return {"coding": [coding or {"system": V2_0074, "code": "LAB", "display": "Laboratory"}]}


def diagnostic_report(group: OrderGroup, ctx: MappingContext, links: JSON) -> JSON:
    """The DiagnosticReport of an OBR; ``links`` holds subject, encounter, basedOn."""
    obr = group.obr
    assert obr is not None
    code = codeable(first(obr, 4), ctx.sender)
    if code is None:
        raise ctx.fail(obr, 4, "universal service identifier is empty")
    status_code = obr.component(25, 1).strip()
    status = mapped("diagnostic_report_status", status_code) if status_code else None
    if status_code and status is None:
        ctx.warn(obr, 25, f"{status_code!r} is not a table 0123 code; status unknown", 103)
    report: JSON = {"resourceType": "DiagnosticReport", "status": status or "unknown",
                    "category": [_category(obr)], "code": code, **links}
    placer, filler = order_identifiers(group, ctx)
    identifiers = [i for i in (filler, placer) if i]
    if identifiers:
        report["identifier"] = identifiers
    start, end = _moment(obr, 7, ctx), _moment(obr, 8, ctx)
    if start and end:
        report["effectivePeriod"] = {"start": start, "end": end}
    elif start:
        report["effectiveDateTime"] = start
    issued = obr.component(22, 1).strip()
    if issued:
        instant = fhir_instant(issued, ctx.default_tz)
        if instant:
            report["issued"] = instant
        else:
            ctx.warn(obr, 22, f"{issued!r} is not a precise date/time; dropped")
    interpreter = practitioner_reference(_interpreter(obr), ctx.sender)
    if interpreter:
        report["resultsInterpreter"] = [interpreter]
    return report


def _interpreter(obr: Segment) -> Repetition | None:
    # OBR-32 is an NDL whose first component is a CNN: id&family&given... as subcomponents.
    rep = first(obr, 32)
    if rep is None or not rep.component(1).strip():
        return None
    if rep.component(2).strip():
        return rep  # sent as components, like an XCN
    delimiters = obr.delimiters
    parts = rep.component(1).split(delimiters.subcomponent) if delimiters.subcomponent \
        else [rep.component(1)]
    return Repetition(delimiters.component.join(parts), delimiters)


def report_key(filler: JSON | None, placer: JSON | None, ctx: MappingContext, obr: Segment
               ) -> JSON:
    """The identifier a report (and its observations' ids) hangs off."""
    chosen = filler or placer
    if chosen is not None:
        return {"system": chosen["system"], "value": chosen["value"]}
    set_id = obr.field(1).strip() or str(ctx.sequence_of(obr))
    return {"system": local_system(ctx.sender, "result"),
            "value": f"{ctx.control_id}^{set_id}"}
