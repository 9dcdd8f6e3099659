"""Orders of medical supplies: FHIR **SupplyRequest**, one per product line, placed by a
buying organization with a selling facility; cart checkout places a cart's lines at once
and reserves their stock atomically.

Mapping (/api field → SupplyRequest element):

    organization_id   → requester (Organization/<buyer>)
    source_facility_id→ deliverFrom (Location/<id>); supplier (Organization/<its
                        managingOrganization>); meta.tag …:facility|<id>
    deliver_to_facility_id → deliverTo (Location/<id>)
    product_id        → itemReference (Medication|Device); meta.tag …:product|<ref>
    quantity          → quantity.value
    unit_price        → extension …:unit-price (valueMoney, the catalogue's price when placed)
    line_total        → extension …:line-total (valueMoney): unit price times quantity, computed
    reserved[]        → extension …:allocation (lot, quantity): the stock reserved
    status            → meta.tag …:order-status (the table below); FHIR status follows:
                        draft → draft; submitted, verified, approved, dispatched → active;
                        delivered → completed; cancelled, rejected → cancelled
    status_reason     → extension …:status-reason (valueString)
    placed_by         → extension …:placed-by (the user); authoredOn when placed
    cart_id           → identifier[system=urn:healthplatform:marketplace:cart]
    (owners)          → meta.security: the buyer's and the seller's organizations (both
                        see and work the order)

Status table: draft → submitted | cancelled; submitted → verified | rejected | cancelled;
verified → approved | rejected | cancelled; approved → dispatched | cancelled; dispatched
→ delivered; delivered, cancelled, rejected are final (409 ``INVALID_TRANSITION``).
Who moves it (the policy's ``supply-order.<move>`` rules, :data:`MOVES`): the buyer's
members who order supplies submit, cancel and confirm delivery; the buyer's
ORG:PHARMACIST or ORG:ADMIN verifies; the buyer's ORG:ADMIN approves the spending; the
seller's ORG:ADMIN or ORG:PHARMACIST dispatches; either side's ORG:ADMIN or
ORG:PHARMACIST rejects. The order (owned by both sides) and the seller's stock record are
then written with the platform's rights, through named elevations: neither side may
write the other's records. Stock is reserved when an order is submitted (checkout places
orders submitted) and released when a reserved order is cancelled or rejected; ``DELETE``
cancels (the order is kept). Reservation takes unexpired lots first expiring first and
is a conditional update (If-Match) of the seller's stock record in the same unit of work
as the orders: of two checkouts racing for the last units one is 201, the other 409
``INSUFFICIENT_STOCK``, and stock is never negative. Events
``platform.marketplace.order_placed``, ``platform.marketplace.order_transitioned``.
"""

from __future__ import annotations

import asyncio
import random
import uuid
from decimal import Decimal
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends
from pydantic import BaseModel, Field

from fhir_server.caller import CallerFhir
from fhir_server.clock import now_instant
from fhir_server.ownership import with_owners
from fhir_server.store import ConditionChanged, VersionConflict
from platform_api.envelope import ApiError, Envelope, created
from platform_api.facade import (
    ApiContext,
    Facade,
    ItemContext,
    SearchParam,
    StatusTable,
    api_context,
    conflict_responses,
    require_organization,
    staged_body,
)
from platform_api.marketplace.catalog import load_product, unit_price
from platform_api.marketplace.common import (
    BASE,
    FACILITY_TAG,
    LINE_TOTAL,
    ROLE_TAG,
    STATUS_TAG,
    TOPIC,
    UNIT_PRICE,
    Money,
    extension,
    facility,
    facility_org,
    local_id,
    money_fhir,
    money_view,
    tag,
    with_extension,
    with_tags,
)
from platform_api.marketplace.inventory import find_stock, low_event
from platform_api.marketplace.stock import Stock, stock_of, with_stock

JSON = dict[str, Any]
ORDER_STATUS = StatusTable.of(
    element="status",
    draft=("submitted", "cancelled"),
    submitted=("verified", "rejected", "cancelled"),
    verified=("approved", "rejected", "cancelled"),
    approved=("dispatched", "cancelled"),
    dispatched=("delivered",),
    delivered=(), cancelled=(), rejected=(),
)
FHIR_STATUS = {"draft": "draft", "submitted": "active", "verified": "active",
               "approved": "active", "dispatched": "active", "delivered": "completed",
               "cancelled": "cancelled", "rejected": "cancelled"}
RESERVED = ("submitted", "verified", "approved")  # stock held for the order, not yet shipped
OrderStatus = Literal["draft", "submitted", "verified", "approved", "dispatched", "delivered",
                      "cancelled", "rejected"]
