"""Search parameters over HTTP, one table per parameter type (R4 3.1.1.4), on the clinical
record set of ``clinical_data.py``: each row is a search and the records it must find.

``{amina}`` in a value is replaced by that record's server id.
"""

from __future__ import annotations

import pytest

from tests.fhir_server.clinical_data import LOINC, MRN, SNOMED, UCUM, V2_0203

pytestmark = pytest.mark.asyncio(loop_scope="module")

PATIENTS = {"amina", "kwame", "zoe", "chinedu", "fatima"}
AMINA_OBS = {"hr-amina", "temp-amina", "weight-amina", "hba1c-amina", "glucose-amina"}
HEART_RATES = {"hr-amina", "hr-kwame", "hr-zoe"}


async def check(clinical, path: str, params: list[tuple[str, str]], expected: set[str]):
    values = [(k, v.format(**clinical.ids)) for k, v in params]
    assert await clinical.names(path, values) == expected, (path, params)


STRING = [
    ("Patient", [("family", "odh")], {"amina"}),
    ("Patient", [("family", "ODHIAMBO")], {"amina"}),
    ("Patient", [("family", "muller")], {"zoe"}),  # accent-insensitive
    ("Patient", [("given", "ZOË")], {"zoe"}),
    ("Patient", [("name", "wanjiru")], {"amina"}),
    ("Patient", [("family:exact", "Müller")], {"zoe"}),
    ("Patient", [("family:exact", "muller")], set()),
    ("Patient", [("family:contains", "ass")], {"fatima"}),
    ("Patient", [("address-city", "mombasa")], {"fatima"}),
    ("Patient", [("address", "00100")], {"amina"}),
    ("Patient", [("family", "odh,mens")], {"amina", "kwame"}),  # OR
    ("Patient", [("given", "amina"), ("family", "hassan")], set()),  # AND
    ("Patient", [("given", "amina"), ("family", "odhiambo")], {"amina"}),
    ("Practitioner", [("name", "kam")], {"dr-kamau"}),
    ("Organization", [("name", "moi teaching\\, referral")], {"mtrh"}),  # escaped comma
    ("Organization", [("name", "kenyatta,aga")], {"knh", "akuh"}),
]

TOKEN = [
    ("Patient", [("gender", "female")], {"amina", "zoe", "fatima"}),
    ("Patient", [("gender:not", "female")], {"kwame", "chinedu"}),
    ("Patient", [("identifier", f"{MRN}|KE-29384756")], {"amina"}),
    ("Patient", [("identifier", "KE-29384756")], {"amina"}),
    ("Patient", [("identifier", f"{MRN}|")], PATIENTS),
    ("Patient", [("identifier", "|KE-29384756")], set()),  # has a system
    ("Patient", [("identifier:of-type", f"{V2_0203}|MR|GH-55102")], {"kwame"}),
    ("Organization", [("identifier", "urn:oid:2.16.404.9|MTRH\\|ELD")], {"mtrh"}),
    ("Observation", [("code", f"{LOINC}|8867-4")], HEART_RATES),
    ("Observation", [("code", "8867-4,8310-5")], HEART_RATES | {"temp-amina"}),
    ("Observation", [("code:text", "heart")], HEART_RATES),
    ("Observation", [("category", "laboratory")], {"hba1c-amina", "glucose-amina"}),
    ("Observation", [("status", "preliminary")], {"note-fatima"}),
    ("Observation", [("value-concept", f"{SNOMED}|266919005")], {"smoking-fatima"}),
    ("Patient", [("telecom", "+254712345678")], {"amina"}),
    ("Patient", [("email", "amina@example.org")], {"amina"}),
    ("Patient", [("deceased", "true")], {"kwame"}),
    ("Patient", [("deceased", "false")], PATIENTS - {"kwame"}),
    ("Condition", [("code", f"{SNOMED}|38341003")], {"htn-kwame"}),
    ("Patient", [("_id", "{amina},{zoe}")], {"amina", "zoe"}),
    ("Patient", [("_id:not", "{amina}")], PATIENTS - {"amina"}),
]

