"""FHIR read, create and search with the clinical audit trail on and off, in one run.

Starts two servers as ``make run`` does (one process each, embedded SQLite store in a
fresh data directory): one with the audit trail on (the default), one with it off
(``HEALTHPLATFORM_CLINICAL_AUDIT=false``). Both get the same data, then ``wrk`` drives
them from a separate process over loopback (32 connections by default), each phase on
one server then the other, and again in the other order (the better of the two runs of
each is kept): a machine that drifts moves both sides alike, so the ratios hold even
where the absolute figures do not.

The phases, each with two callers:

- ``read``: ``GET /fhir/Patient/{id}`` of the clinic's patients;
- ``create_patient``: ``POST /fhir/Patient``;
- ``create_observation``: ``POST /fhir/Observation`` about one of the patients;
- ``search``: ``GET /fhir/Observation?subject=Patient/{id}`` (a patient's few results).

The callers: ``doctor``, an ``ORG:DOCTOR`` of a clinic (invited by its ``ORG:ADMIN``
through the real invitation e-mail, caught by a local SMTP stand-in): the policy path
every clinic member takes (owners settled and checked on writes, grants checked on reads
and compiled into searches); and ``admin``, a platform administrator, whom the policy
does not restrict. ``trivial`` (``/healthz``) is the HTTP stack's ceiling.

After every run the benchmark waits until the server is idle again (``background_s``:
the patient index's comparisons of the Patients a create phase wrote, the audit
trail's appends), so no phase pays for the one before.

Prints one JSON line: each phase's calls/s and p50/p99 on both servers (the best of
the rounds), the server's CPU per request (phase and the background work it left, the
least of the rounds), the ratios audit-on / audit-off of calls/s (``ratio``) and of
requests per CPU second (``cpu_ratio``: what a busy machine moves least), the aims of
issue 36 (reads >= 0.85, creates >= 0.80, read p99 < 25 ms with the audit on), and the
load average of the machine before and after (it is shared: other processes' load moves
the absolute figures).

With ``--profile DIR`` py-spy samples each server during each phase and writes the
collapsed stacks (``DIR/<phase>-<caller>-<on|off>.txt``): where the time goes.

Usage: ``python bench/fhir_crud.py [--seconds 4] [--connections 32] [--only read ...]``
Needs ``wrk`` (Debian package ``wrk``); ``--profile`` needs ``py-spy`` (pip).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from email import message_from_bytes
from email.policy import default as default_policy
from pathlib import Path
from typing import Any

import httpx
from aiosmtpd.controller import Controller

ROOT = Path(__file__).resolve().parents[1]
PATIENT = {
    "resourceType": "Patient",
    "identifier": [{"system": "urn:oid:2.16.404.1.1", "value": "KE-29384756"}],
    "name": [{"use": "official", "family": "Odhiambo", "given": ["Amina", "Wanjiru"]}],
    "gender": "female", "birthDate": "1988-04-12",
    "telecom": [{"system": "phone", "value": "+254712345678", "use": "mobile"}],
    "address": [{"city": "Nairobi", "country": "KE"}],
}
HEART_RATE = {
    "resourceType": "Observation", "status": "final",
    "category": [{"coding": [{"system": "http://terminology.hl7.org/CodeSystem/"
                              "observation-category", "code": "vital-signs"}]}],
    "code": {"coding": [{"system": "http://loinc.org", "code": "8867-4",
                         "display": "Heart rate"}]},
    "effectiveDateTime": "2026-11-20T10:15:00+03:00",
    "valueQuantity": {"value": 88, "unit": "beats/minute",
                      "system": "http://unitsofmeasure.org", "code": "/min"},
}
# Patients differ as a clinic's do (names, birth dates, national ids drawn at random):
# identical ones would all be candidates of the patient index's matching of each create.
GIVEN = ("Amina", "Wanjiru", "Kwame", "Achieng", "Baraka", "Chebet", "Otieno", "Njeri",
         "Kamau", "Akinyi", "Mwangi", "Nafula", "Kiprono", "Zawadi", "Juma", "Halima")
FAMILY = ("Odhiambo", "Mensah", "Kamau", "Ouma", "Wekesa", "Mutua", "Kariuki", "Njoroge",
          "Omondi", "Kiplagat", "Chege", "Wambui", "Korir", "Nyambura", "Atieno", "Were")
PATIENTS = 300  # seeded on each server, as the clinic's doctor
OBSERVATIONS_EACH = 3  # per patient: what a search finds
PHASES = ("read", "create_patient", "create_observation", "search")
CALLERS = ("doctor", "admin")
AIMS = {"read": 0.85, "create_patient": 0.80, "create_observation": 0.80}
READ_P99_AIM_MS = 25.0
PASSWORD = "correct horse battery staple"
WEB_APP = "https://app.bench.example"

REPORT = """
done = function(summary, latency, requests)
  io.write(string.format('{"requests": %d, "duration_us": %d, "errors": %d, '
    .. '"non2xx": %d, "p50_us": %d, "p99_us": %d}\\n',
    summary.requests, summary.duration,
    summary.errors.connect + summary.errors.read + summary.errors.write
      + summary.errors.timeout, summary.errors.status,
    latency:percentile(50), latency:percentile(99)))
