"""Probabilistic record linkage of patients (Fellegi-Sunter), with blocking.

A patient's :class:`Demographics` are read from a FHIR Patient (:func:`demographics`):
names normalised (accents and punctuation dropped, lower case) with their phonetic codes
(``jellyfish``: Metaphone and NYSIIS, which also fold transliteration variants such as
Mohamed / Mohammed / Muhammad), birth date, sex, phone in E.164 (``phonenumbers``),
e-mail, address line, city, postal code, national identifiers and MRNs.

Two records are compared field by field (:func:`compare`); each field lands on one
*level* of :data:`LEVELS` (``exact``, ``close``, ``phonetic``, ... ``different``; a field
missing on either side lands on none and weighs nothing). Every level has an ``m``
probability (of the level among true matches) and a ``u`` probability (among non-matches);
its weight is ``log2(m/u)``, the weights add up, and with the prior ``lambda`` (the chance
that a compared pair is a match, before comparing) give the match probability
(:meth:`Model.score`).
The m/u table is configuration (:data:`DEFAULT_MODEL`) or estimated from the data by
expectation-maximisation (:func:`estimate`, over the comparison vectors of blocked
pairs). String similarity is Jaro-Winkler and Damerau-Levenshtein from ``rapidfuzz``.

First and last names swapped are compared crosswise when that agrees better. A birth
date with day and month transposed, or the year one off, has a level of its own. A
national identifier that agrees is near-certain (weight ~ +13); one that disagrees counts
strongly against (~ -16: with names, birth date and sex agreeing the pair falls below
"possible"), a one-keystroke difference sits in between.

Blocking (:func:`blocking_keys`) keeps a lookup to a few dozen comparisons in an index of
100,000 patients: a pair is compared only when it shares a key (the same national id,
phone or e-mail; the same birth date; the same family-name code and birth year; the same
pair of name codes, in either order; the same postal code and family initial). A query
also asks the variants of its birth date (transposed, year ± 1). :class:`PatientIndex`
holds the demographics and blocks of a population in memory.
"""

from __future__ import annotations

import math
import re
import unicodedata
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import jellyfish
import numpy as np
import phonenumbers
from rapidfuzz.distance import DamerauLevenshtein, JaroWinkler

JSON = dict[str, Any]
V2_0203 = "http://terminology.hl7.org/CodeSystem/v2-0203"

# The levels of each compared field, best first; the last one is disagreement.
LEVELS: dict[str, tuple[str, ...]] = {
    "given": ("exact", "close", "phonetic", "similar", "different"),
    "family": ("exact", "close", "phonetic", "similar", "different"),
    "birth_date": ("exact", "transposed", "year_off", "one_part", "different"),
    "sex": ("same", "different"),
    "phone": ("same", "different"),
    "email": ("same", "different"),
    "address": ("exact", "close", "similar", "different"),
    "city": ("exact", "close", "different"),
    "postcode": ("same", "different"),
    "national_id": ("same", "typo", "different"),
    "mrn": ("same", "different"),
}
FIELDS = tuple(LEVELS)

# m and u per level: what a well-kept register looks like (about 1 record in 20 with a
# typo in a name, 1 in 50 in a birth date; a national id shared by nobody else). The
# bench estimates the same table by EM from the data and gets close to these.
DEFAULT_MODEL: dict[str, dict[str, tuple[float, float]]] = {
    "given": {"exact": (0.88, 0.004), "close": (0.05, 0.002), "phonetic": (0.03, 0.004),
              "similar": (0.02, 0.03), "different": (0.02, 0.96)},
    "family": {"exact": (0.88, 0.002), "close": (0.05, 0.001), "phonetic": (0.03, 0.002),
               "similar": (0.02, 0.02), "different": (0.02, 0.975)},
    "birth_date": {"exact": (0.90, 0.0005), "transposed": (0.02, 0.0001),
                   "year_off": (0.02, 0.0005), "one_part": (0.04, 0.02),
                   "different": (0.02, 0.979)},
    "sex": {"same": (0.97, 0.5), "different": (0.03, 0.5)},
    "phone": {"same": (0.80, 0.0001), "different": (0.20, 0.9999)},
    "email": {"same": (0.80, 0.0001), "different": (0.20, 0.9999)},
    "address": {"exact": (0.80, 0.001), "close": (0.08, 0.002), "similar": (0.05, 0.02),
                "different": (0.07, 0.977)},
    "city": {"exact": (0.85, 0.01), "close": (0.07, 0.005), "different": (0.08, 0.985)},
    "postcode": {"same": (0.90, 0.01), "different": (0.10, 0.99)},
    "national_id": {"same": (0.97998, 0.0001), "typo": (0.02, 0.0005),
                    "different": (0.00002, 0.9994)},
    "mrn": {"same": (0.60, 0.00001), "different": (0.40, 0.99999)},
}
DEFAULT_PRIOR = 1e-4  # the chance that a compared pair is a match, before comparing
BLOCK_LIMIT = 2_000  # a blocking key shared by more records is too common to narrow


