"""Extraction: proposals with evidence from a transcript, committed in one transaction."""

from __future__ import annotations

from typing import Any

from platform_api.sessions.extractor import RuleExtractor
from tests.platform_api.sessions.conftest import data, ready_recording, refusal, wav_bytes

JSON = dict[str, Any]
CONSULTATION = (
    "Blood pressure is 150 over 95 and pulse 88 beats per minute. Temperature 38.5 degrees. "
    "Oxygen saturation 97 percent. She is allergic to penicillin but denies allergy to sulfa "
    "drugs. She takes metformin 500 mg twice daily and amlodipine 5 mg daily. She stopped "
    "taking ibuprofen. Known hypertension and type 2 diabetes. No history of asthma. Her "
    "mother has epilepsy. Possible malaria. Review in two weeks with a repeat blood count.")


def found(text: str) -> list[tuple[str, str, bool, bool]]:
    return [(f.kind, f.evidence.text, f.negated, f.uncertain)
            for f in RuleExtractor().extract(text)]


def test_the_rules_find_vitals_medications_allergies_problems_and_follow_ups() -> None:
    assert found(CONSULTATION) == [
        ("vital-sign", "Blood pressure is 150 over 95", False, False),
        ("vital-sign", "pulse 88 beats per minute", False, False),
        ("vital-sign", "Temperature 38.5 degrees", False, False),
        ("vital-sign", "Oxygen saturation 97 percent", False, False),
        ("allergy", "penicillin", False, False),
        ("allergy", "sulfa drugs", True, False),
        ("medication", "metformin", False, False),
        ("medication", "amlodipine", False, False),
        ("medication", "ibuprofen", True, False),
        ("problem", "hypertension", False, False),
        ("problem", "type 2 diabetes", False, False),
        ("problem", "asthma", True, False),
        ("problem", "malaria", False, True),
        ("follow-up", "Review in two weeks with a repeat blood count", False, False),
    ]


def test_negation_respects_pseudo_triggers_terminations_and_implausible_values() -> None:
    assert found("No increase in the cough.") == [("problem", "cough", False, False)]
    assert found("No fever but she has malaria.") == [("problem", "fever", True, False),
                                                      ("problem", "malaria", False, False)]
    assert found("Pulse 400.") == []
    assert found("No known drug allergies.") == [
        ("allergy", "No known drug allergies", False, False)]
    assert found("Allergic to amoxicillin.") == [("allergy", "amoxicillin", False, False)]


