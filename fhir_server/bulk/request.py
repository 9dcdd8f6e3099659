"""The kick-off request of a bulk export (FHIR Bulk Data Access IG 2.0, ``$export``).

``GET [base]/$export``, ``[base]/Patient/$export`` and ``[base]/Group/[id]/$export`` take
their parameters in the query; ``POST`` takes the same as a ``Parameters`` body
(``valueString`` / ``valueInstant`` / ``valueCode``). Parameters:

- ``_outputFormat``: ``application/fhir+ndjson`` (also its abbreviations
  ``application/ndjson`` and ``ndjson``), the default; anything else is a 400;
- ``_type``: comma-separated resource types (repeatable); unknown types are a 400; at
  patient and group level only the Patient compartment's types (and Patient);
- ``_since``: an instant with a time zone; only resources changed after it;
- ``_typeFilter``: ``Type?search`` (repeatable), a search each resource of that type must
  match (several for one type: any of them); its type must be among ``_type`` when
  ``_type`` is given.

``_elements``, ``patient``, ``includeAssociatedData`` and ``_until`` are not offered: with
``Prefer: handling=strict`` they are a 400, otherwise ignored (as the IG asks) and named
in the manifest's error file.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl

from fhir_server.outcome import FhirError

JSON = dict[str, Any]
NDJSON = "application/fhir+ndjson"
OUTPUT_FORMATS = frozenset({NDJSON, "application/ndjson", "ndjson"})
SYSTEM, PATIENT, GROUP = "system", "patient", "group"
NOT_OFFERED = ("_elements", "patient", "includeAssociatedData", "_until")
KNOWN = ("_outputFormat", "_type", "_since", "_typeFilter", *NOT_OFFERED)
# An instant: seconds required, a time zone required (FHIR instant).
_INSTANT = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:\d{2})$")


@dataclass(frozen=True, slots=True)
class ExportRequest:
    """What to export; kept with the job (``to_json``) so a restart resumes the same."""

    level: str  # system | patient | group
    url: str  # the kick-off URL, for the manifest's ``request``
    group_id: str | None = None
    types: tuple[str, ...] | None = None  # None: every type the level covers
    since: str | None = None
    type_filters: dict[str, tuple[str, ...]] = field(default_factory=dict)  # type → queries
    ignored: tuple[str, ...] = ()  # parameters not offered, ignored (lenient handling)

    def to_json(self) -> JSON:
        return {"level": self.level, "url": self.url, "group_id": self.group_id,
                "types": list(self.types) if self.types is not None else None,
                "since": self.since,
                "type_filters": {t: list(q) for t, q in self.type_filters.items()},
                "ignored": list(self.ignored)}

    @classmethod
    def from_json(cls, data: JSON) -> ExportRequest:
        types = data.get("types")
        return cls(data["level"], data["url"], data.get("group_id"),
                   tuple(types) if types is not None else None, data.get("since"),
                   {t: tuple(q) for t, q in (data.get("type_filters") or {}).items()},
                   tuple(data.get("ignored") or ()))


def parse_request(params: list[tuple[str, str]], *, level: str, url: str,
                  known_types: frozenset[str], level_types: frozenset[str] | None,
                  group_id: str | None = None, strict: bool = False) -> ExportRequest:
    """An :class:`ExportRequest` from the kick-off parameters, or a 400 naming the one
    that is wrong. ``level_types``: the types the level may export (None: any)."""
    types: list[str] | None = None
    since: str | None = None
    filters: dict[str, list[str]] = {}
    ignored: list[str] = []
    for name, value in params:
        if name == "_outputFormat":
            if value not in OUTPUT_FORMATS:
                raise FhirError.of(400, "not-supported", f"_outputFormat {value!r} is not "
                                   f"offered; use {NDJSON}", "_outputFormat")
        elif name == "_type":
            types = [*(types or []), *_types(value, known_types, level_types, level)]
        elif name == "_since":
            if not _INSTANT.match(value):
                raise FhirError.of(400, "value", "_since must be an instant with a time "
                                   "zone, e.g. 2026-01-31T00:00:00Z", "_since")
            since = value
        elif name == "_typeFilter":
            resource_type, _, query = value.partition("?")
            _types(resource_type, known_types, level_types, level, "_typeFilter")
            filters.setdefault(resource_type, []).append(query)
        elif name not in ("_format", "_pretty"):
            if strict:
                raise FhirError.of(400, "not-supported", f"{name} is not offered by this "
                                   "server's $export", name)
            ignored.append(name)
    if types is not None:
        for resource_type in filters:
            if resource_type not in types:
                raise FhirError.of(400, "invalid", f"_typeFilter names {resource_type}, which "
                                   "_type does not list", "_typeFilter")
    return ExportRequest(level, url, group_id,
                         tuple(dict.fromkeys(types)) if types is not None else None, since,
                         {t: tuple(q) for t, q in filters.items()}, tuple(ignored))


def _types(value: str, known: frozenset[str], level_types: frozenset[str] | None,
           level: str, parameter: str = "_type") -> list[str]:
    found = [t.strip() for t in value.split(",") if t.strip()]
    if not found:
        raise FhirError.of(400, "required", f"{parameter} names no resource type", parameter)
    for resource_type in found:
        if resource_type not in known:
            raise FhirError.of(400, "not-supported",
                               f"{resource_type!r} is not a resource type", parameter)
        if level_types is not None and resource_type not in level_types:
            raise FhirError.of(400, "invalid", f"{resource_type} resources are not in the "
                               f"Patient compartment, which a {level}-level export covers",
                               parameter)
    return found


def is_instant(value: str) -> bool:
    """Whether ``value`` is a FHIR instant (seconds and a time zone required)."""
    return _INSTANT.match(value) is not None


def query_pairs(query: str) -> list[tuple[str, str]]:
    return parse_qsl(query, keep_blank_values=True)