# -- demographics ---------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Demographics:
    given: str = ""
    family: str = ""
    birth_date: str = ""  # YYYY-MM-DD (a partial date keeps what it has)
    sex: str = ""
    phone: str = ""  # E.164
    email: str = ""
    address: str = ""
    city: str = ""
    postcode: str = ""
    national_ids: frozenset[str] = frozenset()
    mrns: frozenset[tuple[str, str]] = frozenset()  # (system, value)
    codes: tuple[str, str, str, str] = ("", "", "", "")  # metaphone/nysiis given, family

    @classmethod
    def of(cls, **values: Any) -> Demographics:
        """Normalised demographics from raw values (the /api match form, the bench)."""
        given, family = normal_name(values.get("given")), normal_name(values.get("family"))
        return cls(given=given, family=family,
                   birth_date=str(values.get("birth_date") or "")[:10],
                   sex=str(values.get("sex") or "").lower(),
                   phone=e164(values.get("phone"), values.get("region") or "KE"),
                   email=str(values.get("email") or "").strip().lower(),
                   address=normal_text(values.get("address")),
                   city=normal_text(values.get("city")),
                   postcode=re.sub(r"\s+", "", str(values.get("postcode") or "")).upper(),
                   national_ids=frozenset(i for i in values.get("national_ids") or () if i),
                   mrns=frozenset(values.get("mrns") or ()),
                   codes=(*phonetic(given), *phonetic(family)))


def normal_text(value: Any) -> str:
    """Lower case, accents and punctuation dropped, spaces collapsed."""
    if not value:
        return ""
    text = unicodedata.normalize("NFKD", str(value))
    text = "".join(c for c in text if not unicodedata.combining(c)).lower()
    return " ".join(re.sub(r"[^a-z0-9]+", " ", text).split())


def normal_name(value: Any) -> str:
    return re.sub(r"[0-9]", "", normal_text(value)).strip()


def phonetic(name: str) -> tuple[str, str]:
    if not name:
        return "", ""
    first = name.split()[0]
    return jellyfish.metaphone(first), jellyfish.nysiis(first)


def e164(value: Any, region: str = "KE") -> str:
    """A phone number in E.164 (``+254712345678``), or "" when it is not one."""
    if not value:
        return ""
    try:
        number = phonenumbers.parse(str(value), region)
    except phonenumbers.NumberParseException:
        return ""
    if not phonenumbers.is_possible_number(number):
        return ""
    return phonenumbers.format_number(number, phonenumbers.PhoneNumberFormat.E164)


def _official_name(patient: JSON) -> JSON:
    names = [n for n in patient.get("name") or [] if isinstance(n, dict)]
    return next((n for n in names if n.get("use") == "official"), names[0] if names else {})


def _is_type(identifier: JSON, code: str) -> bool:
    return any(c.get("code") == code for c in (identifier.get("type") or {}).get("coding") or []
               if isinstance(c, dict))