end
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def lua_string(text: str) -> str:
    return "[==[" + text + "]==]"


def script(phase: str, token: str, ids: list[str]) -> str:
    headers = (f'wrk.headers["Authorization"] = "Bearer {token}"\n'
               'wrk.headers["Content-Type"] = "application/fhir+json"\n')
    ids_lua = "ids = {" + ",".join(f'"{i}"' for i in ids) + "}\n"
    if phase == "create_patient":
        return headers + lua_patient() + (
            "request = function()\n"
            '  return wrk.format("POST", "/fhir/Patient", nil, patient())\nend\n') + REPORT
    if phase == "create_observation":
        head = json.dumps(HEART_RATE)[:-1] + ', "subject": {"reference": "Patient/'
        return headers + ids_lua + (
            "request = function()\n"
            f"  local body = {lua_string(head)} .. ids[math.random(#ids)] .. '\"}}}}'\n"
            '  return wrk.format("POST", "/fhir/Observation", nil, body)\nend\n') + REPORT
    if phase == "read":
        return headers + ids_lua + (
            "request = function()\n"
            '  return wrk.format("GET", "/fhir/Patient/" .. ids[math.random(#ids)])\nend\n'
        ) + REPORT
    if phase == "search":
        return headers + ids_lua + (
            "request = function()\n  return wrk.format(\"GET\", "
            '"/fhir/Observation?subject=Patient/" .. ids[math.random(#ids)])\nend\n') + REPORT
    return REPORT  # trivial


def lua_patient() -> str:
    """``patient()``: a Patient's JSON with a name, birth date and id drawn at random."""
    names = ("given = {" + ",".join(f'"{g}"' for g in GIVEN) + "}\n"
             "family = {" + ",".join(f'"{f}"' for f in FAMILY) + "}\n")
    return names + (
        "function pick(list) return list[math.random(#list)] end\n"
        "function patient()\n"
        "  return '{\"resourceType\": \"Patient\", \"identifier\": [{\"system\": "
        "\"urn:oid:2.16.404.1.1\", \"value\": \"KE-' .. math.random(10000000, 99999999) .. "
        "'\"}], \"name\": [{\"use\": \"official\", \"family\": \"' .. pick(family) .. "
        "'\", \"given\": [\"' .. pick(given) .. '\", \"' .. pick(given) .. '\"]}], "
        "\"gender\": \"female\", \"birthDate\": \"' .. math.random(1940, 2020) .. "
        "string.format('-%02d-%02d', math.random(1, 12), math.random(1, 28)) .. '\", "
        "\"telecom\": [{\"system\": \"phone\", \"value\": \"+2547' .. "
        "math.random(10000000, 99999999) .. '\", \"use\": \"mobile\"}], "
        "\"address\": [{\"city\": \"Nairobi\", \"country\": \"KE\"}]}'\nend\n")


def random_patient(draw: random.Random) -> dict[str, Any]:
    return {**PATIENT,
            "identifier": [{"system": "urn:oid:2.16.404.1.1",
                            "value": f"KE-{draw.randrange(10**7, 10**8)}"}],
            "name": [{"use": "official", "family": draw.choice(FAMILY),
                      "given": [draw.choice(GIVEN), draw.choice(GIVEN)]}],
            "birthDate": f"{draw.randrange(1940, 2021)}-{draw.randrange(1, 13):02d}-"
                         f"{draw.randrange(1, 29):02d}",
            "telecom": [{"system": "phone", "value": f"+2547{draw.randrange(10**7, 10**8)}",
                         "use": "mobile"}]}


