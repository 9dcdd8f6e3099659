"""A small generated population for the linkage tests: households (a father and a son of
the same name, twins, siblings) and people registered again with a nickname, a middle
initial, a lone initial, a typo, a transposed or missing birth date, a new address or a
new phone. Each record knows its person and household."""

from __future__ import annotations

import random
from dataclasses import dataclass

from platform_api.mpi.demographics import Demographics

GIVEN = {"male": ["John", "James", "William", "Otieno", "Kamau", "Mohamed", "Baraka",
                  "Juma", "Peter", "Daniel"],
         "female": ["Mary", "Margaret", "Amina", "Wanjiku", "Achieng", "Grace", "Neema",
                    "Fatuma", "Elizabeth", "Zawadi"]}
FAMILY = ["Kamau", "Otieno", "Odhiambo", "Mwangi", "Wekesa", "Ouma", "Njoroge", "Abdi"]
NICK = {"William": "Bill", "Margaret": "Maggie", "Elizabeth": "Liz", "James": "Jim",
        "Daniel": "Dan", "Peter": "Pete"}


@dataclass(frozen=True)
class Entry:
    person: str
    household: str
    values: dict[str, str]

    def demographics(self) -> Demographics:
        return Demographics.of(**self.values)


def _person(rng: random.Random, given: str, family: str, sex: str, born: str, home: str,
            phone: str) -> dict[str, str]:
    return {"given": given, "family": family, "sex": sex, "birth_date": born,
            "address": home, "city": "Nairobi", "phone": phone}


def _again(rng: random.Random, values: dict[str, str]) -> dict[str, str]:
    copy = dict(values)
    change = rng.choice(("nickname", "middle", "initial", "typo", "transposed",
                         "no_birth_date", "moved", "new_phone", "none"))
    if change == "nickname" and copy["given"] in NICK:
        copy["given"] = NICK[copy["given"]]
    elif change == "middle":
        copy["given"] += " W."
    elif change == "initial":
        copy["given"] = copy["given"][0] + "."
    elif change == "typo":
        family = copy["family"]
        copy["family"] = family[:2] + family[3] + family[2] + family[4:]
    elif change == "transposed":
        y, m, d = copy["birth_date"].split("-")
        copy["birth_date"] = f"{y}-{d}-{m}" if int(d) <= 12 else copy["birth_date"]
    elif change == "no_birth_date":
        copy["birth_date"] = ""
    elif change == "moved":
        copy["address"] = f"{rng.randint(1, 99)} Jogoo Road"
    elif change == "new_phone":
        copy["phone"] = f"07{rng.randint(10_000_000, 99_999_999)}"
    return copy


def population(seed: int, households: int) -> dict[str, Entry]:
    rng = random.Random(seed)
    entries: dict[str, Entry] = {}
    people = 0
    for h in range(households):
        family = rng.choice(FAMILY)
        home, phone = f"{rng.randint(1, 400)} Ngong Road", f"07{rng.randint(10**7, 10**8 - 1)}"
        father_year = rng.randint(1950, 1985)
        father = _person(rng, rng.choice(GIVEN["male"]), family, "male",
                         f"{father_year}-0{rng.randint(1, 9)}-1{rng.randint(0, 9)}", home, phone)
        members = [father]
        son_year = father_year + rng.randint(22, 35)
        # a son named after his father, twins with different names, a sister
        members.append({**father, "birth_date": f"{son_year}-0{rng.randint(1, 9)}-2"
                        f"{rng.randint(0, 8)}"})
        twins_born = f"{son_year + 3}-1{rng.randint(0, 2)}-0{rng.randint(1, 9)}"
        twins = rng.sample(GIVEN["female"], 2)
        members += [_person(rng, twins[0], family, "female", twins_born, home, phone),
                    _person(rng, twins[1], family, "female", twins_born, home, phone)]
        for values in members:
            people += 1
            pid = f"person{people}"
            for n in range(rng.choice((1, 2, 2, 3))):
                record = values if n == 0 else _again(rng, values)
                entries[f"r{len(entries):04d}"] = Entry(pid, f"h{h}", record)
    return entries
