"""FHIRPath Patch (R4 fhirpatch.html): a ``Parameters`` resource whose ``operation``
parameters add, insert, delete, replace and move elements named by FHIRPath.

Each operation's parts: ``type`` (add | insert | delete | replace | move), ``path`` (a
FHIRPath expression on the resource), and by type ``name`` (add: the element to add),
``value`` (add, insert, replace: ``value[x]`` for a datatype, or nested ``part`` for an
element without one, such as ``Patient.contact``), ``index`` (insert), ``source`` and
``destination`` (move). The operations apply in order, each to the result of the last.

Paths are evaluated by ``fhirpathpy`` with the R4 model; every element it returns carries
its concrete location in the resource (``Patient.name[0].given[1]``), which is what the
operation changes. The base rules of the spec hold: a path must select one element (a
delete of nothing changes nothing), stay inside the resource (``resolve()`` is not
evaluated), and the result must be a valid resource (the update that stores it validates
it). Whether an element repeats and how a choice element is spelled in JSON
(``value`` + ``Quantity`` → ``valueQuantity``) come from the R4 JSON Schema.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from fhirpathpy import evaluate
from fhirpathpy.engine.nodes import ResourceNode
from fhirpathpy.models import models

from fhir_server.outcome import FhirError
from fhir_server.validation import schema_definitions

JSON = dict[str, Any]
OPERATIONS = ("add", "insert", "delete", "replace", "move")
_SEGMENT = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)(?:\[(\d+)\])?$")
_PRIMITIVE_PARTS = ("extension", "id")  # spelled _<element> in JSON


@dataclass(frozen=True)
class Operation:
    type: str
    path: str
    where: str  # Parameters.parameter[i], for error messages
    name: str | None = None
    value: Any = None
    value_type: str | None = None  # the datatype of value[x] ("Quantity"), None for parts
    index: int | None = None
    source: int | None = None
    destination: int | None = None


Steps = tuple[tuple[str, int | None], ...]  # JSON keys (and list indexes) from the root


@dataclass
class Location:
    """Where an element is: ``container[key]`` or ``container[key][index]``, and the
    steps from the resource down to it."""

    container: JSON
    key: str
    index: int | None
    steps: Steps = ()

    def get(self) -> Any:
        value = self.container[self.key]
        return value if self.index is None else value[self.index]


def apply_fhirpath_patch(resource: JSON, parameters: JSON) -> JSON:
    """``resource`` (changed in place and returned) with every operation applied."""
    for operation in parse_operations(parameters):
        _APPLY[operation.type](resource, operation)
    return resource


# -- reading the Parameters ----------------------------------------------------------------
def parse_operations(parameters: JSON) -> list[Operation]:
    if parameters.get("resourceType") != "Parameters":
        raise _invalid("A FHIRPath Patch is a Parameters resource", "Parameters")
    found = parameters.get("parameter") or []
    if not isinstance(found, list) or not found:
        raise _invalid("The FHIRPath Patch has no operation", "Parameters.parameter")
    return [_operation(p, f"Parameters.parameter[{i}]") for i, p in enumerate(found)]


def _operation(parameter: Any, where: str) -> Operation:
    if not isinstance(parameter, dict) or parameter.get("name") != "operation":
        raise _invalid("each parameter of a FHIRPath Patch is named 'operation'", where)
    parts: dict[str, Any] = {str(p.get("name")): p for p in parameter.get("part") or []
                             if isinstance(p, dict)}
    kind = _primitive(parts.get("type"), "valueCode")
    if kind not in OPERATIONS:
        raise _invalid(f"type must be one of {', '.join(OPERATIONS)} (got {kind!r})",
                       f"{where}.part[type]")
    path = _primitive(parts.get("path"), "valueString")
    if not path:
        raise _invalid("the operation has no path", f"{where}.part[path]")
    value, value_type = _value(parts["value"]) if "value" in parts else (None, None)
    operation = Operation(
        kind, str(path), where, name=_primitive(parts.get("name"), "valueString"),
        value=value, value_type=value_type, index=_integer(parts.get("index"), where),
        source=_integer(parts.get("source"), where),
        destination=_integer(parts.get("destination"), where))
    _require_parts(operation, parts)
    return operation


_REQUIRED = {"add": ("name", "value"), "insert": ("value", "index"), "delete": (),
             "replace": ("value",), "move": ("source", "destination")}


def _require_parts(operation: Operation, parts: dict[str, Any]) -> None:
    missing = [p for p in _REQUIRED[operation.type] if p not in parts]
    if missing:
        raise _invalid(f"a {operation.type} operation needs the part(s) "
                       f"{', '.join(missing)}", operation.where)


def _primitive(part: Any, key: str) -> Any:
    if part is None:
        return None
    return part.get(key, next((v for k, v in part.items() if k.startswith("value")), None))


def _integer(part: Any, where: str) -> int | None:
    value = _primitive(part, "valueInteger")
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise _invalid(f"{part.get('name')} must be an integer of 0 or more", where)
    return value


def _value(part: JSON) -> tuple[Any, str | None]:
    """A part's value and its datatype: ``value[x]``, a ``resource``, or nested parts (an
    element without a datatype, each part one of its children)."""
    for key, value in part.items():
        if key.startswith("value") and len(key) > 5:
            return value, key[5:]
    if "resource" in part:
        return part["resource"], None
    children: JSON = {}
    for child in part.get("part") or []:
        value, _ = _value(child)
        name = child.get("name")
        if name in children:  # a repeating child
            existing = children[name]
            children[name] = [*existing, value] if isinstance(existing, list) \
                else [existing, value]
        else:
            children[name] = value
    return children, None


# -- finding elements ----------------------------------------------------------------------
def _select(resource: JSON, operation: Operation) -> list[Any]:
    try:
        return list(evaluate(resource, operation.path, model=models["r4"],
                             options={"returnRawData": True}))
    except Exception as exc:  # fhirpathpy raises plain Exceptions for what it cannot do
        raise _unprocessable(f"the path {operation.path!r} cannot be evaluated: {exc}",
                             operation) from None


def _location(resource: JSON, node: Any, operation: Operation) -> Location | None:
    """Where an element the path selected is; None for the resource itself."""
    if not isinstance(node, ResourceNode):
        raise _unprocessable(f"the path {operation.path!r} selects a computed value, not an "
                             "element of the resource", operation)
    if node.propName is None:
        if node.data is resource:
            return None
        raise _unprocessable(f"the path {operation.path!r} leaves the resource", operation)
    _root, *segments = node.propName.split(".")
    container: Any = resource
    location: Location | None = None
    steps: Steps = ()
    for segment in segments:
        match = _SEGMENT.match(segment)
        if match is None:
            raise _unprocessable(f"cannot locate {node.propName}", operation)
        key, index = match.group(1), match.group(2)
        if location is not None and key in _PRIMITIVE_PARTS and not isinstance(container,
                                                                                dict):
            # A primitive's extension or id: JSON keeps them in _<element>.
            holder = f"_{location.key}"
            container = location.container.get(holder)
            if location.index is not None and isinstance(container, list):
                container = container[location.index]
            steps = (*steps[:-1], (holder, location.index))
        if not isinstance(container, dict):
            raise _unprocessable(f"cannot locate {node.propName}", operation)
        json_key = _json_key(container, key, node.propName, operation)
        position = None if index is None else int(index)
        steps = (*steps, (json_key, position))
        location = Location(container, json_key, position, steps)
        container = location.get()
    return location


def _json_key(container: JSON, key: str, where: str, operation: Operation) -> str:
    """The JSON key of an element: itself, or a choice element's typed name."""
    if key in container:
        return key
    typed = [k for k in container if k.startswith(key) and k[len(key):][:1].isupper()]
    if len(typed) != 1:
        raise _unprocessable(f"cannot locate {where}", operation)
    return typed[0]