async def test_an_extraction_proposes_and_commits_in_one_transaction(client, clinic, app
                                                                     ) -> None:
    events: list[JSON] = []

    async def seen(event: JSON) -> None:
        events.append(event)
    app.state.services.bus.subscribe("platform.sessions.extraction_committed", seen)
    headers = clinic["doctor"]["headers"]
    recording = await ready_recording(client, clinic, wav_bytes(0.5))
    transcript = data(await client.post("/api/sessions/transcripts", headers=headers, json={
        "recording_id": recording["id"], "provider": "manual"}), 201)
    data(await client.patch(f"/api/sessions/transcripts/{transcript['id']}", headers=headers,
                            json={"text": CONSULTATION}))
    made = data(await client.post("/api/sessions/extractions", headers=headers,
                                  json={"transcript_id": transcript["id"]}), 201)
    assert (made["status"], made["patient_id"], made["encounter_id"]) == (
        "proposed", clinic["patient_id"], clinic["encounter_id"])
    proposals = {p["evidence"]["text"]: p for p in made["proposals"]}
    bp = proposals["Blood pressure is 150 over 95"]
    assert bp["evidence"]["start"] == 0
    assert [c["valueQuantity"]["value"] for c in bp["resource"]["component"]] == [150, 95]
    assert bp["resource"]["component"][0]["valueQuantity"]["code"] == "mm[Hg]"
    sulfa = proposals["sulfa drugs"]
    assert sulfa["resource"]["verificationStatus"]["coding"][0]["code"] == "refuted"
    metformin = proposals["metformin"]["resource"]
    assert metformin["medicationCodeableConcept"]["coding"][0]["code"] == "6809"
    assert metformin["dosage"][0]["text"] == "500 mg twice daily"
    assert proposals["ibuprofen"]["resource"]["status"] == "not-taken"
    got = data(await client.get(f"/api/sessions/extractions/{made['id']}",
                                headers=clinic["nurse"]["headers"]))
    assert got["proposals"] == made["proposals"]
    accept = [bp["id"], proposals["penicillin"]["id"], proposals["metformin"]["id"],
              proposals["hypertension"]["id"],
              proposals["Review in two weeks with a repeat blood count"]["id"]]
    committed = data(await client.post(f"/api/sessions/extractions/{made['id']}/commit",
                                       headers=headers, json={"accept": accept}))
    assert committed["status"] == "committed"
    decided = {p["id"]: (p["decision"], p["committed_as"]) for p in committed["proposals"]}
    written = [decided[p][1] for p in accept]
    assert [w.split("/")[0] for w in written] == [
        "Observation", "AllergyIntolerance", "MedicationStatement", "Condition", "Task"]
    assert all(decision == "rejected" for p, (decision, _) in decided.items()
               if p not in accept)
    observation = (await client.get(f"/fhir/{written[0]}", headers=headers)).json()
    assert observation["subject"]["reference"] == f"Patient/{clinic['patient_id']}"
    assert observation["code"]["coding"][0]["code"] == "85354-9"
    follow_up = data(await client.get(f"/api/sessions/action-items/{written[4].split('/')[1]}",
                                      headers=headers))
    assert follow_up["status"] == "requested" and follow_up["due_date"]
    again = await client.post(f"/api/sessions/extractions/{made['id']}/commit",
                              headers=headers, json={"accept": []})
    assert refusal(again) == (409, "ALREADY_COMMITTED")
    await app.state.services.bus.drain()
    assert events[0]["payload"]["created"] == written


async def test_a_refused_proposal_writes_nothing(client, clinic, other_clinic) -> None:
    headers = clinic["doctor"]["headers"]
    made = data(await client.post("/api/sessions/extractions", headers=headers, json={
        "patient_id": clinic["patient_id"], "text": "Pulse 72. Known asthma."}), 201)
    ids = [p["id"] for p in made["proposals"]]
    unknown = await client.post(f"/api/sessions/extractions/{made['id']}/commit",
                                headers=headers, json={"accept": ["p99"]})
    assert refusal(unknown) == (422, "UNKNOWN_PROPOSAL")
    outsider = await client.post(f"/api/sessions/extractions/{made['id']}/commit",
                                 headers=other_clinic["admin"]["headers"], json={"accept": ids})
    assert outsider.status_code == 403
    # the nurse of the clinic may write them all
    data(await client.post(f"/api/sessions/extractions/{made['id']}/commit",
                           headers=clinic["nurse"]["headers"], json={"accept": ids}))
    conditions = (await client.get(f"/fhir/Condition?subject=Patient/{clinic['patient_id']}",
                                   headers=headers)).json()
    assert len(conditions.get("entry", [])) == 1


async def test_extraction_refusals(client, clinic, other_clinic) -> None:
    headers = clinic["doctor"]["headers"]
    neither = await client.post("/api/sessions/extractions", headers=headers, json={})
    assert refusal(neither) == (422, "VALIDATION_ERROR")
    theirs = await client.post("/api/sessions/extractions",
                               headers=other_clinic["admin"]["headers"],
                               json={"patient_id": clinic["patient_id"], "text": "Pulse 72."})
    assert theirs.status_code == 403
    receptionist = await client.post("/api/sessions/extractions",
                                     headers=clinic["receptionist"]["headers"],
                                     json={"patient_id": clinic["patient_id"],
                                           "text": "Pulse 72."})
    assert receptionist.status_code == 403
    missing = await client.post("/api/sessions/extractions", headers=headers,
                                json={"transcript_id": "nothing"})
    assert refusal(missing) == (404, "NOT_FOUND")
    made = data(await client.post("/api/sessions/extractions", headers=headers, json={
        "patient_id": clinic["patient_id"], "text": "Pulse 72."}), 201)
    assert (await client.get(f"/api/sessions/extractions/{made['id']}",
                             headers=other_clinic["admin"]["headers"])).status_code == 403
    assert refusal(await client.get("/api/sessions/extractions/nothing",
                                    headers=headers)) == (404, "NOT_FOUND")


