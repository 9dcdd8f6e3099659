"""Claim analytics by insurer and by provider over a period, and the reconciliation of
payments with claims and invoices (read-only reports over FHIR Claim, ClaimResponse,
PaymentReconciliation and Invoice; see :mod:`.ledger` for how they are found).

Analytics, per insurer (the Claim's insurer) or provider (its Organization) and currency:
``claims`` (every claim of the period but drafts and cancelled ones), ``billed`` (their
totals), ``approved`` (what the payers' decisions grant), ``paid`` (ClaimResponse payments
and PaymentReconciliation details naming the claim), ``approval_rate`` and
``rejection_rate`` (of the claims decided: approved or partly approved / rejected), and
``mean_days_to_payment`` (claim created → its first payment). Amounts are decimal strings.

Reconciliation: each claim with a decision or a payment, expected = what was approved
(billed when undecided), against what was paid: ``matched``, ``short_paid``, ``overpaid``
or ``unpaid``; each invoice against the payments naming it (``balanced``,
``short_paid``, ``overpaid``, ``unpaid``); and the payments that name nothing the caller
knows (``unmatched_payments``).
"""

from __future__ import annotations

from collections import defaultdict
from datetime import date
from decimal import Decimal
from typing import Any

from fastapi import APIRouter, Depends
from pydantic import BaseModel, Field

from platform_api.envelope import Envelope, ok
from platform_api.facade import ApiContext, api_context
from platform_api.fhir_values import amount_text, decimal_of, local_id
from platform_api.rcm.ledger import (
    ClaimRecord,
    Payment,
    Period,
    claim_records,
    every,
    period,
)
from platform_api.rcm.payers import decision_of, total_of

JSON = dict[str, Any]
router = APIRouter(tags=["rcm"])
PREFIX = "/api/rcm/claims"
UNCOUNTED = ("draft", "cancelled")


class ClaimGroupStats(BaseModel):
    key: str | None = Field(description="The insurer's name or the provider's id")
    name: str | None
    currency: str
    claims: int
    billed: str
    approved: str
    paid: str
    decided: int
    approved_claims: int
    rejected_claims: int
    approval_rate: float | None = Field(description="approved / decided (None: none "
                                        "decided)")
    rejection_rate: float | None
    mean_days_to_payment: float | None


class ClaimAnalytics(BaseModel):
    by: str
    start: str | None = Field(description="from")
    end: str | None = Field(description="to")
    groups: list[ClaimGroupStats]


def _days(start: str | None, end: str | None) -> int | None:
    if not start or not end:
        return None
    return (date.fromisoformat(end[:10]) - date.fromisoformat(start[:10])).days


def group_stats(key: str | None, name: str | None, currency: str,
                records: list[ClaimRecord]) -> JSON:
    decisions = [decision_of(r.response) for r in records if r.response is not None]
    decided = [d for d in decisions if d != "pending"]
    approved = sum(1 for d in decided if d in ("approved", "partial"))
    rejected = sum(1 for d in decided if d == "rejected")
    waits = [d for r in records if (d := _days(r.claim.get("created"), r.first_payment))
             is not None]
    return ClaimGroupStats(
        key=key, name=name, currency=currency, claims=len(records),
        billed=amount_text(sum((r.billed for r in records), Decimal(0))),
        approved=amount_text(sum((total_of(r.response, "benefit") for r in records
                                  if r.response is not None), Decimal(0))),
        paid=amount_text(sum((r.paid for r in records), Decimal(0))),
        decided=len(decided), approved_claims=approved, rejected_claims=rejected,
        approval_rate=round(approved / len(decided), 4) if decided else None,
        rejection_rate=round(rejected / len(decided), 4) if decided else None,
        mean_days_to_payment=round(sum(waits) / len(waits), 2) if waits else None,
    ).model_dump()


async def analytics(ctx: ApiContext, when: Period, by: str) -> JSON:
    records, _payments = await claim_records(ctx, when)
    groups: dict[tuple[str | None, str], list[ClaimRecord]] = defaultdict(list)
    for record in records:
        if record.stage in UNCOUNTED:
            continue
        claim = record.claim
        key = (claim.get("insurer") or {}).get("display") if by == "insurer" else \
            local_id(claim.get("provider"), "Organization")
        groups[(key, record.currency)].append(record)
    names: dict[str, str | None] = {}
    if by == "provider":
        ids = sorted({k for k, _c in groups if k})
        if ids:
            names = {o["id"]: o.get("name") for o in await ctx.fhir.search(
                "Organization", [("_id", ",".join(ids))])}
    stats = [group_stats(key, names.get(key or "") if by == "provider" else key, currency,
                         found) for (key, currency), found in groups.items()]
    stats.sort(key=lambda s: (-s["claims"], s["key"] or "", s["currency"]))
    return ClaimAnalytics.model_validate({
        "by": by, "start": when.start.isoformat() if when.start else None,
        "end": when.end.isoformat() if when.end else None, "groups": stats}).model_dump()


@router.get(PREFIX + "/analytics/by-insurer", response_model=Envelope[ClaimAnalytics],
            summary="Claims per insurer over a period: counts, billed, approved, paid, "
                    "approval and rejection rates, mean days to payment")