def _one(resource: JSON, operation: Operation) -> Location | None:
    """Where the one element a path selects is (None: the resource itself)."""
    nodes = _select(resource, operation)
    if not nodes:
        raise _unprocessable(f"the path {operation.path!r} selects nothing", operation)
    if len(nodes) > 1:
        raise _unprocessable(f"the path {operation.path!r} selects {len(nodes)} elements; "
                             "it must select one", operation)
    return _location(resource, nodes[0], operation)


def _element(resource: JSON, operation: Operation, *, allow_none: bool = False
             ) -> Location | None:
    """The one element (not the resource itself) a delete or replace applies to."""
    nodes = _select(resource, operation)
    if not nodes and allow_none:
        return None
    location = _one(resource, operation)
    if location is None:
        raise _unprocessable(f"{operation.type} cannot apply to the resource itself",
                             operation)
    return location


@dataclass
class ListAt:
    """A list a path names (insert, move): its container, key, items and the steps down
    to the container."""

    container: JSON
    key: str
    items: list[Any]
    steps: Steps


def _list_at(resource: JSON, operation: Operation) -> ListAt:
    nodes = _select(resource, operation)
    if nodes:
        located = [_location(resource, n, operation) for n in nodes]
        places = {(id(loc.container), loc.key) for loc in located if loc is not None}
        first = located[0]
        if len(places) != 1 or first is None or first.index is None:
            raise _unprocessable(f"the path {operation.path!r} must name one list", operation)
        return ListAt(first.container, first.key, first.container[first.key],
                      first.steps[:-1])
    # An empty or absent list: its parent (the path without its last element) holds it.
    parent_path, _, name = operation.path.rpartition(".")
    if not parent_path or not re.fullmatch(r"[A-Za-z][A-Za-z0-9]*", name):
        raise _unprocessable(f"the path {operation.path!r} selects nothing", operation)
    parent, steps = _container(resource, _with(operation, path=parent_path))
    _element_key(_definition(resource, steps), name, None, operation)  # a known element
    return ListAt(parent, name, parent.setdefault(name, []), steps)


