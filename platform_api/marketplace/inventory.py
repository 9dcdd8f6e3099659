"""Inventory per facility (stock records, :mod:`.stock`): the lists, adjustments with a
reason, the low-stock list, the sync from the external stock system and emergency
routing.

- ``GET /api/marketplace/inventory`` (``facility_id``, ``product_id``) and
  ``GET …/inventory/low-stock`` (on hand below the reorder level): FHIR searches over the
  stock records the caller's organizations own.
- ``POST …/inventory/adjust``: ``reason`` received (adds to ``lot_number``, a new lot
  needs ``expiry_date``) | dispensed | expired | damaged (removes ``quantity``, from the
  lot named or first expiring first; 409 ``INSUFFICIENT_STOCK`` when there is not so
  much) | count-correction (the lot holds ``quantity`` units, as counted);
  ``reorder_level`` sets the item's level. Written as the caller: the policy lets the
  facility's ORG:ADMIN and ORG:PHARMACIST update stock (supply category), others 403.
  Events ``platform.marketplace.stock_adjusted``, and ``platform.marketplace.stock_low``
  when on hand falls below the reorder level.
- ``POST …/inventory/sync``: the facility's counts from the external stock system
  (``HEALTHPLATFORM_MARKETPLACE_STOCK_SYSTEM_URL``; products matched by GTIN) are the
  facility's whole stock: reported lots get their counts, lots and products it no longer
  reports go to zero (a product named by a rejected row, or with no GTIN to be named by,
  is left alone); each changed record is one count-correction with its
  ``platform.marketplace.stock_adjusted`` event.
- ``POST …/emergency-routing``: the facilities holding at least ``quantity`` unexpired
  units of a product, nearest first (great-circle distance from the Location's
  position), then the largest stock. It compares every facility's stock, so it reads as
  the platform and answers only the facility, its distance and the usable quantity.
"""

from __future__ import annotations

import math
from datetime import date
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends
from pydantic import BaseModel, Field

from fhir_server.store import ConditionChanged, VersionConflict
from platform_api.envelope import ApiError, Envelope, ok
from platform_api.facade import ApiContext, Facade, SearchParam, api_context, staged_body
from platform_api.marketplace.catalog import load_product
from platform_api.marketplace.common import (
    FACILITY_TAG,
    GTIN_SYSTEM,
    LEVEL_TAG,
    PRODUCT_TAG,
    TOPIC,
    facility,
)
from platform_api.marketplace.feeds import fetch_stock
from platform_api.marketplace.stock import (
    STOCK_CRITERIA,
    STOCK_SYSTEM,
    Stock,
    new_record,
    stock_key,
    stock_of,
    stock_view,
    with_stock,
)

JSON = dict[str, Any]
Reason = Literal["received", "dispensed", "expired", "damaged", "count-correction"]
ATTEMPTS = 20  # a busy record is read again and the change re-applied, this many times


class LotView(BaseModel):
    lot_number: str
    expiry_date: str
    quantity: int


class ChangeView(BaseModel):
    reason: str | None = None
    delta: int | None = None
    lot: str | None = None
    by: str | None = None
    order_id: str | None = None


class StockView(BaseModel):
    id: str
    facility_id: str | None = None
    product_id: str
    product_type: str
    on_hand: int
    usable: int = Field(description="Units in lots not yet expired")
    reorder_level: int | None = None
    low: bool
    lots: list[LotView]
    last_change: ChangeView | None = None
    updated_at: str | None = None


class StockQuery(BaseModel):
    facility_id: Annotated[str | None, SearchParam("_tag", FACILITY_TAG + "|{}")] = Field(
        None, max_length=64)


inventory = Facade(
    resource="SupplyDelivery", name="Stock item", create=StockView, view=StockView,
    query=StockQuery, to_fhir=lambda p, c, e: {}, from_fhir=stock_view,
    fixed=(STOCK_CRITERIA,), sort="_id", tags=["marketplace"],
    summaries={"list": "Stock per facility and product (lots, expiry, reorder level)"},
)
low_stock = Facade(
    resource="SupplyDelivery", name="Stock item", create=StockView, view=StockView,
    query=StockQuery, to_fhir=lambda p, c, e: {}, from_fhir=stock_view,
    fixed=(STOCK_CRITERIA, ("_tag", f"{LEVEL_TAG}|low")), sort="_id", tags=["marketplace"],
    summaries={"list": "Stock items whose quantity on hand is below their reorder level"},
)
router = APIRouter(tags=["marketplace"])
# low-stock first: /inventory/{resource_id} is not served, but keep the literal path ahead
low_stock.mount(router, "/api/marketplace/inventory/low-stock", ops=("list",))
inventory.mount(router, "/api/marketplace/inventory", ops=("list",))


