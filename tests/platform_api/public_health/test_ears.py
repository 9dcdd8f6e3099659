"""The EARS C1, C2 and C3 algorithms (platform_api/public_health/ears.py)."""

from __future__ import annotations

import statistics

import pytest

from platform_api.public_health.ears import evaluate, history_needed
from platform_api.public_health.knowledge import ears_parameters

P = ears_parameters()


def _by_method(counts: list[int], t: int | None = None) -> dict[str, object]:
    t = len(counts) - 1 if t is None else t
    return {e.method: e for e in evaluate(counts, t, P)}


def test_c1_compares_the_day_with_the_seven_days_before():
    week = [2, 3, 2, 3, 2, 3, 2]
    found = _by_method([0, 0, 0, 0, *week, 5])["C1"]
    mean, sd = statistics.fmean(week), statistics.stdev(week)
    assert found.baseline_mean == pytest.approx(mean, abs=1e-3)
    assert found.statistic == pytest.approx((5 - mean) / sd, abs=1e-3)
    assert found.signal is True and found.threshold == 3.0
    assert _by_method([0, 0, 0, 0, *week, 3])["C1"].signal is False


def test_c2_leaves_a_two_day_guard_band():
    # a rise that began two days ago is in C1's baseline but not in C2's
    counts = [2, 3, 2, 3, 2, 3, 2, 2, 3, 9, 9, 9]
    found = _by_method(counts)
    assert found["C2"].baseline_mean == pytest.approx(statistics.fmean(counts[2:9]),
                                                      abs=1e-3)
    assert found["C2"].signal is True
    assert found["C1"].signal is False  # its baseline already holds the 9s


def test_c3_sums_three_days_of_c2_above_one():
    counts = [2, 3, 2, 3, 2, 3, 2, 2, 3, 2, 4, 4, 4]
    found = _by_method(counts)
    c2s = [_by_method(counts, len(counts) - 1 - i)["C2"].statistic for i in range(3)]
    assert found["C3"].statistic == pytest.approx(sum(max(0, c - 1) for c in c2s), abs=1e-2)
    assert found["C3"].signal is (found["C3"].statistic > 2)


def test_a_flat_baseline_uses_the_minimum_sigma():
    found = _by_method([0] * 11 + [1])
    assert found["C1"].statistic == pytest.approx(1 / P.min_sigma)
    assert found["C1"].signal and found["C2"].signal
    quiet = _by_method([0] * 12)
    assert not any(e.signal for e in quiet.values())  # no case, no signal


def test_the_series_must_reach_back_far_enough():
    assert [e.method for e in evaluate([1] * 7 + [2], 7, P)] == ["C1"]
    assert {e.method for e in evaluate([1] * 12, history_needed(P), P)} == {"C1", "C2", "C3"}
