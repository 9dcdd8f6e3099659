"""hl7_gateway.v2_to_fhir: each message family and segment map, field by field (pure, no store)."""

from __future__ import annotations

import base64
from datetime import UTC
from zoneinfo import ZoneInfo

import pytest

from fhir_server.validation import validate_resource
from hl7_gateway.ack import HeaderPolicy, check_header
from hl7_gateway.batch import parse_batch
from hl7_gateway.parser import Repetition, parse
from hl7_gateway.v2_to_fhir import SUPPORTED_MESSAGES, MappingError, map_message
from hl7_gateway.v2_to_fhir.bundle import identifier_condition, search_escape
from hl7_gateway.v2_to_fhir.datatypes import (
    contact_point,
    cx_identifier,
    fhir_date,
    fhir_datetime,
    fhir_instant,
    hd_system,
    human_name,
)
from tests.hl7_gateway.hl7_samples import sample_bytes, sample_files
from tests.hl7_gateway.messages import (
    RECEIVED,
    adt,
    by_code,
    mapped,
    one,
    oru,
    request_of,
    resources,
    sample,
    segment,
)

LOINC = "http://loinc.org"
UCUM = "http://unitsofmeasure.org"
SNOMED = "http://snomed.info/sct"
INTERPRETATION = "http://terminology.hl7.org/CodeSystem/v3-ObservationInterpretation"
V2_0203 = "http://terminology.hl7.org/CodeSystem/v2-0203"
POLICY = HeaderPolicy(message_types=SUPPORTED_MESSAGES)
NOT_MAPPED = {"23", "24", "25", "21"}  # unsupported types (AR) and the SIU without SCH (AE)


def rep(text: str) -> Repetition:
    return parse(f"MSH|^~\\&|A|B|C|D|20240101||ADT^A01|1|P|2.5\rZZZ|{text}\r").segment(
        "ZZZ").repetitions(1)[0]  # type: ignore[union-attr]


# --- every sample -----------------------------------------------------------------------------


@pytest.mark.parametrize("path", sample_files(), ids=lambda p: p.name[:2])
def test_every_supported_sample_maps_to_resources_the_fhir_validator_accepts(path) -> None:
    raw = sample_bytes(path.name[:2])
    for message in parse_batch(raw).messages:
        if path.name[:2] in NOT_MAPPED:
            continue
        assert check_header(message, POLICY) == []
        result = map_message(message, raw, received_at=RECEIVED, default_tz=UTC)
        for entry in result.entries:
            validate_resource(entry.resource)
        kinds = {e.resource["resourceType"] for e in result.entries}
        assert {"Binary", "Provenance"} <= kinds


def test_unsupported_samples_fail_the_header_check_with_codes_200_and_202() -> None:
    codes = {p: [e.code for e in check_header(parse(sample_bytes(p)), POLICY)]
             for p in ("23", "24", "25")}
    assert codes == {"23": [200], "24": [200, 202], "25": [200]}


# --- ORU^R01 --------------------------------------------------------------------------------


