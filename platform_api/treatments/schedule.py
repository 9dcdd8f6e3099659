"""When each step of a treatment protocol falls for one patient: the protocol's timings
(FHIR ``PlanDefinition.action``) turned into the dates of a CarePlan's activities.

A step starts on the treatment's start date, or when another step ends
(``relatedAction`` *after-end*), plus an offset; it lasts ``duration`` (Timing
``repeat.boundsDuration``) or, without one, is open-ended when it repeats (lifelong ART)
and a single event when it does not (a sputum smear at the end of month 2). Months and
years are calendar months and years (2 months from 31 January is 31 March; from
31 December, 28 or 29 February), weeks are 7 days.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import date, timedelta

from dateutil.relativedelta import relativedelta

UNITS = ("d", "wk", "mo", "a")


class ScheduleError(ValueError):
    """A protocol whose steps cannot be placed in time (what and which step)."""

    def __init__(self, message: str, step: str):
        super().__init__(message)
        self.step = step


@dataclass(frozen=True)
class Span:
    """How long: ``value`` ``unit`` (UCUM ``d``, ``wk``, ``mo``, ``a``)."""

    value: int
    unit: str

    def after(self, day: date) -> date:
        if self.unit == "d":
            return day + timedelta(days=self.value)
        if self.unit == "wk":
            return day + timedelta(weeks=self.value)
        if self.unit == "mo":
            return day + relativedelta(months=self.value)
        if self.unit == "a":
            return day + relativedelta(years=self.value)
        raise ValueError(f"unknown unit {self.unit!r} (one of {', '.join(UNITS)})")


@dataclass(frozen=True)
class StepTiming:
    """A step's timing as the protocol states it."""

    id: str
    after: str | None = None  # the step whose end this one starts from
    offset: Span | None = None
    duration: Span | None = None
    repeats: bool = False


@dataclass(frozen=True)
class Scheduled:
    """A step's dates for one patient: ``end`` None when open-ended; ``start == end`` for
    a single event."""

    start: date
    end: date | None


def schedule(steps: Sequence[StepTiming], start: date) -> dict[str, Scheduled]:
    """The dates of every step of a treatment started on ``start`` (ScheduleError for a
    step after an unknown or open-ended step, or a cycle)."""
    by_id: Mapping[str, StepTiming] = {s.id: s for s in steps}
    placed: dict[str, Scheduled] = {}

    def place(step: StepTiming, path: tuple[str, ...]) -> Scheduled:
        if step.id in placed:
            return placed[step.id]
        if step.id in path:
            raise ScheduleError(f"Steps {' → '.join((*path, step.id))} follow each other in "
                                "a circle", step.id)
        begin = start
        if step.after is not None:
            before = by_id.get(step.after)
            if before is None:
                raise ScheduleError(f"Step {step.id!r} follows {step.after!r}, which the "
                                    "protocol does not have", step.id)
            end = place(before, (*path, step.id)).end
            if end is None:
                raise ScheduleError(f"Step {step.id!r} follows {step.after!r}, which never "
                                    "ends", step.id)
            begin = end
        if step.offset is not None:
            begin = step.offset.after(begin)
        if step.duration is not None:
            found = Scheduled(begin, step.duration.after(begin))
        else:
            found = Scheduled(begin, None if step.repeats else begin)
        placed[step.id] = found
        return found

    for step in steps:
        place(step, ())
    return placed


def treatment_end(dates: Mapping[str, Scheduled]) -> date | None:
    """The last day of the treatment; None when a step never ends."""
    ends = [d.end for d in dates.values()]
    if not ends or any(e is None for e in ends):
        return None
    return max(e for e in ends if e is not None)


__all__ = ["UNITS", "ScheduleError", "Scheduled", "Span", "StepTiming", "schedule",
           "treatment_end"]
