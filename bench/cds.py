"""CDS Hooks order-sign throughput and latency, prefetch supplied vs resolved from the store.

Starts the server as ``make run`` does (a fresh SQLite store in a temporary directory,
one trusted CDS client with a generated ES384 key), loads a clinic's patients (each on
warfarin and two other active medications), then drives ``POST /cds-services/
drug-interactions`` with order-sign requests for a draft ibuprofen order (every answer is
a critical interaction card) from ``--connections`` concurrent clients for ``--seconds``:

- ``supplied``: the request carries the prefetch (the patient's medication searches, as
  an EHR would send them);
- ``resolved``: no prefetch; ``fhirServer`` is this server's /fhir with the clinician's
  token as ``fhirAuthorization``, so the two searches run in-process against the store
  under that token's grants.

Every request carries its own client JWT (signed beforehand, outside the timing, as the
EHR would), verified by the server (ES384 signature, audience, expiry, replay). Prints
one JSON line: requests/s, p50 and p99 latency (ms) of each phase. The load generator
shares the machine with the server.

Usage: ``python bench/cds.py [--seconds 10] [--connections 8] [--patients 200]``
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import jwt
from cryptography.hazmat.primitives.asymmetric import ec
from jwt.algorithms import ECAlgorithm

ROOT = Path(__file__).resolve().parent.parent
EHR = "https://ehr.bench.example/"
RXNORM = "http://www.nlm.nih.gov/research/umls/rxnorm"
ACTIVE = [("855332", "Warfarin Sodium 5 MG Oral Tablet"), ("197361", "Amlodipine 5 MG Oral "
          "Tablet"), ("860975", "Metformin hydrochloride 500 MG Oral Tablet")]
SERVICE = "/cds-services/drug-interactions"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def medication_request(patient_id: str, code: str, text: str, status: str = "active",
                       request_id: str | None = None) -> dict[str, Any]:
    resource: dict[str, Any] = {
        "resourceType": "MedicationRequest", "status": status, "intent": "order",
        "subject": {"reference": f"Patient/{patient_id}"},
        "medicationCodeableConcept": {"coding": [{"system": RXNORM, "code": code}],
                                      "text": text}}
    if request_id:
        resource["id"] = request_id
    return resource


def load(client: httpx.Client, headers: dict[str, str], org_id: str, count: int) -> list[str]:
    patients = []
    for i in range(count):
        response = client.post(f"/api/organizations/{org_id}/patients", headers=headers, json={
            "first_name": "Achieng", "last_name": f"Owino{i}", "date_of_birth": "1956-07-21",
            "gender": "female"})
        response.raise_for_status()
        patients.append(response.json()["data"]["id"])
    for start in range(0, count, 50):
        entries = [{"resource": medication_request(p, code, text),
                    "request": {"method": "POST", "url": "MedicationRequest"}}
                   for p in patients[start:start + 50] for code, text in ACTIVE]
        client.post("/fhir", headers={**headers, "Content-Type": "application/fhir+json"},
                    json={"resourceType": "Bundle", "type": "transaction",
                          "entry": entries}).raise_for_status()
    return patients


def order_sign(patient_id: str, prefetch: dict[str, Any] | None, **extra: Any) -> bytes:
    draft = medication_request(patient_id, "197806", "Ibuprofen 600 MG Oral Tablet", "draft",
                               "draft-1")
    body: dict[str, Any] = {
        "hook": "order-sign", "hookInstance": str(uuid.uuid4()),
        "context": {"userId": "Practitioner/bench", "patientId": patient_id,
                    "draftOrders": {"resourceType": "Bundle", "type": "collection",
                                    "entry": [{"resource": draft}]}}, **extra}
    if prefetch is not None:
        body["prefetch"] = prefetch
    return json.dumps(body).encode()


def tokens(key: Any, audience: str, count: int) -> list[str]:
    now = int(time.time())
    return [jwt.encode({"iss": EHR, "aud": audience, "iat": now, "exp": now + 280,
                        "jti": str(uuid.uuid4())}, key, algorithm="ES384",
                       headers={"kid": "bench", "typ": "JWT"}) for _ in range(count)]


async def drive(base: str, bodies: list[bytes], signed: list[str], seconds: float,
                connections: int) -> dict[str, Any]:
    latencies: list[float] = []
    failures = 0
    deadline = time.perf_counter() + seconds
    next_body = 0

    async def worker(client: httpx.AsyncClient) -> None:
        nonlocal failures, next_body
        while time.perf_counter() < deadline and signed:
            body = bodies[next_body % len(bodies)]
            next_body += 1
            headers = {"Authorization": f"Bearer {signed.pop()}",
                       "Content-Type": "application/json"}
            started = time.perf_counter()
            response = await client.post(SERVICE, content=body, headers=headers)
            latencies.append(time.perf_counter() - started)
            if response.status_code != 200 or not response.json()["cards"]:
                failures += 1

    limits = httpx.Limits(max_connections=connections)
    async with httpx.AsyncClient(base_url=base, timeout=30, limits=limits) as client:
        started = time.perf_counter()
        await asyncio.gather(*(worker(client) for _ in range(connections)))
        elapsed = time.perf_counter() - started
    ordered = sorted(latencies)
    return {"requests": len(ordered), "per_s": round(len(ordered) / elapsed, 1),
            "p50_ms": round(statistics.median(ordered) * 1000, 2),
            "p99_ms": round(ordered[int(len(ordered) * 0.99) - 1] * 1000, 2),
            "failures": failures}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=10)
    parser.add_argument("--connections", type=int, default=8)
    parser.add_argument("--patients", type=int, default=200)
    args = parser.parse_args()
    key = ec.generate_private_key(ec.SECP384R1())
    public = {**ECAlgorithm.to_jwk(key.public_key(), as_dict=True), "kid": "bench",
              "alg": "ES384"}
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    data_dir = tempfile.mkdtemp(prefix="bench-cds-")
    limits = {name: "100000000/60" for name in ("read", "write", "public", "webhook")}
    env = {**os.environ, "HEALTHPLATFORM_DATA_DIR": data_dir,
           "HEALTHPLATFORM_HTTP_PORT": str(port), "HEALTHPLATFORM_ACCESS_LOG": "false",
           "HEALTHPLATFORM_RATE_LIMITS": json.dumps(limits),
           "HEALTHPLATFORM_CDS_CLIENTS": json.dumps({EHR: {"jwks": {"keys": [public]}}})}
    exe = Path(sys.executable).parent / "healthplatform"
    server = subprocess.Popen([str(exe), "serve"], env=env, cwd=ROOT,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        with httpx.Client(base_url=base, timeout=60) as client:
            for _ in range(200):
                try:
                    if client.get("/healthz").status_code == 200:
                        break
                except httpx.TransportError:
                    time.sleep(0.1)
            creds = {"email": "bench@clinic.example.org", "password": "correct horse battery",
                     "first_name": "Otieno", "last_name": "Mwangi"}
            client.post("/api/auth/register", json=creds).raise_for_status()
            token = client.post("/api/auth/login", json=creds).json()["data"]["token"]
            headers = {"Authorization": f"Bearer {token}"}
            org = client.post("/api/organizations", headers=headers,
                              json={"name": "Kisumu Bench Clinic"})
            org.raise_for_status()
            patients = load(client, headers, org.json()["data"]["id"], args.patients)
            supplied = []
            for patient in patients:
                found = client.get(f"/fhir/MedicationRequest?patient={patient}"
                                   "&status=active,on-hold", headers=headers).json()
                empty = {"resourceType": "Bundle", "type": "searchset", "entry": []}
                supplied.append(order_sign(patient, {"medications": found,
                                                     "statements": empty}))
        authorization = {"access_token": token, "token_type": "Bearer", "expires_in": 900,
                         "scope": "user/*.read", "subject": "bench-cds"}
        resolved = [order_sign(p, None, fhirServer=f"{base}/fhir",
                               fhirAuthorization=authorization) for p in patients]
        budget = int(args.seconds * 1500)
        audience = base + SERVICE
        results: dict[str, Any] = {"connections": args.connections, "seconds": args.seconds,
                                   "patients": args.patients}
        asyncio.run(drive(base, supplied, tokens(key, audience, 200), 2, args.connections))
        for phase, bodies in (("supplied", supplied), ("resolved", resolved)):
            results[phase] = asyncio.run(drive(base, bodies, tokens(key, audience, budget),
                                               args.seconds, args.connections))
        print(json.dumps({"bench": "cds_order_sign", **results}))
    finally:
        server.terminate()
        server.wait(10)
        shutil.rmtree(data_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
