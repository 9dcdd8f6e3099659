"""Billing of an organization: invoices (FHIR Invoice), payments (FHIR
PaymentReconciliation) and insurance claims (FHIR Claim, with the patient's Coverage).

Amounts are exact decimals: the /api takes numbers or decimal strings, computes with
``Decimal`` and shows amounts as strings with two places (``"1500.00"``); FHIR stores
them as JSON numbers in ``Money`` (``value`` + ISO 4217 ``currency``).

Invoice (/api → FHIR Invoice):
    patient_id → subject (Patient/<id>); (scope) → issuer (Organization/<id>) and owner
    currency → the currency of every Money below
    line_items[] → lineItem[] (sequence; description/code → chargeItemCodeableConcept;
                   priceComponent[type base]: factor = quantity, amount = quantity *
                   unit price)
    total → totalNet = totalGross (the sum of the lines)
    number (generated) → identifier (urn:healthplatform:organization:<org>:invoice)
    note → note[0].text; issued_at → date
    status → status: issued, then balanced once payments reach the total

Payment (/api → FHIR PaymentReconciliation): status active, outcome complete,
    invoice_id → detail[0].request (Invoice/<id>) and the tag
                 ``urn:healthplatform:invoice|<id>`` (R4 has no search parameter on the
                 detail's request; the tag is what the invoice's payments are found by)
    amount, currency → paymentAmount and detail[0].amount (the invoice's currency)
    paid_at → paymentDate (date) and detail[0].date; method (cash, mobile_money, card,
    bank_transfer, insurance, cheque) → extension ``urn:healthplatform:payment-method``;
    reference → paymentIdentifier.value; receipt (1, 2, … per invoice) → identifier.

An invoice's payment status is computed from its payments: ``unpaid``,
``partially_paid``, ``balanced`` (paid exactly) or ``overpaid``; the Invoice's own
status becomes ``balanced`` when a payment brings the paid amount to the total or more.
Payments of one invoice take turns: each inserts its receipt number
(``invoice_receipts/<invoice>:<n>``) in its unit of work, so two payments at once cannot
both count on the same paid amount. A cancelled invoice takes no payment (409
``INVOICE_CANCELLED``); a payment in another currency is 422.

Claim (/api → FHIR Claim, "submit": status active, use claim): patient, provider (the
organization), insurer (display), type (claim-type), priority normal, diagnoses
(ICD-10 → diagnosis[].diagnosisCodeableConcept), items (productOrService, quantity,
unitPrice, net), total, and insurance[0].coverage: the patient's Coverage for the
insurer's policy (``identifier`` ``urn:healthplatform:insurer:<insurer>|<policy
number>``), found or created (a conditional create). The revenue-cycle area builds the
rest of a claim's life on the same resources.

Who: the policy's financial roles (``ORG:ADMIN``, ``ORG:BILLING`` write; ``ORG:DOCTOR``,
``ORG:RECEPTIONIST`` read). Events: ``platform.billing.invoice_created``,
``platform.billing.payment_recorded`` (with the invoice's payment status),
``platform.billing.claim_submitted``.
"""

from __future__ import annotations

import re
import uuid
from decimal import Decimal
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends
from pydantic import AwareDatetime, BaseModel, Field

from fhir_server.clock import now_instant
from fhir_server.store import DuplicateDocument
from platform_api.envelope import ApiError, Envelope, conflict, created
from platform_api.facade import (
    ApiContext,
    Events,
    Facade,
    OrganizationScope,
    SearchParam,
    api_context,
    require_patient,
    staged_body,
    until_stable,
    visible_patient,
)
from platform_api.fhir_values import (
    amount_text,
    coding,
    concept,
    concept_text,
    decimal_of,
    local_id,
    money,
    reference,
)

JSON = dict[str, Any]
INVOICE_TAG = "urn:healthplatform:invoice"
METHOD_EXTENSION = "urn:healthplatform:payment-method"
RECEIPTS = "invoice_receipts"
ICD10 = "http://hl7.org/fhir/sid/icd-10"
# A claim's stage in the revenue cycle (platform_api/rcm): FHIR Claim.status has only
# draft / active / cancelled, so the stage of an active claim is this tag.
CLAIM_STAGE = "urn:healthplatform:claim-stage"
INVOICE_CREATED = "platform.billing.invoice_created"
PAYMENT_RECORDED = "platform.billing.payment_recorded"
CLAIM_SUBMITTED = "platform.billing.claim_submitted"
SOURCE = "billing"
Currency = Annotated[str, Field(pattern=r"^[A-Z]{3}$", examples=["KES"])]
Amount = Annotated[Decimal, Field(gt=0, max_digits=14, decimal_places=2)]
PaymentMethod = Literal["cash", "mobile_money", "card", "bank_transfer", "insurance",
                        "cheque"]