def test_nist_cbc_result_maps_report_observations_specimen_and_order() -> None:
    result = sample("01")
    assert len(resources(result, "Observation")) == 28
    patient = one(result, "Patient")
    assert patient["identifier"][0]["value"] == "PATID1234"
    assert patient["identifier"][0]["type"]["coding"][0]["code"] == "MR"
    assert patient["name"] == [{"family": "Jones", "given": ["William", "A"]}]
    assert (patient["gender"], patient["birthDate"]) == ("male", "1961-06-15")
    assert request_of(result, patient)["method"] == "POST"
    assert request_of(result, patient)["ifNoneExist"].endswith("|PATID1234")

    report = one(result, "DiagnosticReport")
    assert report["status"] == "final"
    assert report["code"]["coding"][0] == {"system": LOINC, "code": "57021-8",
                                           "display": "CBC W Auto Differential panel in Blood"}
    assert report["effectiveDateTime"] == "2011-01-03T14:34:28-08:00"
    assert report["issued"] == "2011-01-04T17:00:28-08:00"
    assert [(i["type"]["coding"][0]["code"], i["value"]) for i in report["identifier"]] == [
        ("FILL", "R-991133"), ("PLAC", "ORD666555")]
    assert len(report["result"]) == 28
    assert request_of(result, report)["url"].startswith("DiagnosticReport?identifier=")

    hemoglobin = by_code(result, "718-7")
    assert hemoglobin["status"] == "final"
    assert hemoglobin["valueQuantity"] == {"value": 12.5, "unit": "grams per milliliter",
                                           "system": UCUM, "code": "g/mL"}
    assert hemoglobin["referenceRange"][0]["text"] == "13 to 18"
    assert hemoglobin["referenceRange"][0]["low"]["value"] == 13
    assert hemoglobin["referenceRange"][0]["high"]["value"] == 18
    assert hemoglobin["interpretation"][0]["coding"][0]["code"] == "L"
    assert hemoglobin["effectiveDateTime"] == "2011-01-03T14:34:28-08:00"
    assert hemoglobin["identifier"][0]["value"] == "R-991133^718-7"
    assert hemoglobin["subject"] == report["subject"]
    assert hemoglobin["performer"][0]["display"] == "Century Hospital"
    assert by_code(result, "26464-8")["interpretation"][0]["coding"][0]["code"] == "HH"

    anisocytosis = by_code(result, "38892-6")["valueCodeableConcept"]
    assert anisocytosis["coding"][0] == {"system": SNOMED, "code": "260348001",
                                         "display": "Present ++ out of ++++"}
    assert anisocytosis["text"] == "Moderate Anisocytosis"
    assert by_code(result, "6742-1")["valueString"] == "Many spherocytes present."

    specimen = one(result, "Specimen")
    assert specimen["type"]["coding"][0]["code"] == "119297000"
    assert report["specimen"] == [hemoglobin["specimen"]]
    order = one(result, "ServiceRequest")
    assert order["requester"]["display"] == "Nicholas Radon"
    assert report["basedOn"] == hemoglobin["basedOn"]


def test_every_resource_is_a_provenance_target_and_the_raw_message_is_kept_verbatim() -> None:
    raw = sample_bytes("30")  # v2.2 with a ZPS Z-segment
    result = mapped(raw)
    binary = one(result, "Binary")
    assert binary["contentType"] == "x-application/hl7-v2+er7"
    assert base64.b64decode(binary["data"]) == raw
    assert b"ZPS|1|BN|LABCORP HOLDINGS" in base64.b64decode(binary["data"])
    provenance = one(result, "Provenance")
    targets = {t["reference"] for t in provenance["target"]}
    others = {e.full_url for e in result.entries
              if e.resource["resourceType"] not in {"Binary", "Provenance"}}
    assert targets == others
    assert provenance["entity"][0]["what"]["reference"] == next(
        e.full_url for e in result.entries if e.resource is binary)
    assert provenance["activity"]["coding"][0]["code"] == "R01"
    assert provenance["recorded"].startswith("2024-03-01T08:00:00")


def test_result_status_x_is_cancelled_with_a_data_absent_reason_and_ntes_become_notes() -> None:
    result = sample("30")
    cancelled = by_code(result, "150001")
    assert cancelled["status"] == "cancelled"
    assert cancelled["dataAbsentReason"]["coding"][0]["code"] == "not-performed"
    assert not any(k.startswith("value") for k in cancelled)
    assert by_code(result, "001719")["note"] == [
        {"text": "Result: NEGATIVE by EIA screen."}, {"text": "No antibodies to HIV-1 detected."}]


def test_invalid_birth_date_is_dropped_with_a_warning_not_a_rejection() -> None:
    result = sample("26")
    assert "birthDate" not in one(result, "Patient")
    assert [(w.code, w.segment, w.field, w.severity.value) for w in result.warnings] == [
        (102, "PID", 7, "W")]
    assert by_code(result, "1554-5")["valueQuantity"]["value"] == 182  # SN ^182
    assert by_code(result, "1553-5")["valueString"] == "182"  # FN: no FHIR type, kept as text


def _single_obx(kind: str, value: str, units: str = "") -> dict:
    raw = oru(results=[]).replace(b"\rSPM", (
        "\r" + segment("OBX", {1: "1", 2: kind, 3: "8888-8^Test value^LN", 5: value, 6: units,
                               11: "F"}) + "\rSPM").encode())
    return by_code(mapped(raw), "8888-8")


