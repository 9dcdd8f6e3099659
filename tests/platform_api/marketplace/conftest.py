"""Fixtures of the marketplace tests: the supplier systems' stand-in served locally, the
app configured to read it, a clinic (Kibera, the buyer, with a pharmacist) and a district
store (Mathare North, the seller) with facilities placed on the map, and a synced
catalogue."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from platform_api.policy.roles import ORG_PHARMACIST
from platform_api.settings import Settings
from tests.conftest import add_member, make_settings, register_and_login
from tests.platform_api.clinic import Clinic
from tests.platform_api.clinic import clinic as clinic
from tests.platform_api.marketplace.standin import TOKEN, SupplierSystems
from tests.platform_api.payments.stand_ins import serving

FHIR_JSON = {"Content-Type": "application/fhir+json"}


@pytest.fixture
async def suppliers() -> AsyncIterator[SupplierSystems]:
    systems = SupplierSystems()
    async with serving(systems) as url:  # type: ignore[arg-type]
        systems.url = url
        yield systems


@pytest.fixture
def settings(tmp_path: Path, suppliers: SupplierSystems) -> Settings:
    return make_settings(tmp_path, marketplace_feeds={
        "medsupply": {"url": f"{suppliers.url}/feeds/catalogue.csv", "format": "csv",
                      "token": TOKEN},
        "medsupply-json": {"url": f"{suppliers.url}/feeds/catalogue.json"},
    }, marketplace_stock_system_url=suppliers.url)


async def make_facility(world: Clinic, who: str, org_id: str, name: str, code: str,
                        latitude: float, longitude: float) -> str:
    response = await world.client.post("/fhir/Location", headers={**world.h(who), **FHIR_JSON},
                                       json={"resourceType": "Location", "status": "active",
                                             "name": name,
                                             "identifier": [{"value": code}],
                                             "managingOrganization": {
                                                 "reference": f"Organization/{org_id}"},
                                             "position": {"latitude": latitude,
                                                          "longitude": longitude}})
    assert response.status_code == 201, response.text
    return str(response.json()["id"])


@pytest.fixture
async def market(clinic: Clinic, suppliers: SupplierSystems) -> Any:
    """The clinic with a pharmacist, a pharmacist at the seller, two facilities each side
    of Nairobi, and the catalogue synced from the CSV feed."""
    clinic.people["pharmacist"] = await register_and_login(clinic.client, first_name="Fatuma",
                                                           last_name="Hassan")
    await add_member(clinic.app, clinic.org_id, clinic.people["pharmacist"], ORG_PHARMACIST)
    clinic.people["seller_pharmacist"] = await register_and_login(
        clinic.client, first_name="Juma", last_name="Mwangi")
    await add_member(clinic.app, clinic.other_org_id, clinic.people["seller_pharmacist"],
                     ORG_PHARMACIST)
    clinic.facilities = {  # type: ignore[attr-defined]
        "kibera": await make_facility(clinic, "admin", clinic.org_id, "Kibera clinic store",
                                      "KCC-STORE", -1.3133, 36.7876),
        "mathare": await make_facility(clinic, "other_admin", clinic.other_org_id,
                                       "Mathare North store", "MNHC-STORE", -1.2566, 36.8616),
    }
    synced = await clinic.post("platform_admin", "/api/marketplace/catalog/sync",
                               {"feed": "medsupply"})
    assert synced.status_code == 200, synced.text
    listed = await clinic.get("admin", "/api/marketplace/products", limit=100)
    clinic.products = {p["sku"]: p for p in listed.json()["data"]}  # type: ignore[attr-defined]
    return clinic


async def receive(world: Any, who: str, facility: str, sku: str, quantity: int, lot: str,
                  expiry: str, reorder_level: int | None = None) -> Any:
    body = {"facility_id": world.facilities[facility], "product_id": world.products[sku]["id"],
            "reason": "received", "quantity": quantity, "lot_number": lot,
            "expiry_date": expiry}
    if reorder_level is not None:
        body["reorder_level"] = reorder_level
    response = await world.post(who, "/api/marketplace/inventory/adjust", body)
    assert response.status_code == 200, response.text
    return response.json()["data"]
