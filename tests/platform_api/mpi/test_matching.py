"""The Fellegi-Sunter model, EM and the blocked index: symmetric scores, partial agreement
shown as such, a national id's weight, and blocking that finds both ways."""

from __future__ import annotations

import random

import pytest

from platform_api.mpi.demographics import Demographics
from platform_api.mpi.matching import Model, PatientIndex, estimate

AMINA = Demographics.of(given="Amina", family="Odhiambo", birth_date="1988-04-12",
                        sex="female", phone="+254712345678")


def test_a_transposed_birth_date_is_partial_agreement_never_agreement():
    scored = Model.from_table({}).score("x", AMINA, Demographics.of(
        given="Amina", family="Odhiambo", birth_date="1988-12-04", sex="female"))
    assert scored.levels["birth_date"] == "transposed"
    assert "birth_date" in scored.partial and "birth_date" not in scored.agreed


def test_swapped_names_are_compared_crosswise():
    swapped = Demographics.of(given="Odhiambo", family="Amina", birth_date="1988-04-12",
                              sex="female")
    scored = Model.from_table({}).score("x", swapped, AMINA)
    assert scored.names_swapped and {"given", "family"} <= set(scored.agreed)


def test_a_score_does_not_depend_on_which_record_comes_first():
    model = Model.from_table({})
    rng = random.Random(4)
    people = [Demographics.of(given=rng.choice(("Amina", "Odhiambo", "A.", "Mohamed")),
                              family=rng.choice(("Odhiambo", "Amina", "Otieno")),
                              birth_date=rng.choice(("1988-04-12", "1988-12-04", "")),
                              sex=rng.choice(("female", "male", "")))
              for _ in range(40)]
    for a in people:
        for b in people:
            assert model.score("x", a, b).weight == model.score("x", b, a).weight


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
        given, family = (0 if rng.random() < (0.95 if match else 0.02) else 6
                         for _ in range(2))
        family = min(family, 4)
        born = 0 if rng.random() < (0.90 if match else 0.01) else 5
        vectors.append((given, family, born, None, None, None, None, None, None))
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


def test_blocking_finds_both_ways():
    """``a`` is a candidate of ``b`` exactly when ``b`` is one of ``a`` (what makes the
    clusters independent of arrival order)."""
    rng = random.Random(9)
    index = PatientIndex()
    for n in range(400):
        year = rng.randint(1980, 1983)
        month, day = rng.randint(1, 12), rng.randint(1, 12)
        index.put(str(n), Demographics.of(
            given=rng.choice(("Juma", "J.", "Neema", "")),
            family=rng.choice(("Mwangi", "Ouma", "")),
            birth_date=rng.choice((f"{year}-{month:02d}-{day:02d}", "")),
            phone=rng.choice(("", "0712000001", "0712000002")),
            address=rng.choice(("", "4 Moi Avenue", "4 Moi Ave"))))
    for a, record in index.records.items():
        for b in index.candidates(record):
            assert a in index.candidates(index.records[b])


def test_namesakes_born_in_another_year_are_not_compared_but_those_without_a_date_are():
    index = PatientIndex()
    index.put("namesake", Demographics.of(given="Amina", family="Odhiambo",
                                          birth_date="1961-09-30"))
    index.put("undated", Demographics.of(given="Amina", family="Odhiambo"))
    index.put("same-phone", Demographics.of(given="Amina", family="Odhiambo",
                                            birth_date="1961-09-30", phone="0712345678"))
    assert index.candidates(AMINA) == {"undated", "same-phone"}
