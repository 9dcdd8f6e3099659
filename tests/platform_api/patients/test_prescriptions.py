"""Prescriptions: a draft MedicationRequest with a structured sig, signed by a doctor after
the prescription checks (drug interactions) run, cancelled through the status table."""

from __future__ import annotations

import pytest

from platform_api import prescription_checks

AMOXICILLIN = {"medication": "Amoxicillin 500 mg oral capsule", "rxcui": "308182",
               "dosage": "500 mg", "frequency": "three times daily", "duration": "7 days",
               "instructions": "Take after meals; finish the course", "quantity": 21,
               "quantity_unit": "capsule", "refills": 1}
# Real medicines of decision support's vocabulary (RxNorm clinical drugs).
WARFARIN = {"medication": "Warfarin Sodium 5 MG Oral Tablet", "rxcui": "855332",
            "dosage": "5 mg", "frequency": "once daily", "duration": "30 days"}
IBUPROFEN = {"medication": "Ibuprofen 400 MG Oral Tablet", "rxcui": "197805",
             "dosage": "400 mg", "frequency": "three times daily", "duration": "5 days"}
NAPROXEN = {"medication": "Naproxen 250 mg tablet", "rxcui": "7258", "dosage": "250 mg",
            "frequency": "twice daily", "duration": "5 days"}
PARACETAMOL = {"medication": "Paracetamol 500 mg tablet", "rxcui": "161",
               "dosage": "500 mg", "frequency": "four times daily", "duration": "3 days"}
async def prescribe(clinic, who=None, **changes):
    response = await clinic.client.post("/api/prescriptions", json={
        "patient_id": clinic.patient_id, **AMOXICILLIN, **changes},
        headers=(who or clinic.doctor)["headers"])
    assert response.status_code == 201, response.text
    return response.json()["data"]


async def signed(clinic, medicine: dict, **body) -> dict:
    created = await prescribe(clinic, **medicine)
    response = await clinic.client.post(f"/api/prescriptions/{created['id']}/sign",
                                        json=body, headers=clinic.doctor["headers"])
    assert response.status_code == 200, response.text
    return response.json()["data"]


async def sign(clinic, medicine: dict, **body):
    created = await prescribe(clinic, **medicine)
    response = await clinic.client.post(f"/api/prescriptions/{created['id']}/sign",
                                        json=body, headers=clinic.doctor["headers"])
    return created, response


async def test_the_started_app_registers_decision_supports_checks(clinic):
    """Signing runs the checks of decision support, wired at start-up: not a test's."""
    from platform_api import cds_prescribing
    assert prescription_checks.checks, "no prescription check is registered"
    assert set(cds_prescribing.CHECKS) <= set(prescription_checks.checks)


async def test_a_prescription_is_a_draft_medication_request_with_a_structured_sig(clinic):
    created = await prescribe(clinic)
    assert created["status"] == "draft" and created["signed_by"] is None
    assert {k: created[k] for k in ("dosage", "frequency", "duration", "instructions",
                                    "rxcui", "refills")} == {
        "dosage": "500 mg", "frequency": "three times daily", "duration": "7 days",
        "instructions": AMOXICILLIN["instructions"], "rxcui": "308182", "refills": 1}
    fhir = (await clinic.fhir(f"MedicationRequest/{created['id']}")).json()
    assert fhir["medicationCodeableConcept"]["coding"][0] == {
        "system": "http://www.nlm.nih.gov/research/umls/rxnorm", "code": "308182",
        "display": AMOXICILLIN["medication"]}
    dosage = fhir["dosageInstruction"][0]
    assert dosage["doseAndRate"][0]["doseQuantity"] == {
        "value": 500, "unit": "mg", "system": "http://unitsofmeasure.org", "code": "mg"}
    assert dosage["timing"]["code"]["coding"][0]["code"] == "TID"
    assert dosage["timing"]["repeat"] == {
        "frequency": 3, "period": 1, "periodUnit": "d", "boundsDuration": {
            "value": 7, "unit": "days", "system": "http://unitsofmeasure.org", "code": "d"}}
    assert dosage["patientInstruction"] == AMOXICILLIN["instructions"]
    assert fhir["dispenseRequest"]["numberOfRepeatsAllowed"] == 1
    events = await clinic.events("platform.prescription.created")
    assert [(e["prescription_id"], e["rxcui"], e["status"]) for e in events] == [
        (created["id"], "308182", "draft")]


