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