def _container(resource: JSON, operation: Operation) -> tuple[JSON, Steps]:
    """The one complex element a path selects, and the steps down to it."""
    location = _one(resource, operation)
    element = resource if location is None else location.get()
    if not isinstance(element, dict):
        raise _unprocessable(f"the path {operation.path!r} selects a primitive value; "
                             "elements can only be added to a complex one", operation)
    return element, () if location is None else location.steps


def _with(operation: Operation, **changes: Any) -> Operation:
    return Operation(**{**operation.__dict__, **changes})


# -- what the schema says of an element ------------------------------------------------------
def _definition(resource: JSON, steps: Steps) -> JSON:
    """The schema definition of the element ``steps`` lead to."""
    definitions = schema_definitions()
    definition: JSON = definitions.get(resource["resourceType"], {})
    node: Any = resource
    for key, index in steps:
        prop = definition.get("properties", {}).get(key, {})
        ref = prop.get("$ref") or prop.get("items", {}).get("$ref", "")
        node = node[key] if index is None else node[key][index]
        name = ref.rsplit("/", 1)[-1]
        if name == "ResourceList":  # contained: the resource's own type
            name = node.get("resourceType", "")
        definition = definitions.get(name, {})
    return definition


def _child_definition(definition: JSON, key: str) -> JSON:
    prop = definition.get("properties", {}).get(key, {})
    ref = prop.get("$ref") or prop.get("items", {}).get("$ref", "")
    return schema_definitions().get(ref.rsplit("/", 1)[-1], {})  # type: ignore[no-any-return]


def _conform(value: Any, definition: JSON) -> Any:
    """A value built from nested parts, its repeating children made lists (a part gives
    one value per name; the schema knows which of them repeat)."""
    if not isinstance(value, dict) or "resourceType" in value:
        return value
    properties = definition.get("properties", {})
    shaped = {}
    for key, child in value.items():
        repeats = properties.get(key, {}).get("type") == "array"
        items = child if isinstance(child, list) else [child]
        items = [_conform(item, _child_definition(definition, key)) for item in items]
        shaped[key] = items if repeats or isinstance(child, list) else items[0]
    return shaped


def _value_for(resource: JSON, steps: Steps, key: str, operation: Operation) -> Any:
    """The operation's value, shaped for the element ``key`` of the element at ``steps``."""
    if operation.value_type is not None:
        return operation.value
    return _conform(operation.value, _child_definition(_definition(resource, steps), key))


