"""The FHIR transaction Bundle one v2 message becomes.

Entries are keyed by what they stand for (``"Patient"``, ``"Observation:R-991133:718-7"``)
so a mapper can add a resource once and reference it from anywhere; the key also seeds a
deterministic ``urn:uuid:`` fullUrl (UUIDv5 in the message's namespace), so mapping the
same message twice gives the same Bundle.

How each kind of entry is written (FHIR R4 transaction semantics):

- ``create``: ``POST`` with ``ifNoneExist`` when a business identifier is known, so a
  resource that already exists is referenced instead of duplicated (patients and
  encounters seen in result and order messages, which must not rewrite demographics);
- ``upsert``: conditional update ``PUT Type?identifier=system|value``: created the first
  time, replaced by later messages about the same thing (an ADT update, a corrected
  result, a rescheduled appointment);
- ``post``: a plain ``POST`` for what every message adds anew (the stored original
  message and its Provenance).

References between entries use the fullUrls; the transaction rewrites them to the ids the
server assigns or finds.
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

__all__ = [
    "Entry",
    "StayMatch",
    "TransactionBuilder",
    "identifier_condition",
    "identifier_token",
    "search_escape",
]

JSON = dict[str, Any]


def search_escape(value: str) -> str:
    """Escape a value for a FHIR search parameter (``\\``, ``|``, ``,`` and ``$``)."""
    for char in ("\\", "|", ",", "$"):
        if char in value:
            value = value.replace(char, "\\" + char)
    return value


def identifier_token(identifier: JSON) -> str:
    """The token search value ``system|value`` for an identifier (FHIR-escaped)."""
    value = search_escape(identifier["value"])
    system = identifier.get("system")
    return f"{search_escape(system)}|{value}" if system else value


_URL_SAFE = re.compile(r"[A-Za-z0-9:/|^._~-]*")


def identifier_condition(identifier: JSON) -> str:
    """The query ``identifier=system|value`` (URL-encoded) that finds ``identifier``."""
    token = identifier_token(identifier)
    # Most ids need no encoding; quote() is the slowest step of mapping a large result.
    return "identifier=" + (token if _URL_SAFE.fullmatch(token) else quote(token, safe=":/|^"))


@dataclass(frozen=True)
class StayMatch:
    """How to find the stored Encounter of a stay the message names by no identifier
    (PV1-19 and PV1-44 empty): the patient's Encounters in one of ``statuses``, the one
    at ``location`` first; with ``any_location``, else the patient's latest such one.
    ``hl7_gateway.stays`` looks them up before the transaction."""

    patient: JSON  # the patient's match identifier (PID-3)
    location: JSON | None  # the identifier of the PV1-3 Location
    statuses: tuple[str, ...]
    any_location: bool


@dataclass
class Entry:
    key: str
    full_url: str
    resource: JSON
    method: str  # POST | PUT
    url: str
    if_none_exist: str | None = None
    # The identifier a conditional entry matches on (ifNoneExist or conditional update).
    identifier: JSON | None = None
    # Merged into the current resource instead of replacing it (see hl7_gateway.merge).
    merge: bool = False
    if_match: str | None = None
    # An Encounter found by the stay it is about rather than by an identifier.
    stay: StayMatch | None = None

    def to_json(self) -> JSON:
        request: JSON = {"method": self.method, "url": self.url}
        if self.if_none_exist:
            request["ifNoneExist"] = self.if_none_exist
        if self.if_match:
            request["ifMatch"] = self.if_match
        return {"fullUrl": self.full_url, "resource": self.resource, "request": request}


@dataclass
class TransactionBuilder:
    """Collects the entries of one message's transaction, one per key."""

    namespace: uuid.UUID
    entries: dict[str, Entry] = field(default_factory=dict)
    _by_url: dict[str, Entry] = field(default_factory=dict)

    def full_url(self, key: str) -> str:
        return f"urn:uuid:{uuid.uuid5(self.namespace, key)}"

    def has(self, key: str) -> bool:
        return key in self.entries

    def reference(self, key: str, display: str | None = None) -> JSON:
        ref: JSON = {"reference": self.entries[key].full_url}
        if display:
            ref["display"] = display
        return ref

    def resolve(self, reference: JSON) -> JSON:
        """The staged resource a reference made by this builder points at."""
        return self._by_url[reference["reference"]].resource

    def entry_of(self, reference: JSON) -> Entry | None:
        """The staged entry a reference made by this builder points at, if any."""
        return self._by_url.get(str(reference.get("reference", "")))

    def get(self, key: str) -> JSON:
        """The resource staged under ``key`` (mappers add to it after creating it)."""
        return self.entries[key].resource

    def _add(self, key: str, resource: JSON, method: str, url: str, *,
             identifier: JSON | None = None, if_none_exist: str | None = None,
             merge: bool = False) -> JSON:
        if key in self.entries:
            return self.reference(key)
        entry = Entry(key, self.full_url(key), resource, method, url, if_none_exist,
                      identifier, merge)
        self.entries[key] = entry
        self._by_url[entry.full_url] = entry
        return self.reference(key)

    def post(self, key: str, resource: JSON) -> JSON:
        """Always create (a new resource per message)."""
        return self._add(key, resource, "POST", resource["resourceType"])

    def create(self, key: str, resource: JSON, identifier: JSON | None) -> JSON:
        """Create unless a resource with ``identifier`` exists (then reference that one)."""
        condition = identifier_condition(identifier) if identifier else None
        return self._add(key, resource, "POST", resource["resourceType"],
                         identifier=identifier, if_none_exist=condition)

    def upsert(self, key: str, resource: JSON, identifier: JSON | None, *,
               merge: bool = False) -> JSON:
        """Create or replace the resource holding ``identifier`` (plain create without one).

        With ``merge`` the mapped elements are laid over the stored resource instead of
        replacing it, so what other sources added (links, other identifiers) survives.
        """
        if identifier is None:
            return self.post(key, resource)
        url = f"{resource['resourceType']}?{identifier_condition(identifier)}"
        return self._add(key, resource, "PUT", url, identifier=identifier, merge=merge)

    def stay(self, key: str, resource: JSON, match: StayMatch) -> JSON:
        """Create, unless the stay ``match`` describes is stored (then update that one)."""
        reference = self.post(key, resource)
        self.entries[key].stay = match
        return reference

    def resources(self, resource_type: str | None = None) -> list[JSON]:
        return [e.resource for e in self.entries.values()
                if resource_type is None or e.resource["resourceType"] == resource_type]

    def bundle(self) -> JSON:
        return {"resourceType": "Bundle", "type": "transaction",
                "entry": [e.to_json() for e in self.entries.values()]}
