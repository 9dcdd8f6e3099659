"""v2 data types → FHIR data types (the E2 "data type maps" of the v2-to-FHIR IG).

| v2 | FHIR | notes |
|---|---|---|
| DT / DTM / TS | date, dateTime, instant | no offset: the gateway's zone; HHMM → HH:MM:00 |
| HD | identifier system | ISO → ``urn:oid:``, UUID → ``urn:uuid:``, URI as is, |
|  |  | a bare namespace id → a local URN |
| CX / EI | Identifier | CX-5 → type (table 0203), CX-7/8 → period |
| CWE / CE / CNE | CodeableConcept | triplets 1-3 and 4-6 → codings, CWE-9 (or -2) → text |
| XPN | HumanName | XPN-7 → use (table 0200) |
| XAD | Address | XAD-7 → use / type (table 0190) |
| XTN | ContactPoint | XTN-2 → use (0201), XTN-3 → system (0202), XTN-4 e-mail |
| XCN / XON | Reference (logical) | identifier + display (no practitioner directory) |
| CQ / NM + units | Quantity | UCUM units get the UCUM system |

Values that cannot be converted give ``None``; the segment mapper decides whether that is
a warning (value dropped) or an error.
"""

from __future__ import annotations

import hashlib
import re
from datetime import datetime, timedelta, tzinfo
from typing import Any

from hl7_gateway.parser import Repetition, Segment
from hl7_gateway.v2_to_fhir.codes import (
    code_system_uri,
    local_system,
    mapped,
    table_coding,
)

JSON = dict[str, Any]

__all__ = [
    "address",
    "codeable",
    "contact_point",
    "cx_identifier",
    "derived_identifier",
    "ei_identifier",
    "fhir_date",
    "fhir_datetime",
    "fhir_instant",
    "fhir_time",
    "first",
    "hd_system",
    "human_name",
    "number",
    "organization_reference",
    "person_name_text",
    "practitioner_reference",
    "quantity",
    "table_concept",
]

# --- dates and times ---------------------------------------------------------------------

_DTM = re.compile(
    r"^(\d{4})(\d{2})?(\d{2})?(\d{2})?(\d{2})?(\d{2})?(?:\.(\d{1,4}))?([+-]\d{4})?$")
_TM = re.compile(r"^(\d{2})(?::?(\d{2}))?(?::?(\d{2}))?(?:\.(\d{1,4}))?([+-]\d{4})?$")


def _parts(value: str) -> tuple[list[str | None], str | None] | None:
    found = _DTM.match(value.strip())
    if found is None:
        return None
    *fields, fraction, offset = found.groups()
    return [*fields, fraction], offset


def _offset(offset: str | None, default_tz: tzinfo, moment: datetime) -> str:
    if offset:
        return f"{offset[:3]}:{offset[3:]}"
    delta = default_tz.utcoffset(moment) or timedelta(0)
    if delta == timedelta(0):
        return "Z"
    sign = "+" if delta >= timedelta(0) else "-"
    minutes = abs(int(delta.total_seconds())) // 60
    return f"{sign}{minutes // 60:02d}:{minutes % 60:02d}"


def _valid_offset(offset: str | None) -> bool:
    if not offset:
        return True
    hours, minutes = int(offset[1:3]), int(offset[3:])
    return minutes < 60 and (hours < 14 or (hours == 14 and minutes == 0))


def _checked(parts: list[str | None]) -> datetime | None:
    year, month, day, hour, minute, second, _ = parts
    try:
        return datetime(int(year or 1), int(month or 1), int(day or 1), int(hour or 0),
                        int(minute or 0), int(second or 0))
    except ValueError:
        return None


def fhir_date(value: str) -> str | None:
    """DT/DTM → FHIR date (YYYY, YYYY-MM or YYYY-MM-DD); None if not a valid date."""
    parsed = _parts(value)
    if parsed is None or _checked(parsed[0]) is None:
        return None
    year, month, day = parsed[0][:3]
    return "-".join(p for p in (year, month, day) if p)