ClaimType = Literal["institutional", "professional", "oral", "pharmacy", "vision"]


def organization_identifier_system(org_id: str, kind: str) -> str:
    return f"urn:healthplatform:organization:{org_id}:{kind}"


# -- models ---------------------------------------------------------------------------------------
class LineItem(BaseModel):
    description: str = Field(min_length=1, max_length=200, examples=["Malaria RDT"])
    code: str | None = Field(default=None, max_length=64, examples=["394915009"])
    system: str | None = Field(default=None, max_length=200,
                               examples=["http://snomed.info/sct"])
    quantity: Annotated[Decimal, Field(gt=0, max_digits=10, decimal_places=2)] = Decimal(1)
    unit_price: Annotated[Decimal, Field(ge=0, max_digits=14, decimal_places=2)] = Field(
        examples=["350.00"])


class InvoiceCreate(BaseModel):
    patient_id: str = Field(min_length=1, max_length=64)
    currency: Currency
    line_items: list[LineItem] = Field(min_length=1, max_length=200)
    note: str | None = Field(default=None, max_length=2000)


class LineItemView(BaseModel):
    description: str | None
    code: str | None = None
    quantity: str
    unit_price: str
    amount: str


class InvoiceView(BaseModel):
    id: str
    number: str | None
    patient_id: str | None
    status: str
    currency: str
    line_items: list[LineItemView]
    total: str
    paid: str
    balance: str = Field(description="total - paid (negative when overpaid)")
    payment_status: str = Field(description="unpaid | partially_paid | balanced | overpaid")
    note: str | None = None
    issued_at: str | None = None


class InvoiceQuery(BaseModel):
    patient_id: Annotated[str | None, SearchParam("subject", "Patient/{}")] = Field(
        None, max_length=64)
    status: Annotated[Literal["issued", "balanced", "cancelled"] | None,
                      SearchParam("status")] = None


class PaymentCreate(BaseModel):
    invoice_id: str = Field(min_length=1, max_length=64)
    amount: Amount = Field(examples=["1500.00"])
    currency: Currency
    method: PaymentMethod = "cash"
    reference: str | None = Field(default=None, max_length=100,
                                  examples=["QK7H2M9XPL"], description="The payment's own "
                                  "reference (e.g. the mobile money transaction code)")
    paid_at: AwareDatetime | None = None


class InvoiceBalance(BaseModel):
    total: str
    paid: str
    balance: str
    payment_status: str


class PaymentView(BaseModel):
    id: str
    invoice_id: str | None
    receipt: str | None
    amount: str
    currency: str
    method: str | None
    reference: str | None
    paid_at: str | None
    invoice: InvoiceBalance | None = None


class PaymentQuery(BaseModel):
    invoice_id: Annotated[str | None, SearchParam("_tag", INVOICE_TAG + "|{}")] = Field(
        None, max_length=64)


class ClaimItem(BaseModel):
    description: str = Field(min_length=1, max_length=200, examples=["Inpatient day"])
    code: str | None = Field(default=None, max_length=64)
    system: str | None = Field(default=None, max_length=200)
    quantity: Annotated[Decimal, Field(gt=0, max_digits=10, decimal_places=2)] = Decimal(1)
    unit_price: Annotated[Decimal, Field(ge=0, max_digits=14, decimal_places=2)]


class ClaimCreate(BaseModel):
    patient_id: str = Field(min_length=1, max_length=64)
    insurer: str = Field(min_length=1, max_length=200, examples=["NHIF"])
    policy_number: str = Field(min_length=1, max_length=64, examples=["NHIF-2231-8890"])
    type: ClaimType = "institutional"
    currency: Currency
    diagnoses: list[Annotated[str, Field(pattern=r"^[A-Z][0-9][0-9A-Z](\.[0-9A-Z]{1,4})?$")]
                    ] = Field(default_factory=list, max_length=25, examples=[["B50.9"]],
                              description="ICD-10 codes")
    items: list[ClaimItem] = Field(min_length=1, max_length=200)


