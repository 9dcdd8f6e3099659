"""Which Patient compartments a resource is in, read from the resource itself.

The official CompartmentDefinition (in the search-parameter registry) names, per resource
type, the reference parameters that put a resource in a patient's compartment
(Observation: ``subject``, ``performer``; Encounter: ``patient``; ...). A search compiles
the same definition to index lookups; this module evaluates it on one resource in memory,
for the access policy's check of one resource and for settling its owners
(:mod:`fhir_server.ownership`). The parameters' FHIRPath expressions are compiled once
per resource type.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fhir_server.search.registry import SearchRegistry
from fhir_server.search.values import parse_reference

JSON = dict[str, Any]
Evaluate = Callable[[JSON], list[Any]]


class PatientCompartments:
    """``patients_of(resource)``: ids of the Patients whose compartments hold it."""

    def __init__(self, registry: SearchRegistry):
        self.registry = registry
        self._evaluators: dict[str, list[Evaluate]] = {}

    def _for(self, resource_type: str) -> list[Evaluate]:
        found = self._evaluators.get(resource_type)
        if found is None:
            found = []
            for code in self.registry.compartment_params("Patient", resource_type):
                param = self.registry.param(resource_type, code)
                if param is None or param.expression is None:
                    continue
                evaluate = self.registry.evaluator(resource_type, param.expression)
                if evaluate is not None:
                    found.append(evaluate)
            self._evaluators[resource_type] = found
        return found

    def patients_of(self, resource: JSON) -> frozenset[str]:
        ids: set[str] = set()
        for evaluate in self._for(str(resource.get("resourceType", ""))):
            for value in evaluate(resource):
                reference = value.get("reference") if isinstance(value, dict) else None
                if not isinstance(reference, str):
                    continue
                parsed = parse_reference(reference)
                if parsed.resource_type == "Patient" and parsed.id:
                    ids.add(parsed.id)
        return frozenset(ids)

    def is_member_type(self, resource_type: str) -> bool:
        return bool(self._for(resource_type))
