"""Dictation: ordered segments (text, or a transcript's) merged into a clinical note."""

from __future__ import annotations

from typing import Any

from tests.platform_api.sessions.conftest import data, ready_recording, refusal, wav_bytes

JSON = dict[str, Any]


async def start(client, clinic, **fields: Any) -> JSON:  # type: ignore[no-untyped-def]
    return data(await client.post("/api/clinical/dictation", headers=clinic["doctor"]["headers"],
                                  json={"patient_id": clinic["patient_id"],
                                        "encounter_id": clinic["encounter_id"], **fields}), 201)


async def segment(client, clinic, dictation_id: str, **body: Any):  # type: ignore[no-untyped-def]
    return await client.post(f"/api/clinical/dictation/{dictation_id}/segments",
                             headers=clinic["doctor"]["headers"], json=body)


async def test_segments_are_ordered_and_merged_into_a_new_note(client, clinic, app) -> None:
    events: list[JSON] = []

    async def seen(event: JSON) -> None:
        events.append(event)
    app.state.services.bus.subscribe("platform.clinical.dictation_merged", seen)
    dictation = await start(client, clinic, title="Ward round")
    assert (dictation["status"], dictation["segments"]) == ("open", [])
    # out of order on purpose: the sequence numbers order them
    data(await segment(client, clinic, dictation["id"], sequence=2,
                       text="She also reports dysuria."), 201)
    view = data(await segment(client, clinic, dictation["id"], sequence=1,
                              text="Fever since Monday."), 201)
    assert [s["sequence"] for s in view["segments"]] == [1, 2]
    data(await segment(client, clinic, dictation["id"], sequence=3, section="plan",
                       text="Urinalysis and urine culture today."), 201)
    duplicate = await segment(client, clinic, dictation["id"], sequence=2, text="again")
    assert refusal(duplicate) == (409, "SEGMENT_EXISTS")
    merged = data(await client.post(f"/api/clinical/dictation/{dictation['id']}/merge",
                                    headers=clinic["doctor"]["headers"], json={}))
    assert merged["status"] == "merged" and merged["note_id"]
    note = data(await client.get(f"/api/clinical/notes/{merged['note_id']}",
                                 headers=clinic["doctor"]["headers"]))
    assert note["subjective"] == "Fever since Monday.\nShe also reports dysuria."
    assert note["plan"] == "Urinalysis and urine culture today."
    assert (note["status"], note["dictation_id"]) == ("preliminary", dictation["id"])
    late = await segment(client, clinic, dictation["id"], sequence=4, text="late")
    assert refusal(late) == (409, "DICTATION_CLOSED")
    await app.state.services.bus.drain()
    assert events[0]["payload"] == {"dictation_id": dictation["id"],
                                    "note_id": note["id"], "patient_id": clinic["patient_id"],
                                    "segments": 3}


async def test_a_dictation_fills_an_open_note_and_takes_transcripts(client, clinic) -> None:
    headers = clinic["doctor"]["headers"]
    note = data(await client.post("/api/clinical/notes", headers=headers, json={
        "patient_id": clinic["patient_id"], "assessment": "Lower urinary tract infection."}),
        201)
    dictation = await start(client, clinic, note_id=note["id"])
    recording = await ready_recording(client, clinic, wav_bytes(0.5))
    transcript = data(await client.post("/api/sessions/transcripts", headers=headers, json={
        "recording_id": recording["id"], "provider": "manual"}), 201)
    pending = await segment(client, clinic, dictation["id"], sequence=1,
                            transcript_id=transcript["id"], section="plan")
    assert refusal(pending) == (409, "TRANSCRIPT_NOT_READY")
    data(await client.patch(f"/api/sessions/transcripts/{transcript['id']}", headers=headers,
                            json={"text": "Nitrofurantoin 100 mg twice daily for five days."}))
    data(await segment(client, clinic, dictation["id"], sequence=1,
                       transcript_id=transcript["id"], section="plan"), 201)
    both = await segment(client, clinic, dictation["id"], sequence=2, text="x",
                         transcript_id=transcript["id"])
    assert refusal(both) == (422, "VALIDATION_ERROR")
    merged = data(await client.post(f"/api/clinical/dictation/{dictation['id']}/merge",
                                    headers=headers, json={}))
    assert merged["note_id"] == note["id"]
    filled = data(await client.get(f"/api/clinical/notes/{note['id']}", headers=headers))
    assert filled["assessment"] == "Lower urinary tract infection."
    assert filled["plan"] == "Nitrofurantoin 100 mg twice daily for five days."


async def test_dictation_refusals(client, clinic, other_clinic) -> None:
    headers = clinic["doctor"]["headers"]
    empty = await start(client, clinic)
    assert refusal(await client.post(f"/api/clinical/dictation/{empty['id']}/merge",
                                     headers=headers, json={})) == (409, "NO_SEGMENTS")
    note = data(await client.post("/api/clinical/notes", headers=headers, json={
        "patient_id": clinic["patient_id"], "plan": "Review."}), 201)
    data(await client.post(f"/api/clinical/notes/{note['id']}/sign", headers=headers, json={}))
    signed = await client.post("/api/clinical/dictation", headers=headers, json={
        "patient_id": clinic["patient_id"], "note_id": note["id"]})
    assert refusal(signed) == (409, "NOTE_SIGNED")
    outsider = await client.post(f"/api/clinical/dictation/{empty['id']}/segments",
                                 headers=other_clinic["admin"]["headers"],
                                 json={"sequence": 1, "text": "x"})
    assert outsider.status_code == 403
    receptionist = await client.post("/api/clinical/dictation",
                                     headers=clinic["receptionist"]["headers"],
                                     json={"patient_id": clinic["patient_id"]})
    assert receptionist.status_code == 403
    assert refusal(await client.post("/api/clinical/dictation/nothing/segments",
                                     headers=headers, json={"sequence": 1, "text": "x"})) == \
        (404, "NOT_FOUND")
    zero = await segment(client, clinic, empty["id"], sequence=0, text="x")
    assert refusal(zero) == (422, "VALIDATION_ERROR")
