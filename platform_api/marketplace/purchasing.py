"""Suppliers, purchase orders and reorder triggers of a buying organization.

Suppliers → FHIR **Organization** (``type`` urn:healthplatform:marketplace:org-type
#supplier; owned by the organization that registered it, which alone changes it and
orders from it; like every Organization it is in the directory signed-in users read):

    organization_id → owner label (the buyer keeping the supplier); name → name;
    email, phone → telecom; country → address.country; lead_time_days → extension
    …:lead-time (valueInteger)

Purchase orders → FHIR **SupplyRequest** (tag …|purchase-order, owned by the buyer):

    organization_id → requester (Organization/<buyer>); supplier_id → supplier;
    facility_id → deliverTo (Location/<id>); product_id → itemReference;
    quantity → quantity.value; line_total → extension …:line-total (the catalogue's unit
    price times quantity, computed); reason → reasonCode.text (e.g. the reorder trigger)

Status table (FHIR SupplyRequest.status): draft → active (``approve``: the buyer's
ORG:ADMIN, never the member who raised it unless they are the only admin's own order) |
cancelled; active → completed | cancelled. Any member of the buying organization raises
one; ``approve`` needs ORG:ADMIN of the buyer (403 otherwise).

Reorder trigger (``POST /api/marketplace/reorder-trigger``, the facility's ORG:ADMIN or
ORG:PHARMACIST): every stock record of the facility at or below its reorder level with no
open purchase order gets a draft purchase order for what the next ``cover_days`` need
(average daily consumption over the last ``window_days`` from the record's history:
dispensings, expiries, damage and orders) topped up to twice the reorder level, at
least the reorder level less what is on hand plus one.

Events ``platform.marketplace.supplier_created``, ``purchase_order_created``,
``purchase_order_approved``.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Annotated, Any, Literal

import orjson
from fastapi import APIRouter, Depends
from pydantic import BaseModel, EmailStr, Field

from fhir_server.clock import now_instant
from fhir_server.ownership import with_owners
from platform_api.envelope import ApiError, Envelope, created
from platform_api.facade import (
    ApiContext,
    Events,
    Facade,
    ItemContext,
    SearchParam,
    StatusTable,
    api_context,
    require_organization,
    staged_body,
)
from platform_api.marketplace.catalog import load_product, unit_price
from platform_api.marketplace.common import (
    BASE,
    FACILITY_TAG,
    LINE_TOTAL,
    ROLE_TAG,
    TOPIC,
    Money,
    extension,
    facility,
    facility_org,
    local_id,
    money_fhir,
    money_view,
    owned_by,
    with_extension,
    with_tags,
)
from platform_api.marketplace.stock import STOCK_CRITERIA, last_change, stock_of

JSON = dict[str, Any]
ORG_TYPE = f"{BASE}:org-type"
LEAD_TIME = f"{BASE}:lead-time"
PO_STATUS = StatusTable.of(draft=("active", "cancelled"), active=("completed", "cancelled"),
                           completed=(), cancelled=())
CONSUMING = ("dispensed", "expired", "damaged", "order")


# -- suppliers ----------------------------------------------------------------------------
class SupplierCreate(BaseModel):
    organization_id: str = Field(min_length=1, max_length=64,
                                 description="The buying organization keeping the supplier")
    name: str = Field(min_length=1, max_length=200, examples=["Kenya Medical Supplies Authority"])
    email: EmailStr | None = None
    phone: str | None = Field(None, max_length=40)
    country: str | None = Field(None, min_length=2, max_length=2)
    lead_time_days: int | None = Field(None, ge=0, le=365)


class SupplierView(BaseModel):
    id: str
    organization_id: str | None = None
    name: str
    email: str | None = None
    phone: str | None = None
    country: str | None = None
    lead_time_days: int | None = None


class SupplierQuery(BaseModel):
    organization_id: Annotated[str | None, SearchParam("_security", "urn:healthplatform:"
                                                       "organization|{}")] = Field(
        None, max_length=64, description="The buying organization")
    name: Annotated[str | None, SearchParam("name")] = Field(None, max_length=200)


def supplier_to_fhir(payload: JSON, ctx: ApiContext, existing: JSON | None) -> JSON:
    org: JSON = {"resourceType": "Organization", "active": True, "name": payload["name"],
                 "type": [{"coding": [{"system": ORG_TYPE, "code": "supplier"}]}]}
    telecom = [{"system": s, "value": payload[k]} for s, k in (("email", "email"),
                                                              ("phone", "phone")) if payload.get(k)]
    if telecom:
        org["telecom"] = telecom
    if payload.get("country"):
        org["address"] = [{"country": payload["country"].upper()}]
    if payload.get("lead_time_days") is not None:
        org = with_extension(org, LEAD_TIME, {"valueInteger": payload["lead_time_days"]})
    return with_owners(with_tags(org, role="supplier"), {payload["organization_id"]})


def supplier_view(org: JSON) -> JSON:
    telecom = {t.get("system"): t.get("value") for t in org.get("telecom") or []}
    owners = owned_by(org)
    return SupplierView(
        id=org["id"], organization_id=owners[0] if owners else None, name=org.get("name", ""),
        email=telecom.get("email"), phone=telecom.get("phone"),
        country=(org.get("address") or [{}])[0].get("country"),
        lead_time_days=(extension(org, LEAD_TIME) or {}).get("valueInteger"),
    ).model_dump()


async def _prepare_supplier(ctx: ApiContext, payload: JSON) -> JSON:
    ctx.authorize("supplier.register", payload["organization_id"])
    return payload


suppliers = Facade(
    resource="Organization", name="Supplier", create=SupplierCreate, view=SupplierView,
    query=SupplierQuery, to_fhir=supplier_to_fhir, from_fhir=supplier_view,
    fixed=(("_tag", f"{ROLE_TAG}|supplier"),), prepare=_prepare_supplier,
    events=Events(created=TOPIC + "supplier_created"), sort="name", tags=["marketplace"],
    summaries={"list": "The suppliers of your organizations",
               "create": "Register a supplier (a FHIR Organization; ORG:ADMIN)"},
)
router = APIRouter(tags=["marketplace"])
suppliers.mount(router, "/api/marketplace/suppliers", ops=("list", "create"))


# -- purchase orders ----------------------------------------------------------------------
class PurchaseOrderCreate(BaseModel):
    organization_id: str = Field(min_length=1, max_length=64, description="The buyer")
    supplier_id: str = Field(min_length=1, max_length=64)
    facility_id: str = Field(min_length=1, max_length=64, description="Where it is delivered")
    product_id: str = Field(min_length=1, max_length=64)
    quantity: int = Field(ge=1, le=10_000_000)
    reason: str | None = Field(None, max_length=500)


class PurchaseOrderView(BaseModel):
    id: str
    status: str
    organization_id: str | None = None
    supplier_id: str | None = None
    facility_id: str | None = None
    product_id: str | None = None
    quantity: int
    line_total: Money | None = None
    reason: str | None = None
    raised_at: str | None = None
    approved_by: str | None = None


PoStatus = Literal["draft", "active", "completed", "cancelled"]


class PurchaseOrderQuery(BaseModel):
    organization_id: Annotated[str | None, SearchParam("requester", "Organization/{}")] = \
        Field(None, max_length=64)
    facility_id: Annotated[str | None, SearchParam("_tag", FACILITY_TAG + "|{}")] = Field(
        None, max_length=64)
    status: Annotated[PoStatus | None, SearchParam("status")] = None


def purchase_order_to_fhir(payload: JSON, ctx: ApiContext, existing: JSON | None) -> JSON:
    request: JSON = {
        "resourceType": "SupplyRequest", "status": "draft", "authoredOn": now_instant(),
        "requester": {"reference": f"Organization/{payload['organization_id']}"},
        "supplier": [{"reference": f"Organization/{payload['supplier_id']}"}],
        "deliverTo": {"reference": f"Location/{payload['facility_id']}"},
        "itemReference": {"reference": payload["product_ref"]},
        "quantity": {"value": payload["quantity"]},
    }
    if payload.get("reason"):
        request["reasonCode"] = [{"text": payload["reason"]}]
    if payload.get("line_total"):
        request = with_extension(request, LINE_TOTAL, {"valueMoney": payload["line_total"]})
    return with_owners(with_tags(request, role="purchase-order",
                                 facility=payload["facility_id"]),
                       {payload["organization_id"]})


def purchase_order_view(request: JSON) -> JSON:
    item = (request.get("itemReference") or {}).get("reference", "")
    approved = next((e.get("valueString") for e in request.get("extension") or []
                     if e.get("url") == f"{BASE}:approved-by"), None)
    return PurchaseOrderView(
        id=request["id"], status=request["status"],
        organization_id=local_id(request.get("requester"), "Organization"),
        supplier_id=local_id((request.get("supplier") or [None])[0], "Organization"),
        facility_id=local_id(request.get("deliverTo"), "Location"),
        product_id=item.split("/", 1)[-1] if item else None,
        quantity=int((request.get("quantity") or {}).get("value") or 0),
        line_total=money_view((extension(request, LINE_TOTAL) or {}).get("valueMoney")),
        reason=(request.get("reasonCode") or [{}])[0].get("text"),
        raised_at=request.get("authoredOn"), approved_by=approved,
    ).model_dump()


async def _prepare_purchase_order(ctx: ApiContext, payload: JSON) -> JSON:
    """The caller is a member of the buyer; the supplier is one of the buyer's; the
    facility is the buyer's; the product is in the catalogue; the total is computed."""
    await require_organization(ctx, payload["organization_id"])
    supplier = await ctx.fhir.find_json("Organization", payload["supplier_id"])
    if supplier is None or "supplier" not in str(supplier.get("type")):
        raise ApiError(404, "NOT_FOUND", "Supplier not found", field="supplier_id")
    if payload["organization_id"] not in owned_by(supplier):
        raise ApiError(422, "UNKNOWN_SUPPLIER", "The supplier is not one of the buying "
                       "organization's", field="supplier_id")
    place = await facility(ctx, payload["facility_id"])
    if facility_org(place) != payload["organization_id"]:
        raise ApiError(422, "NOT_YOUR_FACILITY", "The facility is not the buyer's",
                       field="facility_id")
    product = await load_product(ctx, payload["product_id"])
    payload["product_ref"] = f"{product['resourceType']}/{product['id']}"
    price = unit_price(product)
    if price is not None:
        payload["line_total"] = money_fhir(price[0] * Decimal(payload["quantity"]), price[1])
    return payload


