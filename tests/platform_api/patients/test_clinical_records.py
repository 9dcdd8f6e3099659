"""Clinical records: an Encounter with its notes in a DocumentReference, a Provenance per
change, the record_updated event, the audit trail, and who may do what."""

from __future__ import annotations

import base64

RECORD = {"encounter_type": "consultation",
          "chief_complaint": "Fever and headache for three days",
          "notes": "Malaria RDT positive. Started artemether-lumefantrine 80/480 mg."}


async def create(clinic, who=None, **changes):
    response = await clinic.client.post(
        "/api/clinical-records", json={"patient_id": clinic.patient_id, **RECORD, **changes},
        headers=(who or clinic.doctor)["headers"])
    assert response.status_code == 201, response.text
    return response.json()["data"]


async def test_a_record_is_an_encounter_with_its_notes_readable_on_fhir(clinic):
    record = await create(clinic)
    assert record["encounter_type"] == "consultation" and record["status"] == "finished"
    assert record["notes"] == RECORD["notes"]
    assert record["recorded_by"] == clinic.doctor["user"]["id"]
    encounter = (await clinic.fhir(f"Encounter/{record['id']}")).json()
    assert encounter["class"]["code"] == "AMB"
    assert encounter["type"][0]["coding"][0] == {
        "system": "http://snomed.info/sct", "code": "11429006", "display": "Consultation"}
    assert encounter["reasonCode"] == [{"text": RECORD["chief_complaint"]}]
    assert encounter["subject"] == {"reference": f"Patient/{clinic.patient_id}",
                                    "display": "Amina Odhiambo"}
    note = (await clinic.fhir(f"DocumentReference/{record['note_id']}")).json()
    assert note["context"]["encounter"] == [{"reference": f"Encounter/{record['id']}"}]
    assert note["type"]["coding"][0]["code"] == "11506-3"
    text = base64.b64decode(note["content"][0]["attachment"]["data"]).decode()
    assert text == RECORD["notes"]
    provenance = (await clinic.fhir(f"Provenance?target=Encounter/{record['id']}")).json()
    targets = [t["reference"] for t in provenance["entry"][0]["resource"]["target"]]
    assert targets == [f"Encounter/{record['id']}/_history/1",
                       f"DocumentReference/{record['note_id']}/_history/1"]


async def test_every_change_emits_record_updated(clinic):
    record = await create(clinic)
    url = f"/api/clinical-records/{record['id']}"
    await clinic.client.put(url, json={"notes": "Review in 3 days."},
                            headers=clinic.doctor["headers"])
    await clinic.client.delete(url, headers=clinic.doctor["headers"])
    events = await clinic.events("platform.clinical.record_updated")
    assert [(e["record_id"], e["change"], e["version"]) for e in events] == [
        (record["id"], "created", "1"), (record["id"], "updated", "2"),
        (record["id"], "deleted", "2")]
    assert events[0]["patient_id"] == clinic.patient_id
    assert events[0]["changed_by"] == clinic.doctor["user"]["id"]


async def test_update_changes_the_fields_sent_and_amends_the_note(clinic):
    record = await create(clinic)
    url = f"/api/clinical-records/{record['id']}"
    updated = await clinic.client.put(url, json={"notes": "Afebrile. Continue AL."},
                                      headers=clinic.doctor["headers"])
    assert updated.status_code == 200, updated.text
    data = updated.json()["data"]
    assert data["notes"] == "Afebrile. Continue AL."
    assert data["chief_complaint"] == RECORD["chief_complaint"]
    note = (await clinic.fhir(f"DocumentReference/{record['note_id']}")).json()
    assert note["docStatus"] == "amended" and note["meta"]["versionId"] == "2"
    # Only the note changed: the Encounter keeps its version.
    assert data["version"] == "1"


