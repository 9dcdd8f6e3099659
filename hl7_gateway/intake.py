"""One payload from a door of the gateway (an MLLP frame, an HTTP body) to its answer.

Both doors take the same payloads and answer them the same way:

- ``#`` lines before the first segment are dropped (the provenance notes the shared
  sample files start with; they are not HL7);
- a single message goes to :meth:`HL7Gateway.process` and is answered with its ACKs;
- a batch file (``FHS``/``BHS`` ... ``BTS``/``FTS``, HL7 v2.5.1 2.10.3) has each of its
  messages processed on its own, exactly as if it had come alone (its own idempotency
  key, transaction, ACKs and dead letter), and is answered with one acknowledgement
  batch holding every message's ACKs (:func:`hl7_gateway.batch.build_batch_ack`);
- a batch whose trailer counts disagree with what arrived (BTS-1 messages, FTS-1
  batches) was cut short or spliced on its way, so what it holds is not what was sent:
  none of its messages is processed, each is answered AR (CR in enhanced mode, when
  MSH-15 asks) with an ERR naming the count, and the sender resends the batch. Nothing
  is kept of it: a resend is processed afresh.

Over MLLP the acknowledgement batch is one frame, as the batch was.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from hl7_gateway.ack import ErrorDetail, Outcome, new_control_id
from hl7_gateway.batch import (
    BatchFile,
    build_batch_ack,
    is_batch,
    parse_batch,
    strip_comment_lines,
)
from hl7_gateway.gateway import HL7Gateway, Processed, build_acks, kind_of
from hl7_gateway.parser import HL7ParseError, Message, encode_message

__all__ = ["BatchProcessed", "mllp_handler", "receive"]

JSON = dict[str, Any]
_WORST = (Outcome.REJECT, Outcome.ERROR, Outcome.ACCEPT)


@dataclass
class BatchProcessed:
    """What became of a batch file: each message, and the acknowledgement batch."""

    ack: str
    messages: list[Processed]
    control_id: str = ""  # FHS-11, else BHS-11 of the first batch
    errors: list[ErrorDetail] = field(default_factory=list)  # the batch's own (counts)

    @property
    def outcome(self) -> Outcome:
        """The worst outcome of its messages (accept for an empty batch)."""
        found = {m.outcome for m in self.messages}
        return next((o for o in _WORST if o in found), Outcome.ACCEPT)

    def to_json(self) -> JSON:
        return {"batch": True, "outcome": self.outcome.value, "ack": self.ack,
                "control_id": self.control_id,
                "messages": [m.to_json() for m in self.messages],
                "errors": [{"code": e.code, "severity": e.severity.value,
                            "message": e.message, "segment": e.segment or None,
                            "field": e.field} for e in self.errors]}


async def receive(gateway: HL7Gateway, raw: bytes) -> Processed | BatchProcessed:
    """Process one payload: a message, or a batch file (module docstring)."""
    payload = strip_comment_lines(raw)
    if not is_batch(payload):
        return await gateway.process(payload)
    try:
        batch_file = parse_batch(payload)
    except HL7ParseError:
        # No usable envelope: the gateway NAKs it and keeps it as it does any such input.
        return await gateway.process(payload)
    return await _process_batch(gateway, batch_file)


async def mllp_handler(gateway: HL7Gateway, raw: bytes) -> list[bytes]:
    """The frames answering one MLLP frame, in order."""
    received = await receive(gateway, raw)
    if isinstance(received, BatchProcessed):
        return [encode_message(received.ack)]
    return [encode_message(ack) for ack in received.acks]


async def _process_batch(gateway: HL7Gateway, batch_file: BatchFile) -> BatchProcessed:
    processed: list[Processed] = []
    acks: list[list[str]] = []
    comments: list[str] = []
    errors: list[ErrorDetail] = []
    for batch in batch_file.batches:
        refusal = batch_file.count_error or batch.count_error
        if refusal:
            errors.append(_count_detail(refusal))
        done = [await _one(gateway, message, refusal) for message in batch.messages]
        processed += done
        acks.append([ack for p in done for ack in p.acks])
        comments.append(f"refused whole: {refusal}" if refusal else _summary(done))
    file_comment = (f"refused whole: {batch_file.count_error}" if batch_file.count_error
                    else _summary(processed))
    ack = build_batch_ack(batch_file, acks, comments, file_comment,
                          control_id=new_control_id(),
                          timestamp=datetime.now().astimezone())
    return BatchProcessed(ack, processed, _control_id(batch_file), errors)


async def _one(gateway: HL7Gateway, message: Message, refusal: str | None) -> Processed:
    if refusal is None:
        return await gateway.process(encode_message(message.to_er7()))
    detail = ErrorDetail(199, f"the batch is refused whole ({refusal}): send it again")
    return Processed(Outcome.REJECT, build_acks(message, Outcome.REJECT, [detail], safe=False),
                     [detail], message.control_id, kind_of(message))


def _count_detail(refusal: str) -> ErrorDetail:
    segment = "FTS" if refusal.startswith("FTS") else "BTS"
    return ErrorDetail(199, refusal, segment, 1, 1)


def _summary(done: Sequence[Processed]) -> str:
    counts = {o: sum(1 for p in done if p.outcome is o) for o in _WORST}
    return (f"{len(done)} messages: {counts[Outcome.ACCEPT]} accepted, "
            f"{counts[Outcome.ERROR]} with errors, {counts[Outcome.REJECT]} rejected")


def _control_id(batch_file: BatchFile) -> str:
    if batch_file.header is not None:
        return batch_file.header.field(11)
    first = batch_file.batches[0].header if batch_file.batches else None
    return first.field(11) if first is not None else ""
