"""HL7v2 over MLLP end to end: lab results in, FHIR committed, ACKs out.

Starts the server as ``make run`` does (``healthplatform serve``: one process, embedded
SQLite store in a fresh data directory, MLLP listener on a free port), then drives it from
this process over loopback: 8 persistent MLLP connections, each sending realistic ORU^R01
lab results (one panel, 5-20 OBX, a specimen; patients reused as in a real feed) one after
the other and timing each ACK. Measures, in the same run, the parse-only rate of hl7apy
and of the gateway's hot-path parser on the same messages. Prints one JSON line:

    messages_per_s, ack_p50_ms / ack_p99_ms, resources_per_s (FHIR resource versions
    written, counted in the store), nak count, parse_per_s for hl7apy and the hot path.

Usage: ``python bench/hl7_mllp.py [--seconds 20] [--connections 8] [--patients 2000]``
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import socket
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from hl7_gateway.mllp import MLLPClient  # noqa: E402
from hl7_gateway.parser import parse  # noqa: E402

# (LOINC, name, UCUM unit, low, high): a hospital lab's everyday menu.
TESTS = [
    ("718-7", "Hemoglobin [Mass/volume] in Blood", "g/dL", 12.0, 17.5),
    ("4544-3", "Hematocrit [Volume Fraction] of Blood", "%", 36.0, 53.0),
    ("789-8", "Erythrocytes [#/volume] in Blood", "10*6/uL", 4.2, 5.9),
    ("6690-2", "Leukocytes [#/volume] in Blood", "10*3/uL", 4.5, 11.0),
    ("777-3", "Platelets [#/volume] in Blood", "10*3/uL", 150, 400),
    ("787-2", "MCV [Entitic volume]", "fL", 80, 100),
    ("2345-7", "Glucose [Mass/volume] in Serum or Plasma", "mg/dL", 70, 99),
    ("2160-0", "Creatinine [Mass/volume] in Serum or Plasma", "mg/dL", 0.7, 1.3),
    ("3094-0", "Urea nitrogen [Mass/volume] in Serum or Plasma", "mg/dL", 7, 20),
    ("2951-2", "Sodium [Moles/volume] in Serum or Plasma", "mmol/L", 136, 145),
    ("2823-3", "Potassium [Moles/volume] in Serum or Plasma", "mmol/L", 3.5, 5.1),
    ("2075-0", "Chloride [Moles/volume] in Serum or Plasma", "mmol/L", 98, 107),
    ("2028-9", "Carbon dioxide [Moles/volume] in Serum or Plasma", "mmol/L", 23, 29),
    ("17861-6", "Calcium [Mass/volume] in Serum or Plasma", "mg/dL", 8.6, 10.3),
    ("1742-6", "ALT [Enzymatic activity/volume] in Serum or Plasma", "U/L", 7, 56),
    ("1920-8", "AST [Enzymatic activity/volume] in Serum or Plasma", "U/L", 10, 40),
    ("6768-6", "Alkaline phosphatase [Enzymatic activity/volume]", "U/L", 44, 147),
    ("1975-2", "Bilirubin.total [Mass/volume] in Serum or Plasma", "mg/dL", 0.1, 1.2),
    ("2885-2", "Protein [Mass/volume] in Serum or Plasma", "g/dL", 6.0, 8.3),
    ("1751-7", "Albumin [Mass/volume] in Serum or Plasma", "g/dL", 3.5, 5.0),
]
FAMILIES = ["Achieng", "Otieno", "Wanjiru", "Kamau", "Mensah", "Okafor", "Banda", "Mwangi"]
GIVEN = ["Grace", "Amina", "John", "Kwame", "Fatuma", "Chidi", "Zawadi", "Tendai"]


def oru(n: int, patients: int, rng: random.Random) -> bytes:
    """One ORU^R01: a panel of 5-20 tests for one of ``patients`` patients."""
    patient = rng.randrange(patients)
    count = rng.randint(5, 20)
    when = "20240301" + f"{8 + n % 10:02d}{n % 60:02d}00+0300"
    segments = [
        f"MSH|^~\\&|CITYLAB-LIS|CITY LAB|CLINIC-EHR|KISUMU CLINIC|{when}||ORU^R01^ORU_R01|"
        f"B{n:09d}|P|2.5.1",
        f"PID|1||MRN{patient:07d}^^^CITY LAB&2.16.840.1.113883.19.5&ISO^MR||"
        f"{FAMILIES[patient % 8]}^{GIVEN[patient // 8 % 8]}||19{50 + patient % 50}0412|"
        f"{'FM'[patient % 2]}|||{patient} Oginga Odinga St^^Kisumu^^40100^KE^H",
        f"ORC|RE|P{n:09d}^CLINIC-EHR|F{n:09d}^CITY LAB||CM",
        f"OBR|1|P{n:09d}^CLINIC-EHR|F{n:09d}^CITY LAB|24323-8^Comprehensive metabolic panel^LN"
        f"|||{when}|||||||||1234^Mwangi^John^^^Dr||||||{when}|||F",
    ]
    for k, (code, name, unit, low, high) in enumerate(rng.sample(TESTS, count), 1):
        value = rng.uniform(low * 0.8, high * 1.2)
        flag = "H" if value > high else "L" if value < low else "N"
        segments.append(f"OBX|{k}|NM|{code}^{name}^LN||{value:.1f}|{unit}^{unit}^UCUM|"
                        f"{low}-{high}|{flag}|||F|||{when}")
    segments.append(f"SPM|1|S{n:09d}&CITY LAB||119297000^Blood specimen^SCT|||||||||||||{when}")
    return ("\r".join(segments) + "\r").encode()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def versions_written(db: Path) -> int:
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        return int(conn.execute("SELECT count(*) FROM versions").fetchone()[0])


def parse_rate(messages: list[bytes], parse_one: object, budget: float) -> float:
    """Messages parsed per second by ``parse_one`` over about ``budget`` seconds."""
    done, start = 0, time.perf_counter()
    while time.perf_counter() - start < budget:
        for message in messages:
            parse_one(message)  # type: ignore[operator]
            done += 1
    return done / (time.perf_counter() - start)


def hl7apy_parser() -> object:
    from hl7apy.parser import parse_message

    # hl7apy wants CR-separated text and chokes on nothing else here; default validation.
    return lambda raw: parse_message(raw.decode(), find_groups=True)


async def drive(port: int, connections: int, seconds: float, patients: int, *, first: int
                ) -> tuple[list[float], int, float]:
    """Closed loop: each connection sends, waits for the ACK, sends the next. Control ids
    start at ``first``, so no message repeats an earlier one (that would be a resend)."""
    counter = iter(range(first, 10**9))
    latencies: list[float] = []
    naks = 0
    started = time.perf_counter()
    deadline = started + seconds

    async def connection(seed: int) -> None:
        nonlocal naks
        rng = random.Random(seed + first)
        async with MLLPClient("127.0.0.1", port, timeout=30) as client:
            while time.perf_counter() < deadline:
                message = oru(next(counter), patients, rng)
                start = time.perf_counter()
                reply = await client.send(message)
                latencies.append(time.perf_counter() - start)
                msa = parse(reply).segment("MSA")
                if msa is None or msa.field(1) != "AA":
                    naks += 1

    await asyncio.gather(*(connection(n) for n in range(connections)))
    return latencies, naks, time.perf_counter() - started


def wait_for(port: int, timeout: float = 30.0) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            time.sleep(0.1)
    raise SystemExit(f"the MLLP listener did not come up on port {port}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=20)
    parser.add_argument("--connections", type=int, default=8)
    parser.add_argument("--patients", type=int, default=2000)
    args = parser.parse_args()
    data_dir = Path(tempfile.mkdtemp(prefix="bench-hl7-"))
    mllp_port = free_port()
    env = {**os.environ, "HEALTHPLATFORM_DATA_DIR": str(data_dir),
           "HEALTHPLATFORM_HTTP_PORT": str(free_port()),
           "HEALTHPLATFORM_MLLP_PORT": str(mllp_port), "HEALTHPLATFORM_MLLP_ENABLED": "true",
           "HEALTHPLATFORM_LOG_LEVEL": "WARNING"}
    exe = Path(sys.executable).parent / "healthplatform"
    server = subprocess.Popen([str(exe), "serve"], env=env, cwd=ROOT,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(mllp_port)
        asyncio.run(drive(mllp_port, args.connections, 3, args.patients, first=0))  # warm up
        before = versions_written(data_dir / "healthplatform.db")
        latencies, naks, elapsed = asyncio.run(
            drive(mllp_port, args.connections, args.seconds, args.patients, first=10**8))
        written = versions_written(data_dir / "healthplatform.db") - before
    finally:
        server.terminate()
        server.wait(10)
        shutil.rmtree(data_dir, ignore_errors=True)  # ~170 MB a run
    rng = random.Random(7)
    sample = [oru(n, args.patients, rng) for n in range(200)]
    ordered = sorted(latencies)
    result = {
        "bench": "hl7_mllp",
        "connections": args.connections,
        "seconds": round(elapsed, 2),
        "messages": len(latencies),
        "messages_per_s": round(len(latencies) / elapsed, 1),
        "ack_p50_ms": round(statistics.median(ordered) * 1000, 2),
        "ack_p99_ms": round(ordered[int(len(ordered) * 0.99) - 1] * 1000, 2),
        "resources_per_s": round(written / elapsed, 1),
        "naks": naks,
        "obx_per_message": round(sum(m.count(b"\rOBX|") for m in sample) / len(sample), 1),
        "parse_per_s": {
            "hl7apy": round(parse_rate(sample[:20], hl7apy_parser(), 3), 1),
            "hot_path": round(parse_rate(sample, parse, 3), 1),
        },
        "targets": {"messages_per_s": 500, "ack_p99_ms": 50},
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
