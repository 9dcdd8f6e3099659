"""Valid requests beside bad ones: none of the valid may fail, none of the bad be stored.

Starts the server as ``make run`` does (``healthplatform serve``: one process, a fresh
data directory, MLLP on a free port), then from this process, for ``--seconds``:

- valid traffic: ``--writers`` keep-alive HTTP clients creating Patients on /fhir as a
  clinic's administrator, and ``--mllp`` MLLP connections sending ORU^R01 lab results;
- bad traffic beside it, on keep-alive connections of its own: bodies nested 300 and
  2,000 levels deep, a Patient of 60,000 names (beyond the element bound), wrongly
  shaped resources (a string, a number, a list or null where an object belongs), a
  PATCH that would store such a shape, ``page=99999999999999999999`` on /api and
  ``_history/9223372036854775808`` on /fhir;
- ``/healthz`` probed every 50 ms;

then ``--large-seconds`` of four clients creating large valid Patients (12,000 names,
about 0.5 MB each) in a loop while ``/healthz`` is probed: how long one request's heavy
work holds the others up. Prints one JSON line: the valid requests and their errors
(must be 0), HL7 messages and their non-AA acks (must be 0), the bad requests, how many
were refused with a 4xx, stored (2xx: must be 0) or failed with a 5xx (must be 0),
creates per second, and the /healthz latency (p50 / p99 / max) in both phases.

Usage: ``python bench/mixed_load.py [--seconds 15] [--writers 8] [--mllp 2]``
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from hl7_mllp import oru  # noqa: E402

from hl7_gateway.mllp import MLLPClient  # noqa: E402
from hl7_gateway.parser import parse  # noqa: E402

FHIR = {"Content-Type": "application/fhir+json"}
FAMILIES = ["Achieng", "Otieno", "Wanjiru", "Kamau", "Mensah", "Okafor", "Banda", "Mwangi"]
GIVEN = ["Grace", "Amina", "John", "Kwame", "Fatuma", "Chidi", "Zawadi", "Tendai"]
HAEMOGLOBIN = {"coding": [{"system": "http://loinc.org", "code": "718-7"}]}
PASSWORD = "correct horse battery staple"


def patient(rng: random.Random) -> dict[str, Any]:
    return {"resourceType": "Patient", "gender": rng.choice(["female", "male"]),
            "name": [{"family": rng.choice(FAMILIES), "given": [rng.choice(GIVEN)]}],
            "birthDate": f"19{rng.randint(40, 99)}-0{rng.randint(1, 9)}-1{rng.randint(0, 9)}",
            "telecom": [{"system": "phone", "value": f"+2547{rng.randint(10**7, 10**8 - 1)}"}]}


def nested(levels: int) -> bytes:
    """A Patient whose extension nests ``levels`` deep, as JSON text (no encoder writes
    it that deep)."""
    url = b'"http://example.org/fhir/StructureDefinition/nested"'
    opening = b'{"url": ' + url + b', "extension": ['
    innermost = b'{"url": ' + url + b', "valueString": "x"}'
    return (b'{"resourceType": "Patient", "extension": [' + opening * levels + innermost
            + b"]}" * levels + b"]}")


def observation(**elements: Any) -> dict[str, Any]:
    return {"resourceType": "Observation", "status": "final", "code": HAEMOGLOBIN,
            "subject": {"reference": "Patient/p1"}, **elements}


WRONG_SHAPES = [
    observation(code="abc", subject="Patient/1"), observation(valueQuantity="13.2 g/dL"),
    observation(valueQuantity=13.2), observation(valueQuantity=None),
    observation(extension=[1]), {"resourceType": "Patient", "name": [["Amina", "Otieno"]]},
    {"resourceType": "Patient", "telecom": ["+254712345678"]},
]


def bad_requests(org_id: str, patient_id: str) -> list[Callable[[httpx.AsyncClient],
                                                                 Awaitable[httpx.Response]]]:
    # Written once: the load generator shares the machine's two cores with the server.
    huge = json.dumps({"resourceType": "Patient", "name": [
        {"family": "Mwangi", "given": ["Peter", "Kamau"]} for _ in range(60_000)]}).encode()
    deep, deeper = nested(300), nested(2000)
    requests: list[Callable[[httpx.AsyncClient], Awaitable[httpx.Response]]] = [
        lambda c: c.post("/fhir/Patient", content=deep, headers=FHIR),
        lambda c: c.post("/fhir/Patient", content=deeper, headers=FHIR),
        lambda c: c.post("/fhir/Patient", content=huge, headers=FHIR),
        lambda c: c.patch(f"/fhir/Patient/{patient_id}",
                          json=[{"op": "replace", "path": "/name", "value": [["Amina"]]}],
                          headers={"Content-Type": "application/json-patch+json"}),
        lambda c: c.get(f"/api/organizations/{org_id}/patients?page=99999999999999999999"),
        lambda c: c.get(f"/fhir/Patient/{patient_id}/_history/9223372036854775808"),
        lambda c: c.post("/api/organizations", content=b'{"name": ' + b"[" * 3000
                         + b"]" * 3000 + b"}", headers={"Content-Type": "application/json"}),
    ]
    for body in WRONG_SHAPES:
        requests.append(lambda c, body=body: c.post(
            f"/fhir/{body['resourceType']}", content=json.dumps(body).encode(), headers=FHIR))
    return requests


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def percentiles(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples) or [0.0]
    return {"p50_ms": round(statistics.median(ordered) * 1000, 1),
            "p99_ms": round(ordered[max(0, int(len(ordered) * 0.99) - 1)] * 1000, 1),
            "max_ms": round(ordered[-1] * 1000, 1)}


class Load:
    """The counters of one run."""

    def __init__(self, base: str, headers: dict[str, str], deadline: float):
        self.base, self.headers, self.deadline = base, headers, deadline
        self.valid: Counter[str] = Counter()
        self.bad: Counter[str] = Counter()
        self.hl7: Counter[str] = Counter()
        self.healthz: list[float] = []

    def client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(base_url=self.base, headers=self.headers, timeout=60)

    async def writer(self, seed: int) -> None:
        rng = random.Random(seed)
        async with self.client() as client:
            while time.perf_counter() < self.deadline:
                try:
                    answer = await client.post("/fhir/Patient", json=patient(rng),
                                               headers=FHIR)
                    self.valid["ok" if answer.status_code == 201 else "error"] += 1
                except httpx.HTTPError:
                    self.valid["error"] += 1

    async def mllp(self, port: int, seed: int) -> None:
        rng = random.Random(seed)
        async with MLLPClient("127.0.0.1", port, timeout=60) as client:
            n = seed * 10**6
            while time.perf_counter() < self.deadline:
                n += 1
                msa = parse(await client.send(oru(n, 500, rng))).segment("MSA")
                self.hl7["ok" if msa is not None and msa.field(1) == "AA" else "error"] += 1

    async def attacker(self, requests: list[Callable[[httpx.AsyncClient],
                                                     Awaitable[httpx.Response]]]) -> None:
        async with self.client() as client:
            while time.perf_counter() < self.deadline:
                for send in requests:
                    try:
                        status = (await send(client)).status_code
                    except httpx.HTTPError:
                        status = 0  # the connection failed: as bad as a 5xx
                    self.bad["refused" if 400 <= status < 500 else
                             "stored" if status < 300 and status else "failed"] += 1

    async def prober(self) -> None:
        async with httpx.AsyncClient(base_url=self.base, timeout=60) as client:
            while time.perf_counter() < self.deadline:
                start = time.perf_counter()
                await client.get("/healthz")
                self.healthz.append(time.perf_counter() - start)
                await asyncio.sleep(0.05)

    async def large(self, seed: int, durations: list[float]) -> None:
        body = json.dumps({"resourceType": "Patient", "gender": "female", "name": [
            {"family": f"{FAMILIES[n % 8]}{n}", "given": [GIVEN[n % 8]]}
            for n in range(12_000)]}).encode()
        async with self.client() as client:
            while time.perf_counter() < self.deadline:
                start = time.perf_counter()
                answer = await client.post("/fhir/Patient", headers=FHIR, content=body)
                durations.append(time.perf_counter() - start)
                self.valid["ok" if answer.status_code == 201 else "error"] += 1


async def setup(base: str) -> tuple[dict[str, str], str, str]:
    """A clinic's administrator: (headers, organization id, a Patient id)."""
    async with httpx.AsyncClient(base_url=base, timeout=30) as client:
        for _ in range(150):
            try:
                if (await client.get("/healthz")).status_code == 200:
                    break
            except httpx.TransportError:
                await asyncio.sleep(0.1)
        creds = {"email": "bench-admin@kisumu-clinic.example.org", "password": PASSWORD}
        (await client.post("/api/auth/register", json={
            **creds, "first_name": "Wanjiku", "last_name": "Kamau"})).raise_for_status()
        token = (await client.post("/api/auth/login", json=creds)).json()["data"]["token"]
        headers = {"Authorization": f"Bearer {token}"}
        org = await client.post("/api/organizations", headers=headers,
                                json={"name": "Kisumu Bench Clinic", "country": "KE"})
        created = await client.post("/fhir/Patient", headers={**headers, **FHIR},
                                    json=patient(random.Random(0)))
        return headers, org.json()["data"]["id"], created.json()["id"]


