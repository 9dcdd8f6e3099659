"""SQL on FHIR: ``$viewdefinition-export`` of a 3-column view over N Observations to
Parquet, and ``$run``'s first 1,000 rows, with the Bulk ``$export`` of the same
Observations as the baseline, in one run. Prints one JSON line.

As users run it: the server as ``healthplatform serve`` (one process, embedded SQLite in a
fresh data directory, access policy and clinical audit on, rate limits off), the client a
clinic's administrator (it founds an organization); the Observations are owned by that
clinic, so every page the export reads carries the policy's criteria. The store is filled
directly through the FHIR service (validated resources, indexed as any write, in units
of 1,000) while the server is stopped, their resource events marked relayed (a store
loaded long ago): loading a million through HTTP takes far longer than what is measured.

Measured, client side over loopback:

- ``view_export``: kick-off to the 303 of the status URL; rows/s; the server's peak
  anonymous memory (its heap: RssAnon sampled from /proc every 20 ms, not the pages of the
  store file SQLite maps) and the same before the export began;
- ``run_first_1000``: ``POST ViewDefinition/$run`` with ``_limit=1000`` (json), p50 and
  p95 over ``--iterations`` requests, the whole response read;
- ``bulk_export`` (baseline): ``$export?_type=Observation`` the same way, resources/s and
  peak heap.

Usage: ``python bench/sql_on_fhir.py [--observations 200000] [--iterations 20]
[--audit on|off]``;
``--observations 1000000`` for the aim (filling takes several minutes).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import socket
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fhir_server.ownership import with_owners  # noqa: E402
from fhir_server.service import FhirService  # noqa: E402
from fhir_server.store.sqlite import SQLiteStore  # noqa: E402

LOINC = "http://loinc.org"
CREDENTIALS = {"email": "bench@example.org", "password": "correct horse battery",
               "first_name": "Bench", "last_name": "Analyst"}
VIEW = {
    "resourceType": "ViewDefinition", "name": "glucose", "status": "active",
    "resource": "Observation",
    "select": [{"column": [
        {"name": "id", "path": "getResourceKey()", "type": "id"},
        {"name": "patient", "path": "subject.getReferenceKey(Patient)", "type": "id"},
        {"name": "value", "path": "value.ofType(Quantity).value", "type": "decimal",
         "tag": [{"name": "ansi/type", "value": "DOUBLE"}]}]}],
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def observation(i: int, org_id: str) -> dict[str, Any]:
    return with_owners({
        "resourceType": "Observation", "id": f"o{i}", "status": "final",
        "code": {"coding": [{"system": LOINC, "code": "2339-0"}]},
        "subject": {"reference": f"Patient/p{i // 20}"},
        "effectiveDateTime": "2026-03-02T09:30:00+03:00",
        "valueQuantity": {"value": 80 + i % 90, "unit": "mg/dL"}}, [org_id])


async def fill(data_dir: Path, count: int, org_id: str) -> float:
    store = SQLiteStore(data_dir / "healthplatform.db")
    await store.open()
    service = FhirService(store)
    started = time.perf_counter()
    try:
        for first in range(0, count, 1000):
            async with store.unit_of_work() as uow:
                for i in range(first, min(first + 1000, count)):
                    made = observation(i, org_id)
                    service.stage_create(uow, made, resource_id=made["id"], validated=True)
                await uow.commit()
    finally:
        await store.close()
    # The fill's resource events stand for a past whose handlers ran: a restarted server
    # would otherwise spend the measurement relaying a million of them.
    with sqlite3.connect(data_dir / "healthplatform.db") as conn:
        conn.execute("UPDATE outbox SET dispatched = 1 WHERE dispatched = 0")
    return time.perf_counter() - started


class Server:
    """``healthplatform serve`` of this checkout, in a child process."""

    def __init__(self, data_dir: Path, audit: bool = True):
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        env = {**os.environ, "PYTHONPATH": str(ROOT), "HEALTHPLATFORM_DATA_DIR": str(data_dir),
               "HEALTHPLATFORM_HTTP_PORT": str(self.port),
               "HEALTHPLATFORM_MLLP_ENABLED": "false",
               "HEALTHPLATFORM_RATE_LIMIT_ENABLED": "false",
               "HEALTHPLATFORM_CLINICAL_AUDIT": "true" if audit else "false"}
        self.process = subprocess.Popen(
            [sys.executable, "-m", "platform_api.cli", "serve"], env=env, cwd=ROOT,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def heap_mb(self) -> float:
        try:
            status = Path(f"/proc/{self.process.pid}/status").read_text()
        except OSError:
            return 0.0
        line = next((x for x in status.splitlines() if x.startswith("RssAnon:")), "0 0 kB")
        return int(line.split()[1]) / 1024

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(60)


class PeakHeap:
    """The server's peak anonymous memory while the block runs (sampled every 20 ms)."""

    def __init__(self, server: Server):
        self.server, self.peak, self._stop = server, 0.0, threading.Event()

    def __enter__(self) -> PeakHeap:
        self.before = self.server.heap_mb()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self.server.heap_mb())
            time.sleep(0.02)

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


async def signed_in(base: str, register: bool) -> tuple[httpx.AsyncClient, dict[str, str]]:
    client = httpx.AsyncClient(base_url=base, timeout=3600)
    for _ in range(600):
        try:
            if (await client.get("/healthz")).status_code == 200:
                break
        except httpx.TransportError:
            await asyncio.sleep(0.1)
    if register:
        (await client.post("/api/auth/register", json=CREDENTIALS)).raise_for_status()
    login = await client.post("/api/auth/login", json=CREDENTIALS)
    login.raise_for_status()
    return client, {"Authorization": f"Bearer {login.json()['data']['token']}"}


