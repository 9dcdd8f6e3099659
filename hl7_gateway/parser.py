"""Hot-path HL7 v2 tokenizer: bytes in, a light `Message` of lazily split segments out.

Responsible for turning one HL7 v2 message (versions 2.2 to 2.8) into segments and
fields without a schema: charset selection from MSH-18, delimiters from MSH-1/MSH-2,
escape sequences decoded when a value is read, and repair of the damage that real
feeds and copy-pasted samples carry (LF or CRLF separators, a BOM, trailing
whitespace, blank lines, wrapped lines, segments glued together with spaces).

Field numbers are 1-based as in the standard: in MSH, FHS and BHS field 1 is the
field separator itself and field 2 the encoding characters, so `msh.field(9)` is the
message type and `msh.field(10)` the control id. Structure and validation against a
message definition are not done here; `hl7_gateway.ack` checks the header.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from functools import lru_cache
from typing import NamedTuple

__all__ = [
    "DEFAULT_DELIMITERS",
    "HEADER_SEGMENTS",
    "STANDARD_SEGMENT_IDS",
    "Decoded",
    "Delimiters",
    "HL7ParseError",
    "Message",
    "Repetition",
    "Segment",
    "codec_for_charset",
    "decode_message",
    "encode_message",
    "escape",
    "parse",
    "parse_version",
    "read_msh_leniently",
    "shown",
    "split_segments",
    "unescape",
]


def shown(value: str) -> str:
    """``value`` quoted for an error text that travels in an ACK (ERR-8, MSA-3).

    Not ``repr()``: its backslashes would be escaped once by Python and again by HL7
    (``\\E\\``), so the sender would read ``^~\\\\&`` for the ``^~\\&`` it sent. Only
    characters that cannot be shown (control characters) are written as ``\\xNN``.
    """
    visible = "".join(c if c.isprintable() else f"\\x{ord(c):02x}" for c in value)
    return f"'{visible}'"


class HL7ParseError(ValueError):
    """The input has no usable MSH, so no delimiters and no header can be trusted.

    `error_code` is the HL7 table 0357 code an ACK should carry for this failure.
    """

    def __init__(
        self,
        message: str,
        segment: str | None = None,
        field: int | None = None,
        *,
        error_code: int = 199,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.segment = segment
        self.field = field
        self.error_code = error_code

    def __str__(self) -> str:
        if self.segment is None:
            return self.message
        where = self.segment if self.field is None else f"{self.segment}-{self.field}"
        return f"{where}: {self.message}"


# Segments whose field 1 is the field separator and field 2 the encoding characters.
HEADER_SEGMENTS = frozenset({"MSH", "FHS", "BHS"})

# Segment IDs defined in HL7 v2.2-2.8. Only used to recognise segments glued to the
# previous one with a space, where a looser pattern would split ordinary text.
STANDARD_SEGMENT_IDS = frozenset(
    """