REFERENCE = [
    ("Observation", [("subject", "Patient/{amina}")], AMINA_OBS),
    ("Observation", [("subject", "{amina}")], AMINA_OBS),
    ("Observation", [("subject:Patient", "{amina}")], AMINA_OBS),
    ("Observation", [("patient", "http://testserver/fhir/Patient/{amina}")], AMINA_OBS),
    ("Observation", [("subject", "Patient/{kwame},Patient/{zoe}")],
     {"hr-kwame", "weight-kwame", "hr-zoe"}),
    ("Observation", [("encounter", "Encounter/{enc-amina}")], {"hr-amina", "temp-amina"}),
    ("Observation", [("performer", "Practitioner/{dr-kamau}")], {"hr-amina"}),
    ("DiagnosticReport", [("result", "Observation/{hba1c-amina}")], {"report-amina"}),
    ("Provenance", [("target", "Patient/{amina}")], {"provenance-amina"}),
    ("Organization", [("partof", "Organization/{knh}")], {"akuh"}),
    # chains, several levels, with and without the type
    ("Condition", [("subject:Patient.gender", "male")], {"htn-kwame"}),
    ("Observation", [("patient.identifier", "KE-29384756")], AMINA_OBS),
    ("Observation", [("subject:Patient.organization.name", "aga khan")],
     {"smoking-fatima", "note-fatima"}),
    ("Patient", [("general-practitioner:Practitioner.name", "kamau")], {"amina"}),
    ("Observation", [("subject:Patient.name", "mensah"), ("code", "8867-4")], {"hr-kwame"}),
    # reverse chains
    ("Patient", [("_has:Observation:patient:code", "4548-4")], {"amina"}),
    ("Patient", [("_has:Condition:subject:code", f"{SNOMED}|38341003")], {"kwame"}),
    ("Patient", [("_has:Observation:subject:_has:DiagnosticReport:result:status", "final")],
     {"amina"}),
    ("Practitioner", [("_has:MedicationRequest:requester:status", "active")], {"dr-kamau"}),
]

DATE = [
    ("Patient", [("birthdate", "1988-04-12")], {"amina"}),
    ("Patient", [("birthdate", "1988")], {"amina"}),
    ("Patient", [("birthdate", "eq1988-04")], {"amina"}),
    ("Patient", [("birthdate", "ne1988-04-12")], PATIENTS - {"amina"}),
    ("Patient", [("birthdate", "lt1970")], {"chinedu"}),
    ("Patient", [("birthdate", "gt1995-07-01")], {"zoe"}),
    ("Patient", [("birthdate", "ge1995-07-01")], {"zoe", "fatima"}),
    ("Patient", [("birthdate", "le1975-09-30")], {"kwame", "chinedu"}),
    ("Patient", [("birthdate", "sa1990")], {"zoe", "fatima"}),
    ("Patient", [("birthdate", "eb1980")], {"kwame", "chinedu"}),
    ("Patient", [("birthdate", "ge1980"), ("birthdate", "lt1996")], {"amina", "fatima"}),
    ("Patient", [("birthdate", "1962-11-20")], set()),  # stored to the month only
    ("Patient", [("birthdate", "ap1962-11-20")], {"chinedu"}),
    ("Patient", [("death-date", "2024-01-15")], {"kwame"}),
    ("Observation", [("date", "2024-03-01")], {"hr-amina", "temp-amina", "weight-amina"}),
    ("Observation", [("date", "2024-03-01T06:15:00Z")], {"hr-amina"}),  # 09:15+03:00
    ("Observation", [("date", "ge2024-04")], {"bp-chinedu", "hr-zoe"}),  # Period, dateTime
    ("Observation", [("date", "2024-04-02T08:05:00Z")], set()),  # the period is longer
    ("Condition", [("onset-date", "lt2016")], {"htn-kwame"}),
    ("Condition", [("onset-date", "ge2024-02-01")], {"dm-amina"}),  # onsetPeriod
    ("Encounter", [("date", "2024-03-01")], {"enc-amina"}),
    ("MedicationRequest", [("authoredon", "2023-11-06")], {"metformin-amina"}),
]

