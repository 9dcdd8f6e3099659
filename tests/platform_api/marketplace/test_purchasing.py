"""Suppliers, purchase orders with approval by the buyer's administrator, reorder triggers
from reorder levels and consumption, and the area's operations as a whole."""

from __future__ import annotations

from typing import Any

from tests.platform_api.area_operations import (
    assert_credentials_needed,
    assert_served_and_documented,
)
from tests.platform_api.clinic import refusal

ADJUST = "/api/marketplace/inventory/adjust"


async def supplier(market: Any) -> str:
    created = await market.post("admin", "/api/marketplace/suppliers", {
        "organization_id": market.org_id, "name": "Kenya Medical Supplies Authority",
        "email": "orders@kemsa.example.org", "country": "ke", "lead_time_days": 7})
    assert created.status_code == 201, created.text
    return str(created.json()["data"]["id"])


async def test_suppliers_are_organizations_kept_by_the_buyer(market):
    supplier_id = await supplier(market)
    listed = await market.get("pharmacist", "/api/marketplace/suppliers")
    [found] = listed.json()["data"]
    assert (found["id"], found["country"], found["lead_time_days"]) == (supplier_id, "KE", 7)
    # Organizations are a directory: another clinic sees the supplier, filters by buyer
    seen = await market.get("other_admin", "/api/marketplace/suppliers",
                            organization_id=market.other_org_id)
    assert seen.json()["data"] == []
    refused = await market.post("pharmacist", "/api/marketplace/suppliers", {
        "organization_id": market.org_id, "name": "Someone"})
    assert refused.status_code == 403
    bad = await market.post("admin", "/api/marketplace/suppliers", {
        "organization_id": market.org_id, "name": "X", "email": "not-an-address"})
    assert bad.status_code == 422 and bad.json()["error"]["field"] == "email"


async def test_a_purchase_order_is_raised_by_a_member_and_approved_by_the_admin(market):
    supplier_id = await supplier(market)
    body = {"organization_id": market.org_id, "supplier_id": supplier_id,
            "facility_id": market.facilities["kibera"],
            "product_id": market.products["AMX-500-100"]["id"], "quantity": 4}
    raised = await market.post("pharmacist", "/api/marketplace/purchase-orders", body)
    assert raised.status_code == 201, raised.text
    order = raised.json()["data"]
    assert order["status"] == "draft"
    assert order["line_total"] == {"value": "50.00", "currency": "KES"}  # 4 x 12.50
    url = f"/api/marketplace/purchase-orders/{order['id']}/approve"
    assert (await market.post("pharmacist", url, {})).status_code == 403
    approved = await market.post("admin", url, {})
    assert approved.status_code == 200, approved.text
    assert approved.json()["data"]["status"] == "active"
    assert approved.json()["data"]["approved_by"] == market.user_id("admin")
    again = await market.post("admin", url, {})
    assert refusal(again)[0] == 409
    other = await market.post("other_admin", "/api/marketplace/purchase-orders", body)
    assert other.status_code == 403
    theirs = await market.post("other_admin", "/api/marketplace/purchase-orders", {
        **body, "organization_id": market.other_org_id,
        "facility_id": market.facilities["mathare"]})
    assert refusal(theirs) == (422, "UNKNOWN_SUPPLIER")  # not one of theirs
    elsewhere = await market.post("pharmacist", "/api/marketplace/purchase-orders",
                                  {**body, "facility_id": market.facilities["mathare"]})
    assert refusal(elsewhere) == (422, "NOT_YOUR_FACILITY")
    listed = await market.get("admin", "/api/marketplace/purchase-orders", status="active")
    assert [o["id"] for o in listed.json()["data"]] == [order["id"]]


async def test_reorder_trigger_orders_from_the_level_and_consumption(market):
    supplier_id = await supplier(market)
    product = market.products["ORS-20"]["id"]
    stock = {"facility_id": market.facilities["kibera"], "product_id": product}
    received = await market.post("pharmacist", ADJUST, {
        **stock, "reason": "received", "quantity": 100, "lot_number": "R1",
        "expiry_date": "2031-06-30", "reorder_level": 40})
    assert received.status_code == 200, received.text
    for _ in range(3):  # 90 dispensed over the window: 3 a day
        await market.post("pharmacist", ADJUST, {**stock, "reason": "dispensed",
                                                 "quantity": 30})
    trigger = {"facility_id": market.facilities["kibera"], "supplier_id": supplier_id,
               "cover_days": 30, "window_days": 30}
    triggered = await market.post("pharmacist", "/api/marketplace/reorder-trigger", trigger)
    assert triggered.status_code == 201, triggered.text
    [order] = triggered.json()["data"]["raised"]
    # 10 on hand, level 40: 3 a day for 30 days + 40 - 10 = 120
    assert (order["product_id"], order["quantity"], order["status"]) == (product, 120, "draft")
    again = (await market.post("pharmacist", "/api/marketplace/reorder-trigger",
                               trigger)).json()["data"]
    assert again["raised"] == [] and again["skipped"] == [product]  # an order is open
    assert (await market.post("nurse", "/api/marketplace/reorder-trigger",
                              trigger)).status_code == 403


async def test_every_operation_of_the_area_is_served_and_documented(client):
    await assert_served_and_documented(client, "Marketplace", 20)


async def test_every_route_of_the_area_needs_credentials(client):
    assert await assert_credentials_needed(client, "Marketplace") == []
