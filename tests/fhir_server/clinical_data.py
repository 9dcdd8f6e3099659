"""A small, realistic clinical record set, submitted as one transaction Bundle.

Two hospitals, two clinicians, five patients (accents, a deceased patient, a narrative),
encounters, vital signs and lab results with LOINC codes and UCUM units (one blood
pressure panel with components), conditions with onset dates and periods, a medication
request, a diagnostic report, a provenance record, a risk assessment, a questionnaire and
a value set. Every entry has a ``urn:uuid`` fullUrl; ``ids`` maps the short names used by
the tests to those fullUrls, and the transaction response gives the server's ids.
"""

from __future__ import annotations

import uuid
from typing import Any

LOINC = "http://loinc.org"
UCUM = "http://unitsofmeasure.org"
SNOMED = "http://snomed.info/sct"
MRN = "urn:oid:2.16.404.1.1"
V2_0203 = "http://terminology.hl7.org/CodeSystem/v2-0203"
CATEGORY = "http://terminology.hl7.org/CodeSystem/observation-category"
SECURITY = "http://terminology.hl7.org/CodeSystem/v3-Confidentiality"


def _uuid(name: str) -> str:
    return f"urn:uuid:{uuid.uuid5(uuid.NAMESPACE_URL, 'clinical-data/' + name)}"


def _ref(name: str) -> dict[str, str]:
    return {"reference": _uuid(name)}


def _patient(name: str, mrn: str, family: str, given: list[str], gender: str, birth: str,
             **extra: Any) -> tuple[str, dict[str, Any]]:
    return name, {
        "resourceType": "Patient",
        "identifier": [{"system": MRN, "value": mrn,
                        "type": {"coding": [{"system": V2_0203, "code": "MR"}]}}],
        "name": [{"use": "official", "family": family, "given": given}],
        "gender": gender, "birthDate": birth,
        "managingOrganization": _ref("knh"),
        **extra,
    }


def _observation(name: str, patient: str, code: str, display: str, when: str, value: Any,
                 unit: str | None = None, category: str = "vital-signs", **extra: Any
                 ) -> tuple[str, dict[str, Any]]:
    resource: dict[str, Any] = {
        "resourceType": "Observation", "status": "final",
        "category": [{"coding": [{"system": CATEGORY, "code": category}]}],
        "code": {"coding": [{"system": LOINC, "code": code, "display": display}],
                 "text": display},
        "subject": _ref(patient), "effectiveDateTime": when,
        **extra,
    }
    if unit is not None:
        resource["valueQuantity"] = {"value": value, "unit": unit, "system": UCUM, "code": unit}
    elif value is not None:
        resource["valueString"] = value
    return name, resource


