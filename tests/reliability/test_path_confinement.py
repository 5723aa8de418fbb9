"""Recipe paths stay inside the worker's allowed roots (S001), checked on real directories and symlinks."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from flightdeck.recipe import Recipe, parse_recipe
from flightdeck.worker.path_confinement import CODE, confinement_findings
from tests.service.factories import recipe


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
    inside = _recipe(train=("data/train.jsonl", str(ws / "data"), "./data/train.jsonl"))
    assert confinement_findings(inside, ws) == []
    extra_root = _recipe(train=(str(layout["extra"] / "big.jsonl"),))
    assert confinement_findings(extra_root, ws, extra_roots=[layout["extra"]]) == []


def test_hub_ids_are_not_paths(layout: dict[str, Path]) -> None:
    assert confinement_findings(_recipe(model="meta-llama/Llama-2-7b-hf"), layout["workspace"]) == []


@pytest.mark.parametrize(
    ("model", "train", "path"),
    [
        ("models/tiny", "../secret/passwords.jsonl", "data.train[1].path"),
        ("models/tiny", "data/../../secret/passwords.jsonl", "data.train[1].path"),
        ("../secret/missing-model", "data/train.jsonl", "model.path"),
        ("models\\..\\..\\secret", "data/train.jsonl", "model.path"),
    ],
)
def test_dot_dot_is_refused_at_submit_with_the_recipe_path(model: str, train: str, path: str) -> None:
    """Before any worker sees it (POST /jobs and /preflight parse the same way)."""
    from flightdeck.recipe import RecipeInvalid

    with pytest.raises(RecipeInvalid) as refused:
        _recipe(model=model, train=("data/train.jsonl", train))
    findings = {f.path: f.message for f in refused.value.findings}
    assert path in findings and "'..'" in findings[path], findings


def test_a_path_leading_out_names_the_roots_and_not_what_lies_outside(layout: dict[str, Path]) -> None:
    os.symlink(layout["outside"] / "passwords.jsonl", layout["workspace"] / "data" / "alias.jsonl")
    hostile = _recipe(train=("data/train.jsonl", "data/alias.jsonl"))
    findings = confinement_findings(hostile, layout["workspace"])
    assert _paths(findings) == ["data.train[1].path"]
    message = findings[0].message
    # The roots are named; what lies outside them is not revealed.
    assert str(layout["workspace"].resolve()) in message and str(layout["outside"].resolve()) not in message
    assert "relative to the workspace" in message  # says how to fix it


def test_absolute_paths_outside_the_roots_are_refused(layout: dict[str, Path]) -> None:
    hostile = _recipe(model=str(layout["outside"]), train=("/etc/passwd",))
    assert _paths(confinement_findings(hostile, layout["workspace"])) == ["model.path", "data.train[0].path"]
    # The same extra root that allows one directory does not allow its neighbour.
    assert confinement_findings(hostile, layout["workspace"], extra_roots=[layout["extra"]])


def test_model_path_with_dot_dot_is_never_taken_for_a_hub_id(layout: dict[str, Path]) -> None:
    from flightdeck.worker.path_confinement import is_hub_id

    assert not is_hub_id("../secret", layout["workspace"])  # shaped like org/name, but a path
    assert is_hub_id("acme/model", layout["workspace"])


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
    assert not any(str(outside.resolve()) in f.message for f in findings)  # never revealed


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
            {
                "model": {"path": "@previous"},
                "data": {"train": [{"path": str(layout["outside"] / "passwords.jsonl")}]},
            },
        ]
    )
    assert _paths(confinement_findings(staged, layout["workspace"])) == ["stages[1].data.train[0].path"]


def test_run_directory_and_its_output_must_stay_inside(layout: dict[str, Path]) -> None:
    ws, outside = layout["workspace"], layout["outside"]
    run_dir = ws / "runs" / "20261127-0a1b2c3d" / "job-1-attempt-1"  # <runs>/<database>/job-...
    assert confinement_findings(_recipe(), ws, run_dir=run_dir) == []  # not created yet: fine
    run_dir.mkdir(parents=True)
    os.symlink(outside, run_dir / "output")
    assert _paths(confinement_findings(_recipe(), ws, run_dir=run_dir)) == ["run_dir"]
    os.symlink(outside, ws / "runs" / "20261127-0a1b2c3d" / "job-2-attempt-1")
    linked = confinement_findings(
        _recipe(), ws, run_dir=ws / "runs" / "20261127-0a1b2c3d" / "job-2-attempt-1"
    )
    assert "run_dir" in _paths(linked) and "runs directory" in linked[0].message
    # A database's folder that is a link out of the workspace takes its run directories with it.
    os.symlink(outside, ws / "runs" / "20261101-ffffffff")
    linked = confinement_findings(
        _recipe(), ws, run_dir=ws / "runs" / "20261101-ffffffff" / "job-1-attempt-1"
    )
    assert "run_dir" in _paths(linked) and "runs directory" in linked[0].message


def test_a_hub_id_is_never_read_from_the_agents_own_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from flightdeck.inventory import WorkerInventory
    from flightdeck.worker.host_preflight import run_host_preflight

    workspace, elsewhere = tmp_path / "ws", tmp_path / "elsewhere"
    (workspace / "data").mkdir(parents=True)
    (workspace / "data" / "qa.jsonl").write_text(json.dumps({"query": "q", "label": ["a"]}) + "\n")
    shadow = elsewhere / "acme" / "secret-model"
    shadow.mkdir(parents=True)
    (shadow / "config.json").write_text('{"model_type": "llama", "hidden_size": 4242}')
    monkeypatch.chdir(elsewhere)  # an agent started from another directory
    recipe = _recipe(model="acme/secret-model", train=("data/qa.jsonl",))
    assert confinement_findings(recipe, workspace) == []  # shaped like a hub id: no S001
    inventory = WorkerInventory(cpu_slots=1, cores=1, workspace=str(workspace))
    result = run_host_preflight(recipe, inventory, workspace, [], environ={})
    errors = [f for f in result.findings if f.severity == "error" and f.path == "model.path"]
    assert errors, result.findings  # not loaded from elsewhere/acme/secret-model
    assert "4242" not in str(result.findings) and str(elsewhere) not in str(result.findings)


def test_the_trainer_finds_a_recipes_model_where_the_host_check_found_it(
    layout: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    from flightdeck.run_variables import WORKSPACE_VARIABLE
    from flightdeck.worker.train.recipe_run import RecipeRun

    ws, elsewhere = layout["workspace"], layout["outside"]
    for shadow in ("acme/secret-model", "models/not/built"):  # what transformers would read from "."
        (elsewhere / shadow).mkdir(parents=True)
    run_dir = ws / "runs" / "20261127-0a1b2c3d" / "job-1-attempt-1"
    run_dir.mkdir(parents=True)
    (run_dir / "recipe.json").write_text("{}")
    monkeypatch.setenv(WORKSPACE_VARIABLE, str(ws))
    monkeypatch.chdir(elsewhere)  # a rank started from another directory
    run = RecipeRun(run_dir / "recipe.json")
    located = {
        given: run._model_path(0, _recipe(model=given))
        for given in ("models/tiny", "acme/secret-model", "acme/other-model", "models/not/built")
    }
    assert located == {
        "models/tiny": str(ws / "models" / "tiny"),
        "acme/secret-model": str(ws / "acme" / "secret-model"),  # shadowed here: the workspace's, missing
        "acme/other-model": "acme/other-model",  # a hub id, read from the hub cache
        "models/not/built": str(ws / "models/not/built"),  # not a hub id: never read relative to "."
    }


def test_an_env_value_with_a_trailing_newline_is_refused() -> None:
    from flightdeck.recipe import RecipeInvalid, parse_recipe

    with pytest.raises(RecipeInvalid) as refused:
        parse_recipe({"name": "x", "entrypoint": {"script": "t.py"}, "env": {"NCCL_DEBUG": "INFO\n"}})
    assert [f.path for f in refused.value.findings] == ["env.NCCL_DEBUG"]


def test_a_symlink_in_a_hub_snapshots_subfolder_is_refused(layout: dict[str, Path]) -> None:
    # datasets reads data/<split>-0000i-of-0000n.parquet from a snapshot's subfolders: so is a link there.
    ws = layout["workspace"]
    shards = ws / "data" / "snapshot" / "data"
    shards.mkdir(parents=True)
    (shards / "train-00000-of-00002.parquet").write_text("x")
    os.symlink(layout["outside"] / "passwords.jsonl", shards / "train-00001-of-00002.parquet")
    findings = confinement_findings(_recipe(train=("data/snapshot",)), ws)
    assert _paths(findings) == ["data.train[0].path"]
    assert "data/train-00001-of-00002.parquet" in findings[0].message
