"""The revenue cycle's reports: analytics by insurer and by provider, payments reconciled
with claims and invoices, and fraud flags from explainable rules."""

from __future__ import annotations

from datetime import date
from typing import Any

from tests.platform_api.clinic import Clinic, refusal
from tests.platform_api.rcm.conftest import data, draft
from tests.platform_api.rcm.payer_standin import PayerStandIn

Payer = tuple[PayerStandIn, str]
TODAY = date.today().isoformat()


async def submitted(clinic: Clinic, payer: Payer, decision: str, **extra: Any) -> Any:
    payer[0].decision = decision
    claim = data(await draft(clinic, **extra), 201)
    return data(await clinic.post("billing", f"/api/rcm/claims/{claim['id']}/submit"))


async def record_payment(clinic: Clinic, target: str, amount: float, who: str = "billing"
                         ) -> str:
    response = await clinic.post(who, "/fhir/PaymentReconciliation", {
        "resourceType": "PaymentReconciliation", "status": "active",
        "created": f"{TODAY}T10:00:00Z", "paymentDate": TODAY, "outcome": "complete",
        "paymentAmount": {"value": amount, "currency": "KES"},
        "paymentIdentifier": {"value": "EFT-" + target.replace("/", "-")},
        "detail": [{"type": {"coding": [{"code": "payment"}]},
                    "request": {"reference": target}, "date": TODAY,
                    "amount": {"value": amount, "currency": "KES"}}]})
    assert response.status_code == 201, response.text
    return str(response.json()["id"])


async def test_analytics_by_insurer_and_provider(clinic: Clinic, payer: Payer):
    payer[0].pay_after_days = 3
    await submitted(clinic, payer, "approve")
    await submitted(clinic, payer, "reject")
    await submitted(clinic, payer, "partial", insurer="Jubilee Insurance")
    data(await draft(clinic), 201)  # a draft is not counted
    report = data(await clinic.get("billing", "/api/rcm/claims/analytics/by-insurer",
                                   **{"from": TODAY, "to": TODAY}))
    groups = {g["key"]: g for g in report["groups"]}
    nhif, jubilee = groups["NHIF"], groups["Jubilee Insurance"]
    assert (nhif["claims"], nhif["billed"], nhif["approved"], nhif["paid"]) == (
        2, "3701.00", "1850.50", "1850.50")
    assert (nhif["approval_rate"], nhif["rejection_rate"]) == (0.5, 0.5)
    assert nhif["mean_days_to_payment"] == 3.0 and nhif["currency"] == "KES"
    assert (jubilee["claims"], jubilee["approved"], jubilee["approval_rate"]) == (
        1, "1110.30", 1.0)
    by_provider = data(await clinic.get("admin", "/api/rcm/claims/analytics/by-provider"))
    [provider] = by_provider["groups"]
    assert provider["key"] == clinic.org_id and provider["name"] == "Kibera Community Clinic"
    assert (provider["claims"], provider["billed"], provider["paid"]) == (
        3, "5551.50", "2960.80")
    # another period, another organization's view
    empty = data(await clinic.get("billing", "/api/rcm/claims/analytics/by-insurer",
                                  **{"from": "2020-01-01", "to": "2020-12-31"}))
    assert empty["groups"] == []
    assert data(await clinic.get("other_admin", "/api/rcm/claims/analytics/by-insurer")
                )["groups"] == []
    assert refusal(await clinic.get("other_admin", "/api/rcm/claims/analytics/by-insurer",
                                    organization_id=clinic.org_id)) == (403, "FORBIDDEN")
    backwards = await clinic.get("billing", "/api/rcm/claims/analytics/by-provider",
                                 **{"from": "2026-02-01", "to": "2026-01-01"})
    assert refusal(backwards) == (422, "VALIDATION_ERROR")


async def test_reconciliation_lists_short_paid_unpaid_and_unmatched(clinic: Clinic,
                                                                    payer: Payer):
    paid = await submitted(clinic, payer, "approve")
    queued = await submitted(clinic, payer, "queue")
    rejected = await submitted(clinic, payer, "reject")
    await record_payment(clinic, f"Claim/{queued['id']}", 1000)
    stray = await record_payment(clinic, "Claim/0190a1b2-0000-7000-8000-00000000dead", 420)
    invoice = data(await clinic.post("billing", "/api/rcm/invoices", {
        "organization_id": clinic.org_id, "patient_id": clinic.patient_id,
        "currency": "KES", "line_items": [{"description": "Pharmacy", "unit_price": "1000",
                                           "tax_rate": "0.16"}]}), 201)
    data(await clinic.post("billing", f"/api/organizations/{clinic.org_id}/payments", {
        "invoice_id": invoice["id"], "amount": "1000.00", "currency": "KES"}), 201)
    report = data(await clinic.get("billing", "/api/rcm/claims/reconciliation"))
    claims = {c["claim_id"]: c for c in report["claims"]}
    assert claims[paid["id"]]["result"] == "matched"
    assert claims[paid["id"]]["payments"][0]["source"].startswith("ClaimResponse/")
    assert (claims[queued["id"]]["result"], claims[queued["id"]]["difference"]) == (
        "short_paid", "850.50")
    assert claims[rejected["id"]]["expected"] == "0.00"
    [invoiced] = report["invoices"]
    assert (invoiced["total"], invoiced["paid"], invoiced["result"]) == (
        "1160.00", "1000.00", "short_paid")
    assert [p["source"] for p in report["unmatched_payments"]] == [
        f"PaymentReconciliation/{stray}"]
    assert report["short_paid"] == 2
    assert data(await clinic.get("other_admin", "/api/rcm/claims/reconciliation"))[
        "claims"] == []


