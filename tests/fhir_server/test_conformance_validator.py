"""The StructureDefinition validator (fhir_server.conformance): each rule the reference
validator applies, on realistic resources, with the location and rule of each issue."""

from __future__ import annotations

import base64
import copy
import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
from fhirpathpy import evaluate

from fhir_server.conformance import invariants
from fhir_server.conformance.bindings import check_binding
from fhir_server.conformance.canonicals import ConformanceContext
from fhir_server.conformance.definitions import shipped_structure_definitions
from fhir_server.conformance.model import Binding, compile_profile
from fhir_server.conformance.snapshot import SnapshotError, generate_snapshot
from fhir_server.conformance.validator import Options, Validation

DATA = Path(__file__).resolve().parents[1] / "data" / "conformance"
NATIONAL = "http://example.org/fhir/StructureDefinition/national-patient"


@pytest.fixture(scope="module")
def context() -> ConformanceContext:
    return ConformanceContext()


@pytest.fixture(scope="module")
def national() -> ConformanceContext:
    """The shipped definitions plus a national Patient profile (its snapshot generated
    from its differential) and the value set it binds countries to."""
    profile = json.loads((DATA / "national-patient.json").read_text())
    countries = json.loads((DATA / "countries.json").read_text())
    snapshot = generate_snapshot(profile, ConformanceContext().structure_definition)
    return ConformanceContext({("StructureDefinition", NATIONAL): [snapshot],
                               ("ValueSet", countries["url"]): [countries]})


def issues(context: ConformanceContext, resource: Any, profiles: tuple[str, ...] = (),
           **options: Any) -> list[tuple[str, str, str, str]]:
    """(severity, expression, rule, diagnostics) of every issue."""
    run = Validation(context, Options(**options))
    run.resource(resource, profiles)
    return [(i.severity, i.expression[0], i.rule, i.diagnostics) for i in run.issues]


def errors(context: ConformanceContext, resource: Any, profiles: tuple[str, ...] = (),
           **options: Any) -> dict[str, str]:
    """expression → rule of the first error there."""
    found: dict[str, str] = {}
    for severity, where, rule, _ in issues(context, resource, profiles, **options):
        if severity == "error":
            found.setdefault(where, rule)
    return found


def _with(resource: dict[str, Any], elements: dict[str, Any]) -> dict[str, Any]:
    """``resource`` with ``elements`` set (None: left out)."""
    merged = {**resource, **elements}
    return {k: v for k, v in merged.items() if v is not None}


def amina(**elements: Any) -> dict[str, Any]:
    return _with({"resourceType": "Patient", "id": "amina",
                  "identifier": [{"system": "http://example.org/fhir/sid/national-id",
                                  "value": "27311409"}],
                  "name": [{"family": "Odhiambo", "given": ["Amina"]}], "gender": "female",
                  "birthDate": "1990-04-12"}, elements)


def haemoglobin(**elements: Any) -> dict[str, Any]:
    return _with({"resourceType": "Observation", "status": "final",
                  "code": {"coding": [{"system": "http://loinc.org", "code": "718-7",
                                       "display": "Hemoglobin [Mass/volume] in Blood"}]},
                  "subject": {"reference": "Patient/amina"},
                  "effectiveDateTime": "2024-03-01T08:30:00+03:00",
                  "valueQuantity": {"value": 13.2, "unit": "g/dL",
                                    "system": "http://unitsofmeasure.org", "code": "g/dL"}},
                 elements)


# -- structure --------------------------------------------------------------------------
def test_a_valid_patient_and_observation_have_no_issues(context):
    assert issues(context, amina()) == []
    assert issues(context, haemoglobin()) == []


def test_cardinality_and_unknown_elements_are_errors_where_they_are(context):
    found = errors(context, {"resourceType": "Observation", "status": "final",
                             "hairColour": "red", "subject": [{"reference": "Patient/1"}]})
    assert found["Observation"] == "cardinality-min"  # code is 1..1
    assert found["Observation.hairColour"] == "unknown-element"
    assert found["Observation.subject"] == "array"  # 0..1: not a JSON array


