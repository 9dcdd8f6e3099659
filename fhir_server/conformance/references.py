"""References (R4 2.3.0.x): the forms a ``Reference.reference`` may take, and finding
what it points at inside the resource (contained) or the Bundle being validated.

A literal reference is one of ``#id`` (a contained resource), ``Type/id`` (relative, with
an optional ``/_history/vid``), an absolute URL ending in ``Type/id`` (or not: any
absolute URL is allowed), ``urn:uuid:`` or ``urn:oid:`` (a Bundle entry's fullUrl).

Inside a Bundle a relative reference is resolved against the base of the fullUrl of the
entry that holds it (R4 Bundle 2.36.4.1): ``Patient/1`` in an entry whose fullUrl is
``http://example.org/fhir/Observation/9`` means ``http://example.org/fhir/Patient/1``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from fhir_server.conformance.definitions import resource_type_names

_ID = r"[A-Za-z0-9\-.]{1,64}"
_RELATIVE = re.compile(rf"^([A-Z][A-Za-z]+)/({_ID})(?:/_history/({_ID}))?$")
_ABSOLUTE_REST = re.compile(
    r"^(?:https?://[^\s]+?/)([A-Z][A-Za-z]+)/([A-Za-z0-9\-.]{1,64})(?:/_history/([A-Za-z0-9\-.]{1,64}))?$")


@dataclass(frozen=True, slots=True)
class ParsedReference:
    kind: str  # contained | relative | absolute | uuid | oid | other
    resource_type: str | None = None
    id: str | None = None
    version: str | None = None


def parse_reference(reference: str) -> ParsedReference:
    if reference.startswith("#"):
        return ParsedReference("contained", id=reference[1:])
    if reference.startswith("urn:uuid:"):
        return ParsedReference("uuid")
    if reference.startswith("urn:oid:"):
        return ParsedReference("oid")
    match = _RELATIVE.match(reference)
    if match:
        return ParsedReference("relative", match.group(1), match.group(2), match.group(3))
    match = _ABSOLUTE_REST.match(reference)
    if match and match.group(1) in resource_type_names():
        return ParsedReference("absolute", match.group(1), match.group(2), match.group(3))
    if re.match(r"^[a-zA-Z][a-zA-Z0-9+.\-]*:", reference):
        return ParsedReference("absolute")
    return ParsedReference("other")


def reference_problem(reference: str) -> str | None:
    """Why ``reference`` is not a valid literal reference, or None."""
    if reference.startswith("#"):
        return None  # "#" alone is the container itself
    if any(c.isspace() for c in reference):
        return f"the reference '{reference}' contains whitespace"
    parsed = parse_reference(reference)
    if parsed.kind == "relative" and parsed.resource_type not in resource_type_names():
        return f"'{parsed.resource_type}' in the reference '{reference}' is not a resource type"
    if parsed.kind == "other":
        if "/" in reference:
            head = reference.split("/", 1)[0]
            if head not in resource_type_names():
                return (f"the reference '{reference}' is neither an absolute URL nor "
                        "Type/id (unknown type '" + head + "')")
        return (f"the reference '{reference}' is neither an absolute URL, Type/id nor "
                "#id")
    return None


def base_of(full_url: str) -> str | None:
    """The server base of a RESTful fullUrl (``http://x/fhir/Patient/1`` → ``http://x/fhir``)."""
    match = _ABSOLUTE_REST.match(full_url)
    if not match or match.group(1) not in resource_type_names():
        return None
    return full_url[: match.start(2) - len(match.group(1)) - 2]


@dataclass(slots=True)
class BundleIndex:
    """The entries of a Bundle by fullUrl, to resolve references between them."""

    by_url: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    by_type_id: dict[tuple[str, str], list[tuple[str | None, dict[str, Any]]]] = \
        field(default_factory=dict)

    @classmethod
    def of(cls, bundle: dict[str, Any]) -> BundleIndex:
        index = cls()
        for entry in bundle.get("entry") or ():
            if not isinstance(entry, dict):
                continue
            resource = entry.get("resource")
            if not isinstance(resource, dict):
                continue
            full_url = entry.get("fullUrl")
            if isinstance(full_url, str):
                index.by_url.setdefault(full_url, []).append(resource)
            kind, rid = resource.get("resourceType"), resource.get("id")
            if isinstance(kind, str) and isinstance(rid, str):
                index.by_type_id.setdefault((kind, rid), []).append(
                    (full_url if isinstance(full_url, str) else None, resource))
        return index

    def resolve(self, reference: str, from_url: str | None) -> list[dict[str, Any]]:
        """The entries ``reference`` (made in the entry whose fullUrl is ``from_url``)
        points at: none, one, or several (an ambiguous reference)."""
        if reference in self.by_url:
            return self.by_url[reference]
        parsed = parse_reference(reference)
        if parsed.kind == "relative":
            plain = f"{parsed.resource_type}/{parsed.id}"
            base = base_of(from_url) if from_url else None
            if base is not None:
                found = self.by_url.get(f"{base}/{plain}")
                if found:
                    return _versioned(found, parsed.version)
            # entries without a RESTful fullUrl: matched by type and id
            candidates = [r for url, r in self.by_type_id.get(
                (parsed.resource_type or "", parsed.id or ""), ())
                if url is None or base_of(url) is None or base is None]
            return _versioned(candidates, parsed.version)
        if parsed.kind == "absolute" and parsed.version is not None:
            plain = reference.split("/_history/", 1)[0]
            return _versioned(self.by_url.get(plain, []), parsed.version)
        return []


def _versioned(resources: list[dict[str, Any]], version: str | None) -> list[dict[str, Any]]:
    if version is None:
        return resources
    return [r for r in resources if (r.get("meta") or {}).get("versionId") == version]


def contained_ids(resource: dict[str, Any]) -> dict[str, dict[str, Any]]:
    found = {}
    for item in resource.get("contained") or ():
        if isinstance(item, dict) and isinstance(item.get("id"), str):
            found[item["id"]] = item
    return found
