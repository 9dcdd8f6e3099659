"""Patients' treatments (``platform_api.treatments.plans``): CarePlans instantiated from a
protocol, their activities dated from its timings, their status moves and progress."""

from __future__ import annotations

from tests.platform_api.treatments.conftest import data, malaria_protocol, refusal, shipped


async def start_tb(world, who="doctor", **fields):
    tb = await shipped(world, "tb-2hrze-4hr")
    return data(await world.post(who, "/api/patient-treatments", {
        "patient_id": world.patient_id, "protocol_id": tb["id"],
        "start_date": "2026-01-31", **fields}), 201)


def activity(treatment, step_id):
    return next(a for a in treatment["activities"] if a["id"] == step_id)


async def test_a_tb_treatment_is_dated_from_the_regimen(clinic):
    treatment = await start_tb(clinic)
    assert treatment["status"] == "draft" and treatment["patient_id"] == clinic.patient_id
    assert treatment["start_date"] == "2026-01-31" and treatment["end_date"] == "2026-07-31"
    intensive = activity(treatment, "intensive-hrze")
    assert (intensive["start"], intensive["end"]) == ("2026-01-31", "2026-03-31")
    assert intensive["kind"] == "medication" and intensive["code"]["code"] == "J04AM06"
    continuation = activity(treatment, "continuation-hr")
    assert (continuation["start"], continuation["end"]) == ("2026-03-31", "2026-07-31")
    smear = activity(treatment, "smear-month-5")
    assert (smear["start"], smear["end"]) == ("2026-06-30", "2026-06-30")
    assert activity(treatment, "smear-end-treatment")["start"] == "2026-07-31"
    assert treatment["progress"]["activities"] == 6
    assert treatment["progress"]["days_total"] == 181
    assert treatment["organization_id"] == clinic.org_id


async def test_the_care_plan_instantiates_the_protocol_version(clinic):
    treatment = await start_tb(clinic)
    care_plan = (await clinic.get("doctor", f"/fhir/CarePlan/{treatment['id']}")).json()
    assert care_plan["instantiatesCanonical"] == [
        "urn:healthplatform:treatment-protocol:tb-2hrze-4hr|1"]
    assert care_plan["intent"] == "plan" and care_plan["subject"] == {
        "reference": f"Patient/{clinic.patient_id}"}
    first = care_plan["activity"][0]
    assert first["id"] == "intensive-hrze"
    assert first["detail"]["kind"] == "MedicationRequest"
    assert first["detail"]["scheduledTiming"]["repeat"]["boundsPeriod"] == {
        "start": "2026-01-31", "end": "2026-03-31"}
    smear = next(a for a in care_plan["activity"] if a["id"] == "smear-month-5")
    assert smear["detail"]["scheduledTiming"] == {"event": ["2026-06-30"]}


async def test_an_open_ended_regimen_has_no_end(clinic):
    art = await shipped(clinic, "hiv-art-tld")
    treatment = data(await clinic.post("nurse", "/api/patient-treatments", {
        "patient_id": clinic.patient_id, "protocol_id": art["id"],
        "start_date": "2026-03-01", "status": "active"}), 201)
    assert treatment["end_date"] is None and treatment["progress"]["days_total"] is None
    assert activity(treatment, "viral-load-6-months")["start"] == "2026-09-01"
    yearly = activity(treatment, "viral-load-yearly")
    assert (yearly["start"], yearly["end"]) == ("2028-03-01", None)
    assert yearly["repeat"] == {"frequency": 1, "period": 12, "unit": "mo"}


async def test_who_may_start_a_treatment(clinic):
    for who in ("receptionist", "billing", "stranger", "other_admin"):
        response = await clinic.post(
            who, "/api/patient-treatments", {
                "patient_id": clinic.patient_id,
                "protocol_id": (await shipped(clinic, "tb-2hrze-4hr"))["id"]})
        assert response.status_code == 403, (who, response.text)


