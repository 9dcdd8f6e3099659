"""Bulk Data export of a large store: resources/s and peak memory.

Fills an embedded SQLite store (a fresh data directory) with ``--resources`` resources
staged through the FHIR service in units of 1,000 (validated by the definitions they
were built from, indexed as any write): 10% Patients, the rest Observations, Conditions
and Encounters about them. Then runs ``healthplatform export`` on it in a child process,
timing it and reading the child's peak resident memory from its rusage, and its peak
anonymous memory (its heap) sampled from /proc: RSS also counts the store file's pages
SQLite maps (up to 1 GiB), which grow with the store and are the kernel's page cache.
The same is done first for a store ten times smaller (the baseline): with the export
streaming page by page, its anonymous memory should not grow with the store.

Prints one JSON line. Usage: ``python bench/bulk_export.py [--resources 1000000]``
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fhir_server.service import FhirService  # noqa: E402
from fhir_server.store.sqlite import SQLiteStore  # noqa: E402

LOINC = "http://loinc.org"
SNOMED = "http://snomed.info/sct"


def resource(i: int) -> dict:
    """The ``i``-th resource: a Patient, then nine resources about them, repeated."""
    patient = f"p{i // 10}"
    kind = i % 10
    if kind == 0:
        return {"resourceType": "Patient", "id": patient, "gender": "female",
                "birthDate": f"19{50 + i % 50}-04-12",
                "name": [{"family": f"Odhiambo{i}", "given": ["Amina"]}],
                "identifier": [{"system": "urn:oid:2.16.404.1.1", "value": f"KE-{i:08d}"}]}
    if kind <= 6:
        return {"resourceType": "Observation", "id": f"o{i}", "status": "final",
                "code": {"coding": [{"system": LOINC, "code": "2339-0"}]},
                "subject": {"reference": f"Patient/{patient}"},
                "effectiveDateTime": "2026-03-02T09:30:00+03:00",
                "valueQuantity": {"value": 5.4, "unit": "mmol/L"}}
    if kind <= 8:
        return {"resourceType": "Condition", "id": f"c{i}",
                "code": {"coding": [{"system": SNOMED, "code": "44054006"}]},
                "subject": {"reference": f"Patient/{patient}"}}
    return {"resourceType": "Encounter", "id": f"e{i}", "status": "finished",
            "class": {"code": "AMB"}, "subject": {"reference": f"Patient/{patient}"}}


async def fill(data_dir: Path, count: int) -> float:
    store = SQLiteStore(data_dir / "healthplatform.db")
    await store.open()
    service = FhirService(store)
    started = time.perf_counter()
    try:
        for first in range(0, count, 1000):
            async with store.unit_of_work() as uow:
                for i in range(first, min(first + 1000, count)):
                    made = resource(i)
                    service.stage_create(uow, made, resource_id=made["id"], validated=True)
                await uow.commit()
    finally:
        await store.close()
    return time.perf_counter() - started


def anonymous_mb(pid: int) -> float:
    """The process's anonymous resident memory (its heap: not the store file's pages
    SQLite maps, which RSS counts too), in MB."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0.0
    line = next((x for x in status.splitlines() if x.startswith("RssAnon:")), "0 0 kB")
    return int(line.split()[1]) / 1024


def export(data_dir: Path, cache_mb: int) -> tuple[float, float, float, int]:
    """(seconds, peak RSS in MB, peak anonymous RSS in MB, resources exported) of
    ``healthplatform export``."""
    exe = Path(sys.executable).parent / "healthplatform"
    out = data_dir / "export"
    # The SQLite page cache (256 MiB by default) fills as the export reads the store:
    # that is the store's memory, not the export's, so it is set small here.
    env = {**os.environ, "HEALTHPLATFORM_DATA_DIR": str(data_dir),
           "HEALTHPLATFORM_STORE": f"sqlite:///{data_dir / 'healthplatform.db'}"
                                   f"?cache_mb={cache_mb}"}
    started = time.perf_counter()
    child = subprocess.Popen([str(exe), "export", "--out", str(out)], env=env, cwd=ROOT,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    peak_anonymous = 0.0
    while True:  # sampled every 20 ms: rusage has no peak of it
        pid, status, usage = os.wait4(child.pid, os.WNOHANG)
        if pid:
            break
        peak_anonymous = max(peak_anonymous, anonymous_mb(child.pid))
        time.sleep(0.02)
    seconds = time.perf_counter() - started
    child.returncode = status
    if status != 0:
        raise SystemExit(f"export failed: {child.stderr.read().decode() if child.stderr else ''}")
    manifest = json.loads((out / "manifest.json").read_text())
    return (seconds, usage.ru_maxrss / 1024, peak_anonymous,
            sum(o["count"] for o in manifest["output"]))


def measure(count: int, cache_mb: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="bench-bulk-") as directory:
        data_dir = Path(directory)
        fill_seconds = asyncio.run(fill(data_dir, count))
        seconds, peak, anonymous, exported = export(data_dir, cache_mb)
    return {"resources": count, "fill_seconds": round(fill_seconds, 1),
            "exported": exported, "seconds": round(seconds, 1),
            "resources_per_s": round(exported / seconds), "peak_rss_mb": round(peak, 1),
            "peak_anonymous_mb": round(anonymous, 1)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--resources", type=int, default=1_000_000)
    parser.add_argument("--cache-mb", type=int, default=16,
                        help="SQLite page cache of the exporting process")
    args = parser.parse_args()
    baseline = measure(args.resources // 10, args.cache_mb)
    result = measure(args.resources, args.cache_mb)
    print(json.dumps({"bench": "bulk_export", "store": "sqlite", "cache_mb": args.cache_mb,
                      **result,
                      "baseline_resources": baseline["resources"],
                      "baseline_resources_per_s": baseline["resources_per_s"],
                      "baseline_peak_rss_mb": baseline["peak_rss_mb"],
                      "baseline_peak_anonymous_mb": baseline["peak_anonymous_mb"]}))


if __name__ == "__main__":
    main()
