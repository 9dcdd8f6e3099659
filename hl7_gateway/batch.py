"""HL7 v2 batch files: FHS/BHS envelopes split into their messages, and acknowledged.

Responsible for the batch protocol of HL7 v2 chapter 2 (v2.5.1 2.10.3: `[FHS] {[BHS]
{MSH...} [BTS]} [FTS]`): it groups segments into messages, keeps the file and batch
header and trailer segments, and reports where a trailer's message or batch count
disagrees with what was found. Each message is a `hl7_gateway.parser.Message` like any
other.

The acknowledgement of a batch is itself a batch (2.10.3.3, "all messages are
acknowledged in the response batch"): the same envelope as the batch received, each
header answering its own (sender and receiver swapped, a new control id in FHS-11 /
BHS-11, the received one in FHS-12 / BHS-12, the reference file / batch control id), the
ACKs of every message inside in order, BTS-1 / FTS-1 counting what the answer holds and
BTS-2 / FTS-2 saying in words what became of the messages.

Lines starting with ``#`` before the first segment (provenance notes of sample files) are
not HL7 and are dropped before anything is read (:func:`strip_comment_lines`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime

from hl7_gateway.parser import (
    DEFAULT_DELIMITERS,
    HEADER_SEGMENTS,
    Delimiters,
    HL7ParseError,
    Message,
    Segment,
    decode_message,
    escape,
    split_segments,
)

__all__ = ["Batch", "BatchFile", "build_batch_ack", "is_batch", "parse_batch", "split_batch",
           "strip_comment_lines"]

_BOM = b"\xef\xbb\xbf"

_ENVELOPE = frozenset({"FHS", "BHS", "BTS", "FTS"})


@dataclass
class Batch:
    """One BHS..BTS group (the header and trailer are optional in practice)."""

    header: Segment | None = None
    trailer: Segment | None = None
    messages: list[Message] = field(default_factory=list)
    count_error: str | None = None  # BTS-1 disagrees with the messages found


@dataclass
class BatchFile:
    """A whole batch file: its FHS/FTS and the batches inside."""

    header: Segment | None = None
    trailer: Segment | None = None
    batches: list[Batch] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    count_error: str | None = None  # FTS-1 disagrees with the batches found

    @property
    def messages(self) -> list[Message]:
        """Every message of every batch, in file order."""
        return [m for b in self.batches for m in b.messages]


def strip_comment_lines(raw: bytes) -> bytes:
    """``raw`` without the ``#`` lines before its first segment (a BOM is kept)."""
    bom = _BOM if raw.startswith(_BOM) else b""
    rest = raw[len(bom):]
    while rest.startswith(b"#"):
        ends = [i for i in (rest.find(b"\r"), rest.find(b"\n")) if i >= 0]
        rest = rest[min(ends) + 1:] if ends else b""
        rest = rest.lstrip(b"\r\n")
    return bom + rest


def is_batch(raw: bytes) -> bool:
    """Whether ``raw`` is a batch file (it starts with FHS or BHS)."""
    return raw.removeprefix(_BOM).lstrip(b" \t\r\n\x0b")[:3] in {b"FHS", b"BHS"}


def _check_counts(batch_file: BatchFile) -> list[str]:
    """Set each batch's and the file's ``count_error`` where BTS-1 / FTS-1 declares
    another count than was found (a truncated or spliced batch); the texts, in order."""
    found: list[str] = []
    for number, batch in enumerate(batch_file.batches, 1):
        declared = batch.trailer.field(1).strip() if batch.trailer else ""
        if declared.isdecimal() and int(declared) != len(batch.messages):
            batch.count_error = (f"BTS-1 of batch {number} declares {declared} messages, "
                                 f"found {len(batch.messages)}")
            found.append(batch.count_error)
    declared = batch_file.trailer.field(1).strip() if batch_file.trailer else ""
    if declared.isdecimal() and int(declared) != len(batch_file.batches):
        batch_file.count_error = (f"FTS-1 declares {declared} batches, found "
                                  f"{len(batch_file.batches)}")
        found.append(batch_file.count_error)
    return found


