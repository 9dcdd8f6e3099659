"""The rostering rules and the CP-SAT model, without the API: coverage met when it can
be, every hard rule held, and the gaps reported when coverage cannot be met."""

from __future__ import annotations

from datetime import date, datetime, time, timedelta

from platform_api.workforce.fairness import gini
from platform_api.workforce.rules import (
    CoverageRule,
    Member,
    Rules,
    Shift,
    ShiftType,
    broken_rule,
    days_of,
    requirements,
)
from platform_api.workforce.solver import Solution, solve, solve_greedy

MONDAY = date(2027, 3, 1)
DAY = ShiftType("day", "D", time(7), time(19))
NIGHT = ShiftType("night", "N", time(21), time(7))


def valid(solution: Solution, members: list[Member], rules: Rules) -> bool:
    by_id, placed = {m.user_id: m for m in members}, {}
    for a in sorted(solution.assignments, key=lambda a: a.shift.start):
        if broken_rule(by_id[a.user_id], placed.get(a.user_id, []), a.shift, rules,
                       a.skill) is not None:
            return False
        placed.setdefault(a.user_id, []).append(a.shift)
    return True


def ward(size: int = 8) -> list[Member]:
    return [Member(f"n{i}", frozenset({"senior"} if i < 3 else set()),
                   contracted_minutes_week=40 * 60, max_minutes_week=48 * 60)
            for i in range(size)]


def test_a_feasible_week_is_covered_without_breaking_a_rule():
    members, rules = ward(), Rules(first_day=MONDAY)
    needed = requirements([(DAY, [CoverageRule(1, "senior"), CoverageRule(1)]),
                           (NIGHT, [CoverageRule(1)])], days_of(MONDAY, MONDAY + timedelta(6)))
    solution = solve(members, needed, rules, time_limit=5, workers=1)
    assert solution.status in ("OPTIMAL", "FEASIBLE") and solution.gaps == []
    assert len(solution.assignments) == 21
    assert valid(solution, members, rules)
    seniors = [a for a in solution.assignments if a.skill == "senior"]
    assert len(seniors) == 7 and all(a.user_id in ("n0", "n1", "n2") for a in seniors)


def test_when_coverage_cannot_be_met_the_best_roster_comes_with_its_gaps():
    # one member, five nights needed: at most three in a row
    members, rules = ward(1), Rules(first_day=MONDAY, max_consecutive_nights=3)
    needed = requirements([(NIGHT, [CoverageRule(1)])], days_of(MONDAY, MONDAY + timedelta(4)))
    solution = solve(members, needed, rules, time_limit=5, workers=1)
    assert len(solution.assignments) == 4 and solution.unmet == 1
    assert valid(solution, members, rules)
    missing = solution.gaps[0]
    assert missing.required == 1 and missing.assigned == 0 and missing.shift.type == NIGHT


def test_leave_and_rest_are_respected():
    away = (datetime.combine(MONDAY + timedelta(2), time()),
            datetime.combine(MONDAY + timedelta(4), time()))
    members = [Member("a", unavailable=(away,)), Member("b")]
    rules = Rules(first_day=MONDAY)
    needed = requirements([(DAY, [CoverageRule(1)]), (NIGHT, [CoverageRule(1)])],
                          days_of(MONDAY, MONDAY + timedelta(4)))
    solution = solve(members, needed, rules, time_limit=5, workers=1)
    assert valid(solution, members, rules)
    assert not any(a.user_id == "a" and a.shift.day in (MONDAY + timedelta(2),
                                                        MONDAY + timedelta(3))
                   for a in solution.assignments)
    assert solution.unmet > 0  # two people cannot work days and nights all week


def test_the_rules_name_what_a_shift_would_break():
    rules = Rules(first_day=MONDAY, min_rest_minutes=11 * 60, max_consecutive_nights=2)
    nurse = Member("a", frozenset({"icu"}), max_minutes_week=36 * 60)
    monday_night = Shift(MONDAY, NIGHT)
    assert broken_rule(nurse, [], Shift(MONDAY, DAY), rules, "senior") == "SKILL_MISSING"
    early = ShiftType("early", "E", time(6), time(14))
    assert broken_rule(nurse, [monday_night], Shift(MONDAY + timedelta(1), early), rules) \
        == "OVERLAP"
    assert broken_rule(nurse, [monday_night], Shift(MONDAY + timedelta(1), DAY), rules) == \
        "MIN_REST"
    assert broken_rule(nurse, [Shift(MONDAY, DAY)], Shift(MONDAY + timedelta(1), early),
                       rules) is None  # 19:00 to 06:00: 11 h, enough
    nights = [Shift(MONDAY + timedelta(d), NIGHT) for d in (0, 1)]
    assert broken_rule(nurse, nights, Shift(MONDAY + timedelta(2), NIGHT), rules) == \
        "MAX_CONSECUTIVE_NIGHTS"
    days = [Shift(MONDAY + timedelta(d), DAY) for d in (0, 2, 4)]
    assert broken_rule(nurse, days, Shift(MONDAY + timedelta(6), DAY), rules) == \
        "MAX_HOURS_PER_WEEK"


def test_the_greedy_baseline_keeps_the_rules_too():
    members, rules = ward(5), Rules(first_day=MONDAY)
    needed = requirements([(DAY, [CoverageRule(2)]), (NIGHT, [CoverageRule(1)])],
                          days_of(MONDAY, MONDAY + timedelta(13)))
    assert valid(solve_greedy(members, needed, rules), members, rules)


def test_gini_coefficient():
    assert gini([3, 3, 3]) == 0
    assert gini([0, 0, 0, 4]) == 0.75
    assert gini([]) == 0
