"""Index extraction: a resource → the search-index rows every store adapter keeps.

This runs on every write, so each resource type's parameters are prepared once (compiled
evaluator + the converter for its parameter type) and a write only evaluates and converts.
The rows' fields are named in :data:`fhir_server.store.index.FIELDS`, each row starting
with the parameter code:

- ``string``: (param, normalized, exact)
- ``token``: (param, system, code, normalized display/text)
- ``date``: (param, lo, hi) — half-open UTC range as sortable text
- ``number``: (param, lo, hi)
- ``quantity``: (param, system, code, lo, hi, ncode, nlo, nhi) — the value as sent, and
  normalized: converted to its UCUM base unit when the unit is known
  (:mod:`fhir_server.search.units`), else as sent
- ``reference``: (param, target_type, target_id, url)
- ``uri``: (param, value)
- ``composite``: (param, system, code, value_system, value_code, lo, hi)
- ``text``: (narrative, content) — one row per resource for ``_text`` / ``_content``

Values are read by shape, because FHIR JSON carries no datatypes: a dict with ``coding``
is a CodeableConcept, one with ``start``/``end`` a Period, and so on. Two derived token
forms are stored under suffixed parameter names so they stay indexed lookups:
``identifier:of-type`` (code ``<type code>|<value>``) and ``<reference param>:identifier``
(logical references by identifier).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from typing import Any

from fhir_server.search.dates import date_range
from fhir_server.search.fhirpath import split_union
from fhir_server.search.phonetic import PARAM as PHONETIC
from fhir_server.search.phonetic import phonetic_code
from fhir_server.search.registry import (
    FULL_TEXT,
    RESOURCE_COLUMNS,
    SearchParam,
    SearchRegistry,
)
from fhir_server.search.units import UCUM, canonical
from fhir_server.search.values import DATE_MAX, DATE_MIN, normalize, parse_reference
from fhir_server.store.port import IndexRows

Rows = dict[str, list[tuple[Any, ...]]]
Convert = Callable[[str, list[Any], Rows], None]

_TAG = re.compile(r"<[^>]+>")
_NAME_PARTS = ("family", "given", "prefix", "suffix", "text")
_ADDRESS_PARTS = ("line", "city", "district", "state", "postalCode", "country", "text")
# Not content: identifiers of things, the XHTML, binary data, and the resource's meta
# (versions, tags, security labels: an owner label's code on every resource filled the
# full-text index with ids nobody searches for).
_CONTENT_SKIP = frozenset({"id", "reference", "system", "url", "div", "versionId",
                           "lastUpdated", "fullUrl", "data", "profile", "meta"})


# --- converters: values → rows -----------------------------------------------------------

def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        parts = _NAME_PARTS if "family" in value or "given" in value else (
            _ADDRESS_PARTS if "city" in value or "line" in value or "postalCode" in value
            else tuple(value))
        for part in parts:
            item = value.get(part)
            if isinstance(item, str):
                yield item
            elif isinstance(item, list):
                yield from (s for s in item if isinstance(s, str))


def _string(code: str, values: list[Any], rows: Rows) -> None:
    out = rows.setdefault("string", [])
    for value in values:
        for text in _strings(value):
            out.append((code, normalize(text), text))


def _phonetic(code: str, values: list[Any], rows: Rows) -> None:
    """A ``phonetic`` parameter's rows: the code of each name part, not its text."""
    out = rows.setdefault("string", [])
    for value in values:
        for text in _strings(value):
            if sound := phonetic_code(text):
                out.append((code, sound, text))


