"""Resource validation: the R4 JSON Schema on every write, fhir.resources on top in strict
mode, and OperationOutcome issues that name the failing element."""

from __future__ import annotations

from typing import Any

import pytest

from fhir_server.outcome import FhirError
from fhir_server.validation import _validator, validate_resource


def issues_of(resource: dict[str, Any], **kwargs: Any) -> dict[str, str]:
    with pytest.raises(FhirError) as caught:
        validate_resource(resource, **kwargs)
    assert caught.value.status == 400
    return {issue.expression[0]: f"{issue.code}: {issue.diagnostics}"
            for issue in caught.value.issues}


def test_a_valid_resource_passes_unchanged():
    observation = {"resourceType": "Observation", "status": "final",
                   "code": {"coding": [{"system": "http://loinc.org", "code": "718-7"}]},
                   "valueQuantity": {"value": 13.2, "unit": "g/dL"},
                   "effectiveDateTime": "2024-03-01T08:30:00+03:00"}
    assert validate_resource(observation) is observation
    assert validate_resource(observation, strict=True) is observation


def test_each_problem_is_an_issue_naming_its_element():
    found = issues_of({"resourceType": "Patient", "birthDate": "2020-13-01", "active": "yes",
                       "gender": "unknown-ish", "name": [{"given": "Amina"}],
                       "favouriteColour": "blue"})
    assert found["Patient.birthDate"] == \
        'value: Patient.birthDate: "2020-13-01" is not a valid FHIR date'
    assert found["Patient.active"].startswith("value: Patient.active:")
    assert "unknown-ish" in found["Patient.gender"]
    assert "array" in found["Patient.name[0].given"]
    assert found["Patient.favouriteColour"].startswith("structure: ")
    assert len(found) == 5


def test_required_elements_are_named():
    found = issues_of({"resourceType": "Observation", "status": "final"})
    assert found == {"Observation": 'required: Observation: "code" is a required property'}


def test_problems_inside_contained_and_bundled_resources_are_explained_there():
    found = issues_of({"resourceType": "Patient", "contained": [
        {"resourceType": "Observation", "code": {"text": "Hb"}, "colour": "red"}]})
    assert set(found) == {"Patient.contained[0]", "Patient.contained[0].colour"}
    assert "status" in found["Patient.contained[0]"]
    bundle = {"resourceType": "Bundle", "type": "collection",
              "entry": [{"resource": {"resourceType": "Patient", "gender": 3}}]}
    assert set(issues_of(bundle)) == {"Bundle.entry[0].resource.gender"}
    unknown = {"resourceType": "Bundle", "type": "collection",
               "entry": [{"resource": {"resourceType": "Spaceship"}}]}
    assert "not a resource of a known type" in issues_of(unknown)["Bundle.entry[0].resource"]


def test_required_primitives_may_be_given_as_their_extension():
    # Observation.status is 1..1: its value or its _status extension object must be there.
    found = issues_of({"resourceType": "Observation", "code": {"text": "Hb"}})
    assert found == {"Observation": "required: Observation: status or _status is required"}
    absent = {"resourceType": "Observation", "code": {"text": "Hb"}, "_status": {
        "extension": [{"url": "http://hl7.org/fhir/StructureDefinition/data-absent-reason",
                       "valueCode": "unknown"}]}}
    assert validate_resource(absent) is absent
    bundle = {"resourceType": "Bundle", "type": "transaction",
              "entry": [{"request": {"url": "Patient"}}]}
    assert "method or _method is required" in issues_of(bundle)["Bundle.entry[0].request"]


def test_a_choice_element_takes_one_type_at_a_time():
    twice = {"resourceType": "Observation", "status": "final", "code": {"text": "Hb"},
             "valueString": "high", "valueBoolean": True}
    assert set(issues_of(twice)) == {"Observation.valueString", "Observation.valueBoolean"}
    # A required choice needs one of its types.
    found = issues_of({"resourceType": "MedicationRequest", "status": "active",
                       "intent": "order", "subject": {"reference": "Patient/1"}})
    assert found == {"MedicationRequest": "required: MedicationRequest: "
                     "medicationCodeableConcept or medicationReference is required"}


