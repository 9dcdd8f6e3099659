"""SMART scopes: the grammar (v1 and v2, granular constraints) and how they narrow grants."""

from __future__ import annotations

import pytest

from fhir_server.access import CREATE, READ, SEARCH, Grant, TokenFilter, admits
from fhir_server.smart_scopes import (
    USER_CONTEXTS,
    ScopeError,
    ScopeSet,
    ScopeUniverse,
    enforceable,
    narrow,
    narrowings,
    parse_resource_scope,
)

LAB = "http://terminology.hl7.org/CodeSystem/observation-category|laboratory"
UNIVERSE = ScopeUniverse(
    compartment_types=frozenset({"Patient", "Observation", "Condition", "Encounter"}),
    shared_types=frozenset({"Practitioner", "Organization", "Medication"}),
    token_param=lambda kind, param: (kind, param) in {("Observation", "category"),
                                                      ("Condition", "category")})


@pytest.mark.parametrize(("text", "letters"), [
    ("patient/Observation.read", "rs"), ("user/*.write", "cud"), ("user/*.*", "cruds"),
    ("patient/Observation.rs", "rs"), ("system/Patient.r", "r"), ("user/*.cruds", "cruds"),
])
def test_v1_and_v2_scopes_parse_to_v2_letters(text: str, letters: str) -> None:
    scope = parse_resource_scope(text)
    assert scope is not None and scope.letters == letters


@pytest.mark.parametrize("text", ["patient/Observation.dus", "user/*.rr", "user/*.x",
                                  "system/Observation.", "patient/observation.rs"])
def test_out_of_order_or_unknown_letters_are_not_scopes(text: str) -> None:
    with pytest.raises(ScopeError):
        parse_resource_scope(text)


def test_other_scopes_are_kept_as_text() -> None:
    scopes = ScopeSet.parse("launch/patient openid fhirUser offline_access patient/*.rs")
    assert "openid" in scopes and "launch/patient" in scopes
    assert [s.text for s in scopes.resources] == ["patient/*.rs"]


def test_granular_constraints_are_parsed_into_parameters_and_values() -> None:
    scope = parse_resource_scope(f"patient/Observation.rs?category={LAB}")
    assert scope is not None
    assert scope.constraints == (("category", (LAB,)),)


def test_a_refresh_may_narrow_but_never_widen() -> None:
    granted = ScopeSet.parse("patient/*.rs openid offline_access")
    assert ScopeSet.parse("patient/Observation.rs offline_access").within(granted)
    assert ScopeSet.parse(f"patient/Observation.r?category={LAB}").within(granted)
    assert not ScopeSet.parse("patient/*.cruds").within(granted)
    assert not ScopeSet.parse("user/Observation.rs").within(granted)
    assert not ScopeSet.parse("launch").within(granted)
    narrowed = ScopeSet.parse(f"patient/Observation.rs?category={LAB}")
    assert not ScopeSet.parse("patient/Observation.rs").within(narrowed)


def test_enforceable_scopes_name_token_parameters_of_a_type() -> None:
    assert enforceable(parse_resource_scope(f"patient/Observation.rs?category={LAB}"),  # type: ignore[arg-type]
                       UNIVERSE)
    for text in ("patient/Observation.rs?code:in=http://valueset.example.org/x",
                 "user/*.rs?category=laboratory", "patient/Observation.rs?date=ge2020",
                 "patient/Binary.r"):
        assert not enforceable(parse_resource_scope(text), UNIVERSE), text  # type: ignore[arg-type]


def narrowed(scope: str, action: str, patient: str | None = "p1") -> list[Grant]:
    member = Grant(frozenset({"Observation", "Patient", "Practitioner", "Binary"}),
                   owners=frozenset({"org-1"}), relation="member")
    return narrow([member], narrowings(ScopeSet.parse(scope), action, USER_CONTEXTS,
                                       patient, UNIVERSE))


def test_patient_scopes_confine_compartment_types_to_the_launch_patient() -> None:
    grants = narrowed("patient/*.rs", READ)
    confined = [g for g in grants if g.patients is not None]
    assert confined and all(g.patients == frozenset({"p1"}) for g in confined)
    assert all(g.owners == frozenset({"org-1"}) for g in grants)  # never wider
    shared = [g for g in grants if g.patients is None]
    assert [g.types for g in shared] == [frozenset({"Practitioner"})]  # not Binary


def test_read_and_search_letters_narrow_separately() -> None:
    assert narrowed("patient/Observation.r", SEARCH) == []
    assert narrowed("patient/Observation.s", READ) == []
    assert narrowed("patient/Observation.s", SEARCH)
    assert narrowed("patient/Observation.rs", CREATE) == []


def test_user_scopes_keep_the_relation_unconfined() -> None:
    grants = narrowed("user/Observation.rs", READ)
    assert grants == [Grant(frozenset({"Observation"}), owners=frozenset({"org-1"}),
                            relation="member")]


def test_a_granular_scope_becomes_a_token_filter_checked_on_each_resource() -> None:
    grants = narrowed(f"user/Observation.rs?category={LAB}", READ)
    assert grants[0].tokens == (TokenFilter("category", frozenset({LAB})),)
    lab = {"resourceType": "Observation", "meta": {"security": [
        {"system": "urn:healthplatform:organization", "code": "org-1"}]}}

    def tokens(category: str):  # type: ignore[no-untyped-def]
        system = "http://terminology.hl7.org/CodeSystem/observation-category"
        return lambda resource, param: frozenset({(system, category)})
    assert admits(grants[0], lab, lambda r: frozenset(), tokens("laboratory"))
    assert not admits(grants[0], lab, lambda r: frozenset(), tokens("vital-signs"))
    assert not admits(grants[0], lab, lambda r: frozenset())  # no token reader: refused


def test_without_a_launch_patient_patient_scopes_admit_no_compartment() -> None:
    grants = narrowed("patient/Observation.rs", READ, patient=None)
    assert grants and all(g.patients == frozenset() for g in grants)
