"""HL7 v2 batch files: FHS/BHS envelopes split into their messages.

Responsible for the batch protocol of HL7 v2 chapter 2 (`[FHS] {[BHS] {MSH...} [BTS]}
[FTS]`): it groups segments into messages, keeps the file and batch header and trailer
segments, and reports where a trailer's message or batch count disagrees with what
was found. Each message is a `hl7_gateway.parser.Message` like any other.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hl7_gateway.parser import (
    HEADER_SEGMENTS,
    Delimiters,
    HL7ParseError,
    Message,
    Segment,
    decode_message,
    split_segments,
)

__all__ = ["Batch", "BatchFile", "parse_batch", "split_batch"]

_ENVELOPE = frozenset({"FHS", "BHS", "BTS", "FTS"})


@dataclass
class Batch:
    """One BHS..BTS group (the header and trailer are optional in practice)."""

    header: Segment | None = None
    trailer: Segment | None = None
    messages: list[Message] = field(default_factory=list)


@dataclass
class BatchFile:
    """A whole batch file: its FHS/FTS and the batches inside."""

    header: Segment | None = None
    trailer: Segment | None = None
    batches: list[Batch] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def messages(self) -> list[Message]:
        """Every message of every batch, in file order."""
        return [m for b in self.batches for m in b.messages]


def _count_warnings(batch_file: BatchFile) -> list[str]:
    warnings: list[str] = []
    for number, batch in enumerate(batch_file.batches, 1):
        declared = batch.trailer.field(1) if batch.trailer else ""
        if declared.isdecimal() and int(declared) != len(batch.messages):
            warnings.append(
                f"BTS-1 of batch {number} declares {declared} messages, found {len(batch.messages)}"
            )
    declared = batch_file.trailer.field(1) if batch_file.trailer else ""
    if declared.isdecimal() and int(declared) != len(batch_file.batches):
        warnings.append(f"FTS-1 declares {declared} batches, found {len(batch_file.batches)}")
    return warnings


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
    builder.file.warnings = warnings + repairs + _count_warnings(builder.file)
    return builder.file


def _delimiters_of(line: str, fallback: Delimiters) -> Delimiters:
    try:
        return Delimiters.from_header(line)
    except HL7ParseError:
        return fallback


def split_batch(raw: bytes | str) -> list[Message]:
    """The messages of a batch file, envelope segments dropped."""
    return parse_batch(raw).messages
