"""Small readers and builders of FHIR values the /api areas share: references, codings,
the reference to a platform user, money as exact decimals."""

from __future__ import annotations

from decimal import ROUND_HALF_EVEN, Decimal
from typing import Any

from platform_api.auth.principal import Principal
from platform_api.policy.subject import USER_SYSTEM

JSON = dict[str, Any]
CENT = Decimal("0.01")


def local_id(reference: JSON | None, resource_type: str) -> str | None:
    """The id in ``{"reference": "<Type>/<id>"}`` (a versioned reference's id too)."""
    ref = (reference or {}).get("reference") or ""
    prefix = f"{resource_type}/"
    if not isinstance(ref, str) or not ref.startswith(prefix):
        return None
    return ref[len(prefix):].split("/_history/")[0] or None


def reference(resource_type: str, resource_id: str, display: str | None = None) -> JSON:
    found: JSON = {"reference": f"{resource_type}/{resource_id}"}
    if display:
        found["display"] = display
    return found


def coding(concept: JSON | None) -> JSON:
    """The first coding of a CodeableConcept (``{}`` when it has none)."""
    return ((concept or {}).get("coding") or [{}])[0]  # type: ignore[no-any-return]


def concept(code: str | None, system: str | None = None, display: str | None = None,
            text: str | None = None) -> JSON:
    """A CodeableConcept of one coding (or only a text)."""
    found: JSON = {}
    if code:
        one = {"system": system, "code": code, "display": display}
        found["coding"] = [{k: v for k, v in one.items() if v}]
    if text or (display and not code):
        found["text"] = text or display
    return found


def concept_text(value: JSON | None) -> str | None:
    first = coding(value)
    return (value or {}).get("text") or first.get("display") or first.get("code")


def user_identifier(user_id: str) -> JSON:
    return {"system": USER_SYSTEM, "value": user_id}


def user_reference(principal: Principal, practitioner_id: str | None = None,
                   resource_type: str = "Practitioner") -> JSON:
    """A reference to the calling user: their Practitioner record when they have one, and
    always their user identifier (what "my ..." lists search with ``:identifier``)."""
    found: JSON = {"type": resource_type, "identifier": user_identifier(principal.user_id),
                   "display": principal.email or principal.user_id}
    if practitioner_id:
        found["reference"] = f"Practitioner/{practitioner_id}"
    return found


def referenced_user(value: JSON | None) -> str | None:
    """The user id a reference's platform user identifier carries."""
    identifier = (value or {}).get("identifier") or {}
    return identifier.get("value") if identifier.get("system") == USER_SYSTEM else None


def money(amount: Decimal, currency: str) -> JSON:
    """FHIR Money: the value as a JSON number (the store keeps the digits it is given)."""
    return {"value": decimal_number(amount), "currency": currency}


def decimal_number(amount: Decimal) -> float | int:
    quantized = amount.quantize(CENT, ROUND_HALF_EVEN)
    return int(quantized) if quantized == quantized.to_integral_value() else float(quantized)


def decimal_of(value: Any) -> Decimal:
    """A stored FHIR decimal back as an exact Decimal of cents."""
    return Decimal(str(value if value is not None else 0)).quantize(CENT, ROUND_HALF_EVEN)


def amount_text(amount: Decimal) -> str:
    """An amount as /api shows it: a decimal string with two places ("1500.00")."""
    return str(amount.quantize(CENT, ROUND_HALF_EVEN))
