"""The CDC Early Aberration Reporting System (EARS) C1, C2 and C3 algorithms on a series
of daily counts (Hutwagner et al. 2003; parameters in ``data/syndromes.json``).

For day *t* with count *x_t*, and the mean *m* and sample standard deviation *s* of a
baseline of ``baseline_days`` days:

- **C1**: baseline the 7 days before *t*; ``C1 = (x_t - m) / s``, a signal above 3;
- **C2**: baseline the 7 days before a 2-day guard band (days t-9 … t-3), so a rise that
  began yesterday does not hide in its own baseline; a signal above 3;
- **C3**: ``sum over i = 0, 1, 2 of max(0, C2_{t-i} - 1)``, a signal above 2 (a run of
  moderately high days).

A baseline without variation has ``s = 0``; ``min_sigma`` (as the ``minSigma`` of R's
``surveillance::earsC``) keeps the statistic finite, so one case after a week of none
still signals for a rare syndrome. A day below ``min_count`` never signals.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from platform_api.public_health.knowledge import EarsParameters

METHODS = ("C1", "C2", "C3")


@dataclass(frozen=True)
class Evaluation:
    method: str
    index: int  # the day's position in the series
    count: int
    statistic: float
    threshold: float
    baseline_mean: float
    baseline_sd: float
    signal: bool


def history_needed(p: EarsParameters) -> int:
    """Days of counts before the first day evaluated that C3 needs (C2 two days back)."""
    return p.baseline_days + p.c2_guard_days + 2


def _c(counts: Sequence[int], t: int, guard: int, p: EarsParameters
       ) -> tuple[float, float, float] | None:
    end = t - guard  # the baseline is counts[end - baseline_days : end]
    start = end - p.baseline_days
    if start < 0:
        return None
    baseline = counts[start:end]
    mean = statistics.fmean(baseline)
    sd = statistics.stdev(baseline) if len(baseline) > 1 else 0.0
    return (counts[t] - mean) / max(sd, p.min_sigma), mean, sd


def evaluate(counts: Sequence[int], t: int, p: EarsParameters) -> list[Evaluation]:
    """C1, C2 and C3 of day ``t`` (those the series is long enough for)."""
    found: list[Evaluation] = []
    count = counts[t]
    enough = count >= p.min_count
    c1 = _c(counts, t, 0, p)
    if c1 is not None:
        found.append(Evaluation("C1", t, count, round(c1[0], 3), p.c1_threshold,
                                round(c1[1], 3), round(c1[2], 3),
                                enough and c1[0] > p.c1_threshold))
    c2_guard = p.c2_guard_days
    c2 = _c(counts, t, c2_guard, p)
    if c2 is not None:
        found.append(Evaluation("C2", t, count, round(c2[0], 3), p.c2_threshold,
                                round(c2[1], 3), round(c2[2], 3),
                                enough and c2[0] > p.c2_threshold))
    recent = [_c(counts, t - i, c2_guard, p) for i in range(3)] if t >= 2 else []
    if recent and all(r is not None for r in recent):
        c3 = sum(max(0.0, r[0] - p.c3_excess) for r in recent if r is not None)
        assert c2 is not None
        found.append(Evaluation("C3", t, count, round(c3, 3), p.c3_threshold,
                                round(c2[1], 3), round(c2[2], 3),
                                enough and c3 > p.c3_threshold))
    return found
