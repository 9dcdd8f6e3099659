"""Imaging orders: FHIR ServiceRequest of category imaging, cancel through the status
table, the studies and reports answering an order, and who may do what."""

from __future__ import annotations

CHEST = {"procedure": "Chest X-ray, 2 views", "procedure_code": "36643-5", "modality": "DX",
         "body_site": "Chest", "reason": "Productive cough for 3 weeks; rule out TB",
         "priority": "urgent"}
FHIR = {"Content-Type": "application/fhir+json"}


async def order(clinic, who=None):
    response = await clinic.client.post("/api/imaging", json={
        "patient_id": clinic.patient_id, **CHEST}, headers=(who or clinic.doctor)["headers"])
    assert response.status_code == 201, response.text
    return response.json()["data"]


async def test_an_imaging_order_is_a_service_request(clinic):
    created = await order(clinic)
    assert created["status"] == "active" and created["placer_order_number"].startswith("IMG")
    fhir = (await clinic.fhir(f"ServiceRequest/{created['id']}")).json()
    assert fhir["category"][0]["coding"][0]["code"] == "363679005"
    assert fhir["code"]["coding"][0]["code"] == "36643-5"
    assert fhir["orderDetail"][0]["coding"][0] == {
        "system": "http://dicom.nema.org/resources/ontology/DCM", "code": "DX",
        "display": "Digital Radiography"}
    assert fhir["priority"] == "urgent" and fhir["intent"] == "order"


async def test_cancel_follows_the_status_table(clinic):
    created = await order(clinic)
    url = f"/api/imaging/{created['id']}/cancel"
    cancelled = await clinic.client.post(url, headers=clinic.doctor["headers"])
    assert cancelled.status_code == 200 and cancelled.json()["data"]["status"] == "revoked"
    again = await clinic.client.post(url, headers=clinic.doctor["headers"])
    assert again.status_code == 409 and again.json()["error"]["code"] == "INVALID_TRANSITION"


async def test_the_order_lists_the_study_and_report_answering_it(clinic):
    created = await order(clinic)
    basis = [{"reference": f"ServiceRequest/{created['id']}"}]
    subject = {"reference": f"Patient/{clinic.patient_id}"}
    headers = {**clinic.doctor["headers"], **FHIR}
    study = await clinic.client.post("/fhir/ImagingStudy", json={
        "resourceType": "ImagingStudy", "status": "available", "subject": subject,
        "basedOn": basis}, headers=headers)
    report = await clinic.client.post("/fhir/DiagnosticReport", json={
        "resourceType": "DiagnosticReport", "status": "final", "subject": subject,
        "code": {"text": "Chest X-ray report"}, "basedOn": basis,
        "conclusion": "No active pulmonary disease"}, headers=headers)
    assert study.status_code == report.status_code == 201
    view = (await clinic.client.get(f"/api/imaging/{created['id']}",
                                    headers=clinic.doctor["headers"])).json()["data"]
    assert view["study_ids"] == [study.json()["id"]]
    assert view["report_ids"] == [report.json()["id"]]


async def test_lists_and_access(clinic):
    created = await order(clinic)
    mine = (await clinic.client.get("/api/imaging", headers=clinic.doctor["headers"])).json()
    assert [o["id"] for o in mine["data"]] == [created["id"]]
    assert (await clinic.client.get("/api/imaging", headers=clinic.nurse["headers"])
            ).json()["meta"]["total"] == 0
    own = (await clinic.client.get("/api/imaging", headers=clinic.patient["headers"])).json()
    assert own["meta"]["total"] == 1
    # A lab order is not an imaging order.
    lab = await clinic.client.post("/api/labs", json={
        "patient_id": clinic.patient_id, "test_type": "Full blood count"},
        headers=clinic.doctor["headers"])
    assert (await clinic.client.get(f"/api/imaging/{lab.json()['data']['id']}",
                                    headers=clinic.doctor["headers"])).status_code == 404
    assert (await clinic.client.get(f"/api/imaging?patient_id={clinic.patient_id}",
                                    headers=clinic.doctor["headers"])).json()["meta"][
        "total"] == 1
    url = f"/api/imaging/{created['id']}"
    assert (await clinic.client.post(f"{url}/cancel", headers=clinic.patient["headers"])
            ).status_code == 403
    assert (await clinic.client.get(url, headers=clinic.outsider["headers"])).status_code == 403
    assert (await clinic.client.post("/api/imaging", json={
        "patient_id": clinic.patient_id, **CHEST}, headers=clinic.outsider["headers"])
            ).status_code == 403
    bad = await clinic.client.post("/api/imaging", json={
        "patient_id": clinic.patient_id, **CHEST, "modality": "XRAY"},
        headers=clinic.doctor["headers"])
    assert bad.status_code == 422 and bad.json()["error"]["field"] == "modality"
