"""The MongoDB query documents that search plans compile to (``fhir_server.store.mongo_query``,
``mongo_access``, ``mongo_search``), checked against the documents expected: what the
server is asked is fixed here, independently of any server or fake answering it."""

from __future__ import annotations

from typing import Any

import pytest
from bson.decimal128 import Decimal128

from fhir_server.search.plan import AccessGrant, TokenCriterion, compartment, parse_search
from fhir_server.search.registry import builtin_registry
from fhir_server.store.mongo_access import access_filter
from fhir_server.store.mongo_layout import index_document, sort_document
from fhir_server.store.mongo_query import QueryCompiler
from fhir_server.store.mongo_search import after, sort_stages
from fhir_server.store.port import IndexRows, SearchTooCostly

REGISTRY = builtin_registry()
LIVE = {"deleted": False}
LOINC = "http://loinc.org"


def plan(resource_type: str, *params: tuple[str, str], access=None):
    found = parse_search(REGISTRY, [resource_type], list(params), strict=True)
    found.access = access
    return found


async def no_inner(found, projection):
    raise AssertionError("no inner search expected")


async def compiled(search, inner=no_inner) -> dict[str, Any]:
    return await QueryCompiler(inner, search.access, search.all_types).plan_filter(search)


def clauses(query: dict[str, Any]) -> list[dict[str, Any]]:
    """The clause filters after the type and liveness ones."""
    assert query["$and"][:2] == [{"type": query["$and"][0]["type"]}, LIVE]
    return query["$and"][2:]


@pytest.mark.parametrize(("params", "expected"), [
    ((("family", "Odhiambo"),), {"ix.string": {"$elemMatch": {
        "param": "family", "value": {"$gte": "odhiambo", "$lt": "odhiambo\U0010ffff"}}}}),
    ((("family:exact", "Müller"),), {"ix.string": {"$elemMatch": {
        "param": "family", "exact": "Müller"}}}),
    ((("family:contains", "ass"),), {"ix.string": {"$elemMatch": {
        "param": "family", "value": {"$regex": "ass"}}}}),
    ((("identifier", "urn:oid:2.16.404.1.1|KE-1"),), {"ix.token": {"$elemMatch": {
        "param": "identifier", "code": "KE-1", "system": "urn:oid:2.16.404.1.1"}}}),
    ((("identifier", "|KE-1"),), {"ix.token": {"$elemMatch": {
        "param": "identifier", "code": "KE-1", "system": None}}}),
    ((("gender:not", "female"),), {"ix.token": {"$not": {"$elemMatch": {
        "param": "gender", "code": "female"}}}}),
    ((("gender", "female,male"),), {"ix.token": {"$elemMatch": {
        "param": "gender", "$or": [{"code": "female"}, {"code": "male"}]}}}),
    ((("birthdate", "ge1988"),), {"ix.date": {"$elemMatch": {
        "param": "birthdate", "hi": {"$gt": "1988-01-01T00:00:00.000000Z"}}}}),
    ((("birthdate", "sa1988"),), {"ix.date": {"$elemMatch": {
        "param": "birthdate", "lo": {"$gte": "1989-01-01T00:00:00.000000Z"}}}}),
    ((("birthdate", "eb1988-04"),), {"ix.date": {"$elemMatch": {
        "param": "birthdate", "hi": {"$lte": "1988-04-01T00:00:00.000000Z"}}}}),
    ((("birthdate", "1988-04-12"),), {"ix.date": {"$elemMatch": {
        "param": "birthdate", "lo": {"$gte": "1988-04-12T00:00:00.000000Z"},
        "hi": {"$lte": "1988-04-13T00:00:00.000000Z"}}}}),
    ((("birthdate", "ne1988"),), {"ix.date": {"$elemMatch": {
        "param": "birthdate", "$or": [{"lo": {"$lt": "1988-01-01T00:00:00.000000Z"}},
                                      {"hi": {"$gt": "1989-01-01T00:00:00.000000Z"}}]}}}),
    ((("family:missing", "true"),), {"ix.string": {"$not": {"$elemMatch": {
        "param": "family"}}}}),
    ((("_id", "p1,p2"),), {"id": {"$in": ["p1", "p2"]}}),
    ((("_lastUpdated", "lt2026-01-01"),), {"lastUpdated": {
        "$lt": "2026-01-01T00:00:00.000000Z"}}),
    ((("_content", "odhiambo nairobi"),), {"$and": [
        {"ix.text.content": {"$regex": "^odhiambo"}},
        {"ix.text.content": {"$regex": "^nairobi"}}]}),
    ((("organization", "Organization/knh"),), {"ix.reference": {"$elemMatch": {
        "param": "organization", "target_id": "knh", "target_type": "Organization"}}}),
])
async def test_patient_clauses_compile_to_row_matches(params, expected):
    query = await compiled(plan("Patient", *params))
    assert query["$and"][0] == {"type": "Patient"}
    assert clauses(query) == [expected]


