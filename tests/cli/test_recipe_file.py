"""Reading a recipe file written as YAML: what YAML has that JSON has not."""

from __future__ import annotations

from pathlib import Path

import pytest

from flightdeck.cli.recipe_file import RecipeFileError, read_recipe_file


def test_yaml_dates_times_and_tagged_values_arrive_as_text(tmp_path: Path) -> None:
    path = tmp_path / "r.yml"
    path.write_text("name: 2026-11-29\nstarted: 2026-11-29T10:00:00\nenv: {WANDB_MODE: !!binary aGk=}\n")
    assert read_recipe_file(path) == {
        "name": "2026-11-29",
        "started": "2026-11-29T10:00:00",
        "env": {"WANDB_MODE": "b'hi'"},
    }


def test_a_key_that_is_not_text_is_named_with_where_it_is(tmp_path: Path) -> None:
    # `1: a` beside `"1": b` would become one key once sent as JSON.
    path = tmp_path / "r.yaml"
    path.write_text('name: x\ntraining:\n  1: a\n  "1": b\n')
    with pytest.raises(RecipeFileError, match=r"the key 1 in training is not text: quote it \(\"1\"\)"):
        read_recipe_file(path)
    path.write_text("? [a, b]\n: c\n")
    with pytest.raises(RecipeFileError, match=r"the key \('a', 'b'\) is not text"):
        read_recipe_file(path)
