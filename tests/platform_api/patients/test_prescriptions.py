"""Prescriptions: a draft MedicationRequest with a structured sig, signed by a doctor after
the prescription checks (drug interactions) run, cancelled through the status table."""

from __future__ import annotations

import pytest

from platform_api import prescription_checks

AMOXICILLIN = {"medication": "Amoxicillin 500 mg oral capsule", "rxcui": "308182",
               "dosage": "500 mg", "frequency": "three times daily", "duration": "7 days",
               "instructions": "Take after meals; finish the course", "quantity": 21,
               "quantity_unit": "capsule", "refills": 1}
WARFARIN_ASPIRIN = {"severity": "high", "description": "Increased risk of bleeding",
                    "drugs": ["Warfarin", "Aspirin"],
                    "recommendation": "Avoid the combination or monitor INR closely"}


async def prescribe(clinic, who=None, **changes):
    response = await clinic.client.post("/api/prescriptions", json={
        "patient_id": clinic.patient_id, **AMOXICILLIN, **changes},
        headers=(who or clinic.doctor)["headers"])
    assert response.status_code == 201, response.text
    return response.json()["data"]


@pytest.fixture
def interaction_check():
    """A check registered the way decision support registers its own; it reports what
    ``found`` holds and records what it was asked."""
    asked: list[tuple[dict, str]] = []
    found: list[dict] = []

    async def check(services, medication_request, patient_id):
        asked.append((medication_request, patient_id))
        return list(found)
    prescription_checks.checks.append(check)
    yield found, asked
    prescription_checks.checks.remove(check)


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


async def test_a_doctor_signs_and_the_signature_is_recorded(clinic, interaction_check):
    _found, asked = interaction_check
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
    assert asked[0][1] == clinic.patient_id
    assert asked[0][0]["medicationCodeableConcept"]["text"] == AMOXICILLIN["medication"]
    provenance = (await clinic.fhir(f"Provenance?target=MedicationRequest/{created['id']}"
                                    )).json()["entry"][0]["resource"]
    assert provenance["target"] == [
        {"reference": f"MedicationRequest/{created['id']}/_history/2"}]
    assert provenance["signature"][0]["type"][0]["code"] == "1.2.840.10065.1.12.1.1"
    again = await clinic.client.post(url, json={}, headers=clinic.doctor["headers"])
    assert again.status_code == 409 and again.json()["error"]["code"] == "INVALID_TRANSITION"
    signed_events = await clinic.events("platform.prescription.signed")
    assert [e["prescription_id"] for e in signed_events] == [created["id"]]


async def test_a_high_interaction_refuses_the_sign_unless_overridden(clinic,
                                                                     interaction_check):
    found, _asked = interaction_check
    found.append(WARFARIN_ASPIRIN)
    created = await prescribe(clinic, medication="Aspirin 75 mg tablet", rxcui="243670",
                              dosage="75 mg", frequency="once daily", duration="30 days")
    url = f"/api/prescriptions/{created['id']}/sign"
    refused = await clinic.client.post(url, json={}, headers=clinic.doctor["headers"])
    assert refused.status_code == 409
    error = refused.json()["error"]
    assert error["code"] == "DRUG_INTERACTION" and "bleeding" in error["message"]
    assert error["details"] == [WARFARIN_ASPIRIN]
    still = (await clinic.client.get(f"/api/prescriptions/{created['id']}",
                                     headers=clinic.doctor["headers"])).json()["data"]
    assert still["status"] == "draft"
    reason = "Benefit outweighs the risk; INR monitored weekly"
    signed = await clinic.client.post(url, json={"override_reason": reason},
                                      headers=clinic.doctor["headers"])
    assert signed.status_code == 200, signed.text
    data = signed.json()["data"]
    assert data["status"] == "active" and data["override_reason"] == reason
    assert data["findings"] == [WARFARIN_ASPIRIN]
    issue = (await clinic.fhir(f"DetectedIssue?implicated=MedicationRequest/{created['id']}"
                               )).json()["entry"][0]["resource"]
    assert (issue["severity"], issue["code"]["coding"][0]["code"]) == ("high", "DRG")


async def test_moderate_findings_do_not_refuse_and_a_failing_check_must_be_overridden(
        clinic, interaction_check):
    found, _asked = interaction_check
    found.append({**WARFARIN_ASPIRIN, "severity": "moderate"})
    created = await prescribe(clinic)
    signed = await clinic.client.post(f"/api/prescriptions/{created['id']}/sign", json={},
                                      headers=clinic.doctor["headers"])
    assert signed.status_code == 200 and signed.json()["data"]["findings"][0][
        "severity"] == "moderate"

    async def broken(services, medication_request, patient_id):
        raise RuntimeError("interaction database unreachable")
    prescription_checks.checks.append(broken)
    try:
        other = await prescribe(clinic)
        refused = await clinic.client.post(f"/api/prescriptions/{other['id']}/sign",
                                           json={}, headers=clinic.doctor["headers"])
        assert refused.status_code == 409
        assert "could not run" in refused.json()["error"]["message"]
    finally:
        prescription_checks.checks.remove(broken)


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