async def test_numbers_and_quantities_compare_as_exact_decimals():
    query = await compiled(plan("Observation", ("value-quantity", "gt5.4|http://unitsofmeasure"
                                                ".org|mmol/L")))
    (row,) = clauses(query)
    match = row["ix.quantity"]["$elemMatch"]
    assert match["param"] == "value-quantity" and match["ncode"]
    assert all(isinstance(v, Decimal128) for v in match["nhi"].values())
    query = await compiled(plan("RiskAssessment", ("probability", "0.8")))
    (row,) = clauses(query)
    assert row == {"ix.number": {"$elemMatch": {
        "param": "probability", "lo": {"$gte": Decimal128("0.75")},
        "hi": {"$lt": Decimal128("0.85")}}}}


async def test_a_composite_matches_both_components_on_one_row():
    query = await compiled(plan("Observation", ("code-value-quantity",
                                                f"{LOINC}|8867-4$gt100")))
    (row,) = clauses(query)
    assert row == {"ix.composite": {"$elemMatch": {
        "param": "code-value-quantity", "code": "8867-4", "system": LOINC,
        "lo": {"$gt": Decimal128("100.0")}}}}


async def test_a_chain_searches_its_targets_first_then_their_references():
    asked = []

    async def inner(found, projection):
        asked.append((found, projection))
        return [{"id": "pat-2"}, {"id": "pat-1"}]

    query = await compiled(plan("Observation", ("subject:Patient.family", "Odhiambo")), inner)
    assert asked == [({"$and": [{"type": "Patient"}, LIVE, {"ix.string": {"$elemMatch": {
        "param": "family", "value": {"$gte": "odhiambo", "$lt": "odhiambo\U0010ffff"}}}}]},
        {"id": 1})]
    assert clauses(query) == [{"ix.reference": {"$elemMatch": {
        "param": "subject", "target_type": "Patient", "target_id": {"$in": ["pat-1",
                                                                            "pat-2"]}}}}]


async def test_has_finds_the_resources_its_matches_point_at():
    async def inner(found, projection):
        assert projection == {"ix.reference": 1}
        return [{"ix": {"reference": [
            {"param": "patient", "target_type": "Patient", "target_id": "pat-1"},
            {"param": "performer", "target_type": "Practitioner", "target_id": "dr-1"}]}}]

    query = await compiled(plan("Patient", ("_has:Observation:patient:code", "8867-4")), inner)
    assert clauses(query) == [{"id": {"$in": ["pat-1"]}}]


async def test_an_inner_search_matching_too_many_is_refused():
    async def inner(found, projection):
        return [{"id": str(n)} for n in range(10_001)]

    with pytest.raises(SearchTooCostly):
        await compiled(plan("Observation", ("subject:Patient.gender", "female")), inner)