@pytest.mark.parametrize(("kind", "value", "units", "expected"), [
    ("NM", "7.25", "mmol/L^mmol/L^UCUM",
     {"valueQuantity": {"value": 7.25, "unit": "mmol/L", "system": UCUM, "code": "mmol/L"}}),
    ("NM", "<5", "U/L^U/L^UCUM",
     {"valueQuantity": {"value": 5, "unit": "U/L", "system": UCUM, "code": "U/L",
                        "comparator": "<"}}),
    ("ST", "Hemolyzed specimen", "", {"valueString": "Hemolyzed specimen"}),
    ("TX", "Line one~Line two", "", {"valueString": "Line one\nLine two"}),
    ("FT", "First\\.br\\Second", "", {"valueString": "First\nSecond"}),
    ("CWE", "10828004^Positive^SCT", "",
     {"valueCodeableConcept": {"coding": [{"system": SNOMED, "code": "10828004",
                                           "display": "Positive"}]}}),
    ("CE", "POS^Positive^HL70078", "",
     {"valueCodeableConcept": {"coding": [{
         "system": "http://terminology.hl7.org/CodeSystem/v2-0078", "code": "POS",
         "display": "Positive"}]}}),
    ("IS", "Y", "", {"valueCodeableConcept": {"coding": [{"code": "Y"}]}}),
    ("DT", "20240229", "", {"valueDateTime": "2024-02-29"}),
    ("DTM", "202402291315+0300", "", {"valueDateTime": "2024-02-29T13:15:00+03:00"}),
    ("TS", "20240229131502", "", {"valueDateTime": "2024-02-29T13:15:02Z"}),
    ("TM", "1315", "", {"valueTime": "13:15:00"}),
    ("DR", "20240101^20240131", "", {"valuePeriod": {"start": "2024-01-01",
                                                     "end": "2024-01-31"}}),
    ("NR", "3.5^5.1", "", {"valueRange": {"low": {"value": 3.5}, "high": {"value": 5.1}}}),
    ("SN", "^1^:^128", "", {"valueRatio": {"numerator": {"value": 1},
                                          "denominator": {"value": 128}}}),
    ("SN", "^1^/^40", "", {"valueRatio": {"numerator": {"value": 1},
                                         "denominator": {"value": 40}}}),
    ("SN", "^2^-^5", "/[HPF]^per high power field^UCUM",
     {"valueRange": {"low": {"value": 2, "unit": "per high power field", "system": UCUM,
                             "code": "/[HPF]"},
                     "high": {"value": 5, "unit": "per high power field", "system": UCUM,
                              "code": "/[HPF]"}}}),
    ("SN", "^2^+", "", {"valueString": "2+"}),
    ("SN", ">^200", "mg/dL^mg/dL^UCUM",
     {"valueQuantity": {"value": 200, "unit": "mg/dL", "system": UCUM, "code": "mg/dL",
                        "comparator": ">"}}),
    ("RP", "https://pacs.example.org/study/42^PACS^image^jpeg", "",
     {"extension": [{"url": "http://hl7.org/fhir/5.0/StructureDefinition/extension-"
                            "Observation.value",
                     "valueAttachment": {"url": "https://pacs.example.org/study/42",
                                         "contentType": "image/jpeg"}}]}),
    ("ED", "LAB^application^pdf^Base64^JVBERi0xLjQK", "",
     {"extension": [{"url": "http://hl7.org/fhir/5.0/StructureDefinition/extension-"
                            "Observation.value",
                     "valueAttachment": {"data": "JVBERi0xLjQK",
                                         "contentType": "application/pdf"}}]}),
])
def test_every_obx_value_type_maps_to_its_value_x(kind, value, units, expected) -> None:
    observation = _single_obx(kind, value, units)
    got = {k: v for k, v in observation.items() if k.startswith("value") or k == "extension"}
    assert got == expected
    validate_resource(observation)


def test_a_repeating_numeric_value_becomes_components() -> None:
    observation = _single_obx("NM", "60~120", "/min^/min^UCUM")
    assert [c["valueQuantity"]["value"] for c in observation["component"]] == [60, 120]
    assert observation["component"][0]["code"] == observation["code"]


def test_a_correction_targets_the_same_observation_as_the_original() -> None:
    final, corrected = mapped(oru("LAB-1", status="F")), mapped(oru("LAB-2", status="C"))
    glucose, fixed = by_code(final, "2345-7"), by_code(corrected, "2345-7")
    assert fixed["status"] == "corrected"
    assert one(corrected, "DiagnosticReport")["status"] == "corrected"
    assert request_of(final, glucose)["url"] == request_of(corrected, fixed)["url"]
    assert fixed["identifier"] == glucose["identifier"]


