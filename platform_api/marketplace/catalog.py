"""The product catalogue: FHIR **Medication** (medicines) and **Device** (consumables and
devices), kept in step with the suppliers' feeds.

Mapping (/api field → FHIR element):

    kind        → meta.tag urn:healthplatform:marketplace:kind (medicine | consumable |
                  device); the resource type follows: Medication for medicines, else Device
    name        → Medication.code.text | Device.deviceName[type=user-friendly-name].name
    gtin        → identifier[system=https://www.gs1.org/gtin] (when the feed knows it)
    sku         → identifier[system=urn:healthplatform:marketplace:sku:<feed>] (the
                  supplier's own code: what a later sync matches the product by)
    unit        → Medication.form.text | Device.type.text (the unit sold: "box of 100")
    unit_price  → extension urn:healthplatform:marketplace:unit-price (valueMoney)
    supplier_id → extension urn:healthplatform:marketplace:supplier (valueReference
                  Organization)
    (always)    → meta.tag urn:healthplatform:marketplace#product; Medication.status and
                  Device.status active (inactive once a feed drops the product)

Both types are in the policy's directory / definitions categories: every signed-in user
reads the catalogue; platform administrators write it (``POST .../catalog/sync``, feeds
configured in ``HEALTHPLATFORM_MARKETPLACE_FEEDS``). A feed row needs ``sku``, ``name``,
``price`` (a decimal string or number) and ``currency`` (or the feed's default); ``kind``
defaults to medicine; a bad row is reported by line, field and reason, the others are
applied. Event ``platform.marketplace.catalog_synced`` (counts).
"""

from __future__ import annotations

from decimal import Decimal
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends
from pydantic import BaseModel, Field

from platform_api.envelope import ApiError, Envelope, ok
from platform_api.facade import ApiContext, Facade, SearchParam, api_context
from platform_api.marketplace.common import (
    GTIN_SYSTEM,
    KIND_TAG,
    ROLE_TAG,
    SUPPLIER,
    TOPIC,
    UNIT_PRICE,
    Money,
    decimal_of,
    extension,
    local_id,
    money_fhir,
    money_view,
    tag,
    with_extension,
    with_tags,
)
from platform_api.marketplace.feeds import feed_config, fetch_feed

JSON = dict[str, Any]
Kind = Literal["medicine", "consumable", "device"]
SKU_SYSTEM = "urn:healthplatform:marketplace:sku"


class ProductView(BaseModel):
    id: str
    resource_type: str
    kind: str | None = None
    name: str | None = None
    gtin: str | None = None
    sku: str | None = None
    unit: str | None = None
    unit_price: Money | None = None
    supplier_id: str | None = None
    active: bool = True
    updated_at: str | None = None


class ProductQuery(BaseModel):
    kind: Annotated[Kind | None, SearchParam("_tag", KIND_TAG + "|{}")] = None
    gtin: Annotated[str | None, SearchParam("identifier", GTIN_SYSTEM + "|{}")] = Field(
        None, max_length=14, pattern=r"^\d{8,14}$")


def _identifier(resource: JSON, prefix: str) -> str | None:
    return next((i.get("value") for i in resource.get("identifier") or []
                 if str(i.get("system", "")).startswith(prefix)), None)


def product_view(resource: JSON) -> JSON:
    if resource["resourceType"] == "Medication":
        name = (resource.get("code") or {}).get("text")
        unit = (resource.get("form") or {}).get("text")
        active = resource.get("status", "active") == "active"
    else:
        name = next((n.get("name") for n in resource.get("deviceName") or []), None)
        unit = (resource.get("type") or {}).get("text")
        active = resource.get("status", "active") == "active"
    price = extension(resource, UNIT_PRICE)
    supplier = extension(resource, SUPPLIER)
    return ProductView(
        id=resource["id"], resource_type=resource["resourceType"], kind=tag(resource, KIND_TAG),
        name=name, gtin=_identifier(resource, GTIN_SYSTEM), sku=_identifier(resource, SKU_SYSTEM),
        unit=unit, unit_price=money_view((price or {}).get("valueMoney")),
        supplier_id=local_id((supplier or {}).get("valueReference"), "Organization"),
        active=active, updated_at=(resource.get("meta") or {}).get("lastUpdated"),
    ).model_dump()


products = Facade(
    resource="Medication", also=("Device",), name="Product", create=ProductView,
    view=ProductView, query=ProductQuery, to_fhir=lambda p, c, e: {}, from_fhir=product_view,
    fixed=(("_tag", f"{ROLE_TAG}|product"),), sort="_id", tags=["marketplace"],
    summaries={"list": "The product catalogue (medicines, consumables, devices)"},
)
router = APIRouter(tags=["marketplace"])
products.mount(router, "/api/marketplace/products", ops=("list",))


async def load_product(ctx: ApiContext, product_id: str, field: str = "product_id") -> JSON:
    """A catalogue product by id (either type); 404 when unknown."""
    for kind in products.types:
        found = await ctx.fhir.find_json(kind, product_id)
        if found is not None and tag(found, ROLE_TAG) == "product":
            return found
    raise ApiError(404, "NOT_FOUND", "Product not found", field=field)


def unit_price(product: JSON) -> tuple[Decimal, str] | None:
    money = (extension(product, UNIT_PRICE) or {}).get("valueMoney")
    if not money or money.get("value") is None:
        return None
    return Decimal(str(money["value"])), str(money.get("currency", ""))


