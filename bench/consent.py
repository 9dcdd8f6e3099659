"""What asking for consent costs now that a request is a document addressed to the patient
(``platform_api.patients.consent``), against the baseline of a patient's own grant.

Runs the whole app in one process on a fresh SQLite store in a temporary directory (rate
limits off; the access policy and the clinical audit trail on, as users run it), through
httpx's ASGI transport, one request at a time. ``--patients`` users each open their own
patient profile; a clinic's administrator (a platform login token) then asks each of them
for consent, and as many unknown patient ids. Measures, p50 / p99 in ms:

- ``request``: ``POST /api/consent/request`` for a patient (the clinic's consent rule,
  one Consent search as the clinic, the request document, its key and event);
  ``request_unknown``: the same for an id no patient has (the answers must not differ);
- ``grant`` (the baseline): ``POST /api/consent/grant``, the patient's own FHIR Consent
  write to another clinic;
- ``approve``: the patient accepts the request (the Consent written as the patient, the
  request document and its key removed, in one unit of work);
- ``list_clinic``: ``GET /api/consent`` (20 a page) as the clinic while every request is
  pending (counts and a page of documents, then one Consent search), and
  ``list_clinic_after`` once the patients accepted (their requests became Consents; the
  unknown ids' stay pending);
  ``list_patient``: a patient's list (their request, their grant).

Prints one JSON line. Usage: ``python bench/consent.py [--patients 60]``
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from asgi_lifespan import LifespanManager

from platform_api.app import create_app
from platform_api.settings import Settings

PASSWORD = "correct horse battery staple"


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


def summary(name: str, values: list[float]) -> dict[str, float]:
    return {f"{name}_p50_ms": round(1000 * statistics.median(values), 2),
            f"{name}_p99_ms": round(1000 * percentile(values, 0.99), 2)}


async def timed(call: Any, into: list[float]) -> Any:
    began = time.perf_counter()
    response = await call
    into.append(time.perf_counter() - began)
    if response.status_code >= 300:
        raise RuntimeError(f"{response.request.method} {response.request.url} answered "
                           f"{response.status_code}: {response.text}")
    return response.json()["data"]


async def account(client: httpx.AsyncClient, email: str, first: str) -> dict[str, str]:
    await client.post("/api/auth/register", json={
        "email": email, "password": PASSWORD, "first_name": first, "last_name": "Bench"})
    login = await client.post("/api/auth/login", json={"email": email, "password": PASSWORD})
    return {"Authorization": f"Bearer {login.json()['data']['token']}"}


async def clinic(client: httpx.AsyncClient, name: str) -> tuple[dict[str, str], str]:
    headers = await account(client, f"admin@{name.lower()}.example", "Wanjiku")
    org = (await client.post("/api/organizations", headers=headers, json={
        "name": name, "country": "KE"})).json()["data"]["id"]
    return headers, org


async def run(patients: int) -> dict[str, Any]:
    folder = Path(tempfile.mkdtemp(prefix="bench-consent-"))
    try:
        settings = Settings(data_dir=folder, rate_limit_enabled=False, access_log=False,
                            log_level="WARNING", transcription_workers=0)
        app = create_app(settings)
        async with LifespanManager(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://bench") as c:
                return await measure(c, patients)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


async def measure(client: httpx.AsyncClient, patients: int) -> dict[str, Any]:
    asker, _ = await clinic(client, "Mathare")
    _, other = await clinic(client, "Kibera")
    people = []
    for n in range(patients):
        headers = await account(client, f"patient{n}@bench.example", f"Amina{n}")
        own = (await client.post("/api/patients", headers=headers, json={
            "first_name": f"Amina{n}", "last_name": "Odhiambo", "date_of_birth": "1988-04-12",
            "gender": "female"})).json()["data"]["id"]
        people.append((headers, own))
    took: dict[str, list[float]] = {k: [] for k in (
        "request", "request_unknown", "grant", "approve", "list_clinic", "list_clinic_after",
        "list_patient")}
    asked = []
    for n, (_headers, own) in enumerate(people):
        asked.append((await timed(client.post("/api/consent/request", headers=asker,
                                              json={"patient_id": own}),
                                  took["request"]))["id"])
        await timed(client.post("/api/consent/request", headers=asker,
                                json={"patient_id": f"no-patient-{n}"}),
                    took["request_unknown"])
    for page in range(1, 2 * patients // 20 + 1):
        await timed(client.get("/api/consent", headers=asker, params={"page": page}),
                    took["list_clinic"])
    for (headers, _own), request_id in zip(people, asked, strict=True):
        await timed(client.post("/api/consent/grant", headers=headers, json={
            "grantee_type": "organization", "grantee_id": other}), took["grant"])
        await timed(client.get("/api/consent", headers=headers), took["list_patient"])
        await timed(client.post(f"/api/consent/{request_id}/approve", headers=headers),
                    took["approve"])
    for page in range(1, 2 * patients // 20 + 1):
        await timed(client.get("/api/consent", headers=asker, params={"page": page}),
                    took["list_clinic_after"])
    result: dict[str, Any] = {"benchmark": "consent", "patients": patients}
    for name, values in took.items():
        result.update(summary(name, values))
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--patients", type=int, default=60)
    args = parser.parse_args()
    logging.disable(logging.WARNING)
    print(json.dumps(asyncio.run(run(args.patients))))


if __name__ == "__main__":
    main()