async def by_insurer(when: Period = Depends(period),
                     ctx: ApiContext = Depends(api_context)) -> Any:
    return ok(await analytics(ctx, when, "insurer"))


@router.get(PREFIX + "/analytics/by-provider", response_model=Envelope[ClaimAnalytics],
            summary="Claims per provider (organization) over a period, as by insurer")
async def by_provider(when: Period = Depends(period),
                      ctx: ApiContext = Depends(api_context)) -> Any:
    return ok(await analytics(ctx, when, "provider"))


# -- reconciliation -------------------------------------------------------------------------------
class PaymentLine(BaseModel):
    source: str = Field(description="ClaimResponse/<id> or PaymentReconciliation/<id>")
    amount: str
    currency: str | None
    date: str | None
    target: str | None = Field(description="Claim/<id>, Invoice/<id>, or what it named")
    reference: str | None


class ClaimReconciliation(BaseModel):
    claim_id: str
    number: str | None
    patient_id: str | None
    insurer: str | None
    status: str
    currency: str
    billed: str
    expected: str
    paid: str
    difference: str = Field(description="expected - paid")
    result: str = Field(description="matched | short_paid | overpaid | unpaid")
    payments: list[PaymentLine]


class InvoiceReconciliation(BaseModel):
    invoice_id: str
    number: str | None
    patient_id: str | None
    currency: str
    total: str
    paid: str
    difference: str
    result: str = Field(description="balanced | short_paid | overpaid | unpaid")


class Reconciliation(BaseModel):
    start: str | None
    end: str | None
    claims: list[ClaimReconciliation]
    invoices: list[InvoiceReconciliation]
    unmatched_payments: list[PaymentLine]
    short_paid: int
    unpaid: int


def result_of(expected: Decimal, paid: Decimal, exact: str = "matched") -> str:
    if paid <= 0:
        return "unpaid"
    if paid < expected:
        return "short_paid"
    return exact if paid == expected else "overpaid"


def _line(payment: Payment) -> JSON:
    return PaymentLine(source=payment.source, amount=amount_text(payment.amount),
                       currency=payment.currency, date=payment.date, target=payment.target,
                       reference=payment.reference).model_dump()


def claim_reconciliation(record: ClaimRecord) -> JSON:
    claim, response = record.claim, record.response
    decided = response is not None and decision_of(response) != "pending"
    expected = total_of(response, "benefit") if decided and response else record.billed
    return ClaimReconciliation.model_validate({
        "claim_id": record.id, "number": (claim.get("identifier") or [{}])[0].get("value"),
        "patient_id": local_id(claim.get("patient"), "Patient"),
        "insurer": (claim.get("insurer") or {}).get("display"), "status": record.stage,
        "currency": record.currency, "billed": amount_text(record.billed),
        "expected": amount_text(expected), "paid": amount_text(record.paid),
        "difference": amount_text(expected - record.paid),
        "result": result_of(expected, record.paid),
        "payments": [_line(p) for p in record.payments]}).model_dump()


async def invoice_reconciliations(ctx: ApiContext, when: Period,
                                  payments: list[Payment]) -> tuple[list[JSON], set[str]]:
    invoices = await every(ctx, "Invoice", [*when.criteria("date"),
                                            ("status", "issued,balanced")])
    paid: dict[str, Decimal] = defaultdict(Decimal)
    for payment in payments:
        if (payment.target or "").startswith("Invoice/"):
            paid[payment.target[len("Invoice/"):]] += payment.amount  # type: ignore[index]
    found = []
    for invoice in invoices:
        total = decimal_of((invoice.get("totalGross") or {}).get("value"))
        got = paid.get(invoice["id"], Decimal(0))
        found.append(InvoiceReconciliation(
            invoice_id=invoice["id"], number=(invoice.get("identifier") or [{}])[0].get(
                "value"), patient_id=local_id(invoice.get("subject"), "Patient"),
            currency=(invoice.get("totalGross") or {}).get("currency", ""),
            total=amount_text(total), paid=amount_text(got),
            difference=amount_text(total - got),
            result=result_of(total, got, "balanced")).model_dump())
    return found, {f"Invoice/{i['id']}" for i in invoices}


@router.get(PREFIX + "/reconciliation", response_model=Envelope[Reconciliation],
            summary="Payments matched to claims and invoices: short-paid, unpaid and "
                    "unmatched items listed")
async def reconciliation(when: Period = Depends(period),
                         ctx: ApiContext = Depends(api_context)) -> Any:
    records, payments = await claim_records(ctx, when)
    claims = [claim_reconciliation(r) for r in records
              if r.stage not in UNCOUNTED and (r.response is not None or r.payments)]
    invoices, invoice_refs = await invoice_reconciliations(ctx, when, payments)
    known = {f"Claim/{r.id}" for r in records} | invoice_refs
    unmatched = [_line(p) for p in payments if p.target not in known]
    everything = [*claims, *invoices]
    return ok(Reconciliation.model_validate({
        "start": when.start.isoformat() if when.start else None,
        "end": when.end.isoformat() if when.end else None, "claims": claims,
        "invoices": invoices, "unmatched_payments": unmatched,
        "short_paid": sum(1 for i in everything if i["result"] == "short_paid"),
        "unpaid": sum(1 for i in everything if i["result"] == "unpaid")}).model_dump())
