"""Roster generation: a constraint model solved with OR-Tools CP-SAT, and the greedy
baseline it is measured against (and starts from).

Variables: ``y[m, r]`` — member ``m`` fills one place of requirement ``r`` (a shift and a
skill); only for members qualified and available for it. A member fills at most one
place per shift. The hard rules of :mod:`.rules` are constraints: pairs of shifts too
close together (overlap, minimum rest) exclude each other, weekly minutes are bounded,
every window of ``max_consecutive_nights + 1`` days holds at most that many nights.

Coverage is hard in intent but modelled with a shortfall variable per requirement whose
weight dwarfs every soft goal: when the places cannot all be filled the solver still
returns the best roster, and the shortfalls are its coverage gaps (never a silently short
roster). Soft goals, in decreasing weight: the most night and the most weekend shifts any
one member works (minimised: the load is spread), minutes beyond each member's contract (pro
rata), shifts of a type the member avoids, shifts of a type they prefer (a reward).

The greedy baseline fills requirements in time order with the qualified member who has
worked least so far and breaks no hard rule; the solver gets it as a hint.
"""

from __future__ import annotations

import time as clock
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import date, timedelta

from ortools.sat.python import cp_model

from platform_api.workforce.rules import (
    Assignment,
    Gap,
    Member,
    Requirement,
    Rules,
    Shift,
    broken_rule,
    gaps,
    too_close,
)

SHORTFALL_WEIGHT = 100_000
SPREAD_WEIGHT = 300
OVER_CONTRACT_WEIGHT_PER_MINUTE = 1  # an hour beyond contract: 60
AVOIDED_WEIGHT = 60
PREFERRED_REWARD = 15


@dataclass
class Solution:
    assignments: list[Assignment]
    gaps: list[Gap]
    status: str  # OPTIMAL | FEASIBLE | GREEDY (the solver found nothing better in time)
    seconds: float
    objective: float | None = None
    counts: dict[str, int] = field(default_factory=dict)

    @property
    def unmet(self) -> int:
        return sum(g.missing for g in self.gaps)


def merged(needed: Sequence[Requirement]) -> list[Requirement]:
    """One requirement per shift and skill (coverage rules of one skill add up)."""
    counts: dict[tuple[Shift, str | None], int] = {}
    for r in needed:
        counts[(r.shift, r.skill)] = counts.get((r.shift, r.skill), 0) + r.count
    return [Requirement(shift, skill, count) for (shift, skill), count in counts.items()]


# -- the greedy baseline --------------------------------------------------------------------
def greedy(members: Sequence[Member], needed: Sequence[Requirement], rules: Rules
           ) -> list[Assignment]:
    needed = merged(needed)
    theirs: dict[str, list[Shift]] = {m.user_id: [] for m in members}
    worked = {m.user_id: 0 for m in members}
    nights = {m.user_id: 0 for m in members}
    placed: list[Assignment] = []
    # time order; within a shift, skilled places before "anyone" places
    for requirement in sorted(needed, key=lambda r: (r.shift.start, r.skill is None)):
        shift = requirement.shift
        for _place in range(requirement.count):
            candidates = [m for m in members
                          if shift not in theirs[m.user_id]
                          and broken_rule(m, theirs[m.user_id], shift, rules,
                                          requirement.skill) is None]
            if not candidates:
                break
            chosen = min(candidates, key=lambda m: (
                nights[m.user_id] if shift.type.night else 0,
                worked[m.user_id] / max(m.contracted_minutes_week, 1),
                shift.type.id in m.avoided, m.user_id))
            theirs[chosen.user_id].append(shift)
            worked[chosen.user_id] += shift.type.minutes
            nights[chosen.user_id] += shift.type.night
            placed.append(Assignment(chosen.user_id, shift, requirement.skill))
    return placed


