"""``phonetic`` searches match names that sound alike (Metaphone), on every resource type
that has the parameter, and stores indexed before the codes are migrated in place."""

from __future__ import annotations

import sqlite3

import pytest

from fhir_server.search.extract import IndexExtractor
from fhir_server.search.phonetic import phonetic_code
from fhir_server.search.plan import parse_search
from fhir_server.search.registry import builtin_registry
from fhir_server.store.sqlite import SQLiteStore
from fhir_server.store.sqlite import _upgrade_index_schema as upgrade

REGISTRY = builtin_registry()
EXTRACT = IndexExtractor(REGISTRY)


def person(resource_type: str, family: str, *given: str) -> dict:
    return {"resourceType": resource_type, "name": [{"family": family, "given": list(given)}]}


@pytest.mark.parametrize(("name", "alike", "different"), [
    ("Mohammed", ["Muhammad", "Mohamed"], ["Mahmoud"]),
    ("Smith", ["Smyth"], ["Smart"]),
    ("Kwame", ["Kwami"], ["Kamau"]),
    ("Wanjirũ", ["Wanjiru"], ["Wanjiku"]),
    ("Okafor", ["Okaafor"], ["Okoro"]),
])
def test_names_that_sound_alike_share_a_code(name, alike, different):
    assert all(phonetic_code(a) == phonetic_code(name) for a in alike)
    assert all(phonetic_code(d) != phonetic_code(name) for d in different)


def test_the_index_holds_the_code_of_each_name_part():
    rows = EXTRACT({**person("Patient", "Otieno", "Mohammed", "Amina"), "id": "p1"}).rows
    phonetic = sorted(r for r in rows["string"] if r[0] == "phonetic")
    assert phonetic == [("phonetic", "AMN", "Amina"), ("phonetic", "MHMT", "Mohammed"),
                        ("phonetic", "OTN", "Otieno")]


async def test_a_store_indexed_with_names_is_recoded_in_place(tmp_path):
    path = tmp_path / "store.db"
    store = SQLiteStore(path)
    await store.open()
    body = {**person("Patient", "Smith", "Mohammed"), "id": "p1"}
    async with store.unit_of_work() as uow:
        uow.create("Patient", "p1", body, index=EXTRACT(body))
        await uow.commit()
    await store.close()
    old = sqlite3.connect(path)  # as index schema 2 wrote them: the names themselves
    old.execute("UPDATE idx_string SET value = lower(exact) WHERE param = 'phonetic'")
    old.execute("PRAGMA user_version = 2")
    old.commit()
    old.close()

    store = SQLiteStore(path)
    await store.open()
    try:
        assert not store.needs_reindex  # migrated, not rebuilt
        values = sorted(r[0] for r in store.conn.execute(
            "SELECT value FROM idx_string WHERE param = 'phonetic'"))
        assert values == ["MHMT", "SM0"]
        plan = parse_search(REGISTRY, ["Patient"], [("phonetic", "Smyth")])
        assert [r.id for r in (await store.search(plan)).resources] == ["p1"]
        assert upgrade(store.conn) is False  # already current
    finally:
        await store.close()
