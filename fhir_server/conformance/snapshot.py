"""Snapshot generation: a profile's ``differential`` applied to its base's snapshot (R4
Profiling 5.1.0.x, "Snapshot generation").

The snapshot starts as the base definition's snapshot. Each differential element, in
order, is matched by id (or path and slice name) and its properties replace the base's
(types, cardinality, fixed/pattern values, bindings, slicing, documentation; constraints
are added). An element not in the base yet is made:

- a slice (``Patient.identifier:nhs``): a copy of the sliced element, placed after the
  element and its earlier slices;
- a child of an element whose type was not unrolled (``Patient.identifier:nhs.system``):
  the element's type's children are unrolled below it first, then matched;
- a choice type named by its type (``Observation.valueQuantity``): the ``[x]`` element,
  restricted to that type.

A differential that loosens its base (a lower ``min``, a higher ``max``) or names an
element the base does not have is refused with :class:`SnapshotError`.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

from fhir_server.conformance.definitions import core_url, is_primitive

# The properties of a differential element that replace the base's.
REPLACED = ("short", "definition", "comment", "requirements", "alias", "min", "max",
            "type", "maxLength", "binding", "slicing", "mustSupport", "isModifier",
            "isModifierReason", "isSummary", "meaningWhenMissing", "label", "code",
            "contentReference", "orderMeaning", "condition", "example", "mapping",
            "representation", "sliceIsConstraining")
PREFIXED = ("fixed", "pattern", "defaultValue", "minValue", "maxValue")

Lookup = Callable[[str], dict[str, Any] | None]


class SnapshotError(ValueError):
    """The differential cannot be applied to its base (the message says where)."""


def generate_snapshot(sd: dict[str, Any], lookup: Lookup) -> dict[str, Any]:
    """``sd`` with its snapshot generated from its differential (a new dict).
    ``lookup(url)`` finds other StructureDefinitions (the base, the types)."""
    base_url = sd.get("baseDefinition")
    if not base_url:
        raise SnapshotError("a constraint needs its baseDefinition to make a snapshot")
    base = lookup(str(base_url).split("|")[0])
    if base is None:
        raise SnapshotError(f"the base definition {base_url} is not known to the server")
    if not (base.get("snapshot") or {}).get("element"):
        base = generate_snapshot(base, lookup)
    elements = copy.deepcopy(base["snapshot"]["element"])
    for element in elements:  # the base's own elements keep their base and sources
        element.setdefault("id", element["path"])
    differential = (sd.get("differential") or {}).get("element") or []
    url = str(sd.get("url", ""))
    for position, diff in enumerate(differential):
        if not isinstance(diff, dict) or "path" not in diff:
            raise SnapshotError(f"differential.element[{position}] has no path")
        if diff.get("id") and _path_of(str(diff["id"])) != diff["path"]:
            raise SnapshotError(f"differential.element[{position}]: the id {diff['id']} does "
                                f"not match the path {diff['path']}")
        index = _find(elements, diff, lookup)
        _merge(elements[index], diff, url, position)
    result = dict(sd)
    result["snapshot"] = {"element": elements}
    return result


def _path_of(element_id: str) -> str:
    """The path an element id stands for: its slice names left out."""
    return ".".join(part.split(":")[0] for part in element_id.split("."))


def _diff_id(diff: dict[str, Any]) -> str:
    if diff.get("id"):
        return str(diff["id"])
    path = str(diff["path"])
    return f"{path}:{diff['sliceName']}" if diff.get("sliceName") else path


def _find(elements: list[dict[str, Any]], diff: dict[str, Any], lookup: Lookup) -> int:
    """The position of the snapshot element ``diff`` constrains (made when missing)."""
    wanted = _diff_id(diff)
    for _attempt in range(4):
        for index, element in enumerate(elements):
            if element.get("id") == wanted:
                return index
        # a choice type named by its type: Observation.valueQuantity → value[x]
        parent_id, _, last = wanted.rpartition(".")
        name = last.split(":")[0]
        for index, element in enumerate(elements):
            element_id = str(element.get("id"))
            if not element_id.startswith(parent_id + ".") or "." in \
                    element_id[len(parent_id) + 1:] or not element_id.endswith("[x]"):
                continue
            stem = element_id[len(parent_id) + 1:-3]
            suffix = name[len(stem):]
            if name.startswith(stem) and suffix and suffix[0].isupper() and ":" not in last:
                chosen = next((t for t in element.get("type") or ()
                               if t.get("code", "").lower() == suffix.lower()), None)
                if chosen is None:
                    raise SnapshotError(f"{wanted}: {suffix} is not a type of {element_id}")
                element["type"] = [chosen]
                return index
        if ":" in last:  # a new slice of an element the snapshot has
            sliced_id = f"{parent_id}.{last.rsplit(':', 1)[0]}" if parent_id else \
                last.rsplit(":", 1)[0]
            sliced = next((i for i, e in enumerate(elements) if e.get("id") == sliced_id),
                          None)
            if sliced is not None:
                return _add_slice(elements, sliced, last.rsplit(":", 1)[1], diff)
        if not parent_id:
            break
        parent = next((i for i, e in enumerate(elements) if e.get("id") == parent_id), None)
        if parent is None:
            # the parent itself is missing: make it first (deeper paths, slices of it)
            _find(elements, {"path": diff["path"].rsplit(".", 1)[0], "id": parent_id},
                  lookup)
            continue
        if not _unroll(elements, parent, lookup):
            break
    raise SnapshotError(f"no element {wanted} in the base definition (check the path, "
                        "and that the differential lists its elements in order)")


def _subtree_end(elements: list[dict[str, Any]], index: int) -> int:
    """The position after the element at ``index``, its children and its slices."""
    element_id = str(elements[index].get("id"))
    end = index + 1
    while end < len(elements):
        other = str(elements[end].get("id"))
        if other.startswith(element_id + ".") or other.startswith(element_id + ":"):
            end += 1
        else:
            break
    return end


def _add_slice(elements: list[dict[str, Any]], sliced: int, name: str,
               diff: dict[str, Any]) -> int:
    base = elements[sliced]
    slice_element = {k: copy.deepcopy(v) for k, v in base.items()
                     if k not in ("slicing", "id")}
    slice_element["id"] = f"{base['id']}:{name}"
    slice_element["sliceName"] = name
    if "slicing" not in base and base.get("path", "").endswith(("extension",
                                                                  "modifierExtension")):
        base["slicing"] = {"discriminator": [{"type": "value", "path": "url"}],
                           "ordered": False, "rules": "open"}
    position = _subtree_end(elements, sliced)
    elements.insert(position, slice_element)
    return position


def _unroll(elements: list[dict[str, Any]], parent: int, lookup: Lookup) -> bool:
    """Put the children of the element at ``parent`` (from its type) below it; False when
    it has them already or its type has none."""
    element = elements[parent]
    element_id, path = str(element["id"]), str(element["path"])
    if parent + 1 < len(elements) and str(elements[parent + 1].get("id")).startswith(
            element_id + "."):
        return False
    types = element.get("type") or []
    if len(types) != 1:
        return False
    type_code = str(types[0].get("code"))
    if is_primitive(type_code) and type_code != "xhtml":
        pass  # primitives have id, extension and value children too
    profiles = types[0].get("profile") or []
    definition = lookup(str(profiles[0]).split("|")[0]) if profiles else None
    definition = definition or lookup(core_url(type_code))
    if definition is None or not (definition.get("snapshot") or {}).get("element"):
        return False
    children = []
    root_path = definition["snapshot"]["element"][0]["path"]
    for child in definition["snapshot"]["element"][1:]:
        item = copy.deepcopy(child)
        tail = str(child["path"])[len(root_path):]
        item["path"] = path + tail
        child_id = str(child.get("id") or child["path"])
        item["id"] = element_id + child_id[len(root_path):]
        children.append(item)
    elements[parent + 1:parent + 1] = children
    return bool(children)


def _merge(element: dict[str, Any], diff: dict[str, Any], url: str, position: int) -> None:
    where = f"differential.element[{position}] ({diff.get('id') or diff['path']})"
    if "min" in diff and int(diff["min"]) < int(element.get("min", 0)):
        raise SnapshotError(f"{where}: min {diff['min']} is below the base's "
                            f"{element.get('min')}")
    if "max" in diff and _bigger(str(diff["max"]), str(element.get("max", "*"))):
        raise SnapshotError(f"{where}: max {diff['max']} is above the base's "
                            f"{element.get('max')}")
    if "type" in diff and element.get("type"):
        allowed = {t.get("code") for t in element["type"]}
        for type_json in diff["type"]:
            code = type_json.get("code")
            if code not in allowed and not _type_profile_of(code, allowed):
                raise SnapshotError(f"{where}: the type {code} is not one the base allows "
                                    f"({', '.join(sorted(str(a) for a in allowed))})")
    for key in REPLACED:
        if key in diff:
            element[key] = copy.deepcopy(diff[key])
    for key, value in diff.items():
        if key.startswith(PREFIXED) and key not in ("minValueSet",):
            for prefix in PREFIXED:
                for old in [k for k in element if k.startswith(prefix) and k != key
                            and key.startswith(prefix)]:
                    element.pop(old)
            element[key] = copy.deepcopy(value)
    if diff.get("constraint"):
        known = {c.get("key") for c in element.get("constraint") or ()}
        element["constraint"] = [*(element.get("constraint") or ()),
                                 *({**c, "source": c.get("source", url)}
                                   for c in diff["constraint"] if c.get("key") not in known)]
    if diff.get("sliceName"):
        element["sliceName"] = diff["sliceName"]


def _bigger(a: str, b: str) -> bool:
    if b == "*":
        return False
    if a == "*":
        return True
    return int(a) > int(b)


def _type_profile_of(code: Any, allowed: set[Any]) -> bool:
    """Quantity profiles (SimpleQuantity, Age...) may stand where Quantity is allowed."""
    return code in ("SimpleQuantity", "Age", "Distance", "Duration", "Count", "MoneyQuantity") \
        and "Quantity" in allowed
