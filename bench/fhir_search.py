"""FHIR search at population scale: load rate through transaction bundles, and the latency
of a fixed mix of clinical searches. Prints one JSON line.

Starts the server as ``make run`` does (one process, embedded SQLite store in a fresh data
directory; rate limits off: this measures the FHIR engine), generates a population
(default 20,000 patients and 1,000,000 observations: LOINC vital signs and labs with UCUM
units, realistic values and dates over six years), loads it as transaction bundles (each
a few patients with their observations, ``urn:uuid`` references) with two requests in
flight, then runs each search of the mix ``--iterations`` times with varying arguments:

- identifier: ``Patient?identifier=system|MRN``
- family_birthdate: ``Patient?family=...&birthdate=...``
- patient_code_date: ``Observation?patient=...&code=loinc|8867-4&date=ge...&date=lt...``
- include: ``Observation?patient=...&category=laboratory&_include=Observation:subject``
- chain: ``Observation?subject:Patient.identifier=system|MRN&code=loinc|4548-4``
- has: ``Patient?_has:Observation:patient:code-value-quantity=loinc|4548-4$ge<x>``
- sort_paging: ``Observation?_sort=-date&_count=50`` and its next links to page 5 (each
  page is one sample)

The client is a clinic's administrator (it founds an organization first): what it loads
is owned by the clinic, and every search carries the access policy's criteria, as an
organization member's would.

Reported: resources/s of the load, p50/p95 per search (ms, client side over loopback),
the store's size on disk, and the index-extraction cost per Patient and Observation (µs,
measured in this process on the generated resources).

Usage: ``python bench/fhir_search.py [--patients 20000] [--observations 1000000]
[--iterations 100] [--keep DIR] [--searches-only]``. ``--keep DIR`` loads into (and
keeps) DIR; ``--searches-only`` then runs the search mix again on what DIR holds.
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
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

MRN = "urn:oid:2.16.404.1.1"
LOINC = "http://loinc.org"
UCUM = "http://unitsofmeasure.org"
CATEGORY = "http://terminology.hl7.org/CodeSystem/observation-category"
FAMILIES = [
    "Odhiambo", "Otieno", "Kamau", "Wanjiru", "Mwangi", "Njoroge", "Mensah", "Asante",
    "Owusu", "Boateng", "Okafor", "Okeke", "Adeyemi", "Balogun", "Nwosu", "Hassan", "Ali",
    "Mohamed", "Abdi", "Mutua", "Kiprop", "Chebet", "Nyambura", "Achieng", "Banda", "Phiri",
    "Moyo", "Dlamini", "Ndlovu", "Müller", "Schmidt", "García", "Martínez", "Rossi", "Dubois",
    "Nowak", "Kowalski", "Smith", "Johnson", "Brown", "Nguyen", "Tanaka", "Kim", "Singh",
    "Patel", "Khan", "Silva", "Santos", "Cohen", "Haddad",
]
GIVEN = {
    "female": ["Amina", "Wanjiru", "Akosua", "Chioma", "Fatima", "Zoë", "Grace", "Achieng",
               "Nia", "Ama", "Halima", "Sofia", "Maria", "Aisha", "Imani", "Leila"],
    "male": ["Kwame", "Chinedu", "Otieno", "Brian", "Emeka", "Juma", "Kofi", "Tunde",
             "Musa", "Daniel", "Jonas", "Luca", "Omar", "Samuel", "Baraka", "Ikenna"],
}
CITIES = ["Nairobi", "Mombasa", "Kisumu", "Eldoret", "Accra", "Kumasi", "Lagos", "Abuja",
          "Kampala", "Dar es Salaam"]
# (code, display, unit, mean, sd, decimals, category weight share)
VITALS = [
    ("8867-4", "Heart rate", "/min", 78, 12, 0),
    ("9279-1", "Respiratory rate", "/min", 16, 3, 0),
    ("8310-5", "Body temperature", "Cel", 36.9, 0.5, 1),
    ("59408-5", "Oxygen saturation in Arterial blood by Pulse oximetry", "%", 97, 2, 0),
    ("8480-6", "Systolic blood pressure", "mm[Hg]", 126, 16, 0),
    ("8462-4", "Diastolic blood pressure", "mm[Hg]", 80, 10, 0),
    ("29463-7", "Body weight", "kg", 71, 15, 1),
    ("8302-2", "Body height", "cm", 167, 10, 1),
    ("39156-5", "Body mass index (BMI) [Ratio]", "kg/m2", 25.5, 4.5, 1),
]
LABS = [
    ("4548-4", "Hemoglobin A1c/Hemoglobin.total in Blood", "%", 6.1, 1.2, 1),
    ("2339-0", "Glucose [Mass/volume] in Blood", "mg/dL", 105, 30, 0),
    ("2160-0", "Creatinine [Mass/volume] in Serum or Plasma", "mg/dL", 1.0, 0.3, 2),
    ("718-7", "Hemoglobin [Mass/volume] in Blood", "g/dL", 13.5, 1.6, 1),
    ("2093-3", "Cholesterol [Mass/volume] in Serum or Plasma", "mg/dL", 190, 38, 0),
    ("2823-3", "Potassium [Moles/volume] in Serum or Plasma", "mmol/L", 4.2, 0.4, 1),
    ("2951-2", "Sodium [Moles/volume] in Serum or Plasma", "mmol/L", 140, 3, 0),
    ("6690-2", "Leukocytes [#/volume] in Blood by Automated count", "10*3/uL", 7.0, 2.0, 1),
]
START = 1577836800  # 2020-01-01T00:00:00Z
SPAN = 6 * 365 * 86400


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# --- the population --------------------------------------------------------------------------

def make_patient(rng: random.Random, number: int) -> dict[str, Any]:
    gender = rng.choice(("female", "male"))
    year = rng.randint(1930, 2020)
    return {
        "resourceType": "Patient",
        "identifier": [{"system": MRN, "value": f"MRN{number:08d}"}],
        "name": [{"use": "official", "family": rng.choice(FAMILIES),
                  "given": [rng.choice(GIVEN[gender])]}],
        "gender": gender,
        "birthDate": f"{year}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}",
        "address": [{"city": rng.choice(CITIES), "country": "KE"}],
    }


def make_observation(rng: random.Random, subject: str) -> dict[str, Any]:
    lab = rng.random() < 0.3
    code, display, unit, mean, sd, decimals = rng.choice(LABS if lab else VITALS)
    value = round(max(rng.gauss(mean, sd), mean / 10), decimals)
    moment = time.gmtime(START + rng.randrange(SPAN))
    return {
        "resourceType": "Observation", "status": "final",
        "category": [{"coding": [{"system": CATEGORY,
                                  "code": "laboratory" if lab else "vital-signs"}]}],
        "code": {"coding": [{"system": LOINC, "code": code, "display": display}],
                 "text": display},
        "subject": {"reference": subject},
        "effectiveDateTime": time.strftime("%Y-%m-%dT%H:%M:%SZ", moment),
        "valueQuantity": {"value": value, "unit": unit, "system": UCUM, "code": unit},
    }


def bundles(rng: random.Random, patients: int, observations: int, size: int
            ) -> Iterator[tuple[bytes, int, list[dict[str, Any]]]]:
    """Transaction bundles of whole patient records: (body, resources, the patients)."""
    per_patient, extra = divmod(observations, patients)
    group = max(1, size // (per_patient + 2))
    number = 0
    while number < patients:
        entries, people = [], []
        for _ in range(min(group, patients - number)):
            full_url = f"urn:uuid:{uuid.UUID(int=rng.getrandbits(128), version=4)}"
            person = make_patient(rng, number)
            people.append(person)
            entries.append({"fullUrl": full_url, "resource": person,
                            "request": {"method": "POST", "url": "Patient"}})
            count = per_patient + (1 if number < extra else 0)
            entries += [{"resource": make_observation(rng, full_url),
                         "request": {"method": "POST", "url": "Observation"}}
                        for _ in range(count)]
            number += 1
        body = orjson.dumps({"resourceType": "Bundle", "type": "transaction", "entry": entries})
        yield body, len(entries), people


async def load(client: httpx.AsyncClient, headers: dict[str, str], args: argparse.Namespace
               ) -> tuple[float, int, list[dict[str, Any]]]:
    rng = random.Random(20261122)
    sample: list[dict[str, Any]] = []
    loaded = 0
    in_flight: set[asyncio.Task[None]] = set()

    async def send(body: bytes, people: list[dict[str, Any]]) -> None:
        response = await client.post("/fhir", content=body, headers=headers)
        if response.status_code != 200:
            raise RuntimeError(f"load failed: {response.status_code} {response.text[:500]}")
        result = response.json()["entry"]
        index = 0
        for entry in result:
            location = entry["response"]["location"].rsplit("/fhir/", 1)[-1]
            if location.startswith("Patient/"):
                people[index]["id"] = location.split("/")[1]
                index += 1
        sample.extend(people)

    started = time.perf_counter()
    for body, count, people in bundles(rng, args.patients, args.observations, args.bundle):
        if len(in_flight) >= 2:
            done, in_flight = await asyncio.wait(in_flight, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                task.result()
        in_flight.add(asyncio.create_task(send(body, people)))
        loaded += count
    for task in in_flight:
        await task
    return time.perf_counter() - started, loaded, sample


# --- the search mix ------------------------------------------------------------------------------

def queries(rng: random.Random, people: list[dict[str, Any]]) -> dict[str, Any]:
    person = rng.choice(people)
    mrn = f"{MRN}|{person['identifier'][0]['value']}"
    year = rng.randint(2020, 2024)
    return {
        "identifier": ("Patient", {"identifier": mrn}),
        "family_birthdate": ("Patient", {"family": person["name"][0]["family"],
                                         "birthdate": person["birthDate"]}),
        "patient_code_date": ("Observation", [
            ("patient", person["id"]), ("code", f"{LOINC}|8867-4"),
            ("date", f"ge{year}-01-01"), ("date", f"lt{year + 2}-01-01")]),
        "include": ("Observation", {"patient": person["id"], "category": "laboratory",
                                    "_include": "Observation:subject"}),
        "chain": ("Observation", {"subject:Patient.identifier": mrn,
                                  "code": f"{LOINC}|4548-4"}),
        "has": ("Patient", {"_has:Observation:patient:code-value-quantity":
                            f"{LOINC}|4548-4$ge{rng.choice(['6.5', '7', '7.5'])}"}),
    }


async def timed_get(client: httpx.AsyncClient, url: str, params: Any, headers: dict[str, str]
                    ) -> tuple[float, dict[str, Any]]:
    started = time.perf_counter()
    response = await client.get(url, params=params, headers=headers)
    elapsed = (time.perf_counter() - started) * 1000
    if response.status_code != 200:
        raise RuntimeError(f"{url} {params}: {response.status_code} {response.text[:300]}")
    return elapsed, response.json()


async def search_mix(client: httpx.AsyncClient, headers: dict[str, str],
                     people: list[dict[str, Any]], iterations: int) -> dict[str, Any]:
    rng = random.Random(7)
    samples: dict[str, list[float]] = {}
    matches: dict[str, list[int]] = {}
    for round_number in range(iterations + 3):  # three warm-up rounds are not counted
        for name, (resource_type, params) in queries(rng, people).items():
            elapsed, bundle = await timed_get(client, f"/fhir/{resource_type}", params, headers)
            if round_number >= 3:
                samples.setdefault(name, []).append(elapsed)
                matches.setdefault(name, []).append(
                    sum(1 for e in bundle.get("entry", []) if e["search"]["mode"] == "match"))
        url, params = "/fhir/Observation", {"_sort": "-date", "_count": "50"}
        for _page in range(5):
            elapsed, bundle = await timed_get(client, url, params, headers)
            if round_number >= 3:
                samples.setdefault("sort_paging", []).append(elapsed)
            url = next(x["url"] for x in bundle["link"] if x["relation"] == "next")
            params = None
    return {name: {"p50_ms": round(statistics.median(values), 2),
                   "p95_ms": round(statistics.quantiles(values, n=20)[-1], 2),
                   "samples": len(values),
                   **({"mean_matches": round(statistics.mean(matches[name]), 1)}
                      if name in matches else {})}
            for name, values in samples.items()}


def extraction_cost() -> dict[str, float]:
    from fhir_server.search.extract import IndexExtractor
    from fhir_server.search.registry import builtin_registry

    extract = IndexExtractor(builtin_registry())
    rng = random.Random(3)
    people = [make_patient(rng, i) for i in range(2000)]
    observations = [make_observation(rng, "Patient/p1") for _ in range(2000)]
    costs = {}
    for name, resources in (("Patient", people), ("Observation", observations)):
        for resource in resources[:50]:
            extract(resource)  # compile the plans first
        started = time.perf_counter()
        for resource in resources:
            extract(resource)
        costs[name] = round((time.perf_counter() - started) / len(resources) * 1e6, 1)
    return costs


async def sample_patients(client: httpx.AsyncClient, headers: dict[str, str]
                          ) -> list[dict[str, Any]]:
    """Patients already stored (``--searches-only``): the first thousand."""
    response = await client.get("/fhir/Patient", params={"_count": "1000"}, headers=headers)
    response.raise_for_status()
    return [e["resource"] for e in response.json()["entry"] if e["search"]["mode"] == "match"]


async def count(client: httpx.AsyncClient, headers: dict[str, str], resource_type: str) -> int:
    response = await client.get(f"/fhir/{resource_type}", headers=headers,
                                params={"_summary": "count"})
    response.raise_for_status()
    return int(response.json()["total"])


def directory_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


async def run(args: argparse.Namespace, base: str, data_dir: Path) -> dict[str, Any]:
    async with httpx.AsyncClient(base_url=base, timeout=600) as client:
        for _ in range(200):
            try:
                if (await client.get("/healthz")).status_code == 200:
                    break
            except httpx.TransportError:
                await asyncio.sleep(0.1)
        creds = {"email": "bench@example.org", "password": "correct horse battery",
                 "first_name": "Bench", "last_name": "Runner"}
        registered = await client.post("/api/auth/register", json=creds)
        if registered.status_code != 201 and not args.searches_only:
            registered.raise_for_status()
        token = (await client.post("/api/auth/login", json=creds)).json()["data"]["token"]
        headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/fhir+json"}
        if registered.status_code == 201:  # a clinic's administrator loads and searches
            (await client.post("/api/organizations", json={"name": "Bench Clinic"},
                               headers=headers)).raise_for_status()
        if args.searches_only:
            load_report, people = {}, await sample_patients(client, headers)
        else:
            seconds, loaded, people = await load(client, headers, args)
            load_report = {"resources": loaded, "seconds": round(seconds, 1),
                           "resources_per_s": round(loaded / seconds, 1),
                           "bundle_size": args.bundle}
        size = directory_bytes(data_dir)
        mix = await search_mix(client, headers, people, args.iterations)
        stored = await count(client, headers, "Patient"), await count(client, headers,
                                                                       "Observation")
    return {
        "bench": "fhir_search", "patients": stored[0], "observations": stored[1],
        "load": load_report,
        "searches": mix,
        "store_bytes": size, "store_bytes_per_resource": round(size / sum(stored), 1),
        "extract_us": extraction_cost(),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--patients", type=int, default=20_000)
    parser.add_argument("--observations", type=int, default=1_000_000)
    parser.add_argument("--iterations", type=int, default=100)
    parser.add_argument("--bundle", type=int, default=500, help="resources per transaction")
    parser.add_argument("--keep", type=Path, help="use (and keep) this data directory")
    parser.add_argument("--server-log", type=Path, help="write the server's output here")
    parser.add_argument("--searches-only", action="store_true",
                        help="run the search mix on the data already in --keep")
    args = parser.parse_args()
    if args.searches_only and args.keep is None:
        parser.error("--searches-only needs --keep DIR")
    port = free_port()
    data_dir = args.keep or Path(tempfile.mkdtemp(prefix="bench-search-"))
    data_dir.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "HEALTHPLATFORM_DATA_DIR": str(data_dir),
           "HEALTHPLATFORM_HTTP_PORT": str(port), "HEALTHPLATFORM_MLLP_ENABLED": "false",
           "HEALTHPLATFORM_RATE_LIMIT_ENABLED": "false",
           "HEALTHPLATFORM_MAX_BODY_BYTES": str(64 * 1024 * 1024)}
    exe = Path(sys.executable).parent / "healthplatform"
    log = open(args.server_log, "wb") if args.server_log else None
    output = log or subprocess.DEVNULL
    server = subprocess.Popen([str(exe), "serve"], env=env, cwd=ROOT, stdout=output,
                              stderr=output)
    try:
        result = asyncio.run(run(args, f"http://127.0.0.1:{port}", data_dir))
        print(json.dumps(result))
    finally:
        server.terminate()
        server.wait(30)
        if log is not None:
            log.close()
        if args.keep is None:
            shutil.rmtree(data_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
