"""Prefetch templates filled from the context (the spec's example templates included);
what the client sent wins, null included; what it left out is fetched, or 412."""

from __future__ import annotations

from typing import Any

import pytest

from cds_hooks.models import CdsError, parse_request
from cds_hooks.prefetch import (
    PrefetchUnavailable,
    UnavailableSource,
    bundle_resources,
    render,
    resolve,
)
from tests.cds_hooks.examples_data import example, hook_context, hook_request

SIGN = hook_context("order-sign")  # userId PractitionerRole/123, patientId 1288992


def test_the_specs_example_templates_are_filled() -> None:
    templates = example("prefetch-templates.spec-example.json")["prefetch"]
    assert render(templates["patient"], SIGN) == "Patient/1288992"
    assert render(templates["hemoglobin-a1c"], SIGN) == (
        "Observation?patient=1288992&code=4548-4&_count=1&sort:desc=date")
    assert render(templates["user"], SIGN) == "PractitionerRole?_id=123"


def test_tokens_that_cannot_be_filled_leave_the_key_out() -> None:
    assert render("Practitioner/{{userPractitionerId}}", SIGN) is None  # a PractitionerRole
    assert render("Encounter/{{context.encounterId}}", hook_context("patient-view")) is None
    assert render("Bundle/{{context.draftOrders}}", SIGN) is None  # not a primitive
    assert render("Patient/{{ context.patientId }}", SIGN) == "Patient/1288992"


def test_draft_order_ids_fill_a_search() -> None:
    template = "MedicationRequest?_id={{context.draftOrders.MedicationRequest.id}}"
    assert render(template, SIGN) == "MedicationRequest?_id=smart-MedicationRequest-103"
    select = hook_context("order-select")
    assert render("NutritionOrder?_id={{context.selections.NutritionOrder.id}}", select) == \
        "NutritionOrder?_id=pureeddiet-simple"


class Recording:
    def __init__(self) -> None:
        self.queries: list[str] = []

    async def get(self, query: str) -> dict[str, Any] | None:
        self.queries.append(query)
        return {"resourceType": "Bundle", "type": "searchset", "entry": []}


async def test_what_the_client_sent_wins_and_the_rest_is_fetched() -> None:
    request, _ = parse_request(hook_request("order-sign", SIGN, {"medications": None}))
    source = Recording()
    found = await resolve({"medications": "MedicationRequest?patient={{context.patientId}}",
                           "allergies": "AllergyIntolerance?patient={{context.patientId}}"},
                          request, source)
    assert found["medications"] is None
    assert source.queries == ["AllergyIntolerance?patient=1288992"]


async def test_missing_data_that_cannot_be_had_is_a_412() -> None:
    request, _ = parse_request(hook_request("order-sign", SIGN))
    templates = {"medications": "MedicationRequest?patient={{context.patientId}}"}
    with pytest.raises(CdsError) as nowhere:
        await resolve(templates, request, None)
    assert (nowhere.value.status, nowhere.value.field) == (412, "prefetch")
    with pytest.raises(CdsError) as refused:
        await resolve(templates, request, UnavailableSource("the token was refused"))
    assert refused.value.status == 412 and "the token was refused" in refused.value.message
    with pytest.raises(PrefetchUnavailable):
        await UnavailableSource("x").get("Patient/1")


def test_bundles_keep_their_matches_only() -> None:
    bundle = example("prefetch-data.spec-example.json")["prefetch"]["hemoglobin-a1c"]
    assert [r["resourceType"] for r in bundle_resources(bundle)] == ["Observation"]
    outcome = {"resourceType": "Bundle", "entry": [
        {"resource": {"resourceType": "OperationOutcome"}, "search": {"mode": "outcome"}},
        {"resource": {"resourceType": "Condition"}, "search": {"mode": "include"}}]}
    assert bundle_resources(outcome) == [] and bundle_resources(None) == []
    assert bundle_resources({"resourceType": "Patient", "id": "1"}) == [
        {"resourceType": "Patient", "id": "1"}]