async def test_status_moves_follow_the_table(clinic):
    record = await create(clinic, status="in-progress")
    url = f"/api/clinical-records/{record['id']}"
    done = await clinic.client.put(url, json={"status": "finished"},
                                   headers=clinic.doctor["headers"])
    assert done.json()["data"]["status"] == "finished"
    back = await clinic.client.put(url, json={"status": "in-progress"},
                                   headers=clinic.doctor["headers"])
    assert back.status_code == 409 and back.json()["error"]["code"] == "INVALID_TRANSITION"


async def test_audit_trail_says_who_changed_what_and_when(clinic):
    record = await create(clinic)
    url = f"/api/clinical-records/{record['id']}"
    await clinic.client.put(url, json={"chief_complaint": "Fever, headache and vomiting",
                                       "notes": "Vomiting twice. IV artesunate."},
                            headers=clinic.nurse["headers"])
    # The clinical audit writes its AuditEvents in batches: all of them now, so the trail
    # is the same however busy the machine is (a full run once saw them, once not).
    await clinic.app.state.services.extras["sessions.clinical_audit"].flush()
    audit = await clinic.client.get(f"{url}/audit", headers=clinic.doctor["headers"])
    assert audit.status_code == 200, audit.text
    body = audit.json()
    assert body["meta"]["total"] == len(body["data"])
    events = [e for e in body["data"] if e["source"] == "audit-event"]
    assert events and all(e["by"] in (clinic.doctor["user"]["id"], clinic.nurse["user"]["id"])
                          for e in events)
    latest, first = [e for e in body["data"] if e["source"] == "version"]
    assert (latest["action"], latest["by"], latest["version"], latest["note_version"]) == (
        "updated", clinic.nurse["user"]["id"], "2", "2")
    assert {c["field"]: (c["from"], c["to"]) for c in latest["changes"]} == {
        "chief_complaint": (RECORD["chief_complaint"], "Fever, headache and vomiting"),
        "notes": (RECORD["notes"], "Vomiting twice. IV artesunate.")}
    assert (first["action"], first["by"]) == ("created", clinic.doctor["user"]["id"])
    assert {c["field"] for c in first["changes"]} >= {"encounter_type", "notes"}
    # The patient reads their own record's trail; an outsider does not.
    own = await clinic.client.get(f"{url}/audit", headers=clinic.patient["headers"])
    assert own.status_code == 200  # the same trail, and the reads audited since
    assert len([e for e in own.json()["data"] if e["source"] == "version"]) == 2
    refused = await clinic.client.get(f"{url}/audit", headers=clinic.outsider["headers"])
    assert refused.status_code == 403


async def test_a_change_of_the_notes_alone_names_its_author(clinic):
    record = await create(clinic)
    url = f"/api/clinical-records/{record['id']}"
    changed = await clinic.client.put(url, json={"notes": "Afebrile on day 2."},
                                      headers=clinic.nurse["headers"])
    assert changed.status_code == 200, changed.text
    audit = (await clinic.client.get(f"{url}/audit", headers=clinic.doctor["headers"])
             ).json()
    latest = next(e for e in audit["data"] if e["source"] == "version")
    assert (latest["version"], latest["note_version"]) == (None, "2")
    assert (latest["action"], latest["by"]) == ("updated", clinic.nurse["user"]["id"])
    assert latest["by_display"]
    assert [c["field"] for c in latest["changes"]] == ["notes"]


async def test_versions_written_through_fhir_show_in_the_trail_without_an_author(clinic):
    record = await create(clinic)
    encounter = (await clinic.fhir(f"Encounter/{record['id']}")).json()
    encounter["reasonCode"] = [{"text": "Fever"}]
    written = await clinic.client.put(f"/fhir/Encounter/{record['id']}", json=encounter,
                                      headers={**clinic.admin["headers"],
                                               "Content-Type": "application/fhir+json"})
    assert written.status_code == 200, written.text
    audit = (await clinic.client.get(f"/api/clinical-records/{record['id']}/audit",
                                     headers=clinic.admin["headers"])).json()
    latest = audit["data"][0]
    assert latest["by"] is None and latest["version"] == "2"
    assert latest["changes"] == [{"field": "chief_complaint", "from": RECORD[
        "chief_complaint"], "to": "Fever"}]


