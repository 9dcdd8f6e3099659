"""SPM → Specimen.

| v2 | Specimen | notes |
|---|---|---|
| SPM-2 | identifier | filler-assigned id (else placer-assigned): the match key |
| SPM-4 | type | table 0487 |
| SPM-7 / SPM-8 | collection.method / collection.bodySite | |
| SPM-17 | collection.collectedDateTime (or collectedPeriod) | DR: start^end |
| SPM-18 | receivedTime | |
| SPM-24 | condition | |
| (PID) / (ORC-OBR) | subject / request | |

A specimen without SPM-2 is identified by its order's filler number and SPM-1, so a
resent or corrected result does not add a second one.
"""

from __future__ import annotations

from typing import Any

from hl7_gateway.parser import Segment
from hl7_gateway.v2_to_fhir.codes import local_system
from hl7_gateway.v2_to_fhir.context import MappingContext
from hl7_gateway.v2_to_fhir.datatypes import codeable, fhir_datetime, first, hd_system

__all__ = ["add_specimen"]

JSON = dict[str, Any]


def _identifier(spm: Segment, ctx: MappingContext, order_key: str) -> JSON:
    ids = first(spm, 2)
    if ids is not None:
        for c in (2, 1):  # filler-assigned first: it is the lab's own id
            value = ids.subcomponent(c, 1).strip()
            if value:
                system = (hd_system(ids.subcomponent(c, 2), ids.subcomponent(c, 3),
                                    ids.subcomponent(c, 4))
                          or local_system(ctx.sender, "specimen"))
                return {"system": system, "value": value}
    set_id = spm.field(1).strip() or str(ctx.sequence_of(spm))
    return {"system": local_system(ctx.sender, "specimen"), "value": f"{order_key}^{set_id}"}


def _collection(spm: Segment, ctx: MappingContext) -> JSON:
    collection: JSON = {}
    collected = first(spm, 17)
    if collected is not None:
        start = fhir_datetime(collected.subcomponent(1, 1) or collected.component(1),
                              ctx.default_tz)
        end = fhir_datetime(collected.component(2), ctx.default_tz) \
            if collected.component(2).strip() else None
        if start and end:
            collection["collectedPeriod"] = {"start": start, "end": end}
        elif start:
            collection["collectedDateTime"] = start
        elif collected.text.strip():
            ctx.warn(spm, 17, f"{collected.text!r} is not a valid date/time; dropped")
    method = codeable(first(spm, 7), ctx.sender, default_table="0488")
    if method:
        collection["method"] = method
    site = codeable(first(spm, 8), ctx.sender, default_table="0490")
    if site:
        collection["bodySite"] = site
    return collection


def add_specimen(ctx: MappingContext, spm: Segment, links: JSON, order_key: str) -> JSON:
    """Stage the Specimen of an SPM; ``links`` holds subject (and request)."""
    identifier = _identifier(spm, ctx, order_key)
    specimen: JSON = {"resourceType": "Specimen", "identifier": [identifier], **links}
    kind = codeable(first(spm, 4), ctx.sender, default_table="0487")
    if kind:
        specimen["type"] = kind
    collection = _collection(spm, ctx)
    if collection:
        specimen["collection"] = collection
    received = spm.component(18, 1).strip()
    if received:
        moment = fhir_datetime(received, ctx.default_tz)
        if moment:
            specimen["receivedTime"] = moment
        else:
            ctx.warn(spm, 18, f"{received!r} is not a valid date/time; dropped")
    condition = [c for rep in spm.repetitions(24)
                 if (c := codeable(rep, ctx.sender, default_table="0493"))]
    if condition:
        specimen["condition"] = condition
    key = f"Specimen:{identifier['system']}|{identifier['value']}"
    return ctx.builder.upsert(key, specimen, identifier)