purchase_orders = Facade(
    resource="SupplyRequest", name="Purchase order", create=PurchaseOrderCreate,
    view=PurchaseOrderView, query=PurchaseOrderQuery, to_fhir=purchase_order_to_fhir,
    from_fhir=purchase_order_view, fixed=(("_tag", f"{ROLE_TAG}|purchase-order"),),
    prepare=_prepare_purchase_order, events=Events(created=TOPIC + "purchase_order_created"),
    tags=["marketplace"],
    summaries={"list": "Purchase orders of your organizations (filter by status, facility)",
               "create": "Raise a purchase order with a supplier (a FHIR SupplyRequest)"},
)
purchase_orders.mount(router, "/api/marketplace/purchase-orders", ops=("list", "create"))


@purchase_orders.route("POST", "/{resource_id}/approve",
                       summary="Approve a draft purchase order (the buyer's ORG:ADMIN)")
async def approve(ctx: ItemContext[Any]) -> JSON:
    order = ctx.resource
    buyer = str(local_id(order.get("requester"), "Organization"))
    ctx.authorize("purchase-order.approve", buyer)
    moved = with_extension(PO_STATUS.move(order, "active"), f"{BASE}:approved-by",
                           {"valueString": ctx.principal.user_id})
    return await ctx.save(moved, event=TOPIC + "purchase_order_approved",
                          payload=purchase_order_view({**moved, "meta": order.get("meta")}))