def demographics(patient: JSON, national_systems: Iterable[str] = (),
                 region: str = "KE") -> Demographics:
    """The demographics of a FHIR Patient: national identifiers are those of the
    ``national_systems`` or typed NI (v2-0203), MRNs those typed MR."""
    name = _official_name(patient)
    given = " ".join(g for g in name.get("given") or [] if isinstance(g, str))
    telecom = [t for t in patient.get("telecom") or [] if isinstance(t, dict)]
    address = next((a for a in patient.get("address") or [] if isinstance(a, dict)), {})
    systems = set(national_systems)
    identifiers = [i for i in patient.get("identifier") or [] if isinstance(i, dict)
                   and i.get("value")]
    return Demographics.of(
        given=given, family=name.get("family"), birth_date=patient.get("birthDate"),
        sex=patient.get("gender"), region=region,
        phone=next((t.get("value") for t in telecom if t.get("system") == "phone"), None),
        email=next((t.get("value") for t in telecom if t.get("system") == "email"), None),
        address=" ".join(line for line in address.get("line") or [] if isinstance(line, str)),
        city=address.get("city"), postcode=address.get("postalCode"),
        national_ids=[str(i["value"]) for i in identifiers
                      if i.get("system") in systems or _is_type(i, "NI")],
        mrns=[(str(i.get("system")), str(i["value"])) for i in identifiers
              if _is_type(i, "MR")])


# -- comparing two records ----------------------------------------------------------------------
def _name_level(a: str, b: str, code_a: tuple[str, str], code_b: tuple[str, str]) -> int | None:
    if not a or not b:
        return None
    if a == b:
        return 0
    similarity = JaroWinkler.similarity(a, b)
    tokens_a, tokens_b = set(a.split()), set(b.split())
    if similarity >= 0.92 or tokens_a <= tokens_b or tokens_b <= tokens_a:
        return 1
    if (code_a[0] and code_a[0] == code_b[0]) or (code_a[1] and code_a[1] == code_b[1]):
        return 2
    return 3 if similarity >= 0.80 else 4


def _date_level(a: str, b: str) -> int | None:
    if len(a) < 10 or len(b) < 10:
        return None if not a or not b else (0 if a == b else 4)
    if a == b:
        return 0
    ya, ma, da = a[:4], a[5:7], a[8:10]
    yb, mb, db = b[:4], b[5:7], b[8:10]
    if ya == yb and ma == db and da == mb:
        return 1
    if ma == mb and da == db and ya.isdigit() and yb.isdigit() and abs(int(ya) - int(yb)) == 1:
        return 2
    return 3 if (ya == yb) + (ma == mb) + (da == db) == 2 else 4


def _same(a: str, b: str) -> int | None:
    if not a or not b:
        return None
    return 0 if a == b else 1


def _text_level(a: str, b: str, levels: int) -> int | None:
    if not a or not b:
        return None
    if a == b:
        return 0
    similarity = JaroWinkler.similarity(a, b)
    if similarity >= 0.90:
        return 1
    if levels == 4 and similarity >= 0.75:
        return 2
    return levels - 1


def _id_level(a: frozenset[str], b: frozenset[str]) -> int | None:
    if not a or not b:
        return None
    if a & b:
        return 0
    if any(DamerauLevenshtein.distance(x, y) <= 1 for x in a for y in b):
        return 1
    return 2


def _mrn_level(a: frozenset[tuple[str, str]], b: frozenset[tuple[str, str]]) -> int | None:
    if a & b:
        return 0
    # MRNs of different registers say nothing; the same register disagreeing does.
    return 1 if {s for s, _ in a} & {s for s, _ in b} else None


Vector = tuple[int | None, ...]  # one level index per field of FIELDS (None: missing)


def compare(a: Demographics, b: Demographics, *, swapped: bool = False) -> Vector:
    """The comparison vector of two records (names crosswise when ``swapped``)."""
    ga, fa, gb, fb = a.given, a.family, b.given, b.family
    ca_g, ca_f, cb_g, cb_f = a.codes[:2], a.codes[2:], b.codes[:2], b.codes[2:]
    if swapped:
        gb, fb, cb_g, cb_f = fb, gb, cb_f, cb_g
    return (
        _name_level(ga, gb, ca_g, cb_g),
        _name_level(fa, fb, ca_f, cb_f),
        _date_level(a.birth_date, b.birth_date),
        _same(a.sex, b.sex),
        _same(a.phone, b.phone),
        _same(a.email, b.email),
        _text_level(a.address, b.address, 4),
        _text_level(a.city, b.city, 3),
        _same(a.postcode, b.postcode),
        _id_level(a.national_ids, b.national_ids),
        _mrn_level(a.mrns, b.mrns),
    )


