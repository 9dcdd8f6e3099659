"""OBX (+ following NTE) → Observation.

| v2 | Observation | notes |
|---|---|---|
| OBX-3 | code | CWE; required (an OBX with neither code nor value is skipped with a warning) |
| OBX-5 by OBX-2 | value[x] | see below; a repeating OBX-5 → component[] (text is joined) |
| OBX-6 | the Quantity's unit / code | UCUM units get the UCUM system |
| OBX-7 | referenceRange | text as sent; "a-b", "a to b", "<b", ">a" also as low / high |
| OBX-8 | interpretation | table 0078 → v3 ObservationInterpretation |
| OBX-11 | status | table 0085 → observation-status; X also dataAbsentReason not-performed |
| OBX-14 (else OBR-7) | effectiveDateTime | |
| OBX-16 / OBX-23 | performer | logical Practitioner / Organization references |
| OBX-17 | method | |
| NTE-3 after the OBX | note | |

| OBX-2 | value[x] |
|---|---|
| NM | valueQuantity (comparator when the sender put "<5" in an NM) |
| ST, FT, TX | valueString (FT formatting and .br become line breaks) |
| CE, CWE, CNE, CF, IS, ID | valueCodeableConcept |
| DT, DTM, TS | valueDateTime |
| TM | valueTime |
| DR | valuePeriod |
| NR | valueRange |
| SN | SN-3 ":" or "/" → valueRatio, "-" → valueRange, "+" → valueString; |
|  | none → valueQuantity, SN-1 its comparator |
| ED (Base64), RP | Attachment in the R5 cross-version extension Observation.value |
|  | (R4 value[x] has no Attachment) |
| other (FN, XPN, HD, ...) | valueString of the text |

OBX-11 X (cannot be obtained) also sets dataAbsentReason: R4's data-absent-reason code
system has no "cannot-be-obtained", so the closest R4 code, not-performed, is used.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Callable
from typing import Any

from hl7_gateway.parser import Repetition, Segment
from hl7_gateway.v2_to_fhir.codes import mapped, table_coding
from hl7_gateway.v2_to_fhir.context import MappingContext
from hl7_gateway.v2_to_fhir.datatypes import (
    codeable,
    fhir_datetime,
    fhir_time,
    first,
    number,
    organization_reference,
    practitioner_reference,
    quantity,
)

__all__ = ["following_notes", "observation_from_obx", "obx_has_content"]

JSON = dict[str, Any]
INTERPRETATION = "http://terminology.hl7.org/CodeSystem/v3-ObservationInterpretation"
DATA_ABSENT = "http://terminology.hl7.org/CodeSystem/data-absent-reason"
VALUE_ATTACHMENT = "http://hl7.org/fhir/5.0/StructureDefinition/extension-Observation.value"
TEXT_TYPES = frozenset({"ST", "FT", "TX", "FN", "XPN", "XAD", "AD", "PN", "HD", "XON", "XCN",
                        "CX", "EI", "CP", "MO", "TN", "XTN"})
CODED_TYPES = frozenset({"CE", "CWE", "CNE", "CF", "IS", "ID", "CV"})

_RANGE = re.compile(r"^\s*([+-]?\d*\.?\d+)\s*(?:-|to|\u2013)\s*([+-]?\d*\.?\d+)\s*$", re.I)
_BOUND = re.compile(r"^\s*(<=?|>=?)\s*([+-]?\d*[.,]?\d+)\s*$")
_COMPARATORS = {"<", "<=", ">", ">="}
_DECIMAL_COMMA = re.compile(r"^\s*([+-]?\d+),(\d+)\s*$")
# "3,5-5,1": decimal commas inside a reference range (not "4,000": see _Numbers).
_RANGE_COMMA = re.compile(r"(?<=\d),(?=\d{1,2}(?!\d)|\d{4,})")


# --- values ------------------------------------------------------------------------------


def _text(rep: Repetition) -> str:
    return rep.text.strip()


class _Numbers:
    """Reads the numbers of one OBX-5; a decimal comma is read as a decimal point, with a
    warning for the sender.

    NM (and the numbers of SN and NR) has a decimal point only (HL7 v2.5.1 2.A.47), but
    laboratory systems set to a European locale send ``140,5``: read as text, the value
    would lose its unit and every comparison. One comma between digits, with no point,
    is read as a decimal comma, unless it could be a thousands separator (three digits
    after it and a non-zero integer part: ``4,000``): that stays text, as a thousandfold
    error in a result is worse than a result kept as text.
    """

    def __init__(self, obx: Segment, ctx: MappingContext) -> None:
        self.obx, self.ctx = obx, ctx

    def __call__(self, text: str) -> int | float | None:
        value = number(text)
        if value is not None:
            return value
        found = _DECIMAL_COMMA.match(text)
        if found is None or _maybe_thousands(found.group(1), found.group(2)):
            return None
        value = number(f"{found.group(1)}.{found.group(2)}")
        self.ctx.warn(self.obx, 5, f"'{text.strip()}' has a decimal comma; read as {value} "
                      "(NM takes a decimal point)", code=102)
        return value


def _maybe_thousands(whole: str, fraction: str) -> bool:
    return len(fraction) == 3 and int(whole.lstrip("+-") or "0") != 0


def _numeric(rep: Repetition, units: Repetition | None, sender: str, read: _Numbers
             ) -> JSON | None:
    raw = rep.component(1).strip()
    found = _BOUND.match(raw)
    value = read(found.group(2)) if found else read(raw)
    if value is None:
        return None
    result = quantity(value, units, sender)
    if found:
        result["comparator"] = found.group(1)
    return {"valueQuantity": result}


def _structured_numeric(rep: Repetition, units: Repetition | None, sender: str,
                        read: _Numbers) -> JSON | None:
    comparator, first_value = rep.component(1).strip(), read(rep.component(2))
    separator, second_value = rep.component(3).strip(), read(rep.component(4))
    if first_value is None:
        return None
    if separator in {":", "/"} and second_value is not None:
        return {"valueRatio": {"numerator": quantity(first_value, units, sender),
                               "denominator": {"value": second_value}}}
    if separator == "-" and second_value is not None:
        return {"valueRange": {"low": quantity(first_value, units, sender),
                               "high": quantity(second_value, units, sender)}}
    if separator == "+" or comparator not in _COMPARATORS | {"", "="}:
        # A grade ("2+") or a comparator FHIR has no code for ("<>"): the text says it all.
        return {"valueString": "".join(rep.components()).strip()}
    result = quantity(first_value, units, sender)
    if comparator in _COMPARATORS:
        result["comparator"] = comparator
    return {"valueQuantity": result}


def _numeric_range(rep: Repetition, units: Repetition | None, sender: str, read: _Numbers
                   ) -> JSON | None:
    low, high = read(rep.component(1)), read(rep.component(2))
    if low is None and high is None:
        return None
    value: JSON = {}
    if low is not None:
        value["low"] = quantity(low, units, sender)
    if high is not None:
        value["high"] = quantity(high, units, sender)
    return {"valueRange": value}


def _attachment(rep: Repetition, kind: str) -> JSON | None:
    if kind == "RP":
        pointer = rep.component(1).strip()
        if not pointer:
            return None
        attachment: JSON = {"url": pointer}
        media = "/".join(p for p in (rep.component(3).strip().lower(),
                                     rep.component(4).strip().lower()) if p)
    else:
        encoding, data = rep.component(4).strip().upper(), rep.component(5).strip()
        if not data:
            return None
        if encoding == "BASE64":
            try:
                base64.b64decode(data, validate=True)
            except (binascii.Error, ValueError):
                return None
        else:
            data = base64.b64encode(data.encode()).decode("ascii")
        attachment = {"data": data}
        media = "/".join(p for p in (rep.component(2).strip().lower(),
                                     rep.component(3).strip().lower()) if p)
    if "/" in media:
        attachment["contentType"] = media
    return {"extension": [{"url": VALUE_ATTACHMENT, "valueAttachment": attachment}]}


def _value(kind: str, rep: Repetition, units: Repetition | None, obx: Segment,
           ctx: MappingContext) -> JSON | None:
    """value[x] (or an extension) for one repetition of OBX-5; None if it cannot be read."""
    read = _Numbers(obx, ctx)
    converters: dict[str, Callable[[], JSON | None]] = {
        "NM": lambda: _numeric(rep, units, ctx.sender, read),
        "SN": lambda: _structured_numeric(rep, units, ctx.sender, read),
        "NR": lambda: _numeric_range(rep, units, ctx.sender, read),
        "DR": lambda: _period(rep, ctx),
        "TM": lambda: {"valueTime": t} if (t := fhir_time(rep.component(1))) else None,
        "ED": lambda: _attachment(rep, "ED"),
        "RP": lambda: _attachment(rep, "RP"),
    }
    if kind in converters:
        return converters[kind]()
    if kind in CODED_TYPES:
        concept = codeable(rep, ctx.sender)
        return {"valueCodeableConcept": concept} if concept else None
    if kind in {"DT", "DTM", "TS"}:
        moment = fhir_datetime(rep.component(1), ctx.default_tz)
        return {"valueDateTime": moment} if moment else None
    text = _text(rep) if kind in {"ST", "FT", "TX"} else " ".join(
        p.strip() for p in rep.components() if p.strip())
    return {"valueString": text} if text else None


def _period(rep: Repetition, ctx: MappingContext) -> JSON | None:
    start = fhir_datetime(rep.subcomponent(1, 1), ctx.default_tz) if rep.component(1) else None
    end = fhir_datetime(rep.subcomponent(2, 1), ctx.default_tz) if rep.component(2) else None
    period = {k: v for k, v in (("start", start), ("end", end)) if v}
    return {"valuePeriod": period} if period else None


def _apply_values(observation: JSON, obx: Segment, ctx: MappingContext) -> None:
    kind = obx.component(2, 1).strip().upper()
    reps = [r for r in obx.repetitions(5) if r.raw.strip()]
    if not reps:
        return
    units = first(obx, 6)
    if kind in {"ST", "FT", "TX"} and len(reps) > 1:
        observation["valueString"] = "\n".join(_text(r) for r in reps)
        return
    values = []
    for rep in reps:
        value = _value(kind, rep, units, obx, ctx)
        if value is None:
            ctx.warn(obx, 5, f"{rep.text!r} is not a valid {kind or 'value'}; "
                     "kept as text", code=102)
            value = {"valueString": rep.text.strip()}
        values.append(value)
    if len(values) == 1:
        observation.update(values[0])
        return
    # A repeating OBX-5 is one observation with several values (the IG's component rule).
    observation["component"] = [{"code": observation["code"], **v} for v in values
                                if "extension" not in v]


# --- the rest of the Observation -----------------------------------------------------------


def _reference_range(obx: Segment, units: Repetition | None, sender: str) -> JSON | None:
    text = obx.field(7).strip()
    if not text:
        return None
    pointed = _RANGE_COMMA.sub(".", text) if "." not in text else text
    found = _RANGE.match(pointed)
    reference: JSON = {"text": text}
    if found:
        low, high = number(found.group(1)), number(found.group(2))
        if low is not None:
            reference["low"] = _simple_quantity(quantity(low, units, sender))
        if high is not None:
            reference["high"] = _simple_quantity(quantity(high, units, sender))
        return reference
    bound = _BOUND.match(pointed)
    if bound:
        value = number(bound.group(2))
        if value is not None:
            side = "high" if bound.group(1).startswith("<") else "low"
            reference[side] = _simple_quantity(quantity(value, units, sender))
    return reference


def _simple_quantity(value: JSON) -> JSON:
    return {k: v for k, v in value.items() if k != "comparator"}


def _interpretation(obx: Segment) -> list[JSON]:
    found: list[JSON] = []
    for rep in obx.repetitions(8):
        code = rep.component(1).strip()
        if not code:
            continue
        v3 = mapped("interpretation", code)
        if v3:
            coding: JSON = {"system": INTERPRETATION, "code": v3}
            display = table_coding("0078", code)
            if display and display.get("display"):
                coding["display"] = display["display"]
            found.append({"coding": [coding]})
        else:
            found.append({"text": rep.component(2).strip() or code})
    return found


def _status(observation: JSON, obx: Segment, ctx: MappingContext) -> None:
    code = obx.component(11, 1).strip().upper()
    status = mapped("observation_status", code) if code else None
    if status is None:
        if code:
            ctx.warn(obx, 11, f"{code!r} is not a table 0085 code; status unknown", code=103)
        status = "unknown"
    observation["status"] = status
    if code == "X":
        observation["dataAbsentReason"] = {"coding": [{"system": DATA_ABSENT,
                                                       "code": "not-performed"}]}
        for key in [k for k in observation if k.startswith("value")]:
            del observation[key]


def _performers(obx: Segment, ctx: MappingContext) -> list[JSON]:
    people = [r for rep in obx.repetitions(16)
              if (r := practitioner_reference(rep, ctx.sender))]
    organization = organization_reference(first(obx, 23), ctx.sender)
    return people + ([organization] if organization else [])


def following_notes(ctx: MappingContext, segment: Segment) -> list[str]:
    """NTE-3 texts of the NTE segments right after ``segment``."""
    notes: list[str] = []
    for seg in ctx.following(segment):
        if seg.id != "NTE":
            break
        text = "\n".join(r.text.strip() for r in seg.repetitions(3) if r.text.strip())
        if text:
            notes.append(text)
    return notes


def obx_has_content(obx: Segment) -> bool:
    """Whether the OBX names what it observes or carries a value at all."""
    if obx.component(3, 1).strip() or obx.component(3, 2).strip():
        return True
    kind = obx.component(2, 1).strip().upper()
    # An ED without its data component, or an RP without its pointer, carries nothing.
    part = {"ED": 5, "RP": 1}.get(kind)
    for rep in obx.repetitions(5):
        present = rep.component(part) if part else "".join(rep.components())
        if present.strip():
            return True
    return False


def observation_from_obx(obx: Segment, ctx: MappingContext, links: JSON,
                         *, effective: str | None, category: JSON | None) -> JSON:
    """The Observation of one OBX.

    ``links`` are the elements every Observation of the group shares (subject, encounter,
    basedOn, specimen); ``effective`` is the group's time (OBR-7) for an OBX without OBX-14.
    """
    code = codeable(first(obx, 3), ctx.sender)
    if code is None:
        raise ctx.fail(obx, 3, "observation identifier is empty")
    observation: JSON = {"resourceType": "Observation", "status": "unknown", "code": code}
    if category:
        observation["category"] = [category]
    observation.update(links)
    _apply_values(observation, obx, ctx)
    _status(observation, obx, ctx)
    units = first(obx, 6)
    reference = _reference_range(obx, units, ctx.sender)
    if reference:
        observation["referenceRange"] = [reference]
    interpretation = _interpretation(obx)
    if interpretation:
        observation["interpretation"] = interpretation
    when = obx.component(14, 1).strip()
    moment = fhir_datetime(when, ctx.default_tz) if when else None
    if when and moment is None:
        ctx.warn(obx, 14, f"{when!r} is not a valid date/time; dropped")
    if moment or effective:
        observation["effectiveDateTime"] = moment or effective
    performers = _performers(obx, ctx)
    if performers:
        observation["performer"] = performers
    method = codeable(first(obx, 17), ctx.sender)
    if method:
        observation["method"] = method
    notes = following_notes(ctx, obx)
    if notes:
        observation["note"] = [{"text": n} for n in notes]
    return observation