# -- catalogue sync ----------------------------------------------------------------------------
class CatalogSync(BaseModel):
    feed: str = Field(min_length=1, max_length=64, examples=["kemsa"],
                      description="A feed named in HEALTHPLATFORM_MARKETPLACE_FEEDS")


class RejectedRow(BaseModel):
    line: int
    field: str
    message: str


class CatalogSyncView(BaseModel):
    feed: str
    created: int
    updated: int
    unchanged: int
    rejected: list[RejectedRow]


def _row_product(row: JSON, feed_name: str, feed: dict[str, str], current: JSON | None
                 ) -> JSON:
    """The FHIR resource a feed row describes (over ``current``: what it got elsewhere
    stays); ValueError(field, message) for a row that cannot be one."""
    sku = str(row.get("sku") or "").strip()
    name = str(row.get("name") or "").strip()
    if not sku:
        raise ValueError("sku", "missing")
    if not name:
        raise ValueError("name", "missing")
    kind = str(row.get("kind") or "medicine").strip().lower()
    if kind not in ("medicine", "consumable", "device"):
        raise ValueError("kind", "must be medicine, consumable or device")
    try:
        price = decimal_of(row.get("price"), "price")
    except ApiError as exc:
        raise ValueError("price", exc.message) from None
    currency = str(row.get("currency") or feed.get("currency") or "").strip().upper()
    if len(currency) != 3 or not currency.isalpha():
        raise ValueError("currency", "an ISO 4217 code is needed")
    gtin = str(row.get("gtin") or "").strip()
    if gtin and not (gtin.isdigit() and 8 <= len(gtin) <= 14):
        raise ValueError("gtin", "a GTIN has 8 to 14 digits")
    resource_type = "Medication" if kind == "medicine" else "Device"
    if current is not None and current["resourceType"] != resource_type:
        raise ValueError("kind", f"the product is already a {current['resourceType']}")
    identifiers = [{"system": f"{SKU_SYSTEM}:{feed_name}", "value": sku}]
    if gtin:
        identifiers.insert(0, {"system": GTIN_SYSTEM, "value": gtin})
    unit = str(row.get("unit") or "").strip()
    resource: JSON = dict(current or {"resourceType": resource_type})
    resource["identifier"] = identifiers
    resource["status"] = "active"
    if resource_type == "Medication":
        resource["code"] = {"text": name}
        resource.pop("form", None)
        if unit:
            resource["form"] = {"text": unit}
    else:
        resource["deviceName"] = [{"name": name, "type": "user-friendly-name"}]
        resource.pop("type", None)
        if unit:
            resource["type"] = {"text": unit}
    resource = with_extension(resource, UNIT_PRICE, {"valueMoney": money_fhir(price, currency)})
    supplier = feed.get("supplier_id")
    resource = with_extension(resource, SUPPLIER, {"valueReference": {
        "reference": f"Organization/{supplier}"}} if supplier else None)
    return with_tags(resource, role="product", kind=kind)


def _same(a: JSON, b: JSON) -> bool:
    strip = ("meta", "id")
    return {k: v for k, v in a.items() if k not in strip} == \
        {k: v for k, v in b.items() if k not in strip} and \
        sorted(map(str, (a.get("meta") or {}).get("tag") or [])) == \
        sorted(map(str, (b.get("meta") or {}).get("tag") or []))


@router.post("/api/marketplace/catalog/sync", response_model=Envelope[CatalogSyncView],
             summary="Synchronise the catalogue from a supplier feed (platform administrators)")
async def sync_catalog(body: CatalogSync, ctx: ApiContext = Depends(api_context)) -> Any:
    feed = feed_config(ctx.services.settings, body.feed)
    rows = await fetch_feed(ctx.services.settings, feed)
    system = f"{SKU_SYSTEM}:{body.feed}"
    current: dict[str, JSON] = {}
    for kind in products.types:
        for found in await ctx.fhir.search(kind, [("identifier", f"{system}|")]):
            sku = _identifier(found, system)
            if sku:
                current[sku] = found
    rejected: list[RejectedRow] = []
    counts = {"created": 0, "updated": 0, "unchanged": 0}
    unit = ctx.unit()
    async with unit:
        for line, row in enumerate(rows, start=2):  # line 1 is a CSV feed's header
            sku = str(row.get("sku") or "").strip()
            try:
                resource = _row_product(row, body.feed, feed, current.get(sku))
            except ValueError as exc:
                field, message = exc.args
                rejected.append(RejectedRow(line=line, field=field, message=message))
                continue
            if sku in current and _same(current[sku], resource):
                counts["unchanged"] += 1
            elif sku in current:
                await unit.update(resource, if_match=int(current[sku]["meta"]["versionId"]))
                counts["updated"] += 1
            else:
                await unit.create(resource, ownerless=True)
                counts["created"] += 1
            current[sku] = resource
        result = CatalogSyncView(feed=body.feed, rejected=rejected, **counts)
        unit.emit(TOPIC + "catalog_synced", result.model_dump(exclude={"rejected"}),
                  source_service="marketplace")
        await unit.commit()
    return ok(result.model_dump())


__all__ = ["load_product", "product_view", "products", "router", "unit_price"]
