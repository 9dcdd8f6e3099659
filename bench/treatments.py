"""What starting and following patients' treatments costs: a TB treatment started from
the shipped 2HRZE/4HR protocol (a CarePlan of six dated activities), a progress update
(an activity completed with a note), and a page of a patient's treatments.

Runs the whole app in one process on a fresh SQLite store in a temporary directory (rate
limits off), through httpx's ASGI transport, as a clinic's ORG:ADMIN
with a platform login token, one request at a time. Measures, for ``--treatments`` of
each: ``start_per_s`` and ``start_p50_ms`` / ``_p99_ms`` (``POST
/api/patient-treatments``: protocol read, schedule, policy checks, CarePlan write, event),
``progress_per_s`` and its p50/p99 (``PATCH /api/patient-treatments/:id``), and
``list_p50_ms`` (``GET /api/patients/:id/treatments``, 20 of the patient's treatments
with their totals).

Prints one JSON line. Usage: ``python bench/treatments.py [--treatments 200]``
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


async def timed(call: Any) -> tuple[float, Any]:
    began = time.perf_counter()
    response = await call
    elapsed = time.perf_counter() - began
    if response.status_code >= 300:
        raise RuntimeError(f"{response.request.method} {response.request.url} answered "
                           f"{response.status_code}: {response.text}")
    return elapsed, response.json()["data"]


async def run(treatments: int) -> dict[str, Any]:
    folder = Path(tempfile.mkdtemp(prefix="bench-treatments-"))
    try:
        settings = Settings(data_dir=folder, rate_limit_enabled=False, access_log=False,
                            log_level="WARNING", transcription_workers=0)
        app = create_app(settings)
        async with LifespanManager(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://bench") as c:
                return await measure(c, treatments)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


async def measure(client: httpx.AsyncClient, treatments: int) -> dict[str, Any]:
    await client.post("/api/auth/register", json={
        "email": "admin@kliniki.example", "password": PASSWORD, "first_name": "Wanjiku",
        "last_name": "Kamau"})
    login = await client.post("/api/auth/login", json={"email": "admin@kliniki.example",
                                                       "password": PASSWORD})
    headers = {"Authorization": f"Bearer {login.json()['data']['token']}"}
    org = (await client.post("/api/organizations", headers=headers, json={
        "name": "Kliniki ya Bench", "country": "KE"})).json()["data"]["id"]
    patient = (await client.post(f"/api/organizations/{org}/patients", headers=headers, json={
        "first_name": "Amina", "last_name": "Odhiambo", "date_of_birth": "1988-04-12",
        "gender": "female", "mrn": "B-1"})).json()["data"]["id"]
    tb = (await client.get("/api/treatments", headers=headers,
                           params={"code": "tb-2hrze-4hr"})).json()["data"][0]["id"]
    starts, progress, lists = [], [], []
    made = []
    for _ in range(treatments):
        elapsed, body = await timed(client.post("/api/patient-treatments", headers=headers,
                                                json={"patient_id": patient, "protocol_id": tb,
                                                      "status": "active"}))
        starts.append(elapsed)
        made.append(body["id"])
    for treatment_id in made:
        elapsed, _ = await timed(client.patch(
            f"/api/patient-treatments/{treatment_id}", headers=headers, json={"activities": [
                {"id": "intensive-hrze", "status": "completed", "note": "56 doses observed"}]}))
        progress.append(elapsed)
    for _ in range(max(20, treatments // 5)):
        elapsed, _ = await timed(client.get(f"/api/patients/{patient}/treatments",
                                            headers=headers))
        lists.append(elapsed)
    return {
        "benchmark": "treatments", "treatments": treatments,
        "start_per_s": round(len(starts) / sum(starts), 1),
        "start_p50_ms": round(1000 * statistics.median(starts), 2),
        "start_p99_ms": round(1000 * percentile(starts, 0.99), 2),
        "progress_per_s": round(len(progress) / sum(progress), 1),
        "progress_p50_ms": round(1000 * statistics.median(progress), 2),
        "progress_p99_ms": round(1000 * percentile(progress, 0.99), 2),
        "list_p50_ms": round(1000 * statistics.median(lists), 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--treatments", type=int, default=200)
    args = parser.parse_args()
    logging.disable(logging.WARNING)
    print(json.dumps(asyncio.run(run(args.treatments))))


if __name__ == "__main__":
    main()
