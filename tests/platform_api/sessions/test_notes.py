"""Clinical notes: Compositions with SOAP sections, signed (final, with an attester) by a
doctor or nurse, changed afterwards only by amendment, listed per patient."""

from __future__ import annotations

from typing import Any

from platform_api.sessions.notes import narrative, narrative_text
from tests.conftest import register_and_login
from tests.platform_api.sessions.conftest import data, refusal

JSON = dict[str, Any]
SOAP = {"subjective": "Headache for 3 days.\nNo fever <none> & no vomiting.",
        "objective": "BP 150/95 mmHg, pulse 88/min.",
        "assessment": "Essential hypertension, newly diagnosed.",
        "plan": "Start amlodipine 5 mg daily; review in two weeks."}


async def write_note(client, clinic, who: str = "doctor", **fields: Any):  # type: ignore[no-untyped-def]
    return await client.post("/api/clinical/notes", headers=clinic[who]["headers"], json={
        "patient_id": clinic["patient_id"], "encounter_id": clinic["encounter_id"],
        "type": "consultation", **SOAP, **fields})


def test_section_text_survives_the_xhtml_narrative() -> None:
    text = "Line one <b> & \"quoted\"\nline two"
    div = narrative(text)["div"]
    assert div.startswith('<div xmlns="http://www.w3.org/1999/xhtml">')
    assert "<b>" not in div and "<br/>" in div
    assert narrative_text(narrative(text)) == text


async def test_a_note_is_a_composition_with_soap_sections(client, clinic, app) -> None:
    note = data(await write_note(client, clinic), 201)
    assert (note["status"], note["type"], note["title"]) == ("preliminary", "consultation",
                                                             "Consult note")
    assert {k: note[k] for k in SOAP} == SOAP
    assert note["author_ids"] == [clinic["doctor"]["user"]["id"]]
    composition = (await client.get(f"/fhir/Composition/{note['id']}",
                                    headers=clinic["doctor"]["headers"])).json()
    assert composition["type"]["coding"][0] == {"system": "http://loinc.org",
                                                "code": "11488-4", "display": "Consult note"}
    assert [s["code"]["coding"][0]["code"] for s in composition["section"]] == [
        "61150-9", "61149-1", "51848-0", "18776-5"]
    assert composition["encounter"]["reference"] == f"Encounter/{clinic['encounter_id']}"
    # a draft is edited freely; a nurse's edit adds her as an author
    edited = data(await client.patch(f"/api/clinical/notes/{note['id']}",
                                     headers=clinic["nurse"]["headers"],
                                     json={"objective": "BP 150/95 mmHg, pulse 88/min, "
                                                        "temperature 36.8 Cel."}))
    assert edited["objective"].endswith("36.8 Cel.")
    assert edited["author_ids"] == [clinic["doctor"]["user"]["id"],
                                    clinic["nurse"]["user"]["id"]]


async def test_signing_makes_it_final_and_amendments_keep_the_signed_version(
        client, clinic, app) -> None:
    events: list[JSON] = []

    async def seen(event: JSON) -> None:
        events.append(event)
    app.state.services.bus.subscribe("platform.clinical.*", seen)
    doctor = clinic["doctor"]["headers"]
    note = data(await write_note(client, clinic), 201)
    signed = data(await client.post(f"/api/clinical/notes/{note['id']}/sign", headers=doctor,
                                    json={}))
    assert (signed["status"], signed["signed_by"]) == ("final", clinic["doctor"]["user"]["id"])
    again = await client.post(f"/api/clinical/notes/{note['id']}/sign", headers=doctor,
                              json={})
    assert refusal(again) == (409, "INVALID_TRANSITION")
    silent = await client.patch(f"/api/clinical/notes/{note['id']}", headers=doctor,
                                json={"plan": "Start amlodipine 10 mg daily."})
    assert refusal(silent) == (422, "VALIDATION_ERROR")
    assert silent.json()["error"]["field"] == "amendment_reason"
    amended = data(await client.patch(f"/api/clinical/notes/{note['id']}", headers=doctor, json={
        "plan": "Start amlodipine 10 mg daily; review in one week.",
        "amendment_reason": "Dose corrected after reviewing the home readings"}))
    assert (amended["status"], amended["amendment_reason"]) == (
        "amended", "Dose corrected after reviewing the home readings")
    assert int(amended["version"]) == int(signed["version"]) + 1
    as_signed = (await client.get(
        f"/fhir/Composition/{note['id']}/_history/{signed['version']}", headers=doctor)).json()
    assert as_signed["status"] == "final"
    assert as_signed["attester"][0]["mode"] == "legal"
    assert "5 mg" in as_signed["section"][3]["text"]["div"]
    await app.state.services.bus.drain()
    topics = [e["topic"] for e in events]
    assert topics == ["platform.clinical.note_created", "platform.clinical.note_signed",
                      "platform.clinical.note_amended"]
    assert events[1]["payload"]["by"] == clinic["doctor"]["user"]["id"]


