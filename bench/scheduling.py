"""Scheduling under load: availability over a month of 50 resources, and 32 clients
racing to book overlapping slots. Prints one JSON line.

Starts the server as ``make run`` does (one process, embedded SQLite store in a fresh
data directory). A clinic's administrator registers ``--resources`` doctors, each with a
schedule of weekday hours (08:00-17:00 Africa/Nairobi, 30-minute slots) over ``--days``
days, so the store holds about 18 Slots a resource a weekday. Then, from this process
over loopback:

- **availability**: ``--clients`` concurrent clients ask ``GET /api/appointments/
  availability`` for random (resource, day) pairs of the month: p50/p99 and requests/s;
- **booking**: the same number of clients book at random among a small pool of slots
  (the first two weekdays of four resources), so most attempts collide: p50/p99 of the
  answers, requests/s, bookings (201) per second, 409s;
- **double bookings**: afterwards every booked Appointment of those resources is read
  back and the overlapping pairs of one resource counted (must be 0), and the 201s
  compared with what is stored.

The load generator shares the machine with the server: on 2 cores its own cost is part
of what is measured.

Usage: ``python bench/scheduling.py [--resources 50] [--days 31] [--clients 32]``
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from datetime import date, datetime, timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import httpx

ROOT = Path(__file__).resolve().parents[1]
NAIROBI = ZoneInfo("Africa/Nairobi")
WEEKDAYS = [{"rrule": "FREQ=WEEKLY;BYDAY=MO,TU,WE,TH,FR", "start": "08:00", "end": "17:00"}]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def summary(latencies: list[float], seconds: float) -> dict[str, Any]:
    return {"requests": len(latencies), "per_s": round(len(latencies) / seconds, 1),
            "p50_ms": round(percentile(latencies, 50) * 1000, 1),
            "p99_ms": round(percentile(latencies, 99) * 1000, 1)}


def weekdays(first: date, count: int) -> list[date]:
    days = [first + timedelta(days=i) for i in range(count)]
    return [d for d in days if d.weekday() < 5]


def start_server(data_dir: str, port: int) -> subprocess.Popen[bytes]:
    env = {**os.environ, "HEALTHPLATFORM_DATA_DIR": data_dir,
           "HEALTHPLATFORM_HTTP_PORT": str(port), "HEALTHPLATFORM_MLLP_ENABLED": "false",
           "HEALTHPLATFORM_SCHEDULING_UPKEEP_INTERVAL_SECONDS": "0",
           # one address and one token drive the load: budgets far above a client's
           "HEALTHPLATFORM_RATE_LIMITS": json.dumps({c: "100000000/60" for c in (
               "read", "write", "public", "booking", "login")})}
    exe = Path(sys.executable).parent / "healthplatform"
    return subprocess.Popen([str(exe), "serve"], env=env, cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


async def wait_ready(client: httpx.AsyncClient) -> None:
    for _ in range(300):
        try:
            if (await client.get("/healthz")).status_code == 200:
                return
        except httpx.TransportError:
            pass
        await asyncio.sleep(0.1)
    raise SystemExit("the server did not start")


async def setup(client: httpx.AsyncClient, resources: int, days: int
                ) -> tuple[dict[str, str], str, list[str], float]:
    creds = {"email": "bench@example.org", "password": "correct horse battery",
             "first_name": "Bench", "last_name": "Runner"}
    (await client.post("/api/auth/register", json=creds)).raise_for_status()
    token = (await client.post("/api/auth/login", json=creds)).json()["data"]["token"]
    headers = {"Authorization": f"Bearer {token}"}
    org = (await client.post("/api/organizations", headers=headers, json={
        "name": "Bench Hospital", "country": "KE"})).json()["data"]["id"]
    ids: list[str] = []
    started = time.perf_counter()
    for i in range(resources):
        made = await client.post("/api/resources", headers=headers, json={
            "type": "doctor", "name": f"Dr. Bench Doctor {i:02d}", "organization_id": org,
            "time_zone": "Africa/Nairobi"})
        made.raise_for_status()
        ids.append(made.json()["data"]["id"])
        schedule = await client.post("/api/schedules", headers=headers, json={
            "resource_id": ids[-1], "slot_minutes": 30, "horizon_days": days,
            "working_hours": WEEKDAYS}, timeout=120)
        schedule.raise_for_status()
    return headers, org, ids, time.perf_counter() - started


async def availability(base: str, headers: dict[str, str], ids: list[str], month: list[date],
                       clients: int, requests: int) -> tuple[dict[str, Any], float]:
    latencies: list[float] = []
    slots_seen: list[int] = []

    async def one_client(count: int) -> None:
        async with httpx.AsyncClient(base_url=base, headers=headers, timeout=60) as client:
            for _ in range(count):
                resource, day = random.choice(ids), random.choice(month)
                began = time.perf_counter()
                answer = await client.get("/api/appointments/availability",
                                          params={"resource_id": resource, "date": str(day)})
                latencies.append(time.perf_counter() - began)
                answer.raise_for_status()
                slots_seen.append(len(answer.json()["data"]["slots"]))

    started = time.perf_counter()
    await asyncio.gather(*(one_client(requests // clients) for _ in range(clients)))
    elapsed = time.perf_counter() - started
    return {**summary(latencies, elapsed),
            "slots_per_answer": round(sum(slots_seen) / len(slots_seen), 1)}, elapsed


async def pool_of(client: httpx.AsyncClient, headers: dict[str, str], ids: list[str],
                  month: list[date]) -> list[tuple[str, str, str]]:
    pool = []
    for resource in ids[:4]:
        for day in month[:2]:
            found = (await client.get("/api/appointments/availability", headers=headers,
                                      params={"resource_id": resource, "date": str(day)})
                     ).json()["data"]["slots"]
            pool += [(resource, s["start_utc"], s["end_utc"]) for s in found]
    return pool


async def booking(base: str, pool: list[tuple[str, str, str]], clients: int, attempts: int
                  ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    latencies: list[float] = []
    statuses: dict[int, int] = {}
    won: list[dict[str, Any]] = []

    async def one_client(number: int) -> None:
        async with httpx.AsyncClient(base_url=base, timeout=60) as client:
            for attempt in range(attempts):
                resource, start, end = random.choice(pool)
                began = time.perf_counter()
                answer = await client.post("/api/appointments", json={
                    "resource_id": resource, "patient_name": f"Bench Patient {number}",
                    "patient_email": f"patient{number}.{attempt}@bench.example.org",
                    "start_time": start, "end_time": end, "reason": "Benchmark"})
                latencies.append(time.perf_counter() - began)
                statuses[answer.status_code] = statuses.get(answer.status_code, 0) + 1
                if answer.status_code == 201:
                    won.append(answer.json()["data"])

    started = time.perf_counter()
    await asyncio.gather(*(one_client(n) for n in range(clients)))
    elapsed = time.perf_counter() - started
    return {**summary(latencies, elapsed), "booked": statuses.get(201, 0),
            "bookings_per_s": round(statuses.get(201, 0) / elapsed, 1),
            "refused_409": statuses.get(409, 0),
            "other_statuses": {str(k): v for k, v in statuses.items() if k not in (201, 409)},
            "pool_slots": len(pool)}, won


async def double_bookings(client: httpx.AsyncClient, headers: dict[str, str],
                          resources: list[str]) -> tuple[int, int]:
    """Overlapping pairs of booked appointments of one resource, and how many are stored."""
    overlaps = stored = 0
    for resource in resources:
        bundle = (await client.get("/fhir/Appointment", headers=headers, params={
            "actor": f"Practitioner/{resource}", "status": "booked", "_count": "1000",
            "_sort": "date"})).json()
        times = sorted((e["resource"]["start"], e["resource"]["end"])
                       for e in bundle.get("entry", []))
        stored += len(times)
        for i, (start, end) in enumerate(times):
            overlaps += sum(1 for other_start, _ in times[i + 1:] if other_start < end)
            del start
    return overlaps, stored


async def run(args: argparse.Namespace) -> dict[str, Any]:
    port, data_dir = free_port(), tempfile.mkdtemp(prefix="bench-scheduling-")
    server = start_server(data_dir, port)
    base = f"http://127.0.0.1:{port}"
    try:
        async with httpx.AsyncClient(base_url=base, timeout=60) as client:
            await wait_ready(client)
            headers, _org, ids, setup_s = await setup(client, args.resources, args.days)
            first = (datetime.now(NAIROBI) + timedelta(days=1)).date()
            month = weekdays(first, args.days - 1)
            avail, _ = await availability(base, headers, ids, month, args.clients,
                                          args.availability_requests)
            pool = await pool_of(client, headers, ids, month)
            booked, won = await booking(base, pool, args.clients, args.bookings_per_client)
            overlaps, stored = await double_bookings(client, headers, ids[:4])
        return {"bench": "scheduling", "resources": args.resources, "days": args.days,
                "clients": args.clients, "setup_seconds": round(setup_s, 1),
                "slots": len(ids) * len(weekdays(first - timedelta(days=1), args.days)) * 18,
                "availability": avail, "booking": booked,
                "double_bookings": overlaps, "booked_stored": stored,
                "booked_answered": len(won)}
    finally:
        server.terminate()
        server.wait(30)
        shutil.rmtree(data_dir, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--resources", type=int, default=50)
    parser.add_argument("--days", type=int, default=31)
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--availability-requests", type=int, default=1600)
    parser.add_argument("--bookings-per-client", type=int, default=25)
    print(json.dumps(asyncio.run(run(parser.parse_args()))))


if __name__ == "__main__":
    main()