def _element_key(definition: JSON, name: str, value_type: str | None,
                 operation: Operation) -> tuple[str, bool]:
    """The JSON key for adding ``name`` and whether the element repeats."""
    properties = definition.get("properties", {})
    key = name
    if name not in properties and value_type:
        key = name + value_type[:1].upper() + value_type[1:]
    if key not in properties:
        raise _unprocessable(f"{name!r} is not an element that can be added there",
                             operation)
    return key, properties[key].get("type") == "array"


# -- the operations --------------------------------------------------------------------------
def _add(resource: JSON, operation: Operation) -> None:
    assert operation.name is not None
    container, steps = _container(resource, operation)
    key, repeats = _element_key(_definition(resource, steps), operation.name,
                                operation.value_type, operation)
    value = _value_for(resource, steps, key, operation)
    if repeats:
        container.setdefault(key, []).append(value)
    elif key in container:
        raise _unprocessable(f"{operation.path}.{operation.name} already has a value; use "
                             "replace", operation)
    else:
        container[key] = value


def _insert(resource: JSON, operation: Operation) -> None:
    index = operation.index
    assert index is not None
    place = _list_at(resource, operation)
    if index > len(place.items):
        raise _unprocessable(f"index {index} is past the end of the list "
                             f"({len(place.items)} elements)", operation)
    place.items.insert(index, _value_for(resource, place.steps, place.key, operation))
    _shift_extensions(place.container, place.key, lambda extra: extra.insert(index, None))


def _delete(resource: JSON, operation: Operation) -> None:
    location = _element(resource, operation, allow_none=True)
    if location is None:
        return  # "if found": deleting nothing is not an error
    _remove(location.container, location.key, location.index)
    _drop_emptied(resource, location.steps[:-1])


def _remove(container: JSON, key: str, index: int | None) -> None:
    if index is not None:
        del container[key][index]
        _shift_extensions(container, key, lambda extra: extra.pop(index))
        if container[key]:
            return
    container.pop(key)
    container.pop(f"_{key}", None)


def _drop_emptied(resource: JSON, steps: Steps) -> None:
    """Remove the elements a delete left without content, innermost first: FHIR has no
    empty elements (a name without its only part, ``_birthDate`` without extensions)."""
    while steps:
        parent: Any = resource
        for key, index in steps[:-1]:
            parent = parent[key] if index is None else parent[key][index]
        key, index = steps[-1]
        element = parent[key] if index is None else parent[key][index]
        if element not in ({}, []):
            return
        _remove(parent, key, index)
        steps = steps[:-1]


def _replace(resource: JSON, operation: Operation) -> None:
    location = _element(resource, operation)
    assert location is not None
    key = location.key
    value = _value_for(resource, location.steps[:-1], key, operation)
    if location.index is not None:
        location.container[key][location.index] = value
        return
    base = operation.path.rsplit(".", 1)[-1]
    if key != base and operation.value_type and key.startswith(base):
        # A choice element may change type: valueQuantity → valueString.
        location.container.pop(key)
        location.container.pop(f"_{key}", None)
        key = base + operation.value_type[:1].upper() + operation.value_type[1:]
    location.container[key] = value


def _move(resource: JSON, operation: Operation) -> None:
    source, destination = operation.source, operation.destination
    assert source is not None and destination is not None
    place = _list_at(resource, operation)
    for name, at in (("source", source), ("destination", destination)):
        if at >= len(place.items):
            raise _unprocessable(f"{name} {at} is past the end of the list "
                                 f"({len(place.items)} elements)", operation)
    place.items.insert(destination, place.items.pop(source))
    _shift_extensions(place.container, place.key,
                      lambda extra: extra.insert(destination, extra.pop(source)))


def _shift_extensions(container: JSON, key: str, change: Any) -> None:
    """Keep a primitive list's ``_<key>`` extensions lined up with its values."""
    extra = container.get(f"_{key}")
    if isinstance(extra, list):
        change(extra)


_APPLY = {"add": _add, "insert": _insert, "delete": _delete, "replace": _replace,
          "move": _move}


def _invalid(message: str, where: str) -> FhirError:
    return FhirError.of(400, "invalid", f"FHIRPath Patch: {message}", where)


def _unprocessable(message: str, operation: Operation) -> FhirError:
    return FhirError.of(422, "processing", f"FHIRPath Patch {operation.where} "
                        f"({operation.type} {operation.path}): {message}", operation.where)
