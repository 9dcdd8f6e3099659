"""The adapters under contract, and what the contract tests run on.

Every test in ``tests/contract/`` runs once per adapter of :data:`ADAPTERS` (its test id
says which): on the store itself (``store``), on the whole app over HTTP
(``adapter_client``), or on the app holding the clinical record set (``clinical``,
loaded once per module).

MongoDB: against the server ``HEALTHPLATFORM_TEST_MONGODB_URI`` names (a replica set for
the transaction tests; each test in a database of its own, dropped after it), otherwise
against the in-process fake of ``mongo_fake.py`` (mongomock behind the async client's
surface), which is standalone: what needs multi-document transactions is skipped there
with that reason (:func:`needs_transactions`), never faked. The report header says which
one ran.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import pytest_asyncio
from asgi_lifespan import LifespanManager

from fhir_server.store import ResourceStore, store_from_url
from fhir_server.store.mongo import MongoStore
from platform_api.app import create_app
from tests.conftest import make_clinic_admin, make_settings
from tests.fhir_server.clinical_data import RECORDS, _uuid, server_ids, transaction_bundle

ADAPTERS = ["sqlite", "mongodb"]
FHIR = {"Content-Type": "application/fhir+json"}
MONGODB_URI = os.environ.get("HEALTHPLATFORM_TEST_MONGODB_URI", "")
FAKE_MONGODB = "mongodb://in-process-fake:27017"
NO_TRANSACTIONS = ("needs a MongoDB replica set (multi-document transactions); the "
                   "in-process fake is standalone: set HEALTHPLATFORM_TEST_MONGODB_URI to "
                   "a replica set to run it")


def mongodb_description() -> str:
    """Which MongoDB the contract runs against (the report header says it)."""
    if not MONGODB_URI:
        return ("MongoDB: in-process fake (mongomock behind the async client; standalone: "
                "tests needing transactions skipped); set HEALTHPLATFORM_TEST_MONGODB_URI "
                "for a real server")
    from pymongo import MongoClient
    from pymongo.uri_parser import parse_uri

    hosts = ",".join(f"{h}:{p}" for h, p in parse_uri(MONGODB_URI)["nodelist"])
    try:
        with MongoClient(MONGODB_URI, serverSelectionTimeoutMS=3000) as client:
            hello = client.admin.command("hello")
            version = client.server_info()["version"]
    except Exception as exc:  # the header still says what was asked for
        return f"MongoDB: real server at {hosts} (unreachable: {exc})"
    kind = ("sharded cluster" if hello.get("msg") == "isdbgrid" else
            f"replica set {hello['setName']}" if "setName" in hello else "standalone")
    return f"MongoDB: real server {version} at {hosts} ({kind})"


def store_url(adapter: str, directory: Path) -> str:
    if adapter == "sqlite":
        return f"sqlite:///{directory / 'contract.db'}"
    if adapter == "mongodb":
        # A database of its own per test (the directory is unique per test or module).
        name = "hp_" + uuid.uuid5(uuid.NAMESPACE_URL, str(directory)).hex[:20]
        base, _, options = (MONGODB_URI or FAKE_MONGODB).partition("?")
        scheme, _, rest = base.partition("://")
        hosts = rest.partition("/")[0]
        return f"{scheme}://{hosts}/{name}" + (f"?{options}" if options else "")
    raise ValueError(f"no such adapter under contract: {adapter}")


@pytest.fixture(scope="session", autouse=True)
def mongodb_client() -> Iterator[None]:
    """Without a real server, every MongoStore of the tests talks to the fake."""
    if MONGODB_URI:
        yield
        return
    from tests.contract.mongo_fake import installed

    with installed():
        yield


async def drop_database(url: str) -> None:
    """A test's MongoDB database goes with it."""
    store = MongoStore.from_url(url)
    await store.open()
    try:
        await store.client.drop_database(store.database_name)
    finally:
        await store.close()


def needs_transactions(store: Any) -> None:
    """Skip on a store without multi-document transactions (the fake)."""
    if getattr(store, "transactions", True) is False:
        pytest.skip(NO_TRANSACTIONS)


@pytest.fixture(params=ADAPTERS)
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[ResourceStore]:
    url = store_url(request.param, tmp_path)
    adapter = store_from_url(url, unique_document_fields={"users": ["email"]})
    await adapter.open()
    try:
        yield adapter
    finally:
        await adapter.close()
        if request.param == "mongodb":
            await drop_database(url)


@asynccontextmanager
async def serving(adapter: str, directory: Path) -> AsyncIterator[tuple[Any, httpx.AsyncClient]]:
    """The app on a store of ``adapter``, and a client reaching it over ASGI."""
    url = store_url(adapter, directory)
    app = create_app(make_settings(directory, store=url))
    try:
        async with LifespanManager(app, startup_timeout=30):
            transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
            async with httpx.AsyncClient(transport=transport,
                                         base_url="http://testserver") as c:
                yield app, c
    finally:
        if adapter == "mongodb":
            await drop_database(url)


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
    by a clinic's administrator, who searches it. A store without transactions (the
    MongoDB fake) refuses the transaction; it gets the same records as a batch of
    updates-as-creates, with ids the test picks, and the search tests run the same."""
    async with serving(adapter, directory) as (app, client):
        user = await make_clinic_admin(client)
        headers = {**user["headers"], **FHIR}
        bundle = transaction_bundle()
        if getattr(app.state.services.store, "transactions", True) is False:
            refused = await client.post("/fhir", json=bundle, headers=headers)
            assert refused.status_code == 501, refused.text  # never half-applied
            ids = await _put_each(client, headers, bundle)
        else:
            response = await client.post("/fhir", json=bundle, headers=headers)
            assert response.status_code == 200, response.text
            ids = server_ids(response.json())
        yield Clinical(client, headers, ids, app, adapter)


async def _put_each(client: httpx.AsyncClient, headers: dict[str, str],
                    bundle: dict[str, Any]) -> dict[str, str]:
    """The transaction's records as a batch of PUTs (one unit of work each), their
    ``urn:uuid`` references rewritten to the ids picked for them."""
    picked = {e["fullUrl"]: f"{e['resource']['resourceType']}/"
              f"{e['fullUrl'].rsplit(':', 1)[-1]}" for e in bundle["entry"]}
    text = orjson.dumps(bundle).decode()
    for full_url, reference in picked.items():
        text = text.replace(f'"{full_url}"', f'"{reference}"')
    batch = orjson.loads(text)
    batch["type"] = "batch"
    for entry in batch["entry"]:
        resource = entry["resource"]
        resource["id"] = entry["fullUrl"].rsplit("/", 1)[-1]
        entry["request"] = {"method": "PUT",
                            "url": f"{resource['resourceType']}/{resource['id']}"}
    response = await client.post("/fhir", json=batch, headers=headers)
    assert response.status_code == 200, response.text
    statuses = [e["response"]["status"] for e in response.json()["entry"]]
    assert all(s.startswith("201") for s in statuses), statuses
    return {name: picked[_uuid(name)].split("/")[-1] for name, _resource in RECORDS}


@pytest_asyncio.fixture(scope="module", loop_scope="module", params=ADAPTERS)
async def clinical(request: pytest.FixtureRequest, tmp_path_factory: Any
                   ) -> AsyncIterator[Clinical]:
    async with clinical_record_set(request.param,
                                   tmp_path_factory.mktemp(request.param)) as loaded:
        yield loaded
