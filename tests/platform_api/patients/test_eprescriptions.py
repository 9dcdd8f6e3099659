"""E-prescriptions: a signed prescription sent to a pharmacy as a FHIR Task, transmitted,
dispensed as MedicationDispense, refilled up to the allowed number; who may do each step."""

from __future__ import annotations

from tests.platform_api.patients.test_prescriptions import AMOXICILLIN


async def signed_prescription(clinic, refills=1):
    created = await clinic.client.post("/api/prescriptions", json={
        "patient_id": clinic.patient_id, **AMOXICILLIN, "refills": refills},
        headers=clinic.doctor["headers"])
    assert created.status_code == 201, created.text
    prescription_id = created.json()["data"]["id"]
    signed = await clinic.client.post(f"/api/prescriptions/{prescription_id}/sign", json={},
                                      headers=clinic.doctor["headers"])
    assert signed.status_code == 200, signed.text
    return prescription_id


async def send(clinic, pharmacy, refills=1):
    prescription_id = await signed_prescription(clinic, refills)
    response = await clinic.client.post("/api/eprescriptions", json={
        "prescription_id": prescription_id, "pharmacy_id": pharmacy["org_id"]},
        headers=clinic.doctor["headers"])
    assert response.status_code == 201, response.text
    return response.json()["data"]


async def test_an_eprescription_is_a_fulfil_task_addressed_to_the_pharmacy(clinic, pharmacy):
    sent = await send(clinic, pharmacy)
    assert (sent["status"], sent["fills_allowed"], sent["refills_remaining"]) == (
        "draft", 2, 1)
    assert (sent["pharmacy_id"], sent["pharmacy_name"]) == (pharmacy["org_id"],
                                                            "Uhuru Pharmacy")
    task = (await clinic.fhir(f"Task/{sent['id']}")).json()
    assert task["code"]["coding"][0]["code"] == "fulfill"
    assert task["focus"] == {"reference": f"MedicationRequest/{sent['prescription_id']}"}
    assert task["owner"]["reference"] == f"Organization/{pharmacy['org_id']}"
    assert task["restriction"] == {"repetitions": 2}
    again = await clinic.client.post("/api/eprescriptions", json={
        "prescription_id": sent["prescription_id"], "pharmacy_id": pharmacy["org_id"]},
        headers=clinic.doctor["headers"])
    assert again.status_code == 409 and again.json()["error"]["code"] == "EPRESCRIPTION_EXISTS"
    listing = (await clinic.client.get(f"/api/patients/{clinic.patient_id}/eprescriptions",
                                       headers=clinic.doctor["headers"])).json()
    assert [e["id"] for e in listing["data"]] == [sent["id"]]


async def test_only_signed_prescriptions_go_to_pharmacies(clinic, pharmacy):
    draft = await clinic.client.post("/api/prescriptions", json={
        "patient_id": clinic.patient_id, **AMOXICILLIN}, headers=clinic.doctor["headers"])
    refused = await clinic.client.post("/api/eprescriptions", json={
        "prescription_id": draft.json()["data"]["id"], "pharmacy_id": pharmacy["org_id"]},
        headers=clinic.doctor["headers"])
    assert refused.status_code == 409
    assert refused.json()["error"]["code"] == "PRESCRIPTION_NOT_SIGNED"
    prescription_id = await signed_prescription(clinic)
    not_a_pharmacy = await clinic.client.post("/api/eprescriptions", json={
        "prescription_id": prescription_id, "pharmacy_id": clinic.outsider_org_id},
        headers=clinic.doctor["headers"])
    assert not_a_pharmacy.status_code == 422
    assert not_a_pharmacy.json()["error"]["field"] == "pharmacy_id"
    unknown = await clinic.client.post("/api/eprescriptions", json={
        "prescription_id": prescription_id, "pharmacy_id": "no-such-org"},
        headers=clinic.doctor["headers"])
    assert unknown.status_code == 404