ABS ACC ADD ADJ AFF AIG AIL AIP AIS AL1 APR ARQ ARV AUT BHS BLC BLG BPO BPX BTS BTX
BUI CDM CDO CER CM0 CM1 CM2 CNS CON CSP CSR CSS CTD CTI DB1 DG1 DMI DON DRG DSC DSP
ECD ECR EDU EQL EQP EQU ERQ ERR EVN FAC FHS FT1 FTS GOL GP1 GP2 GT1 IAM IAR IIM ILT
IN1 IN2 IN3 INV IPC IPR ISD ITM IVC IVT LAN LCC LCH LDP LOC LRL MCP MFA MFE MFI MRG
MSA MSH NCK NDS NK1 NPU NSC NST NTE OBR OBX ODS ODT OM1 OM2 OM3 OM4 OM5 OM6 OM7 OMC
ORC ORG OVR PAC PCE PCR PD1 PDA PDC PEO PES PID PKG PMT PR1 PRA PRB PRC PRD PRT PSG
PSH PSL PSS PTH PV1 PV2 PYE QAK QID QPD QRD QRF QRI RAR RAS RCP RDF RDT REL RF1 RGS
RMI ROL RQ1 RQD RXA RXC RXD RXE RXG RXO RXR RXV SAC SCD SCH SCP SDD SFT SGH SGT SHP
SID SLT SPD SPM SPR STF STZ TCC TCD TQ1 TQ2 TXA UAC UB1 UB2 URD URS VAR VND VTQ
""".split()
)

_SEGMENT_ID = re.compile(r"[A-Z][A-Z0-9]{2}")
_BOM = b"\xef\xbb\xbf"
_LEADING_JUNK = " \t\r\n\x0b\x1c\ufeff"


@dataclass(frozen=True, slots=True)
class Delimiters:
    """The separators of one message, read from MSH-1 and MSH-2."""

    field: str = "|"
    component: str = "^"
    repetition: str = "~"
    escape: str = "\\"
    subcomponent: str = "&"
    truncation: str = ""  # MSH-2 position 5, introduced in v2.7

    @classmethod
    def from_header(cls, header: str) -> Delimiters:
        """Read the delimiters from an MSH/FHS/BHS line; raise `HL7ParseError` if unusable."""
        seg_id = header[:3]
        if len(header) < 5:
            raise HL7ParseError("too short to hold delimiters", seg_id, 1, error_code=102)
        sep = header[3]
        end = header.find(sep, 4)
        chars = header[4:] if end < 0 else header[4:end]
        if sep.isalnum() or sep.isspace():
            raise HL7ParseError(f"invalid field separator {shown(sep)}", seg_id, 1, error_code=102)
        invalid = (
            not chars
            or len(chars) > 5
            or len(set(chars)) != len(chars)
            or sep in chars
            or any(c.isalnum() or c.isspace() for c in chars)
        )
        if invalid:
            raise HL7ParseError(
                f"invalid encoding characters {shown(chars)}", seg_id, 2, error_code=102
            )
        return cls(sep, *chars, *[""] * (5 - len(chars)))

    @property
    def encoding_characters(self) -> str:
        """The MSH-2 value these delimiters are written as."""
        return "".join(
            (self.component, self.repetition, self.escape, self.subcomponent, self.truncation)
        )


DEFAULT_DELIMITERS = Delimiters()


# --- charsets -------------------------------------------------------------------

# MSH-18 values (HL7 table 0211) mapped to Python codecs. UTF-16/32 ("UNICODE", "UNICODE
# UTF-16/32") are absent on purpose: such bytes do not start with an ASCII "MSH".
_CHARSET_CODECS = {
    "ASCII": "ascii",
    "ISO IR6": "ascii",
    "8859/1": "latin-1",
    "ISO IR100": "latin-1",
    "8859/2": "iso8859-2",
    "ISO IR101": "iso8859-2",
    "8859/3": "iso8859-3",
    "ISO IR109": "iso8859-3",
    "8859/4": "iso8859-4",
    "ISO IR110": "iso8859-4",
    "8859/5": "iso8859-5",
    "ISO IR144": "iso8859-5",
    "8859/6": "iso8859-6",
    "ISO IR127": "iso8859-6",
    "8859/7": "iso8859-7",
    "ISO IR126": "iso8859-7",
    "8859/8": "iso8859-8",
    "ISO IR138": "iso8859-8",
    "8859/9": "iso8859-9",
    "ISO IR148": "iso8859-9",
    "8859/15": "iso8859-15",
    "UNICODE UTF-8": "utf-8",
    "UTF-8": "utf-8",
    "ISO IR192": "utf-8",
    "ISO IR87": "iso2022_jp",
    "ISO IR159": "iso2022_jp_1",
    "GB 18030-2000": "gb18030",
    "KS X 1001": "euc_kr",
    "BIG-5": "big5",
}

_MSH_IN_BYTES = re.compile(rb"(?:\A|[\r\n])[ \t\x0b]*(?:\xef\xbb\xbf)?MSH")


def codec_for_charset(charset: str) -> str | None:
    """Python codec for an MSH-18 value, or None if the value is empty or unknown."""
    return _CHARSET_CODECS.get(charset.strip().upper()) if charset else None


class Decoded(NamedTuple):
    text: str
    codec: str
    warning: str | None


def _declared_charset(raw: bytes) -> str:
    """MSH-18 (first repetition, first component) read straight from the bytes."""
    found = _MSH_IN_BYTES.search(raw)
    if found is None or len(raw) < found.end() + 2:
        return ""
    start = found.end() - 3
    sep = raw[start + 3 : start + 4]
    ends = [i for i in (raw.find(b"\r", start), raw.find(b"\n", start)) if i >= 0]
    parts = raw[start : min(ends, default=len(raw))].split(sep)
    if len(parts) < 18:
        return ""
    value = parts[17]
    for delimiter in parts[1][:2]:  # component, repetition
        value = value.split(bytes((delimiter,)))[0]
    return value.decode("ascii", "replace")


def decode_message(raw: bytes) -> Decoded:
    """Decode message bytes: a BOM means UTF-8, else MSH-18, else UTF-8, else Latin-1.

    A message whose bytes contradict its MSH-18 is still decoded (senders often declare
    ASCII and send UTF-8), and the mismatch is reported as a warning.
    """
    if raw.startswith(_BOM):
        raw = raw[3:]
        declared = "utf-8"
    else:
        declared = codec_for_charset(_declared_charset(raw)) or ""
    for codec in dict.fromkeys(c for c in (declared, "utf-8") if c):
        try:
            text = raw.decode(codec)
        except UnicodeDecodeError:
            continue
        warning = (
            None
            if not declared or codec == declared
            else (f"bytes are not valid {declared} as MSH-18 declares; decoded as {codec}")
        )
        return Decoded(text, codec, warning)
    warning = "bytes are not valid UTF-8; decoded as Latin-1"
    return Decoded(raw.decode("latin-1"), "latin-1", warning)


def encode_message(text: str) -> bytes:
    """Encode message text in the charset its MSH-18 declares (UTF-8 if none)."""
    codec = "utf-8"
    if "MSH" in text[:8]:
        header = text.lstrip(_LEADING_JUNK).split("\r", 1)[0]
        try:
            msh = Segment(header, Delimiters.from_header(header))
            codec = codec_for_charset(msh.component(18, 1)) or "utf-8"
        except HL7ParseError:
            pass
    # A character the declared charset cannot carry becomes "?" rather than failing the
    # whole message (an ACK must always be sendable).
    return text.encode(codec, errors="replace")


# --- escape sequences -----------------------------------------------------------


def _decode_hex(hex_digits: str, codec: str) -> str | None:
    try:
        return bytes.fromhex(hex_digits).decode(codec, errors="replace")
    except ValueError:
        return None


def _escape_replacement(seq: str, d: Delimiters, codec: str) -> str | None:
    """Text for one escape sequence (without its escape characters); None keeps it as-is."""
    # \H\ and \N\ switch highlighting on and off, which plain text cannot show.
    simple = {
        "F": d.field,
        "S": d.component,
        "T": d.subcomponent,
        "R": d.repetition,
        "E": d.escape,
        "P": d.truncation or None,
        "H": "",
        "N": "",
    }
    if seq in simple:
        return simple[seq]
    head = seq[:1]
    if head == "X" and len(seq) > 1:
        return _decode_hex(seq[1:], codec)
    if seq == ".br":
        return "\n"
    if seq.startswith(".sp"):
        count = seq[3:].strip()
        # The count comes from the sender: bounded so one value cannot balloon in memory.
        return "\n" * (min(int(count), 100) if count.isdecimal() else 1)
    # Formatting commands of FT (.in, .ti, .sk, .ce, .fi, .nf) have no plain-text form,
    # and character-set switches (C, M) cannot be honoured in already decoded text.
    if seq[:3] in {".in", ".ti", ".sk", ".ce", ".fi", ".nf"} or head in {"C", "M"}:
        return ""
    return None


def unescape(value: str, delimiters: Delimiters = DEFAULT_DELIMITERS, codec: str = "utf-8") -> str:
    """Decode HL7 escape sequences; unknown or unterminated sequences are kept verbatim."""
    esc = delimiters.escape
    if not esc or esc not in value:
        return value
    out: list[str] = []
    pos = 0
    while (start := value.find(esc, pos)) >= 0:
        end = value.find(esc, start + 1)
        if end < 0:
            break
        replacement = _escape_replacement(value[start + 1 : end], delimiters, codec)
        if replacement is None:
            out.append(value[pos:end])
            pos = end  # the closing escape may open the next sequence
            continue
        out.append(value[pos:start])
        out.append(replacement)
        pos = end + 1
    out.append(value[pos:])
    return "".join(out)


def escape(value: str, delimiters: Delimiters = DEFAULT_DELIMITERS) -> str:
    """Encode text for use as one HL7 value: delimiters escaped, line breaks as \\.br\\."""
    d = delimiters
    e = d.escape or "\\"
    if e in value:
        value = value.replace(e, f"{e}E{e}")
    for char, code in (
        (d.field, "F"),
        (d.component, "S"),
        (d.subcomponent, "T"),
        (d.repetition, "R"),
        (d.truncation, "P"),
    ):
        if char and char in value:
            value = value.replace(char, f"{e}{code}{e}")
    if "\r" in value or "\n" in value:
        value = value.replace("\r\n", "\n").replace("\r", "\n").replace("\n", f"{e}.br{e}")
    return value


# --- segments and fields --------------------------------------------------------


class Repetition:
    """One occurrence of a (possibly repeating) field, split into components on demand."""

    __slots__ = ("_codec", "_d", "raw")

    def __init__(self, raw: str, delimiters: Delimiters, codec: str = "utf-8") -> None:
        self.raw = raw
        self._d = delimiters
        self._codec = codec

    @property
    def text(self) -> str:
        """The value with escape sequences decoded (delimiters inside stay as they are)."""
        return unescape(self.raw, self._d, self._codec)

    def components(self) -> list[str]:
        return [unescape(c, self._d, self._codec) for c in self.raw.split(self._d.component)]

    def component(self, c: int) -> str:
        parts = self.raw.split(self._d.component)
        return unescape(parts[c - 1], self._d, self._codec) if 0 < c <= len(parts) else ""

    def subcomponent(self, c: int, s: int) -> str:
        parts = self.raw.split(self._d.component)
        if not 0 < c <= len(parts):
            return ""
        subs = parts[c - 1].split(self._d.subcomponent) if self._d.subcomponent else [parts[c - 1]]
        return unescape(subs[s - 1], self._d, self._codec) if 0 < s <= len(subs) else ""

    def __str__(self) -> str:
        return self.text

    def __repr__(self) -> str:
        return f"Repetition({self.raw!r})"


class Segment:
    """One segment; its fields are split from `raw` the first time one is read."""

    __slots__ = ("_codec", "_d", "_fields", "id", "raw")

    def __init__(self, raw: str, delimiters: Delimiters, codec: str = "utf-8") -> None:
        self.raw = raw
        self.id = raw[:3]
        self._d = delimiters
        self._codec = codec
        self._fields: list[str] | None = None

    @property
    def delimiters(self) -> Delimiters:
        return self._d

    def _split(self) -> list[str]:
        fields = self.raw.split(self._d.field)
        if self.id in HEADER_SEGMENTS:
            fields.insert(1, self._d.field)
        self._fields = fields
        return fields

    def _is_literal(self, n: int) -> bool:
        return n <= 2 and self.id in HEADER_SEGMENTS

    @property
    def field_count(self) -> int:
        """Number of the last field present (trailing empty fields included)."""
        return len(self._fields or self._split()) - 1

    def raw_field(self, n: int) -> str:
        """Field n exactly as encoded, all repetitions, escapes untouched; "" if absent."""
        fields = self._fields or self._split()
        return fields[n] if 0 < n < len(fields) else ""

    def field(self, n: int) -> str:
        """Field n as text with escapes decoded; use `component()` for composite values."""
        value = self.raw_field(n)
        if self._is_literal(n) or self._d.escape not in value:
            return value
        return unescape(value, self._d, self._codec)

    def repetitions(self, n: int) -> list[Repetition]:
        """The occurrences of field n (an empty field has none)."""
        value = self.raw_field(n)
        if not value:
            return []
        if self._is_literal(n):
            return [Repetition(value, self._d, self._codec)]
        reps = value.split(self._d.repetition) if self._d.repetition else [value]
        return [Repetition(r, self._d, self._codec) for r in reps]

    def components(self, n: int, rep: int = 1) -> list[str]:
        reps = self.repetitions(n)
        return reps[rep - 1].components() if 0 < rep <= len(reps) else []

    def component(self, n: int, c: int = 1, rep: int = 1) -> str:
        """Component c of repetition `rep` of field n, escapes decoded; "" if absent."""
        value = self.raw_field(n)
        if self._is_literal(n):
            return value if c == 1 and rep == 1 else ""
        if self._d.repetition and self._d.repetition in value:
            reps = value.split(self._d.repetition)
            value = reps[rep - 1] if 0 < rep <= len(reps) else ""
        elif rep != 1:
            return ""
        parts = value.split(self._d.component)
        value = parts[c - 1] if 0 < c <= len(parts) else ""
        return unescape(value, self._d, self._codec) if self._d.escape in value else value

    def subcomponent(self, n: int, c: int, s: int, rep: int = 1) -> str:
        reps = self.repetitions(n)
        return reps[rep - 1].subcomponent(c, s) if 0 < rep <= len(reps) else ""

    def __repr__(self) -> str:
        return f"Segment({self.raw[:60]!r})"


# --- segment splitting and repair -----------------------------------------------


@lru_cache(maxsize=32)
def _glued_segment_pattern(field_sep: str) -> re.Pattern[str]:
    ids = "|".join(sorted(STANDARD_SEGMENT_IDS))
    return re.compile(rf"[ \t]+(?=(?:{ids}|Z[A-Z0-9]{{2}}){re.escape(field_sep)})")


def _starts_segment(line: str, field_sep: str) -> bool:
    if len(line) > 3 and line[3] != field_sep:
        return False
    head = line[:3]
    return head in STANDARD_SEGMENT_IDS or _SEGMENT_ID.fullmatch(head) is not None


def _join_wrapped(previous: str, line: str, d: Delimiters) -> str:
    # Copy-paste wrapping replaces the space between two words with a line break, but
    # a break after a delimiter or a hyphen (phone numbers, GUIDs) dropped nothing.
    no_space = {d.field, d.component, d.repetition, d.subcomponent, "-"}
    if previous[-1] in no_space or line[0] in no_space or line[0].isspace():
        return previous + line
    return previous + " " + line


def split_segments(text: str) -> tuple[list[str], Delimiters, list[str]]:
    """Split message text into segment strings, repairing common damage.

    Returns the segments, the delimiters of the first header segment (MSH, FHS or BHS)
    and a list of the repairs made. Lines that do not start with a segment ID are
    continuations of the previous segment; when such wrapping was found, or the whole
    message is one line, segments glued together with spaces are split apart too.
    """
    text = text.lstrip(_LEADING_JUNK)
    if text[:3] not in HEADER_SEGMENTS:
        found = shown(text[:20]) if text else "empty input"
        raise HL7ParseError(f"expected an MSH segment first, found {found}", "MSH", error_code=100)
    delimiters = Delimiters.from_header(text.split("\r", 1)[0].split("\n", 1)[0])
    sep = delimiters.field
    segments: list[str] = []
    wrapped = 0
    for line in text.replace("\r\n", "\r").replace("\n", "\r").split("\r"):
        line = line.rstrip()
        if not line:
            continue
        if _starts_segment(line, sep):
            segments.append(line)
        elif line[0].isspace() and _starts_segment(stripped := line.lstrip(), sep):
            segments.append(stripped)
        else:
            segments[-1] = _join_wrapped(segments[-1], line, delimiters)
            wrapped += 1
    repairs = [f"joined {wrapped} wrapped line(s) to the segment before"] if wrapped else []
    if wrapped or len(segments) == 1:
        pattern = _glued_segment_pattern(sep)
        unglued = [part.rstrip() for seg in segments for part in pattern.split(seg)]
        if len(unglued) > len(segments):
            repairs.append(f"split {len(unglued) - len(segments)} segment(s) glued with spaces")
            segments = unglued
    return segments, delimiters, repairs


# --- messages -------------------------------------------------------------------


def parse_version(version: str) -> tuple[int, ...]:
    """Version text as numbers, "2.5.1" -> (2, 5, 1); () when it is not a dotted number."""
    try:
        return tuple(int(p) for p in version.strip().split("."))
    except ValueError:
        return ()


class Message:
    """A parsed message: its segments in order, looked up by ID on demand."""

    __slots__ = ("_index", "_segments", "charset", "delimiters", "warnings")

    def __init__(
        self,
        segments: list[Segment],
        delimiters: Delimiters,
        *,
        charset: str | None = None,
        warnings: list[str] | None = None,
    ) -> None:
        if not segments or segments[0].id != "MSH":
            raise HL7ParseError("a message must start with an MSH segment", "MSH", error_code=100)
        self._segments = segments
        self._index: dict[str, list[Segment]] | None = None
        self.delimiters = delimiters
        self.charset = charset  # Python codec the bytes were decoded with; None for text input
        self.warnings = warnings or []

    @classmethod
    def from_lines(
        cls,
        lines: list[str],
        delimiters: Delimiters,
        *,
        charset: str | None = None,
        warnings: list[str] | None = None,
    ) -> Message:
        codec = charset or "utf-8"
        return cls(
            [Segment(line, delimiters, codec) for line in lines],
            delimiters,
            charset=charset,
            warnings=warnings,
        )

    def segments(self, segment_id: str | None = None) -> list[Segment]:
        """All segments, or those with the given ID, in message order."""
        if segment_id is None:
            return list(self._segments)
        if self._index is None:
            index: dict[str, list[Segment]] = {}
            for seg in self._segments:
                index.setdefault(seg.id, []).append(seg)
            self._index = index
        return list(self._index.get(segment_id, ()))

    def segment(self, segment_id: str, occurrence: int = 1) -> Segment | None:
        found = self.segments(segment_id)
        return found[occurrence - 1] if 0 < occurrence <= len(found) else None

    @property
    def msh(self) -> Segment:
        return self._segments[0]

    @property
    def message_type(self) -> str:
        return self.msh.component(9, 1)

    @property
    def trigger_event(self) -> str:
        return self.msh.component(9, 2)

    @property
    def message_structure(self) -> str:
        return self.msh.component(9, 3)

    @property
    def control_id(self) -> str:
        return self.msh.field(10)

    @property
    def processing_id(self) -> str:
        return self.msh.component(11, 1)

    @property
    def version(self) -> str:
        return self.msh.component(12, 1)

    def __iter__(self) -> Iterator[Segment]:
        return iter(self._segments)

    def __len__(self) -> int:
        return len(self._segments)

    def to_er7(self) -> str:
        """The message re-serialised with CR segment separators (after any repairs)."""
        return "\r".join(seg.raw for seg in self._segments) + "\r"

    def __repr__(self) -> str:
        kind = "^".join(p for p in (self.message_type, self.trigger_event) if p)
        return f"Message({kind} {self.control_id!r}, {len(self)} segments)"


def _to_text(raw: bytes | str) -> tuple[str, str | None, list[str]]:
    if isinstance(raw, str):
        return raw.removeprefix("\ufeff"), None, []
    decoded = decode_message(raw)
    return decoded.text, decoded.codec, [decoded.warning] if decoded.warning else []


def parse(raw: bytes | str) -> Message:
    """Parse one HL7 v2 message; raise `HL7ParseError` when it has no usable MSH.

    Bytes are decoded per MSH-18 (see `decode_message`); text is used as given.
    Anything the tokenizer had to repair is listed in `Message.warnings`.
    """
    text, codec, warnings = _to_text(raw)
    lines, delimiters, repairs = split_segments(text)
    if lines[0][:3] != "MSH":
        raise HL7ParseError(
            f"expected MSH, found {lines[0][:3]} (batch files are read with hl7_gateway.batch)",
            "MSH",
            error_code=100,
        )
    return Message.from_lines(lines, delimiters, charset=codec, warnings=warnings + repairs)


def read_msh_leniently(raw: bytes | str) -> Segment | None:
    """Whatever MSH can be read from a message that may not parse, or None if none.

    For building a NAK to broken input: the MSH is searched anywhere in the text, only
    its first line is used, and invalid delimiters fall back to the defaults.
    """
    if isinstance(raw, bytes):
        raw = raw.removeprefix(_BOM)
        codec = codec_for_charset(_declared_charset(raw)) or "utf-8"
        text = raw.decode(codec, errors="replace")
    else:
        text, codec = raw, "utf-8"
    start = text.find("MSH")
    if start < 0:
        return None
    line = re.split(r"[\r\n]", text[start:], maxsplit=1)[0].rstrip()
    try:
        delimiters = Delimiters.from_header(line)
    except HL7ParseError:
        if len(line) > 3 and not line[3].isalnum() and not line[3].isspace():
            delimiters = Delimiters(field=line[3])
        else:
            return Segment("MSH", DEFAULT_DELIMITERS, codec)
    return Segment(line, delimiters, codec)
