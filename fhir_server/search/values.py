"""Value forms shared by index extraction and search parsing, so both sides of a
comparison are normalized the same way: strings (lower case, accents removed), reference
strings, number precision ranges and the open ends of date ranges."""

from __future__ import annotations

import unicodedata
from decimal import Decimal, InvalidOperation
from typing import NamedTuple

# Open ends of a date range (a Period without start or end).
DATE_MIN = "0001-01-01T00:00:00.000000Z"
DATE_MAX = "9999-12-31T23:59:59.999999Z"


def normalize(text: str) -> str:
    """Lower case without accents: ``Zoë`` and ``ZOE`` both become ``zoe``."""
    if text.isascii():
        return text.lower()
    decomposed = unicodedata.normalize("NFKD", text)
    return "".join(c for c in decomposed if not unicodedata.combining(c)).casefold()


class ParsedReference(NamedTuple):
    resource_type: str | None
    id: str | None
    url: str | None  # absolute or canonical URL (version stripped); None when relative


def parse_reference(reference: str) -> ParsedReference:
    """``Patient/1``, ``Patient/1/_history/2``, ``https://x/fhir/Patient/1``, ``urn:uuid:…``,
    or a canonical ``http://x/Questionnaire/q|2.0``."""
    if reference.startswith("#"):
        return ParsedReference(None, None, None)
    if "://" in reference or reference.startswith("urn:"):
        url = reference.split("|", 1)[0]
        path = url.rstrip("/").split("/")
        if len(path) >= 4 and path[-2] == "_history":
            path = path[:-2]
        kind = path[-2] if len(path) >= 2 and path[-2][:1].isupper() else None
        return ParsedReference(kind, None, url)
    parts = reference.split("/")
    if len(parts) >= 2 and parts[0][:1].isupper():
        return ParsedReference(parts[0], parts[1], None)
    return ParsedReference(None, reference, None)


def number_range(text: str) -> tuple[float, float, float]:
    """``(value, lo, hi)``: the value and the interval its precision implies.

    R4 search: ``100`` means [99.5, 100.5), ``100.0`` means [99.95, 100.05), ``1e2`` is
    [50, 150). Raises ValueError when the text is not a number.
    """
    try:
        number = Decimal(text)
    except InvalidOperation:
        raise ValueError(f"{text!r} is not a number") from None
    if not number.is_finite():
        raise ValueError(f"{text!r} is not a finite number")
    exponent = number.as_tuple().exponent
    assert isinstance(exponent, int)
    half = Decimal(5).scaleb(exponent - 1)
    return float(number), float(number - half), float(number + half)