def test_types_and_choice_types(context):
    found = errors(context, haemoglobin(valueString="high", active=True))
    assert found["Observation.valueString"] == "choice-type"
    found = errors(context, haemoglobin(valueQuantity={"value": "13.2"}))
    assert found["Observation.valueQuantity.value"] == "type-decimal"
    assert "Observation.valueCodeableConcept" in errors(
        context, haemoglobin(valueQuantity=None, valueCodeableConcept="high"))


def test_primitives_as_the_reference_checks_them(context):
    found = issues(context, amina(birthDate="1990-02-30", name=[{"family": " Odhiambo "}]))
    by_place = {where: (severity, rule) for severity, where, rule, _ in found}
    assert by_place["Patient.birthDate"] == ("error", "type-date")  # no 30 February
    assert by_place["Patient.name[0].family"] == ("warning", "type-string")  # whitespace
    assert errors(context, haemoglobin(effectiveDateTime="2024-03-01T08:30:00")) == {
        "Observation.effectiveDateTime": "type-dateTime"}  # a time needs a zone
    assert errors(context, {"resourceType": "Observation", "status": "final",
                            "code": {"text": "x"}, "valueInteger": 2 ** 31}) == {
        "Observation.valueInteger": "type-integer"}
    assert errors(context, amina(gender="")) == {"Patient.gender": "type-code"}


def test_empty_arrays_nulls_and_resource_ids(context):
    found = errors(context, amina(telecom=[], address=[None]))
    assert found["Patient.telecom"] == "array-empty"
    assert found["Patient.address[0]"] == "array-null"
    assert errors(context, amina(id="amina_1")) == {"Patient.id": "resource-id"}


def test_an_element_needs_a_value_or_children(context):
    assert errors(context, amina(maritalStatus={})) == {"Patient.maritalStatus": "ele-1"}
    assert errors(context, amina(name=[{"family": "Odhiambo", "_family": {}}])) == {
        "Patient.name[0].family": "ele-1"}


# -- invariants -------------------------------------------------------------------------
def test_invariants_report_their_key_and_text(context):
    run = Validation(context)
    run.resource(amina(contact=[{"gender": "male"}]))
    (issue,) = run.issues
    assert issue.rule == "pat-1" and issue.expression == ("Patient.contact[0]",)
    assert issue.source == "http://hl7.org/fhir/StructureDefinition/Patient"
    assert "SHALL at least contain a contact's details or a reference to an organization" \
        in issue.diagnostics
    assert issue.to_json()["details"]["coding"][0]["code"] == "pat-1"
    period = {"start": "2024-03-02T10:00:00Z", "end": "2024-03-01T10:00:00Z"}
    assert errors(context, haemoglobin(effectiveDateTime=None, effectivePeriod=period)) == {
        "Observation.effectivePeriod": "per-1"}
    both = haemoglobin(dataAbsentReason={"text": "haemolysed"})
    assert errors(context, both) == {"Observation": "obs-6"}


def test_every_core_constraint_parses_once_and_guards_agree_with_the_interpreter(context):
    constraints = {c for sd in shipped_structure_definitions().values()
                   for rule in compile_profile(sd).by_id.values() for c in rule.constraints}
    compiled = [invariants.compile_constraint(c) for c in constraints]
    assert all(c.parsed is not None for c in compiled)
    some = next(iter(constraints))
    assert invariants.compile_constraint(some) is invariants.compile_constraint(some)  # once
    # On an element with none of the guarded names, the guard's answer is the
    # interpreter's (what the guard lets the validator skip).
    guarded = [c for c in compiled if c.guard is not None]
    assert len(guarded) > 200
    env = invariants.Env({}, {})
    functions = invariants.functions_for(env)
    for item in guarded[:80]:
        element = {"id": "x", "extension": [{"url": "http://example.org/x",
                                             "valueString": "y"}]}
        if invariants.applies(item, element):
            continue
        outcome = invariants._run(item.parsed, element, None, env, functions)  # type: ignore[arg-type]
        assert outcome == item.empty_result, item.constraint.key


