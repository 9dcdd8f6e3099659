"""Fixtures of the AI tests: the Kibera clinic of ``tests/platform_api/clinic.py`` (its
staff, a registered patient, a second clinic, a stranger, a platform administrator) and
helpers that write the patient's results and vital signs through /fhir as a clinician."""

from __future__ import annotations

from typing import Any

from tests.platform_api.clinic import Clinic, clinic, refusal  # noqa: F401

JSON = dict[str, Any]
LOINC = "http://loinc.org"
LAB = {"coding": [{"system": "http://terminology.hl7.org/CodeSystem/observation-category",
                   "code": "laboratory"}]}
VITALS = {"coding": [{"system": "http://terminology.hl7.org/CodeSystem/observation-category",
                      "code": "vital-signs"}]}


def data(response: Any, status: int = 200) -> Any:
    assert response.status_code == status, response.text
    return response.json()["data"]


async def write(world: Clinic, resource: JSON, who: str = "doctor") -> JSON:
    response = await world.client.post(f"/fhir/{resource['resourceType']}", json=resource,
                                       headers=world.h(who))
    assert response.status_code == 201, response.text
    return response.json()  # type: ignore[no-any-return]


async def lab(world: Clinic, code: str, value: float, unit: str, when: str,
              display: str = "", reference: tuple[float, float] | None = None,
              patient_id: str | None = None) -> JSON:
    observation: JSON = {
        "resourceType": "Observation", "status": "final", "category": [LAB],
        "code": {"coding": [{"system": LOINC, "code": code, "display": display or code}]},
        "subject": {"reference": f"Patient/{patient_id or world.patient_id}"},
        "effectiveDateTime": when,
        "valueQuantity": {"value": value, "unit": unit, "system": "http://unitsofmeasure.org",
                          "code": unit}}
    if reference:
        observation["referenceRange"] = [{"low": {"value": reference[0], "unit": unit},
                                          "high": {"value": reference[1], "unit": unit}}]
    return await write(world, observation)


async def vital(world: Clinic, code: str, value: float, unit: str, when: str) -> JSON:
    return await write(world, {
        "resourceType": "Observation", "status": "final", "category": [VITALS],
        "code": {"coding": [{"system": LOINC, "code": code}]},
        "subject": {"reference": f"Patient/{world.patient_id}"}, "effectiveDateTime": when,
        "valueQuantity": {"value": value, "unit": unit, "system": "http://unitsofmeasure.org",
                          "code": unit}})