async def test_a_doctor_signs_and_the_signature_is_recorded(clinic):
    created = await prescribe(clinic, who=clinic.nurse)  # a nurse may draft
    url = f"/api/prescriptions/{created['id']}/sign"
    refused = await clinic.client.post(url, json={}, headers=clinic.nurse["headers"])
    assert refused.status_code == 403
    signed = await clinic.client.post(url, json={}, headers=clinic.doctor["headers"])
    assert signed.status_code == 200, signed.text
    data = signed.json()["data"]
    assert (data["status"], data["signed_by"], data["recorded_by"]) == (
        "active", clinic.doctor["user"]["id"], clinic.nurse["user"]["id"])
    assert data["signed_at"] is not None and data["findings"] == []
    provenance = (await clinic.fhir(f"Provenance?target=MedicationRequest/{created['id']}"
                                    )).json()["entry"][0]["resource"]
    assert provenance["target"] == [
        {"reference": f"MedicationRequest/{created['id']}/_history/2"}]
    assert provenance["signature"][0]["type"][0]["code"] == "1.2.840.10065.1.12.1.1"
    again = await clinic.client.post(url, json={}, headers=clinic.doctor["headers"])
    assert again.status_code == 409 and again.json()["error"]["code"] == "INVALID_TRANSITION"
    signed_events = await clinic.events("platform.prescription.signed")
    assert [e["prescription_id"] for e in signed_events] == [created["id"]]


async def test_warfarin_then_ibuprofen_is_refused_unless_overridden(clinic):
    await signed(clinic, WARFARIN)
    created, refused = await sign(clinic, IBUPROFEN)
    assert refused.status_code == 409, refused.text
    error = refused.json()["error"]
    assert error["code"] == "DRUG_INTERACTION" and "bleeding" in error["message"].lower()
    [finding] = error["details"]
    assert (finding["kind"], finding["severity"]) == ("interaction", "high")
    assert set(finding["drugs"]) == {IBUPROFEN["medication"], WARFARIN["medication"]}
    still = (await clinic.client.get(f"/api/prescriptions/{created['id']}",
                                     headers=clinic.doctor["headers"])).json()["data"]
    assert still["status"] == "draft"
    reason = "Short course; INR checked on day 3"
    overridden = await clinic.client.post(
        f"/api/prescriptions/{created['id']}/sign", json={"override_reason": reason},
        headers=clinic.doctor["headers"])
    assert overridden.status_code == 200, overridden.text
    data = overridden.json()["data"]
    assert data["status"] == "active" and data["override_reason"] == reason
    assert [(f["kind"], f["severity"]) for f in data["findings"]] == [("interaction", "high")]
    issue = (await clinic.fhir(f"DetectedIssue?implicated=MedicationRequest/{created['id']}"
                               )).json()["entry"][0]["resource"]
    assert (issue["severity"], issue["code"]["coding"][0]["code"]) == ("high", "DRG")
    assert any(m["action"]["text"] == f"Prescriber override: {reason}"
               for m in issue["mitigation"])
    events = await clinic.events("platform.prescription.signed")
    assert events[-1]["overridden"] is True


async def test_paracetamol_with_amoxicillin_is_signed_without_findings(clinic):
    await signed(clinic, PARACETAMOL)
    data = await signed(clinic, {})  # amoxicillin
    assert data["status"] == "active" and data["findings"] == []


async def test_an_allergy_and_a_duplicate_refuse_the_sign(clinic):
    allergy = {"resourceType": "AllergyIntolerance",
               "patient": {"reference": f"Patient/{clinic.patient_id}"},
               "clinicalStatus": {"coding": [{
                   "system": "http://terminology.hl7.org/CodeSystem/allergyintolerance-clinical",
                   "code": "active"}]},
               "criticality": "high", "code": {"text": "Penicillin"}}
    stored = await clinic.client.post("/fhir/AllergyIntolerance", json=allergy, headers={
        **clinic.doctor["headers"], "Content-Type": "application/fhir+json"})
    assert stored.status_code == 201, stored.text
    _created, refused = await sign(clinic, {})  # amoxicillin: a penicillin
    assert refused.status_code == 409
    [finding] = refused.json()["error"]["details"]
    assert (finding["kind"], finding["severity"]) == ("allergy", "critical")
    await signed(clinic, WARFARIN)
    created, again = await sign(clinic, WARFARIN)
    assert again.status_code == 409
    assert [f["kind"] for f in again.json()["error"]["details"]] == ["duplicate-therapy"]
    await clinic.client.post(f"/api/prescriptions/{created['id']}/sign",
                             json={"override_reason": "dose split"},
                             headers=clinic.doctor["headers"])
    issue = (await clinic.fhir(f"DetectedIssue?implicated=MedicationRequest/{created['id']}"
                               )).json()["entry"][0]["resource"]
    assert issue["code"]["coding"][0]["code"] == "DUPTHPY"