class ClaimView(BaseModel):
    id: str
    number: str | None
    patient_id: str | None
    status: str
    type: str | None
    insurer: str | None
    coverage_id: str | None
    currency: str | None
    diagnoses: list[str]
    items: list[LineItemView]
    total: str
    submitted_at: str | None


class ClaimQuery(BaseModel):
    patient_id: Annotated[str | None, SearchParam("patient", "Patient/{}")] = Field(
        None, max_length=64)
    status: Annotated[Literal["active", "cancelled", "draft", "entered-in-error"] | None,
                      SearchParam("status")] = None


# -- invoices -------------------------------------------------------------------------------------
def _number(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10].upper()}"


def _charge(item: JSON) -> JSON:
    return concept(item.get("code"), item.get("system"), item["description"],
                   item["description"])


def _quantity(item: JSON) -> Decimal:
    return Decimal(str(item.get("quantity", 1)))


def _line_total(item: JSON) -> Decimal:
    return _quantity(item) * Decimal(str(item["unit_price"]))


def invoice_to_fhir(payload: JSON, ctx: ApiContext, existing: JSON | None) -> JSON:
    org_id, currency = ctx.path["org_id"], payload["currency"]
    lines = payload["line_items"]
    total = sum((_line_total(i) for i in lines), Decimal(0))
    invoice: JSON = {
        "resourceType": "Invoice", "status": "issued", "date": now_instant(),
        "identifier": [{"system": organization_identifier_system(org_id, "invoice"),
                        "value": _number("INV")}],
        "subject": reference("Patient", payload["patient_id"]),
        "issuer": reference("Organization", org_id),
        "lineItem": [{"sequence": n, "chargeItemCodeableConcept": _charge(item),
                      "priceComponent": [{"type": "base",
                                          "factor": float(_quantity(item)),
                                          "amount": money(_line_total(item), currency)}]}
                     for n, item in enumerate(lines, 1)],
        "totalNet": money(total, currency), "totalGross": money(total, currency)}
    if payload.get("note"):
        invoice["note"] = [{"text": payload["note"]}]
    return invoice


def payment_status(total: Decimal, paid: Decimal) -> str:
    if paid <= 0:
        return "unpaid"
    if paid < total:
        return "partially_paid"
    return "balanced" if paid == total else "overpaid"


def invoice_total(invoice: JSON) -> Decimal:
    return decimal_of((invoice.get("totalGross") or {}).get("value"))


def balance_of(invoice: JSON, paid: Decimal) -> JSON:
    total = invoice_total(invoice)
    return {"total": amount_text(total), "paid": amount_text(paid),
            "balance": amount_text(total - paid), "payment_status": payment_status(total, paid)}


def _line_view(line: JSON) -> JSON:
    component = (line.get("priceComponent") or [{}])[0]
    quantity = Decimal(str(component.get("factor", 1)))
    amount = decimal_of((component.get("amount") or {}).get("value"))
    charge = line.get("chargeItemCodeableConcept")
    return {"description": concept_text(charge), "code": coding(charge).get("code"),
            "quantity": str(quantity.normalize()), "amount": amount_text(amount),
            "unit_price": amount_text(amount / quantity if quantity else amount)}


def invoice_view(invoice: JSON, paid: Decimal = Decimal(0)) -> JSON:
    return InvoiceView.model_validate({
        "id": invoice["id"], "number": (invoice.get("identifier") or [{}])[0].get("value"),
        "patient_id": local_id(invoice.get("subject"), "Patient"),
        "status": invoice.get("status", ""),
        "currency": (invoice.get("totalGross") or {}).get("currency", ""),
        "line_items": [_line_view(line) for line in invoice.get("lineItem", [])],
        "note": (invoice.get("note") or [{}])[0].get("text"), "issued_at": invoice.get("date"),
        **balance_of(invoice, paid)}).model_dump()


def _paid_by_invoice(payments: list[JSON]) -> dict[str, Decimal]:
    paid: dict[str, Decimal] = {}
    for payment in payments:
        invoice_id = _invoice_of(payment)
        if invoice_id and payment.get("status") == "active":
            amount = decimal_of((payment.get("paymentAmount") or {}).get("value"))
            paid[invoice_id] = paid.get(invoice_id, Decimal(0)) + amount
    return paid


async def _payments_of(ctx: ApiContext, invoice_ids: list[str]) -> list[JSON]:
    if not invoice_ids:
        return []
    return await ctx.fhir.search("PaymentReconciliation", [
        ("_tag", ",".join(f"{INVOICE_TAG}|{i}" for i in invoice_ids))])