def test_native_universal_rules_agree_with_their_expressions():
    for element, expected in (({"family": "Odhiambo"}, True), ({"id": "a"}, False),
                              ({}, False)):
        assert invariants.has_value_or_children(element) is expected
        result = evaluate(element, {"expression": "children().count() > id.count()",
                                    "base": "HumanName"}, model=invariants.MODEL)
        assert result == [expected]
    for extension, expected in (({"url": "u", "valueString": "v"}, True),
                                ({"url": "u"}, False),
                                ({"url": "u", "valueString": "v",
                                  "extension": [{"url": "w", "valueCode": "c"}]}, False)):
        assert invariants.extension_value_or_extensions(extension) is expected
        result = evaluate(extension, {"expression": "extension.exists() != value.exists()",
                                      "base": "Extension"}, model=invariants.MODEL)
        assert result == [expected]


# -- terminology ------------------------------------------------------------------------
def test_bindings_by_strength(context):
    found = issues(context, amina(gender="woman"))
    assert [(s, w, r) for s, w, r, _ in found] == [
        ("error", "Patient.gender", "binding-required")]
    marital = {"coding": [{"system": "http://example.org/local-status", "code": "X"}]}
    assert [(s, r) for s, _, r, _ in issues(context, amina(maritalStatus=marital))] == [
        ("warning", "binding-extensible")]
    # a code from a system outside a preferred value set: a warning
    category = [{"coding": [{"system": "http://snomed.info/sct", "code": "386053000"}]}]
    assert [(s, r) for s, _, r, _ in issues(context, haemoglobin(category=category))] == [
        ("warning", "binding-preferred")]
    # a code of a system the value set takes but the server does not hold (LOINC):
    # information, never a failure
    loinc = Binding("extensible", "http://hl7.org/fhir/ValueSet/observation-codes")
    found = check_binding(context.terminology, loinc, "CodeableConcept",
                          haemoglobin()["code"])
    assert [(severity, code) for severity, code, *_ in found] == [
        ("information", "informational")]


def test_codes_of_held_code_systems_are_checked_without_a_binding(context):
    unknown = {"coding": [{"system": "http://terminology.hl7.org/CodeSystem/v2-0203",
                           "code": "NOT-A-CODE"}]}
    found = errors(context, amina(identifier=[{"type": unknown, "value": "1"}]))
    assert found == {"Patient.identifier[0].type.coding[0].code": "code-unknown"}
    value_set_as_system = {"coding": [{"system": "http://hl7.org/fhir/ValueSet/marital-status",
                                       "code": "M"}]}
    assert errors(context, amina(maritalStatus=value_set_as_system)) == {
        "Patient.maritalStatus.coding[0].system": "coding-system"}


def test_grammar_code_systems(context):
    photo = {"contentType": "image/png", "url": "http://example.org/amina.png"}
    assert errors(context, amina(photo=[photo])) == {}
    assert errors(context, amina(photo=[{**photo, "contentType": "a png"}])) == {
        "Patient.photo[0].contentType": "binding-required"}


# -- extensions -------------------------------------------------------------------------
BIRTH_PLACE = "http://hl7.org/fhir/StructureDefinition/patient-birthPlace"


def test_extensions_against_their_definitions_and_contexts(context):
    good = {"url": BIRTH_PLACE, "valueAddress": {"city": "Kisumu"}}
    assert errors(context, amina(extension=[good])) == {}
    wrong_type = {"url": BIRTH_PLACE, "valueString": "Kisumu"}
    assert errors(context, amina(extension=[wrong_type])) == {
        "Patient.extension[0]": "cardinality-min",  # its value[x] (an Address) is 1..1
        "Patient.extension[0].valueString": "unknown-element"}
    # patient-birthPlace is for Patient, not Observation
    assert errors(context, haemoglobin(extension=[good])) == {
        "Observation.extension[0]": "extension-context"}
    both = {**good, "extension": [{"url": "x", "valueString": "y"}]}
    assert "ext-1" in errors(context, amina(extension=[both])).values()