def fhir_datetime(value: str, default_tz: tzinfo) -> str | None:
    """DTM/TS → FHIR dateTime. A time without an offset is read in ``default_tz``."""
    parsed = _parts(value)
    if parsed is None:
        return None
    parts, offset = parsed
    moment = _checked(parts)
    if moment is None or not _valid_offset(offset):
        return None
    year, month, day, hour, minute, second, fraction = parts
    date = "-".join(p for p in (year, month, day) if p)
    if hour is None or day is None:
        return date
    time = f"{hour}:{minute or '00'}:{second or '00'}" + (f".{fraction}" if fraction else "")
    return f"{date}T{time}{_offset(offset, default_tz, moment)}"


def fhir_instant(value: str, default_tz: tzinfo) -> str | None:
    """DTM → FHIR instant; None unless the value is precise to the hour at least."""
    result = fhir_datetime(value, default_tz)
    return result if result is not None and "T" in result else None


def fhir_time(value: str) -> str | None:
    """TM → FHIR time (hh:mm:ss); the offset, which FHIR time cannot hold, is dropped."""
    found = _TM.match(value.strip())
    if found is None:
        return None
    hour, minute, second, fraction, _ = found.groups()
    if int(hour) > 23 or int(minute or 0) > 59 or int(second or 0) > 59:
        return None
    return f"{hour}:{minute or '00'}:{second or '00'}" + (f".{fraction}" if fraction else "")


# --- numbers and quantities ---------------------------------------------------------------

_NUMBER = re.compile(r"^[+-]?(\d+(\.\d*)?|\.\d+)$")


def number(text: str) -> int | float | None:
    """A v2 NM as a JSON number (int when it has no fraction); None if not numeric."""
    text = text.strip()
    if not _NUMBER.match(text):
        return None
    value = float(text)
    return int(value) if "." not in text and abs(value) < 2**53 else value


def quantity(value: int | float, units: Repetition | None, sender: str) -> JSON:
    """A Quantity; units are a CWE (code^text^system): UCUM codes get the UCUM system."""
    result: JSON = {"value": value}
    if units is None:
        return result
    code, text, system_name = units.component(1), units.component(2), units.component(3)
    if code or text:
        result["unit"] = text or code
    system = code_system_uri(system_name, sender) if system_name else None
    if code and system:
        result["system"] = system
        result["code"] = code
    return result


# --- identifiers -------------------------------------------------------------------------


def hd_system(namespace: str, universal_id: str, universal_type: str) -> str | None:
    """The URI an HD (namespace^universal id^type) names, None when it is empty."""
    universal_id, kind = universal_id.strip(), universal_type.strip().upper()
    if universal_id:
        if kind == "ISO" or (not kind and re.fullmatch(r"\d+(\.\d+)+", universal_id)):
            return f"urn:oid:{universal_id}"
        if kind == "UUID":
            return f"urn:uuid:{universal_id.lower()}"
        if kind in {"URI", "URL"} or universal_id.startswith(("http://", "https://", "urn:")):
            return universal_id
    namespace = namespace.strip()
    if namespace:
        return local_system("authority", namespace)
    if universal_id:
        return local_system("authority", universal_id)
    return None


def _hd_in_component(rep: Repetition, c: int) -> str | None:
    return hd_system(rep.subcomponent(c, 1), rep.subcomponent(c, 2), rep.subcomponent(c, 3))


def cx_identifier(rep: Repetition, sender: str, *, type_code: str | None = None) -> JSON | None:
    """CX → Identifier. Without an assigning authority the id is scoped to the sender."""
    value = rep.component(1).strip()
    if not value:
        return None
    id_type = type_code or rep.component(5).strip()
    system = _hd_in_component(rep, 4) or local_system(sender, id_type or "id")
    identifier: JSON = {"system": system, "value": value}
    coding = table_coding("0203", id_type) if id_type else None
    if coding:
        identifier["type"] = {"coding": [coding]}
    authority = rep.subcomponent(4, 1) or rep.subcomponent(6, 1)
    if authority:
        identifier["assigner"] = {"display": authority}
    return identifier


