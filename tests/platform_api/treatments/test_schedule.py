"""Placing a protocol's steps in time (``platform_api.treatments.schedule``)."""

from __future__ import annotations

from datetime import date

import pytest

from platform_api.treatments.schedule import (
    Scheduled,
    ScheduleError,
    Span,
    StepTiming,
    schedule,
    treatment_end,
)


def test_calendar_months_end_on_the_last_day_of_a_shorter_month():
    assert Span(1, "mo").after(date(2026, 1, 31)) == date(2026, 2, 28)
    assert Span(2, "mo").after(date(2027, 12, 31)) == date(2028, 2, 29)
    assert Span(2, "wk").after(date(2026, 1, 1)) == date(2026, 1, 15)


def test_steps_follow_each_other_with_offsets():
    dates = schedule([
        StepTiming("intensive", duration=Span(2, "mo"), repeats=True),
        StepTiming("continuation", after="intensive", duration=Span(4, "mo"), repeats=True),
        StepTiming("smear", offset=Span(5, "mo")),
        StepTiming("review", after="continuation", offset=Span(1, "wk")),
    ], date(2026, 3, 10))
    assert dates["continuation"] == Scheduled(date(2026, 5, 10), date(2026, 9, 10))
    assert dates["smear"] == Scheduled(date(2026, 8, 10), date(2026, 8, 10))
    assert dates["review"].start == date(2026, 9, 17)
    assert treatment_end(dates) == date(2026, 9, 17)


def test_an_open_ended_step_has_no_end_and_nothing_follows_it():
    dates = schedule([StepTiming("art", repeats=True)], date(2026, 1, 1))
    assert dates["art"].end is None and treatment_end(dates) is None
    with pytest.raises(ScheduleError, match="never ends"):
        schedule([StepTiming("art", repeats=True), StepTiming("vl", after="art")],
                 date(2026, 1, 1))


def test_a_circle_of_steps_is_refused():
    with pytest.raises(ScheduleError, match="circle"):
        schedule([StepTiming("a", after="b", duration=Span(1, "d")),
                  StepTiming("b", after="a", duration=Span(1, "d"))], date(2026, 1, 1))
