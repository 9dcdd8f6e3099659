"""What the revenue cycle's reports read: the claims of a period the caller may see, with
their payers' latest ClaimResponses and the payments (PaymentReconciliation) that name
them, found with a few FHIR searches (no per-claim question).

A payment names what it pays in ``detail[].request`` (``Claim/<id>`` or ``Invoice/<id>``);
R4 has no search parameter on it, so the period's PaymentReconciliations are read and
matched here. A claim's payments are its ClaimResponse's ``payment`` and those details.
A period holding more than a search answers (10,000 of a type) is refused (422
``PERIOD_TOO_LARGE``) rather than reported on in part.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import date
from decimal import Decimal
from typing import Any

from fastapi import Query

from fhir_server.ownership import OWNER_SYSTEM
from fhir_server.service import MAX_SEARCH_RESULTS
from platform_api.envelope import ApiError
from platform_api.facade import ApiContext, require_organization
from platform_api.fhir_values import decimal_of, local_id
from platform_api.rcm.claims import responses_of, stage_of
from platform_api.rcm.payers import paid_of

JSON = dict[str, Any]
CHUNK = 100  # ids per search of the page's ClaimResponses


@dataclass(frozen=True)
class Period:
    """``from`` / ``to`` (inclusive dates of the claims' creation) and an organization."""

    start: date | None
    end: date | None
    organization_id: str | None

    def criteria(self, param: str) -> list[tuple[str, str]]:
        found = []
        if self.start:
            found.append((param, f"ge{self.start.isoformat()}"))
        if self.end:
            found.append((param, f"le{self.end.isoformat()}"))
        if self.organization_id:
            found.append(("_security", f"{OWNER_SYSTEM}|{self.organization_id}"))
        return found


def period(start: date | None = Query(None, alias="from", description="First day (claims "
                                      "created on or after it)"),
           end: date | None = Query(None, alias="to", description="Last day (inclusive)"),
           organization_id: str | None = Query(None, max_length=64, description="One "
                                               "organization's claims")) -> Period:
    """FastAPI dependency: the period of a report."""
    if start and end and end < start:
        raise ApiError(422, "VALIDATION_ERROR", "to: the period ends before it starts",
                       field="to")
    return Period(start, end, organization_id)


@dataclass
class Payment:
    """One payment towards one claim or invoice (or towards nothing we know)."""

    source: str  # ClaimResponse/<id> or PaymentReconciliation/<id>
    amount: Decimal
    currency: str | None
    date: str | None
    target: str | None  # Claim/<id>, Invoice/<id> or None
    reference: str | None = None


@dataclass
class ClaimRecord:
    claim: JSON
    response: JSON | None
    payments: list[Payment] = field(default_factory=list)

    @property
    def id(self) -> str:
        return str(self.claim["id"])

    @property
    def stage(self) -> str:
        return stage_of(self.claim)

    @property
    def billed(self) -> Decimal:
        return decimal_of((self.claim.get("total") or {}).get("value"))

    @property
    def currency(self) -> str:
        return str((self.claim.get("total") or {}).get("currency") or "")

    @property
    def paid(self) -> Decimal:
        return sum((p.amount for p in self.payments), Decimal(0))

    @property
    def first_payment(self) -> str | None:
        dates = sorted(p.date for p in self.payments if p.date)
        return dates[0] if dates else None


async def every(ctx: ApiContext, resource_type: str, params: list[tuple[str, str]]
                ) -> list[JSON]:
    """Every match, or a refusal: a report over a cut list would be wrong without saying."""
    found = await ctx.fhir.search(resource_type, params)
    if len(found) >= MAX_SEARCH_RESULTS:
        raise ApiError(422, "PERIOD_TOO_LARGE", f"More than {MAX_SEARCH_RESULTS} "
                       f"{resource_type} resources in the period: narrow it (from, to, "
                       "organization_id)", field="from")
    return found


async def claims_of_period(ctx: ApiContext, when: Period) -> list[JSON]:
    if when.organization_id:
        await require_organization(ctx, when.organization_id)
    return await every(ctx, "Claim", [("use", "claim"), *when.criteria("created"),
                                      ("_sort", "created")])


async def latest_responses(ctx: ApiContext, claim_ids: list[str]) -> dict[str, JSON]:
    found: dict[str, JSON] = {}
    for at in range(0, len(claim_ids), CHUNK):
        found.update(await responses_of(ctx, claim_ids[at:at + CHUNK]))
    return found


def reconciliation_payments(payments: Iterable[JSON]) -> list[Payment]:
    """Each detail of each active PaymentReconciliation (one without details: its whole
    amount, towards nothing named)."""
    found = []
    for payment in payments:
        if payment.get("status") not in ("active", None):
            continue
        source = f"PaymentReconciliation/{payment['id']}"
        reference = (payment.get("paymentIdentifier") or {}).get("value")
        details = payment.get("detail") or []
        if not details:
            amount = payment.get("paymentAmount") or {}
            found.append(Payment(source, decimal_of(amount.get("value")),
                                 amount.get("currency"), payment.get("paymentDate"), None,
                                 reference))
        for detail in details:
            amount = detail.get("amount") or payment.get("paymentAmount") or {}
            target = (detail.get("request") or {}).get("reference")
            found.append(Payment(source, decimal_of(amount.get("value")),
                                 amount.get("currency"), detail.get("date")
                                 or payment.get("paymentDate"),
                                 target if isinstance(target, str) else None, reference))
    return found


def response_payment(response: JSON) -> Payment | None:
    amount = paid_of(response)
    if amount <= 0:
        return None
    payment = response.get("payment") or {}
    return Payment(f"ClaimResponse/{response['id']}", amount,
                   (payment.get("amount") or {}).get("currency"), payment.get("date"),
                   f"Claim/{local_id(response.get('request'), 'Claim')}",
                   (payment.get("identifier") or {}).get("value"))


async def payments_of_period(ctx: ApiContext, when: Period) -> list[Payment]:
    found = await every(ctx, "PaymentReconciliation", [*when.criteria("created")])
    return reconciliation_payments(found)


async def claim_records(ctx: ApiContext, when: Period) -> tuple[list[ClaimRecord],
                                                                  list[Payment]]:
    """The period's claims with their decisions and payments, and the period's
    PaymentReconciliation payments (each one once, matched or not)."""
    claims = await claims_of_period(ctx, when)
    responses = await latest_responses(ctx, [c["id"] for c in claims])
    records = {c["id"]: ClaimRecord(c, responses.get(c["id"])) for c in claims}
    for record in records.values():
        if record.response is not None and (paid := response_payment(record.response)):
            record.payments.append(paid)
    payments = await payments_of_period(ctx, when)
    for payment in payments:
        target = payment.target or ""
        claim_id = target[len("Claim/"):] if target.startswith("Claim/") else None
        if claim_id in records:
            records[claim_id].payments.append(payment)
    return list(records.values()), payments
