"""Which patients' compartments a resource is in, read from the resource itself: the same
answer as the FHIRPath engine gives, by a direct walk of the compartment paths."""

from __future__ import annotations

import json

import pytest

from fhir_server.compartments import PatientCompartments, plain_paths
from fhir_server.search.registry import builtin_registry
from fhir_server.search.values import parse_reference
from tests.fhir_server.clinical_data import transaction_bundle

REGISTRY = builtin_registry()
COMPARTMENTS = PatientCompartments(REGISTRY)


def by_fhirpath(resource: dict) -> frozenset[str]:
    ids = set()
    kind = resource["resourceType"]
    for code in REGISTRY.compartment_params("Patient", kind):
        evaluate = REGISTRY.evaluator(kind, REGISTRY.param(kind, code).expression)
        for value in evaluate(resource):
            reference = value.get("reference") if isinstance(value, dict) else None
            if isinstance(reference, str):
                parsed = parse_reference(reference)
                if parsed.resource_type == "Patient" and parsed.id:
                    ids.add(parsed.id)
    return frozenset(ids)


def test_every_r4_compartment_expression_is_a_plain_path():
    for kind in REGISTRY.compartment_types("Patient"):
        for code in REGISTRY.compartment_params("Patient", kind):
            expression = REGISTRY.param(kind, code).expression
            assert plain_paths(expression, kind) is not None, (kind, code, expression)


def stored_resources() -> list[dict]:
    """The clinical record set as stored: its urn:uuid references made Type/id."""
    entries = transaction_bundle()["entry"]
    text = json.dumps([e["resource"] for e in entries])
    for i, entry in enumerate(entries):
        text = text.replace(f'"{entry["fullUrl"]}"',
                            f'"{entry["resource"]["resourceType"]}/r{i}"')
    return json.loads(text)  # type: ignore[no-any-return]


RESOURCES = stored_resources()


@pytest.mark.parametrize("resource", RESOURCES,
                         ids=[f"{r['resourceType']}-{i}" for i, r in enumerate(RESOURCES)])
def test_the_direct_walk_agrees_with_fhirpath(resource):
    assert COMPARTMENTS.patients_of(resource) == by_fhirpath(resource)


def test_the_record_set_puts_resources_in_compartments():
    members = [r for r in RESOURCES if COMPARTMENTS.patients_of(r)]
    assert len(members) > len(RESOURCES) // 2


def test_provenance_targets_count_only_patients_and_links_follow_other():
    provenance = {"resourceType": "Provenance", "recorded": "2026-11-24T10:00:00Z",
                  "agent": [{"who": {"display": "lab"}}],
                  "target": [{"reference": "Patient/p1"}, {"reference": "Observation/o1"},
                             {"reference": "Patient/p2"}]}
    assert COMPARTMENTS.patients_of(provenance) == {"p1", "p2"} == by_fhirpath(provenance)
    linked = {"resourceType": "Patient", "id": "p3",
              "link": [{"other": {"reference": "Patient/p4"}, "type": "replaces"}]}
    assert COMPARTMENTS.patients_of(linked) == {"p4"} == by_fhirpath(linked)
    observation = {"resourceType": "Observation", "status": "final", "code": {"text": "x"},
                   "subject": {"reference": "Patient/p5"},
                   "performer": [{"reference": "Practitioner/d1"}, {"reference": "Patient/p6"}]}
    assert COMPARTMENTS.patients_of(observation) == {"p5", "p6"} == by_fhirpath(observation)
