"""Invoices of the revenue cycle: FHIR **Invoice** for a patient or for a payer, with line
items, taxes and totals computed here, listed across the organizations the caller bills
for. The shape is the organizations' billing one (:mod:`platform_api.organizations.
billing`), so an invoice issued here is paid and listed there:

    organization_id → issuer (Organization/<id>) and the owner label
    patient_id → subject (Patient/<id>); bill_to payer: payer → recipient (display)
    currency → every Money
    line_items[] → lineItem[] (chargeItemCodeableConcept; priceComponent base: factor =
                   quantity, amount = quantity x unit price; priceComponent tax: factor =
                   tax_rate, amount = base x rate, rounded half-even to cents)
    net → totalNet (the bases); total → totalGross (bases + taxes)
    number (generated) → identifier; note → note[0].text; issued_at → date
    paid, balance, payment_status ← the PaymentReconciliations naming the invoice

Who: ``ORG:ADMIN``, ``ORG:BILLING`` issue; ``ORG:DOCTOR``, ``ORG:RECEPTIONIST`` read; a
patient reads their own. Event: ``platform.rcm.invoice_issued``.
"""

from __future__ import annotations

import uuid
from decimal import ROUND_HALF_EVEN, Decimal
from typing import Annotated, Any, Literal

from fastapi import APIRouter
from pydantic import BaseModel, Field

from fhir_server.clock import now_instant
from fhir_server.ownership import OWNER_SYSTEM, with_owners
from platform_api.envelope import ApiError
from platform_api.facade import (
    ApiContext,
    Events,
    Facade,
    SearchParam,
    require_organization,
    require_patient,
)
from platform_api.fhir_values import CENT, amount_text, decimal_of, local_id, money
from platform_api.organizations.billing import (
    Currency,
    InvoiceView,
    LineItem,
    invoice_view,
    invoice_views,
    organization_identifier_system,
)

JSON = dict[str, Any]
INVOICE_ISSUED = "platform.rcm.invoice_issued"


class TaxedLineItem(LineItem):
    tax_rate: Annotated[Decimal, Field(ge=0, le=1, max_digits=6, decimal_places=4)] = Field(
        default=Decimal(0), examples=["0.16"], description="e.g. 0.16 for 16% VAT")


class RcmInvoiceCreate(BaseModel):
    organization_id: str = Field(min_length=1, max_length=64)
    patient_id: str = Field(min_length=1, max_length=64)
    bill_to: Literal["patient", "payer"] = "patient"
    payer: str | None = Field(default=None, min_length=1, max_length=200,
                              examples=["NHIF"], description="Required when bill_to is "
                              "payer")
    currency: Currency
    line_items: list[TaxedLineItem] = Field(min_length=1, max_length=200)
    note: str | None = Field(default=None, max_length=2000)


class RcmInvoiceView(InvoiceView):
    organization_id: str | None
    bill_to: str
    payer: str | None
    net: str
    tax: str


class RcmInvoiceQuery(BaseModel):
    patient_id: Annotated[str | None, SearchParam("subject", "Patient/{}")] = Field(
        None, max_length=64)
    organization_id: Annotated[str | None, SearchParam("_security", OWNER_SYSTEM + "|{}")] = \
        Field(None, max_length=64)
    status: Annotated[Literal["issued", "balanced", "cancelled"] | None,
                      SearchParam("status")] = None


def _cents(amount: Decimal) -> Decimal:
    return amount.quantize(CENT, ROUND_HALF_EVEN)