NUMBER_QUANTITY = [
    ("RiskAssessment", [("probability", "0.32")], {"risk-kwame"}),
    ("RiskAssessment", [("probability", "0.3")], {"risk-kwame"}),  # [0.25, 0.35)
    ("RiskAssessment", [("probability", "0.30")], set()),  # [0.295, 0.305)
    ("RiskAssessment", [("probability", "gt0.3")], {"risk-kwame"}),
    ("RiskAssessment", [("probability", "lt0.3")], set()),
    ("Observation", [("value-quantity", "72")], {"hr-amina"}),
    ("Observation", [("value-quantity", "gt100")],
     {"hr-kwame", "weight-kwame", "glucose-amina"}),
    ("Observation", [("value-quantity", f"70.5|{UCUM}|kg")], {"weight-kwame"}),  # 70500 g
    ("Observation", [("value-quantity", f"ge68|{UCUM}|kg")], {"weight-amina", "weight-kwame"}),
    ("Observation", [("value-quantity", "126||mg/dL")], {"glucose-amina"}),
    ("Observation", [("value-quantity", f"1.26|{UCUM}|g/L")], {"glucose-amina"}),
    ("Observation", [("value-quantity", f"le37.5|{UCUM}|Cel")], {"temp-amina"}),
    ("Observation", [("value-quantity", "ap70")], {"hr-amina", "weight-amina", "hr-zoe"}),
    ("Observation", [("component-value-quantity", "gt150")], {"bp-chinedu"}),
]

COMPOSITE = [
    ("Observation", [("code-value-quantity", f"{LOINC}|8867-4$gt100")], {"hr-kwame"}),
    ("Observation", [("code-value-quantity", "8867-4$lt70|" + UCUM + "|/min")], {"hr-zoe"}),
    ("Observation", [("component-code-value-quantity", f"{LOINC}|8480-6$gt140")],
     {"bp-chinedu"}),
    ("Observation", [("component-code-value-quantity", f"{LOINC}|8462-4$gt100")], set()),
    ("Observation", [("combo-code-value-quantity", "8462-4$95")], {"bp-chinedu"}),
    ("Observation", [("code-value-concept", f"{LOINC}|72166-2${SNOMED}|266919005")],
     {"smoking-fatima"}),
    ("Observation", [("code-value-date", "8867-4$2024")], set()),
]

URI = [
    ("Questionnaire", [("url", "http://example.org/fhir/Questionnaire/phq-9")], {"phq9"}),
    ("ValueSet", [("url:below", "http://example.org/fhir/ValueSet")], {"vs-vitals"}),
    ("ValueSet", [("url:above", "http://example.org/fhir/ValueSet/vital-signs/adult/v2")],
     {"vs-vitals"}),
    ("ValueSet", [("url", "http://example.org/fhir/ValueSet")], set()),
    ("Patient", [("_profile", "http://hl7.org/fhir/us/core/StructureDefinition/us-core-patient")],
     {"fatima"}),
    ("Patient", [("_source", "http://lis.akuh.example.org/fhir")], {"fatima"}),
]

MISSING_AND_SPECIAL = [
    ("Patient", [("death-date:missing", "false")], {"kwame"}),
    ("Patient", [("death-date:missing", "true")], PATIENTS - {"kwame"}),
    ("Observation", [("value-quantity:missing", "true")],
     {"smoking-fatima", "note-fatima", "bp-chinedu"}),
    ("Observation", [("encounter:missing", "false")], {"hr-amina", "temp-amina"}),
    ("Patient", [("family:missing", "false"), ("gender", "male")], {"kwame", "chinedu"}),
    ("Patient", [("_tag", "http://example.org/fhir/tags|research-cohort")], {"fatima"}),
    ("Patient", [("_security", "R")], {"fatima"}),
    ("Patient", [("_text", "gestational")], {"amina"}),
    ("Patient", [("_content", "mombasa")], {"fatima"}),
    ("Observation", [("_content", "tobacco never")], {"smoking-fatima"}),
    ("Patient", [("_text", "mombasa")], set()),  # not in any narrative
]


