"""Roster generation: a 4-week roster of 40 members and 3 shift types with realistic
leave, solved with CP-SAT (``platform_api.workforce.solver``) against the greedy baseline
in the same run. Prints one JSON line.

The ward: early (07:00-15:00), late (14:30-22:30) and night (22:00-07:30, crossing
midnight) shifts; weekdays need 9 / 8 / 6 members (2 / 2 / 1 of them ``senior``, one
``icu`` on every shift), weekends 7 / 7 / 6. Forty members: 12 senior, 10 with ``icu``,
a quarter part-time (24 h), the rest 37.5 h contracts, at most 48 h a week; a fifth of
them on one to two weeks of leave somewhere in the four weeks, two on a few sick days.
Rules: 11 h rest, at most 3 consecutive nights. Each member avoids one shift type at
random and prefers another (seeded).

Reported: for each method the solve time, the unmet coverage (member-shifts short), the
spread and Gini coefficient of night and weekend shifts, and a re-check that every
roster breaks no hard rule (``violations`` must be 0).

Usage: ``python bench/roster.py [--members 40] [--days 28] [--time-limit 20] [--seed 7]``
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from datetime import date, datetime, time, timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from platform_api.workforce.fairness import gini
from platform_api.workforce.rules import (
    CoverageRule,
    Member,
    Rules,
    ShiftType,
    broken_rule,
    days_of,
    requirements,
)
from platform_api.workforce.solver import Solution, solve, solve_greedy

WEEKDAYS = frozenset({"mon", "tue", "wed", "thu", "fri"})
WEEKEND = frozenset({"sat", "sun"})


def ward(seed: int, size: int, first: date, days: int) -> tuple[list[Any], list[Member]]:
    rng = random.Random(seed)
    early = ShiftType("early", "E", time(7), time(15))
    late = ShiftType("late", "L", time(14, 30), time(22, 30))
    night = ShiftType("night", "N", time(22), time(7, 30))
    coverage = []
    for shift_type, weekday, weekend, seniors in ((early, 9, 7, 2), (late, 8, 7, 2),
                                                   (night, 6, 6, 1)):
        coverage.append((shift_type, [
            CoverageRule(seniors, "senior"), CoverageRule(1, "icu"),
            CoverageRule(weekday - seniors - 1, None, WEEKDAYS),
            CoverageRule(weekend - seniors - 1, None, WEEKEND)]))
    members = []
    for i in range(size):
        skills = set()
        if i < size * 3 // 10:
            skills.add("senior")
        if i % 4 == 1:
            skills.add("icu")
        unavailable = []
        if rng.random() < 0.2:  # annual leave: one to two weeks
            start = first + timedelta(days=rng.randrange(days - 7))
            length = rng.randint(7, 14)
            unavailable.append((datetime.combine(start, time()),
                                datetime.combine(start + timedelta(days=length), time())))
        if rng.random() < 0.05:  # a few sick days
            start = first + timedelta(days=rng.randrange(days))
            unavailable.append((datetime.combine(start, time()),
                                datetime.combine(start + timedelta(days=3), time())))
        avoided, preferred = rng.sample(["early", "late", "night"], 2)
        members.append(Member(
            f"m{i:02d}", frozenset(skills),
            contracted_minutes_week=24 * 60 if i % 4 == 3 else 2250,  # 37.5 h
            max_minutes_week=48 * 60, unavailable=tuple(unavailable),
            preferred=frozenset({preferred}), avoided=frozenset({avoided})))
    return coverage, members


def violations(solution: Solution, members: list[Member], rules: Rules) -> int:
    by_member = {m.user_id: m for m in members}
    broken = 0
    placed: dict[str, list[Any]] = {}
    for a in sorted(solution.assignments, key=lambda a: a.shift.start):
        if broken_rule(by_member[a.user_id], placed.get(a.user_id, []), a.shift, rules,
                       a.skill) is not None:
            broken += 1
        placed.setdefault(a.user_id, []).append(a.shift)
    return broken


def figures(solution: Solution, members: list[Member], rules: Rules) -> dict[str, Any]:
    nights = {m.user_id: 0 for m in members}
    weekends = {m.user_id: 0 for m in members}
    for a in solution.assignments:
        nights[a.user_id] += a.shift.type.night
        weekends[a.user_id] += a.shift.weekend
    return {"seconds": round(solution.seconds, 3), "status": solution.status,
            "unmet_coverage": solution.unmet, "assigned": len(solution.assignments),
            "night_spread": max(nights.values()) - min(nights.values()),
            "weekend_spread": max(weekends.values()) - min(weekends.values()),
            "night_gini": round(gini(list(nights.values())), 3),
            "weekend_gini": round(gini(list(weekends.values())), 3),
            "violations": violations(solution, members, rules)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--members", type=int, default=40)
    parser.add_argument("--days", type=int, default=28)
    parser.add_argument("--time-limit", type=float, default=20.0)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    first = date(2027, 2, 1)  # a Monday
    coverage, members = ward(args.seed, args.members, first, args.days)
    needed = requirements(coverage, days_of(first, first + timedelta(days=args.days - 1)))
    rules = Rules(first_day=first, min_rest_minutes=11 * 60, max_consecutive_nights=3)
    baseline = solve_greedy(members, needed, rules)
    best = solve(members, needed, rules, time_limit=args.time_limit, workers=args.workers,
                 seed=args.seed)
    print(json.dumps({
        "benchmark": "roster", "members": args.members, "days": args.days,
        "shift_types": 3, "required_member_shifts": sum(r.count for r in needed),
        "members_with_leave": sum(1 for m in members if m.unavailable),
        "time_limit_seconds": args.time_limit, "workers": args.workers,
        "cp_sat": figures(best, members, rules), "greedy": figures(baseline, members, rules),
    }))


if __name__ == "__main__":
    main()