def test_unknown_extensions_follow_the_setting(context):
    local = {"url": "http://clinic.example.org/fhir/StructureDefinition/tribe",
             "valueString": "Luo"}
    assert errors(context, amina(extension=[local])) == {
        "Patient.extension[0]": "extension-unknown"}
    relaxed = issues(context, amina(extension=[local]), unknown_extensions="warning")
    assert [(s, r) for s, _, r, _ in relaxed] == [("warning", "extension-unknown")]
    # an unknown modifier extension changes the meaning: an error whatever the setting
    assert errors(context, amina(modifierExtension=[local]),
                  unknown_extensions="information") == {
        "Patient.modifierExtension[0]": "extension-unknown"}


# -- resources in resources, references ----------------------------------------------------
def test_contained_resources_and_local_references(context):
    practitioner = {"resourceType": "Practitioner", "id": "dr",
                    "name": [{"family": "Mwangi"}]}
    good = haemoglobin(contained=[practitioner], performer=[{"reference": "#dr"}])
    assert errors(context, good) == {}
    dangling = haemoglobin(contained=[practitioner], performer=[{"reference": "#nurse"}])
    found = errors(context, dangling)
    assert found["Observation.performer[0]"] == "ref-1"
    assert found["Observation"] == "dom-3"  # the contained one is referenced by nothing
    nested = haemoglobin(contained=[{**practitioner, "contained": [dict(practitioner)]}],
                         performer=[{"reference": "#dr"}])
    assert "dom-2" in errors(context, nested).values()
    broken = haemoglobin(contained=[{"resourceType": "Practitioner", "id": "dr",
                                     "gender": "robot"}], performer=[{"reference": "#dr"}])
    assert errors(context, broken) == {"Observation.contained[0].gender": "binding-required"}


def test_reference_formats_and_target_types(context):
    assert errors(context, haemoglobin(subject={"reference": "patient 1"})) == {
        "Observation.subject.reference": "reference-format"}
    assert errors(context, haemoglobin(subject={"reference": "Medication/m1"})) == {
        "Observation.subject": "reference-target"}
    assert errors(context, haemoglobin(subject={"reference": "Patient/1", "type": "Group"})
                  ) == {"Observation.subject.type": "reference-type"}


# -- narrative -------------------------------------------------------------------------------
XHTML = 'xmlns="http://www.w3.org/1999/xhtml"'


@pytest.mark.parametrize(("div", "problem"), [
    (f'<div {XHTML}><p>Amina Odhiambo, born 1990</p></div>', None),
    (f'<div {XHTML}><script>alert(1)</script><p>x</p></div>', "script"),
    (f'<div {XHTML}><p onclick="steal()">x</p></div>', "onclick"),
    (f'<div {XHTML}><a href="javascript:steal()">x</a></div>', "script"),
    ('<!DOCTYPE div [<!ENTITY xxe SYSTEM "file:///etc/passwd">]>'
     f'<div {XHTML}>&xxe;</div>', "DTD"),
    ('<div><p>no namespace</p></div>', "namespace"),
    (f'<div {XHTML}><form><input/></form></div>', "form"),
    (f'<div {XHTML}><p>&reg;</p></div>', "well-formed"),
    (f'<div {XHTML}>   </div>', "no content"),
])
def test_narrative_xhtml_rules(context, div, problem):
    found = issues(context, amina(text={"status": "generated", "div": div}))
    messages = [d for severity, where, _, d in found
                if severity == "error" and where == "Patient.text.div"]
    if problem is None:
        assert messages == []
    else:
        assert messages and any(problem in m for m in messages), messages


