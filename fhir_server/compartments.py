"""Which Patient compartments a resource is in, read from the resource itself.

The official CompartmentDefinition (in the search-parameter registry) names, per resource
type, the reference parameters that put a resource in a patient's compartment
(Observation: ``subject``, ``performer``; Encounter: ``patient``; ...). A search compiles
the same definition to index lookups; this module evaluates it on one resource in memory,
for the access policy's check of one resource and for settling its owners
(:mod:`fhir_server.ownership`), on every write.

Every R4 compartment parameter's expression is a union of plain element paths, some
ending in ``.where(resolve() is Patient)`` (a test keeps it so): they are walked directly
over the JSON, a few dict lookups, instead of through the FHIRPath engine (which
``resolve()`` made the largest cost of settling a Provenance that targets a whole HL7
message). An expression of any other shape falls back to the compiled evaluator.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from typing import Any

from fhir_server.search.registry import SearchRegistry
from fhir_server.search.values import parse_reference

JSON = dict[str, Any]
Evaluate = Callable[[JSON], list[Any]]
Reader = Callable[[JSON], Iterator[Any]]
_PLAIN_PATH = re.compile(r"([A-Z][A-Za-z]+)((?:\.[a-z][A-Za-z]*)+)"
                         r"(?:\.where\(resolve\(\) is ([A-Z][A-Za-z]+)\))?")


def plain_paths(expression: str, resource_type: str) -> list[tuple[str, ...]] | None:
    """The element paths of ``expression`` that apply to ``resource_type`` (a part
    restricted by ``resolve() is X`` to another type than Patient can name no patient
    and is left out); ``None`` when a part is not a plain path."""
    paths = []
    for part in (p.strip() for p in expression.split("|")):
        match = _PLAIN_PATH.fullmatch(part)
        if match is None:
            return None
        owner, path, resolved = match.groups()
        if owner == resource_type and resolved in (None, "Patient"):
            paths.append(tuple(path.strip(".").split(".")))
    return paths


def _walk(value: Any, path: tuple[str, ...]) -> Iterator[Any]:
    if not path:
        if isinstance(value, list):
            yield from value
        else:
            yield value
        return
    if isinstance(value, list):
        for item in value:
            yield from _walk(item, path)
    elif isinstance(value, dict):
        found = value.get(path[0])
        if found is not None:
            yield from _walk(found, path[1:])


def _path_reader(path: tuple[str, ...]) -> Reader:
    return lambda resource: _walk(resource, path)


def _evaluator_reader(evaluate: Evaluate) -> Reader:
    return lambda resource: iter(evaluate(resource))


class PatientCompartments:
    """``patients_of(resource)``: ids of the Patients whose compartments hold it."""

    def __init__(self, registry: SearchRegistry):
        self.registry = registry
        self._readers: dict[str, list[Reader]] = {}

    def _for(self, resource_type: str) -> list[Reader]:
        found = self._readers.get(resource_type)
        if found is None:
            found = []
            for code in self.registry.compartment_params("Patient", resource_type):
                param = self.registry.param(resource_type, code)
                if param is None or param.expression is None:
                    continue
                paths = plain_paths(param.expression, resource_type)
                if paths is not None:
                    found += [_path_reader(path) for path in paths]
                elif (evaluate := self.registry.evaluator(resource_type,
                                                          param.expression)) is not None:
                    found.append(_evaluator_reader(evaluate))
            self._readers[resource_type] = found
        return found

    def patients_of(self, resource: JSON) -> frozenset[str]:
        ids: set[str] = set()
        for read in self._for(str(resource.get("resourceType", ""))):
            for value in read(resource):
                reference = value.get("reference") if isinstance(value, dict) else None
                if not isinstance(reference, str):
                    continue
                if reference.startswith("Patient/") and "/" not in reference[8:] \
                        and "?" not in reference and len(reference) > 8:
                    ids.add(reference[8:])  # the usual literal reference, parsed for free
                    continue
                parsed = parse_reference(reference)
                if parsed.resource_type == "Patient" and parsed.id:
                    ids.add(parsed.id)
        return frozenset(ids)

    def is_member_type(self, resource_type: str) -> bool:
        return bool(self._for(resource_type))