async def invoice_views(ctx: ApiContext, invoices: list[JSON]) -> list[JSON]:
    """Views with what was paid: one search for the payments of the page's invoices."""
    paid = _paid_by_invoice(await _payments_of(ctx, [i["id"] for i in invoices]))
    return [invoice_view(i, paid.get(i["id"], Decimal(0))) for i in invoices]


invoices = Facade(
    resource="Invoice", name="Invoice", create=InvoiceCreate, view=InvoiceView,
    query=InvoiceQuery, to_fhir=invoice_to_fhir, from_fhir=invoice_view, views=invoice_views,
    scope=OrganizationScope(), prepare=visible_patient, sort="-date",
    events=Events(created=INVOICE_CREATED, payload=lambda i: {
        "invoice_id": i["id"], "organization_id": local_id(i.get("issuer"), "Organization"),
        "patient_id": local_id(i.get("subject"), "Patient"),
        "total": amount_text(invoice_total(i)),
        "currency": (i.get("totalGross") or {}).get("currency")}),
    tags=["billing"],
    summaries={"list": "List an organization's invoices, with what was paid",
               "create": "Issue an invoice (line items; totals computed as decimals)"},
)


# -- payments -------------------------------------------------------------------------------------
def _invoice_of(payment: JSON) -> str | None:
    for tag in (payment.get("meta") or {}).get("tag") or []:
        if tag.get("system") == INVOICE_TAG:
            return tag.get("code")  # type: ignore[no-any-return]
    return None


def payment_view(payment: JSON, invoice: JSON | None = None,
                 paid: Decimal | None = None) -> JSON:
    amount = payment.get("paymentAmount") or {}
    method = next((e.get("valueCode") for e in payment.get("extension", [])
                   if e.get("url") == METHOD_EXTENSION), None)
    return PaymentView.model_validate({
        "id": payment["id"], "invoice_id": _invoice_of(payment),
        "receipt": (payment.get("identifier") or [{}])[0].get("value"),
        "amount": amount_text(decimal_of(amount.get("value"))),
        "currency": amount.get("currency", ""), "method": method,
        "reference": (payment.get("paymentIdentifier") or {}).get("value"),
        "paid_at": ((payment.get("detail") or [{}])[0]).get("date") or payment.get("created"),
        "invoice": balance_of(invoice, paid) if invoice is not None and paid is not None
        else None}).model_dump()


async def payment_views(ctx: ApiContext, payments: list[JSON]) -> list[JSON]:
    """Views with their invoice's balance now: two searches for the page."""
    invoice_ids = sorted({i for p in payments if (i := _invoice_of(p))})
    found = await ctx.fhir.search("Invoice", [("_id", ",".join(invoice_ids))]) \
        if invoice_ids else []
    paid = _paid_by_invoice(await _payments_of(ctx, invoice_ids))
    by_id = {i["id"]: i for i in found}
    return [payment_view(p, by_id.get(_invoice_of(p) or ""),
                         paid.get(_invoice_of(p) or "", Decimal(0))) for p in payments]



payments = Facade(
    resource="PaymentReconciliation", name="Payment", create=PaymentCreate, view=PaymentView,
    query=PaymentQuery, from_fhir=payment_view, views=payment_views,
    scope=OrganizationScope(), sort="-created", tags=["billing"],
    summaries={"list": "List an organization's payments (invoice_id: one invoice's)"},
)


def payment_to_fhir(body: PaymentCreate, invoice: JSON, receipt: int) -> JSON:
    when = body.paid_at.isoformat() if body.paid_at else now_instant()
    amount = money(body.amount, body.currency)
    payment: JSON = {
        "resourceType": "PaymentReconciliation", "status": "active", "created": now_instant(),
        "meta": {"tag": [{"system": INVOICE_TAG, "code": invoice["id"]}]},
        "identifier": [{"system": f"{INVOICE_TAG}:{invoice['id']}:receipt",
                        "value": str(receipt)}],
        "paymentDate": when[:10], "paymentAmount": amount, "outcome": "complete",
        "disposition": "Payment received",
        "extension": [{"url": METHOD_EXTENSION, "valueCode": body.method}],
        "detail": [{"type": concept("payment", "http://terminology.hl7.org/CodeSystem/"
                                    "payment-type", "Payment"),
                    "request": reference("Invoice", invoice["id"]), "date": when[:10],
                    "amount": amount}]}
    if body.reference:
        payment["paymentIdentifier"] = {"value": body.reference}
    if invoice.get("issuer"):
        payment["paymentIssuer"] = invoice["issuer"]
    return payment