async def test_a_draft_or_unknown_protocol_starts_nothing(clinic):
    draft = data(await clinic.post("doctor", "/api/treatments", malaria_protocol()), 201)
    response = await clinic.post("doctor", "/api/patient-treatments", {
        "patient_id": clinic.patient_id, "protocol_id": draft["id"]})
    assert refusal(response) == (409, "PROTOCOL_NOT_ACTIVE")
    response = await clinic.post("doctor", "/api/patient-treatments", {
        "patient_id": clinic.patient_id, "protocol_id": "no-such-protocol"})
    assert refusal(response) == (404, "NOT_FOUND")
    response = await clinic.post("doctor", "/api/patient-treatments", {
        "patient_id": "no-such-patient", "protocol_id": draft["id"]})
    assert refusal(response) == (404, "NOT_FOUND")
    response = await clinic.post("doctor", "/api/patient-treatments", {"protocol_id": "x"})
    assert response.status_code == 422
    assert response.json()["error"]["field"] == "patient_id"


async def test_status_moves_and_progress(clinic):
    # Listening before the plan is created: its "created" event is one of those expected
    # (listening after it raced the bus's delivery; a full run on a loaded machine lost it).
    events = clinic.recorded("platform.treatments.*")
    treatment = await start_tb(clinic)
    url = f"/api/patient-treatments/{treatment['id']}"

    async def patch(body, who="nurse"):
        return await clinic.client.patch(url, json=body, headers=clinic.h(who))

    early = await patch({"activities": [{"id": "intensive-hrze", "status": "in-progress"}]})
    assert refusal(early) == (409, "TREATMENT_NOT_ACTIVE")
    active = data(await patch({"status": "active"}))
    assert active["status"] == "active"
    assert refusal(await patch({"start_date": "2026-02-01"})) == (409, "TREATMENT_NOT_DRAFT")
    progressed = data(await patch({"activities": [
        {"id": "intensive-hrze", "status": "completed", "note": "56 doses observed"},
        {"id": "smear-end-intensive", "status": "completed", "note": "Smear negative"}]}))
    assert progressed["progress"]["completed"] == 2
    assert progressed["progress"]["percent"] == 33.3
    note = activity(progressed, "intensive-hrze")["notes"][0]
    assert note["text"] == "56 doses observed" and note["by"] == clinic.user_id("nurse")
    again = await patch({"activities": [{"id": "intensive-hrze", "status": "in-progress"}]})
    assert refusal(again) == (409, "INVALID_TRANSITION")
    unknown = await patch({"activities": [{"id": "bedaquiline", "status": "completed"}]})
    assert refusal(unknown) == (422, "VALIDATION_ERROR")
    assert unknown.json()["error"]["field"] == "activities[0].id"
    held = data(await patch({"status": "on-hold", "reason": "Hepatotoxicity"}))
    assert held["status"] == "on-hold" and held["status_reason"] == "Hepatotoxicity"
    revoked = data(await patch({"status": "revoked", "reason": "Rifampicin resistance"},
                               who="doctor"))
    assert activity(revoked, "continuation-hr")["status"] == "cancelled"
    assert activity(revoked, "intensive-hrze")["status"] == "completed"
    assert revoked["progress"]["percent"] == 100.0
    assert refusal(await patch({"status": "active"})) == (409, "INVALID_TRANSITION")
    assert (await patch({"status": "active"}, who="receptionist")).status_code == 403
    await clinic.drain()
    topic = "platform.treatments.patient_treatment_"
    assert [(e["topic"].removeprefix(topic), e["payload"]["status"]) for e in events] == [
        ("created", "draft"), ("status_changed", "active"), ("progressed", "active"),
        ("status_changed", "on-hold"), ("status_changed", "revoked")]
    assert events[-1]["payload"]["previous_status"] == "on-hold"


async def test_a_draft_moves_to_another_start_date(clinic):
    treatment = await start_tb(clinic)
    moved = data(await clinic.client.patch(
        f"/api/patient-treatments/{treatment['id']}", json={"start_date": "2026-02-15"},
        headers=clinic.h("doctor")))
    assert (moved["start_date"], moved["end_date"]) == ("2026-02-15", "2026-08-15")
    assert activity(moved, "continuation-hr")["start"] == "2026-04-15"