# -- the model -------------------------------------------------------------------------------
@dataclass(frozen=True)
class Scored:
    """A candidate's score against a query: probability, total weight, the fields that
    agreed (best level) and disagreed (worst level), and whether names were swapped."""

    id: str
    probability: float
    weight: float
    agreed: tuple[str, ...]
    disagreed: tuple[str, ...]
    levels: Mapping[str, str]
    names_swapped: bool = False


@dataclass
class Model:
    """m/u probabilities per field level and the prior (see the module docstring)."""

    m: dict[str, dict[str, float]]
    u: dict[str, dict[str, float]]
    prior: float = DEFAULT_PRIOR
    _weights: list[list[float]] = field(default_factory=list, repr=False)

    def __post_init__(self) -> None:
        for name in FIELDS:
            for level in LEVELS[name]:
                m, u = self.m[name][level], self.u[name][level]
                if not (0 < m <= 1 and 0 < u <= 1):
                    raise ValueError(f"m and u of {name}.{level} must be in (0, 1]")
        if not 0 < self.prior < 1:
            raise ValueError("the prior must be in (0, 1)")
        self._weights = [[math.log2(self.m[f][lv] / self.u[f][lv]) for lv in LEVELS[f]]
                         for f in FIELDS]

    @classmethod
    def from_table(cls, table: Mapping[str, Mapping[str, Sequence[float]]],
                   prior: float = DEFAULT_PRIOR) -> Model:
        """A model from ``{field: {level: [m, u]}}`` (fields or levels left out keep the
        defaults)."""
        unknown = set(table) - set(FIELDS)
        if unknown:
            raise ValueError(f"unknown MPI fields {sorted(unknown)}; known: {list(FIELDS)}")
        m: dict[str, dict[str, float]] = {}
        u: dict[str, dict[str, float]] = {}
        for name in FIELDS:
            levels = {**DEFAULT_MODEL[name], **{k: tuple(v) for k, v in
                                                 table.get(name, {}).items()}}
            m[name] = {lv: float(levels[lv][0]) for lv in LEVELS[name]}
            u[name] = {lv: float(levels[lv][1]) for lv in LEVELS[name]}
        return cls(m, u, prior)

    def weight(self, vector: Vector) -> float:
        return sum(self._weights[i][level] for i, level in enumerate(vector)
                   if level is not None)

    def probability(self, weight: float) -> float:
        odds = self.prior / (1 - self.prior) * 2.0 ** max(min(weight, 1000.0), -1000.0)
        return odds / (1 + odds)

    def score(self, record_id: str, a: Demographics, b: Demographics) -> Scored:
        straight = compare(a, b)
        crosswise = compare(a, b, swapped=True)
        weight, swapped = self.weight(straight), False
        if a.given and a.family and a.given != a.family \
                and (cross := self.weight(crosswise)) > weight:
            straight, weight, swapped = crosswise, cross, True
        levels = {f: LEVELS[f][lv] for f, lv in zip(FIELDS, straight, strict=True)
                  if lv is not None}
        agreed = tuple(f for f, lv in zip(FIELDS, straight, strict=True)
                       if lv is not None and self._weights[FIELDS.index(f)][lv] > 0)
        disagreed = tuple(f for f, lv in zip(FIELDS, straight, strict=True)
                          if lv is not None and self._weights[FIELDS.index(f)][lv] <= 0)
        return Scored(record_id, self.probability(weight), weight, agreed, disagreed,
                      levels, swapped)

    def table(self) -> dict[str, dict[str, list[float]]]:
        return {f: {lv: [round(self.m[f][lv], 6), round(self.u[f][lv], 6)]
                    for lv in LEVELS[f]} for f in FIELDS}