async def until_done(client: httpx.AsyncClient, headers: dict[str, str], status_url: str
                     ) -> httpx.Response:
    while True:
        polled = await client.get(status_url, headers=headers)
        if polled.status_code not in (202,):
            return polled
        await asyncio.sleep(0.2)


async def view_export(client: httpx.AsyncClient, headers: dict[str, str], server: Server
                      ) -> dict[str, Any]:
    body = {"resourceType": "Parameters", "parameter": [
        {"name": "_format", "valueCode": "parquet"},
        {"name": "view", "part": [{"name": "viewResource", "resource": VIEW}]}]}
    with PeakHeap(server) as heap:
        started = time.perf_counter()
        kicked = await client.post("/fhir/ViewDefinition/$viewdefinition-export",
                                   headers={**headers, "Prefer": "respond-async"}, json=body)
        kicked.raise_for_status()
        done = await until_done(client, headers, kicked.headers["content-location"])
        seconds = time.perf_counter() - started
    assert done.status_code == 303, done.text
    result = (await client.get(done.headers["location"], headers=headers)).json()
    files = [p for out in result["parameter"] if out["name"] == "output"
             for p in out["part"] if p["name"] == "location"]
    job = result["parameter"][0]["valueString"]
    rows = 0
    import pyarrow.parquet as pq

    for location in files:
        answer = await client.get(location["valueUri"], headers=headers)
        rows += pq.ParquetFile(__import__("io").BytesIO(answer.content)).metadata.num_rows
    await client.delete(f"/fhir/$viewdefinition-export-status/{job}", headers=headers)
    return {"rows": rows, "files": len(files), "seconds": round(seconds, 2),
            "rows_per_s": round(rows / seconds), "peak_heap_mb": round(heap.peak, 1),
            "heap_before_mb": round(heap.before, 1)}


async def bulk_export(client: httpx.AsyncClient, headers: dict[str, str], server: Server
                      ) -> dict[str, Any]:
    with PeakHeap(server) as heap:
        started = time.perf_counter()
        kicked = await client.get("/fhir/$export", params={"_type": "Observation"},
                                  headers={**headers, "Prefer": "respond-async"})
        kicked.raise_for_status()
        done = await until_done(client, headers, kicked.headers["content-location"])
        seconds = time.perf_counter() - started
    assert done.status_code == 200, done.text
    count = sum(o["count"] for o in done.json()["output"])
    await client.delete(kicked.headers["content-location"], headers=headers)
    return {"resources": count, "seconds": round(seconds, 2),
            "resources_per_s": round(count / seconds), "peak_heap_mb": round(heap.peak, 1),
            "heap_before_mb": round(heap.before, 1)}


async def run_first_rows(client: httpx.AsyncClient, headers: dict[str, str],
                         iterations: int) -> dict[str, Any]:
    body = {"resourceType": "Parameters", "parameter": [
        {"name": "_format", "valueCode": "json"}, {"name": "_limit", "valueInteger": 1000},
        {"name": "viewResource", "resource": VIEW}]}
    samples, rows = [], 0
    for _ in range(iterations + 2):
        started = time.perf_counter()
        answer = await client.post("/fhir/ViewDefinition/$run", headers=headers, json=body)
        samples.append((time.perf_counter() - started) * 1000)
        answer.raise_for_status()
        rows = len(answer.json())
    samples = sorted(samples[2:])  # the first two warm the caches
    return {"rows": rows, "p50_ms": round(statistics.median(samples), 1),
            "p95_ms": round(samples[int(0.95 * (len(samples) - 1))], 1)}


async def measure(args: argparse.Namespace, data_dir: Path) -> dict[str, Any]:
    server = Server(data_dir)
    try:
        client, headers = await signed_in(server.base, register=True)
        org = await client.post("/api/organizations", json={"name": "Bench Clinic"},
                                headers=headers)
        org.raise_for_status()
        org_id = org.json()["data"]["id"]
        await client.aclose()
    finally:
        server.stop()
    fill_seconds = await fill(data_dir, args.observations, org_id)
    server = Server(data_dir, audit=args.audit == "on")
    try:
        client, headers = await signed_in(server.base, register=False)
        run = await run_first_rows(client, headers, args.iterations)
        views = await view_export(client, headers, server)
        bulk = await bulk_export(client, headers, server)
        await client.aclose()
    finally:
        server.stop()
    return {"bench": "sql_on_fhir", "store": "sqlite", "observations": args.observations,
            "clinical_audit": args.audit,
            "fill_seconds": round(fill_seconds, 1), "view_columns": 3,
            "view_export_parquet": views, "run_first_1000": run, "bulk_export": bulk,
            "view_vs_bulk_speed": round(views["rows_per_s"] / bulk["resources_per_s"], 2)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--observations", type=int, default=200_000)
    parser.add_argument("--iterations", type=int, default=20)
    parser.add_argument("--audit", choices=("on", "off"), default="on",
                        help="the clinical audit trail (on as users run it; off to see "
                             "what it costs)")
    args = parser.parse_args()
    data_dir = Path(tempfile.mkdtemp(prefix="bench-sof-"))
    try:
        print(json.dumps(asyncio.run(measure(args, data_dir))))
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
