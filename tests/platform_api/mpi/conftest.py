"""The clinic the MPI tests work in (tests/platform_api/clinic.py), and patients to match."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from platform_api.settings import Settings
from tests.conftest import make_settings
from tests.platform_api.clinic import Clinic, clinic  # noqa: F401  (the fixture)

JSON = dict[str, Any]


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return make_settings(tmp_path, mpi_auto_link=True)


async def register(world: Clinic, org: str = "admin", **fields: Any) -> str:
    """A patient registered by a clinic (``admin``: Kibera, ``other_admin``: Mathare)."""
    org_id = world.org_id if org == "admin" else world.other_org_id
    response = await world.client.post(f"/api/organizations/{org_id}/patients",
                                       headers=world.h(org), json=fields)
    assert response.status_code == 201, response.text
    return str(response.json()["data"]["id"])


async def fhir_patient(world: Clinic, resource: JSON) -> str:
    response = await world.client.post("/fhir/Patient", headers=world.h("platform_admin"),
                                       json={"resourceType": "Patient", **resource})
    assert response.status_code == 201, response.text
    return str(response.json()["id"])


def data(response: httpx.Response, status: int = 200) -> Any:
    assert response.status_code == status, response.text
    return response.json()["data"]
