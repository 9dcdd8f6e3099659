"""The patch formats of ``PATCH [base]/[type]/[id]`` (and of PATCH entries of a bundle):
what a body means, and applying it to the current version of a resource.

- ``application/json-patch+json``: an array of operations, JSON Patch (RFC 6902);
- ``application/merge-patch+json``: an object, JSON Merge Patch (RFC 7386);
- ``application/fhir+json``: a ``Parameters`` resource, FHIRPath Patch (R4 fhirpatch.html);
- ``application/json``: an array is a JSON Patch, a ``Parameters`` a FHIRPath Patch, any
  other object a JSON Merge Patch.

A plain ``application/json`` object is a merge patch because that is what clients send
with it: fhirpy's ``patch(**fields)`` and ``save(fields=[...])`` send the changed
top-level elements (``null`` to remove one) as ``application/json``, which is RFC 7386's
meaning of such a document, and Aidbox reads it the same way. A bundle's PATCH entry
carries a ``Binary`` (its ``contentType`` one of the JSON types above, its data the
patch) or the ``Parameters`` itself (R4 3.1.0.11.2).

A patch may change neither ``resourceType`` nor ``id``; what it produces is validated and
stored as an update.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass
from typing import Any

import jsonpatch
import orjson

from fhir_server.outcome import FhirError
from fhir_server.patches.fhirpath import apply_fhirpath_patch

JSON_PATCH = "application/json-patch+json"
MERGE_PATCH = "application/merge-patch+json"
FHIRPATH_PATCH = "application/fhir+json"  # a Parameters resource
MEDIA_TYPES = (JSON_PATCH, MERGE_PATCH, FHIRPATH_PATCH)
_FHIR_TYPES = ("application/fhir+json", "application/json+fhir")


@dataclass(frozen=True, slots=True)
class Patch:
    """A patch document and its format (one of ``MEDIA_TYPES``)."""

    format: str
    body: Any

    def apply(self, resource: dict[str, Any]) -> dict[str, Any]:
        """The patched resource; ``resource`` itself may change (pass one of your own)."""
        if self.format == JSON_PATCH:
            return _json_patch(resource, self.body)
        if self.format == MERGE_PATCH:
            return merge_patch(resource, self.body)  # type: ignore[no-any-return]
        return apply_fhirpath_patch(resource, self.body)


def as_patch(operations: Any) -> Patch:
    """A :class:`Patch`; a bare array of operations (how callers passed a JSON Patch
    before there were several formats) is a JSON Patch."""
    if isinstance(operations, Patch):
        return operations
    if not isinstance(operations, list):
        raise FhirError.of(400, "structure", "A JSON Patch body must be an array of operations")
    return Patch(JSON_PATCH, operations)


def patch_from_body(content_type: str, body: Any) -> Patch:
    """The patch a ``PATCH`` request's body is, by its media type (table above)."""
    content_type = content_type.split(";")[0].strip().lower()
    if content_type == JSON_PATCH:
        return as_patch(body)
    if content_type == MERGE_PATCH:
        if not isinstance(body, dict):
            raise FhirError.of(400, "structure", "A JSON Merge Patch body must be an object")
        return Patch(MERGE_PATCH, body)
    if content_type in _FHIR_TYPES:
        if not _is_parameters(body):
            raise FhirError.of(400, "structure", "An application/fhir+json PATCH body is a "
                               "FHIRPath Patch (a Parameters resource); send a partial "
                               f"resource as {MERGE_PATCH}")
        return Patch(FHIRPATH_PATCH, body)
    if content_type == "application/json":
        if isinstance(body, list):
            return Patch(JSON_PATCH, body)
        if _is_parameters(body):
            return Patch(FHIRPATH_PATCH, body)
        if isinstance(body, dict):
            return Patch(MERGE_PATCH, body)
        raise FhirError.of(400, "structure", "A PATCH body is an array (JSON Patch) or an "
                           "object (JSON Merge Patch, or a FHIRPath Patch Parameters)")
    raise FhirError.of(415, "not-supported",
                       f"PATCH takes {', '.join(MEDIA_TYPES)} or application/json, not "
                       f"{content_type or 'a body without Content-Type'}")


def patch_from_entry(resource: Any) -> Patch:
    """The patch of a bundle's PATCH entry: a Binary holding one, or a Parameters."""
    if _is_parameters(resource):
        return Patch(FHIRPATH_PATCH, resource)
    if isinstance(resource, dict) and resource.get("resourceType") == "Binary":
        try:
            body = orjson.loads(base64.b64decode(resource.get("data", ""), validate=True))
        except (binascii.Error, orjson.JSONDecodeError):
            raise FhirError.of(400, "structure", "The Binary does not hold a JSON patch"
                               ) from None
        return patch_from_body(resource.get("contentType") or JSON_PATCH, body)
    raise FhirError.of(400, "not-supported", "PATCH entries take a Binary holding a JSON "
                       "Patch or JSON Merge Patch, or a FHIRPath Patch Parameters")


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386: objects merge member by member, ``null`` removes a member, anything
    else (arrays included) replaces the target."""
    if not isinstance(patch, dict):
        return patch
    merged = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            merged.pop(key, None)
        else:
            merged[key] = merge_patch(merged.get(key), value)
    return merged


def _json_patch(resource: dict[str, Any], operations: list[Any]) -> dict[str, Any]:
    try:
        return jsonpatch.apply_patch(  # type: ignore[no-any-return]
            resource, operations, in_place=True)
    except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException, TypeError,
            KeyError, ValueError) as exc:
        raise FhirError.of(422, "processing", f"The JSON Patch could not be applied: {exc}"
                           ) from None


def _is_parameters(body: Any) -> bool:
    return isinstance(body, dict) and body.get("resourceType") == "Parameters"


__all__ = ["FHIRPATH_PATCH", "JSON_PATCH", "MEDIA_TYPES", "MERGE_PATCH", "Patch", "as_patch",
           "merge_patch", "patch_from_body", "patch_from_entry"]
