"""Recordings: a Media per consultation recording, its audio uploaded in parts to the
blob store (local directory or S3), checked and checksummed, then ready."""

from __future__ import annotations

import hashlib
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import make_settings, register_and_login
from tests.platform_api.scheduling.conftest import served
from tests.platform_api.sessions.conftest import (
    data,
    recording_body,
    refusal,
    wav_bytes,
)

JSON = dict[str, Any]
WAV = {"Content-Type": "audio/wav"}


async def create(client, clinic, who: str = "doctor", **fields: Any):  # type: ignore[no-untyped-def]
    return await client.post("/api/sessions/recordings", headers=clinic[who]["headers"],
                             json=recording_body(clinic, **fields))


async def upload(client, headers, recording_id: str, part: bytes, offset: int | None = None,
                 content_type: str = "audio/wav"):  # type: ignore[no-untyped-def]
    query = "" if offset is None else f"?offset={offset}"
    return await client.post(f"/api/sessions/recordings/{recording_id}/audio{query}",
                             headers={**headers, "Content-Type": content_type}, content=part)


async def test_a_recording_is_a_media_of_the_patient_and_encounter(client, clinic) -> None:
    made = data(await create(client, clinic), 201)
    assert (made["status"], made["size"], made["parts"]) == ("created", 0, 0)
    assert made["recorded_by"] == clinic["doctor"]["user"]["id"]
    media = (await client.get(f"/fhir/Media/{made['id']}",
                              headers=clinic["doctor"]["headers"])).json()
    assert media["status"] == "preparation"
    assert media["subject"]["reference"] == f"Patient/{clinic['patient_id']}"
    assert media["encounter"]["reference"] == f"Encounter/{clinic['encounter_id']}"
    assert media["type"]["coding"][0]["code"] == "audio"
    assert media["content"]["contentType"] == "audio/wav"
    assert {"system": "urn:healthplatform:organization", "code": clinic["org_id"]} in \
        media["meta"]["security"]
    listed = await client.get(f"/api/sessions/recordings?patient_id={clinic['patient_id']}",
                              headers=clinic["nurse"]["headers"])
    assert listed.json()["meta"]["total"] == 1
    assert listed.json()["data"][0]["id"] == made["id"]


async def test_audio_uploaded_in_parts_becomes_ready_with_its_checksum(client, clinic, app
                                                                       ) -> None:
    events: list[JSON] = []

    async def seen(event: JSON) -> None:
        events.append(event)
    app.state.services.bus.subscribe("platform.sessions.recording_ready", seen)
    headers = clinic["doctor"]["headers"]
    audio = wav_bytes(2.0)
    first, second = audio[:40_000], audio[40_000:]
    made = data(await create(client, clinic), 201)
    part = data(await upload(client, headers, made["id"], first, offset=0))
    assert (part["status"], part["size"], part["parts"]) == ("uploading", 40_000, 1)
    stale = await upload(client, headers, made["id"], second, offset=0 + 1)
    assert refusal(stale) == (409, "OFFSET_MISMATCH")
    part = data(await upload(client, headers, made["id"], second, offset=40_000))
    assert (part["size"], part["parts"]) == (len(audio), 2)
    digest = hashlib.sha256(audio).hexdigest()
    ready = data(await client.patch(f"/api/sessions/recordings/{made['id']}/ready",
                                    headers=headers, json={"sha256": digest,
                                                           "duration_seconds": 2.0}))
    assert (ready["status"], ready["size"], ready["sha256"]) == ("ready", len(audio), digest)
    assert ready["duration_seconds"] == 2.0
    media = (await client.get(f"/fhir/Media/{made['id']}", headers=headers)).json()
    assert media["status"] == "completed"
    assert media["content"]["size"] == len(audio)
    assert media["content"]["hash"] == __import__("base64").b64encode(
        hashlib.sha1(audio).digest()).decode()
    played = await client.get(f"/api/sessions/recordings/{made['id']}/audio", headers=headers)
    assert (played.status_code, played.content) == (200, audio)
    assert played.headers["content-type"] == "audio/wav"
    await app.state.services.bus.drain()
    assert [e["payload"]["recording_id"] for e in events] == [made["id"]]
    assert events[0]["payload"]["sha256"] == digest
    closed = await upload(client, headers, made["id"], audio)
    assert refusal(closed) == (409, "RECORDING_CLOSED")
    again = await client.patch(f"/api/sessions/recordings/{made['id']}/ready",
                               headers=headers, json={})
    assert refusal(again) == (409, "INVALID_TRANSITION")


