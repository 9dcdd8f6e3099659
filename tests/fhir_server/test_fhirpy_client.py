"""A real third-party FHIR client (fhirpy) against a real server: uvicorn serving the
whole app in a thread on a free port. It creates resources, searches with a chain and an
include, pages through results, counts, and uses conditional create/update/delete."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from fhirpy import AsyncFHIRClient

from platform_api.app import create_app
from tests.conftest import make_settings
from tests.fhir_server.clinical_data import LOINC, MRN, UCUM


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def server(tmp_path: Path) -> Iterator[str]:
    port = free_port()
    config = uvicorn.Config(create_app(make_settings(tmp_path)), host="127.0.0.1", port=port,
                            log_level="warning", access_log=False, loop="asyncio")
    instance = uvicorn.Server(config)
    thread = threading.Thread(target=instance.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not instance.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        instance.should_exit = True
        thread.join(timeout=20)


async def token(base: str) -> str:
    """The token of an integrator who runs a clinic's records (its ORG:ADMIN)."""
    async with httpx.AsyncClient(base_url=base) as http:
        account = {"email": "integrator@clinic.example.org", "password": "correct horse battery",
                   "first_name": "Ifeoma", "last_name": "Nwosu"}
        assert (await http.post("/api/auth/register", json=account)).status_code == 201
        login = await http.post("/api/auth/login", json={"email": account["email"],
                                                         "password": account["password"]})
        token = str(login.json()["data"]["token"])
        clinic = await http.post("/api/organizations", json={"name": "Enugu Family Clinic"},
                                 headers={"Authorization": f"Bearer {token}"})
        assert clinic.status_code == 201, clinic.text
        return token


def observation(client: Any, patient: Any, value: int, day: int) -> Any:
    return client.resource(
        "Observation", status="final",
        code={"coding": [{"system": LOINC, "code": "8867-4", "display": "Heart rate"}]},
        subject=patient.to_reference(), effectiveDateTime=f"2024-03-{day:02d}T09:00:00Z",
        valueQuantity={"value": value, "system": UCUM, "code": "/min"})


def test_fhirpy_creates_searches_with_chains_and_includes_and_pages(server: str):
    async def scenario() -> None:
        client = AsyncFHIRClient(f"{server}/fhir", authorization=f"Bearer {await token(server)}")
        amina = client.resource("Patient", name=[{"family": "Odhiambo", "given": ["Amina"]}],
                                identifier=[{"system": MRN, "value": "KE-FHIRPY-1"}],
                                birthDate="1988-04-12", gender="female")
        await amina.save()
        kwame = client.resource("Patient", name=[{"family": "Mensah", "given": ["Kwame"]}],
                                birthDate="1975-09-30", gender="male")
        await kwame.save()
        for day in range(1, 8):
            await observation(client, amina, 60 + day, day).save()
        await observation(client, kwame, 118, 9).save()

        chained = client.resources("Observation").search(
            **{"subject:Patient.name": "odhiambo"}).include("Observation", "subject")
        raw = await chained.limit(3).fetch_raw()
        modes = [e["search"]["mode"] for e in raw.entry]
        assert modes.count("match") == 3 and modes.count("include") == 1

        seen = [o.id async for o in client.resources("Observation").search(
            patient=amina.id).sort("-date").limit(2)]
        assert len(seen) == 7 and len(set(seen)) == 7
        assert await client.resources("Observation").search(
            **{"value-quantity": "gt100"}).count() == 1
        assert await client.resources("Patient").search(birthdate__gt="1980").count() == 1

        # conditional create (criteria in the query string) and conditional update
        again = client.resource("Patient", identifier=[{"system": MRN, "value": "KE-FHIRPY-1"}])
        found, created = await client.resources("Patient").search(
            identifier=f"{MRN}|KE-FHIRPY-1").get_or_create(again)
        assert not created and found.id == amina.id
        changed = client.resource("Patient", name=[{"family": "Odhiambo"}], gender="other",
                                  identifier=[{"system": MRN, "value": "KE-FHIRPY-1"}])
        updated, created = await client.resources("Patient").search(
            identifier=f"{MRN}|KE-FHIRPY-1").update(changed)
        assert not created and updated.id == amina.id and updated.gender == "other"
        await client.resources("Observation").search(patient=kwame.id).delete()
        assert await client.resources("Observation").count() == 7

    asyncio.run(scenario())


def test_fhirpy_patch_and_save_with_fields_send_merge_patches(server: str):
    """fhirpy's patch() and save(fields=...) send the changed elements as
    application/json (a null removes one): the server reads that as a JSON Merge Patch,
    so only those elements change."""
    async def scenario() -> None:
        client = AsyncFHIRClient(f"{server}/fhir", authorization=f"Bearer {await token(server)}")
        amina = client.resource("Patient", name=[{"family": "Odhiambo", "given": ["Amina"]}],
                                identifier=[{"system": MRN, "value": "KE-FHIRPY-7"}],
                                birthDate="1988-04-12", gender="female",
                                telecom=[{"system": "phone", "value": "+254712345678"}])
        await amina.save()

        await amina.patch(gender="other")  # save(fields=["gender"]) underneath
        stored = await client.reference("Patient", amina.id).to_resource()
        assert stored.gender == "other" and stored.meta.versionId == "2"
        assert stored.birthDate == "1988-04-12" and stored.telecom[0]["value"] == "+254712345678"

        amina["birthDate"] = "1988-04-13"
        amina["telecom"] = [{"system": "phone", "value": "+254700111222"}]
        await amina.save(fields=["birthDate"])  # telecom changed locally but not sent
        stored = await client.reference("Patient", amina.id).to_resource()
        assert stored.birthDate == "1988-04-13"
        assert stored.telecom[0]["value"] == "+254712345678"

        patched = await client.patch("Patient", amina.id, telecom=None, active=True)
        assert patched["active"] is True and "telecom" not in patched
        assert patched["name"][0]["family"] == "Odhiambo"

    asyncio.run(scenario())