async def run(base: str, mllp_port: int, args: argparse.Namespace) -> dict[str, Any]:
    headers, org_id, patient_id = await setup(base)
    mixed = Load(base, headers, time.perf_counter() + args.seconds)
    started = time.perf_counter()
    await asyncio.gather(
        *(mixed.writer(n) for n in range(args.writers)),
        *(mixed.mllp(mllp_port, n + 1) for n in range(args.mllp)),
        *(mixed.attacker(bad_requests(org_id, patient_id)) for _ in range(2)),
        mixed.prober())
    elapsed = time.perf_counter() - started
    big = Load(base, headers, time.perf_counter() + args.large_seconds)
    durations: list[float] = []
    await asyncio.gather(*(big.large(n, durations) for n in range(4)), big.prober())
    return {
        "bench": "mixed_load", "seconds": round(elapsed, 1), "writers": args.writers,
        "valid_requests": sum(mixed.valid.values()), "valid_errors": mixed.valid["error"],
        "creates_per_s": round(mixed.valid["ok"] / elapsed, 1),
        "hl7_messages": sum(mixed.hl7.values()), "hl7_errors": mixed.hl7["error"],
        "hl7_per_s": round(mixed.hl7["ok"] / elapsed, 1),
        "bad_requests": sum(mixed.bad.values()), "bad_refused_4xx": mixed.bad["refused"],
        "bad_stored_2xx": mixed.bad["stored"], "bad_failed_5xx": mixed.bad["failed"],
        "healthz_mixed": percentiles(mixed.healthz),
        "large_creates": len(durations), "large_errors": big.valid["error"],
        "large_create_p50_ms": percentiles(durations)["p50_ms"],
        "healthz_large": percentiles(big.healthz),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=15)
    parser.add_argument("--large-seconds", type=float, default=10)
    parser.add_argument("--writers", type=int, default=8)
    parser.add_argument("--mllp", type=int, default=2)
    args = parser.parse_args()
    data_dir = tempfile.mkdtemp(prefix="bench-mixed-")
    port, mllp_port = free_port(), free_port()
    # One token drives the load: budgets far above a user's, so none refuses the run.
    env = {**os.environ, "HEALTHPLATFORM_DATA_DIR": data_dir,
           "HEALTHPLATFORM_HTTP_PORT": str(port), "HEALTHPLATFORM_MLLP_PORT": str(mllp_port),
           "HEALTHPLATFORM_MLLP_ENABLED": "true", "HEALTHPLATFORM_LOG_LEVEL": "CRITICAL",
           "HEALTHPLATFORM_ACCESS_LOG": "false",
           "HEALTHPLATFORM_RATE_LIMITS": json.dumps({"read": "100000000/60",
                                                     "write": "100000000/60"})}
    exe = Path(sys.executable).parent / "healthplatform"
    server = subprocess.Popen([str(exe), "serve"], env=env, cwd=ROOT,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        result = asyncio.run(run(f"http://127.0.0.1:{port}", mllp_port, args))
    finally:
        server.terminate()
        server.wait(10)
        shutil.rmtree(data_dir, ignore_errors=True)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
