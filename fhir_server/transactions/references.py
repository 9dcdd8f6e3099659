"""Rewriting the references of a transaction's resources before they are written.

A transaction's resources may point at one another by ``fullUrl`` (``urn:uuid:...``) and
at existing resources by search (``Patient?identifier=sys|val``, a conditional
reference, R4 3.1.0.11.4); both become ``Type/id`` before anything is stored.
"""

from __future__ import annotations

import re
from typing import Any

import orjson

from fhir_server.caller import CallerFhir
from fhir_server.http import parse_query
from fhir_server.outcome import FhirError
from fhir_server.transactions.entries import Entry
from fhir_server.validation import is_resource_type

_CONDITIONAL_REFERENCE = re.compile(rb'"reference":("[A-Z][A-Za-z]+\?(?:[^"\\]|\\.)*")')
# A urn fullUrl as a whole token: "urn:uuid:<uuid>" or "urn:oid:<dotted digits>", not
# followed by more of a URL (so urn:uuid:1 never rewrites inside urn:uuid:12).
_URN = re.compile(rb"urn:(?:uuid|oid):[A-Za-z0-9.:-]+(?![A-Za-z0-9._~-])")


class ReferenceRewriter:
    """Rewrites fullUrl and conditional references in resources about to be written.

    Works on the compact JSON text: a ``urn:uuid``/``urn:oid`` fullUrl is replaced
    wherever it occurs as a whole (references, other uri values, the narrative), another
    fullUrl only where it is a ``reference``; conditional references
    (``Patient?identifier=...``) are searched and must match exactly one resource.
    """

    def __init__(self, fhir: CallerFhir, ids: dict[str, str]):
        self.fhir = fhir
        self.urns = {k.encode(): v.encode() for k, v in ids.items() if k.startswith("urn:")}
        self.urls = {orjson.dumps(k): orjson.dumps(v) for k, v in ids.items()
                     if not k.startswith("urn:")}
        # One precompiled pattern for every urn (compiling one per bundle from its fullUrls
        # cost ~4 ms a bundle); a match that is not one of this bundle's fullUrls is left.
        self.pattern = _URN if self.urns else None

    async def rewrite(self, entry: Entry, resource: dict[str, Any]) -> dict[str, Any]:
        raw = orjson.dumps(resource)
        text = raw
        if self.pattern is not None and b"urn:" in text:
            urns = self.urns
            text = self.pattern.sub(lambda m: urns.get(m.group(0), m.group(0)), text)
        for url, target in self.urls.items():
            text = text.replace(b'"reference":' + url, b'"reference":' + target)
        if b"?" in text:
            for match in set(_CONDITIONAL_REFERENCE.findall(text)):
                reference = orjson.loads(match)
                resolved = await _resolve_conditional(self.fhir, entry, reference)
                text = text.replace(b'"reference":' + match,
                                    b'"reference":' + orjson.dumps(resolved))
        return resource if text is raw else orjson.loads(text)  # type: ignore[no-any-return]


async def _resolve_conditional(fhir: CallerFhir, entry: Entry, reference: str) -> str:
    resource_type, _, query = reference.partition("?")
    if not is_resource_type(resource_type):
        return reference
    found = await fhir.match_ids(resource_type, parse_query(query), limit=2)
    if len(found) != 1:
        raise entry.fail(FhirError.of(
            412, "multiple-matches" if found else "not-found",
            f"The conditional reference {reference!r} matches {len(found)} resources; it "
            "must match exactly one"))
    return f"{resource_type}/{found[0]}"


