"""Two patients' demographics compared field by field.

Each field of a pair lands on one *level* of :data:`LEVELS`, best first; the first level
is agreement, the last disagreement, those between are partial agreement and are shown
as such (never as agreed): a nickname, a one-keystroke typo, a day and month transposed.
A field missing on either side lands on none and weighs nothing.

- **Given names** are tokens: the first given names are compared (a middle name or
  initial on one side only changes nothing; middle initials that differ make the names
  only *close*); a lone initial is compared as an initial (J and James: ``initial``, J
  and Peter: ``different``); nicknames come from the ``nicknames`` package's table
  (William / Bill: ``nickname``); then Jaro-Winkler ``close``, a shared name in another
  place (someone using their middle name), Metaphone / NYSIIS ``phonetic``,
  ``similar``, ``different``.
- **Family names** are compared whole with spaces dropped (Gebre Medhin / Gebremedhin).
- **Birth date**: ``exact``, ``typo`` (one of year, month, day one keystroke off:
  1984 / 1948, 12 / 13), ``transposed`` (day and month swapped), ``year_off`` (only the
  year, one off), ``one_part`` (one of them otherwise different), ``different``.
- **Address**: one field for line, city and postal code together (they are one piece of
  evidence): ``exact``, ``close`` (Jaro-Winkler, or the same words in another order;
  never with another house number),
  ``area`` (another line in the same city or postal code), ``similar``, ``different``.
- **Phones, e-mails, national ids, MRNs** are sets: ``same`` when they share one.

String similarity is Jaro-Winkler and Damerau-Levenshtein from ``rapidfuzz``.
"""

from __future__ import annotations

from functools import lru_cache

from nicknames import NickNamer
from rapidfuzz.distance import DamerauLevenshtein, JaroWinkler

from platform_api.mpi.demographics import Demographics

# The levels of each compared field, best first; the last one is disagreement.
LEVELS: dict[str, tuple[str, ...]] = {
    "given": ("exact", "nickname", "close", "initial", "phonetic", "similar", "different"),
    "family": ("exact", "close", "phonetic", "similar", "different"),
    "birth_date": ("exact", "typo", "transposed", "year_off", "one_part", "different"),
    "sex": ("same", "different"),
    "phone": ("same", "different"),
    "email": ("same", "different"),
    "address": ("exact", "close", "area", "similar", "different"),
    "national_id": ("same", "typo", "different"),
    "mrn": ("same", "different"),
}
FIELDS = tuple(LEVELS)
# Fields that people of one household share (the household rules of linkage.py).
CONTACT_FIELDS = ("phone", "email", "address")

Vector = tuple[int | None, ...]  # one level index per field of FIELDS (None: missing)


def level_index(field: str, level: str) -> int:
    return LEVELS[field].index(level)


_NICKNAMES = NickNamer()


@lru_cache(maxsize=65_536)
def nicknames(a: str, b: str) -> bool:
    """Whether two first names are one a nickname of the other, or both of one name."""
    if a in _NICKNAMES.nicknames_of(b) or b in _NICKNAMES.nicknames_of(a):
        return True
    return bool((_NICKNAMES.canonicals_of(a) | {a}) & (_NICKNAMES.canonicals_of(b) | {b}))


def _given_level(a: str, b: str, code_a: tuple[str, str], code_b: tuple[str, str]
                 ) -> int | None:
    if not a or not b:
        return None
    if a == b:
        return 0
    tokens_a, tokens_b = a.split(), b.split()
    first_a, first_b = tokens_a[0], tokens_b[0]
    if len(first_a) == 1 or len(first_b) == 1:
        return 3 if first_a[0] == first_b[0] else 6
    if first_a == first_b:
        # both have a middle name or initial, and they differ: not quite the same name
        if len(tokens_a) > 1 and len(tokens_b) > 1 and tokens_a[1][0] != tokens_b[1][0]:
            return 2
        return 0
    if nicknames(first_a, first_b):
        return 1
    similarity = JaroWinkler.similarity(first_a, first_b)
    if similarity >= 0.92 or set(tokens_a) & set(tokens_b):
        return 2
    if (code_a[0] and code_a[0] == code_b[0]) or (code_a[1] and code_a[1] == code_b[1]):
        return 4
    return 5 if similarity >= 0.80 else 6


def _family_level(a: str, b: str, code_a: tuple[str, str], code_b: tuple[str, str]
                  ) -> int | None:
    if not a or not b:
        return None
    joined_a, joined_b = a.replace(" ", ""), b.replace(" ", "")
    if joined_a == joined_b:
        return 0
    similarity = JaroWinkler.similarity(joined_a, joined_b)
    if similarity >= 0.92 or set(a.split()) & set(b.split()):
        return 1
    if (code_a[0] and code_a[0] == code_b[0]) or (code_a[1] and code_a[1] == code_b[1]):
        return 2
    return 3 if similarity >= 0.80 else 4


