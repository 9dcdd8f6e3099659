"""Data subject rights: erasure requests reviewed by an administrator, the erasure across
current resources and history (what must stay pseudonymized, with an AuditEvent), and the
export of the whole record."""

from __future__ import annotations

import pytest

from tests.conftest import make_admin
from tests.hl7_gateway.messages import oru
from tests.platform_api.patients.test_prescriptions import AMOXICILLIN


@pytest.fixture
async def admin(app, clinic):
    return await make_admin(app, clinic.client)


async def build_record(clinic):
    """A visit with notes, vitals, a signed prescription, an allergy and a consent."""
    doctor = clinic.doctor["headers"]
    record = (await clinic.client.post("/api/clinical-records", json={
        "patient_id": clinic.patient_id, "encounter_type": "consultation",
        "chief_complaint": "Chest pain on exertion",
        "notes": "Amina Odhiambo, lives in Kibera; ECG normal"}, headers=doctor)).json()["data"]
    await clinic.client.put(f"/api/clinical-records/{record['id']}", json={
        "notes": "ECG normal; refer to cardiology"}, headers=doctor)
    vitals = (await clinic.client.post("/api/vitals", json={
        "patient_id": clinic.patient_id, "heart_rate": 92}, headers=clinic.nurse["headers"])
              ).json()["data"]
    prescription = (await clinic.client.post("/api/prescriptions", json={
        "patient_id": clinic.patient_id, **AMOXICILLIN, "notes": "Patient prefers capsules"},
        headers=doctor)).json()["data"]
    await clinic.client.post(f"/api/prescriptions/{prescription['id']}/sign", json={},
                             headers=doctor)
    await clinic.client.post(f"/api/patients/{clinic.patient_id}/allergies", json={
        "substance": "Penicillin", "code": "764146007", "category": "medication"},
        headers=doctor)
    consent = (await clinic.client.post("/api/consent/grant", json={
        "grantee_type": "organization", "grantee_id": clinic.outsider_org_id},
        headers=clinic.patient["headers"])).json()["data"]
    return {"record": record, "vitals": vitals, "prescription": prescription,
            "consent": consent}


async def request_erasure(clinic, who=None):
    response = await clinic.client.post(
        f"/api/patients/{clinic.patient_id}/erasure-request",
        json={"reason": "I am moving abroad"}, headers=(who or clinic.patient)["headers"])
    assert response.status_code == 201, response.text
    return response.json()["data"]


async def test_a_patient_requests_erasure_and_lists_their_requests(clinic, admin):
    request = await request_erasure(clinic)
    assert (request["status"], request["reason"]) == ("requested", "I am moving abroad")
    task = (await clinic.fhir(f"Task/{request['id']}", admin)).json()
    assert task["code"]["coding"][0]["code"] == "erasure-request"
    assert "security" not in task.get("meta", {})  # no organization owns it
    again = await clinic.client.post(f"/api/patients/{clinic.patient_id}/erasure-request",
                                     json={}, headers=clinic.patient["headers"])
    assert again.status_code == 409 and again.json()["error"]["code"] == "ERASURE_PENDING"
    url = f"/api/patients/{clinic.patient_id}/dsr"
    own = (await clinic.client.get(url, headers=clinic.patient["headers"])).json()
    assert [r["id"] for r in own["data"]] == [request["id"]]
    assert (await clinic.client.get(url, headers=admin["headers"])).json()["meta"]["total"] == 1
    assert (await clinic.client.get(url, headers=clinic.doctor["headers"])).status_code == 403
    assert (await clinic.client.post(f"/api/patients/{clinic.patient_id}/erasure-request",
                                     json={}, headers=clinic.doctor["headers"])
            ).status_code == 403
    assert (await clinic.client.get(url, headers=clinic.outsider["headers"])).status_code == 403