# -- Bundles ------------------------------------------------------------------------------------
def test_bundle_full_urls_duplicates_and_references(context):
    patient = amina()
    bundle = {"resourceType": "Bundle", "type": "collection", "entry": [
        {"fullUrl": "http://example.org/fhir/Patient/amina", "resource": patient},
        {"fullUrl": "http://example.org/fhir/Patient/other", "resource": amina()},
        {"fullUrl": "http://example.org/fhir/Patient/amina", "resource": amina()},
        {"fullUrl": "Observation/1", "resource": haemoglobin(
            subject={"reference": "Practitioner/amina"})}]}
    found = issues(context, bundle)
    rules = {(w, r) for s, w, r, _ in found if s == "error"}
    assert ("Bundle.entry[1]", "bundle-fullurl") in rules  # id other / amina
    assert ("Bundle.entry[2]", "bundle-duplicate") in rules
    assert ("Bundle.entry[3]", "bundle-fullurl") in rules  # not absolute


def test_documents_hold_what_they_reference_and_reach_every_entry(context):
    composition = {"resourceType": "Composition", "id": "c", "status": "final",
                   "type": {"text": "Discharge summary"}, "date": "2024-03-01",
                   "author": [{"reference": "Practitioner/dr"}], "title": "Discharge",
                   "subject": {"reference": "Patient/amina"}}
    identifier = {"system": "urn:ietf:rfc:3986",
                  "value": "urn:uuid:0c3151bd-1cbf-4d64-b04d-cd9187a4c6e0"}
    document = {"resourceType": "Bundle", "type": "document", "timestamp":
                "2024-03-01T10:00:00Z", "identifier": identifier,
                "entry": [
                    {"fullUrl": "http://example.org/fhir/Composition/c", "resource": composition},
                    {"fullUrl": "http://example.org/fhir/Patient/amina", "resource": amina()},
                    {"fullUrl": "http://example.org/fhir/Observation/o",
                     "resource": {**haemoglobin(), "id": "o"}}]}
    found = {(w, r) for s, w, r, _ in issues(context, document) if s == "error"}
    assert ("Bundle.entry[0].resource.author[0]", "bundle-reference") in found  # not held
    assert ("Bundle.entry[2]", "bundle-reachable") not in found  # it references the patient
    lonely = copy.deepcopy(document)
    lonely["entry"][2]["resource"]["subject"] = {"reference": "Patient/someone-else"}
    found = {(w, r) for s, w, r, _ in issues(context, lonely) if s == "error"}
    assert ("Bundle.entry[2]", "bundle-reachable") in found
    no_composition = {**document, "entry": document["entry"][1:]}
    assert "bdl-11" in errors(context, no_composition).values()


def test_a_message_holds_its_focus_and_starts_with_its_header(context):
    header = {"resourceType": "MessageHeader", "id": "h",
              "eventCoding": {"system": "http://example.org/events", "code": "admit"},
              "source": {"endpoint": "http://clinic.example.org/fhir"},
              "focus": [{"reference": "Patient/amina"}]}
    message = {"resourceType": "Bundle", "type": "message",
               "timestamp": "2024-03-01T10:00:00Z", "entry": [
                   {"fullUrl": "http://example.org/fhir/MessageHeader/h", "resource": header},
                   {"fullUrl": "http://example.org/fhir/Patient/amina", "resource": amina()}]}
    assert errors(context, message) == {}
    elsewhere = copy.deepcopy(message)
    elsewhere["entry"][0]["resource"]["focus"] = [{"reference": "Patient/someone-else"}]
    assert errors(context, elsewhere) == {"Bundle.entry[0].resource.focus[0]":
                                          "bundle-reference"}
    no_header = {**message, "entry": message["entry"][::-1]}
    assert "bdl-12" in errors(context, no_header).values()


# -- attachments -------------------------------------------------------------------------
def test_attachment_size_and_hash_must_match_the_data(context):
    data = b"Haemoglobin 13.2 g/dL"
    encoded = base64.b64encode(data).decode()
    digest = base64.b64encode(hashlib.sha1(data).digest()).decode()
    good = {"contentType": "text/plain", "data": encoded, "size": len(data), "hash": digest}
    assert errors(context, amina(photo=[good])) == {}
    assert errors(context, amina(photo=[{**good, "size": 100}])) == {
        "Patient.photo[0].size": "attachment"}
    other = base64.b64encode(hashlib.sha1(b"another file").digest()).decode()
    assert errors(context, amina(photo=[{**good, "hash": other}])) == {
        "Patient.photo[0].hash": "attachment"}


