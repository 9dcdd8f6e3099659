"""fhir_server.patches: what a PATCH body means by its media type, JSON Merge Patch (RFC
7386) and FHIRPath Patch (R4 fhirpatch.html) applied to realistic resources."""

from __future__ import annotations

import base64
from typing import Any

import orjson
import pytest

from fhir_server.outcome import FhirError
from fhir_server.patches import (
    FHIRPATH_PATCH,
    JSON_PATCH,
    MERGE_PATCH,
    Patch,
    merge_patch,
    patch_from_body,
    patch_from_entry,
)

LOINC = "http://loinc.org"


def amina() -> dict[str, Any]:
    return {
        "resourceType": "Patient", "id": "amina",
        "identifier": [{"system": "urn:oid:2.16.404.1.1", "value": "KE-29384756"}],
        "name": [{"use": "official", "family": "Odhiambo", "given": ["Amina", "Wanjiru"]}],
        "gender": "female", "birthDate": "1988-04-12",
        "_birthDate": {"extension": [{
            "url": "http://hl7.org/fhir/StructureDefinition/patient-birthTime",
            "valueDateTime": "1988-04-12T06:30:00+03:00"}]},
        "telecom": [{"system": "phone", "value": "+254712345678", "use": "mobile"}],
    }


def heart_rate() -> dict[str, Any]:
    return {"resourceType": "Observation", "id": "hr", "status": "final",
            "code": {"coding": [{"system": LOINC, "code": "8867-4", "display": "Heart rate"}]},
            "valueQuantity": {"value": 72, "unit": "/min", "system": "http://unitsofmeasure.org",
                              "code": "/min"}}


def operation(kind: str, path: str, *, name: str | None = None, value: dict[str, Any] | None
              = None, **integers: int) -> dict[str, Any]:
    parts: list[dict[str, Any]] = [{"name": "type", "valueCode": kind},
                                   {"name": "path", "valueString": path}]
    if name is not None:
        parts.append({"name": "name", "valueString": name})
    if value is not None:
        parts.append({"name": "value", **value})
    parts.extend({"name": k, "valueInteger": v} for k, v in integers.items())
    return {"name": "operation", "part": parts}


def fhirpath(resource: dict[str, Any], *operations: dict[str, Any]) -> dict[str, Any]:
    return Patch(FHIRPATH_PATCH, {"resourceType": "Parameters",
                                  "parameter": list(operations)}).apply(resource)


# -- which format a body is ----------------------------------------------------------------------
def test_the_media_type_and_shape_of_a_body_say_its_format():
    assert patch_from_body(JSON_PATCH, [{"op": "remove", "path": "/gender"}]).format \
        == JSON_PATCH
    assert patch_from_body(MERGE_PATCH, {"gender": None}).format == MERGE_PATCH
    parameters = {"resourceType": "Parameters", "parameter": []}
    assert patch_from_body("application/fhir+json; charset=utf-8", parameters).format \
        == FHIRPATH_PATCH
    # plain application/json: what fhirpy sends for patch() and save(fields=...)
    assert patch_from_body("application/json", {"active": False}).format == MERGE_PATCH
    assert patch_from_body("application/json", []).format == JSON_PATCH
    assert patch_from_body("application/json", parameters).format == FHIRPATH_PATCH


def test_bodies_that_are_no_patch_are_refused():
    with pytest.raises(FhirError) as partial:
        patch_from_body("application/fhir+json", {"resourceType": "Patient", "active": False})
    assert partial.value.status == 400 and MERGE_PATCH in partial.value.issues[0].diagnostics
    with pytest.raises(FhirError) as xml:
        patch_from_body("application/xml", {})
    assert xml.value.status == 415
    with pytest.raises(FhirError) as not_object:
        patch_from_body(MERGE_PATCH, ["active"])
    assert not_object.value.status == 400


def test_a_bundle_entry_carries_a_binary_or_the_parameters():
    merge = base64.b64encode(orjson.dumps({"active": True})).decode()
    entry = patch_from_entry({"resourceType": "Binary", "contentType": MERGE_PATCH,
                              "data": merge})
    assert entry == Patch(MERGE_PATCH, {"active": True})
    legacy = base64.b64encode(orjson.dumps([{"op": "remove", "path": "/gender"}])).decode()
    assert patch_from_entry({"resourceType": "Binary", "data": legacy}).format == JSON_PATCH
    parameters = {"resourceType": "Parameters", "parameter": [operation("delete",
                                                                        "Patient.gender")]}
    assert patch_from_entry(parameters) == Patch(FHIRPATH_PATCH, parameters)
    with pytest.raises(FhirError):
        patch_from_entry({"resourceType": "Patient"})


