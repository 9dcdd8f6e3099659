"""The primitive types: the JSON type each is written as, its format and its range.

The formats are the regular expressions of the R4 type definitions (the ``regex``
extension on each primitive's ``value``), read from the shipped StructureDefinitions. On
top of them, what the specification states in prose and the reference validator checks:
dates that exist (no 30 February), a time zone on a dateTime that has a time, 32-bit
integers, decoding base64, no whitespace at either end of a string (a warning), no
empty strings.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Callable
from datetime import date
from decimal import Decimal, InvalidOperation
from functools import cache
from typing import Any

from fhir_server.conformance.definitions import core_url, shipped_structure_definitions

REGEX_EXTENSION = "http://hl7.org/fhir/StructureDefinition/regex"
# The JSON representation of each primitive (R4 JSON 2.6.2): numbers and booleans are
# JSON numbers and booleans, everything else a string.
JSON_NUMBER_TYPES = frozenset({"integer", "positiveInt", "unsignedInt", "decimal"})
INTEGER_TYPES = frozenset({"integer", "positiveInt", "unsignedInt"})
INT32 = (-2_147_483_648, 2_147_483_647)
STRING_MAX = 1024 * 1024  # R4: strings SHALL NOT exceed 1 MB

# (severity, IssueType code, message)
Problem = tuple[str, str, str]


@cache
def _regex(type_code: str) -> re.Pattern[str] | None:
    sd = shipped_structure_definitions().get(core_url(type_code))
    if sd is None:
        return None
    for element in sd["snapshot"]["element"]:
        if element["path"] != f"{type_code}.value":
            continue
        for type_json in element.get("type") or ():
            for extension in type_json.get("extension") or ():
                if extension.get("url") == REGEX_EXTENSION:
                    return re.compile(extension["valueString"])
        for extension in element.get("extension") or ():
            if extension.get("url") == REGEX_EXTENSION:
                return re.compile(extension["valueString"])
    return None


def json_type_problem(type_code: str, value: Any) -> str | None:
    """Why ``value`` is not the JSON a ``type_code`` is written as, or None."""
    if type_code == "boolean":
        return None if isinstance(value, bool) else "must be a JSON boolean (true or false)"
    if type_code in INTEGER_TYPES:
        if isinstance(value, bool) or not isinstance(value, int):
            return "must be a JSON number without a fraction"
        return None
    if type_code == "decimal":
        if isinstance(value, bool) or not isinstance(value, int | float | Decimal):
            return "must be a JSON number"
        return None
    if not isinstance(value, str):
        return "must be a JSON string"
    return None


def check_primitive(type_code: str, value: Any) -> list[Problem]:
    """What is wrong with ``value`` as a ``type_code`` (an empty list when nothing)."""
    problem = json_type_problem(type_code, value)
    if problem is not None:
        return [("error", "structure", f"the value {_show(value)} {problem}, as a "
                 f"{type_code} is")]
    found: list[Problem] = []
    if isinstance(value, str):
        if value == "":
            return [("error", "invalid", "a value cannot be empty (\"\"): leave the "
                     "element out instead")]
        if type_code in ("string", "markdown") and value != value.strip():
            found.append(("warning", "invalid", "the value should not start or finish "
                          "with whitespace"))
        if len(value) > STRING_MAX:
            found.append(("error", "too-long", f"the value is longer than {STRING_MAX} "
                          "characters"))
    checker = _CHECKS.get(type_code)
    if checker is not None:
        message = checker(value)
        if message is not None:
            return [*found, ("error", "value", message)]
    if type_code in INTEGER_TYPES or type_code == "decimal" or type_code == "xhtml":
        return found
    regex = _regex(type_code)
    if regex is not None and isinstance(value, str) and not regex.fullmatch(value):
        found.append(("error", "value", f"{_show(value)} is not a valid {type_code}"))
    return found


def _show(value: Any) -> str:
    text = repr(value) if not isinstance(value, str) else f"'{value}'"
    return text if len(text) <= 80 else text[:77] + "..."


def _integer(low: int, high: int, name: str) -> Callable[[Any], str | None]:
    def check(value: Any) -> str | None:
        if value < low or value > high:
            return f"{value} is outside the range of a {name} ({low}..{high})"
        return None
    return check


_DATE = re.compile(r"(\d{4})(?:-(\d{2})(?:-(\d{2}))?)?")


def _real_date(text: str) -> str | None:
    """The date part of a date/dateTime/instant must exist on the calendar."""
    match = _DATE.match(text)
    if match is None or match.group(3) is None:
        return None
    try:
        date(int(match.group(1)), int(match.group(2)), int(match.group(3)))
    except ValueError:
        return f"'{text}' is not a date that exists"
    return None


def _date(value: str) -> str | None:
    regex = _regex("date")
    if regex is not None and not regex.fullmatch(value):
        return f"'{value}' is not a valid date (YYYY, YYYY-MM or YYYY-MM-DD)"
    return _real_date(value)


def _date_time(value: str) -> str | None:
    regex = _regex("dateTime")
    if regex is not None and not regex.fullmatch(value):
        return f"'{value}' is not a valid dateTime"
    if "T" in value and not (value.endswith("Z") or re.search(r"[+-]\d\d:\d\d$", value)):
        return f"'{value}' has a time but no time zone (a dateTime with a time needs one)"
    return _real_date(value)


def _instant(value: str) -> str | None:
    regex = _regex("instant")
    if regex is not None and not regex.fullmatch(value):
        return f"'{value}' is not a valid instant (a full date, time and time zone)"
    return _real_date(value)


def _decimal(value: Any) -> str | None:
    try:
        Decimal(str(value))
    except InvalidOperation:
        return f"{value!r} is not a decimal"
    return None


def _base64(value: str) -> str | None:
    compact = "".join(value.split())
    try:
        base64.b64decode(compact, validate=True)
    except (binascii.Error, ValueError):
        return "the value is not valid base64"
    return None


_UUID = re.compile(r"urn:uuid:[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
_OID = re.compile(r"urn:oid:[0-2](\.(0|[1-9][0-9]*))+")


def _uri(value: str) -> str | None:
    if any(c.isspace() for c in value):
        return f"URI values cannot contain whitespace ('{value}')"
    if value.startswith("urn:uuid:") and not _UUID.fullmatch(value):
        return f"'{value}' is not a valid UUID URN (urn:uuid: and a lower-case UUID)"
    if value.startswith("urn:oid:") and not _OID.fullmatch(value):
        return f"'{value}' is not a valid OID URN"
    return None


_CHECKS: dict[str, Callable[[Any], str | None]] = {
    "integer": _integer(*INT32, "integer"),
    "positiveInt": _integer(1, INT32[1], "positiveInt"),
    "unsignedInt": _integer(0, INT32[1], "unsignedInt"),
    "decimal": _decimal,
    "date": _date,
    "dateTime": _date_time,
    "instant": _instant,
    "base64Binary": _base64,
    "uri": _uri,
    "url": _uri,
    "canonical": _uri,
}


def decimal_of(value: Any) -> Decimal | None:
    try:
        return Decimal(str(value))
    except InvalidOperation:
        return None


def compare_limit(type_code: str, value: Any, limit: Any) -> int | None:
    """-1, 0 or 1 as ``value`` is below, at or above ``limit`` (a minValue/maxValue of
    the same type); None when they cannot be compared."""
    if type_code in JSON_NUMBER_TYPES:
        a, b = decimal_of(value), decimal_of(limit)
        if a is None or b is None:
            return None
        return (a > b) - (a < b)
    if isinstance(value, str) and isinstance(limit, str):
        if type_code in ("date", "dateTime", "instant", "time"):
            # ISO 8601 texts of the same precision compare as strings
            width = min(len(value), len(limit))
            a_text, b_text = value[:width], limit[:width]
            return (a_text > b_text) - (a_text < b_text)
        return (value > limit) - (value < limit)
    return None