def run_wrk(base: str, lua: str, path: str, seconds: int, connections: int) -> dict[str, Any]:
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as f:
        f.write(lua)
    try:
        out = subprocess.run(
            ["wrk", "-t1", f"-c{connections}", f"-d{seconds}s", "--timeout", "5s",
             "-s", f.name, base + path],
            check=True, capture_output=True, text=True,
        ).stdout
    finally:
        os.unlink(f.name)
    result = json.loads(out.strip().splitlines()[-1])
    seconds_taken = result["duration_us"] / 1e6
    return {"requests": result["requests"],
            "per_s": round(result["requests"] / seconds_taken, 1),
            "p50_ms": round(result["p50_us"] / 1000, 2),
            "p99_ms": round(result["p99_us"] / 1000, 2),
            "errors": result["errors"] + result["non2xx"]}


class Inbox:
    """The invitation e-mails the servers send (an aiosmtpd handler)."""

    def __init__(self) -> None:
        self.bodies: list[str] = []

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        message = message_from_bytes(envelope.content, policy=default_policy)
        self.bodies.append(message.get_body(("plain",)).get_content())  # type: ignore[union-attr]
        return "250 Message accepted for delivery"


class Server:
    """One ``healthplatform serve`` process with its data directory and its clinic."""

    def __init__(self, name: str, audit: bool, smtp_port: int, store: str):
        self.name, self.audit = name, audit
        self.port = free_port()
        self.data_dir = tempfile.mkdtemp(prefix=f"bench-crud-{name}-")
        # One token drives the whole load, far above the per-client budgets a deployment
        # would give one user; raised so the limiter still runs (its cost is measured).
        self.env = {**os.environ, "HEALTHPLATFORM_DATA_DIR": self.data_dir,
                    "HEALTHPLATFORM_HTTP_PORT": str(self.port),
                    "HEALTHPLATFORM_MLLP_ENABLED": "false",
                    "HEALTHPLATFORM_CLINICAL_AUDIT": "true" if audit else "false",
                    "HEALTHPLATFORM_SMTP_HOST": "127.0.0.1",
                    "HEALTHPLATFORM_SMTP_PORT": str(smtp_port),
                    "HEALTHPLATFORM_SMTP_TLS": "none",
                    "HEALTHPLATFORM_WEB_APP_URL": WEB_APP,
                    "HEALTHPLATFORM_RATE_LIMITS": json.dumps({
                        "read": "100000000/60", "write": "100000000/60",
                        "public": "100000000/60"})}
        if store.startswith("mongodb"):  # a database each, emptied first and dropped after
            base, _, options = store.partition("?")
            head, _, database = base.rpartition("/")
            store = f"{head}/{database or 'healthplatform_bench'}_{name}" + (
                f"?{options}" if options else "")
            drop_mongodb(store)
        if store:
            self.env["HEALTHPLATFORM_STORE"] = store
        self.store = store
        self.base = f"http://127.0.0.1:{self.port}"
        self.process: subprocess.Popen[bytes] | None = None
        self.tokens: dict[str, str] = {}
        self.patients: list[str] = []

    def command(self, *args: str) -> list[str]:
        # -m from the checkout: this tree's code, whatever is installed
        return [sys.executable, "-m", "platform_api.cli", *args]

    def start(self) -> None:
        subprocess.run(self.command("create-admin", "--email", f"admin@{self.name}.example"),
                       check=True, cwd=ROOT, stdout=subprocess.DEVNULL,
                       env={**self.env, "HEALTHPLATFORM_ADMIN_PASSWORD": PASSWORD})
        self.process = subprocess.Popen(self.command("serve"), env=self.env, cwd=ROOT,
                                        stdout=subprocess.DEVNULL,
                                        stderr=open(Path(self.data_dir) / "server.log", "wb"))

    def wait_ready(self, client: httpx.Client) -> None:
        deadline = time.monotonic() + 180  # a cold start compiles every module
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                log = (Path(self.data_dir) / "server.log").read_text()[-2000:]
                sys.exit(f"server {self.name} exited: {log}")
            try:
                if client.get(self.base + "/healthz").status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        sys.exit(f"server {self.name} did not start")

    def seed(self, client: httpx.Client, inbox: Inbox) -> None:
        def post(path: str, body: Any, token: str | None = None, status: int = 201) -> Any:
            headers = {"Authorization": f"Bearer {token}"} if token else {}
            response = client.post(self.base + path, json=body, headers=headers)
            if response.status_code != status:
                sys.exit(f"{self.name}: POST {path} answered {response.status_code}: "
                         f"{response.text[:300]}")
            return response.json()

        def login(email: str) -> str:
            answer = post("/api/auth/login", {"email": email, "password": PASSWORD},
                          status=200)
            return str(answer["data"]["token"])

        founder = f"founder@{self.name}.example"
        doctor = f"doctor@{self.name}.example"
        for email, first in ((founder, "Wanjiku"), (doctor, "Wanjiru")):
            post("/api/auth/register", {"email": email, "password": PASSWORD,
                                        "first_name": first, "last_name": "Kamau"})
        founder_token = login(founder)
        org = post("/api/organizations", {"name": "Kibera Community Clinic",
                                          "country": "KE"}, founder_token)["data"]["id"]
        post(f"/api/organizations/{org}/invitations",
             {"email": doctor, "role": "ORG:DOCTOR"}, founder_token)
        link = re.compile(rf"{re.escape(WEB_APP)}/invitations/accept\?token=(\S+)")
        found = next((m for b in reversed(inbox.bodies) if (m := link.search(b))), None)
        if found is None:
            sys.exit(f"{self.name}: no invitation link in the e-mail")
        self.tokens["doctor"] = login(doctor)
        post("/api/organizations/invitations/accept", {"token": found.group(1)},
             self.tokens["doctor"], status=200)
        self.tokens["doctor"] = login(doctor)  # the membership in a fresh token
        self.tokens["admin"] = login(f"admin@{self.name}.example")
        headers = {"Authorization": f"Bearer {self.tokens['doctor']}",
                   "Content-Type": "application/fhir+json"}
        draw = random.Random(self.name)
        patients = [random_patient(draw) for _ in range(PATIENTS)]

        def one_patient(patient: dict[str, Any]) -> str:
            made = client.post(self.base + "/fhir/Patient", json=patient, headers=headers)
            made.raise_for_status()
            patient_id = str(made.json()["id"])
            for _ in range(OBSERVATIONS_EACH):
                client.post(self.base + "/fhir/Observation", headers=headers, json={
                    **HEART_RATE, "subject": {"reference": f"Patient/{patient_id}"}
                }).raise_for_status()
            return patient_id

        with ThreadPoolExecutor(8) as pool:  # as a clinic's clients would, side by side
            self.patients = list(pool.map(one_patient, patients))

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            self.process.wait(30)
        shutil.rmtree(self.data_dir, ignore_errors=True)
        if self.store.startswith("mongodb"):
            drop_mongodb(self.store)


