"""FHIR Subscriptions under load: notifications/s and delivery latency with 1,000 active
subscriptions, and what they cost the writes.

Starts the server as ``make run`` does (one process, embedded SQLite store in a fresh
data directory) and a receiver (an aiohttp server in this process, on loopback) standing
for the integrations' endpoints. A clinic administrator writes Observations with 16
concurrent clients, first with no subscription (the baseline), then with 1,000 active
rest-hook subscriptions: 800 on an Observation code (two per code, 400 codes, so half
the Observations match two of them), 100 on a patient (every Observation matches one),
100 on Condition codes (never matched: a type the writes do not touch). Each matching
Observation is PUT to the receiver (R4 rest-hook with a payload).

Prints one JSON line: writes/s and write p99 without and with the subscriptions,
notifications delivered, notifications/s (from the first write to the last receipt), and
delivery latency p50/p99 (from sending the write to receiving its notification: an upper
bound of commit-to-receipt), and how long the subscriptions took from the first create to
all active (each rest-hook is activated once the receiver accepted its handshake; the
bench polls the type-level ``Subscription/$status?status=requested`` until none is left).

Usage: ``python bench/subscriptions.py [--writes 2000] [--subscriptions 1000]``
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
from aiohttp import web

ROOT = Path(__file__).resolve().parents[1]
LOINC = "http://loinc.org"
CONCURRENCY = 16


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))] if ordered else 0.0


class Receiver:
    def __init__(self) -> None:
        self.arrivals: dict[str, float] = {}
        self.count = 0
        self.expected: set[str] | None = None
        self.all_arrived = asyncio.Event()

    async def handle(self, request: web.Request) -> web.Response:
        await request.read()
        self.count += 1
        observation_id = request.path.rsplit("/", 1)[-1]
        self.arrivals.setdefault(observation_id, time.perf_counter())
        self.check()
        return web.Response(status=200)

    def check(self) -> None:
        if self.expected is not None and self.expected <= self.arrivals.keys():
            self.all_arrived.set()


def observation(patient: str, code: int) -> dict:
    return {"resourceType": "Observation", "status": "final",
            "code": {"coding": [{"system": LOINC, "code": f"B-{code}"}]},
            "subject": {"reference": f"Patient/{patient}"},
            "valueQuantity": {"value": 5.4, "unit": "mmol/L"}}


async def write_all(client: httpx.AsyncClient, headers: dict, patients: list[str],
                    count: int) -> tuple[float, list[float], dict[str, tuple[float, str]]]:
    """``count`` Observation creates from 16 clients; (seconds, latencies, each id's
    sending time and patient)."""
    sent: dict[str, tuple[float, str]] = {}
    latencies: list[float] = []
    queue = list(range(count))

    async def one_client() -> None:
        while queue:
            queue.pop()
            patient = random.choice(patients)
            body = observation(patient, random.randrange(800))
            started = time.perf_counter()
            response = await client.post("/fhir/Observation", json=body, headers=headers)
            response.raise_for_status()
            latencies.append(time.perf_counter() - started)
            sent[response.json()["id"]] = (started, patient)

    started = time.perf_counter()
    await asyncio.gather(*(one_client() for _ in range(CONCURRENCY)))
    return time.perf_counter() - started, latencies, sent


async def all_active(client: httpx.AsyncClient, headers: dict) -> float:
    """When no Subscription is left waiting for its handshake (perf_counter time)."""
    deadline = time.perf_counter() + 300
    while time.perf_counter() < deadline:
        waiting = await client.get("/fhir/Subscription/$status", headers=headers,
                                   params={"status": "requested"})
        waiting.raise_for_status()
        if waiting.json()["total"] == 0:
            return time.perf_counter()
        await asyncio.sleep(0.05)
    raise TimeoutError("subscriptions still requested after 300 s")


async def run(args: argparse.Namespace, base: str) -> dict:
    receiver = Receiver()
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", receiver.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    receiver_port = free_port()
    await web.TCPSite(runner, "127.0.0.1", receiver_port).start()

    try:
        limits = httpx.Limits(max_connections=CONCURRENCY * 2)
        async with httpx.AsyncClient(base_url=base, timeout=30, limits=limits) as client:
            for _ in range(200):
                try:
                    if (await client.get("/healthz")).status_code == 200:
                        break
                except httpx.TransportError:
                    await asyncio.sleep(0.1)
            creds = {"email": "bench@example.org", "password": "correct horse battery",
                     "first_name": "Bench", "last_name": "Runner"}
            (await client.post("/api/auth/register", json=creds)).raise_for_status()
            token = (await client.post("/api/auth/login", json=creds)).json()["data"]["token"]
            headers = {"Authorization": f"Bearer {token}"}
            (await client.post("/api/organizations", json={"name": "Bench Clinic"},
                               headers=headers)).raise_for_status()
            token = (await client.post("/api/auth/login", json=creds)).json()["data"]["token"]
            headers = {"Authorization": f"Bearer {token}"}
            patients = [(await client.post("/fhir/Patient", headers=headers, json={
                "resourceType": "Patient", "name": [{"family": f"Bench{i}"}]})).json()["id"]
                for i in range(100)]

            base_seconds, base_latencies, _ = await write_all(client, headers, patients,
                                                              args.writes)
            endpoint = f"http://127.0.0.1:{receiver_port}/hook"
            criteria = [*(f"Observation?code={LOINC}|B-{i % 400}"
                          for i in range(args.subscriptions * 8 // 10)),
                        *(f"Observation?subject=Patient/{patients[i % len(patients)]}"
                          for i in range(args.subscriptions // 10)),
                        *(f"Condition?code={LOINC}|C-{i}"
                          for i in range(args.subscriptions - args.subscriptions * 9 // 10))]
            created = time.perf_counter()
            for text in criteria:
                (await client.post("/fhir/Subscription", headers=headers, json={
                    "resourceType": "Subscription", "status": "requested", "criteria": text,
                    "reason": "bench", "channel": {"type": "rest-hook", "endpoint": endpoint,
                                                   "payload": "application/fhir+json"}})
                 ).raise_for_status()
            activation = await all_active(client, headers) - created
            await asyncio.sleep(1)  # the last Subscription events reach the index
            receiver.count = 0
            first = time.perf_counter()
            seconds, latencies, sent = await write_all(client, headers, patients, args.writes)
            watched = set(patients[:args.subscriptions // 10])
            # each of those matches its patient's subscription
            receiver.expected = {i for i, (_, p) in sent.items() if p in watched}
            receiver.check()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(receiver.all_arrived.wait(), 120)
            last = max(receiver.arrivals.values(), default=first)
            delivery = [receiver.arrivals[i] - sent[i][0] for i in sent
                        if i in receiver.arrivals]
        return {
            "bench": "subscriptions", "store": "sqlite", "subscriptions": len(criteria),
            "writes": args.writes, "concurrency": CONCURRENCY,
            "writes_per_s_without": round(args.writes / base_seconds, 1),
            "write_p99_ms_without": round(percentile(base_latencies, 0.99) * 1000, 1),
            "writes_per_s_with": round(args.writes / seconds, 1),
            "write_p99_ms_with": round(percentile(latencies, 0.99) * 1000, 1),
            "notifications": receiver.count,
            "notifications_per_s": round(receiver.count / (last - first), 1),
            "observations_notified": len(delivery),
            "delivery_p50_ms": round(percentile(delivery, 0.5) * 1000, 1),
            "delivery_p99_ms": round(percentile(delivery, 0.99) * 1000, 1),
            "all_active_after_s": round(activation, 2),
        }
    finally:
        await runner.cleanup()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--writes", type=int, default=2000)
    parser.add_argument("--subscriptions", type=int, default=1000)
    args = parser.parse_args()
    port = free_port()
    env = {**os.environ, "HEALTHPLATFORM_DATA_DIR": tempfile.mkdtemp(prefix="bench-subs-"),
           "HEALTHPLATFORM_HTTP_PORT": str(port), "HEALTHPLATFORM_MPI_AUTO_LINK": "false",
           # the receiver is on loopback, which rest-hooks may not post to by default
           "HEALTHPLATFORM_SUBSCRIPTION_ALLOW_PRIVATE_ENDPOINTS": "true",
           "HEALTHPLATFORM_RATE_LIMITS": json.dumps({"read": "100000000/60",
                                                     "write": "100000000/60",
                                                     "public": "100000000/60"})}
    exe = Path(sys.executable).parent / "healthplatform"
    server = subprocess.Popen([str(exe), "serve"], env=env, cwd=ROOT,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        print(json.dumps(asyncio.run(run(args, f"http://127.0.0.1:{port}"))))
    finally:
        server.terminate()
        server.wait(timeout=30)


if __name__ == "__main__":
    main()