def test_placer_numbers_from_this_platform_use_the_lab_order_system() -> None:
    result = mapped(oru(placer="HP00AB12CD34EF", placer_namespace="HEALTHPLATFORM"))
    placer = one(result, "ServiceRequest")["identifier"][0]
    assert (placer["system"], placer["value"]) == ("urn:healthplatform:lab-order",
                                                   "HP00AB12CD34EF")


def test_an_obx_with_a_value_but_no_identifier_is_left_out_as_an_error_at_obx_3() -> None:
    raw = oru(results=[]).replace(b"\rSPM", b"\rOBX|1|NM|||42|mg||||||F\rSPM")
    result = mapped(raw)
    assert resources(result, "Observation") == []
    [error] = result.errors
    assert (error.code, error.segment, error.sequence, error.field, error.severity.value) \
        == (101, "OBX", 1, 3, "E")


def test_an_oru_without_obr_is_a_segment_sequence_error() -> None:
    raw = b"MSH|^~\\&|LIS|LAB|EHR|CLINIC|20240301||ORU^R01|X1|P|2.5.1\rPID|1||42^^^LAB^MR\r"
    with pytest.raises(MappingError) as failure:
        mapped(raw)
    assert failure.value.detail.code == 100


def test_mapping_twice_gives_the_same_bundle() -> None:
    assert mapped(oru()).bundle == mapped(oru()).bundle


# --- ADT ------------------------------------------------------------------------------------


def test_dense_adt_a01_maps_patient_encounter_and_the_patient_group() -> None:
    result = sample("04")
    patient = one(result, "Patient")
    entry = next(e for e in result.entries if e.resource is patient)
    assert entry.merge and entry.method == "PUT"
    assert entry.url.startswith("Patient?identifier=")
    assert patient["name"][0]["family"] == "EVERYMAN"
    assert patient["name"][0]["given"] == ["ADAM", "A"]
    assert patient["name"][0]["use"] == "usual"
    assert patient["birthDate"] == "1988-08-18"
    assert patient["_birthDate"]["extension"][0]["valueDateTime"] == "1988-08-18T11:26:00+02:15"
    encounter = one(result, "Encounter")
    assert encounter["status"] == "in-progress"
    assert encounter["class"]["code"] == "PRENC"
    assert [loc["status"] for loc in encounter["location"]] == ["active", "completed"]
    assert {p["type"][0]["coding"][0]["code"] for p in encounter["participant"]} >= {
        "ATND", "REF", "CON"}
    allergy = one(result, "AllergyIntolerance")
    assert allergy["code"]["coding"][0]["display"] == "PENICILLIN"
    assert (allergy["criticality"], allergy["onsetDateTime"]) == ("low", "2021-08-24")
    condition = one(result, "Condition")
    assert condition["code"]["coding"][0] == {"system": SNOMED, "code": "422504002",
                                              "display": "Ischemic stroke(disorder)"}
    assert encounter["diagnosis"][0]["condition"]["reference"] == next(
        e.full_url for e in result.entries if e.resource is condition)
    coverage = one(result, "Coverage")
    assert coverage["payor"][0]["display"] == "Blue Cross Blue Shield of Texas"
    assert coverage["period"] == {"start": "1989-10-01", "end": "2050-10-01"}
    assert one(result, "RelatedPerson")["name"][0]["family"] == "Evan"


def test_v23_adt_maps_visit_number_next_of_kin_and_three_insurances() -> None:
    result = sample("05")
    patient = one(result, "Patient")
    assert patient["identifier"][0]["value"] == "10006579"
    assert patient["address"] == [{"use": "home", "type": "postal", "line": ["111 DUCK ST"],
                                   "city": "FOWL", "state": "CA", "postalCode": "999990000"}]
    encounter = one(result, "Encounter")
    assert (encounter["class"]["code"], encounter["identifier"][0]["value"]) == ("IMP",
                                                                                 "40007716")
    assert len(resources(result, "Coverage")) == 3
    kin = one(result, "RelatedPerson")
    assert kin["name"][0] == {"family": "DUCK", "given": ["HUEY"]}
    assert kin["relationship"][0]["coding"][0]["code"] == "SO"


