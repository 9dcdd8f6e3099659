"""The SQLite store checkpoints its WAL in a thread of its own and rewinds it once it is
large, so a store under steady writes keeps a bounded WAL and never checkpoints inside
a request's COMMIT."""

from __future__ import annotations

import asyncio
import os
import sys

from fhir_server.search.extract import IndexExtractor
from fhir_server.search.registry import builtin_registry
from fhir_server.store import sqlite as sqlite_store

EXTRACT = IndexExtractor(builtin_registry())


def pages(path: str) -> int:
    """The file's size in 4 KiB pages, 0 when it does not exist."""
    return os.path.getsize(path) // 4096 if os.path.exists(path) else 0


async def test_the_wal_is_checkpointed_in_the_background_and_rewound(tmp_path, monkeypatch):
    monkeypatch.setattr(sqlite_store._Checkpointer, "RESTART_FRAMES", 64)
    monkeypatch.setattr(sqlite_store._Checkpointer, "PAUSE", 0.001)
    path = tmp_path / "store.db"
    store = sqlite_store.SQLiteStore(path)
    await store.open()
    switch = sys.getswitchinterval()
    sys.setswitchinterval(0.001)  # as `healthplatform serve` runs (platform_api.cli)
    try:
        assert store.writer_conn.execute("PRAGMA wal_autocheckpoint").fetchone()[0] == 0
        async def writer(n: int) -> None:  # eight at once: commits follow back to back
            for i in range(n, 2400, 8):
                body = {"resourceType": "Patient", "id": f"p{i}",
                        "name": [{"family": f"N{i}"}],
                        "identifier": [{"system": "urn:example", "value": str(i)}]}
                async with store.unit_of_work() as uow:
                    uow.create("Patient", body["id"], body, index=EXTRACT(body))
                    await uow.commit()

        await asyncio.gather(*(writer(n) for n in range(8)))
        wal_pages = pages(f"{path}-wal")
        # 2,400 commits of several pages each: without the rewind the WAL holds them all
        # (about 12,900 pages); with it a few hundred, a few thousand when other processes
        # keep the checkpoint thread off the CPU (measured under a parallel test run)
        assert 0 < wal_pages < 6500, wal_pages
        # and the database file itself has the pages the checkpoints copied
        assert pages(str(path)) > 100
    finally:
        sys.setswitchinterval(switch)
        await store.close()
    assert pages(f"{path}-wal") == 0  # the last connection checkpoints, removes it
