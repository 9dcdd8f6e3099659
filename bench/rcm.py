"""Revenue cycle under load: claims drafted and sent to a payer by 32 clients, then the
reports over them. Prints one JSON line.

Starts the server as ``make run`` does (one process, embedded SQLite store in a fresh
data directory) with one payer configured, NHIF over FHIR, answered by a stand-in payer
in this process (``POST /Claim/$submit``: everything approved and paid). A clinic's
administrator registers ``--patients`` patients; then, over loopback:

- **draft**: ``--clients`` concurrent clients draft ``--claims`` claims (two lines each,
  prices drawn around a mean; one in 40 priced six times higher, one in 50 with 100
  units): p50/p99, claims/s;
- **submit**: the same clients send them all to the payer: p50/p99, submissions/s, and
  how many ended ``paid`` (must be all);
- **reports**: ``GET /api/rcm/claims/analytics/by-insurer``, ``/analytics/by-provider``,
  ``/reconciliation`` and ``/fraud-flags`` over every claim: the time of each (3 runs,
  the best), and the flags found by rule.

The load generator and the payer share the machine with the server: on 2 cores their
cost is part of what is measured.

Usage: ``python bench/rcm.py [--patients 20] [--claims 400] [--clients 32]``
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
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
from aiohttp import web

ROOT = Path(__file__).resolve().parents[1]
KEY = "bench-payer-key"


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


async def approve(request: web.Request) -> web.Response:
    """The stand-in payer: every line approved and the total paid today."""
    if request.headers.get("Authorization") != f"Bearer {KEY}":
        return web.json_response({"resourceType": "OperationOutcome"}, status=401)
    claim = await request.json()
    currency = claim["total"]["currency"]

    def amount(category: str, value: float) -> dict[str, Any]:
        return {"category": {"coding": [{"code": category}]},
                "amount": {"value": value, "currency": currency}}
    total = claim["total"]["value"]
    return web.json_response({
        "resourceType": "ClaimResponse", "status": "active", "type": claim["type"],
        "use": claim["use"], "patient": claim["patient"], "created": claim["created"],
        "insurer": claim["insurer"], "outcome": "complete",
        "item": [{"itemSequence": i["sequence"], "adjudication": [
            amount("submitted", i["net"]["value"]), amount("benefit", i["net"]["value"])]}
            for i in claim["item"]],
        "total": [amount("submitted", total), amount("benefit", total)],
        "payment": {"type": {"coding": [{"code": "complete"}]}, "date": claim["created"][:10],
                    "amount": {"value": total, "currency": currency}}})


def start_server(data_dir: str, port: int, payer: str) -> subprocess.Popen[bytes]:
    env = {**os.environ, "HEALTHPLATFORM_DATA_DIR": data_dir,
           "HEALTHPLATFORM_HTTP_PORT": str(port), "HEALTHPLATFORM_MLLP_ENABLED": "false",
           "HEALTHPLATFORM_SCHEDULING_UPKEEP_INTERVAL_SECONDS": "0",
           "HEALTHPLATFORM_RCM_PAYERS": json.dumps({"nhif": {
               "name": "NHIF", "base_url": payer, "format": "fhir", "api_key": KEY,
               "timeout_seconds": 30}}),
           "HEALTHPLATFORM_RATE_LIMITS": json.dumps({c: "100000000/60" for c in (
               "read", "write", "public", "login")})}
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


async def setup(client: httpx.AsyncClient, patients: int
                ) -> tuple[dict[str, str], str, list[str]]:
    creds = {"email": "rcm-bench@example.org", "password": "correct horse battery",
             "first_name": "Bench", "last_name": "Billing"}
    (await client.post("/api/auth/register", json=creds)).raise_for_status()
    token = (await client.post("/api/auth/login", json=creds)).json()["data"]["token"]
    headers = {"Authorization": f"Bearer {token}"}
    org = (await client.post("/api/organizations", headers=headers, json={
        "name": "Bench Hospital", "country": "KE"})).json()["data"]["id"]
    ids = []
    for n in range(patients):
        made = await client.post(f"/api/organizations/{org}/patients", headers=headers, json={
            "first_name": "Patient", "last_name": f"Bench{n:03d}",
            "date_of_birth": f"19{50 + n % 50}-03-0{1 + n % 9}",
            "gender": "female" if n % 2 else "male"})
        made.raise_for_status()
        ids.append(made.json()["data"]["id"])
    return headers, org, ids


def claim_body(org: str, patients: list[str], n: int) -> dict[str, Any]:
    rng = random.Random(n)
    price = max(100.0, rng.gauss(1500, 150)) * (6 if n % 40 == 39 else 1)  # outliers
    return {"organization_id": org, "patient_id": rng.choice(patients), "insurer": "NHIF",
            "policy_number": f"NHIF-{n % 50:04d}", "currency": "KES",
            "diagnoses": [rng.choice(["B50.9", "J06.9", "A09", "I10", "E11.9"])],
            "service_date": f"2026-{1 + n % 12:02d}-{1 + n % 28:02d}",
            "items": [{"description": "Outpatient consultation", "code": "CONSULT",
                       "unit_price": f"{price:.2f}"},
                      {"description": "Malaria RDT", "code": "RDT",
                       "quantity": 100 if n % 50 == 49 else rng.choice([1, 2]),
                       "unit_price": "175.25"}]}


async def drive(base: str, headers: dict[str, str], clients: int, jobs: list[Any],
                send: Any) -> tuple[dict[str, Any], list[httpx.Response]]:
    latencies: list[float] = []
    answers: list[httpx.Response] = []
    queue = list(jobs)

    async def one_client() -> None:
        async with httpx.AsyncClient(base_url=base, headers=headers, timeout=120) as client:
            while queue:
                job = queue.pop()
                began = time.perf_counter()
                answers.append(await send(client, job))
                latencies.append(time.perf_counter() - began)

    started = time.perf_counter()
    await asyncio.gather(*(one_client() for _ in range(clients)))
    return summary(latencies, time.perf_counter() - started), answers


async def best_of(client: httpx.AsyncClient, headers: dict[str, str], path: str,
                  **params: Any) -> tuple[float, Any]:
    times, body = [], None
    for _ in range(3):
        began = time.perf_counter()
        answer = await client.get(path, headers=headers, params=params, timeout=300)
        times.append(time.perf_counter() - began)
        answer.raise_for_status()
        body = answer.json()
    return round(min(times) * 1000, 1), body


async def main(args: argparse.Namespace) -> dict[str, Any]:
    payer_app = web.Application()
    payer_app.router.add_post("/Claim/$submit", approve)
    runner = web.AppRunner(payer_app, access_log=None)
    await runner.setup()
    payer_port, port = free_port(), free_port()
    await web.TCPSite(runner, "127.0.0.1", payer_port).start()
    data_dir = tempfile.mkdtemp(prefix="rcm-bench-")
    server = start_server(data_dir, port, f"http://127.0.0.1:{payer_port}")
    base = f"http://127.0.0.1:{port}"
    try:
        async with httpx.AsyncClient(base_url=base, timeout=120) as client:
            await wait_ready(client)
            headers, org, patients = await setup(client, args.patients)

            async def draft(c: httpx.AsyncClient, n: int) -> httpx.Response:
                return await c.post("/api/rcm/claims", json=claim_body(org, patients, n))
            drafted, answers = await drive(base, headers, args.clients,
                                           list(range(args.claims)), draft)
            ids = [a.json()["data"]["id"] for a in answers if a.status_code == 201]

            async def submit(c: httpx.AsyncClient, claim_id: str) -> httpx.Response:
                return await c.post(f"/api/rcm/claims/{claim_id}/submit")
            submitted, sent = await drive(base, headers, args.clients, ids, submit)
            refusals = Counter(a.json()["error"]["code"] for a in sent if a.status_code != 200)
            statuses = Counter(a.json()["data"]["status"] if a.status_code == 200
                               else str(a.status_code) for a in sent)
            reports = {}
            for name, path in (("by_insurer", "/api/rcm/claims/analytics/by-insurer"),
                               ("by_provider", "/api/rcm/claims/analytics/by-provider"),
                               ("reconciliation", "/api/rcm/claims/reconciliation")):
                reports[name + "_ms"], _body = await best_of(client, headers, path)
            reports["fraud_flags_ms"], flags = await best_of(
                client, headers, "/api/rcm/claims/fraud-flags", limit=100)
            counted = Counter(f["rule"] for f in flags["data"])
    finally:
        server.terminate()
        server.wait(timeout=30)
        await runner.cleanup()
        shutil.rmtree(data_dir, ignore_errors=True)
    return {"benchmark": "rcm", "claims": len(ids), "clients": args.clients,
            "draft": drafted, "submit": submitted, "submitted_statuses": dict(statuses),
            "refusals": dict(refusals),
            "reports": reports, "fraud_flags": flags["meta"]["total"],
            "fraud_flags_first_page_by_rule": dict(counted)}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--patients", type=int, default=20)
    parser.add_argument("--claims", type=int, default=100)
    parser.add_argument("--clients", type=int, default=32)
    print(json.dumps(asyncio.run(main(parser.parse_args()))))
