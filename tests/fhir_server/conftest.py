"""Fixtures of the FHIR tests that are not part of the adapters' contract."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest_asyncio

from tests.contract.conftest import FHIR, Clinical, clinical_record_set

__all__ = ["FHIR", "sqlite_clinical"]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def sqlite_clinical(tmp_path_factory: Any) -> AsyncIterator[Clinical]:
    """The clinical record set on the SQLite adapter (its planner's own tests)."""
    async with clinical_record_set("sqlite", tmp_path_factory.mktemp("sqlite")) as loaded:
        yield loaded
