"""The SQL on FHIR v2 specification's published test suite, run through this server's
``$run`` (``POST /fhir/ViewDefinition/$run`` with the test's view as ``viewResource`` and
its resources as ``resource`` parameters, ``_format=json``), over real HTTP to the app.

Every test of every file of ``tests/data/sql-on-fhir-v2`` (the suite's ``tests/`` folder,
unchanged) is one case: ``expect`` rows compared as a multiset (the specification does not
order rows), ``expectColumns`` the columns in order (CSV header), ``expectCount`` the row
count, ``expectError`` a 4xx OperationOutcome (400 for a bad request, 422 for a view that
cannot run).
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio
from asgi_lifespan import LifespanManager

from platform_api.app import create_app
from tests.conftest import make_settings, register_and_login

SUITE = Path(__file__).resolve().parents[2] / "data" / "sql-on-fhir-v2"
pytestmark = pytest.mark.asyncio(loop_scope="module")


def _cases() -> list[Any]:
    cases = []
    for path in sorted(SUITE.glob("*.json")):
        suite = json.loads(path.read_text())
        for test in suite["tests"]:
            cases.append(pytest.param(suite["resources"], test,
                                      id=f"{path.stem}: {test['title']}"))
    return cases


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def analyst(tmp_path_factory: Any) -> AsyncIterator[tuple[httpx.AsyncClient, dict]]:
    """The app and a signed-in user: running a view over the resources a request
    supplies reads nothing of the server's, so any user may."""
    application = create_app(make_settings(tmp_path_factory.mktemp("sof")))
    async with LifespanManager(application, startup_timeout=30):
        transport = httpx.ASGITransport(app=application, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as c:
            user = await register_and_login(c, first_name="Achieng", last_name="Analyst")
            yield c, user["headers"]


def _parameters(view: dict[str, Any], resources: list[dict[str, Any]],
                fmt: str = "json") -> dict[str, Any]:
    return {"resourceType": "Parameters", "parameter": [
        {"name": "_format", "valueCode": fmt},
        {"name": "viewResource", "resource": {"resourceType": "ViewDefinition", **view}},
        *({"name": "resource", "resource": r} for r in resources)]}


def _key(row: dict[str, Any]) -> str:
    return json.dumps(row, sort_keys=True)


@pytest.mark.parametrize(("resources", "test"), _cases())
async def test_specification_case(analyst: tuple[httpx.AsyncClient, dict],
                                  resources: list[dict[str, Any]], test: dict[str, Any]
                                  ) -> None:
    client, headers = analyst
    response = await client.post("/fhir/ViewDefinition/$run", headers=headers,
                                 json=_parameters(test["view"], resources))
    if test.get("expectError"):
        assert response.status_code in (400, 422), response.text
        assert response.json()["resourceType"] == "OperationOutcome"
        return
    assert response.status_code == 200, response.text
    rows = response.json()
    if "expect" in test:
        assert sorted(map(_key, rows)) == sorted(map(_key, test["expect"]))
    if "expectCount" in test:
        assert len(rows) == test["expectCount"]
    if "expectColumns" in test:
        as_csv = await client.post("/fhir/ViewDefinition/$run", headers=headers,
                                   json=_parameters(test["view"], resources, "csv"))
        assert as_csv.status_code == 200, as_csv.text
        header = next(csv.reader(io.StringIO(as_csv.text)))
        assert header == test["expectColumns"]