async def test_moderate_findings_do_not_refuse_and_a_failing_check_must_be_overridden(
        clinic):
    await signed(clinic, IBUPROFEN)
    data = await signed(clinic, NAPROXEN)  # NSAID duplication: moderate
    assert [(f["kind"], f["severity"]) for f in data["findings"]] == [
        ("interaction", "moderate")]
    # A stored interaction entry that cannot be read: the interaction check fails.
    broken = {"resourceType": "PlanDefinition", "status": "active",
              "identifier": [{"system": "urn:healthplatform:drug-interaction",
                              "value": "broken-entry"}]}
    stored = await clinic.client.post("/fhir/PlanDefinition", json=broken, headers={
        **clinic.admin["headers"], "Content-Type": "application/fhir+json"})
    assert stored.status_code == 201, stored.text
    _created, refused = await sign(clinic, PARACETAMOL)
    assert refused.status_code == 409
    assert "could not run" in refused.json()["error"]["message"]


async def test_cancel_only_while_not_completed(clinic):
    draft = await prescribe(clinic)
    cancelled = await clinic.client.post(f"/api/prescriptions/{draft['id']}/cancel",
                                         headers=clinic.doctor["headers"])
    assert cancelled.status_code == 200 and cancelled.json()["data"]["status"] == "cancelled"
    again = await clinic.client.post(f"/api/prescriptions/{draft['id']}/cancel",
                                     headers=clinic.doctor["headers"])
    assert again.status_code == 409 and again.json()["error"]["code"] == "INVALID_TRANSITION"
    done = await prescribe(clinic)
    fhir = (await clinic.fhir(f"MedicationRequest/{done['id']}")).json()
    await clinic.client.put(f"/fhir/MedicationRequest/{done['id']}",
                            json={**fhir, "status": "completed"},
                            headers={**clinic.admin["headers"],
                                     "Content-Type": "application/fhir+json"})
    refused = await clinic.client.post(f"/api/prescriptions/{done['id']}/cancel",
                                       headers=clinic.doctor["headers"])
    assert refused.status_code == 409


async def test_sigs_are_validated_naming_the_field(clinic):
    for field, value in (("dosage", "a little"), ("duration", "until better"),
                         ("rxcui", "amoxil")):
        response = await clinic.client.post("/api/prescriptions", json={
            "patient_id": clinic.patient_id, **AMOXICILLIN, field: value},
            headers=clinic.doctor["headers"])
        assert response.status_code == 422, field
        assert response.json()["error"]["field"] == field
    missing = {k: v for k, v in AMOXICILLIN.items() if k != "instructions"}
    response = await clinic.client.post("/api/prescriptions", json={
        "patient_id": clinic.patient_id, **missing}, headers=clinic.doctor["headers"])
    assert response.status_code == 422 and response.json()["error"]["field"] == "instructions"
    ranged = await prescribe(clinic, dosage="1-2 tablets", frequency="prn",
                             duration="ongoing")
    assert (ranged["dosage"], ranged["duration"]) == ("1-2 tablets", "ongoing")


async def test_lists_and_access(clinic):
    created = await prescribe(clinic)
    mine = (await clinic.client.get("/api/prescriptions", headers=clinic.doctor["headers"])
            ).json()
    assert [p["id"] for p in mine["data"]] == [created["id"]]
    own = (await clinic.client.get("/api/prescriptions", headers=clinic.patient["headers"])
           ).json()
    assert own["meta"]["total"] == 1
    drafts = (await clinic.client.get(f"/api/prescriptions?patient_id={clinic.patient_id}"
                                      "&status=active", headers=clinic.doctor["headers"])
              ).json()
    assert drafts["meta"]["total"] == 0
    url = f"/api/prescriptions/{created['id']}"
    assert (await clinic.client.get(url, headers=clinic.patient["headers"])).status_code == 200
    assert (await clinic.client.post("/api/prescriptions", json={
        "patient_id": clinic.patient_id, **AMOXICILLIN}, headers=clinic.patient["headers"])
            ).status_code == 403
    assert (await clinic.client.post(f"{url}/cancel", headers=clinic.patient["headers"])
            ).status_code == 403
    assert (await clinic.client.get(url, headers=clinic.outsider["headers"])).status_code == 403
    assert (await clinic.client.post(f"{url}/sign", json={}, headers=clinic.outsider[
        "headers"])).status_code == 403
    assert (await clinic.client.get("/api/prescriptions/unknown", headers=clinic.doctor[
        "headers"])).status_code == 404


@pytest.mark.parametrize(("who", "status", "code"), [
    ("doctor", 200, None), ("admin", 403, "FORBIDDEN"), ("nurse", 403, "FORBIDDEN"),
    ("outsider", 403, "FORBIDDEN")])
async def test_only_a_doctor_of_the_prescriptions_organization_signs(clinic, who, status,
                                                                     code):
    """``prescription.sign``: a doctor of an organization owning the prescription; not its
    administrator or nurse, not a doctor of another organization."""
    created = await prescribe(clinic, who=clinic.nurse)
    signed = await clinic.client.post(f"/api/prescriptions/{created['id']}/sign", json={},
                                      headers=getattr(clinic, who)["headers"])
    assert signed.status_code == status, signed.text
    if code is not None:
        assert signed.json()["error"]["code"] == code
    else:
        assert signed.json()["data"]["status"] == "active"