ALLOCATION = f"{BASE}:allocation"
STATUS_REASON = f"{BASE}:status-reason"
PLACED_BY = f"{BASE}:placed-by"
CART_SYSTEM = f"{BASE}:cart"
CHECKOUT_ATTEMPTS = 40
BUYER, SELLER = "buyer", "seller"
# Each move: the policy's rule deciding it, and whose organizations it is decided in.
MOVES: dict[str, tuple[str, tuple[str, ...]]] = {
    "submitted": ("supply-order.submit", (BUYER,)),
    "cancelled": ("supply-order.cancel", (BUYER,)),
    "delivered": ("supply-order.confirm-delivery", (BUYER,)),
    "verified": ("supply-order.verify", (BUYER,)),
    "approved": ("supply-order.approve", (BUYER,)),
    "dispatched": ("supply-order.dispatch", (SELLER,)),
    "rejected": ("supply-order.reject", (BUYER, SELLER)),
}


class OrderLine(BaseModel):
    product_id: str = Field(min_length=1, max_length=64)
    quantity: int = Field(ge=1, le=1_000_000)
    source_facility_id: str = Field(min_length=1, max_length=64,
                                    description="The facility (Location) selling it")


class OrderCreate(OrderLine):
    organization_id: str = Field(min_length=1, max_length=64, description="The buyer")
    deliver_to_facility_id: str | None = Field(None, min_length=1, max_length=64)


class Checkout(BaseModel):
    organization_id: str = Field(min_length=1, max_length=64, description="The buyer")
    deliver_to_facility_id: str | None = Field(None, min_length=1, max_length=64)
    items: list[OrderLine] = Field(min_length=1, max_length=50)


class Allocation(BaseModel):
    lot_number: str
    quantity: int
    expiry_date: str


class OrderView(BaseModel):
    id: str
    status: str
    organization_id: str | None = None
    supplier_organization_id: str | None = None
    source_facility_id: str | None = None
    deliver_to_facility_id: str | None = None
    product_id: str | None = None
    quantity: int
    unit_price: Money | None = None
    line_total: Money | None = None
    reserved: list[Allocation]
    status_reason: str | None = None
    placed_by: str | None = None
    placed_at: str | None = None
    cart_id: str | None = None
    updated_at: str | None = None


class CheckoutView(BaseModel):
    cart_id: str
    orders: list[OrderView]
    totals: list[Money] = Field(description="The cart's total per currency, computed")


class OrderQuery(BaseModel):
    status: Annotated[OrderStatus | None, SearchParam("_tag", STATUS_TAG + "|{}")] = None
    organization_id: Annotated[str | None, SearchParam("requester", "Organization/{}")] = \
        Field(None, max_length=64, description="The buying organization")
    source_facility_id: Annotated[str | None, SearchParam("_tag", FACILITY_TAG + "|{}")] = \
        Field(None, max_length=64)


class Transition(BaseModel):
    to: OrderStatus = Field(description="The status to move to")
    reason: str | None = Field(None, max_length=500)


def _sub(ext: JSON, url: str) -> Any:
    return next((next((v for k, v in s.items() if k.startswith("value")), None)
                 for s in ext.get("extension") or [] if s.get("url") == url), None)


def allocations(order: JSON) -> list[tuple[str, int, str]]:
    """What the order holds reserved: (lot, quantity, expiry)."""
    return [(str(_sub(e, "lot")), int(_sub(e, "quantity") or 0), str(_sub(e, "expiry")))
            for e in order.get("extension") or [] if e.get("url") == ALLOCATION]


def with_allocations(order: JSON, taken: list[tuple[str, int, str]]) -> JSON:
    kept = [e for e in order.get("extension") or [] if e.get("url") != ALLOCATION]
    kept += [{"url": ALLOCATION, "extension": [{"url": "lot", "valueString": lot},
                                               {"url": "quantity", "valueInteger": qty},
                                               {"url": "expiry", "valueDate": expiry}]}
             for lot, qty, expiry in taken]
    return {**order, "extension": kept}


def order_status(order: JSON) -> str:
    return tag(order, STATUS_TAG) or str(order.get("status"))


