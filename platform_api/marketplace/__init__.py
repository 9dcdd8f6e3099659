"""Medical supply marketplace (spec: Marketplace): the product catalogue synchronised from
supplier feeds (:mod:`.catalog`), stock per facility with lots, expiry and reorder
levels (:mod:`.stock`, :mod:`.inventory`), orders and cart checkout with atomic stock
reservation (:mod:`.orders`), suppliers, purchase orders and reorder triggers
(:mod:`.purchasing`). Each module's docstring gives its FHIR mapping."""

from __future__ import annotations

from fastapi import APIRouter

from platform_api.marketplace import catalog, inventory, orders, purchasing

router = APIRouter()
for _module in (catalog, inventory, orders, purchasing):
    router.include_router(_module.router)

__all__ = ["router"]
