"""bench.harness.median_interval: the interval the block-paired benchmarks print beside their median."""

from __future__ import annotations

import math
import random

import pytest

from bench.harness import median_interval


def test_the_interval_holds_the_true_median_of_skewed_timings_about_95_times_in_100() -> None:
    # Step times are skewed (a preempted step is far slower, never far quicker): lognormal, median 1.
    rng = random.Random(7)
    trials, held = 600, 0
    for _ in range(trials):
        low, high = median_interval([rng.lognormvariate(0.0, 0.4) for _ in range(200)])
        held += low <= 1.0 <= high
    assert 0.93 <= held / trials <= 0.975


def test_the_interval_is_the_order_statistics_either_side_of_the_middle() -> None:
    values = list(range(100))
    random.Random(1).shuffle(values)
    # n 100: ranks 50 -+ 1.96 * 10 / 2, counted from 1: the 40th and the 61st.
    assert median_interval(values) == (39, 60)
    # It narrows as the square root of the count.
    low, high = median_interval(list(range(10_000)))
    assert (low, high) == (4901, 5098) and math.isclose(high - low, 197)


def test_two_values_are_their_own_interval_and_one_is_too_few() -> None:
    assert median_interval([2.0, 1.0]) == (1.0, 2.0)
    with pytest.raises(ValueError, match="needs 2 values or more, not 1"):
        median_interval([1.0])