def test_access_grants_become_criteria_of_the_query():
    owners = (TokenCriterion("urn:healthplatform:organization", "org-1"),)
    member = AccessGrant(None, owners=owners)
    self_grant = AccessGrant(frozenset({"Patient", "Observation"}), patients=("pat-1",),
                             members={"Observation": ("subject", "performer")})
    assert access_filter([member], ["Patient"]) == {"ix.token": {"$elemMatch": {
        "param": "_security", "code": "org-1",
        "system": "urn:healthplatform:organization"}}}
    assert access_filter([self_grant], ["Observation", "Encounter"]) == {"$and": [
        {"type": "Observation"},
        {"type": "Observation", "ix.reference": {"$elemMatch": {
            "param": {"$in": ["subject", "performer"]}, "target_type": "Patient",
            "target_id": {"$in": ["pat-1"]}}}}]}
    # Included resources may be of any type: the grant lists its own.
    assert access_filter([self_grant], None) == {"$and": [
        {"type": {"$in": ["Observation", "Patient"]}},
        {"$or": [{"type": "Observation", "ix.reference": {"$elemMatch": {
            "param": {"$in": ["subject", "performer"]}, "target_type": "Patient",
            "target_id": {"$in": ["pat-1"]}}}},
            {"type": "Patient", "id": {"$in": ["pat-1"]}}]}]}
    assert access_filter([AccessGrant(None)], ["Patient"]) is None  # everything
    assert access_filter([self_grant], ["Encounter"]) == {"_id": {"$in": []}}  # nothing


async def test_the_access_filter_is_part_of_the_search_query():
    grant = AccessGrant(None, owners=(TokenCriterion("urn:healthplatform:organization",
                                                     "org-1"),))
    query = await compiled(plan("Patient", ("gender", "female"), access=(grant,)))
    assert query["$and"][-1] == access_filter([grant], ["Patient"])


async def test_a_compartment_is_the_references_to_its_owner():
    search = plan("Observation")
    search.compartment = compartment(REGISTRY, "Patient", "pat-1", ["Observation"])
    query = await compiled(search)
    (member,) = clauses(query)
    assert member["type"] == "Observation"
    row = member["ix.reference"]["$elemMatch"]
    assert row["target_type"] == "Patient" and row["target_id"] == "pat-1"
    assert "subject" in row["param"]["$in"]


def test_sort_keys_and_the_keyset_after_a_cursor():
    search = plan("Patient", ("_sort", "gender,-birthdate"))
    fields, terms = sort_stages(search.sort)
    assert fields["k0"] == {"$ifNull": ["$sort.gender.a", None]}
    assert fields["k1"] == {"$ifNull": ["$sort.birthdate.d", None]}
    assert fields["m1"] == {"$cond": [{"$gt": [fields["k1"], None]}, 0, 1]}
    assert terms == [("m0", False), ("k0", False), ("m1", False), ("k1", True),
                     ("rid", False)]
    assert after(terms, [0, "female", 0, "1990", "r"], backwards=False) == {"$or": [
        {"m0": {"$gt": 0}},
        {"m0": 0, "k0": {"$gt": "female"}},
        {"m0": 0, "k0": "female", "m1": {"$gt": 0}},
        {"m0": 0, "k0": "female", "m1": 0, "k1": {"$lt": "1990"}},
        {"m0": 0, "k0": "female", "m1": 0, "k1": "1990", "rid": {"$gt": "r"}}]}
    # A missing value: nothing sorts after it among those missing it too.
    assert after(terms[:2], [1, None], backwards=True) == {"m0": {"$lt": 1}}


def test_index_values_are_stored_per_kind_with_sort_keys():
    rows = IndexRows({
        "date": [("birthdate", "1988-04-12T00:00:00.000000Z", "1988-04-13T00:00:00.000000Z")],
        "token": [("gender", None, "female", None), ("identifier", "urn:x", "KE-1", None)],
        "number": [("probability", 0.75, 0.85)],
        "text": [("Amina Odhiambo", "Amina Odhiambo Nairobi")],
    })
    ix = index_document(rows)
    assert ix["token"][0] == {"param": "gender", "code": "female"}
    assert ix["number"] == [{"param": "probability", "lo": Decimal128("0.75"),
                             "hi": Decimal128("0.85")}]
    assert ix["text"] == {"narrative": ["amina", "odhiambo"],
                          "content": ["amina", "nairobi", "odhiambo"]}
    assert sort_document(ix) == {
        "birthdate": {"a": "1988-04-12T00:00:00.000000Z", "d": "1988-04-13T00:00:00.000000Z"},
        "gender": {"a": "female", "d": "female"}, "identifier": {"a": "KE-1", "d": "KE-1"},
        "probability": {"a": Decimal128("0.75"), "d": Decimal128("0.85")}}
