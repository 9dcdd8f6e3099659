"""Hook requests are validated as CDS Hooks 2.0 and the Hook Library define them (the
spec's own examples pass; every bad field is a 400 naming it); the response and
feedback models hold the spec's rules."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from pydantic import ValidationError

from cds_hooks.models import (
    Action,
    Card,
    CdsError,
    CdsResponse,
    Link,
    parse_feedback,
    parse_request,
)
from tests.cds_hooks.examples_data import example, hook_context, hook_request

HOOKS = ["patient-view", "order-select", "order-sign", "appointment-book",
         "encounter-start", "encounter-discharge"]


@pytest.mark.parametrize("hook", HOOKS)
def test_the_hook_library_examples_are_valid_requests(hook: str) -> None:
    request, context = parse_request(hook_request(hook, hook_context(hook)))
    assert request.hook == hook
    assert context.patientId == "1288992"


def test_the_specs_patient_view_request_with_fhir_authorization_is_valid() -> None:
    request, context = parse_request(example("patient-view-request.spec-example.json"))
    assert request.fhirServer == "http://hooks.smarthealthit.org:9080"
    assert request.fhirAuthorization is not None
    assert request.fhirAuthorization.subject == "cds-service4"
    assert context.encounterId == "89284"
    assert request.prefetch is not None and "patientToGreet" in request.prefetch


def test_order_select_and_sign_examples_expose_their_draft_orders() -> None:
    _, select = parse_request(hook_request("order-select", hook_context("order-select")))
    assert [r["id"] for r in select.selected()] == [  # type: ignore[attr-defined]
        "pureeddiet-simple", "smart-MedicationRequest-103"]
    _, sign = parse_request(hook_request("order-sign", hook_context("order-sign", 2)))
    assert {r["resourceType"] for r in sign.orders()} == {  # type: ignore[attr-defined]
        "NutritionOrder", "MedicationRequest"}


def _without(data: dict[str, Any], path: str) -> dict[str, Any]:
    changed = copy.deepcopy(data)
    *parents, last = path.split(".")
    target = changed
    for part in parents:
        target = target[part]
    del target[last]
    return changed


def _with(data: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    changed = copy.deepcopy(data)
    *parents, last = path.split(".")
    target = changed
    for part in parents:
        target = target[part]
    target[last] = value
    return changed


SIGN = hook_request("order-sign", hook_context("order-sign"))
SELECT = hook_request("order-select", hook_context("order-select"))
BOOK = hook_request("appointment-book", hook_context("appointment-book"))
START = hook_request("encounter-start", hook_context("encounter-start"))
VIEW = hook_request("patient-view", hook_context("patient-view", 2))
BAD_REQUESTS = {
    "no hook": (_without(VIEW, "hook"), "hook"),
    "hookInstance not a UUID": (_with(VIEW, "hookInstance", "instance-42"), "hookInstance"),
    "no hookInstance": (_without(VIEW, "hookInstance"), "hookInstance"),
    "no context": (_without(VIEW, "context"), "context"),
    "fhirServer not a URL": (_with(VIEW, "fhirServer", "hooks.example.org"), "fhirServer"),
    "authorization without server": (_with(VIEW, "fhirAuthorization", {
        "access_token": "t", "token_type": "Bearer", "expires_in": 300,
        "scope": "patient/*.read", "subject": "cds"}), "fhirServer"),
    "authorization of another type": (_with(_with(VIEW, "fhirServer", "https://ehr.example"),
                                            "fhirAuthorization", {
        "access_token": "t", "token_type": "MAC", "expires_in": 300, "scope": "s",
        "subject": "cds"}), "fhirAuthorization.token_type"),
    "unknown hook": (_with(VIEW, "hook", "chart-open"), "hook"),
    "patient-view without userId": (_without(VIEW, "context.userId"), "context.userId"),
    "userId not a user reference": (_with(VIEW, "context.userId", "Device/12"),
                                    "context.userId"),
    "patient-view without patientId": (_without(VIEW, "context.patientId"),
                                       "context.patientId"),
    "patientId not an id": (_with(VIEW, "context.patientId", "Patient/1288992"),
                            "context.patientId"),
    "order-sign without draftOrders": (_without(SIGN, "context.draftOrders"),
                                       "context.draftOrders"),
    "draftOrders not a Bundle": (_with(SIGN, "context.draftOrders", {"resourceType": "List"}),
                                 "context.draftOrders"),
    "draftOrders entry without a resource": (_with(SIGN, "context.draftOrders", {
        "resourceType": "Bundle", "entry": [{"fullUrl": "x"}]}), "context.draftOrders"),
    "order-select without selections": (_without(SELECT, "context.selections"),
                                        "context.selections"),
    "selections empty": (_with(SELECT, "context.selections", []), "context.selections"),
    "selection not a draft order": (_with(SELECT, "context.selections",
                                          ["MedicationRequest/other"]),
                                    "context.selections"),
    "order-select without draftOrders": (_without(SELECT, "context.draftOrders"),
                                         "context.draftOrders"),
    "encounter-start without encounterId": (_without(START, "context.encounterId"),
                                            "context.encounterId"),
    "appointment-book without appointments": (_without(BOOK, "context.appointments"),
                                              "context.appointments"),
    "appointments not a Bundle": (_with(BOOK, "context.appointments", []),
                                  "context.appointments"),
}


@pytest.mark.parametrize("case", sorted(BAD_REQUESTS))
def test_every_bad_field_is_a_400_naming_it(case: str) -> None:
    body, field = BAD_REQUESTS[case]
    with pytest.raises(CdsError) as refused:
        parse_request(body)
    assert refused.value.status == 400
    assert refused.value.field == field, refused.value.message
    assert refused.value.outcome()["issue"][0]["expression"] == [field]


def test_the_specs_extension_example_lacks_the_patient_a_patient_view_needs() -> None:
    with pytest.raises(CdsError) as refused:
        parse_request(example("request-with-extension.spec-example.json"))
    assert refused.value.field == "context.patientId"


def test_a_fhir_server_without_authorization_is_allowed_as_the_spec_does() -> None:
    request, _ = parse_request(_with(VIEW, "fhirServer", "http://fhir.example.org:9080"))
    assert request.fhirAuthorization is None


def test_a_request_for_another_hook_than_the_route_is_refused() -> None:
    with pytest.raises(CdsError) as refused:
        parse_request(VIEW, "order-sign")
    assert refused.value.field == "hook"


def test_the_specs_card_responses_are_valid() -> None:
    response = CdsResponse.model_validate(example("cards-response.spec-example.json"))
    assert [c.indicator for c in response.cards] == ["info", "warning"]
    assert response.cards[0].links is not None
    assert response.cards[0].links[2].type == "smart"
    # The system-action example omits the action's description, REQUIRED by the Action
    # table (SMART-CDS-NOTES: "Action = {type*, description*, ...}"): refused for it.
    with pytest.raises(ValidationError, match="description"):
        CdsResponse.model_validate(example("system-actions-response.spec-example.json"))
    for name in ("create", "update", "delete"):
        Action.model_validate(example(f"action-{name}.spec-example.json"))


def test_the_specs_autolaunchable_example_lacks_the_indicator_every_card_needs() -> None:
    # The published example omits indicator, which the spec's Card table marks REQUIRED.
    with pytest.raises(ValidationError, match="indicator"):
        CdsResponse.model_validate(example("cards-response-autolaunchable.spec-example.json"))


def test_cards_keep_the_specs_rules() -> None:
    source = {"label": "Drug-drug interaction check"}
    with pytest.raises(ValidationError):
        Card(summary="x" * 140, indicator="info", source=source)  # type: ignore[arg-type]
    with pytest.raises(ValidationError):
        Card(summary="ok", indicator="urgent", source=source)  # type: ignore[arg-type]
    with pytest.raises(ValidationError, match="selectionBehavior"):
        Card(summary="ok", indicator="info", source=source,  # type: ignore[arg-type]
             suggestions=[{"label": "Remove"}])  # type: ignore[list-item]
    with pytest.raises(ValidationError, match="cds-resp-3"):
        Link(label="Guideline", url="https://example.org", type="absolute", appContext="{}")
    with pytest.raises(ValidationError, match="resourceId"):
        Action(type="delete", description="Remove the order")


@pytest.mark.parametrize("name", ["feedback-accepted", "feedback-overridden-no-reason",
                                  "feedback-overridden-with-reason"])
def test_the_specs_feedback_examples_are_valid(name: str) -> None:
    feedback = parse_feedback(example(f"{name}.spec-example.json"))
    assert feedback.feedback[0].card


def test_accepted_feedback_must_name_the_suggestions() -> None:
    body = example("feedback-accepted.spec-example.json")
    del body["feedback"][0]["acceptedSuggestions"]
    with pytest.raises(CdsError) as refused:
        parse_feedback(body)
    assert refused.value.status == 400 and "acceptedSuggestions" in refused.value.message