# -- reorder triggers ---------------------------------------------------------------------
class ReorderTrigger(BaseModel):
    facility_id: str = Field(min_length=1, max_length=64)
    supplier_id: str = Field(min_length=1, max_length=64)
    cover_days: int = Field(30, ge=1, le=365, description="Days of consumption to order")
    window_days: int = Field(30, ge=1, le=365, description="Days of history averaged")


class ReorderView(BaseModel):
    facility_id: str
    raised: list[PurchaseOrderView]
    skipped: list[str] = Field(description="Products below their level with an open order")


async def consumed(ctx: ApiContext, record: JSON, since: datetime) -> int:
    """Units the stock record lost to use (dispensings, expiries, damage, orders) since."""
    total, before = 0, None
    while True:
        page = await ctx.fhir.history("SupplyDelivery", record["id"],
                                      since=since.isoformat(), count=100, before_seq=before)
        for version in page.entries:
            change = last_change(orjson.loads(version.body)) or {}
            if change.get("reason") in CONSUMING and (change.get("delta") or 0) < 0:
                total -= int(change["delta"])
        if len(page.entries) < 100:
            return total
        before = page.entries[-1].seq


async def _announce(ctx: ApiContext, view: JSON) -> None:
    async with ctx.services.store.unit_of_work() as uow:
        uow.emit(TOPIC + "purchase_order_created", view, source_service="marketplace")
        await uow.commit()