async def test_only_administrators_decide_and_a_refusal_says_why(clinic, admin):
    request = await request_erasure(clinic)
    base = f"/api/patients/{clinic.patient_id}/dsr/{request['id']}"
    for who in (clinic.patient, clinic.doctor, clinic.admin):
        assert (await clinic.client.post(f"{base}/approve", json={}, headers=who["headers"])
                ).status_code == 403
    rejected = await clinic.client.post(f"{base}/reject", json={
        "reason": "Records under a court order"}, headers=admin["headers"])
    assert rejected.status_code == 200, rejected.text
    data = rejected.json()["data"]
    assert (data["status"], data["decision_note"], data["decided_by"]) == (
        "rejected", "Records under a court order", admin["user"]["id"])
    late = await clinic.client.post(f"{base}/approve", json={}, headers=admin["headers"])
    assert late.status_code == 409 and late.json()["error"]["code"] == "INVALID_TRANSITION"


async def test_approval_erases_the_record_and_pseudonymizes_what_must_stay(clinic, admin):
    built = await build_record(clinic)
    record_id, note_id = built["record"]["id"], built["record"]["note_id"]
    prescription_id = built["prescription"]["id"]
    # A lab result the HL7v2 gateway stored, with the original message as a Binary.
    authority = f"&urn:healthplatform:organization:{clinic.org_id}:mrn&URI"
    ingested = await clinic.client.post(
        "/api/lab/hl7-ingest", content=oru("ERASE-1", patient="KCC-0001", authority=authority),
        headers={**admin["headers"], "Content-Type": "x-application/hl7-v2+er7"})
    assert ingested.json()["data"]["ack_code"] == "AA", ingested.text
    written = ingested.json()["data"]["resources"]
    report = next(r for r in written if r.startswith("DiagnosticReport/"))
    message = next(r for r in written if r.startswith("Binary/"))
    request = await request_erasure(clinic)
    approved = await clinic.client.post(
        f"/api/patients/{clinic.patient_id}/dsr/{request['id']}/approve", json={},
        headers=admin["headers"])
    assert approved.status_code == 200, approved.text
    done = approved.json()["data"]
    assert done["status"] == "completed" and done["erased"] > 0 and done["pseudonymized"] > 0
    store = clinic.app.state.services.store
    # Erased: gone with their history, as if never written.
    for kind, rid in (("Encounter", record_id), ("DocumentReference", note_id),
                      ("Observation", built["vitals"]["id"])):
        assert (await clinic.fhir(f"{kind}/{rid}", admin)).status_code == 404
        assert (await store.history(kind, rid)).total == 0
    provenance = (await clinic.fhir(f"Provenance?target=Encounter/{record_id}", admin)).json()
    assert provenance["total"] == 0
    for gone in (report, message):  # the result and the message that brought it
        assert (await clinic.fhir(gone, admin)).status_code == 404
    # Kept, pseudonymized, with no history left to tell what was there.
    patient = (await clinic.fhir(f"Patient/{clinic.patient_id}", admin)).json()
    assert "name" not in patient and "telecom" not in patient
    assert patient["birthDate"] == "1988" and patient["active"] is False
    assert [i["system"] for i in patient["identifier"]] == ["urn:healthplatform:pseudonym"]
    assert (await store.history("Patient", clinic.patient_id)).total == 1
    prescription = (await clinic.fhir(f"MedicationRequest/{prescription_id}", admin)).json()
    assert prescription["medicationCodeableConcept"]["text"] == AMOXICILLIN["medication"]
    assert "display" not in prescription["subject"] and "note" not in prescription
    assert (await store.history("MedicationRequest", prescription_id)).total == 1
    consent = (await clinic.fhir(f"Consent/{built['consent']['id']}", admin)).json()
    assert consent["status"] == "inactive"
    found = (await clinic.fhir("Patient?family=odhiambo", admin)).json()
    assert found["total"] == 0
    # The AuditEvent says what went and what stayed, and why.
    audit = (await clinic.fhir(f"AuditEvent/{done['audit_event_id']}", admin)).json()
    assert audit["type"]["code"] == "110110" and audit["action"] == "D"
    assert "Erased" in audit["outcomeDesc"] and "pharmacy law" in audit["outcomeDesc"]
    assert audit["entity"][0]["what"] == {"reference": f"Patient/{clinic.patient_id}"}
    # The patient's account no longer reaches a record; the grantee reaches nothing.
    assert (await clinic.client.get("/api/patients/me", headers=clinic.patient["headers"])
            ).status_code == 404
    assert (await clinic.client.get(f"/api/prescriptions/{prescription_id}",
                                    headers=clinic.outsider["headers"])).status_code == 403
    events = await clinic.events("platform.privacy.erasure_completed")
    assert [(e["request_id"], e["approved_by"]) for e in events] == [
        (request["id"], admin["user"]["id"])]