async def test_a_wrong_checksum_keeps_the_recording_open_for_a_fresh_upload(client, clinic
                                                                            ) -> None:
    headers = clinic["doctor"]["headers"]
    made = data(await create(client, clinic), 201)
    data(await upload(client, headers, made["id"], wav_bytes(0.5)))
    wrong = await client.patch(f"/api/sessions/recordings/{made['id']}/ready",
                               headers=headers, json={"sha256": "0" * 64})
    assert refusal(wrong) == (409, "CHECKSUM_MISMATCH")
    fresh = wav_bytes(0.7)
    restarted = data(await upload(client, headers, made["id"], fresh, offset=0))
    assert (restarted["size"], restarted["parts"]) == (len(fresh), 1)
    ready = data(await client.patch(f"/api/sessions/recordings/{made['id']}/ready",
                                    headers=headers,
                                    json={"sha256": hashlib.sha256(fresh).hexdigest()}))
    assert ready["status"] == "ready"


async def test_uploads_are_checked_for_type_content_and_size(client, clinic) -> None:
    headers = clinic["doctor"]["headers"]
    made = data(await create(client, clinic), 201)
    other_type = await upload(client, headers, made["id"], wav_bytes(), content_type="audio/mpeg")
    assert refusal(other_type) == (415, "UNSUPPORTED_MEDIA_TYPE")
    png = b"\x89PNG\r\n\x1a\n" + b"\x00" * 200
    assert refusal(await upload(client, headers, made["id"], png)) == (422, "AUDIO_MISMATCH")
    assert refusal(await upload(client, headers, made["id"], b"")) == (422, "VALIDATION_ERROR")
    too_big = wav_bytes(70.0)  # 2.2 MB: over the tests' 2 MiB recording limit
    assert refusal(await upload(client, headers, made["id"], too_big)) == \
        (413, "RECORDING_TOO_LARGE")
    nothing = await client.patch(f"/api/sessions/recordings/{made['id']}/ready",
                                 headers=headers, json={})
    assert refusal(nothing) == (409, "NO_AUDIO")
    bad_sum = await client.patch(f"/api/sessions/recordings/{made['id']}/ready",
                                 headers=headers, json={"sha256": "not-hex"})
    assert refusal(bad_sum) == (422, "VALIDATION_ERROR")
    not_yet = await client.get(f"/api/sessions/recordings/{made['id']}/audio", headers=headers)
    assert refusal(not_yet) == (409, "RECORDING_NOT_READY")


async def test_create_checks_the_patient_and_the_encounter(client, clinic, other_clinic
                                                           ) -> None:
    assert refusal(await create(client, clinic, patient_id="no-such-patient")) == \
        (404, "NOT_FOUND")
    assert refusal(await create(client, clinic, encounter_id="no-such-encounter")) == \
        (404, "NOT_FOUND")
    from tests.platform_api.sessions.conftest import register_patient, start_encounter

    sibling = await register_patient(client, clinic["admin"]["headers"], clinic["org_id"],
                                     first_name="Baraka", mrn="KCC-2292")
    theirs = await start_encounter(client, clinic["doctor"]["headers"], sibling["id"])
    assert refusal(await create(client, clinic, encounter_id=theirs)) == \
        (422, "ENCOUNTER_PATIENT_MISMATCH")
    bad = await create(client, clinic, content_type="video/mp4")
    assert refusal(bad) == (422, "VALIDATION_ERROR")
    assert bad.json()["error"]["field"] == "content_type"


