"""Invoices of the revenue cycle (FHIR Invoice): to a patient or a payer, taxes and totals
computed as decimals, the same resources the organization's billing pays and lists."""

from __future__ import annotations

import httpx

from tests.platform_api.clinic import Clinic, refusal
from tests.platform_api.rcm.conftest import data

LINES = [{"description": "Outpatient consultation", "code": "11429006",
          "system": "http://snomed.info/sct", "unit_price": "1500.00"},
         {"description": "Amoxicillin 500 mg", "quantity": 21, "unit_price": "12.35",
          "tax_rate": "0.16"}]


async def issue(clinic: Clinic, who: str = "billing", **extra: object) -> httpx.Response:
    return await clinic.post(who, "/api/rcm/invoices", {
        "organization_id": clinic.org_id, "patient_id": clinic.patient_id,
        "currency": "KES", "line_items": LINES, **extra})


async def test_an_invoice_computes_taxes_and_totals(clinic: Clinic):
    events = clinic.recorded("platform.rcm.invoice_issued")
    invoice = data(await issue(clinic), 201)
    # 1500.00 + 21 x 12.35 = 1759.35 net; 16% of 259.35 = 41.496 → 41.50
    assert (invoice["net"], invoice["tax"], invoice["total"]) == ("1759.35", "41.50",
                                                                  "1800.85")
    assert invoice["bill_to"] == "patient" and invoice["payer"] is None
    assert invoice["organization_id"] == clinic.org_id and invoice["balance"] == "1800.85"
    fhir = (await clinic.get("billing", f"/fhir/Invoice/{invoice['id']}")).json()
    assert fhir["totalNet"] == {"value": 1759.35, "currency": "KES"}
    assert fhir["lineItem"][1]["priceComponent"][1] == {
        "type": "tax", "factor": 0.16, "amount": {"value": 41.5, "currency": "KES"}}
    # the organization's billing pays the same Invoice
    data(await clinic.post("billing", f"/api/organizations/{clinic.org_id}/payments", {
        "invoice_id": invoice["id"], "amount": "1800.85", "currency": "KES"}), 201)
    paid = data(await clinic.get("receptionist", f"/api/rcm/invoices/{invoice['id']}"))
    assert (paid["paid"], paid["payment_status"], paid["status"]) == (
        "1800.85", "balanced", "balanced")
    await clinic.drain()
    assert events[0]["payload"]["total"] == "1800.85"


async def test_an_invoice_to_a_payer_names_it(clinic: Clinic):
    invoice = data(await issue(clinic, bill_to="payer", payer="NHIF"), 201)
    assert invoice["bill_to"] == "payer" and invoice["payer"] == "NHIF"
    missing = await issue(clinic, bill_to="payer")
    assert refusal(missing) == (422, "VALIDATION_ERROR")
    assert missing.json()["error"]["field"] == "payer"


async def test_invoices_are_listed_and_refused_by_role(clinic: Clinic):
    first = data(await issue(clinic), 201)
    assert refusal(await issue(clinic, who="doctor")) == (403, "FORBIDDEN")
    assert refusal(await issue(clinic, who="nurse")) == (403, "FORBIDDEN")
    assert refusal(await issue(clinic, who="other_admin")) == (403, "FORBIDDEN")
    bad = await issue(clinic, line_items=[{"description": "VAT", "unit_price": "10",
                                           "tax_rate": "1.5"}])
    assert bad.json()["error"]["field"] == "line_items.0.tax_rate"
    assert refusal(await issue(clinic, currency="shillings")) == (422, "VALIDATION_ERROR")
    listed = await clinic.get("doctor", "/api/rcm/invoices", patient_id=clinic.patient_id)
    assert [i["id"] for i in listed.json()["data"]] == [first["id"]]
    assert listed.json()["meta"]["total"] == 1
    assert data(await clinic.get("stranger", "/api/rcm/invoices")) == []
    assert refusal(await clinic.get("other_admin", f"/api/rcm/invoices/{first['id']}"))[0] \
        == 403
    assert refusal(await clinic.get("billing", "/api/rcm/invoices/"
                                    "0190a1b2-0000-7000-8000-000000000000")) == (404,
                                                                                 "NOT_FOUND")