# -- JSON Merge Patch ----------------------------------------------------------------------------
def test_merge_patch_follows_rfc_7386():
    # The examples of RFC 7386 appendix A.
    assert merge_patch({"a": "b"}, {"a": "c"}) == {"a": "c"}
    assert merge_patch({"a": "b"}, {"b": "c"}) == {"a": "b", "b": "c"}
    assert merge_patch({"a": "b"}, {"a": None}) == {}
    assert merge_patch({"a": [{"b": "c"}]}, {"a": [1]}) == {"a": [1]}
    assert merge_patch({"a": {"b": "c"}}, {"a": {"b": "d", "c": None}}) == {"a": {"b": "d"}}
    assert merge_patch({"e": None}, {"a": 1}) == {"e": None, "a": 1}
    assert merge_patch([1, 2], {"a": "b", "c": None}) == {"a": "b"}


def test_merge_patch_of_a_patient_sets_replaces_and_removes_top_level_elements():
    patched = Patch(MERGE_PATCH, {"active": False, "gender": None,
                                  "telecom": [{"system": "email",
                                               "value": "amina@example.org"}]}).apply(amina())
    assert patched["active"] is False and "gender" not in patched
    assert patched["telecom"] == [{"system": "email", "value": "amina@example.org"}]
    assert patched["name"] == amina()["name"]


# -- FHIRPath Patch ------------------------------------------------------------------------------
def test_add_sets_a_missing_element_or_appends_to_a_repeating_one():
    patched = fhirpath(
        amina(),
        operation("add", "Patient", name="active", value={"valueBoolean": True}),
        operation("add", "Patient", name="identifier", value={"valueIdentifier": {
            "system": "urn:healthplatform:organization:kcc:mrn", "value": "KCC-0001"}}),
        operation("add", "Patient.name.where(use = 'official')", name="given",
                  value={"valueString": "Njeri"}))
    assert patched["active"] is True
    assert [i["value"] for i in patched["identifier"]] == ["KE-29384756", "KCC-0001"]
    assert patched["name"][0]["given"] == ["Amina", "Wanjiru", "Njeri"]


def test_add_spells_a_choice_element_by_its_type_and_builds_backbone_elements_from_parts():
    patched = fhirpath(amina(), operation("add", "Patient", name="deceased",
                                          value={"valueDateTime": "2026-03-01T10:00:00Z"}),
                       operation("add", "Patient", name="contact", value={"part": [
                           {"name": "relationship", "valueCodeableConcept": {"coding": [{
                               "system": "http://terminology.hl7.org/CodeSystem/v2-0131",
                               "code": "N"}]}},
                           {"name": "name", "valueHumanName": {"family": "Odhiambo",
                                                                "given": ["Baraka"]}},
                           {"name": "telecom", "valueContactPoint": {
                               "system": "phone", "value": "+254700000001"}}]}))
    assert patched["deceasedDateTime"] == "2026-03-01T10:00:00Z"
    contact = patched["contact"][0]
    # relationship and telecom repeat: one part each becomes a list of one
    assert contact["relationship"][0]["coding"][0]["code"] == "N"
    assert contact["name"] == {"family": "Odhiambo", "given": ["Baraka"]}
    assert contact["telecom"] == [{"system": "phone", "value": "+254700000001"}]


def test_add_refuses_an_unknown_element_and_one_that_already_has_a_value():
    with pytest.raises(FhirError) as unknown:
        fhirpath(amina(), operation("add", "Patient", name="favouriteColour",
                                    value={"valueString": "blue"}))
    assert unknown.value.status == 422
    assert unknown.value.issues[0].expression == ("Parameters.parameter[0]",)
    with pytest.raises(FhirError) as twice:
        fhirpath(amina(), operation("add", "Patient", name="birthDate",
                                    value={"valueDate": "1990-01-01"}))
    assert "use replace" in twice.value.issues[0].diagnostics


