"""What the view tests share: a blood-pressure view (the README's example) and a clinic
whose patients have blood pressures recorded, with a second clinic beside it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import httpx

from tests.conftest import make_clinic_admin
from tests.platform_api.smart.support import Clinic, make_clinic

JSON = dict[str, Any]
LOINC = "http://loinc.org"
VITAL_SIGNS = "http://terminology.hl7.org/CodeSystem/observation-category"

BLOOD_PRESSURE: JSON = {
    "resourceType": "ViewDefinition", "name": "blood_pressure", "status": "active",
    "url": "https://clinic.example.org/fhir/ViewDefinition/blood_pressure",
    "resource": "Observation",
    "constant": [{"name": "bp", "valueCode": "85354-9"}],
    "where": [{"path": "code.coding.exists(system = 'http://loinc.org' and code = %bp)"}],
    "select": [{"column": [
        {"name": "id", "path": "getResourceKey()", "type": "id"},
        {"name": "patient", "path": "subject.getReferenceKey(Patient)", "type": "id"},
        {"name": "effective", "path": "effective.ofType(dateTime)", "type": "dateTime"}]},
        {"column": [{"name": "systolic", "type": "decimal",
                     "path": "component.where(code.coding.code = '8480-6')"
                             ".value.ofType(Quantity).value.first()",
                     "tag": [{"name": "ansi/type", "value": "DOUBLE"}]},
                    {"name": "diastolic", "type": "decimal",
                     "path": "component.where(code.coding.code = '8462-4')"
                             ".value.ofType(Quantity).value.first()",
                     "tag": [{"name": "ansi/type", "value": "DOUBLE"}]}]}],
}


def blood_pressure(patient: str, systolic: float, diastolic: float,
                   when: str = "2026-03-02T09:30:00+03:00") -> JSON:
    def component(code: str, display: str, value: float) -> JSON:
        return {"code": {"coding": [{"system": LOINC, "code": code, "display": display}]},
                "valueQuantity": {"value": value, "unit": "mmHg",
                                  "system": "http://unitsofmeasure.org", "code": "mm[Hg]"}}
    return {"resourceType": "Observation", "status": "final",
            "category": [{"coding": [{"system": VITAL_SIGNS, "code": "vital-signs"}]}],
            "code": {"coding": [{"system": LOINC, "code": "85354-9",
                                 "display": "Blood pressure panel"}]},
            "subject": {"reference": f"Patient/{patient}"}, "effectiveDateTime": when,
            "component": [component("8480-6", "Systolic blood pressure", systolic),
                          component("8462-4", "Diastolic blood pressure", diastolic)]}


@dataclass
class Clinics:
    clinic: Clinic  # Kibera: two patients with blood pressures
    pressures: dict[str, str]  # Observation id → patient id
    other: JSON  # another clinic's admin (ORG:ADMIN of Mathare), with one blood pressure
    other_pressure: str


async def make_clinics(app: Any, client: httpx.AsyncClient) -> Clinics:
    clinic = await make_clinic(app, client)
    pressures = {}
    for patient, readings in ((clinic.amina, ((128, 84), (141, 92))),
                              (clinic.baraka, ((118, 76),))):
        for systolic, diastolic in readings:
            created = await client.post("/fhir/Observation", headers=clinic.admin["headers"],
                                        json=blood_pressure(patient, systolic, diastolic))
            assert created.status_code == 201, created.text
            pressures[created.json()["id"]] = patient
    other = await make_clinic_admin(client, name="Mathare North Health Centre",
                                    first_name="Njeri", last_name="Wambui")
    patient = await client.post(f"/api/organizations/{other['org_id']}/patients",
                                headers=other["headers"],
                                json={"first_name": "Zawadi", "last_name": "Ouma",
                                      "date_of_birth": "1990-02-14", "gender": "female"})
    assert patient.status_code == 201, patient.text
    theirs = await client.post("/fhir/Observation", headers=other["headers"],
                               json=blood_pressure(patient.json()["data"]["id"], 150, 95))
    assert theirs.status_code == 201, theirs.text
    return Clinics(clinic, pressures, other, theirs.json()["id"])


def run_parameters(view: JSON | None = None, **values: Any) -> JSON:
    """A $run Parameters body: ``viewResource`` and each value as its value[x]."""
    kinds = {"_format": "valueCode", "header": "valueBoolean", "_limit": "valueInteger",
             "_since": "valueInstant", "patient": "valueReference", "group": "valueReference",
             "viewReference": "valueReference"}
    parameters: list[JSON] = []
    if view is not None:
        parameters.append({"name": "viewResource", "resource": view})
    for name, value in values.items():
        for one in value if isinstance(value, list) else [value]:
            if kinds[name] == "valueReference":
                one = {"reference": one}
            parameters.append({"name": name, kinds[name]: one})
    return {"resourceType": "Parameters", "parameter": parameters}