def _tokens(value: Any) -> list[tuple[str | None, str | None, str | None]]:
    """(system, code, text) of a token value. A CodeableConcept gives one row per coding,
    its text (``:text`` searches it and the codings' displays) folded into every row."""
    if isinstance(value, str):
        return [(None, value, None)]
    if isinstance(value, bool):
        return [(None, "true" if value else "false", None)]
    if isinstance(value, (int, float)):
        return [(None, str(value), None)]
    if not isinstance(value, dict):
        return []
    if "coding" in value or ("text" in value and "value" not in value and "code" not in value):
        text = value.get("text")
        concept_text = normalize(text) if isinstance(text, str) else None
        rows = [(system, code, _texts(display, concept_text))
                for coding in value.get("coding") or () if isinstance(coding, dict)
                for system, code, display in _tokens(coding)]
        return rows or ([(None, None, concept_text)] if concept_text else [])
    if "code" in value:  # Coding (and Quantity/Money-like codes)
        display = value.get("display")
        return [(value.get("system"), value.get("code"),
                 normalize(display) if isinstance(display, str) else None)]
    if "value" in value:  # Identifier, ContactPoint
        kind = value.get("type")
        text = kind.get("text") if isinstance(kind, dict) else None
        return [(value.get("system"), _text(value["value"]), normalize(text) if text else None)]
    return []


def token_codes(values: list[Any]) -> frozenset[tuple[str | None, str | None]]:
    """(system, code) of every token the values of a token parameter index (what a token
    search matches), for checking one resource in memory."""
    return frozenset((system, code) for value in values for system, code, _ in _tokens(value))


def _texts(first: str | None, second: str | None) -> str | None:
    """Both texts for a contains-match (``\x1f`` never occurs in search terms)."""
    if first and second and first != second:
        return f"{first}\x1f{second}"
    return first or second


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else (None if value is None else str(value))


def _token(code: str, values: list[Any], rows: Rows) -> None:
    out = rows.setdefault("token", [])
    for value in values:
        out.extend([(code, *t) for t in _tokens(value)])
        if isinstance(value, dict) and "value" in value and isinstance(value.get("type"), dict):
            # identifier:of-type=<type system>|<type code>|<value>
            for coding in value["type"].get("coding") or ():
                if isinstance(coding, dict) and coding.get("code"):
                    out.append((f"{code}:of-type", coding.get("system"),
                                f"{coding['code']}|{value['value']}", None))


def _date_span(value: Any) -> tuple[str, str] | None:
    try:
        if isinstance(value, str):
            return date_range(value)
        if isinstance(value, dict):
            if "start" in value or "end" in value:  # Period
                lo = date_range(value["start"])[0] if value.get("start") else DATE_MIN
                hi = date_range(value["end"])[1] if value.get("end") else DATE_MAX
                return lo, hi
            if "event" in value or "repeat" in value:  # Timing
                spans = [s for s in map(_date_span, value.get("event") or ()) if s]
                bounds = (value.get("repeat") or {}).get("boundsPeriod")
                if bounds:
                    spans += [s for s in [_date_span(bounds)] if s]
                if spans:
                    return min(s[0] for s in spans), max(s[1] for s in spans)
    except ValueError:
        return None  # a time ("10:30") or malformed text: not a searchable date
    return None


def _date(code: str, values: list[Any], rows: Rows) -> None:
    out = rows.setdefault("date", [])
    for value in values:
        span = _date_span(value)
        if span is not None:
            out.append((code, *span))


def _number_of(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, dict) and isinstance(value.get("value"), (int, float)):
        return float(value["value"])
    return None


def _number(code: str, values: list[Any], rows: Rows) -> None:
    out = rows.setdefault("number", [])
    for value in values:
        if isinstance(value, dict) and ("low" in value or "high" in value):
            lo, hi = _number_of(value.get("low")), _number_of(value.get("high"))
            out.append((code, lo if lo is not None else float("-inf"),
                        hi if hi is not None else float("inf")))
        elif (number := _number_of(value)) is not None:
            out.append((code, number, number))


def _quantity_row(code: str, system: str | None, unit: Any, lo: float, hi: float
                  ) -> tuple[Any, ...]:
    if system == UCUM and isinstance(unit, str):
        low, high = canonical(lo, unit), canonical(hi, unit)
        if low is not None and high is not None:
            return code, system, unit, lo, hi, low[0], low[1], high[1]
    return code, system, unit, lo, hi, unit, lo, hi


