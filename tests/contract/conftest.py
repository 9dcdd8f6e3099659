"""Adapters under contract. The MongoDB adapter joins this list when it exists."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from fhir_server.store.sqlite import SQLiteStore


@pytest.fixture(params=["sqlite"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[SQLiteStore]:
    adapter = SQLiteStore(tmp_path / "contract.db", unique_document_fields={"users": ["email"]})
    await adapter.open()
    try:
        yield adapter
    finally:
        await adapter.close()
