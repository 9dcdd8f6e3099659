"""Options of the SQLite store URL: ``sqlite:///path?cache_mb=N`` sizes each connection's
page cache (a small machine wants less than the default, a large store more)."""

from __future__ import annotations

import pytest

from fhir_server.store import store_from_url
from fhir_server.store.sqlite import DEFAULT_CACHE_MB, SQLiteStore


def cache_kib(store: SQLiteStore) -> list[int]:
    return [-conn.execute("PRAGMA cache_size").fetchone()[0]
            for conn in (store.conn, store.writer_conn)]


async def test_the_default_cache_and_one_set_in_the_url(tmp_path):
    for url, megabytes in ((f"sqlite:///{tmp_path / 'a.db'}", DEFAULT_CACHE_MB),
                           (f"sqlite:///{tmp_path / 'b.db'}?cache_mb=32", 32)):
        store = store_from_url(url)
        await store.open()
        try:
            assert store.path.endswith(".db")  # the option is not part of the file name
            assert cache_kib(store) == [megabytes * 1024] * 2
        finally:
            await store.close()


@pytest.mark.parametrize("query", ["cache_mb=0", "cache_mb=lots", "cache=64", "cache_mb"])
def test_a_bad_option_is_refused_by_name(tmp_path, query):
    with pytest.raises(ValueError, match="cache_mb"):
        store_from_url(f"sqlite:///{tmp_path / 'c.db'}?{query}")


async def test_the_store_files_and_their_directory_are_private_to_the_service_user(tmp_path):
    import stat

    store = SQLiteStore(tmp_path / "clinic" / "healthplatform.db")
    await store.open()
    try:
        async with store.unit_of_work() as uow:
            uow.create("Patient", "p1", {"resourceType": "Patient"})
            await uow.commit()
        directory = tmp_path / "clinic"
        assert stat.S_IMODE(directory.stat().st_mode) == 0o700
        files = sorted(p.name for p in directory.iterdir())
        # the store and its audit log (fhir_server.audit_log), each with its WAL files
        assert files == ["healthplatform-audit.db", "healthplatform-audit.db-shm",
                         "healthplatform-audit.db-wal", "healthplatform.db",
                         "healthplatform.db-shm", "healthplatform.db-wal"]
        for path in directory.iterdir():
            assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    finally:
        await store.close()


async def test_a_world_readable_store_of_an_older_version_is_narrowed(tmp_path, caplog):
    import stat

    old = tmp_path / "old.db"
    store = SQLiteStore(old)
    await store.open()
    await store.close()
    old.chmod(0o644)
    again = SQLiteStore(old)
    with caplog.at_level("WARNING"):
        await again.open()
    try:
        assert stat.S_IMODE(old.stat().st_mode) == 0o600
        assert "narrowed to 0600" in caplog.text
    finally:
        await again.close()
