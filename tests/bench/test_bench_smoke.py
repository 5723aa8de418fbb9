"""Every benchmark runs once in a tiny configuration, so none can rot; no timing is asserted.

In the `slow` run (CI runs it): each starts its own service, and together they took about 17 s of the
default run.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import orjson
import pytest
import typer

from bench import claim, dispatch, ingest, read, time_to_diagnosis

pytestmark = pytest.mark.slow


def _common(tmp_path: Path) -> list[str]:
    return [
        "--reps",
        "1",
        "--no-mlflow",
        "--results-dir",
        str(tmp_path / "results"),
        "--work-dir",
        str(tmp_path / "work"),
    ]


def _written(tmp_path: Path, name: str) -> dict[str, object]:
    [path] = (tmp_path / "results").glob(f"{name}-*.json")
    return dict(orjson.loads(path.read_bytes()))


def test_ingest_runs_and_checks_idempotency(tmp_path: Path) -> None:
    result = ingest.main([*_common(tmp_path), "--batches", "3", "--steps-per-batch", "10", "--keys", "3"])
    assert set(result["flightdeck"]) == {"sqlite", "postgres"}  # both databases, in the one command
    for figures in result["flightdeck"].values():
        assert figures["points_per_second"]["n"] == 1 and figures["rss_peak_mb"] > 0
    assert result["mlflow"] is None
    assert _written(tmp_path, "ingest")["benchmark"] == "ingest"


def test_read_runs_series_and_downsampled_views(tmp_path: Path) -> None:
    result = read.main(
        [
            *_common(tmp_path),
            "--steps",
            "50",
            "--keys",
            "2",
            "--big-points",
            "2000",
            "--buckets",
            "10",
            "--requests",
            "2",
        ]
    )
    for figures in result["flightdeck"].values():
        assert figures["series"]["all_ms"]["n"] == 2 and figures["downsampled"]["all_ms"]["n"] == 2
    assert set(result["flightdeck"]) == {"sqlite", "postgres"}
    assert _written(tmp_path, "read")["mlflow"] is None


def test_claim_takes_every_job_exactly_once_on_each_path(tmp_path: Path) -> None:
    result = claim.main(
        [
            *_common(tmp_path),
            "--jobs",
            "12",
            "--clients",
            "3",
            "--submit-threads",
            "2",
            "--paths",
            "batched,plain",
        ]
    )
    for by_path in result["databases"].values():
        assert set(by_path) == {"batched", "plain"}
        for figures in by_path.values():
            assert sum(r["claim_ms"]["n"] for r in figures["runs"]) == 12
    assert set(result["databases"]) == {"sqlite", "postgres"}
    assert _written(tmp_path, "claim")["benchmark"] == "claim"


def test_realistic_claims_answer_every_scheduled_claim_after_a_restart(tmp_path: Path) -> None:
    arguments = ["--load", "realistic", "--databases", "sqlite", "--paths", "batched,plain", "--agents", "4"]
    schedule = ["--interval-s", "0.2,0.4", "--load-factors", "1", "--duration-s", "1"]
    result = claim.main([*_common(tmp_path), *arguments, *schedule])
    for scenarios in result["databases"]["sqlite"].values():
        assert scenarios["burst"]["got_a_job"] == 4 and scenarios["burst"]["errors"] == 0
        steady = scenarios["steady x1"]
        assert steady["offered"] >= 4 and steady["got_a_job"] == steady["offered"] and steady["errors"] == 0
    assert set(result["databases"]["sqlite"]) == {"batched", "plain"}


def test_dispatch_to_a_long_polling_claim(tmp_path: Path) -> None:
    result = dispatch.main([*_common(tmp_path), "--claim-only", "--jobs", "2"])
    assert result["dispatch_ms"]["n"] == 2
    assert result["measured_until"] == "claim answered"


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="the agent's trainer needs torch")
def test_dispatch_to_a_real_agent_starting_torchrun(tmp_path: Path) -> None:
    result = dispatch.main([*_common(tmp_path), "--jobs", "1", "--warmup", "0"])
    assert result["dispatch_ms"]["n"] == 1
    assert result["measured_until"] == "torchrun started"


def test_data_opens_a_small_corpus_with_both_loaders(tmp_path: Path) -> None:
    from bench import data

    result = data.main(
        [
            *("--lines", "2000", "--loader-workers", "1"),
            *("--results-dir", str(tmp_path / "results"), "--work-dir", str(tmp_path / "work")),
        ]
    )
    # Both loaders see the same samples (the blank line of every thousand left out) and were measured.
    assert {result[name]["samples"] for name in ("old", "datasets_cold", "datasets_warm")} == {1998}
    assert all(result[name]["peak_pss_mb"] > 0 for name in ("old", "datasets_cold", "datasets_warm"))
    # Each loader's 1,000-line baseline, and the corpus's own cost over it.
    assert result["old_baseline"]["samples"] == result["datasets_baseline"]["samples"] == 999
    assert all("peak_pss_anon_mb" in result[name]["corpus"] for name in ("old", "datasets_warm"))
    # The corpus streamed (nothing tokenised ahead): each rank's first batch, over its own baseline.
    assert result["streaming"]["samples"] == 16 and "first_batch_s" in result["streaming"]["corpus"]
    assert result["streamed_by_default"] is False  # 2,000 lines are far below the worker's threshold
    assert _written(tmp_path, "data")["loader_workers"] == 1


def test_data_stops_when_a_rank_dies_before_its_first_batch(tmp_path: Path) -> None:
    """A rank that cannot open its loader exits; the benchmark says so instead of waiting an hour."""
    from bench import data

    corpus = tmp_path / "corpus.txt"
    data.write_corpus(corpus, 10)
    with pytest.raises(RuntimeError, match="before their first batch"):
        data.measure(
            str(tmp_path / "no-such-loader.py"), corpus, tmp_path / "no-tokenizer", tmp_path / "cache"
        )


def test_the_old_loader_is_pointed_at_where_its_imports_live_now() -> None:
    from bench import data

    old = "from service.recipe.schema import DataSource\nfrom worker.train.collate import C\n"
    assert data._current_imports(old) == (
        "from flightdeck.recipe.schema import DataSource\nfrom flightdeck.worker.train.collate import C\n"
    )


def test_time_to_diagnosis_names_an_unknown_case_before_starting_a_service(tmp_path: Path) -> None:
    # A typo in --cases is answered with the codes there are, not a KeyError after the service started.
    with pytest.raises(
        typer.BadParameter, match=r"unknown case.*H3.*choose from D005.*H002.*H004.*H007.*G002"
    ):
        time_to_diagnosis.main(["--runs", "1", "--cases", "H002,H3", "--results-dir", str(tmp_path)])
    assert not list(tmp_path.iterdir())


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="the tiny training runs need torch")
def test_monitor_overhead_runs_each_variant_against_its_baseline_in_one_command(tmp_path: Path) -> None:
    from bench import monitor_overhead

    argv = ["--runs", "2", "--steps", "8", "--variants", "instrumented,loop_instrumented"]
    result = monitor_overhead.main([*argv, "--results-dir", str(tmp_path / "results")])
    # The baselines were added and run in the same command, interleaved with what they are compared to.
    assert {name: len(result[name]) for name in ("plain", "instrumented", "loop", "loop_instrumented")} == {
        "plain": 2,
        "instrumented": 2,
        "loop": 2,
        "loop_instrumented": 2,
    }
    assert "callback" not in result and "monitored" not in result
    # The instrumented Trainer's own hooks (the injected callback's) and the loop watch's were timed.
    assert all(run["hooks"] > 0 and run["hooks_cpu"] > 0 for run in result["instrumented"])
    assert all(run["hooks"] > 0 for run in result["loop_instrumented"])
    assert result["instrumented_paired_ratio"] > 0 and result["goal"] == 1.02
    assert _written(tmp_path, "monitor_overhead")["benchmark"] == "monitor_overhead"


@pytest.mark.skipif(
    importlib.util.find_spec("torch") is None, reason="the loop and the host check need torch"
)
def test_cold_start_runs_each_variant_after_its_baseline_and_says_what_each_loaded(tmp_path: Path) -> None:
    from bench import cold_start

    result = cold_start.main(
        [
            *("--reps", "1", "--variants", "loop,host-check,recipe-rank+bitsandbytes"),
            *("--results-dir", str(tmp_path / "results")),
        ]
    )
    # Each baseline was added, before its variant.
    assert list(result) == ["loop-bare", "loop", "host-check", "recipe-rank", "recipe-rank+bitsandbytes"]
    assert result["loop"]["baseline"] == "loop-bare" and result["loop"]["ratio"] > 0
    # A watched plain loop's first step loads nothing of transformers; the host check only transformers;
    # a recipe rank that does not quantise keeps bitsandbytes out.
    assert {name: run["loaded"] for name, run in result.items()} == {
        "loop-bare": [],
        "loop": [],
        "host-check": ["transformers"],
        "recipe-rank": ["peft", "transformers"],
        "recipe-rank+bitsandbytes": ["bitsandbytes", "peft", "transformers"],
    }
    assert _written(tmp_path, "cold_start")["benchmark"] == "cold_start"


def test_cold_start_names_an_unknown_variant() -> None:
    from bench import cold_start

    with pytest.raises(typer.BadParameter, match=r"unknown variant.*'lop'.*choose from loop-bare"):
        cold_start.chosen_variants("loop,lop")


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="the tiny loop needs torch")
def test_monitor_overhead_times_each_loop_watched_and_bare_by_turns_with_its_null_beside(
    tmp_path: Path,
) -> None:
    from bench import monitor_overhead

    argv = ["--runs", "2", "--steps", "60", "--variants", "loop_blocks,loop_clip_blocks"]
    result = monitor_overhead.main([*argv, "--results-dir", str(tmp_path / "results")])
    for variant in ("loop_blocks", "loop_clip_blocks"):
        # Blocks of 6 steps, the first a warm-up: per run W | B B W W B B W W B, 4 watched pairs, 2 null.
        assert result[f"{variant}_pairs"] == 8
        low, high = result[f"{variant}_interval"]
        assert 0 < low <= result[f"{variant}_ratio"] <= high
        null_low, null_high = result[f"{variant}_null_interval"]
        assert 0 < null_low <= result[f"{variant}_null_ratio"] <= null_high
        # The watch ran in its blocks (its hooks timed per watched step); no other variant ran.
        assert result[f"{variant}_hook_s_per_step"] > 0
        assert variant not in result
    assert "loop" not in result and "loop_clip" not in result
    assert _written(tmp_path, "monitor_overhead")["loop_clip_blocks_pairs"] == 8


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="the tiny loop needs torch")
def test_monitor_overhead_says_how_many_steps_the_blocks_need(tmp_path: Path) -> None:
    from bench import monitor_overhead

    with pytest.raises(typer.BadParameter, match=r"too few blocks.*1 watched pairs.*--steps at least 48"):
        monitor_overhead.main(["--runs", "1", "--steps", "24", "--variants", "loop_blocks"])


def test_monitor_overhead_names_an_unknown_variant() -> None:
    from bench import monitor_overhead

    with pytest.raises(typer.BadParameter, match=r"unknown variant.*instrumentd.*choose from plain"):
        monitor_overhead.chosen_variants("plain,instrumentd")


def test_dispatch_names_an_unknown_executor(tmp_path: Path) -> None:
    from bench import dispatch

    with pytest.raises(typer.BadParameter, match=r"'kubernetes': use 'agent' or 'slurm'"):
        dispatch.main(["--executor", "kubernetes", "--results-dir", str(tmp_path)])
