"""Fixtures of the Sessions tests: a clinic in Kisumu with a doctor, a nurse and a
receptionist, a patient it registered with an encounter, another clinic, and short clips
spoken by espeak-ng."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest

from platform_api.policy.roles import ORG_DOCTOR, ORG_NURSE, ORG_RECEPTIONIST
from tests.conftest import add_member, make_clinic_admin, register_and_login

# the envelope helpers the Scheduling tests use
from tests.platform_api.scheduling.conftest import data, refusal  # noqa: F401

JSON = dict[str, Any]
PATIENT = {"first_name": "Akinyi", "last_name": "Ouma", "date_of_birth": "1991-07-23",
           "gender": "female", "phone": "+254722334455", "mrn": "KCC-2291"}


async def register_patient(client: httpx.AsyncClient, headers: dict[str, str], org_id: str,
                           **fields: Any) -> JSON:
    response = await client.post(f"/api/organizations/{org_id}/patients", headers=headers,
                                 json={**PATIENT, **fields})
    return data(response, 201)  # type: ignore[no-any-return]


async def start_encounter(client: httpx.AsyncClient, headers: dict[str, str],
                          patient_id: str) -> str:
    response = await client.post("/fhir/Encounter", headers=headers, json={
        "resourceType": "Encounter", "status": "in-progress",
        "class": {"system": "http://terminology.hl7.org/CodeSystem/v3-ActCode",
                  "code": "AMB", "display": "ambulatory"},
        "subject": {"reference": f"Patient/{patient_id}"},
        "period": {"start": "2026-11-20T09:00:00+03:00"}})
    assert response.status_code == 201, response.text
    return str(response.json()["id"])


@pytest.fixture
async def clinic(app: Any, client: httpx.AsyncClient) -> JSON:
    """Kisumu Community Clinic: its ORG:ADMIN, a doctor, a nurse, a receptionist, a
    patient it registered and an encounter of that patient."""
    admin = await make_clinic_admin(client, name="Kisumu Community Clinic",
                                    first_name="Otieno", last_name="Mwangi")
    org_id = admin["org_id"]
    staff = {}
    for role, (first, last) in ((ORG_DOCTOR, ("Wanjiru", "Kamau")),
                                (ORG_NURSE, ("Achieng", "Otieno")),
                                (ORG_RECEPTIONIST, ("Baraka", "Mwangi"))):
        member = await register_and_login(client, first_name=first, last_name=last)
        await add_member(app, org_id, member, role)
        staff[role] = member
    patient = await register_patient(client, admin["headers"], org_id)
    encounter_id = await start_encounter(client, staff[ORG_DOCTOR]["headers"], patient["id"])
    return {"admin": admin, "org_id": org_id, "doctor": staff[ORG_DOCTOR],
            "nurse": staff[ORG_NURSE], "receptionist": staff[ORG_RECEPTIONIST],
            "patient": patient, "patient_id": patient["id"], "encounter_id": encounter_id}


@pytest.fixture
async def other_clinic(client: httpx.AsyncClient) -> JSON:
    admin = await make_clinic_admin(client, name="Mombasa Coast Clinic", first_name="Hassan",
                                    last_name="Ali")
    return {"admin": admin, "org_id": admin["org_id"]}


ESPEAK = "espeak-ng"


def speak(text: str, path: Path) -> Path:
    """A WAV file of ``text`` spoken by espeak-ng (skips the test without it)."""
    if shutil.which(ESPEAK) is None:
        pytest.skip(f"needs the Debian package {ESPEAK} (apt-get install {ESPEAK})")
    subprocess.run([ESPEAK, "-s", "150", "-w", str(path), text], check=True,
                   capture_output=True)
    return path


def wav_bytes(seconds: float = 0.5, rate: int = 16000) -> bytes:
    """A silent PCM WAV (a real header, for upload tests that need no speech)."""
    import io
    import wave

    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(rate)
        out.writeframes(b"\x00\x00" * int(seconds * rate))
    return buffer.getvalue()


async def wait_for(check: Any, seconds: float = 60.0, every: float = 0.1) -> Any:
    """Poll the coroutine function ``check`` until it returns something truthy."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    while True:
        found = await check()
        if found:
            return found
        if loop.time() > deadline:
            raise AssertionError("timed out waiting")
        await asyncio.sleep(every)


@pytest.fixture
def settings(tmp_path: Path) -> Any:
    from tests.conftest import make_settings

    return make_settings(tmp_path, recording_max_bytes=2 * 1024 * 1024,
                         transcription_poll_seconds=0.5)


def recording_body(clinic: JSON, **fields: Any) -> JSON:
    return {"patient_id": clinic["patient_id"], "encounter_id": clinic["encounter_id"],
            "title": "Antenatal consultation", "content_type": "audio/wav", "language": "en",
            **fields}


async def ready_recording(client: httpx.AsyncClient, clinic: JSON, audio: bytes) -> JSON:
    """A recording of ``audio`` (WAV), uploaded in one part and marked ready."""
    headers = clinic["doctor"]["headers"]
    made = data(await client.post("/api/sessions/recordings", headers=headers,
                                  json=recording_body(clinic)), 201)
    data(await client.post(f"/api/sessions/recordings/{made['id']}/audio?offset=0",
                           headers={**headers, "Content-Type": "audio/wav"}, content=audio))
    return data(await client.patch(f"/api/sessions/recordings/{made['id']}/ready",  # type: ignore[no-any-return]
                                   headers=headers, json={}))
