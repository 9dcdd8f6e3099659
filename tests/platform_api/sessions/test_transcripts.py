"""Transcripts: jobs (Tasks) run by the worker through the in-process Whisper model or an
OpenAI-compatible HTTP service, and transcripts (DocumentReferences) submitted or
corrected by people."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import make_settings
from tests.platform_api.scheduling.conftest import served
from tests.platform_api.sessions.conftest import (
    clinic as make_clinic,
)
from tests.platform_api.sessions.conftest import (
    data,
    ready_recording,
    refusal,
    speak,
    wait_for,
    wav_bytes,
)
from tests.platform_api.sessions.stt_standin import SpeechToTextStandIn
from tests.stand_ins import serving

JSON = dict[str, Any]
KEY = "sk-kisumu-test-0123456789"


async def finished(client, headers, transcript_id: str) -> JSON:  # type: ignore[no-untyped-def]
    async def done() -> JSON | None:
        view = data(await client.get(f"/api/sessions/transcripts/{transcript_id}",
                                     headers=headers))
        return view if view["job"]["status"] in ("completed", "failed", "cancelled") else None
    return await wait_for(done)  # type: ignore[no-any-return]


async def test_the_local_model_transcribes_a_spoken_clip(client, clinic, app, tmp_path) -> None:
    clip = speak("The patient has a fever and a cough. Blood pressure is one hundred and "
                 "forty over ninety.", tmp_path / "consultation.wav")
    events: list[JSON] = []

    async def seen(event: JSON) -> None:
        events.append(event)
    app.state.services.bus.subscribe("platform.sessions.transcript_completed", seen)
    headers = clinic["doctor"]["headers"]
    recording = await ready_recording(client, clinic, clip.read_bytes())
    queued = data(await client.post("/api/sessions/transcripts", headers=headers,
                                    json={"recording_id": recording["id"]}), 201)
    assert queued["status"] == "pending"
    assert queued["job"]["status"] in ("requested", "in-progress")
    assert queued["job"]["provider"] == "local"
    view = await finished(client, headers, queued["id"])
    assert view["job"]["status"] == "completed", view["job"]
    assert view["status"] == "completed"
    words = view["text"].lower()
    for word in ("patient", "fever", "cough", "blood pressure"):
        assert word in words, words
    assert view["segments"] and view["segments"][0]["start"] == 0.0
    assert (view["source"], view["job"]["progress"], view["job"]["model"]) == (
        "automatic", 1.0, "tiny.en")
    assert view["recording_id"] == recording["id"]
    # the recording lists it, and now knows its duration
    again = data(await client.get(f"/api/sessions/recordings/{recording['id']}",
                                  headers=headers))
    assert again["transcripts"] == [{"id": view["id"], "status": "completed"}]
    assert again["duration_seconds"] and again["duration_seconds"] > 3
    # the worker's commit wakes the relay a moment after its write is visible
    await wait_for(lambda: _some(events))
    assert events[0]["payload"]["transcript_id"] == view["id"]
    assert events[0]["payload"]["words"] >= 10


async def _some(found: list[JSON]) -> bool:
    return bool(found)


@pytest.fixture
async def stt() -> AsyncIterator[tuple[SpeechToTextStandIn, str]]:
    stand_in = SpeechToTextStandIn(KEY)
    async with serving(stand_in.app()) as url:
        yield stand_in, url + "/v1"


async def test_the_http_provider_sends_the_audio_to_the_service(tmp_path: Path, stt) -> None:
    stand_in, url = stt
    settings = make_settings(tmp_path, transcription_provider="http",
                             transcription_http_url=url, transcription_http_api_key=KEY,
                             transcription_http_model="whisper-large-v3")
    async with served(settings) as (app, client):
        clinic = await make_clinic.__wrapped__(app, client)  # type: ignore[attr-defined]
        headers = clinic["doctor"]["headers"]
        recording = await ready_recording(client, clinic, wav_bytes(1.0))
        queued = data(await client.post("/api/sessions/transcripts", headers=headers,
                                        json={"recording_id": recording["id"],
                                              "language": "en"}), 201)
        view = await finished(client, headers, queued["id"])
        assert view["job"]["status"] == "completed", view["job"]
        assert view["text"] == stand_in.text
        assert [s["start"] for s in view["segments"]] == [0.0, 2.5]
        assert view["job"]["model"] == "whisper-large-v3"
        assert stand_in.received == [{"model": "whisper-large-v3", "language": "en",
                                      "response_format": "verbose_json",
                                      "bytes": recording["size"]}]
        # a failing service fails the job with its reason, and a retry is allowed
        stand_in.fail_with = 503
        second = data(await client.post("/api/sessions/transcripts", headers=headers,
                                        json={"recording_id": recording["id"]}), 201)
        failed = await finished(client, headers, second["id"])
        assert failed["job"]["status"] == "failed"
        assert "503" in failed["job"]["error"] and "overloaded" in failed["job"]["error"]
        assert failed["status"] == "pending"


async def test_a_person_submits_and_corrects_a_transcript(client, clinic, app) -> None:
    headers = clinic["doctor"]["headers"]
    recording = await ready_recording(client, clinic, wav_bytes(0.5))
    opened = data(await client.post("/api/sessions/transcripts", headers=headers, json={
        "recording_id": recording["id"], "provider": "manual"}), 201)
    assert (opened["status"], opened["job"], opened["source"]) == ("pending", None, "manual")
    text = "Mother reports reduced fetal movements since yesterday."
    submitted = data(await client.patch(
        f"/api/sessions/transcripts/{opened['id']}", headers=clinic["nurse"]["headers"],
        json={"text": text, "segments": [{"start": 0, "end": 3.2, "text": text}]}))
    assert (submitted["status"], submitted["text"]) == ("completed", text)
    assert submitted["transcribed_by"] == clinic["nurse"]["user"]["id"]
    assert submitted["segments"] == [{"start": 0.0, "end": 3.2, "text": text}]
    fixed = "Mother reports reduced fetal movements since this morning."
    no_reason = await client.patch(f"/api/sessions/transcripts/{opened['id']}",
                                   headers=headers, json={"text": fixed})
    assert refusal(no_reason) == (422, "VALIDATION_ERROR")
    corrected = data(await client.patch(
        f"/api/sessions/transcripts/{opened['id']}", headers=headers,
        json={"text": fixed, "reason": "Misheard the time of onset"}))
    assert (corrected["status"], corrected["text"]) == ("corrected", fixed)
    assert corrected["correction_reason"] == "Misheard the time of onset"
    assert int(corrected["version"]) == int(submitted["version"]) + 1
    history = (await client.get(f"/fhir/DocumentReference/{opened['id']}/_history",
                                headers=headers)).json()
    statuses = [e["resource"]["docStatus"] for e in history["entry"]]
    assert statuses == ["amended", "final", "preliminary"]


async def test_a_queued_job_is_cancelled_when_a_person_submits_first(tmp_path: Path) -> None:
    settings = make_settings(tmp_path, transcription_workers=0)  # nothing runs the job
    async with served(settings) as (app, client):
        clinic = await make_clinic.__wrapped__(app, client)  # type: ignore[attr-defined]
        headers = clinic["doctor"]["headers"]
        recording = await ready_recording(client, clinic, wav_bytes(0.5))
        queued = data(await client.post("/api/sessions/transcripts", headers=headers,
                                        json={"recording_id": recording["id"]}), 201)
        assert queued["job"]["status"] == "requested"
        second = await client.post("/api/sessions/transcripts", headers=headers,
                                   json={"recording_id": recording["id"]})
        assert refusal(second) == (409, "TRANSCRIPTION_IN_PROGRESS")
        done = data(await client.patch(f"/api/sessions/transcripts/{queued['id']}",
                                       headers=headers, json={"text": "Typed by hand."}))
        assert (done["status"], done["job"]["status"]) == ("completed", "cancelled")
        # and the worker, when one comes, leaves it alone
        from fhir_server.access import SYSTEM
        from fhir_server.caller import CallerFhir
        from platform_api.sessions.transcripts import claim

        fhir = CallerFhir(app.state.services.fhir, SYSTEM)
        assert await claim(fhir, done["job"]["id"], 3600) is None


async def test_transcription_refusals(client, clinic, other_clinic) -> None:
    headers = clinic["doctor"]["headers"]
    made = data(await client.post("/api/sessions/recordings", headers=headers, json={
        "patient_id": clinic["patient_id"]}), 201)
    not_ready = await client.post("/api/sessions/transcripts", headers=headers,
                                  json={"recording_id": made["id"]})
    assert refusal(not_ready) == (409, "RECORDING_NOT_READY")
    unknown = await client.post("/api/sessions/transcripts", headers=headers,
                                json={"recording_id": "no-such-recording"})
    assert refusal(unknown) == (404, "NOT_FOUND")
    recording = await ready_recording(client, clinic, wav_bytes(0.5))
    no_http = await client.post("/api/sessions/transcripts", headers=headers,
                                json={"recording_id": recording["id"], "provider": "http"})
    assert refusal(no_http) == (422, "PROVIDER_NOT_CONFIGURED")
    receptionist = await client.post("/api/sessions/transcripts",
                                     headers=clinic["receptionist"]["headers"],
                                     json={"recording_id": recording["id"]})
    assert receptionist.status_code == 403
    outsider = await client.post("/api/sessions/transcripts",
                                 headers=other_clinic["admin"]["headers"],
                                 json={"recording_id": recording["id"]})
    assert outsider.status_code == 403
    manual = data(await client.post("/api/sessions/transcripts", headers=headers, json={
        "recording_id": recording["id"], "provider": "manual"}), 201)
    theirs = await client.patch(f"/api/sessions/transcripts/{manual['id']}",
                                headers=other_clinic["admin"]["headers"], json={"text": "x"})
    assert theirs.status_code == 403
    empty = await client.patch(f"/api/sessions/transcripts/{manual['id']}", headers=headers,
                               json={"text": ""})
    assert refusal(empty) == (422, "VALIDATION_ERROR")
    # a DocumentReference that is not a transcript is not one here
    other = await client.post("/fhir/DocumentReference", headers=headers, json={
        "resourceType": "DocumentReference", "status": "current",
        "subject": {"reference": f"Patient/{clinic['patient_id']}"},
        "content": [{"attachment": {"contentType": "text/plain", "data": "aGVsbG8="}}]})
    assert other.status_code == 201, other.text
    assert refusal(await client.get(f"/api/sessions/transcripts/{other.json()['id']}",
                                    headers=headers)) == (404, "NOT_FOUND")


async def test_a_job_is_claimed_once_and_taken_over_when_its_worker_went_silent(
        tmp_path: Path) -> None:
    from fhir_server.access import SYSTEM
    from fhir_server.caller import CallerFhir
    from platform_api.sessions.transcripts import claim, queued

    settings = make_settings(tmp_path, transcription_workers=0)
    async with served(settings) as (app, client):
        clinic = await make_clinic.__wrapped__(app, client)  # type: ignore[attr-defined]
        recording = await ready_recording(client, clinic, wav_bytes(0.5))
        job_id = data(await client.post("/api/sessions/transcripts",
                                        headers=clinic["doctor"]["headers"],
                                        json={"recording_id": recording["id"]}),
                      201)["job"]["id"]
        fhir = CallerFhir(app.state.services.fhir, SYSTEM)
        assert await queued(fhir, 3600) == [job_id]
        job = await claim(fhir, job_id, 3600)
        assert job is not None and job.recording_id == recording["id"]
        assert await claim(fhir, job_id, 3600) is None  # another worker has it
        assert await queued(fhir, 3600) == []
        assert await claim(fhir, job_id, 0) is not None  # silent past the threshold
