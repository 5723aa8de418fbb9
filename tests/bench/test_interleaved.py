"""bench.harness.interleaved: the repetition order every comparing benchmark shares."""

from __future__ import annotations

from bench.harness import interleaved


def test_every_variant_runs_once_per_round_each_round_starting_one_later() -> None:
    order: list[str] = []

    def measure(variant: str) -> str:
        order.append(variant)
        return f"{variant}{len(order)}"

    results = interleaved(3, ["a", "b", "c"], measure)
    assert order == ["a", "b", "c", "b", "c", "a", "c", "a", "b"]
    # Per variant, in round order: round r's result is the r-th of each list (pairs for paired ratios).
    assert results == {"a": ["a1", "a6", "a8"], "b": ["b2", "b4", "b9"], "c": ["c3", "c5", "c7"]}


def test_no_rounds_and_no_variants_measure_nothing() -> None:
    assert interleaved(0, ["a"], lambda v: 1 / 0) == {"a": []}
    assert interleaved(2, [], lambda v: 1 / 0) == {}
