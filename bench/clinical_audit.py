"""What the clinical audit trail costs a request: FHIR reads and searches with it and
without it, and the cost of writing the AuditEvents in batches.

Runs the whole app in one process on a fresh SQLite store in a temporary directory (rate
limits off), calling it as ASGI directly (no HTTP client in the measured path), as a
clinic's doctor with a platform login token. Measures:

- ``read_off_us`` / ``read_on_us``: median of ``GET /fhir/Observation/{id}`` without and
  with the audit listener attached (reads take turns, one of each, so a busy moment of
  the shared machine weighs on both alike); ``read_overhead_us`` / ``_pct`` the
  difference: what a request pays (a note in memory);
- ``search_off_us`` / ``search_on_us``: the same for a search of the patient's
  Observations (20 results), one AuditEvent per search;
- ``flush_events_per_s`` and ``flush_us_per_event``: writing the noted AuditEvents (one
  append to the audit log per batch of ``--batch``; wall time, the log's writer thread
  included), the work the recorder does off the request path;
- ``amortized_read_overhead_pct``: the read overhead plus the flush cost of its event, as
  a share of a read: the whole cost of auditing a read, wherever it is paid.

Prints one JSON line. Usage: ``python bench/clinical_audit.py [--reads 3000]``
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
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
from asgi_lifespan import LifespanManager

from platform_api.app import create_app
from platform_api.settings import Settings

PASSWORD = "correct horse battery staple"
Call = Callable[[], Awaitable[None]]


def asgi_call(app: Any, path: str, query: bytes, headers: list[tuple[bytes, bytes]]) -> Call:
    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start" and message["status"] != 200:
            raise RuntimeError(f"GET {path} answered {message['status']}")

    async def one() -> None:
        scope = {"type": "http", "http_version": "1.1", "method": "GET", "path": path,
                 "raw_path": path.encode(), "root_path": "", "scheme": "http",
                 "query_string": query, "headers": [(b"host", b"bench"), *headers],
                 "client": ("127.0.0.1", 5000), "server": ("bench", 80)}
        await app(scope, receive, send)
    return one


async def setup(app: Any) -> dict[str, Any]:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://bench") as client:
        await client.post("/api/auth/register", json={
            "email": "doctor@kliniki.example", "password": PASSWORD, "first_name": "Wanjiru",
            "last_name": "Kamau"})
        login = await client.post("/api/auth/login", json={"email": "doctor@kliniki.example",
                                                           "password": PASSWORD})
        token = login.json()["data"]["token"]
        headers = {"Authorization": f"Bearer {token}"}
        org = (await client.post("/api/organizations", headers=headers, json={
            "name": "Kliniki ya Bench", "country": "KE"})).json()["data"]["id"]
        patient = (await client.post(f"/api/organizations/{org}/patients", headers=headers,
                                     json={"first_name": "Amina", "last_name": "Odhiambo",
                                           "date_of_birth": "1988-04-12", "gender": "female",
                                           "mrn": "B-1"})).json()["data"]["id"]
        ids = []
        for value in range(20):
            made = await client.post("/fhir/Observation", headers=headers, json={
                "resourceType": "Observation", "status": "final",
                "code": {"coding": [{"system": "http://loinc.org", "code": "8867-4",
                                     "display": "Heart rate"}]},
                "subject": {"reference": f"Patient/{patient}"},
                "valueQuantity": {"value": 60 + value, "unit": "/min"}})
            ids.append(made.json()["id"])
    return {"token": token, "patient": patient, "observation": ids[0]}


async def timed(call: Call) -> float:
    started = time.perf_counter()
    await call()
    return (time.perf_counter() - started) * 1e6


async def paired(app: Any, recorder: Any, call: Call, count: int) -> tuple[float, float]:
    """Medians (µs) of ``call`` without and with the listener, taking turns."""
    listeners = app.state.services.fhir.access_listeners
    off, on = [], []
    for _ in range(count):
        listeners.remove(recorder.note)
        off.append(await timed(call))
        listeners.append(recorder.note)
        on.append(await timed(call))
        if len(recorder._notes) > 5000:  # keep the pending list as a live server would
            recorder._notes.clear()
    return statistics.median(off), statistics.median(on)


async def main(reads: int, batch: int) -> dict[str, Any]:
    directory = Path(tempfile.mkdtemp(prefix="bench-audit-"))
    settings = Settings(data_dir=directory, rate_limit_enabled=False, access_log=False,
                        log_level="WARNING", transcription_workers=0,
                        clinical_audit_flush_seconds=3600, clinical_audit_batch=10**9)
    logging.disable(logging.WARNING)
    try:
        app = create_app(settings)
        async with LifespanManager(app):
            data = await setup(app)
            recorder = app.state.services.extras["sessions.clinical_audit"]
            await recorder.flush()
            auth = [(b"authorization", f"Bearer {data['token']}".encode())]
            read = asgi_call(app, f"/fhir/Observation/{data['observation']}", b"", auth)
            search = asgi_call(app, "/fhir/Observation",
                               f"subject=Patient/{data['patient']}".encode(), auth)
            for _ in range(200):  # warm up
                await read()
            recorder._notes.clear()
            read_off, read_on = await paired(app, recorder, read, reads)
            search_off, search_on = await paired(app, recorder, search, reads // 3)
            recorder._notes.clear()
            for _ in range(batch * 5):
                await read()
            pending, recorder._notes = recorder._notes, []
            started = time.perf_counter()
            written = 0
            for first in range(0, len(pending), batch):
                recorder._notes = pending[first:first + batch]
                written += await recorder.flush()
            flush_seconds = time.perf_counter() - started
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    per_event = flush_seconds / written * 1e6
    return {
        "read_off_us": round(read_off, 1), "read_on_us": round(read_on, 1),
        "read_overhead_us": round(read_on - read_off, 1),
        "read_overhead_pct": round((read_on - read_off) / read_off * 100, 1),
        "search_off_us": round(search_off, 1), "search_on_us": round(search_on, 1),
        "search_overhead_pct": round((search_on - search_off) / search_off * 100, 1),
        "flush_events": written, "flush_events_per_s": round(written / flush_seconds),
        "flush_us_per_event": round(per_event, 1),
        "amortized_read_overhead_pct": round((read_on - read_off + per_event) / read_off
                                             * 100, 1),
        "reads": reads, "batch": batch,
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reads", type=int, default=3000)
    parser.add_argument("--batch", type=int, default=500)
    arguments = parser.parse_args()
    print(json.dumps(asyncio.run(main(arguments.reads, arguments.batch))))
