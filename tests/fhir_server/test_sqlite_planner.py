"""The SQLite adapter's planner and budget: forcing its other paths must not change what a
search finds (the contract tests check what it finds on the usual paths)."""

from __future__ import annotations

import pytest

from fhir_server.store import sqlite_search
from tests.contract.test_search_parameters import PLAN_SENSITIVE, check
from tests.contract.test_search_results import names, walk

pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest.mark.parametrize(("path", "params", "expected"), PLAN_SENSITIVE)
async def test_broad_search_plans_find_the_same_records(sqlite_clinical, monkeypatch, path,
                                                        params, expected):
    """With every clause deemed too broad to drive, chains and _has run as correlated
    checks and the query scans the type in rid order: the answers must not change."""
    monkeypatch.setattr(sqlite_search, "ESTIMATE_CAP", 0)
    monkeypatch.setattr(sqlite_search, "DRIVE_NOW", -1)
    await check(sqlite_clinical, path, params, expected)


async def test_too_costly_search_is_refused_not_timed_out(sqlite_clinical, monkeypatch):
    monkeypatch.setattr(sqlite_search, "SEARCH_BUDGET", 100)
    monkeypatch.setattr(sqlite_search, "_BUDGET_STEP", 10)
    response = await sqlite_clinical.client.get("/fhir/Observation", params={
        "subject:Patient.name": "a"}, headers=sqlite_clinical.headers)
    assert response.status_code == 400
    assert response.json()["issue"][0]["code"] == "too-costly"


@pytest.mark.parametrize("sort", ["birthdate", "-birthdate", "family", "-_lastUpdated", "_id"])
async def test_streamed_sort_matches_the_materialized_one(sqlite_clinical, monkeypatch, sort):
    """A large result is sorted by walking the sort index; a small one in full. Forcing
    the large-result path must give the same order and pages."""
    expected = names(sqlite_clinical, await sqlite_clinical.search("Patient", {"_sort": sort}))
    monkeypatch.setattr(sqlite_search, "ESTIMATE_CAP", 0)
    pages = await walk(sqlite_clinical, "Patient", {"_sort": sort, "_count": "2"})
    assert [n for page in pages for n in page][:5] == expected
