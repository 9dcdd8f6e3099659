"""What the marketplace modules share: code systems, tags, money, extensions and
facilities. Who may approve spending or act for the seller is the access policy's
(:mod:`platform_api.policy.actions.commerce`: ``supplier.register``,
``supply-order.*``, ``purchase-order.*``)."""

from __future__ import annotations

from decimal import Decimal, InvalidOperation
from typing import Any

from pydantic import BaseModel, Field

from fhir_server.ownership import owner_labels
from platform_api.envelope import ApiError, not_found
from platform_api.facade import ApiContext

JSON = dict[str, Any]
BASE = "urn:healthplatform:marketplace"
KIND_TAG = f"{BASE}:kind"  # product kind: medicine | consumable | device
ROLE_TAG = BASE  # what a resource is in the marketplace: product | stock | order | purchase-order
FACILITY_TAG = f"{BASE}:facility"
PRODUCT_TAG = f"{BASE}:product"
LEVEL_TAG = f"{BASE}:stock-level"  # low | ok
STATUS_TAG = f"{BASE}:order-status"
GTIN_SYSTEM = "https://www.gs1.org/gtin"
UNIT_PRICE = f"{BASE}:unit-price"
LINE_TOTAL = f"{BASE}:line-total"
SUPPLIER = f"{BASE}:supplier"
TOPIC = "platform.marketplace."


class Money(BaseModel):
    """An amount of money: a decimal written as a string (never a binary float) and its
    ISO 4217 currency."""

    value: str = Field(examples=["125.50"])
    currency: str = Field(pattern=r"^[A-Z]{3}$", examples=["KES"])


def decimal_of(value: Any, field: str) -> Decimal:
    """``value`` (a string, or a JSON number read as its text) as a Decimal; 422 naming
    ``field`` when it is not a finite non-negative amount."""
    try:
        amount = Decimal(str(value).strip())
    except (InvalidOperation, ValueError):
        raise ApiError(422, "VALIDATION_ERROR", f"{field}: not a decimal amount",
                       field=field) from None
    if not amount.is_finite() or amount < 0:
        raise ApiError(422, "VALIDATION_ERROR", f"{field}: must be zero or more", field=field)
    return amount


def money_fhir(amount: Decimal, currency: str) -> JSON:
    return {"value": _json_decimal(amount), "currency": currency}


def _json_decimal(amount: Decimal) -> Any:
    """A Decimal as the JSON number FHIR stores: an int when whole, else a float whose
    shortest text is the decimal's (two decimal places round-trip exactly)."""
    if amount == amount.to_integral_value():
        return int(amount)
    return float(amount)


def money_view(money: JSON | None) -> Money | None:
    if not money or money.get("value") is None:
        return None
    amount = Decimal(str(money["value"])).quantize(Decimal("0.01"))
    return Money(value=str(amount), currency=money.get("currency", ""))


def money_decimal(money: JSON | None) -> Decimal:
    return Decimal(str((money or {}).get("value", 0)))


def extension(resource: JSON, url: str) -> JSON | None:
    return next((e for e in resource.get("extension") or [] if e.get("url") == url), None)


def with_extension(resource: JSON, url: str, value: JSON | None) -> JSON:
    """``resource`` with its ``url`` extension replaced by ``value`` (``{"valueX": ...}`` or
    a complex ``{"extension": [...]}``), or removed when None."""
    kept = [e for e in resource.get("extension") or [] if e.get("url") != url]
    if value is not None:
        kept.append({"url": url, **value})
    out = {**resource, "extension": kept}
    if not kept:
        out.pop("extension")
    return out


def tags(resource: JSON, system: str) -> list[str]:
    return [t["code"] for t in (resource.get("meta") or {}).get("tag") or []
            if t.get("system") == system and t.get("code")]


def tag(resource: JSON, system: str) -> str | None:
    found = tags(resource, system)
    return found[0] if found else None


def with_tags(resource: JSON, **by_system: str | None) -> JSON:
    """``resource`` with one tag per given system (replacing that system's tags); the
    keyword names the system: role, kind, facility, product, level, status."""
    systems = {"role": ROLE_TAG, "kind": KIND_TAG, "facility": FACILITY_TAG,
               "product": PRODUCT_TAG, "level": LEVEL_TAG, "status": STATUS_TAG}
    meta = dict(resource.get("meta") or {})
    replaced = {systems[k] for k in by_system}
    kept = [t for t in meta.get("tag") or [] if t.get("system") not in replaced]
    kept += [{"system": systems[k], "code": v} for k, v in by_system.items() if v]
    meta["tag"] = kept
    return {**resource, "meta": meta}


def local_id(reference: JSON | None, resource_type: str | None = None) -> str | None:
    ref = (reference or {}).get("reference") or ""
    kind, _, rest = ref.partition("/")
    if not rest or (resource_type and kind != resource_type):
        return None
    return rest.split("/", 1)[0]


async def facility(ctx: ApiContext, facility_id: str, field: str = "facility_id") -> JSON:
    """A facility: a Location (the directory: anyone signed in may read it) managed by an
    organization; 404 unknown, 422 when it has no managing organization."""
    location = await ctx.fhir.find_json("Location", facility_id)
    if location is None:
        raise not_found("Facility")
    if not local_id(location.get("managingOrganization"), "Organization"):
        raise ApiError(422, "FACILITY_WITHOUT_ORGANIZATION", "The facility (Location) has "
                       "no managingOrganization", field=field)
    return location


def facility_org(location: JSON) -> str:
    return str(local_id(location.get("managingOrganization"), "Organization"))


def owned_by(resource: JSON) -> list[str]:
    return sorted(owner_labels(resource))