PATHS = {"read": "/fhir/Patient", "create_patient": "/fhir/Patient",
         "create_observation": "/fhir/Observation", "search": "/fhir/Observation",
         "trivial": "/healthz"}


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def settle(server: Server, limit: float = 300.0) -> float:
    """Wait until the server is idle (under 10% of a core for a second): the background
    work a phase left (the patient index's comparisons of new Patients, the audit trail's
    writes) must not run into the next phase. How long that took."""
    assert server.process is not None
    started = time.monotonic()
    quiet = 0
    while time.monotonic() - started < limit:
        before = cpu_seconds(server.process.pid)
        time.sleep(0.5)
        quiet = quiet + 1 if cpu_seconds(server.process.pid) - before < 0.05 else 0
        if quiet >= 2:
            break
    return round(time.monotonic() - started, 1)


def py_spy() -> str:
    beside = Path(sys.executable).parent / "py-spy"  # pip-installed in this environment
    return str(beside) if beside.exists() else (shutil.which("py-spy") or "py-spy")


def measure(server: Server, phase: str, caller: str, args: argparse.Namespace
            ) -> dict[str, Any]:
    lua = script(phase, server.tokens.get(caller, ""), server.patients)
    profiler = None
    if args.profile and server.process is not None:
        out = Path(args.profile) / f"{phase}-{caller}-{server.name}.txt"
        profiler = subprocess.Popen(
            [py_spy(), "record", "--pid", str(server.process.pid), "--format", "raw",
             "--rate", "200", "--duration", str(args.seconds), "--output", str(out),
             "--nonblocking"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    assert server.process is not None
    cpu_before = cpu_seconds(server.process.pid)
    try:
        result = run_wrk(server.base, lua, PATHS[phase], args.seconds, args.connections)
    finally:
        if profiler is not None:
            profiler.wait(30)
    result["background_s"] = settle(server)
    # the server's CPU for the phase and the background work it left, per request: what
    # other processes on the machine move least
    used = cpu_seconds(server.process.pid) - cpu_before
    result["cpu_us_per_request"] = round(used / max(result["requests"], 1) * 1e6)
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=int, default=4, help="of each wrk run")
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3,
                        help="runs of each phase on each server, alternating their order")
    parser.add_argument("--only", action="append", choices=PHASES,
                        help="run only this phase (repeatable)")
    parser.add_argument("--callers", action="append", choices=CALLERS,
                        help="run only this caller's phases (repeatable)")
    parser.add_argument("--store", default="", help="mongodb://host/db?replicaSet=rs0: both "
                        "servers on MongoDB, in databases db_on and db_off (emptied first, "
                        "dropped after); default: SQLite in fresh data directories")
    parser.add_argument("--profile", default="", metavar="DIR",
                        help="write py-spy collapsed stacks of each phase here")
    args = parser.parse_args()
    if shutil.which("wrk") is None:
        sys.exit("wrk is not installed: apt-get install wrk")
    if args.profile:
        Path(args.profile).mkdir(parents=True, exist_ok=True)
    inbox, smtp_port = Inbox(), free_port()
    smtp = Controller(inbox, hostname="127.0.0.1", port=smtp_port)
    smtp.start()
    servers = [Server("on", True, smtp_port, args.store),
               Server("off", False, smtp_port, args.store)]
    load_before = os.getloadavg()
    try:
        for server in servers:
            server.start()
        with httpx.Client(timeout=30) as client:
            for server in servers:
                server.wait_ready(client)
                server.seed(client, inbox)
        for server in servers:  # warm up, then let the seeding's background work end
            run_wrk(server.base, script("trivial", "", []), "/healthz", 2, args.connections)
            settle(server)
        runs: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
        plan = [(p, c) for p in PHASES for c in CALLERS
                if (not args.only or p in args.only)
                and (not args.callers or c in args.callers)]
        order = list(servers)
        for _round in range(args.rounds):
            for phase, caller in plan:
                for server in order:
                    runs.setdefault((phase, caller, server.name), []).append(
                        measure(server, phase, caller, args))
            order.reverse()
            random.shuffle(plan)  # no phase always follows the same one
        trivial = run_wrk(servers[0].base, script("trivial", "", []), "/healthz",
                          args.seconds, args.connections)
        print(json.dumps(report(runs, args, trivial, load_before)))
    finally:
        for server in servers:
            server.stop()
        smtp.stop()


