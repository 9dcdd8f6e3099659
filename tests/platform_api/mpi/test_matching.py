"""The record linkage model: comparison levels, weights, EM, blocking and the index."""

from __future__ import annotations

import random

import pytest

from platform_api.mpi.matching import (
    FIELDS,
    LEVELS,
    Demographics,
    Model,
    PatientIndex,
    compare,
    demographics,
    e164,
    estimate,
)

AMINA = Demographics.of(given="Amina", family="Odhiambo", birth_date="1988-04-12",
                        sex="female", phone="+254712345678")


def levels(a: Demographics, b: Demographics) -> dict[str, str]:
    return {f: LEVELS[f][lv] for f, lv in zip(FIELDS, compare(a, b), strict=True)
            if lv is not None}


def test_birth_dates_transposed_or_a_year_off_have_levels_of_their_own():
    assert levels(AMINA, Demographics.of(birth_date="1988-12-04"))["birth_date"] == "transposed"
    assert levels(AMINA, Demographics.of(birth_date="1987-04-12"))["birth_date"] == "year_off"
    assert levels(AMINA, Demographics.of(birth_date="1988-04-13"))["birth_date"] == "one_part"
    assert levels(AMINA, Demographics.of(birth_date="1971-09-30"))["birth_date"] == "different"


def test_names_fold_accents_and_transliterations_into_phonetic_agreement():
    assert levels(Demographics.of(given="Kwamé"), Demographics.of(given="kwame"))["given"] \
        == "exact"
    assert levels(Demographics.of(given="Mohamed"), Demographics.of(given="Muhammad"))[
        "given"] in ("close", "phonetic")
    assert levels(Demographics.of(family="Otieno"), Demographics.of(family="Mensah"))[
        "family"] == "different"


def test_phones_are_compared_in_e164():
    assert e164("0712 345 678", "KE") == "+254712345678"
    assert e164("not a phone") == ""
    local = Demographics.of(phone="0712-345-678", region="KE")
    assert levels(AMINA, local)["phone"] == "same"


def test_swapped_names_are_compared_crosswise():
    swapped = Demographics.of(given="Odhiambo", family="Amina", birth_date="1988-04-12",
                              sex="female")
    scored = Model.from_table({}).score("x", swapped, AMINA)
    assert scored.names_swapped and {"given", "family"} <= set(scored.agreed)


def test_a_national_id_agreeing_is_near_certain_and_disagreeing_counts_strongly_against():
    model = Model.from_table({})
    a = Demographics.of(family="Kiprop", national_ids=["29384756"])
    same = model.score("x", a, Demographics.of(family="Kiprop", national_ids=["29384756"]))
    typo = model.score("x", a, Demographics.of(family="Kiprop", national_ids=["29384765"]))
    other = model.score("x", a, Demographics.of(family="Kiprop", national_ids=["55501234"]))
    assert same.weight > typo.weight > 0 > other.weight
    assert same.weight - other.weight > 25


def test_a_model_from_configuration_is_checked():
    with pytest.raises(ValueError, match="unknown MPI fields"):
        Model.from_table({"shoe_size": {"same": [0.9, 0.1]}})
    with pytest.raises(ValueError, match="must be in"):
        Model.from_table({"sex": {"same": [0.0, 0.5]}})


def test_em_recovers_m_and_u_from_unlabelled_pairs():
    rng = random.Random(3)
    vectors = []
    for _ in range(4000):  # 20% matches: each name agrees 95% / 2%, dates 90% / 1%
        match = rng.random() < 0.2
        given, family = (0 if rng.random() < (0.95 if match else 0.02) else 4
                         for _ in range(2))
        born = 0 if rng.random() < (0.90 if match else 0.01) else 4
        vectors.append((given, family, born, None, None, None, None, None, None, None, None))
    model = estimate(vectors)
    assert model.prior == pytest.approx(0.2, abs=0.03)
    assert model.m["birth_date"]["exact"] == pytest.approx(0.9, abs=0.05)
    assert model.u["birth_date"]["exact"] == pytest.approx(0.01, abs=0.02)


def test_the_index_blocks_so_a_lookup_compares_few_records():
    index = PatientIndex()
    rng = random.Random(5)
    for n in range(2000):
        index.put(str(n), Demographics.of(
            given=rng.choice(("Baraka", "Juma", "Neema", "Zawadi")),
            family=rng.choice(("Mwangi", "Kamau", "Ouma", "Wekesa")),
            birth_date=f"19{rng.randint(40, 99)}-0{rng.randint(1, 9)}-1{rng.randint(0, 9)}"))
    index.put("amina", AMINA)
    query = Demographics.of(given="Amina", family="Odhiambo", birth_date="1988-12-04")
    assert len(index.candidates(query)) < 50
    found = index.match(Model.from_table({}), query, threshold=0.5)
    assert found[0].id == "amina"
    index.remove("amina")
    assert "amina" not in index.candidates(query)


def test_demographics_are_read_from_a_fhir_patient():
    patient = {"resourceType": "Patient", "id": "p1",
               "name": [{"use": "old", "family": "Ouma"},
                        {"use": "official", "family": "Odhiambo", "given": ["Amina", "W."]}],
               "telecom": [{"system": "phone", "value": "0712345678"},
                           {"system": "email", "value": "Amina@Example.org"}],
               "birthDate": "1988-04-12", "gender": "female",
               "address": [{"line": ["Kibera Drive 4"], "city": "Nairobi",
                            "postalCode": "00100"}],
               "identifier": [
                   {"system": "urn:oid:2.16.404.1.1", "value": "29384756"},
                   {"type": {"coding": [{"code": "MR"}]}, "system": "urn:kcc:mrn",
                    "value": "KCC-1"}]}
    d = demographics(patient, ["urn:oid:2.16.404.1.1"])
    assert (d.given, d.family, d.phone, d.email) == ("amina w", "odhiambo", "+254712345678",
                                                     "amina@example.org")
    assert d.national_ids == {"29384756"} and d.mrns == {("urn:kcc:mrn", "KCC-1")}
    assert (d.address, d.city, d.postcode) == ("kibera drive 4", "nairobi", "00100")
