"""docs/recipe.md documents every field of the schema."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel

from flightdeck.recipe.schema import DataSource, Recipe

DOC = (Path(__file__).resolve().parents[2] / "docs" / "recipe.md").read_text()


def field_paths(model: type[BaseModel], prefix: str = "") -> list[str]:
    paths = []
    for name, info in model.model_fields.items():
        path = f"{prefix}{name}"
        paths.append(path)
        annotation = info.annotation
        for candidate in getattr(annotation, "__args__", (annotation,)):
            if (
                isinstance(candidate, type)
                and issubclass(candidate, BaseModel)
                and candidate is not DataSource
            ):
                paths.extend(field_paths(candidate, f"{path}."))
    return paths


def test_every_field_is_documented() -> None:
    missing = [p for p in field_paths(Recipe) if f"`{p}`" not in DOC and p not in ("env", "stages")]
    missing += [f"data.*.{n}" for n in DataSource.model_fields if f"`data.*.{n}`" not in DOC]
    assert missing == []
