"""The search-index rows a write stores with its resource, named for every adapter.

The FHIR service extracts, from each version it writes, one row per value of each search
parameter (:mod:`fhir_server.search.extract`), grouped by the parameter's kind; an
adapter stores them in the same atomic step as the resource (SQLite: one table per kind,
``idx_<kind>``; MongoDB: arrays in the resource's document) and compiles search plans
against them. :data:`FIELDS` names each kind's fields once, for the extractor and every
adapter (SQLite derives its columns from it).

Rows are plain tuples in the order of their fields, typed by the aliases below: a write
builds dozens of them, and a ``NamedTuple`` cost six times as much to build (measured:
164 ns against 26 ns a row) and cannot be serialized by orjson for the bulk inserts.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

FIELDS: Mapping[str, tuple[str, ...]] = {
    # value normalized (lower case, accents removed) for prefix and contains, and as sent
    "string": ("param", "value", "exact"),
    # normalized display / text for :text
    "token": ("param", "system", "code", "text"),
    # half-open range [lo, hi) of UTC instants as sortable text
    "date": ("param", "lo", "hi"),
    "number": ("param", "lo", "hi"),
    # the value as sent, and n*: converted to its UCUM base unit when the unit is known
    "quantity": ("param", "system", "code", "lo", "hi", "ncode", "nlo", "nhi"),
    "reference": ("param", "target_type", "target_id", "url"),
    "uri": ("param", "value"),
    # the token component, and the value component as a token or a range
    "composite": ("param", "system", "code", "vsystem", "vcode", "lo", "hi"),
    # one row per resource, for _text and _content
    "text": ("narrative", "content"),
}

Number = float
StringRow = tuple[str, str, str]
TokenRow = tuple[str, str | None, str | None, str | None]
DateRow = tuple[str, str, str]
NumberRow = tuple[str, Number, Number]
QuantityRow = tuple[str, str | None, str | None, Number, Number, str | None, Number, Number]
ReferenceRow = tuple[str, str | None, str | None, str | None]
UriRow = tuple[str, str]
CompositeRow = tuple[str, str | None, str | None, str | None, str | None, object, object]
TextRow = tuple[str, str]
# IndexRows.rows maps each kind to its rows; by kind they are the aliases above.
Row = tuple[Any, ...]


def as_document(kind: str, row: tuple[object, ...]) -> dict[str, object]:
    """A row as a mapping of its field names (a document store's shape)."""
    return dict(zip(FIELDS[kind], row, strict=True))