def _quantity(code: str, values: list[Any], rows: Rows) -> None:
    out = rows.setdefault("quantity", [])
    for value in values:
        if not isinstance(value, dict):
            if (number := _number_of(value)) is not None:
                out.append(_quantity_row(code, None, None, number, number))
            continue
        if "low" in value or "high" in value:  # Range
            low, high = value.get("low") or {}, value.get("high") or {}
            lo, hi = _number_of(low), _number_of(high)
            unit = low.get("code") or high.get("code") or low.get("unit") or high.get("unit")
            out.append(_quantity_row(code, low.get("system") or high.get("system"), unit,
                                     lo if lo is not None else float("-inf"),
                                     hi if hi is not None else float("inf")))
        elif (number := _number_of(value)) is not None:
            system = value.get("system") or ("urn:iso:std:iso:4217" if "currency" in value
                                             else None)
            unit = value.get("code") or value.get("currency") or value.get("unit")
            out.append(_quantity_row(code, system, unit, number, number))


def _reference(code: str, values: list[Any], rows: Rows) -> None:
    out = rows.setdefault("reference", [])
    for value in values:
        if isinstance(value, str):  # canonical / uri
            out.append((code, *parse_reference(value)))
        elif isinstance(value, dict):
            if isinstance(value.get("reference"), str):
                parsed = parse_reference(value["reference"])
                if parsed.id or parsed.url:
                    out.append((code, *parsed))
            elif "resourceType" in value:  # an embedded resource (Bundle.entry[0].resource)
                out.append((code, value["resourceType"], value.get("id"), None))
            identifier = value.get("identifier")
            if isinstance(identifier, dict) and "value" in identifier:
                rows.setdefault("token", []).append(
                    (f"{code}:identifier", identifier.get("system"), _text(identifier["value"]),
                     None))


def _uri(code: str, values: list[Any], rows: Rows) -> None:
    out = rows.setdefault("uri", [])
    out.extend((code, v) for v in values if isinstance(v, str))


_CONVERTERS: dict[str, Convert] = {
    "string": _string, "token": _token, "date": _date, "number": _number,
    "quantity": _quantity, "reference": _reference, "uri": _uri,
}


# --- composites --------------------------------------------------------------------------

def _composite_values(kind: str, value: Any) -> Iterator[tuple[Any, Any, Any, Any]]:
    """(value_system, value_code, lo, hi) of a composite's second component."""
    if kind == "token":
        for system, code, _display in _tokens(value):
            if code is not None:
                yield system, code, None, None
    elif kind == "quantity" and isinstance(value, dict):
        number = _number_of(value)
        if number is not None:
            yield value.get("system"), value.get("code") or value.get("unit"), number, number
    elif kind == "string":
        for text in _strings(value):
            yield None, normalize(text), None, None
    elif kind == "date":
        span = _date_span(value)
        if span is not None:
            yield None, None, span[0], span[1]
    elif kind == "number":
        number = _number_of(value)
        if number is not None:
            yield None, None, number, number
    elif kind == "reference" and isinstance(value, dict) and isinstance(value.get("reference"),
                                                                          str):
        parsed = parse_reference(value["reference"])
        yield parsed.resource_type, parsed.id or parsed.url, None, None
    elif kind == "uri" and isinstance(value, str):
        yield None, value, None, None


class _Composite:
    """Evaluates a composite parameter: pairs of (token, value) taken from the same element."""

    def __init__(self, registry: SearchRegistry, resource_type: str, param: SearchParam):
        assert param.expression is not None
        self.code = param.code
        self.elements = registry.evaluator(resource_type, param.expression)
        first, second = param.components
        self.first = registry.relative_evaluator(first.expression)
        self.second = registry.relative_evaluator(second.expression)
        self.kind = second.type

    def __call__(self, resource: dict[str, Any], rows: Rows) -> None:
        if self.elements is None or self.first is None or self.second is None:
            return
        out = rows.setdefault("composite", [])
        for element in self.elements(resource):
            heads = [t for v in self.first(element, resource) for t in _tokens(v)
                     if t[1] is not None]
            if not heads:
                continue
            tails = [t for v in self.second(element, resource)
                     for t in _composite_values(self.kind, v)]
            for system, code, _display in heads:
                out.extend((self.code, system, code, *tail) for tail in tails)


# --- full text ---------------------------------------------------------------------------

_SKIP_CONTENT = _CONTENT_SKIP | {"resourceType"}