async def test_a_patients_treatments_are_listed_for_those_who_see_the_patient(clinic):
    first = await start_tb(clinic)
    art = await shipped(clinic, "hiv-art-tld")
    data(await clinic.post("doctor", "/api/patient-treatments", {
        "patient_id": clinic.patient_id, "protocol_id": art["id"], "status": "active"}), 201)
    url = f"/api/patients/{clinic.patient_id}/treatments"
    page = (await clinic.get("nurse", url)).json()
    assert page["meta"]["total"] == 2
    drafts = data(await clinic.get("doctor", url, status="draft"))
    assert [t["id"] for t in drafts] == [first["id"]]
    for who in ("stranger", "other_admin"):
        assert (await clinic.get(who, url)).status_code == 403, who
    # the receptionist sees the patient, not their clinical records
    assert (await clinic.get("receptionist", url)).json()["meta"]["total"] == 0
    mine = await clinic.client.get(url, headers=clinic.h("doctor"), params={"limit": 1})
    assert mine.json()["meta"] == {"page": 1, "limit": 1, "total": 2}


async def test_a_protocol_in_use_is_retired_not_deleted_and_keeps_its_content(clinic):
    made = data(await clinic.post("doctor", "/api/treatments",
                                  malaria_protocol(status="active")), 201)
    data(await clinic.post("doctor", "/api/patient-treatments", {
        "patient_id": clinic.patient_id, "protocol_id": made["id"]}), 201)
    url = f"/api/treatments/{made['id']}"
    changed = await clinic.client.patch(url, json={"title": "Changed"},
                                        headers=clinic.h("doctor"))
    assert refusal(changed) == (409, "PROTOCOL_IN_USE")
    removal = data(await clinic.client.delete(url, headers=clinic.h("admin")))
    assert removal == {"id": made["id"], "deleted": False, "retired": True}
    kept = data(await clinic.get("doctor", url))
    assert kept["status"] == "retired" and kept["title"] == made["title"]


async def test_an_activity_keeps_its_title_code_and_instructions(clinic):
    treatment = await start_tb(clinic)
    intensive = activity(treatment, "intensive-hrze")
    assert intensive["title"] == "Intensive phase: HRZE daily"
    assert intensive["instructions"].startswith("4FDC tablets")
    assert intensive["repeat"] == {"frequency": 1, "period": 1, "unit": "d"}
    smear = activity(treatment, "smear-end-intensive")
    assert smear["code"]["code"] == "11545-1" and smear["kind"] == "test"


async def test_a_care_plan_that_is_no_treatment_is_not_found_here(clinic):
    other = await clinic.client.post("/fhir/CarePlan", headers=clinic.h("doctor"), json={
        "resourceType": "CarePlan", "status": "active", "intent": "plan",
        "subject": {"reference": f"Patient/{clinic.patient_id}"}})
    assert other.status_code == 201, other.text
    for treatment_id in (other.json()["id"], "no-such-treatment"):
        response = await clinic.client.patch(f"/api/patient-treatments/{treatment_id}",
                                             json={"status": "completed"},
                                             headers=clinic.h("doctor"))
        assert refusal(response) == (404, "NOT_FOUND")


async def test_the_patient_reads_their_own_treatments_and_changes_none(clinic):
    from tests.conftest import register_and_login
    from tests.platform_api.patients.conftest import link_account

    treatment = await start_tb(clinic, status="active")
    amina = await register_and_login(clinic.client, first_name="Amina", last_name="Odhiambo")
    await link_account(clinic.app, clinic.patient_id, amina)
    own = await clinic.client.get(f"/api/patients/{clinic.patient_id}/treatments",
                                  headers=amina["headers"])
    assert [t["id"] for t in own.json()["data"]] == [treatment["id"]]
    changed = await clinic.client.patch(
        f"/api/patient-treatments/{treatment['id']}", headers=amina["headers"],
        json={"activities": [{"id": "intensive-hrze", "status": "completed"}]})
    assert changed.status_code == 403