async def test_transmit_dispense_refill_until_no_refill_is_left(clinic, pharmacy):
    sent = await send(clinic, pharmacy, refills=1)
    url = f"/api/eprescriptions/{sent['id']}"
    pharmacist = pharmacy["pharmacist"]["headers"]
    # Not sent yet: the pharmacy sees nothing.
    assert (await clinic.client.get(url, headers=pharmacist)).status_code == 403
    assert (await clinic.client.patch(f"{url}/transmit", headers=pharmacist)).status_code == 403
    transmitted = await clinic.client.patch(f"{url}/transmit", headers=clinic.doctor["headers"])
    assert transmitted.status_code == 200, transmitted.text
    assert transmitted.json()["data"]["status"] == "requested"
    resent = await clinic.client.patch(f"{url}/transmit", headers=clinic.doctor["headers"])
    assert resent.status_code == 409 and resent.json()["error"]["code"] == "INVALID_TRANSITION"
    queue = (await clinic.client.get("/api/eprescriptions", headers=pharmacist)).json()
    assert [e["id"] for e in queue["data"]] == [sent["id"]]
    assert queue["data"][0]["patient_name"] == "Amina Odhiambo"
    # The pharmacy reads the prescription it was sent, not the patient's record.
    assert (await clinic.fhir(f"MedicationRequest/{sent['prescription_id']}",
                              pharmacy["pharmacist"])).status_code == 200
    assert (await clinic.fhir(f"Patient/{clinic.patient_id}", pharmacy["pharmacist"])
            ).status_code == 403
    # Only the pharmacy dispenses.
    assert (await clinic.client.patch(f"{url}/dispense", json={},
                                      headers=clinic.doctor["headers"])).status_code == 403
    first = await clinic.client.patch(f"{url}/dispense", json={"quantity": 21,
                                                               "quantity_unit": "capsule"},
                                      headers=pharmacist)
    assert first.status_code == 200, first.text
    data = first.json()["data"]
    assert (data["status"], data["fills_dispensed"], data["refills_remaining"]) == (
        "in-progress", 1, 1)
    dispense = (await clinic.fhir(f"MedicationDispense/{data['dispense_ids'][0]}")).json()
    assert dispense["type"]["coding"][0]["code"] == "FF"
    assert dispense["authorizingPrescription"] == [
        {"reference": f"MedicationRequest/{sent['prescription_id']}"}]
    assert dispense["quantity"] == {"value": 21, "unit": "capsule"}
    twice = await clinic.client.patch(f"{url}/dispense", json={}, headers=pharmacist)
    assert twice.status_code == 409 and twice.json()["error"]["code"] == "INVALID_TRANSITION"
    # The patient asks for the refill; the pharmacy dispenses the last fill.
    asked = await clinic.client.post(f"{url}/refill", json={"notes": "Running out"},
                                     headers=clinic.patient["headers"])
    assert asked.status_code == 200, asked.text
    assert asked.json()["data"]["status"] == "requested"
    last = await clinic.client.patch(f"{url}/dispense", json={}, headers=pharmacist)
    assert last.json()["data"]["status"] == "completed"
    assert last.json()["data"]["refills_remaining"] == 0
    refill = (await clinic.fhir(f"MedicationDispense/{last.json()['data']['dispense_ids'][1]}"
                                )).json()
    assert refill["type"]["coding"][0]["code"] == "RF"
    prescription = (await clinic.client.get(f"/api/prescriptions/{sent['prescription_id']}",
                                            headers=clinic.doctor["headers"])).json()["data"]
    assert prescription["status"] == "completed"
    none_left = await clinic.client.post(f"{url}/refill", json={},
                                         headers=clinic.patient["headers"])
    assert none_left.status_code == 409 and none_left.json()["error"]["code"] == \
        "NO_REFILLS_LEFT"
    topics = [(await clinic.events(t)) for t in (
        "platform.prescription.transmitted", "platform.prescription.dispensed",
        "platform.prescription.refill_requested")]
    assert [len(t) for t in topics] == [1, 2, 1]
    assert topics[1][1]["fill"] == 2 and topics[1][1]["pharmacy_id"] == pharmacy["org_id"]


async def test_refills_are_refused_before_the_first_fill_and_to_strangers(clinic, pharmacy):
    sent = await send(clinic, pharmacy, refills=2)
    url = f"/api/eprescriptions/{sent['id']}"
    early = await clinic.client.post(f"{url}/refill", json={}, headers=clinic.patient[
        "headers"])
    assert early.status_code == 409 and early.json()["error"]["code"] == "INVALID_TRANSITION"
    assert (await clinic.client.post(f"{url}/refill", json={}, headers=clinic.outsider[
        "headers"])).status_code == 403
    assert (await clinic.client.get(f"/api/patients/{clinic.patient_id}/eprescriptions",
                                    headers=clinic.outsider["headers"])).status_code == 403
    assert (await clinic.client.post("/api/eprescriptions", json={
        "prescription_id": sent["prescription_id"], "pharmacy_id": pharmacy["org_id"]},
        headers=clinic.outsider["headers"])).status_code == 403
    own = (await clinic.client.get("/api/eprescriptions", headers=clinic.patient["headers"])
           ).json()
    assert [e["id"] for e in own["data"]] == [sent["id"]]
