"""A source above the worker's size threshold (FLIGHTDECK_STREAMING_ABOVE_MB) is streamed without being
asked; D009 still asks for training.max_steps, at host preflight, before anything launches. The threshold
is set small here: a corpus of a few KB stands in for one of tens of GB."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from torch.utils.data import IterableDataset

from flightdeck.recipe import parse_recipe
from flightdeck.worker.host_preflight.data_rules import check_data
from flightdeck.worker.train.data import open_training_data
from flightdeck.worker.train.data_sources import STREAMING_ABOVE_VARIABLE, with_auto_streaming

from .conftest import RunOutcome


def _recipe(path: str, **training: Any) -> Any:
    return parse_recipe(
        {
            "name": "auto-stream",
            "task": "masked_lm",
            "model": {"path": "models/tiny-bert", "dtype": "float32"},
            "adapter": None,
            "data": {"train": [{"path": path, "preset": "text"}], "num_workers": 0},
            "training": {"per_device_batch_size": 2, "gradient_accumulation_steps": 1, **training},
            "resources": {"gpus_per_node": 1, "accelerator": "any"},
        }
    )


def _corpus(tmp_path: Path) -> Path:
    (tmp_path / "corpus.txt").write_text("".join(f"line number {i} of the corpus\n" for i in range(400)))
    return tmp_path  # ~11 KB


def test_a_source_above_the_threshold_is_streamed_and_one_below_is_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    workspace = _corpus(tmp_path)
    recipe = _recipe("corpus.txt", max_steps=3)
    assert with_auto_streaming(recipe, workspace) is recipe  # default threshold: 16 GiB
    monkeypatch.setenv(STREAMING_ABOVE_VARIABLE, "0.005")  # 5 KB
    streamed = with_auto_streaming(recipe, workspace)
    assert streamed.data.train[0].streaming and not recipe.data.train[0].streaming
    data = open_training_data(streamed.data.train, workspace, task="masked_lm")
    assert isinstance(data, IterableDataset)  # no Arrow conversion, no length
    monkeypatch.setenv(STREAMING_ABOVE_VARIABLE, "1")  # 1 MB: the corpus is below it
    assert with_auto_streaming(recipe, workspace) is recipe


def test_d009_asks_for_max_steps_when_a_source_is_streamed_for_its_size(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    workspace = _corpus(tmp_path)
    assert not [f for f in check_data(_recipe("corpus.txt"), workspace, None) if f.code == "D009"]
    monkeypatch.setenv(STREAMING_ABOVE_VARIABLE, "0.005")
    (finding,) = [f for f in check_data(_recipe("corpus.txt"), workspace, None) if f.code == "D009"]
    assert finding.path == "training.max_steps" and finding.severity == "error"
    assert STREAMING_ABOVE_VARIABLE in finding.message and "corpus.txt" in finding.message
    assert finding.fix and finding.fix.startswith(
        f"set training.max_steps, or raise {STREAMING_ABOVE_VARIABLE}"
    )
    bounded = check_data(_recipe("corpus.txt", max_steps=3), workspace, None)
    assert not [f for f in bounded if f.code == "D009"]


def test_a_threshold_that_is_not_a_number_names_the_variable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    workspace = _corpus(tmp_path)
    monkeypatch.setenv(STREAMING_ABOVE_VARIABLE, "16GB")
    (finding,) = check_data(_recipe("corpus.txt"), workspace, None)
    assert finding.code == "D009" and finding.path == "data.train[0].streaming"
    assert STREAMING_ABOVE_VARIABLE in finding.message and "positive number of MB" in finding.message
    assert finding.fix and finding.fix.startswith(f"set {STREAMING_ABOVE_VARIABLE} on the worker")


@pytest.mark.slow  # real torchrun, one rank: ~20 s
def test_the_trainer_streams_a_corpus_above_the_threshold(
    workspace: Path,
    monkeypatch: pytest.MonkeyPatch,
    make_recipe: Callable[..., dict[str, Any]],
    run_trainer: Callable[..., RunOutcome],
) -> None:
    monkeypatch.setenv(STREAMING_ABOVE_VARIABLE, "0.001")  # the ranks inherit the worker's environment
    recipe = make_recipe(
        task="masked_lm",
        model={"path": "models/tiny-bert"},
        adapter=None,
        data={"train": [{"path": "data/corpus.txt", "preset": "text"}], "num_workers": 0},
        training={"max_steps": 2},
        resources={"gpus_per_node": 1},
    )
    outcome = run_trainer(recipe, nproc=1)
    assert outcome.returncode == 0, outcome.describe()
    assert "above the size threshold" in outcome.output and "dataset has a stream" in outcome.output
    assert [s["step"] for s in outcome.steps] == [1, 2]
