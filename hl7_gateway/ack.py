"""HL7 v2 acknowledgements: which ACKs to send, and the ACK messages themselves.

Responsible for
- the acknowledgement mode of a message: original (MSH-15 and MSH-16 empty) or
  enhanced, and in enhanced mode whether the table 0155 conditions (AL/NE/ER/SU) ask
  for a commit ACK (CA/CE/CR) and for an application ACK (AA/AE/AR);
- building ACK messages: MSH with sender and receiver swapped, the message's own
  version and delimiters, a new control id and `ACK^<event>^ACK`; MSA echoing MSH-10;
  one ERR per problem (v2.5+: ERR-2 location, ERR-3 table 0357 code, ERR-4 severity,
  ERR-8 text; earlier versions: ERR-1 `segment^sequence^field^code&text&HL70357`);
- header validation (message type, event, version, processing id → codes 200, 201,
  203, 202) and NAKs for input that never reached the application (unparseable,
  oversize, handler failure), built from whatever MSH could be read.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

from hl7_gateway.parser import (
    DEFAULT_DELIMITERS,
    Delimiters,
    HL7ParseError,
    Message,
    Segment,
    escape,
    parse_version,
    read_msh_leniently,
    shown,
)

__all__ = [
    "ERROR_CODES",
    "SUPPORTED_VERSIONS",
    "AckCode",
    "AckCondition",
    "AckMode",
    "ErrorDetail",
    "HeaderPolicy",
    "Outcome",
    "Severity",
    "ack_code_for",
    "ack_mode",
    "application_ack_required",
    "build_ack",
    "build_failure_ack",
    "build_header_reject",
    "build_response_ack",
    "build_unparseable_ack",
    "check_header",
    "commit_ack_required",
    "new_control_id",
]


class AckCode(StrEnum):
    """MSA-1, HL7 table 0008."""

    AA = "AA"  # application accept
    AE = "AE"  # application error
    AR = "AR"  # application reject
    CA = "CA"  # commit accept
    CE = "CE"  # commit error
    CR = "CR"  # commit reject


class AckCondition(StrEnum):
    """MSH-15 / MSH-16, HL7 table 0155."""

    ALWAYS = "AL"
    NEVER = "NE"
    ERROR = "ER"
    SUCCESS = "SU"


class AckMode(StrEnum):
    ORIGINAL = "original"
    ENHANCED = "enhanced"


class Outcome(StrEnum):
    """What happened to a message, independent of the acknowledgement mode."""

    ACCEPT = "accept"
    ERROR = "error"
    REJECT = "reject"


class Severity(StrEnum):
    """ERR-4, HL7 table 0516."""

    ERROR = "E"
    FATAL = "F"
    WARNING = "W"
    INFORMATION = "I"


# HL7 table 0357, message error condition codes.
ERROR_CODES: Mapping[int, str] = {
    0: "Message accepted",
    100: "Segment sequence error",
    101: "Required field missing",
    102: "Data type error",
    103: "Table value not found",
    104: "Value too long",
    198: "Non-conformant cardinality",
    199: "Other error",
    200: "Unsupported message type",
    201: "Unsupported event code",
    202: "Unsupported processing id",
    203: "Unsupported version id",
    204: "Unknown key identifier",
    205: "Duplicate key identifier",
    206: "Application record locked",
    207: "Application internal error",
}

SUPPORTED_VERSIONS = frozenset(
    {"2.2", "2.3", "2.3.1", "2.4", "2.5", "2.5.1", "2.6", "2.7", "2.7.1", "2.8", "2.8.1", "2.8.2"}
)
# Used when the incoming MSH-12 cannot be read at all.
FALLBACK_VERSION = "2.5.1"

_ORIGINAL_CODES = {
    Outcome.ACCEPT: AckCode.AA,
    Outcome.ERROR: AckCode.AE,
    Outcome.REJECT: AckCode.AR,
}
_COMMIT_CODES = {Outcome.ACCEPT: AckCode.CA, Outcome.ERROR: AckCode.CE, Outcome.REJECT: AckCode.CR}


@dataclass(frozen=True, slots=True)
class ErrorDetail:
    """One problem to report in an ERR segment."""

    code: int  # HL7 table 0357
    message: str = ""  # ERR-8, for a human
    segment: str = ""
    sequence: int = 1
    field: int | None = None
    component: int | None = None
    severity: Severity = Severity.ERROR

    @property
    def code_text(self) -> str:
        return ERROR_CODES.get(self.code, ERROR_CODES[199])

    @classmethod
    def from_parse_error(cls, error: HL7ParseError) -> ErrorDetail:
        return cls(error.error_code, str(error), error.segment or "", 1, error.field)


# --- mode and conditions ----------------------------------------------------------


def _header(source: Message | Segment | None) -> Segment:
    if source is None:
        return Segment("MSH", DEFAULT_DELIMITERS)
    return source.msh if isinstance(source, Message) else source


def ack_mode(header: Message | Segment) -> AckMode:
    msh = _header(header)
    if msh.field(15).strip() or msh.field(16).strip():
        return AckMode.ENHANCED
    return AckMode.ORIGINAL


def _condition(msh: Segment, n: int) -> AckCondition:
    value = msh.component(n, 1).strip().upper()
    # In enhanced mode an empty or unknown condition counts as AL: a missing ACK makes
    # the sender resend (duplicates), an unexpected one is merely ignored.
    try:
        return AckCondition(value)
    except ValueError:
        return AckCondition.ALWAYS


def _condition_met(condition: AckCondition, outcome: Outcome) -> bool:
    if condition is AckCondition.ERROR:
        return outcome is not Outcome.ACCEPT
    if condition is AckCondition.SUCCESS:
        return outcome is Outcome.ACCEPT
    return condition is AckCondition.ALWAYS


def commit_ack_required(header: Message | Segment, outcome: Outcome) -> bool:
    """Whether a commit ACK (CA/CE/CR) is due: enhanced mode, per MSH-15."""
    msh = _header(header)
    if ack_mode(msh) is AckMode.ORIGINAL:
        return False
    return _condition_met(_condition(msh, 15), outcome)


def application_ack_required(header: Message | Segment, outcome: Outcome) -> bool:
    """Whether an application ACK (AA/AE/AR) is due: always in original mode, else per MSH-16."""
    msh = _header(header)
    if ack_mode(msh) is AckMode.ORIGINAL:
        return True
    return _condition_met(_condition(msh, 16), outcome)


def ack_code_for(header: Message | Segment, outcome: Outcome) -> AckCode:
    """The code of the ACK returned on the connection: AA/AE/AR or, enhanced, CA/CE/CR."""
    codes = _COMMIT_CODES if ack_mode(header) is AckMode.ENHANCED else _ORIGINAL_CODES
    return codes[outcome]


# --- building -----------------------------------------------------------------------


def new_control_id() -> str:
    """A fresh MSH-10; 20 characters fit the ST(20) limit of v2.5."""
    return uuid.uuid4().hex[:20].upper()


def _version_tuple(version: str) -> tuple[int, ...]:
    # An unreadable version gets the current ERR layout rather than the v2.3 one.
    return parse_version(version) or (2, 5)


def _msh_for_ack(msh: Segment, control_id: str, timestamp: datetime) -> tuple[str, str]:
    """The ACK's MSH line and the version number (MSH-12.1) that shapes the rest."""
    d = msh.delimiters
    version = msh.raw_field(12) or FALLBACK_VERSION
    number = msh.component(12, 1) or FALLBACK_VERSION
    event = msh.components(9)[1:2]
    # MSH-9.3 (message structure) exists from v2.3.1 on.
    kind = ["ACK", event[0] if event else ""]
    if _version_tuple(number) >= (2, 3, 1):
        kind.append("ACK")
    processing = msh.raw_field(11) if msh.component(11, 1) in {"P", "T", "D"} else "P"
    fields = [
        "MSH",
        d.encoding_characters,
        msh.raw_field(5),
        msh.raw_field(6),
        msh.raw_field(3),
        msh.raw_field(4),
        timestamp.strftime("%Y%m%d%H%M%S%z"),
        "",
        d.component.join(escape(k, d) for k in kind).rstrip(d.component),
        escape(control_id, d),
        processing,
        version,
        "",
        "",
        "",
        "",
        "",
        msh.raw_field(18),
    ]
    return d.field.join(fields).rstrip(d.field), number