def invoice_to_fhir(payload: JSON, ctx: ApiContext, existing: JSON | None) -> JSON:
    org_id, currency = payload["organization_id"], payload["currency"]
    lines, net, tax = [], Decimal(0), Decimal(0)
    for n, item in enumerate(payload["line_items"], 1):
        quantity = Decimal(str(item.get("quantity", 1)))
        base = _cents(quantity * Decimal(str(item["unit_price"])))
        rate = Decimal(str(item.get("tax_rate", 0)))
        line_tax = _cents(base * rate)
        net, tax = net + base, tax + line_tax
        components = [{"type": "base", "factor": float(quantity),
                       "amount": money(base, currency)}]
        if rate:
            components.append({"type": "tax", "factor": float(rate),
                               "amount": money(line_tax, currency)})
        concept: JSON = {"text": item["description"]}
        if item.get("code"):
            concept["coding"] = [{k: v for k, v in (("system", item.get("system")),
                                                   ("code", item["code"]),
                                                   ("display", item["description"])) if v}]
        lines.append({"sequence": n, "chargeItemCodeableConcept": concept,
                      "priceComponent": components})
    invoice: JSON = {
        "resourceType": "Invoice", "status": "issued", "date": now_instant(),
        "identifier": [{"system": organization_identifier_system(org_id, "invoice"),
                        "value": f"INV-{uuid.uuid4().hex[:10].upper()}"}],
        "subject": {"reference": f"Patient/{payload['patient_id']}"},
        "issuer": {"reference": f"Organization/{org_id}"},
        "lineItem": lines, "totalNet": money(net, currency),
        "totalGross": money(net + tax, currency)}
    if payload.get("bill_to") == "payer":
        invoice["recipient"] = {"display": payload["payer"]}
    else:
        invoice["recipient"] = {"reference": f"Patient/{payload['patient_id']}"}
    if payload.get("note"):
        invoice["note"] = [{"text": payload["note"]}]
    return with_owners(invoice, {org_id})


def _extra(invoice: JSON) -> JSON:
    net = decimal_of((invoice.get("totalNet") or {}).get("value"))
    gross = decimal_of((invoice.get("totalGross") or {}).get("value"))
    recipient = invoice.get("recipient") or {}
    to_payer = not str(recipient.get("reference") or "").startswith("Patient/")
    return {"organization_id": local_id(invoice.get("issuer"), "Organization"),
            "bill_to": "payer" if to_payer and recipient else "patient",
            "payer": recipient.get("display") if to_payer else None,
            "net": amount_text(net), "tax": amount_text(gross - net)}


async def rcm_invoice_views(ctx: ApiContext, invoices: list[JSON]) -> list[JSON]:
    views = await invoice_views(ctx, invoices)
    return [RcmInvoiceView.model_validate({**v, **_extra(i)}).model_dump()
            for v, i in zip(views, invoices, strict=True)]


def rcm_invoice_view(invoice: JSON) -> JSON:
    return RcmInvoiceView.model_validate({**invoice_view(invoice), **_extra(invoice)}
                                         ).model_dump()


async def _prepare(ctx: ApiContext, payload: JSON) -> JSON:
    await require_organization(ctx, payload["organization_id"])
    await require_patient(ctx, payload["patient_id"])
    if payload.get("bill_to") == "payer" and not payload.get("payer"):
        raise ApiError(422, "VALIDATION_ERROR", "payer: name the payer the invoice is for",
                       field="payer")
    return payload


invoices = Facade(
    resource="Invoice", name="Invoice", create=RcmInvoiceCreate, view=RcmInvoiceView,
    query=RcmInvoiceQuery, to_fhir=invoice_to_fhir, from_fhir=rcm_invoice_view,
    views=rcm_invoice_views, prepare=_prepare, sort="-date", tags=["rcm"],
    events=Events(created=INVOICE_ISSUED, payload=lambda i: {
        "invoice_id": i["id"], **_extra(i), "patient_id": local_id(i.get("subject"),
                                                                   "Patient"),
        "total": amount_text(decimal_of((i.get("totalGross") or {}).get("value"))),
        "currency": (i.get("totalGross") or {}).get("currency")}),
    summaries={"list": "List the invoices you may see (patient, organization, status)",
               "create": "Issue an invoice to a patient or a payer (taxes and totals "
                         "computed as decimals)",
               "get": "An invoice with what was paid"},
)
router = APIRouter(tags=["rcm"])
invoices.mount(router, "/api/rcm/invoices", ops=("list", "create", "get"))