RECORDS: list[tuple[str, dict[str, Any]]] = [
    ("knh", {"resourceType": "Organization", "name": "Kenyatta National Hospital",
             "identifier": [{"system": "urn:oid:2.16.404", "value": "KNH-001"}],
             "address": [{"city": "Nairobi", "country": "KE"}]}),
    ("akuh", {"resourceType": "Organization", "name": "Aga Khan University Hospital",
              "partOf": _ref("knh"), "address": [{"city": "Mombasa", "country": "KE"}]}),
    ("mtrh", {"resourceType": "Organization", "name": "Moi Teaching, Referral Hospital",
              "identifier": [{"system": "urn:oid:2.16.404.9", "value": "MTRH|ELD"}],
              "address": [{"city": "Eldoret", "country": "KE"}]}),
    ("dr-kamau", {"resourceType": "Practitioner",
                  "name": [{"family": "Kamau", "given": ["Wanjiku"], "prefix": ["Dr"]}],
                  "identifier": [{"system": "urn:oid:2.16.404.2", "value": "KMPDC-4471"}]}),
    ("dr-otieno", {"resourceType": "Practitioner",
                   "name": [{"family": "Otieno", "given": ["Brian"]}]}),
    _patient("amina", "KE-29384756", "Odhiambo", ["Amina", "Wanjiru"], "female", "1988-04-12",
             telecom=[{"system": "phone", "value": "+254712345678", "use": "mobile"},
                      {"system": "email", "value": "amina@example.org"}],
             address=[{"city": "Nairobi", "country": "KE", "postalCode": "00100"}],
             generalPractitioner=[_ref("dr-kamau")],
             text={"status": "generated",
                   "div": "<div xmlns=\"http://www.w3.org/1999/xhtml\">Amina Odhiambo, "
                          "followed for gestational diabetes</div>"}),
    _patient("kwame", "GH-55102", "Mensah", ["Kwame"], "male", "1975-09-30",
             deceasedDateTime="2024-01-15T08:30:00+00:00",
             address=[{"city": "Accra", "country": "GH"}]),
    _patient("zoe", "DE-7731", "Müller", ["Zoë"], "female", "2001-02-14",
             address=[{"city": "Berlin", "country": "DE"}]),
    _patient("chinedu", "NG-88213", "Okafor", ["Chinedu", "Emeka"], "male", "1962-11",
             address=[{"city": "Lagos", "country": "NG"}]),
    _patient("fatima", "KE-11223344", "Hassan", ["Fatima"], "female", "1995-07-01",
             address=[{"city": "Mombasa", "country": "KE"}],
             managingOrganization=_ref("akuh"),
             meta={"tag": [{"system": "http://example.org/fhir/tags", "code": "research-cohort"}],
                   "profile": ["http://hl7.org/fhir/us/core/StructureDefinition/us-core-patient"],
                   "security": [{"system": SECURITY, "code": "R"}],
                   "source": "http://lis.akuh.example.org/fhir"}),
    ("enc-amina", {"resourceType": "Encounter", "status": "finished",
                   "class": {"system": "http://terminology.hl7.org/CodeSystem/v3-ActCode",
                             "code": "AMB"},
                   "subject": _ref("amina"),
                   "participant": [{"individual": _ref("dr-kamau")}],
                   "period": {"start": "2024-03-01T09:00:00+03:00",
                              "end": "2024-03-01T10:30:00+03:00"},
                   "serviceProvider": _ref("knh")}),
    _observation("hr-amina", "amina", "8867-4", "Heart rate", "2024-03-01T09:15:00+03:00", 72,
                 "/min", encounter=_ref("enc-amina"), performer=[_ref("dr-kamau")]),
    _observation("temp-amina", "amina", "8310-5", "Body temperature",
                 "2024-03-01T09:16:00+03:00", 37.2, "Cel", encounter=_ref("enc-amina")),
    _observation("weight-amina", "amina", "29463-7", "Body weight", "2024-03-01T09:17:00+03:00",
                 68.5, "kg"),
    _observation("hba1c-amina", "amina", "4548-4", "Hemoglobin A1c", "2024-02-20", 6.9, "%",
                 category="laboratory"),
    _observation("glucose-amina", "amina", "2339-0", "Glucose", "2023-11-05T07:30:00Z", 126,
                 "mg/dL", category="laboratory"),
    _observation("hr-kwame", "kwame", "8867-4", "Heart rate", "2023-12-30T22:00:00Z", 118,
                 "/min"),
    _observation("weight-kwame", "kwame", "29463-7", "Body weight", "2023-12-30T22:05:00Z",
                 70500, "g"),
    _observation("hr-zoe", "zoe", "8867-4", "Heart rate", "2024-05-10T14:00:00+02:00", 64,
                 "/min"),
    ("bp-chinedu", {
        "resourceType": "Observation", "status": "final",
        "category": [{"coding": [{"system": CATEGORY, "code": "vital-signs"}]}],
        "code": {"coding": [{"system": LOINC, "code": "85354-9",
                             "display": "Blood pressure panel"}]},
        "subject": _ref("chinedu"), "effectivePeriod": {"start": "2024-04-02T08:00:00Z",
                                                       "end": "2024-04-02T08:10:00Z"},
        "component": [
            {"code": {"coding": [{"system": LOINC, "code": "8480-6", "display": "Systolic"}]},
             "valueQuantity": {"value": 152, "system": UCUM, "code": "mm[Hg]"}},
            {"code": {"coding": [{"system": LOINC, "code": "8462-4", "display": "Diastolic"}]},
             "valueQuantity": {"value": 95, "system": UCUM, "code": "mm[Hg]"}},
        ]}),
    _observation("smoking-fatima", "fatima", "72166-2", "Tobacco smoking status",
                 "2024-01-10", None, category="social-history",
                 valueCodeableConcept={"coding": [{"system": SNOMED, "code": "266919005",
                                                   "display": "Never smoked"}]}),
    _observation("note-fatima", "fatima", "8302-2", "Body height", "2024-01-10", None,
                 status="preliminary", dataAbsentReason={"text": "patient declined"}),
    ("htn-kwame", {"resourceType": "Condition",
                   "clinicalStatus": {"coding": [{
                       "system": "http://terminology.hl7.org/CodeSystem/condition-clinical",
                       "code": "active"}]},
                   "code": {"coding": [{"system": SNOMED, "code": "38341003",
                                        "display": "Hypertensive disorder"}]},
                   "subject": _ref("kwame"), "onsetDateTime": "2015-06-01"}),
    ("dm-amina", {"resourceType": "Condition",
                  "code": {"coding": [{"system": SNOMED, "code": "11687002",
                                       "display": "Gestational diabetes mellitus"}]},
                  "subject": _ref("amina"), "encounter": _ref("enc-amina"),
                  "onsetPeriod": {"start": "2023-10-01", "end": "2024-02-28"},
                  "recorder": _ref("dr-kamau")}),
    ("metformin-amina", {
        "resourceType": "MedicationRequest", "status": "active", "intent": "order",
        "medicationCodeableConcept": {"coding": [{
            "system": "http://www.nlm.nih.gov/research/umls/rxnorm", "code": "860975",
            "display": "metformin 500 MG Extended Release Oral Tablet"}]},
        "subject": _ref("amina"), "requester": _ref("dr-kamau"), "authoredOn": "2023-11-06"}),
    ("report-amina", {"resourceType": "DiagnosticReport", "status": "final",
                      "code": {"coding": [{"system": LOINC, "code": "24331-1",
                                           "display": "Lipid panel"}]},
                      "subject": _ref("amina"),
                      "result": [_ref("hba1c-amina"), _ref("glucose-amina")],
                      "effectiveDateTime": "2024-02-20"}),
    ("provenance-amina", {"resourceType": "Provenance", "target": [_ref("amina")],
                          "recorded": "2024-03-01T10:35:00+03:00",
                          "agent": [{"who": _ref("dr-kamau")}]}),
    ("risk-kwame", {"resourceType": "RiskAssessment", "status": "final",
                    "subject": _ref("kwame"),
                    "prediction": [{"probabilityDecimal": 0.32,
                                    "outcome": {"text": "Stroke within 10 years"}}]}),
    ("phq9", {"resourceType": "Questionnaire", "status": "active",
              "url": "http://example.org/fhir/Questionnaire/phq-9", "name": "PHQ9"}),
    ("vs-vitals", {"resourceType": "ValueSet", "status": "active",
                   "url": "http://example.org/fhir/ValueSet/vital-signs/adult",
                   "name": "AdultVitalSigns"}),
]


def transaction_bundle() -> dict[str, Any]:
    return {"resourceType": "Bundle", "type": "transaction", "entry": [
        {"fullUrl": _uuid(name), "resource": resource,
         "request": {"method": "POST", "url": resource["resourceType"]}}
        for name, resource in RECORDS
    ]}


def server_ids(response_bundle: dict[str, Any]) -> dict[str, str]:
    """Short name → server id, from the transaction-response (entries keep their order)."""
    ids = {}
    for (name, _), entry in zip(RECORDS, response_bundle["entry"], strict=True):
        ids[name] = entry["response"]["location"].split("/")[-3]
    return ids
