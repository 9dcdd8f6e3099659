"""Pairs judged with the household rules, and clusters that do not depend on the order
records arrive in."""

from __future__ import annotations

import random

import pytest

from platform_api.mpi.demographics import Demographics
from platform_api.mpi.linkage import Constraints, Linker, Rules
from platform_api.mpi.matching import Model, PatientIndex
from tests.platform_api.mpi.population import population

HOME = {"address": "14 Ngong Road", "city": "Nairobi", "phone": "0712345678",
        "family": "Kamau"}


def linker(records: dict[str, dict[str, str]], owners: dict[str, str] | None = None,
           **rules: bool) -> Linker:
    index = PatientIndex()
    for rid, values in records.items():
        index.put(rid, Demographics.of(**values),
                  frozenset({(owners or {}).get(rid, "kibera")}))
    return Linker(index, Model.from_table({}), Rules(**rules))


def test_a_father_and_his_son_of_the_same_name_are_never_linked():
    judged = linker({"father": {**HOME, "given": "John", "sex": "male",
                                "birth_date": "1961-03-04"},
                     "son": {**HOME, "given": "John", "sex": "male",
                             "birth_date": "1989-07-21"}}).pair("father", "son")
    assert judged.household and not judged.automatic
    assert judged.conflict == "household: birth dates differ (different)"
    # the shared phone and address speak for the household: left out of the score
    assert judged.grade is None


def test_twins_stay_apart_and_are_not_even_proposed():
    judged = linker({"a": {**HOME, "given": "Wanjiku", "sex": "female",
                           "birth_date": "2012-05-06"},
                     "b": {**HOME, "given": "Achieng", "sex": "female",
                           "birth_date": "2012-05-06"}}).pair("a", "b")
    assert judged.conflict == "household: same birth date, different given names (twins)"
    assert judged.grade in (None, "possible")


def test_one_person_registered_twice_at_home_is_linked():
    judged = linker({"a": {**HOME, "given": "Amina W.", "sex": "female",
                           "birth_date": "1988-04-12"},
                     "b": {**HOME, "given": "Amina", "sex": "female",
                           "birth_date": "1988-04-12"}}).pair("a", "b")
    assert judged.household and judged.automatic and judged.grade == "certain"


def test_a_transposed_birth_date_waits_for_review_even_with_the_same_phone():
    judged = linker({"a": {"given": "Mohammed", "family": "Hassan", "sex": "male",
                           "birth_date": "1984-03-07", "phone": "0722000111"},
                     "b": {"given": "Muhammad", "family": "Hassan", "sex": "male",
                           "birth_date": "1984-07-03", "phone": "0722000111"}}).pair("a", "b")
    assert judged.scored.levels["birth_date"] == "transposed"
    assert "birth_date" not in judged.scored.agreed
    assert "transposed" in str(judged.hold)
    assert judged.grade == "probable" and not judged.automatic


def test_records_of_two_organizations_are_candidates_unless_the_rules_allow():
    records = {"a": {"given": "Grace", "family": "Achieng", "sex": "female",
                     "birth_date": "1980-04-12"},
               "b": {"given": "Grace", "family": "Achieng", "sex": "female",
                     "birth_date": "1980-04-12"}}
    owners = {"a": "kibera", "b": "mathare"}
    held = linker(records, owners).pair("a", "b")
    assert held.grade == "certain" and held.hold == "different organizations"
    assert linker(records, owners, across_organizations=True).pair("a", "b").automatic


def test_a_missing_birth_date_waits_for_review():
    judged = linker({"a": {"given": "Baraka", "family": "Mwangi", "sex": "male",
                           "birth_date": "1990-01-02", "national_ids": ["22334455"]},
                     "b": {"given": "Baraka", "family": "Mwangi", "sex": "male",
                           "email": "baraka@example.org"}}).pair("a", "b")
    assert judged.hold == "a birth date is missing" and not judged.automatic


def test_a_record_joins_a_cluster_only_when_it_conflicts_with_none_of_its_members():
    # b matches a and c each, but a and c are different people (birth dates differ)
    records = {"a": {"given": "Juma", "family": "Ouma", "sex": "male", "birth_date":
                     "1970-02-03", "national_ids": ["11112222"]},
               "b": {"given": "Juma", "family": "Ouma", "sex": "male",
                     "national_ids": ["11112222"], "phone": "0701000001"},
               "c": {"given": "Juma", "family": "Ouma", "sex": "male", "birth_date":
                     "1995-08-09", "phone": "0701000001", "national_ids": ["11112222"]}}
    judge = linker(records)
    assert judge.pair("a", "c").conflict == "birth dates differ"
    plan = judge.cluster(records, [judge.pair("a", "b"), judge.pair("b", "c"),
                                   judge.pair("a", "c")], Constraints(), {})
    assert all({"a", "c"} - c.members for c in plan.clusters)


def test_people_s_decisions_bind_the_clusters():
    records = {"a": {"given": "Neema", "family": "Wekesa", "sex": "female",
                     "birth_date": "2001-06-07"},
               "b": {"given": "Neema", "family": "Wekesa", "sex": "female",
                     "birth_date": "2001-06-07"},
               "c": {"given": "Neema", "family": "Wekesa", "sex": "female",
                     "phone": "0722000333"}}
    judge = linker(records)
    pairs = [judge.pair("a", "b")]
    apart = judge.cluster(records, pairs, Constraints(apart=frozenset({frozenset("ab")})), {})
    assert len(apart.clusters) == 3
    together = judge.cluster(records, pairs, Constraints(
        linked=frozenset({frozenset("bc")}), merged_away=frozenset("c")),
        {"a": "2", "b": "1", "c": "0"})
    assert {c.members for c in together.clusters} == {frozenset("abc")}
    assert together.cluster_of("a").golden == "b"  # created first of those not merged away


def clusters_added_one_by_one(entries: dict[str, Demographics], order: list[str]
                              ) -> set[frozenset[str]]:
    index = PatientIndex()
    clusters: dict[str, frozenset[str]] = {}
    for rid in order:
        index.put(rid, entries[rid])
        judge = Linker(index, Model.from_table({}), Rules())
        reached, pairs = judge.neighbourhood([rid], lambda x: clusters.get(x, ()))
        for cluster in judge.cluster(reached, pairs, Constraints(), {}).clusters:
            for member in cluster.members:
                clusters[member] = cluster.members
    return set(clusters.values())


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_clusters_are_the_same_in_any_order_and_never_merge_a_household(seed: int):
    entries = population(seed=5, households=40)
    records = {rid: e.demographics() for rid, e in entries.items()}
    index = PatientIndex()
    for rid, d in records.items():
        index.put(rid, d)
    judge = Linker(index, Model.from_table({}), Rules())
    pairs = {p.ids: p for rid in records for p in judge.neighbours(rid)}
    at_once = {c.members for c in judge.cluster(records, pairs.values(), Constraints(),
                                                {}).clusters}
    order = list(records)
    random.Random(seed).shuffle(order)
    assert clusters_added_one_by_one(records, order) == at_once
    people = [{entries[r].person for r in cluster} for cluster in at_once]
    assert all(len(p) == 1 for p in people), "two people of a household merged"
    assert sum(len(c) > 1 for c in at_once) > 20  # and duplicates were found