@pytest.mark.parametrize(("event", "discharge", "status"), [
    ("A01", "", "in-progress"), ("A02", "", "in-progress"),
    ("A03", "20240305120000+0300", "finished"), ("A04", "", "arrived"),
    ("A05", "", "planned"), ("A08", "", "in-progress"), ("A11", "", "cancelled"),
    ("A13", "", "in-progress"),
])
def test_encounter_status_follows_the_trigger_event(event, discharge, status) -> None:
    encounter = one(mapped(adt(event, f"E-{event}", discharge=discharge)), "Encounter")
    assert encounter["status"] == status


def test_person_events_update_the_patient_only() -> None:
    for event in ("A28", "A31"):
        result = mapped(adt(event, f"P-{event}"))
        assert resources(result, "Encounter") == []
        assert one(result, "Patient")["name"][0]["family"] == "Achieng"


def test_a40_merge_links_both_records_and_deactivates_the_old_one() -> None:
    raw = adt("A40", "M-1", patient="MRN-2", extra=["MRG|MRN-1^^^KISUMU HOSP^MR"])
    result = mapped(raw)
    survivor, prior = resources(result, "Patient")
    assert survivor["identifier"][0]["value"] == "MRN-2"
    assert (prior["active"], prior["identifier"][0]["value"]) == (False, "MRN-1")
    urls = {id(e.resource): e.full_url for e in result.entries}
    assert survivor["link"] == [{"other": {"reference": urls[id(prior)]}, "type": "replaces"}]
    assert prior["link"] == [{"other": {"reference": urls[id(survivor)]},
                              "type": "replaced-by"}]
    assert all(e.merge for e in result.entries if e.resource["resourceType"] == "Patient")


# --- orders, immunizations, scheduling, documents -------------------------------------------------


def test_orm_maps_a_service_request_merged_on_its_placer_number() -> None:
    result = sample("10")
    order = one(result, "ServiceRequest")
    entry = next(e for e in result.entries if e.resource is order)
    assert entry.merge and entry.url.startswith("ServiceRequest?identifier=")
    assert (order["status"], order["intent"]) == ("active", "order")
    assert order["code"]["coding"][0]["code"] == "24725-4"
    assert order["authoredOn"] == "2021-10-20T11:26:00+02:15"
    assert order["requester"]["display"] == "JONES A ORDPROVIDER"
    assert [i["value"] for i in order["identifier"]] == ["1101", "1201"]
    assert order["reasonReference"][0]["reference"] == next(
        e.full_url for e in result.entries if e.resource["resourceType"] == "Condition")
    answer = one(result, "Observation")
    assert order["supportingInfo"] == [{"reference": next(
        e.full_url for e in result.entries if e.resource is answer)}]


def test_oml_maps_the_order_with_its_specimen_and_coverage() -> None:
    result = sample("11")
    order = one(result, "ServiceRequest")
    assert order["identifier"][0]["system"] == "urn:oid:2.16.840.1.113883.3.72.5.24"
    assert order["code"]["coding"][0]["code"] == "6532-6"
    specimen = one(result, "Specimen")
    assert specimen["type"]["coding"][0]["display"] == "Serum"
    assert order["specimen"][0]["reference"] == next(
        e.full_url for e in result.entries if e.resource is specimen)
    assert one(result, "Coverage")["payor"][0]["display"] == "Lansing Health Care"


def test_vxu_maps_each_administration_to_an_immunization() -> None:
    result = sample("12")
    given, *historical = resources(result, "Immunization")
    assert given["vaccineCode"]["coding"][0] == {"system": "http://hl7.org/fhir/sid/ndc",
                                                 "code": "49281-0215-88", "display": "TENIVAC"}
    assert (given["status"], given["occurrenceDateTime"]) == ("completed", "2015-06-24")
    assert given["doseQuantity"] == {"value": 0.5, "unit": "mL", "system": UCUM, "code": "mL"}
    assert (given["lotNumber"], given["expirationDate"]) == ("315841", "2015-12-16")
    assert given["manufacturer"]["display"] == "Sanofi Pasteur"
    assert given["primarySource"] is True
    assert given["route"]["coding"][0]["code"] == "C28161"
    assert given["site"]["coding"][0]["code"] == "RD"
    assert given["fundingSource"]["coding"][0]["code"] == "PHC70"
    assert given["programEligibility"][0]["coding"][0]["code"] == "V01"
    assert given["education"][0]["presentationDate"] == "2015-06-24"
    assert [p["function"]["coding"][0]["code"] for p in given["performer"]] == ["AP", "OP"]
    assert given["identifier"][0]["value"] == "13696"
    assert [h["primarySource"] for h in historical] == [False, False]
    assert all("doseQuantity" not in h for h in historical)  # 999: unknown amount