async def test_each_role_reaches_recordings_as_the_policy_says(client, clinic, other_clinic
                                                               ) -> None:
    made = data(await create(client, clinic), 201)
    path = f"/api/sessions/recordings/{made['id']}"
    assert (await client.get(path)).status_code == 401
    # the nurse records and uploads too (clinical cru)
    nurse = clinic["nurse"]["headers"]
    assert data(await upload(client, nurse, made["id"], wav_bytes()))["parts"] == 1
    # the receptionist may not read or write clinical records
    receptionist = clinic["receptionist"]["headers"]
    assert (await client.get(path, headers=receptionist)).status_code == 403
    assert (await create(client, clinic, who="receptionist")).status_code == 403
    listed = await client.get("/api/sessions/recordings", headers=receptionist)
    assert listed.json()["meta"]["total"] == 0  # only what their own record could hold
    # another clinic sees nothing of it
    outsider = other_clinic["admin"]["headers"]
    assert (await client.get(path, headers=outsider)).status_code == 403
    assert (await upload(client, outsider, made["id"], wav_bytes())).status_code == 403
    mine = await client.get("/api/sessions/recordings", headers=outsider)
    assert mine.json()["meta"]["total"] == 0
    # a signed-in stranger cannot record the patient
    stranger = await register_and_login(client, first_name="Juma", last_name="Hamisi")
    assert (await client.post("/api/sessions/recordings", headers=stranger["headers"],
                              json=recording_body(clinic))).status_code == 403


# --- S3-compatible blob store -----------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def s3_endpoint() -> Iterator[str]:
    """moto's S3 in server mode: a real HTTP S3 API on a local port."""
    server_module = pytest.importorskip("moto.server", reason="needs moto[server]")
    port = _free_port()
    server = server_module.ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.stop()


async def test_recordings_go_to_an_s3_bucket_by_setting(tmp_path: Path, s3_endpoint: str
                                                        ) -> None:
    import boto3

    credentials = {"aws_access_key_id": "healthplatform", "aws_secret_access_key": "s3cret"}
    bucket = boto3.client("s3", endpoint_url=s3_endpoint, region_name="us-east-1",
                          **credentials)
    bucket.create_bucket(Bucket="kisumu-recordings")
    settings = make_settings(tmp_path, blob_store="s3://kisumu-recordings/clinic-a",
                             blob_s3_endpoint_url=s3_endpoint,
                             blob_s3_access_key_id="healthplatform",
                             blob_s3_secret_access_key="s3cret", transcription_workers=0)
    from tests.platform_api.sessions.conftest import clinic as make_clinic

    async with served(settings) as (app, client):
        clinic = await make_clinic.__wrapped__(app, client)  # type: ignore[attr-defined]
        headers = clinic["doctor"]["headers"]
        audio = wav_bytes(1.0)
        made = data(await create(client, clinic), 201)
        data(await upload(client, headers, made["id"], audio[:10_000]))
        data(await upload(client, headers, made["id"], audio[10_000:], offset=10_000))
        ready = data(await client.patch(f"/api/sessions/recordings/{made['id']}/ready",
                                        headers=headers, json={}))
        assert ready["sha256"] == hashlib.sha256(audio).hexdigest()
        keys = [o["Key"] for o in bucket.list_objects_v2(
            Bucket="kisumu-recordings")["Contents"]]
        assert keys == [f"clinic-a/recordings/{made['id']}/part-00001",
                        f"clinic-a/recordings/{made['id']}/part-00002"]
        played = await client.get(f"/api/sessions/recordings/{made['id']}/audio",
                                  headers=headers)
        assert played.content == audio
    assert not list((tmp_path / "spool").glob("*"))  # spooled parts were removed