async def test_only_doctors_and_nurses_of_the_clinic_sign(client, clinic, other_clinic
                                                          ) -> None:
    note = data(await write_note(client, clinic), 201)
    sign = f"/api/clinical/notes/{note['id']}/sign"
    admin = await client.post(sign, headers=clinic["admin"]["headers"], json={})
    assert refusal(admin) == (403, "FORBIDDEN")
    receptionist = await client.post(sign, headers=clinic["receptionist"]["headers"], json={})
    assert receptionist.status_code == 403
    outsider = await client.post(sign, headers=other_clinic["admin"]["headers"], json={})
    assert outsider.status_code == 403
    assert data(await client.post(sign, headers=clinic["nurse"]["headers"], json={}))[
        "signed_by"] == clinic["nurse"]["user"]["id"]
    amend = await client.patch(f"/api/clinical/notes/{note['id']}",
                               headers=clinic["admin"]["headers"],
                               json={"plan": "x", "amendment_reason": "tidy"})
    assert amend.status_code == 403


async def test_notes_are_listed_per_patient_with_filters(client, clinic, other_clinic) -> None:
    first = data(await write_note(client, clinic), 201)
    second = data(await write_note(client, clinic, type="progress"), 201)
    data(await client.post(f"/api/clinical/notes/{first['id']}/sign",
                           headers=clinic["doctor"]["headers"], json={}))
    path = f"/api/clinical/notes/patient/{clinic['patient_id']}"
    listed = await client.get(path, headers=clinic["nurse"]["headers"])
    assert listed.json()["meta"]["total"] == 2
    assert {n["id"] for n in listed.json()["data"]} == {first["id"], second["id"]}
    finals = await client.get(path + "?status=final&limit=1",
                              headers=clinic["doctor"]["headers"])
    assert [n["id"] for n in finals.json()["data"]] == [first["id"]]
    progress = await client.get(path + "?type=progress", headers=clinic["doctor"]["headers"])
    assert [n["id"] for n in progress.json()["data"]] == [second["id"]]
    assert (await client.get(path, headers=other_clinic["admin"]["headers"])).status_code \
        == 403
    assert refusal(await client.get("/api/clinical/notes/patient/nobody",
                                    headers=clinic["doctor"]["headers"])) == (404, "NOT_FOUND")
    assert (await client.get(path)).status_code == 401


async def test_note_refusals(client, clinic, other_clinic) -> None:
    assert refusal(await write_note(client, clinic, patient_id="nobody")) == (404, "NOT_FOUND")
    assert (await write_note(client, clinic, who="receptionist")).status_code == 403
    stranger = await register_and_login(client, first_name="Juma", last_name="Hamisi")
    assert (await client.post("/api/clinical/notes", headers=stranger["headers"], json={
        "patient_id": clinic["patient_id"], **SOAP})).status_code == 403
    bad = await write_note(client, clinic, type="poem")
    assert refusal(bad) == (422, "VALIDATION_ERROR")
    note = data(await write_note(client, clinic), 201)
    assert (await client.get(f"/api/clinical/notes/{note['id']}",
                             headers=other_clinic["admin"]["headers"])).status_code == 403
    assert refusal(await client.get("/api/clinical/notes/nothing-here",
                                    headers=clinic["doctor"]["headers"])) == (404, "NOT_FOUND")


async def test_a_consent_opens_the_patients_notes_to_another_clinic(client, clinic,
                                                                  other_clinic) -> None:
    note = data(await write_note(client, clinic), 201)
    theirs = other_clinic["admin"]["headers"]
    path = f"/api/clinical/notes/patient/{clinic['patient_id']}"
    assert (await client.get(f"/api/clinical/notes/{note['id']}", headers=theirs)
            ).status_code == 403
    consent = await client.post("/fhir/Consent", headers=clinic["admin"]["headers"], json={
        "resourceType": "Consent", "status": "active",
        "scope": {"coding": [{"system": "http://terminology.hl7.org/CodeSystem/consentscope",
                              "code": "patient-privacy"}]},
        "category": [{"coding": [{"system": "http://loinc.org", "code": "59284-0"}]}],
        "patient": {"reference": f"Patient/{clinic['patient_id']}"},
        "policyRule": {"coding": [{"system": "http://terminology.hl7.org/CodeSystem/v3-ActCode",
                                   "code": "OPTIN"}]},
        "provision": {"type": "permit", "actor": [{
            "role": {"coding": [{"system": "http://terminology.hl7.org/CodeSystem/v3-RoleClass",
                                 "code": "PROV"}]},
            "reference": {"reference": f"Organization/{other_clinic['org_id']}"}}]}})
    assert consent.status_code == 201, consent.text
    assert data(await client.get(f"/api/clinical/notes/{note['id']}", headers=theirs))[
        "id"] == note["id"]
    assert (await client.get(path, headers=theirs)).json()["meta"]["total"] == 1
    # they write their own note for the patient; it belongs to their clinic
    own = data(await write_note(client, {**clinic, "doctor": other_clinic["admin"]},
                                encounter_id=None), 201)
    fhir = (await client.get(f"/fhir/Composition/{own['id']}", headers=theirs)).json()
    assert {"system": "urn:healthplatform:organization", "code": other_clinic["org_id"]} in \
        fhir["meta"]["security"]
