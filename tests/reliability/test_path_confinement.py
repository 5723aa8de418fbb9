"""Recipe paths stay inside the worker's allowed roots (S001), checked on real directories and symlinks."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from service.recipe import Recipe, parse_recipe
from tests.service.factories import recipe
from worker.path_confinement import CODE, confinement_findings


@pytest.fixture
def layout(tmp_path: Path) -> dict[str, Path]:
    """A workspace with a model and data, an extra root, and a secret directory outside both."""
    workspace, extra, outside = tmp_path / "ws", tmp_path / "shared-data", tmp_path / "secret"
    (workspace / "models" / "tiny").mkdir(parents=True)
    (workspace / "data").mkdir()
    (workspace / "data" / "train.jsonl").write_text("{}\n")
    (workspace / "runs").mkdir()
    extra.mkdir()
    (extra / "big.jsonl").write_text("{}\n")
    outside.mkdir()
    (outside / "passwords.jsonl").write_text("{}\n")
    return {"workspace": workspace, "extra": extra, "outside": outside}


def _recipe(
    model: str = "models/tiny", train: tuple[str, ...] = ("data/train.jsonl",), **extra: Any
) -> Recipe:
    payload = recipe(**extra)
    payload["model"]["path"] = model
    payload["data"]["train"] = [{"path": p, "preset": "chartqa"} for p in train]
    return parse_recipe(payload)


def _paths(findings: list[Any]) -> list[str]:
    assert all(f.code == CODE and f.severity == "error" and f.where == "host" for f in findings)
    return [f.path for f in findings]


def test_paths_inside_the_roots_pass(layout: dict[str, Path]) -> None:
    ws = layout["workspace"]
    inside = _recipe(train=("data/train.jsonl", str(ws / "data"), "data/../data/train.jsonl"))
    assert confinement_findings(inside, ws) == []
    extra_root = _recipe(train=(str(layout["extra"] / "big.jsonl"),))
    assert confinement_findings(extra_root, ws, extra_roots=[layout["extra"]]) == []


def test_hub_ids_are_not_paths(layout: dict[str, Path]) -> None:
    assert confinement_findings(_recipe(model="meta-llama/Llama-2-7b-hf"), layout["workspace"]) == []


def test_dot_dot_escape_is_refused_with_the_recipe_path(layout: dict[str, Path]) -> None:
    hostile = _recipe(train=("data/train.jsonl", "../secret/passwords.jsonl"))
    findings = confinement_findings(hostile, layout["workspace"])
    assert _paths(findings) == ["data.train[1].path"]
    message = findings[0].message
    assert str(layout["workspace"].resolve()) in message and str(layout["outside"].resolve()) in message
    assert "relative to the workspace" in message  # says how to fix it


def test_absolute_paths_outside_the_roots_are_refused(layout: dict[str, Path]) -> None:
    hostile = _recipe(model=str(layout["outside"]), train=("/etc/passwd",))
    assert _paths(confinement_findings(hostile, layout["workspace"])) == ["model.path", "data.train[0].path"]
    # The same extra root that allows one directory does not allow its neighbour.
    assert confinement_findings(hostile, layout["workspace"], extra_roots=[layout["extra"]])


def test_model_path_with_dot_dot_is_never_taken_for_a_hub_id(layout: dict[str, Path]) -> None:
    hostile = _recipe(model="../secret/missing-model")
    assert _paths(confinement_findings(hostile, layout["workspace"])) == ["model.path"]


def test_symlinks_leading_out_are_refused(layout: dict[str, Path]) -> None:
    ws, outside = layout["workspace"], layout["outside"]
    os.symlink(outside / "passwords.jsonl", ws / "data" / "innocent.jsonl")
    os.symlink(outside, ws / "models" / "linked-model")
    os.symlink(outside, ws / "data" / "linked-dir")
    hostile = _recipe(
        model="models/linked-model", train=("data/innocent.jsonl", "data/linked-dir/passwords.jsonl")
    )
    findings = confinement_findings(hostile, ws)
    assert _paths(findings) == ["model.path", "data.train[0].path", "data.train[1].path"]
    assert all(str(outside.resolve()) in f.message for f in findings)


def test_a_symlink_inside_a_split_directory_is_refused(layout: dict[str, Path]) -> None:
    ws = layout["workspace"]
    split_dir = ws / "data" / "chartqa"
    split_dir.mkdir()
    (split_dir / "train.jsonl").write_text("{}\n")
    os.symlink(layout["outside"] / "passwords.jsonl", split_dir / "validation.jsonl")
    findings = confinement_findings(_recipe(train=("data/chartqa",)), ws)
    assert _paths(findings) == ["data.train[0].path"]
    assert "validation.jsonl" in findings[0].message


def test_symlinks_staying_inside_pass(layout: dict[str, Path]) -> None:
    ws = layout["workspace"]
    os.symlink(ws / "data" / "train.jsonl", ws / "data" / "alias.jsonl")
    os.symlink(layout["extra"], ws / "data" / "shared")
    inside = _recipe(train=("data/alias.jsonl", "data/shared/big.jsonl"))
    assert confinement_findings(inside, ws, extra_roots=[layout["extra"]]) == []
    assert _paths(confinement_findings(inside, ws)) == ["data.train[1].path"]  # without the extra root


def test_stages_are_checked_each_and_previous_is_not_a_path(layout: dict[str, Path]) -> None:
    staged = _recipe(
        stages=[
            {"name": "one"},
            {"model": {"path": "@previous"}, "data": {"train": [{"path": "../secret/passwords.jsonl"}]}},
        ]
    )
    assert _paths(confinement_findings(staged, layout["workspace"])) == ["stages[1].data.train[0].path"]


def test_run_directory_and_its_output_must_stay_inside(layout: dict[str, Path]) -> None:
    ws, outside = layout["workspace"], layout["outside"]
    run_dir = ws / "runs" / "job-1-attempt-1"
    assert confinement_findings(_recipe(), ws, run_dir=run_dir) == []  # not created yet: fine
    run_dir.mkdir()
    os.symlink(outside, run_dir / "output")
    assert _paths(confinement_findings(_recipe(), ws, run_dir=run_dir)) == ["run_dir"]
    os.symlink(outside, ws / "runs" / "job-2-attempt-1")
    linked = confinement_findings(_recipe(), ws, run_dir=ws / "runs" / "job-2-attempt-1")
    assert "run_dir" in _paths(linked) and "runs directory" in linked[0].message
