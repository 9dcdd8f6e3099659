"""Demographics as the index compares them: normalised names as tokens, phones in E.164,
addresses with their abbreviations spelt out, and what is read from a FHIR Patient."""

from __future__ import annotations

from platform_api.mpi.demographics import Demographics, demographics, e164, normal_address


def test_names_lose_accents_and_punctuation_and_keep_their_tokens():
    d = Demographics.of(given="Amina W.", family="Gebre-Medhin", birth_date="1988-04-12")
    assert (d.given, d.first_given, d.family) == ("amina w", "amina", "gebre medhin")
    assert Demographics.of(given="Kwamé").given == "kwame"


def test_a_lone_initial_has_no_phonetic_code_and_family_codes_ignore_spaces():
    assert Demographics.of(given="J.", family="Kamau").codes[:2] == ("", "")
    assert Demographics.of(family="Gebre Medhin").codes[2:] == \
        Demographics.of(family="Gebremedhin").codes[2:]


def test_phones_are_kept_in_e164_and_several_may_be_given():
    assert e164("0712 345 678", "KE") == "+254712345678"
    assert e164("not a phone") == ""
    d = Demographics.of(phone=["0712-345-678", "+254 733 000111"], region="KE")
    assert d.phones == {"+254712345678", "+254733000111"}


def test_address_abbreviations_are_spelt_out():
    assert normal_address("12 Ngong Rd.") == normal_address("12 ngong road") == \
        "12 ngong road"
    assert normal_address("P.O. Box 4, Moi Ave") == "box 4 moi avenue"


def test_demographics_are_read_from_a_fhir_patient():
    patient = {"resourceType": "Patient", "id": "p1",
               "name": [{"use": "old", "family": "Ouma"},
                        {"use": "official", "family": "Odhiambo", "given": ["Amina", "W."]}],
               "telecom": [{"system": "phone", "value": "0712345678"},
                           {"system": "phone", "value": "0733000111"},
                           {"system": "email", "value": "Amina@Example.org"}],
               "birthDate": "1988-04-12", "gender": "female",
               "address": [{"use": "old", "line": ["Kawangware 2"], "city": "Nairobi"},
                           {"line": ["Kibera Drive 4"], "city": "Nairobi",
                            "postalCode": "00100"}],
               "identifier": [
                   {"system": "urn:oid:2.16.404.1.1", "value": "29384756"},
                   {"type": {"coding": [{"code": "MR"}]}, "system": "urn:kcc:mrn",
                    "value": "KCC-1"}]}
    d = demographics(patient, ["urn:oid:2.16.404.1.1"])
    assert (d.given, d.family) == ("amina w", "odhiambo")
    assert d.phones == {"+254712345678", "+254733000111"}
    assert d.emails == {"amina@example.org"}
    assert d.national_ids == {"29384756"} and d.mrns == {("urn:kcc:mrn", "KCC-1")}
    assert (d.address, d.city, d.postcode) == ("kibera drive 4", "nairobi", "00100")