def order_view(order: JSON) -> JSON:
    price = (extension(order, UNIT_PRICE) or {}).get("valueMoney")
    total = (extension(order, LINE_TOTAL) or {}).get("valueMoney")
    return OrderView(
        id=order["id"], status=order_status(order),
        organization_id=local_id(order.get("requester"), "Organization"),
        supplier_organization_id=local_id((order.get("supplier") or [{}])[0], "Organization"),
        source_facility_id=local_id(order.get("deliverFrom"), "Location"),
        deliver_to_facility_id=local_id(order.get("deliverTo"), "Location"),
        product_id=local_id(order.get("itemReference")),
        quantity=int((order.get("quantity") or {}).get("value") or 0),
        unit_price=money_view(price), line_total=money_view(total),
        reserved=[Allocation(lot_number=lot, quantity=q, expiry_date=e)
                  for lot, q, e in allocations(order)],
        status_reason=(extension(order, STATUS_REASON) or {}).get("valueString"),
        placed_by=(extension(order, PLACED_BY) or {}).get("valueString"),
        placed_at=order.get("authoredOn"),
        cart_id=next((i.get("value") for i in order.get("identifier") or []
                      if i.get("system") == CART_SYSTEM), None),
        updated_at=(order.get("meta") or {}).get("lastUpdated"),
    ).model_dump()


orders = Facade(
    resource="SupplyRequest", name="Order", create=OrderCreate, view=OrderView,
    query=OrderQuery, to_fhir=lambda p, c, e: {}, from_fhir=order_view,
    fixed=(("_tag", f"{ROLE_TAG}|order"),), statuses=ORDER_STATUS, tags=["marketplace"],
    summaries={"list": "Orders the caller's organizations placed or sell (filter by status, "
                       "buyer, selling facility)", "get": "An order"},
)
router = APIRouter(tags=["marketplace"])
orders.mount(router, "/api/marketplace/orders", ops=("list", "get"))


# -- placing orders ----------------------------------------------------------------------------
class _Line:
    """One cart line, checked: its product, selling facility and price."""

    def __init__(self, index: int, line: OrderLine, product: JSON, source: JSON) -> None:
        self.index, self.line, self.product, self.source = index, line, product, source
        price = unit_price(product)
        if price is None:
            raise ApiError(422, "PRODUCT_NOT_PRICED", "This product has no price in the "
                           "catalogue", field=f"items.{index}.product_id")
        self.price, self.currency = price
        self.ref = f"{product['resourceType']}/{product['id']}"

    @property
    def total(self) -> Decimal:
        return self.price * self.line.quantity


async def _check_buyer(ctx: ApiContext, org_id: str) -> None:
    """The caller orders for ``org_id`` (404 unknown; 403 not a member, or a role that
    does not order supplies)."""
    await require_organization(ctx, org_id)
    ctx.authorize("supply-order.place", org_id)


async def _lines(ctx: ApiContext, items: list[OrderLine]) -> list[_Line]:
    lines = []
    for index, item in enumerate(items):
        product = await load_product(ctx, item.product_id, f"items.{index}.product_id")
        source = await facility(ctx, item.source_facility_id,
                                f"items.{index}.source_facility_id")
        lines.append(_Line(index, item, product, source))
    return lines


def _order(line: _Line, buyer: str, deliver_to: str | None, status: str, by: str,
           cart_id: str | None) -> JSON:
    order: JSON = {
        "resourceType": "SupplyRequest", "status": FHIR_STATUS[status],
        "itemReference": {"reference": line.ref},
        "quantity": {"value": line.line.quantity},
        "requester": {"reference": f"Organization/{buyer}"},
        "supplier": [{"reference": f"Organization/{facility_org(line.source)}"}],
        "deliverFrom": {"reference": f"Location/{line.source['id']}"},
        "authoredOn": now_instant(),
        "extension": [
            {"url": UNIT_PRICE, "valueMoney": money_fhir(line.price, line.currency)},
            {"url": LINE_TOTAL, "valueMoney": money_fhir(line.total, line.currency)},
            {"url": PLACED_BY, "valueString": by}],
    }
    if deliver_to:
        order["deliverTo"] = {"reference": f"Location/{deliver_to}"}
    if cart_id:
        order["identifier"] = [{"system": CART_SYSTEM, "value": cart_id}]
    order = with_tags(order, role="order", status=status, facility=line.source["id"],
                      product=line.ref)
    return with_owners(order, {buyer, facility_org(line.source)})