# -- adjust ------------------------------------------------------------------------------------
class StockAdjust(BaseModel):
    facility_id: str = Field(min_length=1, max_length=64)
    product_id: str = Field(min_length=1, max_length=64)
    reason: Reason
    quantity: int = Field(ge=0, le=10_000_000, description="Units received, removed, or "
                          "(count-correction) counted in the lot")
    lot_number: str | None = Field(None, min_length=1, max_length=64)
    expiry_date: date | None = None
    reorder_level: int | None = Field(None, ge=0, le=10_000_000)
    note: str | None = Field(None, max_length=500)


def apply_adjustment(stock: Stock, body: StockAdjust) -> tuple[int, str | None]:
    """Change ``stock`` as ``body`` says; the change in units and the lot it touched."""
    before = stock.on_hand
    expiry = body.expiry_date.isoformat() if body.expiry_date else None
    if body.reason in ("received", "count-correction") and not body.lot_number:
        raise ApiError(422, "VALIDATION_ERROR", f"lot_number: needed when {body.reason}",
                       field="lot_number")
    if body.reason == "received":
        assert body.lot_number is not None
        stock.put(body.lot_number, body.quantity, expiry)
    elif body.reason == "count-correction":
        assert body.lot_number is not None
        lot = stock.lot(body.lot_number)
        if lot is None:
            stock.put(body.lot_number, body.quantity, expiry)
        else:
            lot.quantity = body.quantity
            lot.expiry = expiry or lot.expiry
    else:
        if body.lot_number and stock.lot(body.lot_number) is None:
            raise ApiError(404, "NOT_FOUND", "No such lot of this product at this facility",
                           field="lot_number")
        stock.take(body.quantity, body.lot_number, usable_only=body.reason == "dispensed")
    if body.reorder_level is not None:
        stock.reorder_level = body.reorder_level
    return stock.on_hand - before, body.lot_number


async def find_stock(fhir: Any, facility_id: str, product_ref: str) -> JSON | None:
    found = await fhir.search("SupplyDelivery", [
        ("identifier", f"{STOCK_SYSTEM}|{stock_key(facility_id, product_ref)}")])
    return found[0] if found else None


def low_event(record: JSON) -> JSON:
    view = stock_view(record)
    return {k: view[k] for k in ("id", "facility_id", "product_id", "on_hand",
                                 "reorder_level")}


async def write_stock(ctx: ApiContext, unit: Any, current: JSON | None, changed: JSON) -> Any:
    """Stage ``changed`` (a create when there is no ``current``: conditional on the
    record's identifier, so two first receipts cannot make two records), with the events
    it brings."""
    if current is None:
        staged = await unit.create(changed, expected_type="SupplyDelivery", if_none_exist=[
            ("identifier", f"{STOCK_SYSTEM}|{changed['identifier'][0]['value']}")])
    else:
        staged = await unit.update(changed, if_match=int(current["meta"]["versionId"]))
    was_low = current is not None and stock_of(current).low
    if stock_of(changed).low and not was_low:
        unit.emit(TOPIC + "stock_low", low_event({**changed, "id": staged.id}),
                  source_service="marketplace")
    return staged


@router.post("/api/marketplace/inventory/adjust", response_model=Envelope[StockView],
             summary="Adjust a facility's stock with a reason (every change is recorded)")
