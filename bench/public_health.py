"""What public-health reporting and syndromic surveillance cost: case reports, the
dashboard, the HMIS export, syndrome counts and EARS alerts over a clinic's month.

Runs the whole app in one process on a fresh SQLite store in a temporary directory (rate
limits off), through httpx's ASGI transport (no sockets), as the clinic's founder
(ORG:ADMIN) and a platform administrator. Loads ``--encounters`` encounters spread over
28 days (reasons from a realistic mix, a temperature each, in transaction bundles of 100)
and reports ``--cases`` notifiable cases one after the other. Measures:

- ``case_report_per_s``, ``case_report_p50_ms`` / ``_p99_ms``: ``POST
  /api/public-health/cases`` (Condition, Encounter, two Observations, the episode check);
- ``dashboard_json_ms``, ``dashboard_svg_ms``, ``dashboard_png_ms``: medians of the
  12-week dashboard as counts and as charts;
- ``hmis_export_ms``: median of a week's dataValueSets;
- ``syndromes_ms``, ``alerts_ms``: medians of the 28-day syndrome counts and of the 7-day
  EARS alerts (which read 18 days of encounters) for the clinic.

Prints one JSON line. Usage: ``python bench/public_health.py [--encounters 600]
[--cases 100] [--repeat 10]``
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import random
import shutil
import statistics
import tempfile
import time
from datetime import date, timedelta
from pathlib import Path
from typing import Any

import httpx
from asgi_lifespan import LifespanManager

from platform_api.app import create_app
from platform_api.settings import Settings

PASSWORD = "correct horse battery staple"
REASONS = ["Fever and cough", "Acute watery diarrhoea", "Routine antenatal visit",
           "Cough, no fever", "Headache", "Fever with rash", "Hypertension review",
           "Loose stools and vomiting", "Malaria test", "Child immunization"]
DISEASES = ["cholera", "malaria", "measles", "typhoid", "dengue"]


async def _login(client: httpx.AsyncClient, email: str) -> dict[str, str]:
    await client.post("/api/auth/register", json={
        "email": email, "password": PASSWORD, "first_name": "Wanjiru", "last_name": "Kamau"})
    login = await client.post("/api/auth/login", json={"email": email, "password": PASSWORD})
    return {"Authorization": f"Bearer {login.json()['data']['token']}"}


def _bundle(patient: str, days: list[date], rng: random.Random) -> dict[str, Any]:
    entries = []
    for n, day in enumerate(days):
        url = f"urn:uuid:00000000-0000-4000-8000-{n:012d}"
        entries.append({"fullUrl": url, "request": {"method": "POST", "url": "Encounter"},
                        "resource": {
                            "resourceType": "Encounter", "status": "finished",
                            "class": {"system": "http://terminology.hl7.org/CodeSystem/"
                                                "v3-ActCode", "code": "AMB"},
                            "subject": {"reference": f"Patient/{patient}"},
                            "period": {"start": f"{day.isoformat()}T10:00:00+03:00"},
                            "reasonCode": [{"text": rng.choice(REASONS)}]}})
        entries.append({"request": {"method": "POST", "url": "Observation"}, "resource": {
            "resourceType": "Observation", "status": "final",
            "code": {"coding": [{"system": "http://loinc.org", "code": "8310-5"}]},
            "subject": {"reference": f"Patient/{patient}"}, "encounter": {"reference": url},
            "valueQuantity": {"value": round(rng.uniform(36.2, 39.8), 1), "unit": "Cel",
                              "system": "http://unitsofmeasure.org", "code": "Cel"}}})
    return {"resourceType": "Bundle", "type": "transaction", "entry": entries}


async def _median_ms(client: httpx.AsyncClient, path: str, headers: dict[str, str],
                     repeat: int, **params: Any) -> float:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        response = await client.get(path, params=params, headers=headers)
        times.append((time.perf_counter() - started) * 1000)
        if response.status_code != 200:
            raise RuntimeError(f"GET {path} answered {response.status_code}: {response.text}")
    return round(statistics.median(times), 1)


async def main(encounters: int, cases: int, repeat: int) -> dict[str, Any]:
    directory = Path(tempfile.mkdtemp(prefix="bench-public-health-"))
    settings = Settings(data_dir=directory, rate_limit_enabled=False, access_log=False,
                        log_level="WARNING", transcription_workers=0)
    logging.disable(logging.WARNING)
    rng = random.Random(23)
    try:
        app = create_app(settings)
        async with LifespanManager(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://bench",
                                         timeout=120) as client:
                h = await _login(client, "founder@kliniki.example")
                await _login(client, "admin@platform.example")
                await app.state.services.auth.create_admin(
                    "admin@platform.example", PASSWORD, "Grace", "Admin")
                admin = await _login(client, "admin@platform.example")
                org = (await client.post("/api/organizations", headers=h, json={
                    "name": "Kliniki ya Bench", "country": "KE"})).json()["data"]["id"]
                organization = (await client.get(f"/fhir/Organization/{org}",
                                                 headers=h)).json()
                organization["identifier"] = [{"system": "urn:healthplatform:hmis-org-unit",
                                               "value": "KEbench0001"}]
                organization["address"] = [{"district": "Kibra"}]
                await client.put(f"/fhir/Organization/{org}", headers=h, json=organization)
                patients = [(await client.post(f"/api/organizations/{org}/patients",
                                               headers=h, json={
                    "first_name": "Amina", "last_name": f"Odhiambo{i}",
                    "date_of_birth": f"{1960 + i}-04-12", "gender": "female",
                    "mrn": f"B-{i}"})).json()["data"]["id"] for i in range(20)]
                today = date.today()
                days = [today - timedelta(days=rng.randrange(28)) for _ in range(encounters)]
                for first in range(0, encounters, 100):
                    response = await client.post("/fhir", headers=h, json=_bundle(
                        rng.choice(patients), days[first:first + 100], rng))
                    if response.status_code != 200:
                        raise RuntimeError(response.text)
                report_ms = []
                for n in range(cases):
                    body = {"patient_id": patients[n % len(patients)],
                            "disease": DISEASES[n % len(DISEASES)],
                            "onset_date": (today - timedelta(days=rng.randrange(80)))
                            .isoformat(), "classification": "suspected",
                            "observations": [
                                {"code": "8310-5", "value": 38.5, "unit": "Cel",
                                 "category": "vital-signs"},
                                {"code": "6463-4", "value": "pending"}]}
                    started = time.perf_counter()
                    response = await client.post("/api/public-health/cases", headers=h,
                                                 json=body)
                    report_ms.append((time.perf_counter() - started) * 1000)
                    if response.status_code not in (200, 201):
                        raise RuntimeError(response.text)
                week = (today - timedelta(days=7)).isocalendar()
                result = {
                    "encounters": encounters, "cases": cases,
                    "case_report_per_s": round(cases / (sum(report_ms) / 1000), 1),
                    "case_report_p50_ms": round(statistics.median(report_ms), 1),
                    "case_report_p99_ms": round(statistics.quantiles(report_ms, n=100)[98], 1),
                    "dashboard_json_ms": await _median_ms(
                        client, "/api/public-health/dashboard", admin, repeat),
                    "dashboard_svg_ms": await _median_ms(
                        client, "/api/public-health/dashboard", admin, repeat, format="svg"),
                    "dashboard_png_ms": await _median_ms(
                        client, "/api/public-health/dashboard", admin, repeat, format="png"),
                    "hmis_export_ms": await _median_ms(
                        client, "/api/public-health/hmis-export", h, repeat,
                        period=f"{week[0]}W{week[1]}"),
                    "syndromes_ms": await _median_ms(
                        client, "/api/surveillance/syndromes", h, repeat),
                    "alerts_ms": await _median_ms(
                        client, "/api/surveillance/alerts", h, repeat),
                }
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    return result


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--encounters", type=int, default=600)
    parser.add_argument("--cases", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=10)
    arguments = parser.parse_args()
    print(json.dumps(asyncio.run(main(arguments.encounters, arguments.cases,
                                      arguments.repeat))))
