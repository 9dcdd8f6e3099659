"""v2 → FHIR: one parsed v2 message becomes one FHIR transaction Bundle (pure functions).

Message families, one module each (their docstrings hold the mapping tables):

| message | module | main resources |
|---|---|---|
| ADT^A01/02/03/04/05/08/11/13/28/31/40 | ``adt`` | Patient, Encounter (+ RelatedPerson, Coverage, |
|  |  | AllergyIntolerance, Condition) |
| ORU^R01 | ``oru`` | DiagnosticReport, Observation, Specimen, ServiceRequest |
| ORM^O01, OML^O21 | ``orders`` | ServiceRequest (+ Observation, Specimen, Condition) |
| VXU^V04 | ``vxu`` | Immunization |
| SIU^S12-S15 | ``siu`` | Appointment |
| MDM^T02/T04 | ``mdm`` | DocumentReference |

Shared segment mappers: ``pid`` (Patient), ``pv1`` (Encounter, Location), ``nk1``, ``in1``,
``al1``, ``dg1``, ``obr`` (ServiceRequest, DiagnosticReport), ``obx`` (Observation),
``spm`` (Specimen), ``provenance`` (Binary + Provenance, in every transaction); v2 data
types in ``datatypes``, code tables as data in ``v2_maps.json`` (read by ``codes``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, tzinfo
from typing import Any

from hl7_gateway.ack import ErrorDetail
from hl7_gateway.parser import Message
from hl7_gateway.v2_to_fhir.adt import ADT_EVENTS, map_adt
from hl7_gateway.v2_to_fhir.bundle import Entry
from hl7_gateway.v2_to_fhir.context import MappingContext, MappingError
from hl7_gateway.v2_to_fhir.mdm import map_mdm
from hl7_gateway.v2_to_fhir.orders import map_order
from hl7_gateway.v2_to_fhir.oru import map_oru
from hl7_gateway.v2_to_fhir.pid import PATIENT
from hl7_gateway.v2_to_fhir.provenance import add_provenance, add_source_message
from hl7_gateway.v2_to_fhir.siu import SIU_EVENTS, map_siu
from hl7_gateway.v2_to_fhir.vxu import map_vxu

__all__ = [
    "SUPPORTED_MESSAGES",
    "MappedMessage",
    "MappingError",
    "map_message",
]

JSON = dict[str, Any]

_MAPPERS: dict[str, tuple[frozenset[str], Callable[[MappingContext], None]]] = {
    "ADT": (frozenset(ADT_EVENTS), map_adt),
    "ORU": (frozenset({"R01"}), map_oru),
    "ORM": (frozenset({"O01"}), map_order),
    "OML": (frozenset({"O21"}), map_order),
    "VXU": (frozenset({"V04"}), map_vxu),
    "SIU": (frozenset(SIU_EVENTS), map_siu),
    "MDM": (frozenset({"T02", "T04"}), map_mdm),
}

# Message type → accepted trigger events (for the header check: codes 200 / 201).
SUPPORTED_MESSAGES: Mapping[str, frozenset[str]] = {k: v[0] for k, v in _MAPPERS.items()}


@dataclass
class MappedMessage:
    """The transaction for one message, and what the gateway needs around it."""

    message: Message
    entries: list[Entry]
    warnings: list[ErrorDetail] = field(default_factory=list)
    # Segments not stored while the rest is (severity E): the message is answered AE.
    errors: list[ErrorDetail] = field(default_factory=list)

    @property
    def bundle(self) -> JSON:
        return {"resourceType": "Bundle", "type": "transaction",
                "entry": [e.to_json() for e in self.entries]}

    @property
    def merges(self) -> list[Entry]:
        """Conditional updates to lay over the stored resource instead of replacing it."""
        return [e for e in self.entries if e.merge]

    def resources(self, resource_type: str) -> list[Entry]:
        return [e for e in self.entries if e.resource["resourceType"] == resource_type]


def map_message(message: Message, raw: bytes, *, received_at: datetime,
                default_tz: tzinfo) -> MappedMessage:
    """Map a parsed message (header already checked) to its transaction.

    Raises :class:`MappingError` (carrying the ERR detail) when the message cannot be
    stored; segments that could not be stored while the rest can are listed in
    ``MappedMessage.errors``, values that had to be dropped in ``MappedMessage.warnings``.
    """
    events, mapper = _MAPPERS[message.message_type]
    if message.trigger_event not in events:
        raise KeyError(f"{message.message_type}^{message.trigger_event} is not supported")
    ctx = MappingContext(message, received_at, default_tz)
    mapper(ctx)
    patient = ctx.builder.reference(PATIENT) if ctx.builder.has(PATIENT) else None
    add_source_message(ctx, raw, patient)
    add_provenance(ctx)
    return MappedMessage(message, list(ctx.builder.entries.values()), ctx.warnings,
                         ctx.errors)
