"""FHIR date/dateTime/instant values as ranges (search precision semantics, R4 3.1.1.4.2).

A value stands for the whole interval its precision implies: ``2026`` is all of 2026,
``2026-11-22`` the whole day. Ranges are half-open ``[lo, hi)`` as UTC instants rendered
in the store's sortable text form (``YYYY-MM-DDTHH:MM:SS.ffffffZ``).
"""

from __future__ import annotations

import re
from datetime import UTC, date, datetime, timedelta, timezone
from functools import lru_cache

_DATE = re.compile(
    r"^(?P<y>\d{4})(?:-(?P<m>\d{2})(?:-(?P<d>\d{2})"
    r"(?:T(?P<H>\d{2}):(?P<M>\d{2})(?::(?P<S>\d{2})(?:\.(?P<f>\d+))?)?"
    r"(?P<tz>Z|[+-]\d{2}:\d{2})?)?)?)?$"
)
PREFIXES = ("eq", "ne", "gt", "lt", "ge", "le", "sa", "eb", "ap")


# The calendar's edges (Python's datetime, and the store's sortable text): a range that
# would end after the last instant, or start before the first one once moved to UTC, is
# clamped to them, so ``gt9999-12-31`` or ``0001-01-01T00:00:00+14:00`` is a search that
# finds what it can rather than an overflow (issue 32).
FIRST = "0001-01-01T00:00:00.000000Z"
LAST = "9999-12-31T23:59:59.999999Z"


def fmt(moment: datetime) -> str:
    try:
        # isoformat, not strftime: %Y writes year 1 as "1" on glibc, out of sort order
        return moment.astimezone(UTC).replace(tzinfo=None).isoformat(
            timespec="microseconds") + "Z"
    except OverflowError:
        return FIRST if moment.year == 1 else LAST


def _after(moment: datetime, delta: timedelta) -> str:
    try:
        return fmt(moment + delta)
    except OverflowError:
        return LAST


_SECOND = timedelta(seconds=1)
_ZERO = timedelta(0)


def _iso(moment: datetime) -> str:
    if moment.utcoffset() != _ZERO:
        moment = moment.astimezone(UTC)
    return moment.isoformat(timespec="microseconds")[:26] + "Z"


@lru_cache(maxsize=65536)
def date_range(value: str) -> tuple[str, str]:
    """The half-open UTC range ``[lo, hi)`` that a FHIR date/dateTime/instant covers.

    Cached and with fast paths for the two shapes most data has (a full date, a dateTime
    to the second with a zone): index extraction calls this on every write.
    """
    if len(value) == 10 and value[4] == "-" and value[7] == "-":
        try:
            day = date.fromisoformat(value)
        except ValueError:
            pass
        else:
            if day.year < 9999:
                return (f"{value}T00:00:00.000000Z",
                        f"{day + timedelta(days=1)}T00:00:00.000000Z")
    if len(value) in (20, 25) and value[10] == "T" and value[16] == ":" and value[19] in "Z+-":
        try:
            moment = datetime.fromisoformat(value)
        except ValueError:
            pass
        else:
            if moment.tzinfo is not None and 1 < moment.year < 9999:
                return _iso(moment), _iso(moment + _SECOND)
    return _parse_range(value)


def _parse_range(value: str) -> tuple[str, str]:
    match = _DATE.match(value.strip())
    if not match:
        raise ValueError(f"{value!r} is not a FHIR date, dateTime or instant")
    g = match.groupdict()
    tz = UTC
    if g["tz"] and g["tz"] != "Z":
        sign = 1 if g["tz"][0] == "+" else -1
        hours, minutes = int(g["tz"][1:3]), int(g["tz"][4:6])
        tz = timezone(sign * timedelta(hours=hours, minutes=minutes))
    year = int(g["y"])
    if g["m"] is None:
        lo = datetime(year, 1, 1, tzinfo=tz)
        return fmt(lo), _after(lo.replace(month=12, day=31), timedelta(days=1))
    month = int(g["m"])
    if g["d"] is None:
        lo = datetime(year, month, 1, tzinfo=tz)
        if month == 12:
            return fmt(lo), _after(lo.replace(day=31), timedelta(days=1))
        return fmt(lo), fmt(lo.replace(month=month + 1))
    day = datetime(year, month, int(g["d"]), tzinfo=tz)
    if g["H"] is None:
        return fmt(day), _after(day, timedelta(days=1))
    lo = day.replace(hour=int(g["H"]), minute=int(g["M"]))
    if g["S"] is None:
        return fmt(lo), _after(lo, timedelta(minutes=1))
    lo = lo.replace(second=int(g["S"]))
    if g["f"] is None:
        return fmt(lo), _after(lo, timedelta(seconds=1))
    digits = g["f"][:6]
    lo = lo.replace(microsecond=int(digits.ljust(6, "0")))
    return fmt(lo), _after(lo, timedelta(microseconds=10 ** (6 - len(digits))))


def split_prefix(value: str) -> tuple[str, str]:
    if len(value) > 2 and value[:2] in PREFIXES and not value[:2].isdigit():
        return value[:2], value[2:]
    return "eq", value


def approximate(lo: str, hi: str) -> tuple[str, str]:
    """``ap`` on dates: the range widened by 10% of its distance from now (R4 3.1.1.4.2),
    as every store adapter compares it."""
    def parse(text: str) -> datetime:
        return datetime.fromisoformat(text.replace("Z", "+00:00"))
    start, end, now = parse(lo), parse(hi), datetime.now(UTC)
    margin = abs(now - start) * 0.1
    try:
        low = max(start - margin, datetime(1, 1, 1, tzinfo=UTC)) if start.year > 1 else start
    except OverflowError:
        low = start.replace(year=1, month=1, day=1, hour=0, minute=0, second=0,
                            microsecond=0)
    return fmt(low), _after(end, margin)