def _err_location(error: ErrorDetail, d: Delimiters) -> str:
    if not error.segment:
        return ""
    parts = [error.segment, str(error.sequence), str(error.field or "")]
    if error.component:
        parts += ["1", str(error.component)]
    return d.component.join(parts).rstrip(d.component)


def _err_segments(errors: Sequence[ErrorDetail], d: Delimiters, version: str) -> list[str]:
    if not errors:
        return []
    f, c, s = d.field, d.component, d.subcomponent
    if _version_tuple(version) >= (2, 5):
        return [
            f.join(
                [
                    "ERR",
                    "",
                    _err_location(e, d),
                    c.join([str(e.code), escape(e.code_text, d), "HL70357"]),
                    e.severity.value,
                    "",
                    "",
                    "",
                    escape(e.message, d),
                ]
            ).rstrip(f)
            for e in errors
        ]
    # Before v2.5 ERR has only ERR-1 (ELD), repeated once per error.
    elds = [
        c.join(
            [
                e.segment,
                str(e.sequence) if e.segment else "",
                str(e.field or ""),
                s.join([str(e.code), escape(e.message or e.code_text, d), "HL70357"]),
            ]
        )
        for e in errors
    ]
    return [f.join(["ERR", d.repetition.join(elds)])]


def build_ack(
    header: Message | Segment | None,
    code: AckCode,
    *,
    errors: Sequence[ErrorDetail] = (),
    control_id: str | None = None,
    timestamp: datetime | None = None,
) -> str:
    """An ACK (CR-separated text) answering `header`, the message or its MSH.

    `None` stands for a message whose MSH could not be read at all. MSA-3 carries the
    first error's text for versions before 2.7, which dropped the field.
    """
    msh = _header(header)
    d = msh.delimiters
    msh_line, version = _msh_for_ack(
        msh, control_id or new_control_id(), timestamp or datetime.now().astimezone()
    )
    msa = ["MSA", code.value, msh.raw_field(10)]
    first_text = next((e.message or e.code_text for e in errors), "")
    if first_text and _version_tuple(version) < (2, 7):
        msa.append(escape(first_text[:80], d))  # MSA-3 is ST(80) in those versions
    segments = [msh_line, d.field.join(msa), *_err_segments(errors, d, version)]
    return "\r".join(segments) + "\r"


