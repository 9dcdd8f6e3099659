"""Slot times from working hours: RFC 5545 recurrence, slot length and buffer, the
time zone (summer time included), exceptions, overnight hours."""

from __future__ import annotations

from datetime import UTC, date, datetime, time

import pytest

from platform_api.scheduling.slots import (
    Closure,
    Rules,
    WorkingHours,
    check_rrule,
    generate,
    rules_extension,
    rules_of,
    slot_id,
)
from tests.platform_api.scheduling.conftest import NAIROBI

MONDAY = date(2027, 3, 1)


def rules(*hours: WorkingHours, zone: str = "Africa/Nairobi", slot: int = 30, buffer: int = 0,
          closures: tuple[Closure, ...] = (), until: date | None = None) -> Rules:
    return Rules(zone, slot, buffer, 60, MONDAY, until, hours, closures)


def utc(day: date, hour: int, minute: int = 0) -> datetime:
    return datetime.combine(day, time(hour, minute), UTC)


def local_starts(times: list[tuple[datetime, datetime]], zone=NAIROBI) -> list[str]:
    return [s.astimezone(zone).strftime("%a %H:%M") for s, _ in times]


def test_weekly_rule_picks_the_days_and_the_hours_give_the_slots() -> None:
    weekdays = WorkingHours("FREQ=WEEKLY;BYDAY=MO,WE", time(8), time(9, 30))
    found = generate(rules(weekdays), utc(MONDAY, 0), utc(date(2027, 3, 8), 0))
    assert local_starts(found) == ["Mon 08:00", "Mon 08:30", "Mon 09:00",
                                   "Wed 08:00", "Wed 08:30", "Wed 09:00"]
    # 08:00 in Nairobi (UTC+3) is 05:00 UTC
    assert found[0] == (utc(MONDAY, 5), utc(MONDAY, 5, 30))


def test_a_buffer_follows_every_slot_and_a_slot_never_overruns_the_hours() -> None:
    morning = WorkingHours("FREQ=DAILY", time(8), time(10))
    found = generate(rules(morning, slot=25, buffer=10), utc(MONDAY, 0), utc(MONDAY, 23))
    assert local_starts(found) == ["Mon 08:00", "Mon 08:35", "Mon 09:10"]


def test_exceptions_close_whole_days_and_parts_of_days() -> None:
    daily = WorkingHours("FREQ=DAILY", time(8), time(10))
    holiday = Closure(datetime(2027, 3, 2, tzinfo=NAIROBI), datetime(2027, 3, 3, tzinfo=NAIROBI),
                      "Public holiday")
    leave = Closure(datetime(2027, 3, 3, 9, tzinfo=NAIROBI),
                    datetime(2027, 3, 3, 12, tzinfo=NAIROBI), "Training")
    found = generate(rules(daily, closures=(holiday, leave)), utc(MONDAY, 0),
                     utc(date(2027, 3, 4), 0))
    assert local_starts(found) == ["Mon 08:00", "Mon 08:30", "Mon 09:00", "Mon 09:30",
                                   "Wed 08:00", "Wed 08:30"]


def test_local_hours_hold_across_a_change_to_summer_time() -> None:
    # Europe/London moves to BST on 2027-03-28: 09:00 local is 09:00Z, then 08:00Z
    daily = WorkingHours("FREQ=DAILY", time(9), time(10))
    found = generate(rules(daily, zone="Europe/London", slot=60), utc(date(2027, 3, 27), 0),
                     utc(date(2027, 3, 29), 0))
    assert [s for s, _ in found] == [utc(date(2027, 3, 27), 9), utc(date(2027, 3, 28), 8)]


def test_overnight_hours_end_the_next_day_and_valid_until_stops_them() -> None:
    night = WorkingHours("FREQ=DAILY", time(22), time(2))
    found = generate(rules(night, slot=120, until=MONDAY), utc(MONDAY, 0),
                     utc(date(2027, 3, 5), 0))
    assert [(s.astimezone(NAIROBI).isoformat(), e.astimezone(NAIROBI).isoformat())
            for s, e in found] == [("2027-03-01T22:00:00+03:00", "2027-03-02T00:00:00+03:00"),
                                   ("2027-03-02T00:00:00+03:00", "2027-03-02T02:00:00+03:00")]


def test_overlapping_hours_give_each_time_once() -> None:
    first = WorkingHours("FREQ=DAILY", time(8), time(10))
    second = WorkingHours("FREQ=WEEKLY;BYDAY=MO", time(9), time(11))
    found = generate(rules(first, second, slot=60), utc(MONDAY, 0), utc(MONDAY, 23))
    assert local_starts(found) == ["Mon 08:00", "Mon 09:00", "Mon 10:00"]


@pytest.mark.parametrize(("text", "complaint"), [
    ("FREQ=HOURLY", "FREQ must be"),
    ("FREQ=DAILY;BYHOUR=9", "BYHOUR cannot be used"),
    ("FREQ=WEEKLY;BYDAY=XX", "not a valid RFC 5545 RRULE"),
    ("", "give one RRULE"),
])
def test_rules_that_cannot_be_working_hours_are_refused(text: str, complaint: str) -> None:
    with pytest.raises(ValueError, match=complaint):
        check_rrule(text)


def test_rules_round_trip_through_the_schedule_extension() -> None:
    kept = rules(WorkingHours("FREQ=WEEKLY;BYDAY=TU", time(14), time(17)), buffer=5,
                 closures=(Closure(datetime(2027, 4, 1, tzinfo=NAIROBI),
                                   datetime(2027, 4, 2, tzinfo=NAIROBI), "Leave"),))
    schedule = {"resourceType": "Schedule", "extension": [rules_extension(kept)],
                "planningHorizon": {"start": MONDAY.isoformat()}}
    assert rules_of(schedule) == kept
    assert rules_of({"resourceType": "Schedule"}) is None


def test_a_slot_id_is_its_schedule_and_utc_start() -> None:
    assert slot_id("0193", utc(MONDAY, 5)) == "0193-202703010500"
