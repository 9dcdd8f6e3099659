"""The rostering rules as data and one checker, shared by the solver, swaps, leave and the
greedy baseline.

A roster covers whole days; a *shift* is one shift type on one day, from the day's start
time to its end time (the next day when it crosses midnight). Times are the
organization's wall-clock times.

Hard rules (a roster, a swap, a leave change never breaks them; their codes are the
refusal codes of a swap):

- ``SKILL_MISSING``: a member works only shifts whose required skills they all hold;
- ``UNAVAILABLE``: nobody works during their approved leave or declared unavailability;
- ``OVERLAP``: no two shifts of one member overlap;
- ``MIN_REST``: at least ``min_rest_minutes`` between the end of one shift and the start
  of the next (11 h by default: the EU Working Time Directive's daily rest);
- ``MAX_HOURS_PER_WEEK``: within each 7-day block from the roster's first day, at most
  the member's maximum (48 h by default: the Directive's weekly limit);
- ``MAX_CONSECUTIVE_NIGHTS``: at most ``max_consecutive_nights`` night shifts on
  consecutive days.

A night shift is one with at least 3 hours between 22:00 and 06:00 (the Directive's
"night worker" test).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import date, datetime, time, timedelta

NIGHT_START, NIGHT_END = time(22), time(6)
NIGHT_MINUTES = 180
WEEKDAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")


@dataclass(frozen=True)
class ShiftType:
    id: str
    code: str
    start: time
    end: time
    required_skills: frozenset[str] = frozenset()

    @property
    def crosses_midnight(self) -> bool:
        return self.end <= self.start

    @property
    def minutes(self) -> int:
        start, end = self.interval(date(2000, 1, 3))
        return int((end - start).total_seconds() // 60)

    @property
    def night(self) -> bool:
        start, end = self.interval(date(2000, 1, 3))
        night_minutes = 0
        for offset in (-1, 0):  # the night before the shift's day, and the night after
            night_from = datetime.combine(start.date() + timedelta(days=offset), NIGHT_START)
            night_to = datetime.combine(start.date() + timedelta(days=offset + 1), NIGHT_END)
            overlap = (min(end, night_to) - max(start, night_from)).total_seconds()
            night_minutes += max(0, int(overlap // 60))
        return night_minutes >= NIGHT_MINUTES

    def interval(self, day: date) -> tuple[datetime, datetime]:
        end_day = day + timedelta(days=1) if self.crosses_midnight else day
        return datetime.combine(day, self.start), datetime.combine(end_day, self.end)


@dataclass(frozen=True)
class Shift:
    """One shift type on one day."""

    day: date
    type: ShiftType

    @property
    def start(self) -> datetime:
        return self.type.interval(self.day)[0]

    @property
    def end(self) -> datetime:
        return self.type.interval(self.day)[1]

    @property
    def weekend(self) -> bool:
        return self.day.weekday() >= 5


@dataclass(frozen=True)
class Member:
    user_id: str
    skills: frozenset[str] = frozenset()
    contracted_minutes_week: int = 40 * 60
    max_minutes_week: int = 48 * 60
    unavailable: tuple[tuple[datetime, datetime], ...] = ()
    preferred: frozenset[str] = frozenset()  # shift type ids
    avoided: frozenset[str] = frozenset()

    def available(self, shift: Shift) -> bool:
        return not any(start < shift.end and shift.start < end
                       for start, end in self.unavailable)

    def qualified(self, shift: Shift, skill: str | None = None) -> bool:
        return shift.type.required_skills <= self.skills and (
            skill is None or skill in self.skills)


@dataclass(frozen=True)
class Rules:
    first_day: date  # weeks are 7-day blocks from here
    min_rest_minutes: int = 11 * 60
    max_consecutive_nights: int = 3

    def week(self, day: date) -> int:
        return (day - self.first_day).days // 7


@dataclass(frozen=True)
class Requirement:
    """``count`` members on ``shift``, each holding ``skill`` (None: any member)."""

    shift: Shift
    skill: str | None
    count: int


@dataclass(frozen=True)
class Assignment:
    user_id: str
    shift: Shift
    skill: str | None = None


@dataclass
class Gap:
    shift: Shift
    skill: str | None
    required: int
    assigned: int

    @property
    def missing(self) -> int:
        return self.required - self.assigned


@dataclass
class CoverageRule:
    """A shift type's coverage: ``count`` members with ``skill`` on ``days`` (weekday
    names; empty: every day)."""

    count: int
    skill: str | None = None
    days: frozenset[str] = field(default_factory=frozenset)

    def applies(self, day: date) -> bool:
        return not self.days or WEEKDAYS[day.weekday()] in self.days


def days_of(first_day: date, last_day: date) -> list[date]:
    return [first_day + timedelta(days=i) for i in range((last_day - first_day).days + 1)]


def requirements(shift_types: Sequence[tuple[ShiftType, Sequence[CoverageRule]]],
                 days: Iterable[date]) -> list[Requirement]:
    """Every day's requirements, from each shift type's coverage rules."""
    found = []
    for day in days:
        for shift_type, rules in shift_types:
            for rule in rules:
                if rule.applies(day) and rule.count > 0:
                    found.append(Requirement(Shift(day, shift_type), rule.skill, rule.count))
    return found


def too_close(a: Shift, b: Shift, rules: Rules) -> str | None:
    """``OVERLAP`` or ``MIN_REST`` when one member cannot work both shifts."""
    if a == b:
        return None
    if a.start < b.end and b.start < a.end:
        return "OVERLAP"
    first, second = (a, b) if a.start < b.start else (b, a)
    if (second.start - first.end).total_seconds() < rules.min_rest_minutes * 60:
        return "MIN_REST"
    return None


def broken_rule(member: Member, theirs: Sequence[Shift], candidate: Shift, rules: Rules,
                skill: str | None = None) -> str | None:
    """The first hard rule ``member`` would break by working ``candidate`` on top of the
    shifts ``theirs`` (None: none)."""
    if not member.qualified(candidate, skill):
        return "SKILL_MISSING"
    if not member.available(candidate):
        return "UNAVAILABLE"
    for shift in theirs:
        if (reason := too_close(shift, candidate, rules)) is not None:
            return reason
    week = rules.week(candidate.day)
    minutes = sum(s.type.minutes for s in theirs if rules.week(s.day) == week)
    if minutes + candidate.type.minutes > member.max_minutes_week:
        return "MAX_HOURS_PER_WEEK"
    if candidate.type.night and _night_run(theirs, candidate) > rules.max_consecutive_nights:
        return "MAX_CONSECUTIVE_NIGHTS"
    return None


def _night_run(theirs: Sequence[Shift], candidate: Shift) -> int:
    nights = {s.day for s in theirs if s.type.night} | {candidate.day}
    run, day = 1, candidate.day - timedelta(days=1)
    while day in nights:
        run, day = run + 1, day - timedelta(days=1)
    day = candidate.day + timedelta(days=1)
    while day in nights:
        run, day = run + 1, day + timedelta(days=1)
    return run


def gaps(needed: Sequence[Requirement], assignments: Sequence[Assignment]) -> list[Gap]:
    """The requirements the assignments leave short (each assignment fills the
    requirement of its shift and skill)."""
    filled: dict[tuple[Shift, str | None], int] = {}
    for assignment in assignments:
        key = (assignment.shift, assignment.skill)
        filled[key] = filled.get(key, 0) + 1
    short = []
    for requirement in needed:
        key = (requirement.shift, requirement.skill)
        assigned = min(filled.get(key, 0), requirement.count)
        if assigned < requirement.count:
            short.append(Gap(requirement.shift, requirement.skill, requirement.count, assigned))
    return short