@pytest.mark.parametrize(("path", "params", "expected"), STRING)
async def test_string(clinical, path, params, expected):
    await check(clinical, path, params, expected)


@pytest.mark.parametrize(("path", "params", "expected"), TOKEN)
async def test_token(clinical, path, params, expected):
    await check(clinical, path, params, expected)


@pytest.mark.parametrize(("path", "params", "expected"), REFERENCE)
async def test_reference_chain_and_has(clinical, path, params, expected):
    await check(clinical, path, params, expected)


@pytest.mark.parametrize(("path", "params", "expected"), DATE)
async def test_date(clinical, path, params, expected):
    await check(clinical, path, params, expected)


@pytest.mark.parametrize(("path", "params", "expected"), NUMBER_QUANTITY)
async def test_number_and_quantity(clinical, path, params, expected):
    await check(clinical, path, params, expected)


@pytest.mark.parametrize(("path", "params", "expected"), COMPOSITE)
async def test_composite(clinical, path, params, expected):
    await check(clinical, path, params, expected)


@pytest.mark.parametrize(("path", "params", "expected"), URI)
async def test_uri(clinical, path, params, expected):
    await check(clinical, path, params, expected)


@pytest.mark.parametrize(("path", "params", "expected"), MISSING_AND_SPECIAL)
async def test_missing_tags_and_full_text(clinical, path, params, expected):
    await check(clinical, path, params, expected)


async def test_date_approximately_widens_by_a_tenth_of_the_distance_to_now(clinical):
    # R4: ap matches within 10% of the time between the value and now; the data is a
    # couple of years old, so a point inside the blood-pressure period's day matches it
    # and a date a decade earlier matches nothing.
    near = await clinical.names("Observation", [("date", "ap2024-04-02T08:05:00Z")])
    assert "bp-chinedu" in near
    assert await clinical.names("Observation", [("date", "ap2014-04-02")]) == set()


async def test_last_updated_prefixes(clinical):
    bundle = await clinical.search("Patient", {"_id": clinical.ids["amina"]})
    stamp = bundle["entry"][0]["resource"]["meta"]["lastUpdated"]
    assert "amina" in await clinical.names("Patient", [("_lastUpdated", f"le{stamp}")])
    assert "amina" not in await clinical.names("Patient", [("_lastUpdated", f"gt{stamp}")])
    assert await clinical.names("Patient", [("_lastUpdated", stamp[:10])]) == PATIENTS
    assert await clinical.names("Patient", [("_lastUpdated", "lt2000")]) == set()


@pytest.mark.parametrize(("params", "problem"), [
    ({"birthdate": "yesterday"}, "birthdate"),
    ({"probability": "high"}, "probability"),
    ({"code-value-quantity": "8867-4"}, "components"),
    ({"_count": "-1"}, "_count"),
    ({"identifier:of-type": "MR|123"}, "of-type"),
])
async def test_malformed_values_are_400(clinical, params, problem):
    path = "RiskAssessment" if "probability" in params else (
        "Observation" if "code-value-quantity" in params else "Patient")
    response = await clinical.client.get(f"/fhir/{path}", params=params,
                                         headers=clinical.headers)
    assert response.status_code == 400, response.text
    assert response.json()["resourceType"] == "OperationOutcome"
    assert problem in response.text


PLAN_SENSITIVE = [row for row in REFERENCE if any(":" in k or "." in k for k, _ in row[1])] + [
    ("Observation", [("code", "8867-4"), ("date", "ge2024")], {"hr-amina", "hr-zoe"}),
    ("Observation", [("value-quantity", "gt100")], {"hr-kwame", "weight-kwame", "glucose-amina"}),
    ("Patient", [("gender:not", "female"), ("birthdate", "lt1970")], {"chinedu"}),
]