def test_siu_maps_an_appointment_with_its_time_and_participants() -> None:
    result = sample("14")
    appointment = one(result, "Appointment")
    assert appointment["status"] == "booked"
    assert appointment["identifier"][0]["value"] == "36996"
    assert appointment["start"] == "2021-09-24T09:30:00+02:15"
    assert appointment["end"] == "2021-09-24T10:20:00+02:15"
    assert appointment["minutesDuration"] == 50
    assert appointment["serviceType"][0]["coding"][0]["code"] == "76164006"
    assert appointment["reasonCode"][0]["coding"][0]["code"] == "EMERGENCY"
    assert appointment["comment"] == "Appointment booked for emergency procedure"
    actors = [p["actor"].get("display") or p["actor"]["reference"][:8]
              for p in appointment["participant"]]
    assert actors == ["urn:uuid", "Robert C GE", "urn:uuid", "EVIS X12 Video Colonoscope"]
    assert all(p["status"] == "accepted" for p in appointment["participant"])


def test_v23_siu_takes_the_start_from_sch_11_and_the_end_from_the_duration() -> None:
    appointment = one(sample("22"), "Appointment")
    assert appointment["status"] == "arrived"
    assert (appointment["start"], appointment["end"]) == ("2008-03-06T10:00:00+00:00",
                                                          "2008-03-06T10:20:00+00:00")
    assert appointment["minutesDuration"] == 20


def test_siu_without_sch_is_a_segment_sequence_error() -> None:
    with pytest.raises(MappingError) as failure:
        sample("21")
    assert failure.value.detail.code == 100


def test_mdm_t04_joins_the_obx_text_into_the_document_content() -> None:
    result = sample("20")
    document = one(result, "DocumentReference")
    assert (document["status"], document["docStatus"]) == ("current", "final")
    assert document["masterIdentifier"]["value"] == "9528"
    assert document["author"][0]["display"] == "JOHN JOHNSON"
    text = base64.b64decode(document["content"][0]["attachment"]["data"]).decode()
    assert text.startswith("PATIENT NAME:\nSMITH, JOHN E.")
    assert "IMPRESSION/ASSESSMENT:" in text
    assert document["content"][0]["attachment"]["contentType"] == "text/plain; charset=utf-8"


def test_mdm_t02_points_at_the_dicom_study_and_warns_about_the_empty_pdf() -> None:
    result = sample("15")
    document = one(result, "DocumentReference")
    assert document["type"]["coding"][0]["code"] == "DI"
    assert document["date"] == "2008-01-31T15:55:00+02:15"
    assert document["content"] == [{"attachment": {"url": "urn:oid:1.2.840.317.5947431.51",
                                                   "title": "DICOM Study"}}]
    assert [(w.segment, w.field) for w in result.warnings] == [("OBX", 5)]


# --- data types ------------------------------------------------------------------------------


@pytest.mark.parametrize(("value", "expected"), [
    ("2024", "2024"), ("202402", "2024-02"), ("20240229", "2024-02-29"),
    ("2024022913", "2024-02-29T13:00:00Z"), ("202402291315", "2024-02-29T13:15:00Z"),
    ("20240229131502.25-0500", "2024-02-29T13:15:02.25-05:00"),
    ("20230229", None), ("2024023", None), ("196203520", None), ("20240101+1500", None),
])
def test_v2_timestamps_become_fhir_date_times(value, expected) -> None:
    assert fhir_datetime(value, UTC) == expected


def test_a_time_without_offset_is_read_in_the_gateway_zone() -> None:
    assert fhir_datetime("202403011015", ZoneInfo("Africa/Nairobi")) == \
        "2024-03-01T10:15:00+03:00"
    assert fhir_instant("20240301", UTC) is None
    assert fhir_date("19870412083000") == "1987-04-12"


def test_hd_names_a_system_by_its_universal_id_or_its_namespace() -> None:
    assert hd_system("NIST", "2.16.840.1.113883.3.72", "ISO") == "urn:oid:2.16.840.1.113883.3.72"
    assert hd_system("", "9F1C0E8A-1B2C-4D3E-8F90-A1B2C3D4E5F6", "UUID") == \
        "urn:uuid:9f1c0e8a-1b2c-4d3e-8f90-a1b2c3d4e5f6"
    assert hd_system("CITY LAB", "", "") == "urn:healthplatform:hl7v2:authority:CITY%20LAB"
    assert hd_system("", "", "") is None


