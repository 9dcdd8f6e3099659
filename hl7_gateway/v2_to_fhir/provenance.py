"""MSH / EVN → Provenance, and the original message → Binary.

Every message's transaction stores the message exactly as received (all segments, Z
segments included, in its original bytes) as a Binary, and a Provenance that says which
resources that message wrote:

| v2 | Provenance | notes |
|---|---|---|
| (every other entry) | target | each resource the message created, updated or referenced |
| (now) | recorded | when the gateway received the message |
| EVN-2 (else MSH-7) | occurredDateTime | when the sender says the event happened |
| MSH-9.2 | activity | table 0003 event type |
| EVN-4 | reason | table 0062 event reason |
| MSH-3 / MSH-4 | agent (type author) | logical reference: the sending application at its facility |
| (Binary) | entity (role source) | the stored original message |

| (message) | Binary | |
|---|---|---|
| raw bytes | data | base64, unchanged |
| | contentType | ``x-application/hl7-v2+er7`` |
| (Patient) | securityContext | so access to the message follows access to the patient |
"""

from __future__ import annotations

import base64
from typing import Any

from hl7_gateway.v2_to_fhir.codes import local_system, table_coding
from hl7_gateway.v2_to_fhir.context import MappingContext
from hl7_gateway.v2_to_fhir.datatypes import fhir_datetime

__all__ = ["HL7_V2_MEDIA_TYPE", "MESSAGE_KEY", "add_provenance", "add_source_message"]

JSON = dict[str, Any]
HL7_V2_MEDIA_TYPE = "x-application/hl7-v2+er7"
MESSAGE_KEY = "Binary:message"
PROVENANCE_KEY = "Provenance:message"
AGENT_TYPE = "http://terminology.hl7.org/CodeSystem/provenance-participant-type"


def add_source_message(ctx: MappingContext, raw: bytes, patient: JSON | None) -> JSON:
    """Stage the original message as a Binary."""
    binary: JSON = {"resourceType": "Binary", "contentType": HL7_V2_MEDIA_TYPE,
                    "data": base64.b64encode(raw).decode("ascii")}
    if patient is not None:
        binary["securityContext"] = patient
    return ctx.builder.post(MESSAGE_KEY, binary)


def _agent(ctx: MappingContext) -> JSON:
    app, facility = ctx.sending_app, ctx.sending_facility
    who: JSON = {"type": "Device",
                 "display": f"{app} at {facility}" if app and facility else app or facility
                 or "unknown sender",
                 "identifier": {"system": local_system("sending-application"),
                                "value": f"{app}^{facility}"}}
    return {"type": {"coding": [{"system": AGENT_TYPE, "code": "author"}]}, "who": who}


def add_provenance(ctx: MappingContext) -> JSON:
    """Stage the Provenance of everything staged so far; call it last."""
    targets = [ctx.builder.reference(key) for key in ctx.builder.entries
               if key != MESSAGE_KEY]
    provenance: JSON = {
        "resourceType": "Provenance",
        "target": targets,
        "recorded": ctx.received_at.isoformat(timespec="milliseconds"),
        "agent": [_agent(ctx)],
        "entity": [{"role": "source", "what": ctx.builder.reference(MESSAGE_KEY)}],
    }
    activity = table_coding("0003", ctx.event) if ctx.event else None
    if activity:
        provenance["activity"] = {"coding": [activity]}
    evn = ctx.message.segment("EVN")
    when = (evn.component(2, 1) if evn is not None else "") or ctx.message.msh.component(7, 1)
    occurred = fhir_datetime(when, ctx.default_tz) if when.strip() else None
    if occurred:
        provenance["occurredDateTime"] = occurred
    reason = table_coding("0062", evn.component(4, 1)) if evn is not None else None
    if reason:
        provenance["reason"] = [{"coding": [reason]}]
    return ctx.builder.post(PROVENANCE_KEY, provenance)
