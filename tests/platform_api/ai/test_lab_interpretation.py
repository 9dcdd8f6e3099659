"""POST /api/ai/lab-interpretation: a result against its range, critical limits, the
patient's previous values, panel patterns and KDIGO acute kidney injury."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from tests.platform_api.ai.conftest import data, lab, refusal, write

URL = "/api/ai/lab-interpretation"


def hours_ago(hours: float) -> str:
    return (datetime.now(UTC) - timedelta(hours=hours)).strftime("%Y-%m-%dT%H:%M:%SZ")


async def test_full_blood_count_with_low_haemoglobin_and_mcv_is_microcytic_anaemia(clinic):
    hb = await lab(clinic, "718-7", 9.1, "g/dL", hours_ago(1), "Haemoglobin")
    mcv = await lab(clinic, "787-2", 68, "fL", hours_ago(1), "MCV")
    plt = await lab(clinic, "777-3", 250, "10*3/uL", hours_ago(1), "Platelets")
    report = await write(clinic, {
        "resourceType": "DiagnosticReport", "status": "final",
        "code": {"coding": [{"system": "http://loinc.org", "code": "58410-2"}]},
        "subject": {"reference": f"Patient/{clinic.patient_id}"},
        "result": [{"reference": f"Observation/{o['id']}"} for o in (hb, mcv, plt)]})
    answer = data(await clinic.post("doctor", URL, {"patient_id": clinic.patient_id,
                                                    "lab_result_id": report["id"]}))
    by_code = {r["code"]: r for r in answer["results"]}
    assert answer["lab_result_type"] == "DiagnosticReport"
    # the patient is female: the table's female interval 12.0-15.5 g/dL
    assert by_code["718-7"]["flag"] == "low" and by_code["718-7"]["reference_low"] == 12.0
    assert by_code["718-7"]["reference_source"] == "table"
    assert by_code["787-2"]["flag"] == "low" and by_code["777-3"]["flag"] == "normal"
    assert [p["code"] for p in answer["patterns"]] == ["microcytic-anaemia"]
    assert set(answer["patterns"][0]["evidence"]) == {f"Observation/{hb['id']}",
                                                      f"Observation/{mcv['id']}"}
    support = answer["support"]
    assert support["based_on"][0]["kind"] == "rule" and "not a diagnosis" in \
        support["disclaimer"]
    assert {i["reference"] for i in support["inputs"]} == {
        f"Observation/{o['id']}" for o in (hb, mcv, plt)}
    # the call is audited, readable by the clinic's administrator
    event = data(await clinic.get("admin", f"/api/clinical/audit/{support['audit_event_id']}"))
    assert event["subtype"] == "ai-lab-interpretation" and event["action"] == "E"
    assert event["user_id"] == clinic.user_id("doctor")
    assert event["patient_ids"] == [clinic.patient_id]


async def test_critical_potassium_with_a_large_delta_is_flagged(clinic):
    earlier = await lab(clinic, "2823-3", 4.2, "mmol/L", hours_ago(30))
    now = await lab(clinic, "2823-3", 6.8, "mmol/L", hours_ago(1), reference=(3.6, 5.0))
    answer = data(await clinic.post("doctor", URL, {"patient_id": clinic.patient_id,
                                                    "lab_result_id": now["id"]}))
    result = next(r for r in answer["results"] if r["observation_id"] == now["id"])
    assert result["reference_source"] == "laboratory" and result["reference_high"] == 5.0
    assert result["flag"] == "high" and result["critical"] is True
    assert result["critical_limit"] == 6.2
    assert result["previous"]["observation_id"] == earlier["id"]
    assert result["delta"] == 2.6 and result["delta_exceeded"] is True
    assert answer["summary"].startswith("1 critical")


async def test_creatinine_rise_meets_kdigo_stage_2(clinic):
    await lab(clinic, "2160-0", 0.9, "mg/dL", hours_ago(24 * 5))
    await lab(clinic, "14682-9", 110, "umol/L", hours_ago(30))  # 1.24 mg/dL
    now = await lab(clinic, "2160-0", 2.0, "mg/dL", hours_ago(1))
    answer = data(await clinic.post("nurse", URL, {"patient_id": clinic.patient_id,
                                                   "lab_result_id": now["id"]}))
    aki = next(p for p in answer["patterns"] if p["code"] == "aki-kdigo")
    assert aki["stage"] == 2 and "2.2 times" in aki["suggestion"]
    assert answer["support"]["missing"] == []


async def test_creatinine_without_history_names_what_is_missing(clinic):
    now = await lab(clinic, "2160-0", 0.8, "mg/dL", hours_ago(1))
    answer = data(await clinic.post("doctor", URL, {"patient_id": clinic.patient_id,
                                                    "lab_result_id": now["id"]}))
    assert answer["patterns"] == []
    assert answer["support"]["missing"] == [
        "creatinine of the previous 7 days (KDIGO AKI check)"]


async def test_refusals(clinic):
    hb = await lab(clinic, "718-7", 13.0, "g/dL", hours_ago(1))
    body = {"patient_id": clinic.patient_id, "lab_result_id": hb["id"]}
    # roles outside the care team, and another clinic's administrator
    assert refusal(await clinic.post("receptionist", URL, body)) == (
        403, "CLINICAL_ROLE_REQUIRED")
    assert refusal(await clinic.post("stranger", URL, body)) == (403, "CLINICAL_ROLE_REQUIRED")
    assert (await clinic.post("other_admin", URL, body)).status_code == 403
    assert refusal(await clinic.post("doctor", URL, {**body, "lab_result_id": "nope"})) == (
        404, "LAB_RESULT_NOT_FOUND")
    assert refusal(await clinic.post("doctor", URL, {**body, "patient_id": "nope"})) == (
        404, "NOT_FOUND")
    assert refusal(await clinic.post("doctor", URL, {"patient_id": clinic.patient_id})) == (
        422, "VALIDATION_ERROR")
    other = data(await clinic.post("admin", f"/api/organizations/{clinic.org_id}/patients", {
        "first_name": "Juma", "last_name": "Kiprono", "date_of_birth": "1970-01-02",
        "gender": "male", "mrn": "KCC-0002"}), 201)
    assert refusal(await clinic.post("doctor", URL, {"patient_id": other["id"],
                                                     "lab_result_id": hb["id"]})) == (
        422, "LAB_RESULT_PATIENT_MISMATCH")


async def test_another_organization_interprets_with_the_patients_consent(clinic):
    hb = await lab(clinic, "718-7", 10.2, "g/dL", hours_ago(2))
    body = {"patient_id": clinic.patient_id, "lab_result_id": hb["id"]}
    assert (await clinic.post("other_admin", URL, body)).status_code == 403
    await write(clinic, {
        "resourceType": "Consent", "status": "active",
        "scope": {"coding": [{"system": "http://terminology.hl7.org/CodeSystem/consentscope",
                              "code": "patient-privacy"}]},
        "category": [{"coding": [{"system": "http://loinc.org", "code": "59284-0"}]}],
        "patient": {"reference": f"Patient/{clinic.patient_id}"},
        "provision": {"type": "permit", "actor": [{
            "role": {"coding": [{"system": "http://terminology.hl7.org/CodeSystem/v3-RoleClass",
                                 "code": "PROV"}]},
            "reference": {"reference": f"Organization/{clinic.other_org_id}"}}]}},
        who="admin")
    answer = data(await clinic.post("other_admin", URL, body))
    assert answer["results"][0]["flag"] == "low"
    # the trail belongs to the patient's organization, which reads who looked
    event = data(await clinic.get("admin",
                                  f"/api/clinical/audit/{answer['support']['audit_event_id']}"))
    assert event["user_id"] == clinic.user_id("other_admin")
    assert event["organization_ids"] == [clinic.org_id]
