"""Field-by-field comparison: given names as tokens (initials as initials, middle
initials, nicknames), birth dates (typo, transposition, a year off), one address field,
and symmetry."""

from __future__ import annotations

import random

from platform_api.mpi.comparison import FIELDS, LEVELS, compare, nicknames
from platform_api.mpi.demographics import Demographics


def levels(a: Demographics, b: Demographics) -> dict[str, str]:
    return {f: LEVELS[f][lv] for f, lv in zip(FIELDS, compare(a, b), strict=True)
            if lv is not None}


def given(a: str, b: str) -> str:
    return levels(Demographics.of(given=a), Demographics.of(given=b))["given"]


def born(a: str, b: str) -> str:
    return levels(Demographics.of(birth_date=a), Demographics.of(birth_date=b))["birth_date"]


def test_a_middle_initial_on_one_side_only_changes_nothing():
    assert given("Amina W.", "Amina") == "exact"
    assert given("Amina", "Amina Wanjiru") == "exact"


def test_middle_initials_that_differ_make_the_names_only_close():
    assert given("John A.", "John B.") == "close"


def test_a_lone_initial_is_compared_as_an_initial():
    assert given("J.", "James") == "initial"
    assert given("J. K.", "James Kamau") == "initial"
    assert given("P.", "James") == "different"


def test_nicknames_come_from_the_nicknames_table():
    assert nicknames("bill", "william") and nicknames("william", "bill")
    assert given("Bill", "William") == "nickname"
    assert given("Maggie", "Margaret") == "nickname"
    assert given("Wanjiku", "Achieng") == "different"


def test_transliterations_and_typos_are_close_or_phonetic():
    assert given("Mohamed", "Muhammad") in ("close", "phonetic")
    assert given("Kwame", "Kwmae") == "close"


def test_birth_date_levels():
    assert born("1984-03-07", "1984-03-07") == "exact"
    assert born("1984-03-07", "1984-07-03") == "transposed"
    assert born("1984-03-07", "1948-03-07") == "typo"  # two digits swapped
    assert born("1984-03-12", "1984-03-21") == "typo"
    assert born("2009-05-04", "2010-05-04") == "year_off"
    assert born("1984-03-07", "1984-03-19") == "one_part"
    assert born("1986-03-07", "2015-11-20") == "different"
    assert born("1986", "1986-03-07") == "one_part"


def test_the_address_is_one_field_with_the_area():
    home = Demographics.of(address="12 Ngong Road", city="Nairobi", postcode="00100")
    assert levels(home, Demographics.of(address="12 Ngong Rd", city="Nairobi"))[
        "address"] == "exact"
    assert levels(home, Demographics.of(address="40 Moi Avenue", city="Nairobi"))[
        "address"] == "area"
    assert levels(home, Demographics.of(address="112 Ngong Road", city="Nairobi"))[
        "address"] == "area"  # another house on the same road
    assert levels(home, Demographics.of(address="12 Ngong Road", city="Kisumu"))[
        "address"] == "similar"
    assert levels(home, Demographics.of(address="3 Oginga Odinga St", city="Kisumu"))[
        "address"] == "different"
    assert "city" not in FIELDS and "postcode" not in FIELDS


def test_every_level_is_symmetric():
    rng = random.Random(11)
    names = ["Amina", "Amina W.", "A.", "Bill", "William", "Mohamed", "Muhammad", ""]
    dates = ["1984-03-07", "1984-07-03", "1948-03-07", "1985-03-07", "", "1984"]
    for _ in range(300):
        a, b = (Demographics.of(given=rng.choice(names), family=rng.choice(names),
                                birth_date=rng.choice(dates), sex=rng.choice(("male", "")),
                                address=rng.choice(("12 Ngong Rd", "12 Ngong Road", "")),
                                city=rng.choice(("Nairobi", "")))
                for _ in range(2))
        assert compare(a, b) == compare(b, a)