async def _patient(clinic: Clinic, **fields: Any) -> str:
    body = {"first_name": "Juma", "last_name": "Hamisi", "date_of_birth": "1950-03-03",
            "gender": "male", "mrn": "KCC-0950", **fields}
    return str(data(await clinic.post("admin", f"/api/organizations/{clinic.org_id}/patients",
                                      body), 201)["id"])


async def test_fraud_flags_name_their_rule_and_evidence(clinic: Clinic):
    elder = await _patient(clinic)
    patient = (await clinic.get("admin", f"/fhir/Patient/{elder}")).json()
    patient["deceasedDateTime"] = "2026-06-01T10:00:00Z"
    updated = await clinic.client.put(f"/fhir/Patient/{elder}", json=patient,
                                      headers=clinic.h("admin"))
    assert updated.status_code == 200, updated.text
    duplicate = data(await draft(clinic), 201)
    data(await draft(clinic), 201)  # the same consultation again, same day
    after_death = data(await draft(clinic, patient_id=elder, diagnoses=["O80"]), 201)
    before_birth = data(await draft(clinic, service_date="1980-01-01",
                                    diagnoses=["N40.0"]), 201)
    too_many = data(await draft(clinic, service_date="2026-11-18", items=[
        {"description": "Paracetamol 500 mg", "code": "PARA-500", "quantity": 500,
         "unit_price": "5"}]), 201)
    prices = ["1400", "1500", "1550", "1600", "1450", "9000"]
    outlier: dict[str, Any] = {}
    for n, price in enumerate(prices):
        claim = data(await draft(clinic, service_date=f"2026-10-{n + 1:02d}", items=[
            {"description": "Ultrasound", "code": "US-ABD", "unit_price": price}]), 201)
        outlier = claim
    cancelled = data(await draft(clinic, service_date="2026-10-01", items=[
        {"description": "Ultrasound", "code": "US-ABD", "unit_price": "1400"}]), 201)
    await clinic.client.put(f"/api/rcm/claims/{cancelled['id']}", json={
        "status": "cancelled"}, headers=clinic.h("billing"))
    response = await clinic.get("billing", "/api/rcm/claims/fraud-flags", limit=100)
    flags = response.json()["data"]
    by_rule: dict[str, list[dict[str, Any]]] = {}
    for flag in flags:
        by_rule.setdefault(flag["rule"], []).append(flag)
    assert {f["claim_id"] for f in by_rule["duplicate_claim"]} >= {duplicate["id"]}
    assert duplicate["id"] in by_rule["duplicate_claim"][0]["evidence"]["other_claims"] + [
        by_rule["duplicate_claim"][0]["claim_id"]]
    [dead] = by_rule["service_after_death"]
    assert dead["claim_id"] == after_death["id"] and dead["evidence"]["deceased"] == \
        "2026-06-01"
    assert [f["claim_id"] for f in by_rule["service_before_birth"]] == [before_birth["id"]]
    assert [f["claim_id"] for f in by_rule["impossible_quantity"]] == [too_many["id"]]
    sexes = {(f["claim_id"], f["evidence"]["diagnosis"]) for f in by_rule["sex_inconsistent"]}
    assert sexes == {(after_death["id"], "O80"), (before_birth["id"], "N40.0")}
    [aged] = by_rule["age_inconsistent"]
    assert aged["claim_id"] == after_death["id"] and aged["evidence"]["patient_age"] == 76
    [priced] = by_rule["billed_amount_outlier"]
    assert priced["claim_id"] == outlier["id"] and priced["evidence"]["median"] == "1525.00"
    assert priced["evidence"]["z_score"] > 3.5 and priced["evidence"]["prices"] == 6
    assert "modified z-score" in priced["explanation"]
    assert cancelled["id"] not in {f["claim_id"] for f in flags}
    assert response.json()["meta"]["total"] == len(flags)
    one_rule = await clinic.get("billing", "/api/rcm/claims/fraud-flags",
                                rule="impossible_quantity")
    assert one_rule.json()["meta"]["total"] == 1
    assert refusal(await clinic.get("billing", "/api/rcm/claims/fraud-flags",
                                    rule="astrology")) == (422, "VALIDATION_ERROR")
    assert data(await clinic.get("other_admin", "/api/rcm/claims/fraud-flags")) == []


async def test_a_period_too_large_to_read_whole_is_refused(clinic: Clinic, monkeypatch):
    from platform_api.rcm import ledger

    for _ in range(2):
        data(await draft(clinic), 201)
    monkeypatch.setattr(ledger, "MAX_SEARCH_RESULTS", 2)
    for report in ("analytics/by-insurer", "fraud-flags", "reconciliation"):
        refused = await clinic.get("billing", f"/api/rcm/claims/{report}")
        assert refusal(refused) == (422, "PERIOD_TOO_LARGE"), report
        assert refused.json()["error"]["field"] == "from"
    assert data(await clinic.get("billing", "/api/rcm/claims/analytics/by-insurer",
                                 **{"from": "2030-01-01"}))["groups"] == []
