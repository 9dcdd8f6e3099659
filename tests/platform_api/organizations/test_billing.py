"""Invoices (FHIR Invoice) with exact decimal totals, payments (PaymentReconciliation)
that say whether the invoice is balanced, partially paid or overpaid, and insurance
claims (Claim with the patient's Coverage)."""

from __future__ import annotations

import asyncio
from typing import Any

from tests.platform_api.clinic import Clinic, refusal

LINES = [{"description": "Outpatient consultation", "code": "11429006",
          "system": "http://snomed.info/sct", "unit_price": "1500.00"},
         {"description": "Malaria rapid diagnostic test", "quantity": 2,
          "unit_price": "175.25"}]


def url(clinic: Clinic, part: str) -> str:
    return f"/api/organizations/{clinic.org_id}/{part}"


async def issue(clinic: Clinic, who: str = "billing", **extra: Any) -> Any:
    return await clinic.post(who, url(clinic, "invoices"), {
        "patient_id": clinic.patient_id, "currency": "KES", "line_items": LINES, **extra})


async def pay(clinic: Clinic, invoice_id: str, amount: str, who: str = "billing",
              currency: str = "KES") -> Any:
    return await clinic.post(who, url(clinic, "payments"), {
        "invoice_id": invoice_id, "amount": amount, "currency": currency,
        "method": "mobile_money", "reference": "QK7H2M9XPL"})


async def test_an_invoice_totals_its_lines_as_decimals(clinic: Clinic):
    issued = await issue(clinic, note="Paid at the front desk")
    assert issued.status_code == 201, issued.text
    invoice = issued.json()["data"]
    assert invoice["total"] == "1850.50" and invoice["currency"] == "KES"
    assert invoice["paid"] == "0.00" and invoice["payment_status"] == "unpaid"
    assert [(i["quantity"], i["unit_price"], i["amount"]) for i in invoice["line_items"]] == [
        ("1", "1500.00", "1500.00"), ("2", "175.25", "350.50")]
    assert invoice["number"].startswith("INV-")
    fhir = (await clinic.get("billing", f"/fhir/Invoice/{invoice['id']}")).json()
    assert fhir["totalGross"] == {"value": 1850.5, "currency": "KES"}
    assert fhir["subject"]["reference"] == f"Patient/{clinic.patient_id}"
    listed = (await clinic.get("receptionist", url(clinic, "invoices"))).json()
    assert listed["meta"]["total"] == 1
    assert (await clinic.get("admin", url(clinic, "invoices") + "/" + invoice["id"])
            ).json()["data"]["total"] == "1850.50"


async def test_invoices_are_refused_to_the_wrong_people_and_bad_amounts(clinic: Clinic):
    assert refusal(await issue(clinic, who="nurse")) == (403, "FORBIDDEN")
    assert refusal(await issue(clinic, who="other_admin")) == (403, "FORBIDDEN")
    negative = await clinic.post("billing", url(clinic, "invoices"), {
        "patient_id": clinic.patient_id, "currency": "KES",
        "line_items": [{"description": "Refund", "unit_price": "-5"}]})
    assert refusal(negative) == (422, "VALIDATION_ERROR")
    assert negative.json()["error"]["field"] == "line_items.0.unit_price"
    assert refusal(await clinic.post("billing", url(clinic, "invoices"), {
        "patient_id": clinic.patient_id, "currency": "shillings", "line_items": LINES})) == (
        422, "VALIDATION_ERROR")
    assert refusal(await clinic.post("billing", url(clinic, "invoices"), {
        "patient_id": "nobody", "currency": "KES", "line_items": LINES})) == (404, "NOT_FOUND")


async def test_payments_say_whether_the_invoice_is_partly_paid_balanced_or_overpaid(
        clinic: Clinic):
    events = clinic.recorded("platform.billing.payment_recorded")
    invoice = (await issue(clinic)).json()["data"]
    first = await pay(clinic, invoice["id"], "1000.50")
    assert first.status_code == 201, first.text
    assert first.json()["data"]["invoice"] == {"total": "1850.50", "paid": "1000.50",
                                              "balance": "850.00",
                                              "payment_status": "partially_paid"}
    assert first.json()["data"]["receipt"] == "1"
    second = (await pay(clinic, invoice["id"], "850")).json()["data"]
    assert second["invoice"]["payment_status"] == "balanced" and second["receipt"] == "2"
    fhir = (await clinic.get("billing", f"/fhir/Invoice/{invoice['id']}")).json()
    assert fhir["status"] == "balanced"
    third = (await pay(clinic, invoice["id"], "100")).json()["data"]
    assert third["invoice"]["payment_status"] == "overpaid"
    assert third["invoice"]["balance"] == "-100.00"
    listed = (await clinic.get("billing", url(clinic, "payments"), invoice_id=invoice["id"])
              ).json()
    assert listed["meta"]["total"] == 3
    assert {p["method"] for p in listed["data"]} == {"mobile_money"}
    reconciliation = (await clinic.get("billing", f"/fhir/PaymentReconciliation/"
                                                  f"{second['id']}")).json()
    assert reconciliation["detail"][0]["request"]["reference"] == f"Invoice/{invoice['id']}"
    assert reconciliation["paymentAmount"] == {"value": 850, "currency": "KES"}
    await clinic.drain()
    assert [e["payload"]["payment_status"] for e in events] == [
        "partially_paid", "balanced", "overpaid"]


