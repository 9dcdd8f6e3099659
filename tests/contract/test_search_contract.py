"""The search contract every store adapter must pass: index rows written in the same
commit as the resource, search plans compiled to queries, keyset paging that is stable
under writes, includes, conditional writes decided inside the commit, and reindexing."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from fhir_server.search.extract import IndexExtractor
from fhir_server.search.plan import Cursor, parse_search
from fhir_server.search.registry import builtin_registry
from fhir_server.store import (
    Condition,
    ConditionChanged,
    IndexRows,
    MultipleMatches,
    ResourceExists,
)
from tests.contract.conftest import needs_transactions

REGISTRY = builtin_registry()
EXTRACT = IndexExtractor(REGISTRY)


def patient(pid: str, family: str, birth: str, mrn: str | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"resourceType": "Patient", "id": pid, "name": [{"family": family}],
                            "birthDate": birth}
    if mrn:
        body["identifier"] = [{"system": "urn:oid:2.16.404.1.1", "value": mrn}]
    return body


def plan(resource_type: str, **params: str):
    return parse_search(REGISTRY, [resource_type], list(params.items()), strict=True)


async def put(store, *resources: dict[str, Any]) -> None:
    """Write ``resources`` in one unit of work; one unit each on a store without
    multi-document transactions (the tests that need one unit say so)."""
    units = [resources] if getattr(store, "transactions", True) else [[r] for r in resources]
    for unit in units:
        async with store.unit_of_work() as uow:
            for body in unit:
                uow.update(body["resourceType"], body["id"], body, index=EXTRACT(body))
            await uow.commit()


async def ids(store, search) -> list[str]:
    return [r.id for r in (await store.search(search)).resources]


async def test_index_rows_follow_create_update_and_delete(store):
    await put(store, patient("p1", "Odhiambo", "1988-04-12"), patient("p2", "Mensah", "1975"))
    assert await ids(store, plan("Patient", family="odh")) == ["p1"]
    await put(store, patient("p1", "Okafor", "1988-04-12"))
    assert await ids(store, plan("Patient", family="odh")) == []
    assert await ids(store, plan("Patient", family="oka")) == ["p1"]
    async with store.unit_of_work() as uow:
        uow.delete("Patient", "p1")
        await uow.commit()
    assert await ids(store, plan("Patient", birthdate="ge1900")) == ["p2"]



async def test_updates_keep_every_index_table_current(store):
    """Each update changes some parameter types and leaves others as they were."""
    base = {**patient("p1", "Odhiambo", "1988-04-12", "KE-1"), "gender": "female"}
    await put(store, base, patient("p2", "Mensah", "1975"))
    steps = [
        ({}, {"family": "odhiambo", "gender": "female", "birthdate": "1988-04-12"}),
        ({}, {"family": "odhiambo", "gender": "female"}),  # the same body again
        ({"gender": "male"}, {"family": "odhiambo", "gender": "male"}),
        ({"gender": "male", "name": [{"family": "Okafor"}]},
         {"family": "okafor", "_content": "okafor"}),
        ({"gender": "male", "name": [{"family": "Okafor"}], "birthDate": "1990"},
         {"birthdate": "1990", "gender": "male", "identifier": "KE-1"}),
    ]
    for change, expect in steps:
        await put(store, {**base, **change})
        for param, value in expect.items():
            assert await ids(store, plan("Patient", **{param: value})) == ["p1"], (change, param)
    assert await ids(store, plan("Patient", family="odhiambo")) == []
    assert await ids(store, plan("Patient", gender="female")) == []
    assert await ids(store, plan("Patient", birthdate="1988")) == []
    assert await ids(store, plan("Patient", _content="odhiambo")) == []
    async with store.unit_of_work() as uow:
        uow.delete("Patient", "p1")
        await uow.commit()
    assert await ids(store, plan("Patient", gender="male")) == []
    await put(store, {**base, "gender": "other"})  # back from deletion
    assert await ids(store, plan("Patient", gender="other")) == ["p1"]
    assert await ids(store, plan("Patient", family="odhiambo")) == ["p1"]


async def test_writes_of_one_resource_in_one_commit_keep_only_the_last_rows(store):
    needs_transactions(store)
    await put(store, patient("p1", "Odhiambo", "1988", "KE-7"), patient("p2", "Mensah", "1975"))
    async with store.unit_of_work() as uow:
        for family, mrn in (("Okafor", "KE-8"), ("Wanjiru", "KE-9")):
            body = patient("p1", family, "1988", mrn)
            uow.update("Patient", "p1", body, index=EXTRACT(body))
        body = patient("p2", "Achieng", "1975")
        uow.update("Patient", "p2", body, index=EXTRACT(body))
        uow.delete("Patient", "p2")
        # A condition later in the same commit sees the updates, not the committed rows.
        stale = patient("p3", "Kamau", "1990", "KE-7")
        kept = uow.create("Patient", "p3", stale, index=EXTRACT(stale),
                          condition=Condition(plan("Patient", identifier="KE-7")))
        await uow.commit()
    assert not kept.existing
    assert await ids(store, plan("Patient", family="okafor")) == []
    assert await ids(store, plan("Patient", family="wanjiru")) == ["p1"]
    assert await ids(store, plan("Patient", identifier="KE-9")) == ["p1"]
    assert await ids(store, plan("Patient", identifier="KE-7")) == ["p3"]
    assert await ids(store, plan("Patient", family="achieng")) == []
    assert await ids(store, plan("Patient", birthdate="1975")) == []

async def test_a_failed_commit_leaves_no_index_rows(store):
    needs_transactions(store)
    await put(store, patient("p1", "Odhiambo", "1988"))
    with pytest.raises(ResourceExists):
        async with store.unit_of_work() as uow:
            body = patient("p2", "Mensah", "1975")
            uow.create("Patient", "p2", body, index=EXTRACT(body))
            uow.create("Patient", "p1", patient("p1", "Clash", "1990"))
            await uow.commit()
    assert await ids(store, plan("Patient", family="mensah")) == []


async def test_keyset_pages_are_stable_under_writes(store):
    await put(store, *[patient(f"p{i}", "Odhiambo", f"19{50 + i}") for i in range(6)])
    search = plan("Patient", family="odhiambo", _sort="birthdate", _count="2")
    first = await store.search(search)
    assert [r.id for r in first.resources] == ["p0", "p1"] and first.next is not None
    await put(store, patient("early", "Odhiambo", "1901"), patient("late", "Odhiambo", "2001"))
    search.cursor = first.next
    second = await store.search(search)
    assert [r.id for r in second.resources] == ["p2", "p3"]
    search.cursor = second.previous
    assert [r.id for r in (await store.search(search)).resources] == ["p0", "p1"]
    search.cursor = Cursor.decode(second.next.encode())
    assert [r.id for r in (await store.search(search)).resources] == ["p4", "p5"]


async def test_totals_and_includes(store):
    organization = {"resourceType": "Organization", "id": "knh", "name": "KNH"}
    member = {**patient("p1", "Odhiambo", "1988"),
              "managingOrganization": {"reference": "Organization/knh"}}
    await put(store, organization, member, patient("p2", "Odhiambo", "1990"))
    search = plan("Patient", family="odhiambo", _include="Patient:organization",
                  _total="accurate", _count="1")
    page = await store.search(search)
    assert page.total == 2
    assert [r.id for r in page.included] == (["knh"] if page.resources[0].id == "p1" else [])


async def test_conditional_create_is_decided_inside_the_commit(store):
    needs_transactions(store)
    condition = plan("Patient", identifier="urn:oid:2.16.404.1.1|KE-1")
    first = patient("a", "Odhiambo", "1988", "KE-1")
    async with store.unit_of_work() as uow:
        created = uow.create("Patient", "a", first, index=EXTRACT(first),
                             condition=Condition(condition))
        duplicate = {**first, "id": "b"}
        again = uow.create("Patient", "b", duplicate, index=EXTRACT(duplicate),
                           condition=Condition(condition))
        await uow.commit()
    assert not created.existing and again.existing and again.result.id == "a"
    await put(store, patient("c", "Odhiambo", "1988", "KE-1"))
    with pytest.raises(MultipleMatches):
        async with store.unit_of_work() as uow:
            uow.create("Patient", "d", patient("d", "X", "1988"), condition=Condition(condition))
            await uow.commit()
    with pytest.raises(ConditionChanged):
        async with store.unit_of_work() as uow:
            uow.create("Patient", "e", patient("e", "X", "1988"),
                       condition=Condition(condition, expected_ids=("a",)))
            await uow.commit()


async def test_conditional_update_targets_the_match(store):
    await put(store, patient("a", "Odhiambo", "1988", "KE-2"))
    body = patient("ignored", "Okafor", "1988", "KE-2")
    async with store.unit_of_work() as uow:
        staged = uow.update("Patient", "ignored", body, index=EXTRACT(body),
                            condition=Condition(plan("Patient", identifier="KE-2")))
        await uow.commit()
    assert staged.result.id == "a" and staged.result.version == 2
    assert orjson.loads((await store.read("Patient", "a")).body)["name"][0]["family"] == "Okafor"


async def test_reindex_reads_and_replaces_index_rows(store):
    async with store.unit_of_work() as uow:  # written without index rows
        uow.create("Patient", "p1", patient("p1", "Odhiambo", "1988"))
        await uow.commit()
    assert await ids(store, plan("Patient", family="odhiambo")) == []
    assert await store.count_current() == 1
    batches = [batch async for batch in store.iter_current(batch=10)]
    items = [(s, EXTRACT(orjson.loads(s.body))) for s in batches[0]]
    await store.replace_index(items)
    assert await ids(store, plan("Patient", family="odhiambo")) == ["p1"]
    await store.replace_index([(batches[0][0], IndexRows())])
    assert await ids(store, plan("Patient", family="odhiambo")) == []


async def test_conditions_see_what_the_same_commit_wrote_before_them(store):
    needs_transactions(store)
    def staged_patient(uow, pid, mrn, criteria=None, system="urn:oid:2.16.404.1.1"):
        body = patient(pid, "Odhiambo", "1988")
        body["identifier"] = [{"system": system, "value": mrn} if system else {"value": mrn}]
        condition = Condition(plan("Patient", **criteria)) if criteria else None
        return uow.create("Patient", pid, body, index=EXTRACT(body), condition=condition)

    async with store.unit_of_work() as uow:
        staged_patient(uow, "a", "KE-1")
        staged_patient(uow, "b", "KE-2", system=None)
        found = [staged_patient(uow, f"x{i}", "KE-0", criteria)
                 for i, criteria in enumerate([
                     {"identifier": "urn:oid:2.16.404.1.1|KE-1"},  # a
                     {"identifier": "KE-1"},  # a: any system
                     {"identifier": "|KE-1"},  # none: a has a system
                     {"identifier": "|KE-2"},  # b
                     {"identifier": "other|KE-2"},  # none
                     {"identifier": "KE-2,KE-1", "_id": "b"},  # b (not a token: all rows)
                     {"identifier": "KE-2", "active": "true"},  # none: b is not active
                 ])]
        await uow.commit()
    outcome = [s.result.id if s.existing else None for s in found]
    assert outcome == ["a", "a", None, "b", None, "b", None]


async def test_match_ids_finds_what_search_finds(store):
    """Conditional interactions ask for matching ids only; every kind of plan answers as
    the search of the same criteria does (deleted resources never match)."""
    await put(store, patient("a", "Odhiambo", "1988", "KE-1"), patient("b", "Mensah", "1975"),
              {**patient("c", "Okafor", "1990", "KE-3"), "active": True},
              {**patient("d", "Kamau", "1960"), "identifier": [{"value": "KE-4"}]})
    async with store.unit_of_work() as uow:
        uow.delete("Patient", "c")
        await uow.commit()
    observation = {"resourceType": "Observation", "id": "o1", "status": "final",
                   "code": {"coding": [{"system": "http://loinc.org", "code": "718-7"}]},
                   "component": [{"code": {"coding": [{"system": "http://loinc.org",
                                                       "code": "8480-6"}]}}]}
    await put(store, observation)
    cases = [
        ("Patient", {"identifier": "urn:oid:2.16.404.1.1|KE-1"}, ["a"]),
        ("Patient", {"identifier": "KE-1,KE-4"}, ["a", "d"]),
        ("Patient", {"identifier": "|KE-4"}, ["d"]),
        ("Patient", {"identifier": "|KE-1"}, []),
        ("Patient", {"identifier": "KE-3"}, []),  # deleted
        ("Patient", {"identifier": "KE-1", "family": "odh"}, ["a"]),  # planned as a search
        ("Patient", {"family": "m"}, ["b"]),
        ("Observation", {"combo-code": "http://loinc.org|8480-6"}, ["o1"]),  # a union
        ("Observation", {"code": "8480-6"}, []),
    ]
    for resource_type, criteria, expected in cases:
        search = plan(resource_type, **criteria)
        assert await store.match_ids(search, limit=10) == expected, criteria
        assert sorted(await ids(store, search)) == expected, criteria
    assert len(await store.match_ids(plan("Patient", identifier="KE-1,KE-4"), limit=1)) == 1


async def test_match_ids_many_answers_each_plan_as_match_ids_does(store):
    """A transaction asks the conditions of all its entries at once: each answer is the
    one ``match_ids`` gives for that plan alone, in order, whatever else is asked with it
    (plain token conditions of several types and parameters, codes shared across systems,
    ``|code``, OR-ed codes, deleted resources, plans that are not plain tokens)."""
    await put(store, patient("a", "Odhiambo", "1988", "KE-1"), patient("b", "Mensah", "1975"),
              {**patient("c", "Okafor", "1990", "KE-3")},
              {**patient("d", "Kamau", "1960"), "identifier": [{"value": "KE-4"}]},
              {**patient("e", "Banda", "1970"),
               "identifier": [{"system": "urn:other", "value": "KE-1"}]})
    async with store.unit_of_work() as uow:
        uow.delete("Patient", "c")
        await uow.commit()
    await put(store, {"resourceType": "Observation", "id": "o1", "status": "final",
                      "identifier": [{"system": "urn:oid:2.16.404.1.1", "value": "KE-1"}],
                      "code": {"coding": [{"system": "http://loinc.org", "code": "718-7"}]}})
    criteria = [
        ("Patient", {"identifier": "urn:oid:2.16.404.1.1|KE-1"}),  # a, not e nor o1
        ("Patient", {"identifier": "KE-1"}),  # a and e
        ("Patient", {"identifier": "urn:other|KE-1"}),  # e
        ("Patient", {"identifier": "KE-1,KE-4"}),  # a, d, e
        ("Patient", {"identifier": "|KE-4"}),  # d
        ("Patient", {"identifier": "|KE-1"}),  # none
        ("Patient", {"identifier": "KE-3"}),  # deleted
        ("Observation", {"identifier": "urn:oid:2.16.404.1.1|KE-1"}),  # o1
        ("Observation", {"code": "http://loinc.org|718-7"}),  # o1
        ("Patient", {"family": "m"}),  # not a token: b
        ("Patient", {"identifier": "KE-1", "family": "odh"}),  # two clauses: a
        ("Patient", {"identifier": "urn:nothing|KE-9"}),  # none
    ]
    plans = [plan(resource_type, **c) for resource_type, c in criteria]
    expected = [await store.match_ids(p, limit=10) for p in plans]
    assert expected[:5] == [["a"], ["a", "e"], ["e"], ["a", "d", "e"], ["d"]]
    assert await store.match_ids_many(plans, limit=10) == expected
    assert await store.match_ids_many(list(reversed(plans)), limit=10) == expected[::-1]
    assert await store.match_ids_many(plans, limit=1) == [e[:1] for e in expected]
    assert await store.match_ids_many([], limit=2) == []


async def test_match_ids_many_with_a_code_many_resources_share(store):
    """A condition on a code held by many resources still answers up to the limit (an
    adapter that looks them up together must not bring, or miss, any of them)."""
    await put(store, *[patient(f"p{i:02d}", "Shared", "1980", "SHARED") for i in range(25)],
              patient("x", "Single", "1981", "ONE"))
    plans = [plan("Patient", identifier="urn:oid:2.16.404.1.1|SHARED"),
             plan("Patient", identifier="ONE")]
    for limit in (1, 2, 101):
        expected = [await store.match_ids(p, limit=limit) for p in plans]
        assert await store.match_ids_many(plans, limit=limit) == expected
    assert len(expected[0]) == 25 and expected[1] == ["x"]


async def test_an_expunged_resource_leaves_no_index_rows(store):
    await put(store, patient("p1", "Odhiambo", "1988-04-12", mrn="KE-1"),
              patient("p2", "Odhiambo", "1975-09-30"))
    async with store.unit_of_work() as uow:
        uow.expunge("Patient", "p1")
        await uow.commit()
    assert await ids(store, plan("Patient", family="odhiambo")) == ["p2"]
    assert await store.match_ids(plan("Patient", identifier="KE-1"), 5) == []
    assert await ids(store, plan("Patient", _content="odhiambo")) == ["p2"]
    # A later write of the same id starts a new life at version 1.
    await put(store, patient("p1", "Wanjiru", "1990-01-01"))
    assert (await store.read("Patient", "p1")).version == 1
    assert await ids(store, plan("Patient", family="wanjiru")) == ["p1"]