async def test_export_returns_the_record_as_a_bundle_and_in_api_shapes(clinic, admin):
    built = await build_record(clinic)
    url = f"/api/patients/{clinic.patient_id}/export"
    bundle = await clinic.client.get(url, headers=clinic.patient["headers"])
    assert bundle.status_code == 200, bundle.text
    data = bundle.json()["data"]
    assert (data["resourceType"], data["type"]) == ("Bundle", "searchset")
    kinds = {e["resource"]["resourceType"] for e in data["entry"]}
    assert {"Patient", "Encounter", "DocumentReference", "Observation", "MedicationRequest",
            "AllergyIntolerance", "Consent"} <= kinds
    assert all(e["fullUrl"].endswith(f"{e['resource']['resourceType']}/{e['resource']['id']}")
               for e in data["entry"])
    shaped = (await clinic.client.get(f"{url}?format=json", headers=clinic.doctor["headers"])
              ).json()["data"]
    assert shaped["patient"]["id"] == clinic.patient_id
    assert [r["id"] for r in shaped["clinical_records"]] == [built["record"]["id"]]
    assert shaped["clinical_records"][0]["notes"] == "ECG normal; refer to cardiology"
    assert [v["heart_rate"] for v in shaped["vitals"]] == [92]
    assert shaped["observations"] == []  # the vital signs are in vitals
    assert [p["status"] for p in shaped["prescriptions"]] == ["active"]
    assert [a["substance"] for a in shaped["allergies"]] == ["Penicillin"]
    assert [c["status"] for c in shaped["consents"]] == ["active"]
    exports = (await clinic.fhir(f"AuditEvent?entity=Patient/{clinic.patient_id}", admin)
               ).json()
    assert sum(1 for e in exports["entry"] if e["resource"]["type"]["code"] == "110106") == 2
    desk = (await clinic.client.get(url, headers=clinic.receptionist["headers"])).json()
    assert {e["resource"]["resourceType"] for e in desk["data"]["entry"]} >= {"Patient",
                                                                              "Encounter"}
    assert "MedicationRequest" not in {e["resource"]["resourceType"]
                                       for e in desk["data"]["entry"]}  # what they may see
    bad = await clinic.client.get(f"{url}?format=xml", headers=clinic.patient["headers"])
    assert bad.status_code == 422 and bad.json()["error"]["field"] == "format"
    consented = await clinic.client.get(url, headers=clinic.outsider["headers"])
    assert consented.status_code == 200  # the consent the patient granted lets them in
    await clinic.client.post(f"/api/consent/{built['consent']['id']}/revoke",
                             headers=clinic.patient["headers"])
    assert (await clinic.client.get(url, headers=clinic.outsider["headers"])).status_code == 403


MARK = "Erin"  # what identifies the patient in free text: none of it may survive


def _narrative(kind: str) -> dict:
    return {"status": "generated",
            "div": f'<div xmlns="http://www.w3.org/1999/xhtml">{kind} for {MARK}</div>'}


