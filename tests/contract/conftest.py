"""The adapters under contract, and what the contract tests run on.

Every test in ``tests/contract/`` runs once per adapter of :data:`ADAPTERS` (its test id
says which): on the store itself (``store``), on the whole app over HTTP
(``adapter_client``), or on the app holding the clinical record set (``clinical``,
loaded once per module). A second adapter passes the contract by joining the list.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio
from asgi_lifespan import LifespanManager

from fhir_server.store import ResourceStore, store_from_url
from platform_api.app import create_app
from tests.conftest import make_clinic_admin, make_settings
from tests.fhir_server.clinical_data import server_ids, transaction_bundle

# The MongoDB adapter joins this list when it exists.
ADAPTERS = ["sqlite"]
FHIR = {"Content-Type": "application/fhir+json"}


def store_url(adapter: str, directory: Path) -> str:
    if adapter == "sqlite":
        return f"sqlite:///{directory / 'contract.db'}"
    raise ValueError(f"no such adapter under contract: {adapter}")


@pytest.fixture(params=ADAPTERS)
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[ResourceStore]:
    adapter = store_from_url(store_url(request.param, tmp_path),
                             unique_document_fields={"users": ["email"]})
    await adapter.open()
    try:
        yield adapter
    finally:
        await adapter.close()


@asynccontextmanager
async def serving(adapter: str, directory: Path) -> AsyncIterator[tuple[Any, httpx.AsyncClient]]:
    """The app on a store of ``adapter``, and a client reaching it over ASGI."""
    app = create_app(make_settings(directory, store=store_url(adapter, directory)))
    async with LifespanManager(app):
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as c:
            yield app, c


@pytest.fixture(params=ADAPTERS)
async def adapter_client(request: pytest.FixtureRequest, tmp_path: Path
                         ) -> AsyncIterator[httpx.AsyncClient]:
    async with serving(request.param, tmp_path) as (_app, client):
        yield client


@dataclass
class Clinical:
    client: httpx.AsyncClient
    headers: dict[str, str]
    ids: dict[str, str]  # short name (clinical_data.RECORDS) → server id
    app: Any
    adapter: str

    async def search(self, path: str, params: Any = None, **headers: str) -> dict[str, Any]:
        url = f"/fhir/{path}" if path else "/fhir"
        response = await self.client.get(url, params=params,
                                          headers={**self.headers, **headers})
        assert response.status_code == 200, response.text
        return response.json()  # type: ignore[no-any-return]

    async def names(self, path: str, params: Any = None) -> set[str]:
        """The short names of the matches of a search (all pages)."""
        by_id = {v: k for k, v in self.ids.items()}
        found: set[str] = set()
        bundle = await self.search(path, params)
        while True:
            found |= {by_id.get(e["resource"]["id"], e["resource"]["id"])
                      for e in bundle["entry"] if e["search"]["mode"] == "match"}
            nxt = next((link["url"] for link in bundle["link"] if link["relation"] == "next"),
                       None)
            if nxt is None:
                return found
            response = await self.client.get(nxt, headers=self.headers)
            bundle = response.json()


@asynccontextmanager
async def clinical_record_set(adapter: str, directory: Path) -> AsyncIterator[Clinical]:
    """The app on ``adapter`` holding the clinical record set, written (one transaction)
    by a clinic's administrator, who searches it."""
    async with serving(adapter, directory) as (app, client):
        user = await make_clinic_admin(client)
        headers = {**user["headers"], **FHIR}
        response = await client.post("/fhir", json=transaction_bundle(), headers=headers)
        assert response.status_code == 200, response.text
        yield Clinical(client, headers, server_ids(response.json()), app, adapter)


@pytest_asyncio.fixture(scope="module", loop_scope="module", params=ADAPTERS)
async def clinical(request: pytest.FixtureRequest, tmp_path_factory: Any
                   ) -> AsyncIterator[Clinical]:
    async with clinical_record_set(request.param,
                                   tmp_path_factory.mktemp(request.param)) as loaded:
        yield loaded