@router.post("/api/marketplace/reorder-trigger", status_code=201,
             response_model=Envelope[ReorderView],
             summary="Raise draft purchase orders for the facility's items at or below their "
                     "reorder level (from average consumption)")
async def reorder_trigger(body: ReorderTrigger, ctx: ApiContext = Depends(api_context)) -> Any:
    place = await facility(ctx, body.facility_id)
    org_id = facility_org(place)
    ctx.authorize("purchase-order.reorder", org_id)
    records = await ctx.fhir.search("SupplyDelivery", [
        STOCK_CRITERIA, ("_tag", f"{FACILITY_TAG}|{place['id']}")])
    open_orders = await ctx.fhir.search("SupplyRequest", [
        ("_tag", f"{ROLE_TAG}|purchase-order"), ("_tag", f"{FACILITY_TAG}|{place['id']}"),
        ("status", "draft,active")])
    pending = {(o.get("itemReference") or {}).get("reference") for o in open_orders}
    since = datetime.now(UTC) - timedelta(days=body.window_days)
    raised, skipped = [], []
    for record in records:
        stock = stock_of(record)
        if stock.reorder_level is None or stock.on_hand > stock.reorder_level:
            continue
        product_ref = str((record.get("suppliedItem") or {}).get("itemReference", {})
                          .get("reference"))
        product_id = product_ref.split("/", 1)[-1]
        if product_ref in pending:
            skipped.append(product_id)
            continue
        daily = await consumed(ctx, record, since) / body.window_days
        quantity = max(math.ceil(daily * body.cover_days) + stock.reorder_level
                       - stock.on_hand, 2 * stock.reorder_level - stock.on_hand,
                       stock.reorder_level - stock.on_hand + 1)
        payload = await _prepare_purchase_order(ctx, {
            "organization_id": org_id, "supplier_id": body.supplier_id,
            "facility_id": place["id"], "product_id": product_id, "quantity": quantity,
            "reason": f"Reorder: {stock.on_hand} on hand, level {stock.reorder_level}, "
                      f"{daily:.1f} a day over {body.window_days} days"})
        unit = ctx.fhir.unit()
        async with unit:
            staged = await unit.create(purchase_order_to_fhir(payload, ctx, None))
            await unit.commit()
        view = purchase_order_view(staged_body(staged))
        await _announce(ctx, view)
        raised.append(view)
    return created(ReorderView(
        facility_id=place["id"], skipped=skipped,
        raised=[PurchaseOrderView.model_validate(v) for v in raised]).model_dump())
