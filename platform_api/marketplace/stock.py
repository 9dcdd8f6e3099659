"""A facility's stock of one product: FHIR **SupplyDelivery** (R4 has no inventory
resource; InventoryItem is R5). One record per (facility, product): "this much of that
product has been supplied to this facility's store and is on hand", which makes every
reservation of that product at that facility one conditional update of one resource
(the store serializes writes per resource: two checkouts racing for the last units
cannot both succeed).

Mapping (/api field → SupplyDelivery element):

    facility_id   → destination (Location/<id>, a facility with position and
                    managingOrganization); meta.tag …:facility|<id>; owned (meta.security)
                    by the facility's organization
    product_id    → suppliedItem.itemReference (Medication|Device); meta.tag …:product|<ref>
    on_hand       → suppliedItem.quantity.value (the sum of the lots)
    lots[]        → extension …:lot (complex: lot, expiry, quantity), first expiring first
    reorder_level → extension …:reorder-level (valueInteger)
    low           → meta.tag …:stock-level|low when on_hand < reorder_level, else ok (so the
                    low-stock list is one search)
    last change   → extension …:change (reason, delta, lot, by, order); the record's FHIR
                    history holds every change, each version naming why it was made
    (always)      → identifier …:stock|<facility>:<product ref> (one record per pair),
                    status completed, occurrenceDateTime the last change
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import date
from typing import Any

from fhir_server.clock import now_instant
from fhir_server.ownership import with_owners
from platform_api.envelope import ApiError
from platform_api.marketplace.common import (
    BASE,
    FACILITY_TAG,
    LEVEL_TAG,
    PRODUCT_TAG,
    ROLE_TAG,
    extension,
    local_id,
    tag,
    with_extension,
    with_tags,
)

JSON = dict[str, Any]
STOCK_SYSTEM = f"{BASE}:stock"
LOT = f"{BASE}:lot"
REORDER_LEVEL = f"{BASE}:reorder-level"
CHANGE = f"{BASE}:change"
OUTFLOWS = ("dispensed", "expired", "damaged", "reserved")


@dataclass
class Lot:
    lot: str
    expiry: str  # YYYY-MM-DD
    quantity: int

    def usable(self, today: str) -> bool:
        return self.expiry > today and self.quantity > 0


@dataclass
class Stock:
    """The figures of one stock record."""

    lots: list[Lot] = field(default_factory=list)
    reorder_level: int | None = None

    @property
    def on_hand(self) -> int:
        return sum(lot.quantity for lot in self.lots)

    def usable(self, today: str | None = None) -> int:
        day = today or date.today().isoformat()
        return sum(lot.quantity for lot in self.lots if lot.usable(day))

    @property
    def low(self) -> bool:
        return self.reorder_level is not None and self.on_hand < self.reorder_level

    def lot(self, number: str) -> Lot | None:
        return next((lot for lot in self.lots if lot.lot == number), None)

    def take(self, quantity: int, lot_number: str | None = None, *, usable_only: bool = True
             ) -> list[tuple[str, int, str]]:
        """Remove ``quantity`` units, from ``lot_number`` or first expiring first (unexpired
        lots only when ``usable_only``); what was taken per lot. 409 INSUFFICIENT_STOCK
        (nothing taken) when there is not enough."""
        today = date.today().isoformat()
        if lot_number is not None:
            lots = [lot for lot in self.lots if lot.lot == lot_number]
        else:
            lots = sorted((lot for lot in self.lots
                           if not usable_only or lot.usable(today)), key=lambda lot: lot.expiry)
        if sum(lot.quantity for lot in lots) < quantity:
            available = sum(lot.quantity for lot in lots)
            raise ApiError(409, "INSUFFICIENT_STOCK", f"Only {available} unit(s) available, "
                           f"{quantity} asked")
        taken: list[tuple[str, int, str]] = []
        left = quantity
        for lot in lots:
            if left == 0:
                break
            part = min(left, lot.quantity)
            if part:
                lot.quantity -= part
                taken.append((lot.lot, part, lot.expiry))
                left -= part
        return taken

    def put(self, lot_number: str, quantity: int, expiry: str | None) -> None:
        existing = self.lot(lot_number)
        if existing is not None:
            existing.quantity += quantity
            if expiry:
                existing.expiry = expiry
        else:
            if not expiry:
                raise ApiError(422, "VALIDATION_ERROR", "expiry_date: a new lot needs its "
                               "expiry date", field="expiry_date")
            self.lots.append(Lot(lot_number, expiry, quantity))


def _sub(ext: JSON, url: str) -> Any:
    for sub in ext.get("extension") or []:
        if sub.get("url") == url:
            return next((v for k, v in sub.items() if k.startswith("value")), None)
    return None


def stock_of(record: JSON) -> Stock:
    lots = [Lot(str(_sub(e, "lot")), str(_sub(e, "expiry")), int(_sub(e, "quantity") or 0))
            for e in record.get("extension") or [] if e.get("url") == LOT]
    level = (extension(record, REORDER_LEVEL) or {}).get("valueInteger")
    return Stock(lots, level)


def stock_key(facility_id: str, product_ref: str) -> str:
    return f"{facility_id}:{product_ref}"


def new_record(facility: JSON, product: JSON) -> JSON:
    product_ref = f"{product['resourceType']}/{product['id']}"
    record: JSON = {
        "resourceType": "SupplyDelivery", "status": "completed",
        "identifier": [{"system": STOCK_SYSTEM, "value": stock_key(facility["id"], product_ref)}],
        "suppliedItem": {"quantity": {"value": 0}, "itemReference": {"reference": product_ref}},
        "destination": {"reference": f"Location/{facility['id']}"},
    }
    org = local_id(facility.get("managingOrganization"), "Organization")
    return with_owners(with_tags(record, role="stock", facility=facility["id"],
                                 product=product_ref), {str(org)})


def with_stock(record: JSON, stock: Stock, change: JSON) -> JSON:
    """``record`` holding ``stock``'s figures, its level tag and ``change`` (reason, delta,
    lot, by, order) as the reason of this version."""
    kept = [e for e in record.get("extension") or [] if e.get("url") not in (LOT, CHANGE)]
    lots = sorted((lot for lot in stock.lots if lot.quantity > 0), key=lambda lot: lot.expiry)
    kept += [{"url": LOT, "extension": [
        {"url": "lot", "valueString": lot.lot}, {"url": "expiry", "valueDate": lot.expiry},
        {"url": "quantity", "valueInteger": lot.quantity}]} for lot in lots]
    kept.append({"url": CHANGE, "extension": [
        {"url": key, **value} for key, value in (
            ("reason", {"valueCode": change["reason"]}),
            ("delta", {"valueInteger": int(change["delta"])}),
            ("lot", {"valueString": change["lot"]} if change.get("lot") else None),
            ("by", {"valueString": change["by"]} if change.get("by") else None),
            ("order", {"valueReference": {"reference": change["order"]}}
             if change.get("order") else None),
        ) if value is not None]})
    out = {**record, "extension": kept, "occurrenceDateTime": now_instant()}
    out["suppliedItem"] = {**record["suppliedItem"],
                           "quantity": {"value": sum(lot.quantity for lot in lots)}}
    out = with_extension(out, REORDER_LEVEL, None if stock.reorder_level is None
                         else {"valueInteger": stock.reorder_level})
    return with_tags(out, level="low" if stock.low else "ok")


def last_change(record: JSON) -> JSON | None:
    ext = extension(record, CHANGE)
    if ext is None:
        return None
    return {"reason": _sub(ext, "reason"), "delta": _sub(ext, "delta"), "lot": _sub(ext, "lot"),
            "by": _sub(ext, "by"),
            "order_id": local_id(_sub(ext, "order"), "SupplyRequest")}


def stock_view(record: JSON) -> JSON:
    stock = stock_of(record)
    return {
        "id": record["id"], "facility_id": tag(record, FACILITY_TAG),
        "product_id": (tag(record, PRODUCT_TAG) or "/").split("/", 1)[1],
        "product_type": (tag(record, PRODUCT_TAG) or "/").split("/", 1)[0],
        "on_hand": stock.on_hand, "usable": stock.usable(),
        "reorder_level": stock.reorder_level, "low": tag(record, LEVEL_TAG) == "low",
        "lots": [{"lot_number": lot.lot, "expiry_date": lot.expiry, "quantity": lot.quantity}
                 for lot in stock.lots],
        "last_change": last_change(record),
        "updated_at": (record.get("meta") or {}).get("lastUpdated"),
    }


STOCK_CRITERIA = ("_tag", f"{ROLE_TAG}|stock")
