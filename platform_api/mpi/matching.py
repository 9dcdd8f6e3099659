"""Probabilistic record linkage of patients (Fellegi-Sunter), with blocking.

Two records' :class:`~platform_api.mpi.demographics.Demographics` are compared field by
field (:func:`~platform_api.mpi.comparison.compare`: each field lands on a level). Every
level has an ``m`` probability (of the level among true matches) and a ``u`` probability
(among non-matches); its weight is ``log2(m/u)``, the weights add up, and with the prior
``lambda`` (the chance that a compared pair is a match, before comparing) give the match
probability (:meth:`Model.score`). Scoring is symmetric: which record of a pair came
first never changes its score.
The m/u table is configuration (:data:`DEFAULT_MODEL`) or estimated from the data by
expectation-maximisation (:func:`estimate`, over the comparison vectors of blocked
pairs).

First and last names swapped are compared crosswise when that agrees better. A national
identifier that agrees is near-certain (weight ~ +13); one that disagrees counts strongly
against (~ -16: with names, birth date and sex agreeing the pair falls below "possible"),
a one-keystroke difference sits in between.

Blocking (:func:`blocking_keys`) keeps a lookup to a few dozen comparisons in an index of
100,000 patients: a pair is compared only when it shares a key (a national id, phone or
e-mail; the birth date; the family name's code and birth year; the first given and the
family name's codes, in either order; the normalised address). A query also asks the
variants of its birth date (transposed, year ± 1): as the variant relation is symmetric,
so is blocking (``a`` finds ``b`` exactly when ``b`` finds ``a``), which the
order-independent clustering of :mod:`.linkage` needs.
:class:`PatientIndex` holds the demographics, owners and blocks of a population in
memory.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from platform_api.mpi.comparison import (
    FIELDS,
    LEVELS,
    Vector,
    compare,
    date_disagrees,
    maybe_swapped,
)
from platform_api.mpi.demographics import Demographics

JSON = dict[str, Any]

# m and u per level: what a well-kept register looks like (about 1 record in 20 with a
# typo in a name, 1 in 50 in a birth date; a national id shared by nobody else). The
# bench estimates the same table by EM from the data and gets close to these.
DEFAULT_MODEL: dict[str, dict[str, tuple[float, float]]] = {
    "given": {"exact": (0.86, 0.004), "nickname": (0.02, 0.0005), "close": (0.04, 0.002),
              "initial": (0.02, 0.0015), "phonetic": (0.03, 0.004), "similar": (0.01, 0.03),
              "different": (0.02, 0.958)},
    "family": {"exact": (0.88, 0.002), "close": (0.05, 0.001), "phonetic": (0.03, 0.002),
               "similar": (0.02, 0.02), "different": (0.02, 0.975)},
    "birth_date": {"exact": (0.88, 0.0005), "typo": (0.03, 0.002),
                   "transposed": (0.015, 0.0001), "year_off": (0.02, 0.0005),
                   "one_part": (0.025, 0.02), "different": (0.03, 0.9769)},
    "sex": {"same": (0.97, 0.5), "different": (0.03, 0.5)},
    "phone": {"same": (0.80, 0.0001), "different": (0.20, 0.9999)},
    "email": {"same": (0.80, 0.0001), "different": (0.20, 0.9999)},
    "address": {"exact": (0.75, 0.0005), "close": (0.08, 0.0005), "area": (0.07, 0.1),
                "similar": (0.02, 0.01), "different": (0.08, 0.8885)},
    "national_id": {"same": (0.97998, 0.0001), "typo": (0.02, 0.0005),
                    "different": (0.00002, 0.9994)},
    "mrn": {"same": (0.60, 0.00001), "different": (0.40, 0.99999)},
}
DEFAULT_PRIOR = 1e-4  # the chance that a compared pair is a match, before comparing
BLOCK_LIMIT = 2_000  # a blocking key shared by more records is too common to narrow
NAME_KEYS = ("names:", "fy:")  # the keys many records share (see PatientIndex.candidates)


# -- the model -------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Scored:
    """A candidate's score against a query: probability, total weight, the level of each
    field, and which fields agreed (first level), agreed in part (a level between:
    a nickname, a typo, a transposed birth date) and disagreed (weight at most 0)."""

    id: str
    probability: float
    weight: float
    agreed: tuple[str, ...]
    partial: tuple[str, ...]
    disagreed: tuple[str, ...]
    levels: Mapping[str, str]
    names_swapped: bool = False
    vector: Vector = ()


# (levels, vector, weight) → the weight to use (the household rule of linkage.py)
Adjust = Callable[[Mapping[str, str], Vector, float], float]


def _key(vector: Vector) -> tuple[int, ...]:
    return tuple(-1 if level is None else level for level in vector)


@dataclass
class Model:
    """m/u probabilities per field level and the prior (see the module docstring)."""

    m: dict[str, dict[str, float]]
    u: dict[str, dict[str, float]]
    prior: float = DEFAULT_PRIOR
    _weights: list[list[float]] = field(default_factory=list, repr=False)
    _kinds: list[list[int]] = field(default_factory=list, repr=False)

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
        # per field and level: 0 agreement (the first level), 1 partial (positive
        # weight), 2 disagreement
        self._kinds = [[0 if n == 0 else 1 if w > 0 else 2 for n, w in enumerate(weights)]
                       for weights in self._weights]

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

    def weight(self, vector: Vector, ignore: Iterable[int] = ()) -> float:
        """The weight of a comparison vector (fields at the positions ``ignore`` left
        out, as if missing)."""
        skip = set(ignore)
        weights = self._weights
        total = 0.0
        for i, level in enumerate(vector):
            if level is not None and i not in skip:
                total += weights[i][level]
        return total

    def level_weight(self, field_index: int, level: int) -> float:
        return self._weights[field_index][level]

    def probability(self, weight: float) -> float:
        odds = self.prior / (1 - self.prior) * 2.0 ** max(min(weight, 1000.0), -1000.0)
        return odds / (1 + odds)

    def score(self, record_id: str, a: Demographics, b: Demographics,
              adjust: Adjust | None = None) -> Scored:
        """``b`` (whose id is ``record_id``) scored against ``a``; the same whichever of
        the two is ``a`` (every level is symmetric; crosswise both ways are tried).
        ``adjust`` may change the weight once the levels are known."""
        vector = compare(a, b)
        weight, swapped = self.weight(vector), False
        if maybe_swapped(a, b):
            # both ways crosswise (a's given name with b's family name, and the other
            # way), the better kept: the score stays symmetric
            for crosswise in (compare(a, b, swapped=True), compare(b, a, swapped=True)):
                cross = self.weight(crosswise)
                if cross > weight or (swapped and cross == weight and _key(crosswise) <
                                      _key(vector)):
                    vector, weight, swapped = crosswise, cross, True
        levels: dict[str, str] = {}
        kinds: tuple[list[str], list[str], list[str]] = ([], [], [])  # agreed, partial, not
        for i, level in enumerate(vector):
            if level is not None:
                name = FIELDS[i]
                levels[name] = LEVELS[name][level]
                kinds[self._kinds[i][level]].append(name)
        agreed, partial, disagreed = kinds
        if adjust is not None:
            weight = adjust(levels, vector, weight)
        return Scored(record_id, self.probability(weight), weight, tuple(agreed),
                      tuple(partial), tuple(disagreed), levels, swapped, vector)

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
    keys |= {f"tel:{p}" for p in d.phones}
    keys |= {f"mail:{e}" for e in d.emails}
    if d.birth_date:
        keys.add(f"dob:{d.birth_date}")
    _, given_code, _, family_code = d.codes
    if family_code and d.birth_date:
        keys.add(f"fy:{family_code}:{d.birth_date[:4]}")
    if given_code and family_code:
        keys.add("names:" + ":".join(sorted((given_code, family_code))))
    if d.address:
        keys.add(f"addr:{d.address}")
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
    return keys


class PatientIndex:
    """Demographics of a population, their owners (organizations) and blocks, in
    memory."""

    def __init__(self, block_limit: int = BLOCK_LIMIT) -> None:
        self.records: dict[str, Demographics] = {}
        self.owners: dict[str, frozenset[str]] = {}
        self.blocks: dict[str, set[str]] = {}
        self.block_limit = block_limit

    def __len__(self) -> int:
        return len(self.records)

    def __contains__(self, record_id: object) -> bool:
        return record_id in self.records

    def put(self, record_id: str, d: Demographics, owners: frozenset[str] = frozenset()
            ) -> None:
        old = self.records.get(record_id)
        if old == d:
            self.owners[record_id] = owners
            return
        self.remove(record_id)
        self.records[record_id] = d
        self.owners[record_id] = owners
        for key in blocking_keys(d):
            self.blocks.setdefault(key, set()).add(record_id)

    def remove(self, record_id: str) -> None:
        old = self.records.pop(record_id, None)
        self.owners.pop(record_id, None)
        if old is None:
            return
        for key in blocking_keys(old):
            members = self.blocks.get(key)
            if members is not None:
                members.discard(record_id)
                if not members:
                    del self.blocks[key]

    def candidates(self, d: Demographics) -> set[str]:
        """The records sharing a key with ``d``; of those met only through a name key
        (many share a name), those whose birth date is entirely different are left out:
        such a pair can score "possible" at most, never a link or a review (what it would
        need, a phone, an e-mail, an address, a national id, finds it through its own
        key), and there are many of them in a large index."""
        found: set[str] = set()
        by_name: set[str] = set()
        for key in query_keys(d):
            members = self.blocks.get(key)
            if members and len(members) <= self.block_limit:
                (by_name if key.startswith(NAME_KEYS) else found).update(members)
        if len(d.birth_date) == 10:
            records = self.records
            by_name = {m for m in by_name - found
                       if not date_disagrees(d.birth_date, records[m].birth_date)}
        return found | by_name

    def match(self, model: Model, d: Demographics, *, threshold: float = 0.0,
              exclude: Iterable[str] = (), limit: int = 20) -> list[Scored]:
        """The candidates at or above ``threshold``, best first."""
        skip = set(exclude)
        scored = [model.score(cid, d, self.records[cid]) for cid in self.candidates(d)
                  if cid not in skip]
        kept = [s for s in scored if s.probability >= threshold]
        kept.sort(key=lambda s: (-s.weight, s.id))
        return kept[:limit]


__all__ = ["DEFAULT_MODEL", "Demographics", "Model", "PatientIndex", "Scored",
           "blocking_keys", "estimate", "query_keys"]