async def test_two_payments_at_once_both_count(clinic: Clinic):
    invoice = (await issue(clinic)).json()["data"]
    answers = await asyncio.gather(pay(clinic, invoice["id"], "925.25"),
                                   pay(clinic, invoice["id"], "925.25", who="admin"))
    assert [a.status_code for a in answers] == [201, 201]
    assert sorted(a.json()["data"]["receipt"] for a in answers) == ["1", "2"]
    shown = (await clinic.get("billing", url(clinic, "invoices") + "/" + invoice["id"])
             ).json()["data"]
    assert shown["payment_status"] == "balanced" and shown["status"] == "balanced"


async def test_payments_are_refused_for_the_wrong_invoice_currency_or_person(clinic: Clinic):
    invoice = (await issue(clinic)).json()["data"]
    wrong = await pay(clinic, invoice["id"], "10", currency="UGX")
    assert refusal(wrong) == (422, "VALIDATION_ERROR") and wrong.json()["error"]["field"] == \
        "currency"
    assert refusal(await pay(clinic, invoice["id"], "0")) == (422, "VALIDATION_ERROR")
    assert refusal(await pay(clinic, "no-such-invoice", "10")) == (404, "NOT_FOUND")
    assert refusal(await pay(clinic, invoice["id"], "10", who="nurse")) == (403, "FORBIDDEN")
    assert refusal(await pay(clinic, invoice["id"], "10", who="stranger")) == (403, "FORBIDDEN")


async def submit(clinic: Clinic, who: str = "billing", **extra: Any) -> Any:
    return await clinic.post(who, url(clinic, "claims"), {
        "patient_id": clinic.patient_id, "insurer": "NHIF", "policy_number": "NHIF-2231-8890",
        "currency": "KES", "diagnoses": ["B50.9", "D64.9"],
        "items": [{"description": "Inpatient day", "quantity": 3, "unit_price": "4500"}],
        **extra})


async def test_a_claim_is_submitted_with_the_patients_coverage(clinic: Clinic):
    submitted = await submit(clinic)
    assert submitted.status_code == 201, submitted.text
    claim = submitted.json()["data"]
    assert claim["status"] == "active" and claim["total"] == "13500.00"
    assert claim["diagnoses"] == ["B50.9", "D64.9"] and claim["insurer"] == "NHIF"
    fhir = (await clinic.get("billing", f"/fhir/Claim/{claim['id']}")).json()
    assert fhir["use"] == "claim" and fhir["provider"]["reference"] == \
        f"Organization/{clinic.org_id}"
    coverage = (await clinic.get("billing", f"/fhir/Coverage/{claim['coverage_id']}")).json()
    assert coverage["subscriberId"] == "NHIF-2231-8890"
    again = (await submit(clinic)).json()["data"]
    assert again["coverage_id"] == claim["coverage_id"]  # the same policy, one Coverage
    listed = (await clinic.get("doctor", url(clinic, "claims"), patient_id=clinic.patient_id)
              ).json()
    assert listed["meta"]["total"] == 2


async def test_claims_are_refused_to_the_wrong_people_and_codes(clinic: Clinic):
    assert refusal(await submit(clinic, who="doctor")) == (403, "FORBIDDEN")
    assert refusal(await submit(clinic, who="stranger")) == (403, "FORBIDDEN")
    bad = await submit(clinic, diagnoses=["malaria"])
    assert refusal(bad) == (422, "VALIDATION_ERROR")
    assert bad.json()["error"]["field"] == "diagnoses.0"
    await submit(clinic)
    # A nurse's role has no financial rights: the list holds nothing for them (a claim in
    # their own patient record, had they one, would show).
    hidden = (await clinic.get("nurse", url(clinic, "claims"))).json()
    assert hidden["data"] == [] and hidden["meta"]["total"] == 0