async def adjust_stock(body: StockAdjust, ctx: ApiContext = Depends(api_context)) -> Any:
    place = await facility(ctx, body.facility_id)
    product = await load_product(ctx, body.product_id)
    product_ref = f"{product['resourceType']}/{product['id']}"
    for _attempt in range(ATTEMPTS):
        current = await find_stock(ctx.fhir, place["id"], product_ref)
        stock = stock_of(current) if current else Stock()
        delta, lot = apply_adjustment(stock, body)
        changed = with_stock(current or new_record(place, product), stock, {
            "reason": body.reason, "delta": delta, "lot": lot, "by": ctx.principal.user_id})
        unit = ctx.fhir.unit()
        try:
            async with unit:
                staged = await write_stock(ctx, unit, current, changed)
                unit.emit(TOPIC + "stock_adjusted", {
                    **low_event({**changed, "id": staged.id}), "reason": body.reason,
                    "delta": delta}, source_service="marketplace")
                await unit.commit()
        except (VersionConflict, ConditionChanged):
            continue
        if staged.existing:  # another first receipt created the record: apply to it
            continue
        return ok(stock_view(staged_body(staged)))
    raise ApiError(409, "STOCK_BUSY", "The stock record kept changing; try again")


# -- sync from the stock system ----------------------------------------------------------------
class StockSync(BaseModel):
    facility_id: str = Field(min_length=1, max_length=64)


class SyncRejected(BaseModel):
    index: int
    field: str
    message: str


class StockSyncView(BaseModel):
    facility_id: str
    updated: int
    unchanged: int
    rejected: list[SyncRejected]


def _facility_code(place: JSON) -> str:
    """The facility's code in the stock system: its first identifier, else its id."""
    return str(next((i.get("value") for i in place.get("identifier") or [] if i.get("value")),
                    place["id"]))


@router.post("/api/marketplace/inventory/sync", response_model=Envelope[StockSyncView],
             summary="Replace a facility's counts with the external stock system's")
async def sync_stock(body: StockSync, ctx: ApiContext = Depends(api_context)) -> Any:
    place = await facility(ctx, body.facility_id)
    items = await fetch_stock(ctx.services.settings, _facility_code(place))
    rejected: list[SyncRejected] = []
    counted: dict[str, tuple[JSON, list[tuple[str, str, int]]]] = {}
    for index, item in enumerate(items):
        gtin, lot, expiry, quantity = (item.get("gtin"), item.get("lot"), item.get("expiry"),
                                       item.get("quantity"))
        if not isinstance(quantity, int) or quantity < 0:
            rejected.append(SyncRejected(index=index, field="quantity", message="not a count"))
            continue
        if not lot or not isinstance(expiry, str):
            rejected.append(SyncRejected(index=index, field="lot", message="lot and expiry "
                                         "are needed"))
            continue
        products = [p for kind in ("Medication", "Device") for p in await ctx.fhir.search(
            kind, [("identifier", f"{GTIN_SYSTEM}|{gtin}")])]
        if not products:
            rejected.append(SyncRejected(index=index, field="gtin", message="no product in "
                                         "the catalogue has this GTIN"))
            continue
        product = products[0]
        entry = counted.setdefault(f"{product['resourceType']}/{product['id']}", (product, []))
        entry[1].append((str(lot), expiry[:10], quantity))
    updated = unchanged = 0
    held = await _unreported_stock(ctx, place["id"], counted, rejected, items)
    unit = ctx.fhir.unit()
    async with unit:
        for product_ref, (product, lots) in [*counted.items(), *held.items()]:
            current = await find_stock(ctx.fhir, place["id"], product_ref)
            stock = stock_of(current) if current else Stock()
            before = [(lot.lot, lot.expiry, lot.quantity) for lot in stock.lots]
            reported = {lot_number for lot_number, _e, _q in lots}
            for lot in stock.lots:  # the stock system's list is the whole stock
                if lot.lot not in reported:
                    lot.quantity = 0
            for lot_number, expiry, quantity in lots:
                existing = stock.lot(lot_number)
                if existing is None:
                    stock.put(lot_number, quantity, expiry)
                else:
                    existing.quantity, existing.expiry = quantity, expiry
            if [(lot.lot, lot.expiry, lot.quantity) for lot in stock.lots] == before:
                unchanged += 1
                continue
            delta = stock.on_hand - sum(q for _l, _e, q in before)
            changed = with_stock(current or new_record(place, product), stock, {
                "reason": "count-correction", "delta": delta, "by": "stock-system"})
            staged = await write_stock(ctx, unit, current, changed)
            unit.emit(TOPIC + "stock_adjusted", {
                **low_event({**changed, "id": staged.id}), "reason": "count-correction",
                "delta": delta}, source_service="marketplace")
            updated += 1
        await unit.commit()
    return ok(StockSyncView(facility_id=place["id"], updated=updated, unchanged=unchanged,
                            rejected=rejected).model_dump())