class _Builder:
    """Assigns segments, in order, to the file, its batches and their messages."""

    def __init__(self, charset: str | None) -> None:
        self.file = BatchFile()
        self.charset = charset
        self.lines: list[Segment] = []

    def _batch(self) -> Batch:
        if not self.file.batches:
            self.file.batches.append(Batch())
        return self.file.batches[-1]

    def finish_message(self) -> None:
        if self.lines:
            msh = self.lines[0]
            self._batch().messages.append(Message(self.lines, msh.delimiters, charset=self.charset))
            self.lines = []

    def add(self, seg: Segment) -> None:
        if seg.id == "MSH" or seg.id in _ENVELOPE:
            self.finish_message()
        if seg.id == "FHS":
            self.file.header = seg
        elif seg.id == "BHS":
            self.file.batches.append(Batch(header=seg))
        elif seg.id == "BTS":
            self._batch().trailer = seg
        elif seg.id == "FTS":
            self.file.trailer = seg
        elif seg.id == "MSH" or self.lines:
            self.lines.append(seg)
        else:
            raise HL7ParseError(f"{seg.id} segment outside any message", seg.id, error_code=100)


def parse_batch(raw: bytes | str) -> BatchFile:
    """Parse a batch file (or a single message, which becomes a one-message batch)."""
    if isinstance(raw, bytes):
        decoded = decode_message(raw)
        text, charset = decoded.text, decoded.codec
        warnings = [decoded.warning] if decoded.warning else []
    else:
        text, charset, warnings = raw.removeprefix("\ufeff"), None, []
    lines, delimiters, repairs = split_segments(text)
    builder = _Builder(charset)
    codec = charset or "utf-8"
    current = delimiters
    for line in lines:
        # Each header segment inside a batch carries its own MSH-2 (FHS-2, BHS-2).
        if line[:3] in HEADER_SEGMENTS:
            current = _delimiters_of(line, current)
        builder.add(Segment(line, current, codec))
    builder.finish_message()
    builder.file.warnings = warnings + repairs + _check_counts(builder.file)
    return builder.file


def _delimiters_of(line: str, fallback: Delimiters) -> Delimiters:
    try:
        return Delimiters.from_header(line)
    except HL7ParseError:
        return fallback


def split_batch(raw: bytes | str) -> list[Message]:
    """The messages of a batch file, envelope segments dropped."""
    return parse_batch(raw).messages


# --- the acknowledgement batch -----------------------------------------------------------


def _reply_header(header: Segment, control_id: str, timestamp: datetime) -> str:
    """The FHS / BHS answering ``header`` (v2.5.1 2.15.6 FHS, 2.15.2 BHS: 3-6 applications
    and facilities, 7 date/time, 11 control id, 12 the control id answered)."""
    d = header.delimiters
    fields = [header.id, d.encoding_characters, header.raw_field(5), header.raw_field(6),
              header.raw_field(3), header.raw_field(4), timestamp.strftime("%Y%m%d%H%M%S%z"),
              "", "", "", escape(control_id, d), header.raw_field(11)]
    return d.field.join(fields).rstrip(d.field)


def _trailer(segment_id: str, count: int, comment: str, d: Delimiters) -> str:
    return d.field.join([segment_id, str(count), escape(comment, d)])


def build_batch_ack(batch_file: BatchFile, acks: Sequence[Sequence[str]],
                    comments: Sequence[str], file_comment: str, *, control_id: str,
                    timestamp: datetime) -> str:
    """The acknowledgement batch of ``batch_file`` (module docstring).

    ``acks``: per batch of the file, the ACK messages of its messages in order;
    ``comments``: per batch, BTS-2; ``file_comment``: FTS-2. Each header gets
    ``control_id`` with its position appended (``-F`` for the file, ``-B1``... batches),
    cut to fit FHS-11 / BHS-11 (ST, 20 characters in v2.5.1).
    """
    control_id = control_id[:15]
    lines: list[str] = []
    d = batch_file.header.delimiters if batch_file.header else DEFAULT_DELIMITERS
    if batch_file.header is not None:
        lines.append(_reply_header(batch_file.header, f"{control_id}-F", timestamp))
    for number, (batch, answers, comment) in enumerate(
            zip(batch_file.batches, acks, comments, strict=True), 1):
        batch_d = batch.header.delimiters if batch.header else d
        if batch.header is not None:
            lines.append(_reply_header(batch.header, f"{control_id}-B{number}", timestamp))
        lines += [ack.rstrip("\r") for ack in answers]
        if batch.header is not None or batch.trailer is not None:
            lines.append(_trailer("BTS", len(answers), comment, batch_d))
    if batch_file.header is not None or batch_file.trailer is not None:
        lines.append(_trailer("FTS", len(batch_file.batches), file_comment, d))
    return "\r".join(lines) + "\r"