def test_strict_mode_adds_the_fhir_resources_model_checks():
    # An element with neither a value nor an extension: the models refuse it.
    empty = {"resourceType": "Patient", "name": [{"family": "Otieno", "_family": {}}]}
    assert validate_resource(empty) is empty
    assert issues_of(empty, strict=True)


def test_a_type_the_schema_lacks_is_checked_with_its_model():
    # SubscriptionStatus (an R4B backport) is not in the R4 schema: fhir.resources checks it.
    assert issues_of({"resourceType": "SubscriptionStatus", "status": "nonsense",
                      "type": "heartbeat"})


# --- $validate over HTTP ---------------------------------------------------------------------

FHIR = {"Content-Type": "application/fhir+json"}


@pytest.fixture
def h(clinic_admin: dict[str, Any]) -> dict[str, str]:
    return {**clinic_admin["headers"], **FHIR}


def patient(**extra: Any) -> dict[str, Any]:
    return {"resourceType": "Patient", "name": [{"family": "Otieno", "given": ["Amina"]}],
            "gender": "female", "birthDate": "1990-04-12", **extra}


async def count_patients(client: Any, h: dict[str, str]) -> int:
    response = await client.get("/fhir/Patient", params={"_summary": "count"}, headers=h)
    return int(response.json()["total"])


async def test_validate_answers_200_with_the_issues_and_stores_nothing(client, h):
    valid = await client.post("/fhir/Patient/$validate", json=patient(), headers=h)
    assert valid.status_code == 200
    outcome = valid.json()
    assert outcome["resourceType"] == "OperationOutcome"
    assert [i["severity"] for i in outcome["issue"]] == ["information"]

    invalid = await client.post("/fhir/Patient/$validate",
                                json=patient(birthDate="12/04/1990", hairColour="red"),
                                headers=h)
    assert invalid.status_code == 200  # an invalid resource is a successful validation
    issues = {tuple(i["expression"]): i for i in invalid.json()["issue"]}
    assert issues[("Patient.birthDate",)]["severity"] == "error"
    assert issues[("Patient.hairColour",)]["code"] == "structure"
    assert await count_patients(client, h) == 0


async def test_validate_checks_what_only_the_models_catch(client, h):
    # Accepted by the schema (what writes check by default), refused by the models.
    empty_family = patient(name=[{"family": "Otieno", "_family": {}}])
    response = await client.post("/fhir/Patient/$validate", json=empty_family, headers=h)
    assert any(i["severity"] == "error" for i in response.json()["issue"]), response.text


async def test_validate_takes_parameters_with_mode_and_profile(client, h):
    created = await client.post("/fhir/Patient", json=patient(), headers=h)
    patient_id = created.json()["id"]
    other = {**patient(), "id": "someone-else"}
    body = {"resourceType": "Parameters", "parameter": [
        {"name": "resource", "resource": other}, {"name": "mode", "valueCode": "update"},
        {"name": "profile", "valueUri": "http://example.org/StructureDefinition/ke-patient"}]}
    response = await client.post(f"/fhir/Patient/{patient_id}/$validate", json=body,
                                 headers=h)
    assert response.status_code == 200
    issues = response.json()["issue"]
    assert any(i["severity"] == "error" and "not the id in the URL" in i["diagnostics"]
               for i in issues)
    # a profile the server does not know cannot be checked: an error naming it
    assert any(i["severity"] == "error" and i["code"] == "not-found"
               and "ke-patient" in i["diagnostics"] for i in issues)

    delete_ok = await client.post(f"/fhir/Patient/{patient_id}/$validate?mode=delete",
                                  json={"resourceType": "Parameters"}, headers=h)
    assert delete_ok.status_code == 200
    assert delete_ok.json()["issue"][0]["severity"] == "information"
    unknown = await client.post("/fhir/Patient/nobody/$validate?mode=delete",
                                json={"resourceType": "Parameters"}, headers=h)
    assert unknown.status_code == 404