# -- claims ---------------------------------------------------------------------------------------
def insurer_key(insurer: str) -> str:
    """The key of an insurer's name ("Jubilee Insurance" → ``jubilee-insurance``): its
    Coverage identifiers' system, and its payer settings in the revenue-cycle area."""
    return re.sub(r"[^a-z0-9]+", "-", insurer.lower()).strip("-") or "insurer"


def _insurer_system(insurer: str) -> str:
    return "urn:healthplatform:insurer:" + insurer_key(insurer)


def coverage_for(body: ClaimCreate) -> JSON:
    return {"resourceType": "Coverage", "status": "active",
            "identifier": [{"system": _insurer_system(body.insurer),
                            "value": body.policy_number}],
            "subscriberId": body.policy_number,
            "beneficiary": reference("Patient", body.patient_id),
            "payor": [{"display": body.insurer}]}


def claim_to_fhir(body: ClaimCreate, org_id: str, coverage_id: str) -> JSON:
    items = [item.model_dump() for item in body.items]
    total = sum((_line_total(i) for i in items), Decimal(0))
    diagnosis_sequences = list(range(1, len(body.diagnoses) + 1))
    return {
        "resourceType": "Claim", "status": "active", "use": "claim", "created": now_instant(),
        "meta": {"tag": [{"system": CLAIM_STAGE, "code": "submitted"}]},
        "identifier": [{"system": organization_identifier_system(org_id, "claim"),
                        "value": _number("CLM")}],
        "type": concept(body.type, "http://terminology.hl7.org/CodeSystem/claim-type",
                        body.type.title()),
        "patient": reference("Patient", body.patient_id),
        "provider": reference("Organization", org_id),
        "insurer": {"display": body.insurer},
        "priority": concept("normal", "http://terminology.hl7.org/CodeSystem/processpriority",
                            "Normal"),
        "insurance": [{"sequence": 1, "focal": True,
                       "coverage": reference("Coverage", coverage_id)}],
        **({"diagnosis": [{"sequence": n, "diagnosisCodeableConcept": concept(code, ICD10)}
                          for n, code in zip(diagnosis_sequences, body.diagnoses,
                                             strict=True)]} if body.diagnoses else {}),
        "item": [{"sequence": n, "productOrService": _charge(item),
                  "quantity": {"value": float(_quantity(item))},
                  "unitPrice": money(Decimal(item["unit_price"]), body.currency),
                  "net": money(_line_total(item), body.currency),
                  **({"diagnosisSequence": diagnosis_sequences} if diagnosis_sequences
                     else {})}
                 for n, item in enumerate(items, 1)],
        "total": money(total, body.currency)}


def claim_view(claim: JSON) -> JSON:
    total = claim.get("total") or {}
    return ClaimView.model_validate({
        "id": claim["id"], "number": (claim.get("identifier") or [{}])[0].get("value"),
        "patient_id": local_id(claim.get("patient"), "Patient"), "status": claim["status"],
        "type": coding(claim.get("type")).get("code"),
        "insurer": (claim.get("insurer") or {}).get("display"),
        "coverage_id": local_id(((claim.get("insurance") or [{}])[0]).get("coverage"),
                                "Coverage"),
        "currency": total.get("currency"),
        "diagnoses": [coding(d.get("diagnosisCodeableConcept")).get("code")
                      for d in claim.get("diagnosis", [])],
        "items": [{"description": concept_text(i.get("productOrService")),
                   "code": coding(i.get("productOrService")).get("code"),
                   "quantity": str(Decimal(str((i.get("quantity") or {}).get("value", 1)))
                                   .normalize()),
                   "unit_price": amount_text(decimal_of((i.get("unitPrice") or {}).get(
                       "value"))),
                   "amount": amount_text(decimal_of((i.get("net") or {}).get("value")))}
                  for i in claim.get("item", [])],
        "total": amount_text(decimal_of(total.get("value"))),
        "submitted_at": claim.get("created")}).model_dump()


claims = Facade(
    resource="Claim", name="Claim", create=ClaimCreate, view=ClaimView, query=ClaimQuery,
    from_fhir=claim_view, scope=OrganizationScope(), sort="-created",
    fixed=(("use", "claim"),),  # not the pre-authorizations (Claims too)
    tags=["billing"], summaries={"list": "List an organization's insurance claims"},
)

