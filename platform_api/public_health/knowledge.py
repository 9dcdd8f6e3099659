"""The public-health knowledge the area interprets, kept as data (``data/``): the WHO IDSR
priority diseases, the syndromes and the signs they are made of, the EARS parameters,
and the mapping of counts to a DHIS2 instance's data elements.

Loaded once, on first use; ``HEALTHPLATFORM_HMIS_MAPPING_FILE`` replaces the shipped
mapping with a deployment's own (its DHIS2 instance's UIDs). A mapping that names a
disease or syndrome the platform does not know, or has no open last age group, is
refused with a message naming it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

DATA = Path(__file__).parent / "data"
JSON = dict[str, Any]


@dataclass(frozen=True)
class Disease:
    key: str
    name: str
    icd10: tuple[str, ...]
    reporting: str  # immediate | weekly | monthly
    episode_days: int | None  # None: one case per patient, ever


@dataclass(frozen=True)
class VitalSign:
    loinc: frozenset[str]
    unit: str
    at_least: float | None = None
    at_most: float | None = None

    def holds(self, value: float) -> bool:
        return (self.at_least is None or value >= self.at_least) and \
            (self.at_most is None or value <= self.at_most)


@dataclass(frozen=True)
class Sign:
    name: str
    words: tuple[str, ...] = ()
    icd10: tuple[str, ...] = ()
    snomed: frozenset[str] = frozenset()
    vitals: tuple[VitalSign, ...] = ()
    encounter_class: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Syndrome:
    code: str
    name: str
    signs: tuple[str, ...]  # all of them
    definition: str


@dataclass(frozen=True)
class EarsParameters:
    baseline_days: int
    c2_guard_days: int
    c1_threshold: float
    c2_threshold: float
    c3_threshold: float
    c3_excess: float
    min_sigma: float
    min_count: int


@dataclass(frozen=True)
class AgeGroup:
    label: str
    below_years: int | None
    category_option_combo: str


@dataclass(frozen=True)
class HmisMapping:
    org_unit_system: str
    default_category_option_combo: str
    cases_data_set: str
    age_groups: tuple[AgeGroup, ...]
    disease_elements: dict[str, dict[str, str]]  # disease → {"cases": uid, "deaths": uid}
    syndromes_data_set: str
    syndrome_elements: dict[str, str]


def _read(path: Path) -> JSON:
    with path.open("rb") as handle:
        return json.load(handle)  # type: ignore[no-any-return]


@cache
def diseases() -> dict[str, Disease]:
    data = _read(DATA / "idsr_diseases.json")
    default = data["default_episode_days"]
    return {d["key"]: Disease(d["key"], d["name"], tuple(d["icd10"]), d["reporting"],
                              d.get("episode_days", default))
            for d in data["diseases"]}


@cache
def _syndrome_data() -> JSON:
    return _read(DATA / "syndromes.json")


@cache
def signs() -> dict[str, Sign]:
    found = {}
    for name, sign in _syndrome_data()["signs"].items():
        vitals = tuple(VitalSign(frozenset(v["loinc"]), v["unit"], v.get("at_least"),
                                 v.get("at_most")) for v in sign.get("vitals", ()))
        found[name] = Sign(name, tuple(w.lower() for w in sign.get("words", ())),
                           tuple(sign.get("icd10", ())), frozenset(sign.get("snomed", ())),
                           vitals, frozenset(sign.get("encounter_class", ())))
    return found


@cache
def syndromes() -> dict[str, Syndrome]:
    known = signs()
    found = {}
    for s in _syndrome_data()["syndromes"]:
        missing = [sign for sign in s["all"] if sign not in known]
        if missing:
            raise ValueError(f"syndrome {s['code']!r} names unknown signs {missing}")
        found[s["code"]] = Syndrome(s["code"], s["name"], tuple(s["all"]), s["definition"])
    return found


@cache
def negations() -> tuple[str, ...]:
    return tuple(_syndrome_data()["negations"])


@cache
def ears_parameters() -> EarsParameters:
    e = _syndrome_data()["ears"]
    return EarsParameters(e["baseline_days"], e["c2_guard_days"], e["c1_threshold"],
                          e["c2_threshold"], e["c3_threshold"], e["c3_excess"],
                          e["min_sigma"], e["min_count"])


@cache
def hmis_mapping(path: str = "") -> HmisMapping:
    """The mapping of ``path`` (empty: the shipped one), checked against the diseases and
    syndromes it names."""
    data = _read(Path(path) if path else DATA / "hmis_mapping.json")
    cases, synd = data["cases"], data["syndromes"]
    unknown = [k for k in cases["data_elements"] if k not in diseases()] + \
        [k for k in synd["data_elements"] if k not in syndromes()]
    if unknown:
        raise ValueError(f"the HMIS mapping names unknown diseases or syndromes: {unknown}")
    groups = tuple(AgeGroup(g["label"], g["below_years"], g["category_option_combo"])
                   for g in cases["age_groups"])
    if not groups or groups[-1].below_years is not None:
        raise ValueError("the HMIS mapping's last age group must be open (below_years null)")
    return HmisMapping(data["org_unit_system"], data["default_category_option_combo"],
                       cases["data_set"], groups, dict(cases["data_elements"]),
                       synd["data_set"], dict(synd["data_elements"]))
