"""What an erased patient's kept records lose: every free text but what must stay.

The element types come from the R4 definitions (:func:`fhir_server.definitions.
schema_definitions`), so no path is listed by hand: walking a resource, an element goes when
its type is

- ``Narrative`` (``text``) or ``Annotation`` (notes, comments with their authors);
- ``string`` or ``markdown`` (descriptions, instructions such as
  ``dosageInstruction.patientInstruction`` and ``.text``, names, addresses, telecoms,
  titles, an Extension's ``valueString`` / ``valueMarkdown`` with the extension itself),
  unless it is a kept element;
- an ``Attachment``'s ``data`` and ``title`` (what a document held, and what it was called).

**Kept** (:data:`KEPT_IN_TYPES`, :data:`KEPT_IN_RESOURCES`): the names of what was coded
(``Coding.display``, ``CodeableConcept.text``: the medicine prescribed is often only
text), references' targets and displays (the patient's name on references is removed
separately), identifiers' values (a prescription number a pharmacy quotes), units, and per
resource type what its legal purpose needs (an immunization's lot number for recalls; an
AuditEvent's outcome and its agents' names). An element emptied by the removals (an
extension left with only its url) goes too.
"""

from __future__ import annotations

from functools import cache
from typing import Any

from fhir_server.definitions import schema_definitions

JSON = dict[str, Any]
REMOVED_TYPES = frozenset({"Narrative", "Annotation"})
TEXT_TYPES = frozenset({"string", "markdown"})
QUANTITY_TYPES = ("Quantity", "SimpleQuantity", "Duration", "Age", "Distance", "Count",
                  "MoneyQuantity")
# datatype → its string elements that stay wherever the datatype is used
KEPT_IN_TYPES: dict[str, frozenset[str]] = {
    "Coding": frozenset({"display", "version"}),
    "CodeableConcept": frozenset({"text"}),
    "Reference": frozenset({"reference", "display"}),
    "Identifier": frozenset({"value"}),
    **{name: frozenset({"unit"}) for name in QUANTITY_TYPES},
}
# resource type → dotted paths (from the resource, indexes left out) of strings that stay
KEPT_IN_RESOURCES: dict[str, frozenset[str]] = {
    "Immunization": frozenset({"lotNumber"}),
    "AuditEvent": frozenset({"outcomeDesc", "agent.name", "source.site"}),
    # what the prescription checks found (the knowledge table's words, not the patient's)
    "DetectedIssue": frozenset({"detail"}),
}
ATTACHMENT_REMOVED = frozenset({"data", "title"})


@cache
def _text_pattern() -> str:
    return str(schema_definitions()["string"]["pattern"])


def _type_of(prop: JSON) -> str | None:
    """The datatype name of a schema property (``string`` for an inlined string or
    markdown primitive, such as a choice ``valueString``)."""
    ref = prop.get("$ref") or (prop.get("items") or {}).get("$ref")
    if ref:
        return str(ref).rsplit("/", 1)[-1]
    shape = prop.get("items") if prop.get("type") == "array" else prop
    if (shape or {}).get("type") == "string" and shape.get("pattern") == _text_pattern():
        return "string"
    return None


def without_free_text(resource: JSON) -> JSON:
    """``resource`` without the free text of the module docstring."""
    cleaned = _scrub(resource, resource["resourceType"], "", resource["resourceType"])
    return cleaned if isinstance(cleaned, dict) else {"resourceType": resource["resourceType"],
                                                      "id": resource.get("id")}


def _scrub(value: Any, type_name: str, path: str, resource_type: str) -> Any:
    if isinstance(value, list):
        items = [_scrub(v, type_name, path, resource_type) for v in value]
        return [i for i in items if i is not None]
    if not isinstance(value, dict):
        return value
    if type_name == "ResourceList":  # a contained resource: its own type, its own paths
        inner = str(value.get("resourceType", ""))
        return _scrub(value, inner, "", inner)
    properties = schema_definitions().get(type_name, {}).get("properties", {})
    kept_here = KEPT_IN_TYPES.get(type_name, frozenset())
    kept_paths = KEPT_IN_RESOURCES.get(resource_type, frozenset())
    cleaned: JSON = {}
    for key, child in value.items():
        prop = properties.get(key)
        if prop is None:  # resourceType, or what the schema does not describe: kept as is
            cleaned[key] = child
            continue
        child_type = _type_of(prop)
        child_path = f"{path}.{key}" if path else key
        if child_type in REMOVED_TYPES or (
                type_name == "Attachment" and key in ATTACHMENT_REMOVED):
            continue
        if child_type in TEXT_TYPES and key not in kept_here and child_path not in kept_paths:
            continue
        if child_type is None:
            cleaned[key] = child
            continue
        scrubbed = _scrub(child, child_type, child_path, resource_type)
        if scrubbed not in (None, [], {}):
            cleaned[key] = scrubbed
    for key in [k for k in cleaned if k.startswith("_") and k[1:] not in cleaned]:
        del cleaned[key]  # a removed primitive's id and extensions
    if type_name == "Extension" and not set(cleaned) - {"url", "id"}:
        return None  # its value was free text
    return cleaned or None