async def test_lists_by_patient_and_mine(clinic):
    first = await create(clinic, date="2026-01-10T09:00:00Z")
    second = await create(clinic, who=clinic.nurse, date="2026-03-02T10:30:00Z")
    by_patient = await clinic.client.get(
        f"/api/patients/{clinic.patient_id}/clinical-records", headers=clinic.doctor["headers"])
    assert [r["id"] for r in by_patient.json()["data"]] == [second["id"], first["id"]]
    assert by_patient.json()["meta"]["total"] == 2
    mine = (await clinic.client.get("/api/clinical-records",
                                    headers=clinic.nurse["headers"])).json()
    assert [r["id"] for r in mine["data"]] == [second["id"]]
    as_patient = (await clinic.client.get("/api/clinical-records",
                                          headers=clinic.patient["headers"])).json()
    assert as_patient["meta"]["total"] == 2
    assert as_patient["data"][0]["notes"] == RECORD["notes"]  # the patient reads the notes
    paged = (await clinic.client.get(f"/api/clinical-records?patient_id={clinic.patient_id}"
                                     "&limit=1&page=2", headers=clinic.doctor["headers"])).json()
    assert paged["meta"] == {"page": 2, "limit": 1, "total": 2}
    assert [r["id"] for r in paged["data"]] == [first["id"]]


async def test_access_by_role_membership_and_consent(clinic):
    record = await create(clinic)
    url = f"/api/clinical-records/{record['id']}"
    # The patient reads but may not write their record.
    assert (await clinic.client.get(url, headers=clinic.patient["headers"])).status_code == 200
    assert (await clinic.client.put(url, json={"notes": "x"}, headers=clinic.patient[
        "headers"])).status_code == 403
    # A receptionist handles visits but not clinical notes.
    refused = await clinic.client.post("/api/clinical-records", json={
        "patient_id": clinic.patient_id, **RECORD}, headers=clinic.receptionist["headers"])
    assert refused.status_code == 403
    # A doctor with neither membership nor consent is refused everywhere.
    for response in (
            await clinic.client.get(url, headers=clinic.outsider["headers"]),
            await clinic.client.get(f"/api/patients/{clinic.patient_id}/clinical-records",
                                    headers=clinic.outsider["headers"]),
            await clinic.client.post("/api/clinical-records", json={
                "patient_id": clinic.patient_id, **RECORD},
                headers=clinic.outsider["headers"])):
        assert response.status_code == 403, response.text
        assert response.json()["error"]["code"] == "FORBIDDEN"
    # A nurse may not delete; the doctor may.
    assert (await clinic.client.delete(url, headers=clinic.nurse["headers"])).status_code == 403
    assert (await clinic.client.delete(url, headers=clinic.doctor["headers"])).status_code == 200
    gone = await clinic.client.get(url, headers=clinic.doctor["headers"])
    assert gone.status_code == 404 and gone.json()["error"]["code"] == "NOT_FOUND"
    assert (await clinic.client.get(url)).status_code == 401


async def test_payloads_are_validated_and_unknown_patients_are_404(clinic):
    missing = await clinic.client.post("/api/clinical-records", json={
        "patient_id": clinic.patient_id, "encounter_type": "consultation"},
        headers=clinic.doctor["headers"])
    assert missing.status_code == 422 and missing.json()["error"]["field"] in {
        "chief_complaint", "notes"}
    bad_status = await clinic.client.post("/api/clinical-records", json={
        "patient_id": clinic.patient_id, **RECORD, "status": "done"},
        headers=clinic.doctor["headers"])
    assert bad_status.status_code == 422 and bad_status.json()["error"]["field"] == "status"
    unknown = await clinic.client.post("/api/clinical-records", json={
        "patient_id": "no-such-patient", **RECORD}, headers=clinic.doctor["headers"])
    assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "NOT_FOUND"