async def test_a_model_extractor_is_kept_to_what_the_text_says(tmp_path) -> None:
    import socket

    from aiohttp import web

    from tests.conftest import make_settings
    from tests.platform_api.scheduling.conftest import served
    from tests.platform_api.sessions.conftest import clinic as make_clinic
    from tests.platform_api.sessions.model_standin import ChatStandIn

    stand_in = ChatStandIn("sk-model-kisumu", findings=[
        {"kind": "vital-sign", "name": "blood pressure", "evidence": "BP 160/100",
         "value": 160, "value2": 100},
        {"kind": "medication", "name": "Paracetamol", "evidence": "paracetamol 1 g",
         "dosage": "1 g three times daily"},
        {"kind": "problem", "name": "pre-eclampsia", "evidence": "suspect pre-eclampsia",
         "uncertain": True},
        {"kind": "problem", "name": "migraine", "evidence": "a migraine she never had"},
        {"kind": "vital-sign", "name": "heart rate", "evidence": "BP 160/100", "value": 900},
    ])
    runner = web.AppRunner(stand_in.app())
    await runner.setup()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    await web.TCPSite(runner, "127.0.0.1", port).start()
    text = "BP 160/100 today. Took paracetamol 1 g for the headache. I suspect pre-eclampsia."
    try:
        settings = make_settings(tmp_path, transcription_workers=0,
                                 extraction_model_url=f"http://127.0.0.1:{port}/v1",
                                 extraction_model_api_key="sk-model-kisumu",
                                 extraction_model_name="clinical-extractor-7b")
        async with served(settings) as (app, client):
            clinic = await make_clinic.__wrapped__(app, client)  # type: ignore[attr-defined]
            headers = clinic["doctor"]["headers"]
            made = data(await client.post("/api/sessions/extractions", headers=headers, json={
                "patient_id": clinic["patient_id"], "text": text, "extractor": "model"}), 201)
            assert made["extractor"] == "model clinical-extractor-7b"
            found = {p["kind"] + ":" + p["evidence"]["text"]: p for p in made["proposals"]}
            # the invented migraine (not in the text) and the implausible pulse are dropped
            assert set(found) == {"vital-sign:BP 160/100", "medication:paracetamol 1 g",
                                  "problem:suspect pre-eclampsia"}
            paracetamol = found["medication:paracetamol 1 g"]["resource"]
            assert paracetamol["medicationCodeableConcept"]["coding"][0]["code"] == "161"
            condition = found["problem:suspect pre-eclampsia"]["resource"]
            assert condition["verificationStatus"]["coding"][0]["code"] == "provisional"
            assert condition["code"]["coding"][1] == {
                "system": "http://hl7.org/fhir/sid/icd-10", "code": "O14.9",
                "display": "Pre-eclampsia"}
            assert stand_in.received[0]["messages"][1]["content"] == text
            stand_in.content = "not json"
            broken = await client.post("/api/sessions/extractions", headers=headers, json={
                "patient_id": clinic["patient_id"], "text": text, "extractor": "model"})
            assert refusal(broken) == (502, "EXTRACTOR_FAILED")
    finally:
        await runner.cleanup()


async def test_the_model_extractor_needs_a_configured_model(client, clinic) -> None:
    missing = await client.post("/api/sessions/extractions", headers=clinic["doctor"]["headers"],
                                json={"patient_id": clinic["patient_id"], "text": "Pulse 72.",
                                      "extractor": "model"})
    assert refusal(missing) == (422, "PROVIDER_NOT_CONFIGURED")