async def _reserve(ctx: ApiContext, system: CallerFhir,
                   wanted: list[tuple[JSON, JSON, int, str]]
                   ) -> tuple[list[tuple[JSON, JSON]], list[list[tuple[str, int, str]]]]:
    """Take each wanted (facility, product, quantity, order reference) from the seller's
    stock record, read now with ``system`` (the platform's rights the caller's permitted
    move was elevated to: the stock is the seller's); the records to write (current,
    changed) and what each line took. Lines of the same record share it."""
    records: dict[str, tuple[JSON, Stock, list[str]]] = {}
    taken: list[list[tuple[str, int, str]]] = []
    for index, (source, product, quantity, order_ref) in enumerate(wanted):
        ref = f"{product['resourceType']}/{product['id']}"
        key = f"{source['id']}:{ref}"
        if key not in records:
            current = await find_stock(system, source["id"], ref)
            if current is None:
                raise ApiError(409, "INSUFFICIENT_STOCK", "The facility holds none of this "
                               "product", field=f"items.{index}.quantity")
            records[key] = (current, stock_of(current), [])
        current, stock, refs = records[key]
        try:
            taken.append(stock.take(quantity))
        except ApiError as exc:
            raise ApiError(409, "INSUFFICIENT_STOCK", exc.message,
                           field=f"items.{index}.quantity") from None
        refs.append(order_ref)
    changes = [(current, with_stock(current, stock, {
        "reason": "reserved", "delta": stock.on_hand - stock_of(current).on_hand,
        "by": ctx.principal.user_id, "order": refs[0]}))
        for current, stock, refs in records.values()]
    return changes, taken


async def _stage_stock(unit: Any, changes: list[tuple[JSON, JSON]]) -> None:
    """Stage the stock records' changes in ``unit`` (elevated: the seller's records)."""
    for current, changed in changes:
        await unit.update(changed, if_match=int(current["meta"]["versionId"]))
        if stock_of(changed).low and not stock_of(current).low:
            unit.emit(TOPIC + "stock_low", low_event(changed), source_service="marketplace")


async def _backoff(attempt: int) -> None:
    await asyncio.sleep(random.uniform(0, 0.002 * (attempt + 1)))  # jitter


@router.post("/api/marketplace/cart/checkout", status_code=201,
             response_model=Envelope[CheckoutView],
             summary="Turn a cart into orders, reserving their stock atomically",
             responses=conflict_responses({"INSUFFICIENT_STOCK": "a line asks more than "
                                           "the facility holds unexpired"}))
async def checkout(body: Checkout, ctx: ApiContext = Depends(api_context)) -> Any:
    await _check_buyer(ctx, body.organization_id)
    if body.deliver_to_facility_id:
        await facility(ctx, body.deliver_to_facility_id, "deliver_to_facility_id")
    lines = await _lines(ctx, body.items)
    cart_id = str(uuid.uuid4())
    system = ctx.elevate("supply-order.place: reserve the sellers' stock and store the "
                         "orders both sides own")
    for attempt in range(CHECKOUT_ATTEMPTS):
        placed = [{**_order(line, body.organization_id, body.deliver_to_facility_id,
                            "submitted", ctx.principal.user_id, cart_id),
                   "id": str(uuid.uuid4())} for line in lines]
        changes, taken = await _reserve(ctx, system, [
            (line.source, line.product, line.line.quantity, f"SupplyRequest/{order['id']}")
            for line, order in zip(lines, placed, strict=True)])
        unit = system.unit()
        try:
            async with unit:
                await _stage_stock(unit, changes)
                staged = []
                for order, took in zip(placed, taken, strict=True):
                    staged.append(await unit.create(
                        with_allocations(order, took), resource_id=order["id"],
                        expected_type="SupplyRequest"))
                    unit.emit(TOPIC + "order_placed", order_view(order),
                              source_service="marketplace")
                await unit.commit()
        except (VersionConflict, ConditionChanged):
            await _backoff(attempt)
            continue
        views = [order_view(staged_body(s)) for s in staged]
        totals: dict[str, Decimal] = {}
        for line in lines:
            totals[line.currency] = totals.get(line.currency, Decimal(0)) + line.total
        return created(CheckoutView(cart_id=cart_id, orders=[
            OrderView.model_validate(v) for v in views], totals=[
            Money(value=str(v.quantize(Decimal("0.01"))), currency=c)
            for c, v in sorted(totals.items())]).model_dump())
    raise ApiError(409, "STOCK_BUSY", "The stock kept changing while reserving; try again")


@router.post("/api/marketplace/orders", status_code=201, response_model=Envelope[OrderView],
             summary="Place a draft order (stock is reserved when it is submitted)")