def test_insert_puts_the_value_at_the_index_also_into_an_absent_list():
    patched = fhirpath(amina(),
                       operation("insert", "Patient.name[0].given",
                                 value={"valueString": "Njeri"}, index=1),
                       operation("insert", "Patient.generalPractitioner",
                                 value={"valueReference": {"reference": "Practitioner/wk"}},
                                 index=0))
    assert patched["name"][0]["given"] == ["Amina", "Njeri", "Wanjiru"]
    assert patched["generalPractitioner"] == [{"reference": "Practitioner/wk"}]
    with pytest.raises(FhirError) as past_end:
        fhirpath(amina(), operation("insert", "Patient.telecom", index=5,
                                    value={"valueContactPoint": {"system": "sms"}}))
    assert past_end.value.status == 422


def test_delete_removes_one_element_and_what_it_leaves_empty_and_nothing_is_no_error():
    patched = fhirpath(amina(), operation("delete", "Patient.telecom.where(system = 'phone')"),
                       operation("delete", "Patient.birthDate.extension"),
                       operation("delete", "Patient.name[0].given[1]"),
                       operation("delete", "Patient.deceased"))
    assert "telecom" not in patched
    assert patched["birthDate"] == "1988-04-12" and "_birthDate" not in patched
    assert patched["name"][0]["given"] == ["Amina"]
    with pytest.raises(FhirError) as several:
        fhirpath(amina(), operation("delete", "Patient.name.given"))
    assert "selects 2 elements" in several.value.issues[0].diagnostics


def test_replace_changes_one_value_and_a_choice_element_may_change_its_type():
    patched = fhirpath(heart_rate(),
                       operation("replace", "Observation.status",
                                 value={"valueCode": "amended"}),
                       operation("replace", "Observation.value",
                                 value={"valueString": "irregular, about 72/min"}))
    assert patched["status"] == "amended"
    assert "valueQuantity" not in patched
    assert patched["valueString"] == "irregular, about 72/min"
    coded = fhirpath(heart_rate(), operation(
        "replace", "Observation.code.coding.where(system = 'http://loinc.org').display",
        value={"valueString": "Heart rate (beats/minute)"}))
    assert coded["code"]["coding"][0]["display"] == "Heart rate (beats/minute)"
    with pytest.raises(FhirError) as nothing:
        fhirpath(heart_rate(), operation("replace", "Observation.issued",
                                         value={"valueInstant": "2026-03-01T10:00:00Z"}))
    assert "selects nothing" in nothing.value.issues[0].diagnostics


def test_move_reorders_a_list_and_keeps_primitive_extensions_in_line():
    patient = amina()
    patient["name"][0]["_given"] = [None, {"extension": [{
        "url": "http://hl7.org/fhir/StructureDefinition/iso21090-EN-qualifier",
        "valueCode": "CL"}]}]
    patched = fhirpath(patient, operation("move", "Patient.name[0].given",
                                          source=1, destination=0))
    assert patched["name"][0]["given"] == ["Wanjiru", "Amina"]
    assert patched["name"][0]["_given"][0]["extension"][0]["valueCode"] == "CL"
    assert patched["name"][0]["_given"][1] is None


def test_paths_must_name_elements_of_the_resource():
    with pytest.raises(FhirError) as computed:
        fhirpath(amina(), operation("replace", "Patient.name.given.count()",
                                    value={"valueInteger": 1}))
    assert "computed value" in computed.value.issues[0].diagnostics
    with pytest.raises(FhirError) as other:
        fhirpath(amina(), operation("delete", "Patient.generalPractitioner.resolve().name"))
    assert other.value.status == 422
    with pytest.raises(FhirError) as root:
        fhirpath(amina(), operation("delete", "Patient"))
    assert "resource itself" in root.value.issues[0].diagnostics


def test_a_malformed_parameters_is_a_400_naming_the_parameter():
    for parameters, where in (
            ({"resourceType": "Parameters"}, "Parameters.parameter"),
            ({"resourceType": "Parameters", "parameter": [{"name": "op"}]},
             "Parameters.parameter[0]"),
            ({"resourceType": "Parameters", "parameter": [operation("upsert", "Patient")]},
             "Parameters.parameter[0].part[type]"),
            ({"resourceType": "Parameters", "parameter": [operation("add", "Patient")]},
             "Parameters.parameter[0]"),
            ({"resourceType": "Parameters", "parameter": [
                operation("move", "Patient.name", source=-1, destination=0)]},
             "Parameters.parameter[0]")):
        with pytest.raises(FhirError) as refused:
            Patch(FHIRPATH_PATCH, parameters).apply(amina())
        assert refused.value.status == 400, parameters
        assert refused.value.issues[0].expression == (where,)