def ei_identifier(rep: Repetition | None, sender: str, *, kind: str,
                  type_code: str | None = None) -> JSON | None:
    """EI (entity id^namespace^universal id^type) → Identifier.

    ``kind`` names what the id identifies ("placer-order", "filler-order", ...) and scopes
    the system of a bare id, which is only unique within its sender and kind.
    """
    if rep is None:
        return None
    value = rep.component(1).strip()
    if not value:
        return None
    system = (hd_system(rep.component(2), rep.component(3), rep.component(4))
              or local_system(sender, kind))
    identifier: JSON = {"system": system, "value": value}
    coding = table_coding("0203", type_code) if type_code else None
    if coding:
        identifier["type"] = {"coding": [coding]}
    return identifier


# --- codes -------------------------------------------------------------------------------


def _coding(code: str, display: str, system_name: str, version: str, sender: str,
            default_table: str | None) -> JSON | None:
    code, display = code.strip(), display.strip()
    if not code:
        return None
    system = code_system_uri(system_name, sender)
    if system is None and default_table:
        coding = table_coding(default_table, code)
        if coding and display and "display" not in coding:
            coding["display"] = display
        return coding
    result: JSON = {"code": code}
    if system:
        result = {"system": system, "code": code}
        if version.strip():
            result["version"] = version.strip()
    if display:
        result["display"] = display
    return result


def codeable(rep: Repetition | None, sender: str, *, default_table: str | None = None
             ) -> JSON | None:
    """CWE/CE/CNE/CF → CodeableConcept; None if the value is empty.

    ``default_table`` is the v2 table of a field whose coding system is implied (IS/ID
    fields, or a CWE sent without CWE-3).
    """
    if rep is None:
        return None
    codings = [
        c for c in (
            _coding(rep.component(1), rep.component(2), rep.component(3), rep.component(7),
                    sender, default_table),
            _coding(rep.component(4), rep.component(5), rep.component(6), rep.component(8),
                    sender, None),
            _coding(rep.component(10), rep.component(11), rep.component(12),
                    rep.component(13), sender, None),
        ) if c is not None
    ]
    text = rep.component(9).strip() or (rep.component(2).strip() if not codings else "")
    if not codings and not text:
        return None
    concept: JSON = {}
    if codings:
        concept["coding"] = codings
    if text:
        concept["text"] = text
    return concept


def table_concept(table: str, code: str) -> JSON | None:
    coding = table_coding(table, code)
    return {"coding": [coding]} if coding else None


# --- names, addresses, telecom --------------------------------------------------------------


def _nonempty(*values: str) -> list[str]:
    return [v.strip() for v in values if v and v.strip()]


def _period(start: str, end: str, default_tz: tzinfo) -> JSON | None:
    period = {k: v for k, v in (("start", fhir_datetime(start, default_tz) if start else None),
                                ("end", fhir_datetime(end, default_tz) if end else None)) if v}
    return period or None


def human_name(rep: Repetition, default_tz: tzinfo) -> JSON | None:
    """XPN → HumanName (family is FN.1, the surname; degree XPN-6 joins the suffixes)."""
    name: JSON = {}
    use = mapped("name_use", rep.component(7)) if rep.component(7) else None
    if use:
        name["use"] = use
    family = rep.subcomponent(1, 1).strip()
    if family:
        name["family"] = family
    given = _nonempty(rep.component(2), *rep.component(3).split(" "))
    if given:
        name["given"] = given
    prefix = _nonempty(rep.component(5))
    if prefix:
        name["prefix"] = prefix
    suffix = _nonempty(rep.component(4), rep.component(6), rep.component(14))
    if suffix:
        name["suffix"] = suffix
    period = _period(rep.component(12) or rep.subcomponent(10, 1),
                     rep.component(13) or rep.subcomponent(10, 2), default_tz)
    if period:
        name["period"] = period
    return name if ({"family", "given"} & name.keys()) else None


def person_name_text(family: str, given: str, middle: str = "", suffix: str = "",
                     prefix: str = "", degree: str = "") -> str:
    return " ".join(_nonempty(prefix, given, middle, family, suffix, degree))