async def create_order(body: OrderCreate, ctx: ApiContext = Depends(api_context)) -> Any:
    await _check_buyer(ctx, body.organization_id)
    if body.deliver_to_facility_id:
        await facility(ctx, body.deliver_to_facility_id, "deliver_to_facility_id")
    product = await load_product(ctx, body.product_id)
    source = await facility(ctx, body.source_facility_id, "source_facility_id")
    line = _Line(0, body, product, source)
    unit = ctx.elevate_unit(ctx.fhir.unit(), "supply-order.place: store the draft order "
                            "both sides own")
    async with unit:
        staged = await unit.create(
            _order(line, body.organization_id, body.deliver_to_facility_id, "draft",
                   ctx.principal.user_id, None), expected_type="SupplyRequest")
        await unit.commit()
    return created(order_view(staged_body(staged)))


# -- moving orders ------------------------------------------------------------------------------
def _may_move(ctx: ApiContext, order: JSON, target: str) -> None:
    """403 unless the policy's rule for the move (:data:`MOVES`) admits the caller in the
    buying or selling organization it names."""
    sides = {BUYER: local_id(order.get("requester"), "Organization"),
             SELLER: local_id((order.get("supplier") or [{}])[0], "Organization")}
    action, where = MOVES[target]
    ctx.authorize(action, [o for side in where if (o := sides[side])])


async def move_order(ctx: ItemContext[Any], target: str, reason: str | None) -> JSON:
    """Move the order through the table, reserving stock on submission and releasing it
    when a reserved order is cancelled or rejected; one unit of work."""
    order = ctx.resource
    current = order_status(order)
    ORDER_STATUS.check(current, target)
    _may_move(ctx, order, target)
    system = ctx.elevate("supply-order.move: update the order and the seller's stock")
    moved = with_tags({**order, "status": FHIR_STATUS[target]}, status=target)
    moved = with_extension(moved, STATUS_REASON, {"valueString": reason} if reason else None)
    changes: list[tuple[JSON, JSON]] = []
    if target == "submitted":
        product = await load_product(ctx, local_id(order.get("itemReference")) or "")
        source = await facility(ctx, local_id(order.get("deliverFrom"), "Location") or "")
        changes, taken = await _reserve(ctx, system, [
            (source, product, int(order["quantity"]["value"]), f"SupplyRequest/{order['id']}")])
        moved = with_allocations(moved, taken[0])
    elif target in ("cancelled", "rejected") and current in RESERVED:
        changes = await _release(ctx, system, order)
        moved = with_allocations(moved, [])
    unit = system.unit()
    async with unit:
        await _stage_stock(unit, changes)
        staged = await unit.update(
            moved, if_match=int(order["meta"]["versionId"]))
        unit.emit(TOPIC + "order_transitioned", {**order_view(moved), "from": current},
                  source_service="marketplace")
        await unit.commit()
    return staged_body(staged)


async def _release(ctx: ApiContext, system: CallerFhir, order: JSON
                   ) -> list[tuple[JSON, JSON]]:
    source_id = local_id(order.get("deliverFrom"), "Location") or ""
    product_ref = (order.get("itemReference") or {}).get("reference", "")
    current = await find_stock(system, source_id, product_ref)
    if current is None:
        return []
    stock = stock_of(current)
    for lot_number, quantity, expiry in allocations(order):
        stock.put(lot_number, quantity, expiry)  # an emptied lot comes back with its expiry
    returned = sum(q for _lot, q, _expiry in allocations(order))
    return [(current, with_stock(current, stock, {
        "reason": "released", "delta": returned, "by": ctx.principal.user_id,
        "order": f"SupplyRequest/{order['id']}"}))]


@orders.route("POST", "/{resource_id}/transition", body=Transition,
              summary="Move an order to a named status (the table decides)",
              conflicts={"INVALID_TRANSITION": "the status table has no such move",
                         "INSUFFICIENT_STOCK": "submitting asks more than is held"})
async def transition_order(ctx: ItemContext[Transition]) -> JSON:
    assert ctx.body is not None
    return await move_order(ctx, ctx.body.to, ctx.body.reason)


@orders.route("POST", "/{resource_id}/verify",
              summary="Verify a submitted order (the buyer's pharmacist or administrator)",
              conflicts={"INVALID_TRANSITION": "the order is not submitted"})
async def verify_order(ctx: ItemContext[Any]) -> JSON:
    return await move_order(ctx, "verified", None)


@orders.route("DELETE", "/{resource_id}",
              summary="Cancel an order (kept, status cancelled; its stock is released)",
              conflicts={"INVALID_TRANSITION": "the order is dispatched or final"})
async def cancel_order(ctx: ItemContext[Any]) -> JSON:
    return await move_order(ctx, "cancelled", f"Cancelled by {ctx.principal.user_id}")


__all__ = ["ORDER_STATUS", "OrderView", "order_view", "orders", "router"]