async def kept_records_with_free_text(clinic) -> dict[str, str]:
    """Records of kinds that must stay, each using free-text elements of every kind."""
    doctor = clinic.doctor["headers"]
    fhir_headers = {**doctor, "Content-Type": "application/fhir+json"}
    subject = {"reference": f"Patient/{clinic.patient_id}"}
    prescription = (await clinic.client.post("/api/prescriptions", json={
        "patient_id": clinic.patient_id, **AMOXICILLIN,
        "instructions": f"{MARK} must finish course", "notes": f"{MARK} prefers capsules"},
        headers=doctor)).json()["data"]
    request = (await clinic.fhir(f"MedicationRequest/{prescription['id']}")).json()
    request["text"] = _narrative("Prescription")
    request["extension"] = [{"url": "urn:example:comment", "valueString": f"Call {MARK}"},
                            {"url": "urn:example:coded", "valueCode": "kept"}]
    request["dosageInstruction"][0]["_patientInstruction"] = {
        "extension": [{"url": "urn:example:spoken", "valueMarkdown": f"*{MARK}*"}]}
    updated = await clinic.client.put(f"/fhir/MedicationRequest/{prescription['id']}",
                                      json=request, headers=fhir_headers)
    assert updated.status_code == 200, updated.text
    written = {"MedicationRequest": prescription["id"]}
    for resource in (
        {"resourceType": "Immunization", "status": "completed", "patient": subject,
         "vaccineCode": {"coding": [{"system": "http://hl7.org/fhir/sid/cvx", "code": "08",
                                     "display": "Hep B"}]},
         "occurrenceDateTime": "2024-01-10", "lotNumber": "LOT-77",
         "text": _narrative("Immunization"),
         "note": [{"authorString": f"Nurse of {MARK}", "text": f"{MARK} fainted"}],
         "education": [{"documentType": f"Leaflet given to {MARK}",
                        "presentationDate": "2024-01-10"}],
         "extension": [{"url": "urn:example:remark", "valueMarkdown": f"**{MARK}**"}]},
        {"resourceType": "MedicationDispense", "status": "completed", "subject": subject,
         "medicationCodeableConcept": {"text": "Amoxicillin 500 mg oral capsule"},
         "note": [{"text": f"Handed to {MARK}'s mother"}],
         "dosageInstruction": [{"text": f"{MARK}: one capsule three times daily",
                                "patientInstruction": f"{MARK} takes it after meals"}]},
        {"resourceType": "AdverseEvent", "actuality": "actual", "subject": subject,
         "event": {"text": "Rash"}, "text": _narrative("Adverse event"),
         "extension": [{"url": "urn:example:story", "valueString": f"{MARK} said so"}]},
        {"resourceType": "Consent", "status": "active", "patient": subject,
         "scope": {"coding": [{"system": "http://terminology.hl7.org/CodeSystem/"
                               "consentscope", "code": "patient-privacy"}]},
         "category": [{"coding": [{"system": "http://loinc.org", "code": "59284-0"}]}],
         "sourceAttachment": {"contentType": "text/plain", "title": f"Form of {MARK}",
                              "data": "RXJpbiBzaWduZWQ="}},
    ):
        stored = await clinic.client.post(f"/fhir/{resource['resourceType']}",
                                          json=resource, headers=fhir_headers)
        assert stored.status_code == 201, stored.text
        written[resource["resourceType"]] = stored.json()["id"]
    return written


async def test_erasure_removes_every_free_text_of_what_stays_and_its_history(clinic, admin):
    written = await kept_records_with_free_text(clinic)
    request = await request_erasure(clinic)
    approved = await clinic.client.post(
        f"/api/patients/{clinic.patient_id}/dsr/{request['id']}/approve", json={},
        headers=admin["headers"])
    assert approved.status_code == 200, approved.text
    for kind, rid in written.items():
        current = await clinic.fhir(f"{kind}/{rid}", admin)
        assert current.status_code == 200, (kind, current.text)
        history = (await clinic.fhir(f"{kind}/{rid}/_history", admin)).json()
        assert history["total"] == 1
        for text in (current.text, str(history)):
            assert MARK not in text, (kind, text)
            assert "RXJpbiBzaWduZWQ=" not in text and "div" not in text
    prescription = (await clinic.fhir(f"MedicationRequest/{written['MedicationRequest']}",
                                      admin)).json()
    assert prescription["medicationCodeableConcept"]["text"] == AMOXICILLIN["medication"]
    assert prescription["extension"] == [{"url": "urn:example:coded", "valueCode": "kept"}]
    dosage = prescription["dosageInstruction"][0]
    assert "patientInstruction" not in dosage and "text" not in dosage
    assert dosage["doseAndRate"][0]["doseQuantity"]["unit"] == "mg"
    immunization = (await clinic.fhir(f"Immunization/{written['Immunization']}", admin)
                    ).json()
    assert immunization["lotNumber"] == "LOT-77" and "note" not in immunization
    assert immunization["vaccineCode"]["coding"][0]["display"] == "Hep B"
    consent = (await clinic.fhir(f"Consent/{written['Consent']}", admin)).json()
    assert consent["sourceAttachment"] == {"contentType": "text/plain"}
