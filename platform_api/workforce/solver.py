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
roster). Soft goals, in decreasing weight: night and weekend shifts beyond each member's
fair share (the places shared in proportion to the days each can work), minutes beyond
each member's contract (pro rata), shifts of a type the member avoids, shifts of a type
they prefer (a reward).

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

SHORTFALL_WEIGHT = 10_000_000
SPREAD_WEIGHT = 3_000  # a night or weekend beyond one's share: 50 h beyond contract
OVER_CONTRACT_WEIGHT_PER_MINUTE = 1  # an hour beyond contract: 60
AVOIDED_WEIGHT = 300
PREFERRED_REWARD = 60
COVER_SHARE = 0.4  # of the time limit, for the coverage alone


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
        # contracted minutes); (nights | weekends, member) -> (excess, fair share)
        self.over: dict[int, tuple[cp_model.IntVar, int]] = {}
        self.excess: dict[tuple[str, int], tuple[cp_model.IntVar, int]] = {}
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

    def _fair_excess(self, name: str, loads: dict[int, cp_model.LinearExprT], places: int
                     ) -> list[cp_model.IntVar]:
        """For each member, the ``name`` shifts they work beyond their fair share of the
        ``places`` (shared in proportion to the days each can work at all: someone on
        leave half the period owes half as many)."""
        days = {m: len({s.day for s in self._shifts_of(m)}) for m in loads}
        total = sum(days.values()) or 1
        excess = []
        for m, load in loads.items():
            fair = places * days[m] // total  # rounded down: the shares add up to no more
            # than the places, so every shift beyond one's share is someone else's short
            above = self.model.new_int_var(0, max(places, 1), f"{name}_excess{m}")
            self.model.add(above >= load - fair)
            self.excess[(name, m)] = (above, fair)
            excess.append(above)
        return excess

    def _objective(self) -> None:
        model, days = self.model, {r.shift.day for r in self.needed}
        terms: list[cp_model.LinearExprT] = [SHORTFALL_WEIGHT * s for s in self.short.values()]
        nights: dict[int, cp_model.LinearExprT] = {}
        weekends: dict[int, cp_model.LinearExprT] = {}
        for m, member in enumerate(self.members):
            shifts = self._shifts_of(m)
            if any(s.type.night for s in shifts):
                nights[m] = sum(self.on[(m, s)] for s in shifts if s.type.night)
            if any(s.weekend for s in shifts):
                weekends[m] = sum(self.on[(m, s)] for s in shifts if s.weekend)
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
        night_places = sum(r.count for r in self.needed if r.shift.type.night)
        weekend_places = sum(r.count for r in self.needed if r.shift.weekend)
        terms += [SPREAD_WEIGHT * e for e in self._fair_excess("nights", nights, night_places)]
        terms += [SPREAD_WEIGHT * e
                  for e in self._fair_excess("weekends", weekends, weekend_places)]
        self.objective = sum(terms)
        model.minimize(self.objective)

    def cover_first(self) -> None:
        """Phase one: the shortfall, then the fair spread of nights and weekends (the
        search keeps the load spread while it fills places)."""
        self.model.minimize(SHORTFALL_WEIGHT * sum(self.short.values())
                            + sum(e for e, _fair in self.excess.values()))

    def then_everything(self, solver: cp_model.CpSolver) -> None:
        """Phase two: no more shortfall than phase one's best (``solver``'s), which is the
        hint, and the whole objective minimised."""
        model = self.model
        model.add(sum(self.short.values()) <= sum(solver.value(s) for s in self.short.values()))
        model.clear_hints()
        for var in self.y.values():
            model.add_hint(var, solver.boolean_value(var))
        for var in self.short.values():
            model.add_hint(var, solver.value(var))
        self._hint_helpers([(m, self.needed[r].shift) for (m, r), var in self.y.items()
                            if solver.boolean_value(var)])
        model.minimize(self.objective)

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
        self._hint_helpers([(index[a.user_id], a.shift) for a in placed])

    def _hint_helpers(self, worked: Sequence[tuple[int, Shift]]) -> None:
        """Hint the objective's helper variables from the shifts ``worked``."""
        minutes = [0] * len(self.members)
        loads = {"nights": [0] * len(self.members), "weekends": [0] * len(self.members)}
        for m, shift in worked:
            minutes[m] += shift.type.minutes
            loads["nights"][m] += shift.type.night
            loads["weekends"][m] += shift.weekend
        for m, (over, contracted) in self.over.items():
            self.model.add_hint(over, max(0, minutes[m] - contracted))
        for (name, m), (above, fair) in self.excess.items():
            self.model.add_hint(above, max(0, loads[name][m] - fair))

    def assignments(self, solver: cp_model.CpSolver) -> list[Assignment]:
        return [Assignment(self.members[m].user_id, self.needed[r].shift, self.needed[r].skill)
                for (m, r), var in self.y.items() if solver.boolean_value(var)]


def solve(members: Sequence[Member], needed: Sequence[Requirement], rules: Rules, *,
          time_limit: float, workers: int = 2, seed: int = 0) -> Solution:
    """The best roster CP-SAT finds within ``time_limit`` seconds, with its gaps (the
    greedy roster when CP-SAT found nothing better in time).

    Two phases share the time: the coverage and the fair spread first (``COVER_SHARE``
    of it, from the greedy roster), then every goal without giving back any coverage. On
    2 cores this fills more places than one solve of the weighted sum, whose search
    spends its time on the soft goals (bench/roster.py, 20 s: 1-5 member-shifts short
    over three runs, where one weighted solve left 5 and the greedy roster 6)."""
    started = clock.perf_counter()
    baseline = greedy(members, needed, rules)
    roster = RosterModel(members, needed, rules)
    roster.hint(baseline)
    roster.cover_first()
    first = _solver(time_limit * COVER_SHARE, workers, seed)
    status = first.solve(roster.model)
    if status in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        roster.then_everything(first)
        spent = clock.perf_counter() - started
        second = _solver(max(time_limit - spent, time_limit * 0.2), workers, seed)
        status = second.solve(roster.model)
        if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            second, status = first, cp_model.FEASIBLE  # phase one's roster stands
    else:
        second = first
    needed = roster.needed
    if status in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        placed = roster.assignments(second)
        found = Solution(placed, gaps(needed, placed), second.status_name(status),
                         clock.perf_counter() - started, second.objective_value)
    else:
        found = Solution(baseline, gaps(needed, baseline), "GREEDY",
                         clock.perf_counter() - started)
    found.counts = {"variables": len(roster.y), "requirements": len(needed)}
    return found


def _solver(seconds: float, workers: int, seed: int) -> cp_model.CpSolver:
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = max(seconds, 0.1)
    solver.parameters.num_workers = max(1, workers)
    solver.parameters.random_seed = seed
    return solver