def build_response_ack(
    header: Message | Segment | None,
    outcome: Outcome,
    *,
    errors: Sequence[ErrorDetail] = (),
    control_id: str | None = None,
) -> str | None:
    """The ACK to write back on the connection, or None when the sender asked for none.

    Original mode: AA/AE/AR, always. Enhanced mode: CA/CE/CR when MSH-15 asks for it;
    the application ACK of enhanced mode is sent later, on its own, via `build_ack`.
    """
    msh = _header(header)
    if ack_mode(msh) is AckMode.ENHANCED and not commit_ack_required(msh, outcome):
        return None
    return build_ack(msh, ack_code_for(msh, outcome), errors=errors, control_id=control_id)


# --- header validation and failures ---------------------------------------------


@dataclass(frozen=True)
class HeaderPolicy:
    """What the receiver accepts. `message_types` maps a type to its events (None: any)."""

    message_types: Mapping[str, frozenset[str] | None] | None = None  # None: any type
    versions: frozenset[str] = SUPPORTED_VERSIONS
    processing_ids: frozenset[str] = frozenset({"P", "T", "D"})


def _required(msh: Segment, n: int, name: str) -> ErrorDetail | None:
    if msh.component(n, 1).strip():
        return None
    return ErrorDetail(101, f"MSH-{n} ({name}) is empty", "MSH", 1, n)


def _check_type(msh: Segment, policy: HeaderPolicy) -> list[ErrorDetail]:
    kind, event = msh.component(9, 1), msh.component(9, 2)
    if policy.message_types is None:
        return []
    if kind not in policy.message_types:
        return [ErrorDetail(200, f"message type {shown(kind)} is not accepted", "MSH", 1, 9, 1)]
    events = policy.message_types[kind]
    if events is not None and event not in events:
        return [ErrorDetail(201, f"event {kind}^{event} is not accepted", "MSH", 1, 9, 2)]
    return []


def check_header(
    header: Message | Segment, policy: HeaderPolicy | None = None
) -> list[ErrorDetail]:
    """Problems with MSH-9/10/11/12 that make the receiver reject the message."""
    msh = _header(header)
    policy = policy or HeaderPolicy()
    missing = [
        e
        for n, name in (
            (9, "message type"),
            (10, "message control id"),
            (11, "processing id"),
            (12, "version id"),
        )
        if (e := _required(msh, n, name)) is not None
    ]
    if any(e.field == 9 for e in missing):
        problems = missing
    else:
        problems = missing + _check_type(msh, policy)
    version, processing = msh.component(12, 1), msh.component(11, 1)
    if version and version not in policy.versions:
        problems.append(
            ErrorDetail(203, f"version {shown(version)} is not supported", "MSH", 1, 12)
        )
    if processing and processing not in policy.processing_ids:
        problems.append(
            ErrorDetail(202, f"processing id {shown(processing)} is not accepted", "MSH", 1, 11)
        )
    return problems


def build_header_reject(header: Message | Segment, errors: Sequence[ErrorDetail]) -> str | None:
    """AR (original mode) or CR (enhanced, if MSH-15 wants it) for a header that failed."""
    return build_response_ack(header, Outcome.REJECT, errors=errors)


def build_failure_ack(
    raw: bytes | str, error: ErrorDetail, outcome: Outcome = Outcome.ERROR
) -> str | None:
    """ACK for input the application never processed, built from whatever MSH is readable.

    None only when a readable MSH-15 in enhanced mode asked for no such ACK.
    """
    return build_response_ack(read_msh_leniently(raw), outcome, errors=[error])


def build_unparseable_ack(raw: bytes | str, error: HL7ParseError | str) -> str | None:
    """AE (or CE in enhanced mode) for a message that does not parse."""
    if isinstance(error, str):
        error = HL7ParseError(error)
    return build_failure_ack(raw, ErrorDetail.from_parse_error(error), Outcome.ERROR)
