"""What validation costs a write, and what ``$expand`` costs a pick list.

Runs the whole app in one process on a fresh SQLite store in a temporary directory
(policy and audit on, rate limits raised), as a clinic's administrator (an organization
member's token), with a national-style Patient profile (``tests/data/conformance``)
written through ``/fhir`` (snapshot generated on write). Measures, medians:

- ``write_base_p50_us``: the validation every create or update of a typical Patient
  and Observation gets with the base profile: the compiled R4 JSON Schema plus the
  profile check of writes (nothing to check when no profile is claimed or required);
  ``schema_only_p50_us`` the JSON Schema alone (the baseline: validation before);
- ``write_national_p50_us``: the same for a Patient claiming the national profile
  (``meta.profile``, checked in ``warn`` mode: the full StructureDefinition validation
  against the profile, invariants and terminology included);
- ``full_base_p50_us``: the full StructureDefinition validation against the base
  definitions (what ``$validate`` runs), Patient and Observation;
- ``create_p50_us``: a whole ``POST /fhir/Patient`` through the app (the named baseline
  the validation cost is a share of);
- ``expand_1000_p50_ms``: ``GET /fhir/ValueSet/$expand`` of the R4 v3 ActCode value set
  (1,116 codes, all on one page), through the app; ``expand_cold_ms`` the first call
  (the value set's members computed);
- ``agreement``: not measured here (tests/fhir_server/test_validation_agreement.py).

Prints one JSON line. Usage: ``python bench/validation.py [--iterations 2000]``
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
from asgi_lifespan import LifespanManager

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fhir_server.validation import validate_resource  # noqa: E402
from platform_api.app import create_app  # noqa: E402
from platform_api.settings import Settings  # noqa: E402

DATA = ROOT / "tests" / "data" / "conformance"
NATIONAL = "http://example.org/fhir/StructureDefinition/national-patient"
ACT_CODE = "http://terminology.hl7.org/ValueSet/v3-ActCode"
PASSWORD = "correct horse battery staple"
PATIENT = {
    "resourceType": "Patient",
    "identifier": [{"system": "http://example.org/fhir/sid/national-id", "value": "27311409"}],
    "name": [{"use": "official", "family": "Odhiambo", "given": ["Amina", "Wanjiru"]}],
    "gender": "female", "birthDate": "1988-04-12",
    "telecom": [{"system": "phone", "value": "+254712345678", "use": "mobile"}],
    "address": [{"city": "Nairobi", "country": "KE"}],
}
OBSERVATION = {
    "resourceType": "Observation", "status": "final",
    "category": [{"coding": [{"system": "http://terminology.hl7.org/CodeSystem/"
                              "observation-category", "code": "laboratory"}]}],
    "code": {"coding": [{"system": "http://loinc.org", "code": "718-7",
                         "display": "Hemoglobin [Mass/volume] in Blood"}]},
    "subject": {"reference": "Patient/amina"},
    "effectiveDateTime": "2024-03-01T08:30:00+03:00",
    "valueQuantity": {"value": 13.2, "unit": "g/dL", "system": "http://unitsofmeasure.org",
                      "code": "g/dL"},
}


def p50(samples: list[float]) -> float:
    return statistics.median(samples)


async def timed_many(call: Callable[[], Awaitable[Any]], count: int) -> list[float]:
    samples = []
    for _ in range(count):
        start = time.perf_counter()
        await call()
        samples.append(time.perf_counter() - start)
    return samples


async def clinic_admin(client: httpx.AsyncClient) -> dict[str, str]:
    email = "admin@kibera-clinic.example.org"
    assert (await client.post("/api/auth/register", json={
        "email": email, "password": PASSWORD, "first_name": "Wanjiku",
        "last_name": "Kamau"})).status_code == 201
    login = await client.post("/api/auth/login", json={"email": email, "password": PASSWORD})
    headers = {"Authorization": f"Bearer {login.json()['data']['token']}"}
    created = await client.post("/api/organizations", headers=headers,
                                json={"name": "Kibera Community Clinic", "country": "KE"})
    assert created.status_code == 201, created.text
    return {**headers, "Content-Type": "application/fhir+json"}


async def main(iterations: int) -> dict[str, Any]:
    data_dir = Path(tempfile.mkdtemp(prefix="bench-validation-"))
    logging.disable(logging.WARNING)  # warn mode logs each non-conforming write
    try:
        settings = Settings(data_dir=data_dir, access_log=False, log_level="ERROR",
                            argon2_time_cost=1, argon2_memory_kib=8192,
                            rate_limits={"read": "100000000/60", "write": "100000000/60"})
        app = create_app(settings)
        async with LifespanManager(app, startup_timeout=60):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport,
                                         base_url="http://bench") as client:
                headers = await clinic_admin(client)
                for name, kind in (("countries", "ValueSet"),
                                   ("national-patient", "StructureDefinition")):
                    body = json.loads((DATA / f"{name}.json").read_text())
                    stored = await client.put(f"/fhir/{kind}/{name}", json=body,
                                              headers=headers)
                    assert stored.status_code in (200, 201), stored.text
                fhir = app.state.services.fhir
                conformance = fhir.conformance
                await conformance.registry.refresh(force=True)
                national = {**PATIENT, "meta": {"profile": [NATIONAL]}}

                async def write_validation(resource: dict[str, Any]) -> None:
                    await fhir.validate(resource, resource["resourceType"])
                    issues = await conformance.check_write(resource)
                    assert not issues, issues

                async def schema_only(resource: dict[str, Any]) -> None:
                    validate_resource(resource, resource["resourceType"])

                async def full(resource: dict[str, Any]) -> None:
                    await conformance.validate(resource)

                results: dict[str, Any] = {}
                for name, call, resources in (
                        ("schema_only", schema_only, (PATIENT, OBSERVATION)),
                        ("write_base", write_validation, (PATIENT, OBSERVATION)),
                        ("write_national", write_validation, (national,)),
                        ("full_base", full, (PATIENT, OBSERVATION))):
                    for resource in resources:  # warm (profiles compiled, members cached)
                        await call(resource)
                    samples: list[float] = []
                    for resource in resources:
                        samples += await timed_many(
                            lambda r=resource, c=call: c(r), iterations)
                    results[f"{name}_p50_us"] = round(p50(samples) * 1e6, 1)

                async def create() -> None:
                    response = await client.post("/fhir/Patient", json=PATIENT,
                                                 headers=headers)
                    assert response.status_code == 201, response.text
                results["create_p50_us"] = round(p50(await timed_many(create, 200)) * 1e6, 1)

                async def expand() -> None:
                    response = await client.get("/fhir/ValueSet/$expand", headers=headers,
                                                params={"url": ACT_CODE, "count": "1000"})
                    assert response.status_code == 200, response.text
                    assert response.json()["expansion"]["total"] >= 1000
                cold = await timed_many(expand, 1)
                results["expand_cold_ms"] = round(cold[0] * 1e3, 2)
                results["expand_1000_p50_ms"] = round(p50(await timed_many(expand, 50)) * 1e3,
                                                      2)
                results["expand_codes"] = (await client.get(
                    "/fhir/ValueSet/$expand", headers=headers,
                    params={"url": ACT_CODE, "count": "0"})).json()["expansion"]["total"]
        return {"bench": "validation", "iterations": iterations, **results}
    finally:
        logging.disable(logging.NOTSET)
        shutil.rmtree(data_dir, ignore_errors=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--iterations", type=int, default=2000,
                        help="validations timed per resource and kind")
    arguments = parser.parse_args()
    print(json.dumps(asyncio.run(main(arguments.iterations))))