def address(rep: Repetition, default_tz: tzinfo) -> JSON | None:
    """XAD → Address; XAD-7 gives use (home, work, ...) and type (postal for mailing)."""
    result: JSON = {}
    kind = rep.component(7)
    if kind:
        use = mapped("address_use", kind)
        if use:
            result["use"] = use
        address_type = mapped("address_type", kind)
        if address_type:
            result["type"] = address_type
    line = _nonempty(rep.subcomponent(1, 1), rep.component(2))
    if line:
        result["line"] = line
    for key, c in (("city", 3), ("state", 4), ("postalCode", 5), ("country", 6),
                   ("district", 9)):
        value = rep.component(c).strip()
        if value:
            result[key] = value
    period = _period(rep.component(13) or rep.subcomponent(12, 1),
                     rep.component(14) or rep.subcomponent(12, 2), default_tz)
    if period:
        result["period"] = period
    return result if (result.keys() - {"use", "type", "period"}) else None


def _phone_number(rep: Repetition) -> str:
    if rep.component(1).strip():
        return rep.component(1).strip()
    country, area, local, extension = (rep.component(c).strip() for c in (5, 6, 7, 8))
    number_text = " ".join(_nonempty(f"+{country}" if country else "",
                                     f"({area})" if area else "", local))
    if number_text and extension:
        number_text += f" ext. {extension}"
    return number_text or rep.component(12).strip()


def contact_point(rep: Repetition, default_use: str | None) -> JSON | None:
    """XTN → ContactPoint; ``default_use`` applies when XTN-2 does not name one."""
    use_code, equipment = rep.component(2).strip(), rep.component(3).strip()
    is_email = use_code == "NET" or equipment in {"Internet", "X.400"}
    value = rep.component(4).strip() if is_email else _phone_number(rep)
    if is_email and not value:
        value = rep.component(1).strip()
    if not value:
        return None
    system = "email" if is_email else (mapped("contact_point_system", equipment) or "phone")
    point: JSON = {"system": system, "value": value}
    use = "mobile" if equipment == "CP" else (mapped("contact_point_use", use_code)
                                              if use_code else None)
    use = use or (None if is_email else default_use)
    if use:
        point["use"] = use
    return point


# --- people and organizations (logical references) ----------------------------------------


def practitioner_reference(rep: Repetition | None, sender: str) -> JSON | None:
    """XCN → a logical Reference(Practitioner): identifier (XCN-1, XCN-9) and name."""
    if rep is None:
        return None
    display = person_name_text(rep.subcomponent(2, 1), rep.component(3), rep.component(4),
                               rep.component(5), rep.component(6), rep.component(7))
    return _logical_reference(rep, "Practitioner", rep.component(1).strip(), display, 9,
                              sender)


def organization_reference(rep: Repetition | None, sender: str) -> JSON | None:
    """XON → a logical Reference(Organization): name XON-1, id XON-10 (or XON-3)."""
    if rep is None:
        return None
    value = rep.component(10).strip() or rep.component(3).strip()
    return _logical_reference(rep, "Organization", value, rep.component(1).strip(), 6,
                              sender)


def _logical_reference(rep: Repetition, kind: str, value: str, display: str,
                       authority: int, sender: str) -> JSON | None:
    """A logical Reference(kind): identifier ``value`` in the system of the HD in
    component ``authority`` (else the sender's local one), and a display."""
    if not value and not display:
        return None
    ref: JSON = {"type": kind}
    if value:
        system = _hd_in_component(rep, authority) or local_system(sender, kind.lower())
        ref["identifier"] = {"system": system, "value": value}
    ref["display"] = display or value
    return ref


def derived_identifier(kind: str, *parts: str) -> JSON:
    """A stable identifier for a resource v2 gives no id of its own (a next of kin, an
    allergy): a digest of what makes it the same thing, e.g. patient + allergen."""
    digest = hashlib.sha256("\x1f".join(p.strip().lower() for p in parts).encode()).hexdigest()
    return {"system": local_system("derived", kind), "value": digest[:32]}


def first(segment: Segment | None, field_no: int) -> Repetition | None:
    """The first repetition of a field, None when the field (or segment) is empty."""
    if segment is None:
        return None
    reps = segment.repetitions(field_no)
    return reps[0] if reps else None