async def _unreported_stock(ctx: ApiContext, facility_id: str,
                            counted: dict[str, tuple[JSON, list[tuple[str, str, int]]]],
                            rejected: list[SyncRejected], items: list[JSON]
                            ) -> dict[str, tuple[JSON, list[tuple[str, str, int]]]]:
    """The facility's stock records of products the stock system no longer reports (each
    with no lot: all go to zero). A product named by a rejected row is left as it is: the
    row may have been its count."""
    unsure = {str(items[r.index].get("gtin")) for r in rejected
              if isinstance(items[r.index], dict)}
    records = await ctx.fhir.search("SupplyDelivery", [
        STOCK_CRITERIA, ("_tag", f"{FACILITY_TAG}|{facility_id}")])
    held: dict[str, tuple[JSON, list[tuple[str, str, int]]]] = {}
    for record in records:
        product_ref = str(((record.get("suppliedItem") or {}).get("itemReference") or {}
                           ).get("reference") or "")
        if not product_ref or product_ref in counted or not stock_of(record).on_hand:
            continue
        kind, _, product_id = product_ref.partition("/")
        product = await ctx.fhir.find_json(kind, product_id) if kind in (
            "Medication", "Device") else None
        gtins = {str(i.get("value")) for i in (product or {}).get("identifier") or []
                 if i.get("system") == GTIN_SYSTEM}
        if product is not None and gtins and not gtins & unsure:
            held[product_ref] = (product, [])
    return held


# -- emergency routing ---------------------------------------------------------------------------
class EmergencyRouting(BaseModel):
    product_id: str = Field(min_length=1, max_length=64)
    quantity: int = Field(ge=1, le=10_000_000)
    latitude: float = Field(ge=-90, le=90)
    longitude: float = Field(ge=-180, le=180)
    limit: int = Field(10, ge=1, le=50)


class RouteView(BaseModel):
    facility_id: str
    name: str | None = None
    organization_id: str | None = None
    distance_km: float
    usable: int


EARTH_RADIUS_KM = 6371.0088  # the IUGG mean radius


def great_circle_km(lat1: float, lon1: float, lat2: float, lon2: float) -> float:
    """Haversine distance."""
    p1, p2 = math.radians(lat1), math.radians(lat2)
    dp, dl = p2 - p1, math.radians(lon2 - lon1)
    a = math.sin(dp / 2) ** 2 + math.cos(p1) * math.cos(p2) * math.sin(dl / 2) ** 2
    return 2 * EARTH_RADIUS_KM * math.asin(math.sqrt(min(1.0, a)))


@router.post("/api/marketplace/emergency-routing", response_model=Envelope[list[RouteView]],
             summary="The nearest facilities holding enough unexpired stock of a product")
async def emergency_routing(body: EmergencyRouting, ctx: ApiContext = Depends(api_context)
                            ) -> Any:
    product = await load_product(ctx, body.product_id)
    # Every facility's stock is compared, whoever asks (the answer names only the
    # facility, its distance and the usable quantity): read with the platform's rights.
    system = ctx.elevate("emergency-routing: read every facility's stock of the product")
    records = await system.search("SupplyDelivery", [
        STOCK_CRITERIA, ("_tag", f"{PRODUCT_TAG}|{product['resourceType']}/{product['id']}")])
    routes: list[RouteView] = []
    today = date.today().isoformat()
    for record in records:
        usable = stock_of(record).usable(today)
        facility_id = stock_view(record)["facility_id"]
        if usable < body.quantity or not facility_id:
            continue
        place = await system.find_json("Location", facility_id)
        position = (place or {}).get("position") or {}
        if place is None or "latitude" not in position or "longitude" not in position:
            continue  # a facility without coordinates cannot be ranked by distance
        distance = great_circle_km(body.latitude, body.longitude, float(position["latitude"]),
                                   float(position["longitude"]))
        routes.append(RouteView(
            facility_id=facility_id, name=place.get("name"), usable=usable,
            organization_id=(place.get("managingOrganization") or {}).get(
                "reference", "/").split("/", 1)[1] or None,
            distance_km=round(distance, 3)))
    routes.sort(key=lambda r: (r.distance_km, -r.usable))
    return ok([r.model_dump() for r in routes[:body.limit]])
