"""Fixtures of the FHIR tests: a module-wide app holding the clinical record set.

Loading the records once per test module (one transaction over HTTP) keeps the
table-driven search tests fast; tests that write use the per-test ``client`` fixture of
``tests/conftest.py`` instead.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest_asyncio
from asgi_lifespan import LifespanManager

from platform_api.app import create_app
from tests.conftest import make_clinic_admin, make_settings
from tests.fhir_server.clinical_data import server_ids, transaction_bundle

FHIR = {"Content-Type": "application/fhir+json"}


@dataclass
class Clinical:
    client: httpx.AsyncClient
    headers: dict[str, str]
    ids: dict[str, str]  # short name (clinical_data.RECORDS) → server id
    app: Any

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


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def clinical(tmp_path_factory: Any) -> AsyncIterator[Clinical]:
    application = create_app(make_settings(tmp_path_factory.mktemp("clinical")))
    async with LifespanManager(application):
        transport = httpx.ASGITransport(app=application, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as c:
            user = await make_clinic_admin(c)
            headers = {**user["headers"], **FHIR}
            response = await c.post("/fhir", json=transaction_bundle(), headers=headers)
            assert response.status_code == 200, response.text
            yield Clinical(c, headers, server_ids(response.json()), application)