# -- profiles ------------------------------------------------------------------------------
def test_a_national_profile_slices_fixes_binds_and_adds_invariants(national):
    assert errors(national, amina(), (NATIONAL,)) == {}
    bad = amina(identifier=[{"system": "http://other.example.org/mrn", "value": "1"}],
                name=[{"given": ["Amina"]}], address=[{"country": "FR"}],
                photo=[{"url": "http://example.org/a.png"}], deceasedBoolean=True, active=True)
    found = issues(national, bad, (NATIONAL,))
    by_rule = {(w, r) for s, w, r, _ in found if s == "error"}
    assert ("Patient", "cardinality-min") in by_rule  # identifier:nationalId
    assert ("Patient.name[0]", "cardinality-min") in by_rule  # family
    assert ("Patient.address[0].country", "binding-required") in by_rule
    assert ("Patient", "cardinality-max") in by_rule  # photo 0..0
    assert ("Patient", "np-1") in by_rule
    too_long = amina(identifier=[{"system": "http://example.org/fhir/sid/national-id",
                                  "value": "1234567890123"}])
    assert errors(national, too_long, (NATIONAL,)) == {
        "Patient.identifier[0].value": "max-length"}


def test_meta_profile_is_validated_and_an_unknown_one_is_a_warning(national):
    claimed = amina(meta={"profile": [NATIONAL]}, birthDate=None)
    assert errors(national, claimed) == {"Patient": "cardinality-min"}
    unknown = amina(meta={"profile": ["http://example.org/fhir/StructureDefinition/none"]})
    assert [(s, r) for s, _, r, _ in issues(national, unknown)] == [
        ("warning", "profile-unknown")]


def test_slicing_closed_ordered_and_by_type(context):
    vital_signs = "http://hl7.org/fhir/StructureDefinition/vitalsigns"
    bp = haemoglobin(category=[{"coding": [{
        "system": "http://terminology.hl7.org/CodeSystem/observation-category",
        "code": "vital-signs"}]}])
    assert errors(context, bp, (vital_signs,)) == {}
    missing = haemoglobin()
    assert errors(context, missing, (vital_signs,)) == {"Observation": "cardinality-min"}


def test_slices_told_by_values_of_slices_below_them(context):
    """bp slices its components by code.coding.code, which each slice fixes in a slice of
    its own code.coding."""
    def component(code: str, value: int) -> dict[str, Any]:
        return {"code": {"coding": [{"system": "http://loinc.org", "code": code}]},
                "valueQuantity": {"value": value, "unit": "mmHg",
                                  "system": "http://unitsofmeasure.org", "code": "mm[Hg]"}}
    bp = haemoglobin(code={"coding": [{"system": "http://loinc.org", "code": "85354-9"}]},
                     valueQuantity=None, category=[{"coding": [{
                         "system": "http://terminology.hl7.org/CodeSystem/"
                                   "observation-category", "code": "vital-signs"}]}],
                     component=[component("8480-6", 120), component("8462-4", 80)])
    profile = ("http://hl7.org/fhir/StructureDefinition/bp",)
    assert errors(context, bp, profile) == {}
    systolic_only = {**bp, "component": [component("8480-6", 120)]}
    found = issues(context, systolic_only, profile)
    assert {(s, w, r) for s, w, r, _ in found} == {("error", "Observation", "cardinality-min")}
    assert any("DiastolicBP: minimum required = 1, but only found 0" in d
               for *_, d in found)
    assert not any("SystolicBP" in d for *_, d in found)