def _date_level(a: str, b: str) -> int | None:
    if not a or not b:
        return None
    if a == b:
        return 0
    if len(a) < 10 or len(b) < 10:  # a partial date agreeing with the other's beginning
        return 4 if a.startswith(b) or b.startswith(a) else 5
    parts_a, parts_b = (a[:4], a[5:7], a[8:10]), (b[:4], b[5:7], b[8:10])
    if parts_a[0] == parts_b[0] and parts_a[1] == parts_b[2] and parts_a[2] == parts_b[1]:
        return 2
    differing = [i for i in range(3) if parts_a[i] != parts_b[i]]
    if len(differing) != 1:
        return 5
    i = differing[0]
    if DamerauLevenshtein.distance(parts_a[i], parts_b[i]) <= 1:
        return 1
    if i == 0 and parts_a[0].isdigit() and parts_b[0].isdigit() \
            and abs(int(parts_a[0]) - int(parts_b[0])) == 1:
        return 3
    return 4


_DIFFERENT_DATE = LEVELS["birth_date"].index("different")


def date_disagrees(a: str, b: str) -> bool:
    """Whether two birth dates are entirely different (the last level)."""
    return _date_level(a, b) == _DIFFERENT_DATE


def _same(a: str, b: str) -> int | None:
    if not a or not b:
        return None
    return 0 if a == b else 1


def _shared(a: frozenset[str], b: frozenset[str]) -> int | None:
    if not a or not b:
        return None
    return 0 if a & b else 1


def _numbers(address: str) -> list[str]:
    return [token for token in address.split() if any(c.isdigit() for c in token)]


def _address_level(a: Demographics, b: Demographics) -> int | None:
    """One level for the whole address (line, city, postal code), which are not
    independent evidence: counting each would count one address three times."""
    area_known = bool((a.city and b.city) or (a.postcode and b.postcode))
    same_area = bool((a.city and a.city == b.city) or (a.postcode and a.postcode == b.postcode))
    if a.address and b.address:
        in_place = same_area or not area_known
        if a.address == b.address:
            return 0 if in_place else 3
        similarity = JaroWinkler.similarity(a.address, b.address)
        # another house number is another house, however alike the rest
        same_numbers = _numbers(a.address) == _numbers(b.address)
        if in_place and same_numbers and (similarity >= 0.90 or sorted(
                a.address.split()) == sorted(b.address.split())):
            return 1
        if same_area:
            return 2
        return 3 if similarity >= 0.75 and not area_known else 4
    if area_known:
        return 2 if same_area else 4
    return None


def _id_level(a: frozenset[str], b: frozenset[str]) -> int | None:
    if not a or not b:
        return None
    if a & b:
        return 0
    if any(DamerauLevenshtein.distance(x, y) <= 1 for x in a for y in b):
        return 1
    return 2


def _mrn_level(a: frozenset[tuple[str, str]], b: frozenset[tuple[str, str]]) -> int | None:
    if not a or not b:
        return None
    if a & b:
        return 0
    # MRNs of different registers say nothing; the same register disagreeing does.
    return 1 if {s for s, _ in a} & {s for s, _ in b} else None


def maybe_swapped(a: Demographics, b: Demographics) -> bool:
    """Whether one record's given name looks like the other's family name (then the
    names are worth comparing crosswise): a cheap test before the whole comparison."""
    if not (a.given and a.family and b.given and b.family):
        return False
    return (JaroWinkler.similarity(a.first_given, b.family) >= 0.8
            or JaroWinkler.similarity(a.family, b.first_given) >= 0.8)


def compare(a: Demographics, b: Demographics, *, swapped: bool = False) -> Vector:
    """The comparison vector of two records (``b``'s given and family names exchanged
    when ``swapped``). Every level is symmetric: ``compare(a, b)`` is ``compare(b, a)``
    (not so crosswise: ``a``'s given name meets ``b``'s family name there)."""
    ga, fa, gb, fb = a.given, a.family, b.given, b.family
    ca_g, ca_f, cb_g, cb_f = a.codes[:2], a.codes[2:], b.codes[:2], b.codes[2:]
    if swapped:
        gb, fb, cb_g, cb_f = fb, gb, cb_f, cb_g
    return (
        _given_level(ga, gb, ca_g, cb_g),
        _family_level(fa, fb, ca_f, cb_f),
        _date_level(a.birth_date, b.birth_date),
        _same(a.sex, b.sex),
        _shared(a.phones, b.phones),
        _shared(a.emails, b.emails),
        _address_level(a, b),
        _id_level(a.national_ids, b.national_ids),
        _mrn_level(a.mrns, b.mrns),
    )