# -- routes ---------------------------------------------------------------------------------------
router = APIRouter(tags=["billing"])
ORG = "/api/organizations/{org_id}"


@router.post(ORG + "/payments", status_code=201, response_model=Envelope[PaymentView],
             summary="Record a payment against an invoice (says whether it is now balanced, "
                     "partially paid or overpaid)")
async def record_payment(org_id: str, body: PaymentCreate,
                         ctx: ApiContext = Depends(api_context)) -> Any:
    await payments.enter(ctx)

    async def once() -> JSON:
        invoice = await invoices.load(ctx, body.invoice_id)
        if invoice.get("status") in ("cancelled", "entered-in-error"):
            raise conflict("INVOICE_CANCELLED", "This invoice was cancelled")
        currency = (invoice.get("totalGross") or {}).get("currency")
        if body.currency != currency:
            raise ApiError(422, "VALIDATION_ERROR", f"currency: the invoice is in {currency}",
                           field="currency")
        earlier = [p for p in await _payments_of(ctx, [invoice["id"]])
                   if p.get("status") == "active"]
        paid = _paid_by_invoice(earlier).get(invoice["id"], Decimal(0)) + body.amount
        receipt = len(earlier) + 1
        payment = OrganizationScope().stamp(payment_to_fhir(body, invoice, receipt), org_id)
        unit = ctx.fhir.unit()
        try:
            async with unit:
                staged = await unit.create(payment, expected_type="PaymentReconciliation")
                unit.insert_document(RECEIPTS, f"{invoice['id']}:{receipt}", {
                    "id": f"{invoice['id']}:{receipt}", "payment_id": staged.id})
                if paid >= invoice_total(invoice) and invoice.get("status") == "issued":
                    await unit.update({**invoice, "status": "balanced"},
                                      if_match=int(invoice["meta"]["versionId"]))
                balance = balance_of(invoice, paid)
                unit.emit(PAYMENT_RECORDED, {
                    "payment_id": staged.id, "invoice_id": invoice["id"],
                    "organization_id": org_id, "amount": amount_text(body.amount),
                    "currency": body.currency, "method": body.method, **balance},
                    source_service=SOURCE)
                await unit.commit()
        except DuplicateDocument:  # another payment of this invoice took the receipt
            raise _Retry() from None
        return payment_view(staged_body(staged), invoice, paid)

    return created(await _retrying(once))


class _Retry(Exception):
    """Another payment of the same invoice committed first: count the payments again."""


async def _retrying(once: Any, attempts: int = 5) -> JSON:
    for _attempt in range(attempts):
        try:
            return await until_stable(once)  # type: ignore[no-any-return]
        except _Retry:
            continue
    raise ApiError(409, "CONFLICT", "The invoice kept receiving payments; retry")


@router.post(ORG + "/claims", status_code=201, response_model=Envelope[ClaimView],
             summary="Submit an insurance claim (the patient's coverage found or recorded)")
async def submit_claim(org_id: str, body: ClaimCreate,
                       ctx: ApiContext = Depends(api_context)) -> Any:
    await claims.enter(ctx)
    await require_patient(ctx, body.patient_id)
    coverage = OrganizationScope().stamp(coverage_for(body), org_id)
    identifier = coverage["identifier"][0]
    stored, _created = await ctx.fhir.create(coverage, expected_type="Coverage", if_none_exist=[
        ("identifier", f"{identifier['system']}|{identifier['value']}"),
        ("beneficiary", f"Patient/{body.patient_id}")])
    claim = OrganizationScope().stamp(claim_to_fhir(body, org_id, stored.id), org_id)
    unit = ctx.unit()
    async with unit:
        staged = await unit.create(claim, expected_type="Claim")
        unit.emit(CLAIM_SUBMITTED, {
            "claim_id": staged.id, "organization_id": org_id, "patient_id": body.patient_id,
            "insurer": body.insurer, "coverage_id": stored.id,
            "total": amount_text(sum((_line_total(i.model_dump()) for i in body.items),
                                     Decimal(0))), "currency": body.currency},
            source_service=SOURCE)
        await unit.commit()
    return created(claim_view(staged_body(staged)))


invoices.mount(router, ORG + "/invoices", ops=("list", "create", "get"))
payments.mount(router, ORG + "/payments", ops=("list",))
claims.mount(router, ORG + "/claims", ops=("list",))