def full_text(resource: dict[str, Any]) -> tuple[str, str]:
    """(narrative, content): the narrative's text, and every distinct string value of the
    resource except identifiers of things (ids, references, systems, urls, the XHTML).

    An explicit stack rather than recursion: this runs on every write."""
    text = resource.get("text")
    div = text.get("div") if isinstance(text, dict) else None
    narrative = _TAG.sub(" ", div) if isinstance(div, str) else ""
    parts: list[str] = []
    stack: list[Any] = [resource]
    while stack:
        node = stack.pop()
        for key, item in (node.items() if type(node) is dict else enumerate(node)):
            if key in _SKIP_CONTENT:
                continue
            kind = type(item)
            if kind is str:
                parts.append(item)
            elif kind is dict or kind is list:
                stack.append(item)
    return narrative, " ".join(dict.fromkeys(parts))


# --- the extractor -----------------------------------------------------------------------

Step = Callable[[dict[str, Any], Rows], None]
_LEADING_LOWER = re.compile(r"[a-z]+")
_BASES: dict[str, str] = {}  # element name → its leading lower-case part (memo)


def _base(key: str) -> str:
    base = _BASES.get(key)
    if base is None:
        match = _LEADING_LOWER.match(key)
        base = _BASES[key] = match.group() if match is not None else key
    return base


def present_elements(resource: dict[str, Any]) -> set[str]:
    """Top-level element names of a resource, choice elements also by their base name
    (``valueQuantity`` → ``value``), to match :meth:`Compiler.gates`."""
    present = set(resource)
    present.update(_base(key) for key in resource)
    return present


class IndexExtractor:
    """``extractor(resource) -> IndexRows`` for the parameters of the registry."""

    def __init__(self, registry: SearchRegistry):
        self.registry = registry
        self._plans: dict[str, list[tuple[frozenset[str] | None, Step]]] = {}

    def __call__(self, resource: dict[str, Any]) -> IndexRows:
        resource_type = resource["resourceType"]
        plan = self._plans.get(resource_type)
        if plan is None:
            plan = self._plans[resource_type] = self._plan(resource_type)
        present = present_elements(resource)
        rows: Rows = {}
        for gates, step in plan:
            if gates is None or not gates.isdisjoint(present):
                step(resource, rows)
        rows["text"] = [full_text(resource)]
        return IndexRows({table: _unique(values) for table, values in rows.items() if values})

    def _plan(self, resource_type: str) -> list[tuple[frozenset[str] | None, Step]]:
        steps: list[tuple[frozenset[str] | None, Step]] = []
        for param in self.registry.params(resource_type).values():
            if not param.searchable or param.code in RESOURCE_COLUMNS | FULL_TEXT \
                    or param.union_of:  # its values are the rows of the parameters it unites
                continue
            assert param.expression is not None
            if param.type == "composite":
                steps.append((self._composite_gates(resource_type, param),
                              _Composite(self.registry, resource_type, param)))
                continue
            evaluate = self.registry.evaluator(resource_type, param.expression)
            if evaluate is not None:
                convert = (_phonetic if param.code == PHONETIC and param.type == "string"
                           else _CONVERTERS[param.type])
                steps.append((self.registry.gates(param.expression),
                              _step(param.code, evaluate, convert)))
        return steps

    def _composite_gates(self, resource_type: str, param: SearchParam) -> frozenset[str] | None:
        assert param.expression is not None
        gates: set[str] = set()
        for part in split_union(param.expression):
            # On the resource itself the value component decides: code-value-quantity has
            # nothing to index on an Observation without valueQuantity.
            found = (self.registry.gates(param.components[-1].expression, relative=True)
                     if part == resource_type else self.registry.gates(part))
            if found is None:
                return None
            gates |= found
        return frozenset(gates)


def _step(code: str, evaluate: Callable[[dict[str, Any]], list[Any]], convert: Convert
          ) -> Callable[[dict[str, Any], Rows], None]:
    def step(resource: dict[str, Any], rows: Rows) -> None:
        values = evaluate(resource)
        if values:
            convert(code, values, rows)
    return step


def _unique(rows: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    return list(dict.fromkeys(rows)) if len(rows) > 1 else rows