def test_snapshot_generation_refuses_what_loosens_or_is_not_there():
    profile = json.loads((DATA / "national-patient.json").read_text())
    lookup = ConformanceContext().structure_definition
    loose = copy.deepcopy(profile)
    loose["differential"]["element"].append({"id": "Patient.gender", "path": "Patient.gender",
                                             "max": "2"})
    with pytest.raises(SnapshotError, match="max 2 is above"):
        generate_snapshot(loose, lookup)
    nowhere = copy.deepcopy(profile)
    nowhere["differential"]["element"].append({"id": "Patient.favouriteColour",
                                               "path": "Patient.favouriteColour"})
    with pytest.raises(SnapshotError, match=r"no element Patient\.favouriteColour"):
        generate_snapshot(nowhere, lookup)


# -- conformance resources ------------------------------------------------------------------
def test_code_systems_and_value_sets_are_checked_as_the_reference_checks_them(context):
    supplement = {"resourceType": "CodeSystem", "url": "http://clinic.example.org/cs/sup",
                  "status": "draft", "content": "complete",
                  "supplements": "http://hl7.org/fhir/administrative-gender",
                  "concept": [{"code": "female", "designation": [{"value": "Mwanamke"}]},
                              {"code": "robot"}]}
    found = errors(context, supplement)
    assert found["CodeSystem.content"] == "codesystem-supplement"
    assert found["CodeSystem.concept[1]"] == "codesystem-supplement"
    properties = {"resourceType": "CodeSystem", "url": "http://clinic.example.org/cs/p",
                  "status": "draft", "content": "complete", "property": [
                      {"code": "notSelectable", "type": "dateTime",
                       "uri": "http://hl7.org/fhir/concept-properties#notSelectable"},
                      {"code": "notSelectable", "type": "boolean"}],
                  "concept": [{"code": "a", "property": [{"code": "notSelectable",
                                                          "valueBoolean": True}]}]}
    found = errors(context, properties)
    assert set(found) == {"CodeSystem.property[0]", "CodeSystem.property[1]",
                          "CodeSystem.concept[0].property[0]"}
    relative = {"resourceType": "ValueSet", "url": "ValueSet/local", "status": "draft",
                "compose": {"include": [{"system": "#cs"}]}}
    assert errors(context, relative) == {"ValueSet.url": "canonical-url",
                                         "ValueSet.compose.include[0].system":
                                             "valueset-system"}


def test_a_search_parameter_derived_from_r4_keeps_its_type_and_bases(context):
    derived = {"resourceType": "SearchParameter", "url": "http://clinic.example.org/sp/name",
               "name": "name", "status": "active", "description": "Name",
               "derivedFrom": "http://hl7.org/fhir/SearchParameter/Organization-name",
               "code": "name", "base": ["Patient"], "type": "token",
               "expression": "Organization.name"}
    assert [r for s, _, r, _ in issues(context, derived) if s == "error"] == [
        "searchparameter-derived", "searchparameter-derived"]


def test_periods_compare_at_the_precision_both_have(context):
    for start, end, valid in (("2023-06-21", "2023-06-22T06:20:00Z", True),
                              ("2023-06-21", "2023-06-21T06:20:00Z", False),  # undecided
                              ("2023-06-21T10:00:00+03:00", "2023-06-21T07:30:00Z", True),
                              ("2023-06-22", "2023-06-21", False)):
        found = errors(context, amina(contact=[{"name": {"family": "Odhiambo"},
                                                "period": {"start": start, "end": end}}]))
        assert (found == {}) is valid, (start, end, found)


def test_a_vital_sign_conforms_to_its_profile_without_claiming_it(context):
    temperature = haemoglobin(code={"coding": [{"system": "http://loinc.org",
                                                "code": "8310-5"}]},
                              valueQuantity={"value": 37.2, "unit": "Cel",
                                             "system": "http://unitsofmeasure.org",
                                             "code": "Cel"})
    # the body temperature profile asks for the vital-signs category
    assert errors(context, temperature) == {"Observation": "cardinality-min"}
    assert errors(context, temperature, vital_signs=False) == {}