def estimate(vectors: Sequence[Vector], start: Model | None = None, *,
             iterations: int = 50, floor: float = 1e-6) -> Model:
    """Fellegi-Sunter m/u and prior estimated by expectation-maximisation from the
    comparison vectors of (blocked) candidate pairs, starting from ``start``."""
    model = start or Model.from_table({})
    if not vectors:
        return model
    data = np.array([[-1 if lv is None else lv for lv in v] for v in vectors], dtype=np.int16)
    m = [np.array([model.m[f][lv] for lv in LEVELS[f]]) for f in FIELDS]
    u = [np.array([model.u[f][lv] for lv in LEVELS[f]]) for f in FIELDS]
    prior = model.prior
    for _ in range(iterations):
        log_m = np.zeros(len(data))
        log_u = np.zeros(len(data))
        for i in range(len(FIELDS)):
            seen = data[:, i] >= 0
            levels = data[seen, i]
            log_m[seen] += np.log(m[i][levels])
            log_u[seen] += np.log(u[i][levels])
        diff = np.clip(np.log(1 - prior) + log_u - np.log(prior) - log_m, -700, 700)
        p = 1 / (1 + np.exp(diff))
        prior = float(np.clip(p.mean(), 1e-6, 1 - 1e-6))
        for i, name in enumerate(FIELDS):
            seen = data[:, i] >= 0
            count = len(LEVELS[name])
            if not seen.any():
                continue
            wm = np.bincount(data[seen, i], weights=p[seen], minlength=count) + floor
            wu = np.bincount(data[seen, i], weights=1 - p[seen], minlength=count) + floor
            m[i], u[i] = wm / wm.sum(), wu / wu.sum()
    return Model({f: dict(zip(LEVELS[f], map(float, m[i]), strict=True))
                  for i, f in enumerate(FIELDS)},
                 {f: dict(zip(LEVELS[f], map(float, u[i]), strict=True))
                  for i, f in enumerate(FIELDS)}, prior)


# -- blocking and the index ----------------------------------------------------------------------
def blocking_keys(d: Demographics) -> set[str]:
    """The keys a record is filed under (see the module docstring)."""
    keys = {f"nid:{n}" for n in d.national_ids}
    if d.phone:
        keys.add(f"tel:{d.phone}")
    if d.email:
        keys.add(f"mail:{d.email}")
    if d.birth_date:
        keys.add(f"dob:{d.birth_date}")
    _, given_code, _, family_code = d.codes
    if family_code and d.birth_date:
        keys.add(f"fy:{family_code}:{d.birth_date[:4]}")
    if given_code and family_code:
        keys.add("names:" + ":".join(sorted((given_code, family_code))))
    if d.postcode and d.family:
        keys.add(f"pc:{d.postcode}:{d.family[0]}")
    return keys


def query_keys(d: Demographics) -> set[str]:
    """The keys a query looks up: its own, and those of its birth date's variants."""
    keys = blocking_keys(d)
    date = d.birth_date
    if len(date) == 10 and date[:4].isdigit():
        year = int(date[:4])
        variants = {f"{date[:4]}-{date[8:10]}-{date[5:7]}",
                    f"{year - 1:04d}{date[4:]}", f"{year + 1:04d}{date[4:]}"}
        keys |= {f"dob:{v}" for v in variants if v != date}
        family_code = d.codes[3]
        if family_code:
            keys |= {f"fy:{family_code}:{y}" for y in (year - 1, year + 1)}
    return keys


class PatientIndex:
    """Demographics of a population and their blocks, in memory."""

    def __init__(self, block_limit: int = BLOCK_LIMIT) -> None:
        self.records: dict[str, Demographics] = {}
        self.blocks: dict[str, set[str]] = {}
        self.block_limit = block_limit

    def __len__(self) -> int:
        return len(self.records)

    def put(self, record_id: str, d: Demographics) -> None:
        self.remove(record_id)
        self.records[record_id] = d
        for key in blocking_keys(d):
            self.blocks.setdefault(key, set()).add(record_id)

    def remove(self, record_id: str) -> None:
        old = self.records.pop(record_id, None)
        if old is None:
            return
        for key in blocking_keys(old):
            members = self.blocks.get(key)
            if members is not None:
                members.discard(record_id)
                if not members:
                    del self.blocks[key]

    def candidates(self, d: Demographics) -> set[str]:
        found: set[str] = set()
        for key in query_keys(d):
            members = self.blocks.get(key)
            if members and len(members) <= self.block_limit:
                found |= members
        return found

    def match(self, model: Model, d: Demographics, *, threshold: float = 0.0,
              exclude: Iterable[str] = (), limit: int = 20) -> list[Scored]:
        """The candidates at or above ``threshold``, best first."""
        skip = set(exclude)
        scored = [model.score(cid, d, self.records[cid]) for cid in self.candidates(d)
                  if cid not in skip]
        kept = [s for s in scored if s.probability >= threshold]
        kept.sort(key=lambda s: (-s.weight, s.id))
        return kept[:limit]
