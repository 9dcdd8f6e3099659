"""Which records are one person: pairs judged with the household rules, and clusters
formed the same whatever order the records came in.

**A pair** (:meth:`Linker.pair`) is scored by the model and then judged:

- *Household.* Two records with the same family name that share a phone, an e-mail or
  an address may be two people of one household (a father and his son of the same
  name, twins, siblings). For them the shared contact details are evidence of the
  household, not of the person, and are left out of the score (but for the strongest
  one when a birth date is missing); and the pair is never linked automatically when a
  birth date is missing, when the birth dates differ beyond a one-keystroke typo or a
  day and month transposition, when the sexes differ, or when the birth dates are the
  same but the given names differ by more than a nickname or a typo (twins; a lone
  initial may be either twin's). A shared
  national id lifts none of these (a child's record often carries a parent's id). A typo
  in the birth date with given names that are not the same (or a nickname) waits for
  review.
- *Holds* keep a certain pair for review instead of an automatic link: the household
  rule, sexes that differ, national ids that differ, a birth date that agrees only in
  part (a day and month transposed is never agreement) or is missing on either side
  (unless a national id agrees), given names that differ (unless a national id agrees),
  and records of different organizations (unless ``across_organizations``).
- *Grades* follow the probability (``Rules``), but a certain pair held for any reason
  but its organizations is graded ``probable``: ``certain`` means the index would link
  it by itself.
- *Conflicts* (the household rule, sexes or national ids that differ, birth dates
  entirely different, organizations that differ when links may not cross them, a
  score below "possible", a person's rejection or undone link) keep two records apart
  even through a third: no automatic cluster holds a conflicting pair.

**Clusters** (:meth:`Linker.cluster`): the pairs a person linked join first; then the
automatic pairs, strongest first (ties broken by the records' contents, never their ids
or arrival), each joining two clusters only when no pair across them conflicts. The
record created first (and not merged away by a person) is the golden record. As the
order of the pairs depends only on the records, and blocking is symmetric, the clusters
of a population are the same whatever order its records came in; and the clusters of a
neighbourhood closed under automatic pairs and existing links
(:meth:`Linker.neighbourhood`) are those the whole population would give it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from platform_api.mpi.comparison import CONTACT_FIELDS, FIELDS, Vector
from platform_api.mpi.demographics import Demographics
from platform_api.mpi.matching import Model, PatientIndex, Scored

_CONTACT = tuple(FIELDS.index(f) for f in CONTACT_FIELDS)
# Levels that say two records share a household's contact details.
_SHARED_CONTACT = {"phone": {"same"}, "email": {"same"}, "address": {"exact", "close"}}
_SAME_FAMILY = {"exact", "close", "phonetic"}
_SAME_GIVEN = {"exact", "nickname"}
# a typo, not another name (a lone initial may be either twin's: J. for John or James)
_TWIN_GIVEN = {"exact", "nickname", "close"}
# In a household, birth dates this close may be one person's (a transposition is still
# never agreement: it waits for review, see _hold)
_HOUSEHOLD_BIRTH_DATES = {"exact", "typo", "transposed"}


@dataclass(frozen=True)
class Rules:
    link_threshold: float = 0.99
    review_threshold: float = 0.90
    possible_threshold: float = 0.50
    across_organizations: bool = False
    automatic_links: bool = True  # off: every certain pair waits for review

    def grade(self, probability: float) -> str | None:
        if probability >= self.link_threshold:
            return "certain"
        if probability >= self.review_threshold:
            return "probable"
        if probability >= self.possible_threshold:
            return "possible"
        return None


@dataclass(frozen=True, slots=True)
class Pair:
    """Two records judged: their score (household contact left out when they may be a
    household), grade, why a certain pair waits for review (``hold``) and why the two
    may never be linked automatically, even through others (``conflict``)."""

    ids: tuple[str, str]
    scored: Scored
    grade: str | None
    household: bool
    hold: str | None
    conflict: str | None

    @property
    def automatic(self) -> bool:
        return self.grade == "certain" and self.hold is None


@dataclass(frozen=True)
class Constraints:
    """What people decided: pairs linked by hand (or merged by a system outside the
    index), pairs rejected or unlinked, and records a person merged away (never the
    golden record)."""

    linked: frozenset[frozenset[str]] = frozenset()
    apart: frozenset[frozenset[str]] = frozenset()
    merged_away: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Cluster:
    golden: str
    members: frozenset[str]  # the golden record included


@dataclass
class Plan:
    clusters: list[Cluster]
    candidates: list[Pair]  # pairs to review: probable or better, in different clusters
    # (one of the two may be outside the records clustered)
    joined_by: dict[str, Pair] = field(default_factory=dict)  # member → the pair it joined by

    def cluster_of(self, record_id: str) -> Cluster:
        return next(c for c in self.clusters if record_id in c.members)


def _may_be_household(levels: Mapping[str, str]) -> bool:
    return levels.get("family") in _SAME_FAMILY and any(
        levels.get(f) in shared for f, shared in _SHARED_CONTACT.items())


def household_rule(levels: Mapping[str, str]) -> tuple[bool, str | None, str | None]:
    """(may these be two people of one household, why they must be kept apart, why a
    person must look at them) from the levels of a pair."""
    household = _may_be_household(levels)
    if not household:
        return False, None, None
    born, sex, given = levels.get("birth_date"), levels.get("sex"), levels.get("given")
    if sex == "different":
        return True, "household: sexes differ", None
    if born is None:
        return True, "household: no birth date to tell them apart", None
    if born is not None and born not in _HOUSEHOLD_BIRTH_DATES:
        return True, f"household: birth dates differ ({born})", None
    if born == "exact" and given not in _TWIN_GIVEN:
        return True, "household: same birth date, different given names (twins)", None
    if born not in (None, "exact") and given not in _SAME_GIVEN:
        return True, None, f"household: birth dates ({born}) and given names ({given}) differ"
    return True, None, None


class Linker:
    """Judges pairs and forms clusters over a :class:`PatientIndex`."""

    def __init__(self, index: PatientIndex, model: Model, rules: Rules):
        self.index = index
        self.model = model
        self.rules = rules
        self._pairs: dict[tuple[str, str], Pair] = {}

    def pair(self, a: str, b: str) -> Pair:
        ids = (a, b) if a < b else (b, a)
        found = self._pairs.get(ids)
        if found is None:
            found = self._pairs[ids] = self._judge(ids)
        return found

    def _judge(self, ids: tuple[str, str]) -> Pair:
        records, owners = self.index.records, self.index.owners
        return self.judge(ids, records[ids[0]], records[ids[1]],
                          (owners.get(ids[0], frozenset()), owners.get(ids[1], frozenset())))

    def judge(self, ids: tuple[str, str], first: Demographics, second: Demographics,
              owners: tuple[frozenset[str], frozenset[str]] | None) -> Pair:
        """Two records' pair (``owners`` None: a query, of no organization)."""
        scored = self.model.score(ids[1], first, second, self._household_weight)
        levels = scored.levels
        household, household_conflict, household_hold = household_rule(levels)
        conflict = household_conflict or self._conflict(levels, scored.probability, owners)
        hold = conflict or household_hold or self._hold(levels)
        grade = self.rules.grade(scored.probability)
        if grade == "certain" and hold is not None and conflict != "different organizations":
            grade = "probable"  # certain means it would be linked automatically
        if hold is None and not self.rules.automatic_links:
            hold = "automatic links are off"
        return Pair(ids, scored, grade, household, hold, conflict)

    def _household_weight(self, levels: Mapping[str, str], vector: Vector, weight: float
                          ) -> float:
        """For two records that may be a household, the weight without the contact
        details they share; when a birth date is missing, the strongest of them still
        counts (the pair is then for a person to tell apart, not for the index to
        dismiss)."""
        if not _may_be_household(levels):
            return weight
        weight = self.model.weight(vector, ignore=_CONTACT)
        if "birth_date" in levels:
            return weight
        shared = [self.model.level_weight(i, level) for i in _CONTACT
                  if (level := vector[i]) is not None]
        return weight + max(shared, default=0.0)

    def _conflict(self, levels: Mapping[str, str], probability: float,
                  owners: tuple[frozenset[str], frozenset[str]] | None) -> str | None:
        if levels.get("sex") == "different":
            return "sexes differ"
        if levels.get("national_id") == "different":
            return "national ids differ"
        if levels.get("birth_date") == "different":
            return "birth dates differ"
        if owners is not None and not self.rules.across_organizations \
                and owners[0] != owners[1]:
            return "different organizations"
        if probability < self.rules.possible_threshold:
            return "unlikely"
        return None

    def _hold(self, levels: Mapping[str, str]) -> str | None:
        born = levels.get("birth_date")
        if born is None and levels.get("national_id") != "same":
            return "a birth date is missing"
        if born not in (None, "exact", "typo"):
            return f"birth dates agree only in part ({born})"
        if levels.get("given") == "different" and levels.get("national_id") != "same":
            return "given names differ"
        return None

    def match(self, query: Demographics, *, threshold: float = 0.0, limit: int = 20,
              exclude: Iterable[str] = ()) -> list[Pair]:
        """The records matching demographics that are in no record (``Patient/$match``),
        judged as pairs (household contact left out), best first."""
        skip = set(exclude)
        found = [self.judge(("", cid), query, self.index.records[cid], None)
                 for cid in self.index.candidates(query) if cid not in skip]
        kept = [p for p in found if p.scored.probability >= threshold]
        kept.sort(key=lambda p: (-p.scored.weight, p.ids[1]))
        return kept[:limit]

    # -- neighbourhoods and clusters ---------------------------------------------------------
    def neighbours(self, record_id: str) -> list[Pair]:
        """The pairs of a record with the records it blocks with, "possible" or better."""
        query = self.index.records[record_id]
        found = [self.pair(record_id, other) for other in self.index.candidates(query)
                 if other != record_id]
        return [p for p in found if p.grade is not None]

    def neighbourhood(self, seeds: Iterable[str],
                      linked: Callable[[str], Iterable[str]] = lambda _: ()
                      ) -> tuple[set[str], list[Pair]]:
        """The records reached from ``seeds`` through automatic pairs and ``linked``
        (existing links and people's decisions), and the pairs met on the way."""
        reached: set[str] = set()
        pairs: dict[tuple[str, str], Pair] = {}
        waiting = [s for s in seeds if s in self.index]
        while waiting:
            record_id = waiting.pop()
            if record_id in reached:
                continue
            reached.add(record_id)
            for pair in self.neighbours(record_id):
                pairs[pair.ids] = pair
                if pair.automatic:
                    waiting.extend(pair.ids)
            waiting.extend(o for o in linked(record_id) if o in self.index)
        return reached, list(pairs.values())

    def cluster(self, ids: Iterable[str], pairs: Iterable[Pair], constraints: Constraints,
                created: Mapping[str, str]) -> Plan:
        """The clusters of ``ids`` (see the module docstring)."""
        members = set(ids)
        parent = {i: i for i in members}
        groups = {i: {i} for i in members}
        joined_by: dict[str, Pair] = {}

        def root(i: str) -> str:
            while parent[i] != i:
                parent[i] = parent[parent[i]]
                i = parent[i]
            return i

        def join(a: str, b: str) -> None:
            ra, rb = root(a), root(b)
            if len(groups[ra]) < len(groups[rb]):
                ra, rb = rb, ra
            parent[rb] = ra
            groups[ra] |= groups.pop(rb)

        for pair_ids in sorted(tuple(sorted(p)) for p in constraints.linked):
            a, b = pair_ids
            if a in members and b in members and root(a) != root(b):
                join(a, b)
        pairs = list(pairs)
        within = [p for p in pairs if p.ids[0] in members and p.ids[1] in members]
        for pair in sorted((p for p in within if p.automatic), key=self._order):
            ra, rb = root(pair.ids[0]), root(pair.ids[1])
            if ra != rb and self._compatible(groups[ra], groups[rb], constraints):
                join(ra, rb)
                for i in pair.ids:
                    joined_by.setdefault(i, pair)
        clusters = [Cluster(self._golden(group, constraints, created), frozenset(group))
                    for group in groups.values()]
        clusters.sort(key=lambda c: sorted(c.members))
        where = {i: c.golden for c in clusters for i in c.members}
        # a pair with one record outside ``ids`` is across clusters: the other is not
        # linked to any record of ``ids``, or the neighbourhood would have reached it
        candidates = [p for p in pairs if p.scored.probability >= self.rules.review_threshold
                      and where.get(p.ids[0], p.ids[0]) != where.get(p.ids[1], p.ids[1])
                      and (p.ids[0] in members or p.ids[1] in members)
                      and frozenset(p.ids) not in constraints.apart]
        candidates.sort(key=self._order)
        return Plan(clusters, candidates, joined_by)

    def _order(self, pair: Pair) -> tuple[object, ...]:
        keys = sorted((self.index.records[pair.ids[0]].sort_key(),
                       self.index.records[pair.ids[1]].sort_key()))
        return (-pair.scored.weight, keys, pair.ids)

    def _compatible(self, left: set[str], right: set[str], constraints: Constraints) -> bool:
        for a in left:
            for b in right:
                if frozenset((a, b)) in constraints.apart or self.pair(a, b).conflict:
                    return False
        return True

    def _golden(self, group: set[str], constraints: Constraints,
                created: Mapping[str, str]) -> str:
        eligible = [i for i in group if i not in constraints.merged_away] or list(group)
        return min(eligible, key=lambda i: (created.get(i, "~"),
                                            self.index.records[i].sort_key(), i))
