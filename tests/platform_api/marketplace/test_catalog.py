"""The product catalogue and its sync from supplier feeds (CSV and JSON over HTTP)."""

from __future__ import annotations

from tests.platform_api.clinic import refusal


async def test_sync_creates_products_from_the_csv_feed_with_decimal_prices(market):
    products = market.products
    assert set(products) == {"AMX-500-100", "ORS-20", "GLV-M-100"}
    amoxicillin = products["AMX-500-100"]
    assert amoxicillin["resource_type"] == "Medication"
    assert amoxicillin["gtin"] == "06151100012345"
    assert amoxicillin["unit_price"] == {"value": "12.50", "currency": "KES"}
    assert products["ORS-20"]["unit_price"] == {"value": "0.35", "currency": "KES"}
    assert products["GLV-M-100"]["resource_type"] == "Device"
    assert products["GLV-M-100"]["kind"] == "consumable"
    fhir = await market.client.get(f"/fhir/Medication/{amoxicillin['id']}",
                                   headers=market.h("platform_admin"))
    assert fhir.json()["code"]["text"] == "Amoxicillin 500 mg capsules"


async def test_a_second_sync_updates_changed_rows_and_reports_bad_ones(market, suppliers):
    suppliers.catalogue[0]["price"] = "13.10"
    suppliers.catalogue.append({"sku": "BAD-1", "name": "Syringe 5 ml", "kind": "device",
                                "price": "abc", "currency": "KES"})
    response = await market.post("platform_admin", "/api/marketplace/catalog/sync",
                                 {"feed": "medsupply"})
    result = response.json()["data"]
    assert (result["created"], result["updated"], result["unchanged"]) == (0, 1, 2)
    assert result["rejected"] == [{"line": 5, "field": "price",
                                   "message": "price: not a decimal amount"}]
    listed = await market.get("nurse", "/api/marketplace/products", gtin="06151100012345")
    assert [p["unit_price"]["value"] for p in listed.json()["data"]] == ["13.10"]


async def test_products_filter_by_kind_and_are_paginated(market):
    response = await market.get("receptionist", "/api/marketplace/products", kind="medicine",
                                limit=1)
    body = response.json()
    assert body["meta"]["total"] == 2 and len(body["data"]) == 1


async def test_sync_is_for_platform_administrators_and_names_unknown_feeds(market):
    assert refusal(await market.post("admin", "/api/marketplace/catalog/sync",
                                     {"feed": "medsupply"})) == (403, "FORBIDDEN")
    response = await market.post("platform_admin", "/api/marketplace/catalog/sync",
                                 {"feed": "nowhere"})
    assert refusal(response) == (422, "UNKNOWN_FEED")
    assert response.json()["error"]["field"] == "feed"


async def test_the_json_feed_is_read_too(market):
    response = await market.post("platform_admin", "/api/marketplace/catalog/sync",
                                 {"feed": "medsupply-json"})
    assert response.json()["data"]["created"] == 3  # its own SKU system: new products