def test_an_id_without_assigning_authority_is_scoped_to_the_sender() -> None:
    identifier = cx_identifier(rep("884422^^^^MR"), "KISUMU HOSP")
    assert identifier == {"system": "urn:healthplatform:hl7v2:KISUMU%20HOSP:MR",
                          "value": "884422",
                          "type": {"coding": [{"system": V2_0203, "code": "MR",
                                               "display": "Medical record number"}]}}


def test_names_and_telecoms() -> None:
    name = human_name(rep("Odhiambo&van^Amina^W^Jr^Dr^MD^L"), UTC)
    assert name == {"use": "official", "family": "Odhiambo", "given": ["Amina", "W"],
                    "prefix": ["Dr"], "suffix": ["Jr", "MD"]}
    assert contact_point(rep("^PRN^PH^^254^712^345678"), "home") == {
        "system": "phone", "value": "+254 (712) 345678", "use": "home"}
    assert contact_point(rep("^NET^Internet^amina@example.org"), "home") == {
        "system": "email", "value": "amina@example.org"}
    assert contact_point(rep("0712345678^ORN^CP"), "home") == {
        "system": "phone", "value": "0712345678", "use": "mobile"}


def test_conditions_escape_search_separators_and_url_encode_the_value() -> None:
    assert search_escape("a|b,c$d\\e") == "a\\|b\\,c\\$d\\\\e"
    assert identifier_condition({"system": "urn:x", "value": "4 East, bed B"}) == \
        "identifier=urn:x|4%20East%5C%2C%20bed%20B"


# A result as a laboratory set to a European locale sends it (HL7 v2.5.1 7.4.1 ORU^R01; NM,
# 2.A.47, has a decimal point only): the value keeps its number and unit, with a warning.
DECIMAL_COMMA_ORU = (
    "MSH|^~\\&|LIS|LABOR MITTE|KIS|KLINIKUM NORD|20240305091500+0100||ORU^R01^ORU_R01|"
    "LM-77120|P|2.5.1\r"
    "PID|1||4711^^^KLINIKUM NORD^PI||Becker^Anna||19720304|F\r"
    "OBR|1||LM-5531^LABOR MITTE|24326-1^Electrolytes panel^LN|||20240305080000+0100"
    "|||||||||||||||20240305091000+0100|||F\r"
    "OBX|1|NM|2951-2^Sodium [Moles/volume] in Serum or Plasma^LN||140,5|"
    "mmol/L^millimole per liter^UCUM|135,0-145,0|N|||F\r"
    "OBX|2|NM|2823-3^Potassium [Moles/volume] in Serum or Plasma^LN||<3,1|"
    "mmol/L^millimole per liter^UCUM|3,5-5,1|L|||F\r"
    "OBX|3|NM|26464-8^Leukocytes [#/volume] in Blood^LN||12,500|/uL^per microliter^UCUM"
    "|||||F\r"
)


def test_a_decimal_comma_is_read_as_a_number_with_its_unit_and_a_warning() -> None:
    result = mapped(DECIMAL_COMMA_ORU.encode())
    sodium = by_code(result, "2951-2")
    assert sodium["valueQuantity"] == {"value": 140.5, "unit": "millimole per liter",
                                       "system": UCUM, "code": "mmol/L"}
    assert sodium["referenceRange"][0]["low"]["value"] == 135.0
    assert sodium["referenceRange"][0]["high"]["value"] == 145.0
    potassium = by_code(result, "2823-3")
    assert (potassium["valueQuantity"]["value"], potassium["valueQuantity"]["comparator"]) \
        == (3.1, "<")
    # "12,500" may be twelve thousand five hundred: kept as text, never read as 12.5
    assert by_code(result, "26464-8")["valueString"] == "12,500"
    warned = {(w.segment, w.sequence, w.field, w.severity.value) for w in result.warnings}
    assert warned == {("OBX", 1, 5, "W"), ("OBX", 2, 5, "W"), ("OBX", 3, 5, "W")}
    assert any("'140,5' has a decimal comma; read as 140.5" in w.message
               for w in result.warnings)