def solve_greedy(members: Sequence[Member], needed: Sequence[Requirement], rules: Rules
                 ) -> Solution:
    started = clock.perf_counter()
    placed = greedy(members, needed, rules)
    return Solution(placed, gaps(merged(needed), placed), "GREEDY",
                    clock.perf_counter() - started)


# -- the constraint model -------------------------------------------------------------------
class RosterModel:
    def __init__(self, members: Sequence[Member], needed: Sequence[Requirement],
                 rules: Rules):
        self.members, self.needed, self.rules = list(members), merged(needed), rules
        self.model = cp_model.CpModel()
        self.y: dict[tuple[int, int], cp_model.IntVar] = {}
        self.short: dict[int, cp_model.IntVar] = {}
        self.works: dict[tuple[int, Shift], list[cp_model.IntVar]] = {}
        # the objective's helper variables, hinted from a roster: member -> (over, its
        # contracted minutes); the heaviest loads with their kind (night | weekend)
        self.over: dict[int, tuple[cp_model.IntVar, int]] = {}
        self.heaviest: dict[str, cp_model.IntVar] = {}
        self._build()

    def _build(self) -> None:
        model = self.model
        for r, requirement in enumerate(self.needed):
            places = []
            for m, member in enumerate(self.members):
                if member.qualified(requirement.shift, requirement.skill) and \
                        member.available(requirement.shift):
                    var = model.new_bool_var(f"y{m}_{r}")
                    self.y[(m, r)] = var
                    places.append(var)
                    self.works.setdefault((m, requirement.shift), []).append(var)
            short = model.new_int_var(0, requirement.count, f"short{r}")
            model.add(sum(places) + short == requirement.count)
            self.short[r] = short
        self.on: dict[tuple[int, Shift], cp_model.LinearExprT] = {}
        for key, places in self.works.items():
            model.add_at_most_one(places)
            self.on[key] = sum(places)
        for m in range(len(self.members)):
            self._member_rules(m)
        self._objective()

    def _shifts_of(self, m: int) -> list[Shift]:
        return sorted((s for (i, s) in self.on if i == m), key=lambda s: s.start)

    def _member_rules(self, m: int) -> None:
        model, member, rules = self.model, self.members[m], self.rules
        shifts = self._shifts_of(m)
        reach = timedelta(minutes=rules.min_rest_minutes)
        for i, first in enumerate(shifts):
            for second in shifts[i + 1:]:
                if second.start >= first.end + reach:
                    break
                if too_close(first, second, rules):
                    model.add_at_most_one(self.works[(m, first)] + self.works[(m, second)])
        weeks: dict[int, list[cp_model.LinearExprT]] = {}
        for shift in shifts:
            weeks.setdefault(rules.week(shift.day), []).append(
                shift.type.minutes * self.on[(m, shift)])
        for minutes in weeks.values():
            model.add(sum(minutes) <= member.max_minutes_week)
        by_day: dict[date, list[cp_model.LinearExprT]] = {}
        for shift in shifts:
            if shift.type.night:
                by_day.setdefault(shift.day, []).append(self.on[(m, shift)])
        window = rules.max_consecutive_nights + 1
        for day in sorted(by_day):
            run = [n for d in range(window)
                   for n in by_day.get(day + timedelta(days=d), [])]
            if len(run) > rules.max_consecutive_nights:
                model.add(sum(run) <= rules.max_consecutive_nights)

    def _heaviest(self, name: str, loads: list[cp_model.LinearExprT], bound: int
                  ) -> cp_model.IntVar:
        """The largest of ``loads`` (minimised: the load is spread; a spread max - min
        would be pinned by whoever is on leave)."""
        high = self.model.new_int_var(0, bound, f"{name}_max")
        for load in loads:
            self.model.add(load <= high)
        self.heaviest[name] = high
        return high

    def _objective(self) -> None:
        model, days = self.model, {r.shift.day for r in self.needed}
        terms: list[cp_model.LinearExprT] = [SHORTFALL_WEIGHT * s for s in self.short.values()]
        nights, weekends = [], []
        for m, member in enumerate(self.members):
            shifts = self._shifts_of(m)
            if any(s.type.night for s in shifts):
                nights.append(sum(self.on[(m, s)] for s in shifts if s.type.night))
            if any(s.weekend for s in shifts):
                weekends.append(sum(self.on[(m, s)] for s in shifts if s.weekend))
            minutes = sum(s.type.minutes * self.on[(m, s)] for s in shifts)
            contracted = int(member.contracted_minutes_week * len(days) // 7)
            over = model.new_int_var(0, 60 * 24 * max(len(days), 1), f"over{m}")
            model.add(over >= minutes - contracted)
            self.over[m] = (over, contracted)
            terms.append(OVER_CONTRACT_WEIGHT_PER_MINUTE * over)
            for s in shifts:
                if s.type.id in member.avoided:
                    terms.append(AVOIDED_WEIGHT * self.on[(m, s)])
                if s.type.id in member.preferred:
                    terms.append(-PREFERRED_REWARD * self.on[(m, s)])
        if len(nights) > 1:
            terms.append(SPREAD_WEIGHT * self._heaviest("nights", nights, len(days)))
        if len(weekends) > 1:
            terms.append(SPREAD_WEIGHT * self._heaviest("weekends", weekends, 2 * len(days)))
        model.minimize(sum(terms))

    def hint(self, placed: Sequence[Assignment]) -> None:
        index = {m.user_id: i for i, m in enumerate(self.members)}
        chosen = {(index[a.user_id], a.shift, a.skill) for a in placed}
        for (m, r), var in self.y.items():
            requirement = self.needed[r]
            self.model.add_hint(var, (m, requirement.shift, requirement.skill) in chosen)
        for r, short in self.short.items():
            requirement = self.needed[r]
            filled = sum(1 for a in placed
                         if (a.shift, a.skill) == (requirement.shift, requirement.skill))
            self.model.add_hint(short, max(0, requirement.count - filled))
        minutes = [0] * len(self.members)
        loads = {"nights": [0] * len(self.members), "weekends": [0] * len(self.members)}
        for a in placed:
            m = index[a.user_id]
            minutes[m] += a.shift.type.minutes
            loads["nights"][m] += a.shift.type.night
            loads["weekends"][m] += a.shift.weekend
        for m, (over, contracted) in self.over.items():
            self.model.add_hint(over, max(0, minutes[m] - contracted))
        for name, high in self.heaviest.items():
            self.model.add_hint(high, max(loads[name]))

    def assignments(self, solver: cp_model.CpSolver) -> list[Assignment]:
        return [Assignment(self.members[m].user_id, self.needed[r].shift, self.needed[r].skill)
                for (m, r), var in self.y.items() if solver.boolean_value(var)]


def solve(members: Sequence[Member], needed: Sequence[Requirement], rules: Rules, *,
          time_limit: float, workers: int = 2, seed: int = 0) -> Solution:
    """The best roster CP-SAT finds within ``time_limit`` seconds, with its gaps (the
    greedy roster when CP-SAT found nothing better in time)."""
    started = clock.perf_counter()
    baseline = greedy(members, needed, rules)
    roster = RosterModel(members, needed, rules)
    roster.hint(baseline)
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = time_limit
    solver.parameters.num_workers = max(1, workers)
    solver.parameters.random_seed = seed
    status = solver.solve(roster.model)
    needed = roster.needed
    if status in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        placed = roster.assignments(solver)
        found = Solution(placed, gaps(needed, placed), solver.status_name(status),
                         clock.perf_counter() - started, solver.objective_value)
    else:
        found = Solution(baseline, gaps(needed, baseline), "GREEDY",
                         clock.perf_counter() - started)
    found.counts = {"variables": len(roster.y), "requirements": len(needed)}
    return found
