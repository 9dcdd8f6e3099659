"""What every segment mapper shares while one message is mapped.

A :class:`MappingContext` holds the parsed message, the transaction being built, the time
zone for v2 timestamps that carry none, and what went wrong on the way:

- warnings: values that had to be dropped; they travel back to the sender as ERR
  segments of severity W on the AA;
- errors: lines (segments) that could not be stored while the rest of the message was,
  one result of a lab report without its OBX-3, say; ERR segments of severity E naming
  the segment and field, on an AE (the message is stored, not whole);
- a :class:`MappingError`: a problem that makes the whole message unusable; it names the
  segment and field, and becomes an AE with that location, nothing stored.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import datetime, tzinfo
from functools import cached_property

from hl7_gateway.ack import ErrorDetail, Severity
from hl7_gateway.parser import Message, Segment
from hl7_gateway.v2_to_fhir.bundle import TransactionBuilder

__all__ = ["MappingContext", "MappingError", "message_namespace"]

# Root of the deterministic fullUrls: uuid5(NAMESPACE_URL, "urn:healthplatform:hl7v2").
_ROOT = uuid.uuid5(uuid.NAMESPACE_URL, "urn:healthplatform:hl7v2")


def message_namespace(sending_app: str, sending_facility: str, control_id: str) -> uuid.UUID:
    """The UUID namespace of one message, from its idempotency key (MSH-3, MSH-4, MSH-10)."""
    return uuid.uuid5(_ROOT, f"{sending_app}|{sending_facility}|{control_id}")


class MappingError(Exception):
    """The message cannot become FHIR resources; ``detail`` is the ERR to send back."""

    def __init__(self, detail: ErrorDetail) -> None:
        super().__init__(str(detail.message))
        self.detail = detail


@dataclass
class MappingContext:
    message: Message
    received_at: datetime
    default_tz: tzinfo
    builder: TransactionBuilder = field(init=False)
    warnings: list[ErrorDetail] = field(default_factory=list)
    errors: list[ErrorDetail] = field(default_factory=list)
    segments: list[Segment] = field(init=False)
    _positions: dict[int, int] = field(init=False)

    def __post_init__(self) -> None:
        self.builder = TransactionBuilder(
            message_namespace(self.sending_app, self.sending_facility, self.control_id))
        self.segments = self.message.segments()
        self._positions = {id(seg): i for i, seg in enumerate(self.segments)}

    def following(self, segment: Segment) -> list[Segment]:
        """The segments after ``segment``, in message order."""
        return self.segments[self._positions[id(segment)] + 1:]

    # -- the header, as the mappers need it ------------------------------------------------
    @cached_property
    def sending_app(self) -> str:
        return self.message.msh.component(3, 1) or self.message.msh.component(3, 2)

    @cached_property
    def sending_facility(self) -> str:
        return self.message.msh.component(4, 1) or self.message.msh.component(4, 2)

    @cached_property
    def sender(self) -> str:
        """Scope for values that are only unique at the sender (local codes, bare ids)."""
        return self.sending_facility or self.sending_app or "unknown-sender"

    @property
    def control_id(self) -> str:
        return self.message.control_id

    @property
    def event(self) -> str:
        return self.message.trigger_event

    # -- problems --------------------------------------------------------------------------
    def sequence_of(self, segment: Segment) -> int:
        """1-based occurrence of ``segment`` among the message's segments of its type."""
        same = self.message.segments(segment.id)
        return next((i for i, s in enumerate(same, 1) if s is segment), 1)

    def _detail(self, code: int, text: str, segment: Segment, field_no: int | None,
                severity: Severity) -> ErrorDetail:
        label = f"{segment.id}-{field_no}" if field_no else segment.id
        return ErrorDetail(code, f"{label}: {text}", segment.id, self.sequence_of(segment),
                           field_no, severity=severity)

    def warn(self, segment: Segment, field_no: int, text: str, code: int = 102) -> None:
        """A value was dropped; the message is still accepted (ERR severity W)."""
        self.warnings.append(self._detail(code, text, segment, field_no, Severity.WARNING))

    def skip(self, segment: Segment, field_no: int, text: str, code: int = 101) -> None:
        """This segment cannot be stored, the rest of the message is (ERR severity E)."""
        self.errors.append(self._detail(code, text, segment, field_no, Severity.ERROR))

    def fail(self, segment: Segment | None, field_no: int | None, text: str,
             code: int = 101) -> MappingError:
        """A MappingError to raise: the message cannot be stored."""
        if segment is None:
            return MappingError(ErrorDetail(code, text))
        return MappingError(self._detail(code, text, segment, field_no, Severity.ERROR))
