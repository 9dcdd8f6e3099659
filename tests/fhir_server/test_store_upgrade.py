"""A store file made by an earlier release opens, gains what this one needs, and keeps
serving: the SQLite adapter migrates in place."""

from __future__ import annotations

import sqlite3

from fhir_server.search.extract import IndexExtractor
from fhir_server.search.plan import parse_search
from fhir_server.search.registry import builtin_registry
from fhir_server.store.sqlite import INDEX_SCHEMA_VERSION, SQLiteStore

REGISTRY = builtin_registry()
EXTRACT = IndexExtractor(REGISTRY)


async def test_a_store_without_digests_gains_them(tmp_path):
    path = tmp_path / "old.db"
    old = sqlite3.connect(path)
    old.executescript(f"""
        CREATE TABLE resources (rid INTEGER PRIMARY KEY, type TEXT NOT NULL, id TEXT NOT NULL,
            version INTEGER NOT NULL, last_updated TEXT NOT NULL,
            deleted INTEGER NOT NULL DEFAULT 0, UNIQUE (type, id));
        PRAGMA user_version = {INDEX_SCHEMA_VERSION};
    """)
    old.close()
    store = SQLiteStore(path)
    await store.open()
    try:
        for gender in ("female", "male"):
            body = {"resourceType": "Patient", "id": "p1", "gender": gender}
            async with store.unit_of_work() as uow:
                uow.update("Patient", "p1", body, index=EXTRACT(body))
                await uow.commit()
        found = await store.search(parse_search(REGISTRY, ["Patient"], [("gender", "male")]))
        assert [r.id for r in found.resources] == ["p1"]
        assert not (await store.search(
            parse_search(REGISTRY, ["Patient"], [("gender", "female")]))).resources
        digests = store.conn.execute(
            "SELECT index_digest, content_digest FROM resources").fetchone()
        assert None not in digests
    finally:
        await store.close()