def report(runs: dict[tuple[str, str, str], list[dict[str, Any]]], args: argparse.Namespace,
           trivial: dict[str, Any], load_before: tuple[float, float, float]) -> dict[str, Any]:
    results: dict[str, Any] = {}
    aims: dict[str, Any] = {}
    for (phase, caller, name), measured in sorted(runs.items()):
        best = max(measured, key=lambda r: r["per_s"])
        best = {**best, "cpu_us_per_request": min(r["cpu_us_per_request"] for r in measured)}
        entry = results.setdefault(caller, {}).setdefault(phase, {})
        entry[name] = best
        if "on" in entry and "off" in entry:
            ratio = round(entry["on"]["per_s"] / entry["off"]["per_s"], 3)
            entry["ratio"] = ratio
            entry["cpu_ratio"] = round(entry["off"]["cpu_us_per_request"]
                                       / max(entry["on"]["cpu_us_per_request"], 1), 3)
            if phase in AIMS:
                aims[f"{caller}_{phase}_ratio"] = {"ratio": ratio, "aim": AIMS[phase],
                                                   "met": ratio >= AIMS[phase]}
            if phase == "read":
                aims[f"{caller}_read_p99_ms"] = {
                    "p99_ms": entry["on"]["p99_ms"], "aim": READ_P99_AIM_MS,
                    "met": entry["on"]["p99_ms"] < READ_P99_AIM_MS}
    return {"bench": "fhir_crud", "store": args.store.partition(":")[0] or "sqlite",
            "connections": args.connections, "seconds_each": args.seconds,
            "rounds": args.rounds, "trivial": trivial, "results": results, "aims": aims,
            "load_average_before": [round(x, 2) for x in load_before],
            "load_average_after": [round(x, 2) for x in os.getloadavg()]}


def drop_mongodb(url: str) -> None:
    from pymongo import MongoClient

    with MongoClient(url, serverSelectionTimeoutMS=5000) as client:
        client.drop_database(client.get_default_database().name)


if __name__ == "__main__":
    main()