async def test_validate_refuses_what_cannot_be_validated(client, h):
    wrong_type = await client.post("/fhir/Patient/$validate",
                                   json={"resourceType": "Observation"}, headers=h)
    assert wrong_type.status_code == 200
    assert wrong_type.json()["issue"][0]["expression"] == ["resourceType"]
    nothing = await client.post("/fhir/Patient/$validate",
                                json={"resourceType": "Parameters", "parameter": []}, headers=h)
    assert nothing.status_code == 400
    bad_mode = await client.post("/fhir/Patient/$validate?mode=upsert", json=patient(),
                                 headers=h)
    assert bad_mode.status_code == 400
    assert (await client.post("/fhir/Patient/$validate", json=patient())).status_code == 401


def test_one_compiled_validator_serves_every_resource_type():
    # compiling one per type cost ~52 MB and 0.25 s for every type a server met
    assert _validator("Patient") is _validator("Observation") is _validator("Bundle")
    assert _validator("SubscriptionStatus") is None  # not in the R4 schema: the models check


HAEMOGLOBIN = {"coding": [{"system": "http://loinc.org", "code": "718-7",
                           "display": "Hemoglobin [Mass/volume] in Blood"}]}


def observation(**elements: Any) -> dict[str, Any]:
    return {"resourceType": "Observation", "status": "final", "code": HAEMOGLOBIN,
            "subject": {"reference": "Patient/amina-odhiambo"}, **elements}


# Every shape the R4 schema let through before complex types said "type": "object": a
# string, a number, a list or null where an object (or an array of objects) is required.
WRONG_SHAPES = [
    (observation(code="abc"), "Observation.code"),
    (observation(code=None), "Observation.code"),
    (observation(code=718), "Observation.code"),
    (observation(code=[HAEMOGLOBIN]), "Observation.code"),
    (observation(subject="Patient/1"), "Observation.subject"),
    (observation(valueQuantity="13.2 g/dL"), "Observation.valueQuantity"),
    (observation(valueQuantity=13.2), "Observation.valueQuantity"),
    (observation(valueQuantity=[{"value": 13.2}]), "Observation.valueQuantity"),
    (observation(valueQuantity=None), "Observation.valueQuantity"),
    (observation(code={"coding": ["http://loinc.org|718-7"]}), "Observation.code.coding[0]"),
    (observation(extension=[1]), "Observation.extension[0]"),
    (observation(text={"status": "generated", "div": 5}), "Observation.text.div"),
    ({"resourceType": "Patient", "name": [["Amina", "Odhiambo"]]}, "Patient.name[0]"),
    ({"resourceType": "Patient", "name": ["Amina Odhiambo"]}, "Patient.name[0]"),
    ({"resourceType": "Patient", "extension": ["http://example.org/x"]},
     "Patient.extension[0]"),
    ({"resourceType": "Patient", "contact": [{"name": "Baraka"}]}, "Patient.contact[0].name"),
    ({"resourceType": "Bundle", "type": "collection", "entry": [[{"resource": {}}]]},
     "Bundle.entry[0]"),
    ({"resourceType": "Bundle", "type": "collection", "entry": [{"resource": "Patient/1"}]},
     "Bundle.entry[0].resource"),
]


@pytest.mark.parametrize(("resource", "element"), WRONG_SHAPES,
                         ids=[element for _, element in WRONG_SHAPES])
def test_a_value_of_the_wrong_json_type_where_an_object_is_required_is_refused(
        resource: dict[str, Any], element: str) -> None:
    assert element in issues_of(resource)


def test_every_complex_type_of_the_schema_says_it_is_an_object() -> None:
    from fhir_server.validation import _schema

    definitions = _schema()["definitions"]
    untyped = [name for name, d in definitions.items() if "properties" in d
               and d.get("type") != "object"]
    assert untyped == []
    assert definitions["xhtml"] == {"type": "string"}
