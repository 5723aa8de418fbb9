"""`flightdeck make-tiny-model` and `make-demo-data`: local tiny models and datasets for demos and tests."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

import typer


def register(app: typer.Typer) -> None:
    """Add the `make-tiny-model` and `make-demo-data` commands to `app`."""
    app.command("make-tiny-model")(make_tiny_model)
    app.command("make-demo-data")(make_demo_data)
    app.command("make-demo-workspace")(make_demo_workspace)


def make_tiny_model(
    directory: Annotated[Path, typer.Argument(help="Where to write the model and its tokenizer.")],
    arch: Annotated[
        Literal["llama", "qwen2", "bert", "qwen2_vl", "qwen2_5_vl", "llava_siglip"],
        typer.Option(
            help="llama or qwen2 (causal LM), bert (masked LM), qwen2_vl, qwen2_5_vl or llava_siglip (vision-language: "
            "image processor and chat template saved beside the model)."
        ),
    ] = "llama",
    seed: Annotated[int, typer.Option(help="Seed for the random weights.")] = 0,
) -> None:
    """Build a 2-layer, hidden-64 model with a BPE tokenizer trained on the fly (seconds, no download)."""
    # torch and transformers live only in the worker image: import them when the command runs.
    from flightdeck.worker.tiny.model import make_tiny_model as build

    out = build(directory, arch, seed=seed)
    typer.echo(f"tiny {arch} model written to {out}")
    typer.echo(f'use it in a recipe as "model": {{"path": "{out}"}}')


def make_demo_data(
    directory: Annotated[Path, typer.Argument(help="Where to write the datasets.")],
    text_lines: Annotated[int, typer.Option(min=1, help="Lines in the masked-LM text corpus.")] = 2000,
    seed: Annotated[int, typer.Option(help="Seed for the generated rows.")] = 0,
) -> None:
    """Write datasets shaped like ChartQA, InfoVQA, OCR-VQA (text-only and with images), alpaca and a corpus."""
    from flightdeck.worker.tiny.demo_data import make_demo_data as build

    for name, path in build(directory, seed=seed, text_lines=text_lines).items():
        typer.echo(f"{name:12s} {path}")


def make_demo_workspace(
    directory: Annotated[Path, typer.Argument(help="The workspace: models/ and data/ go under it.")] = Path(
        "."
    ),
) -> None:
    """Every tiny model (models/tiny-*) and the demo datasets (data/) the examples use, in one go;
    what is already complete is kept."""
    from flightdeck.worker.tiny import make_demo_workspace as build

    build(directory, keep_existing=True)
    typer.echo(f"demo workspace ready in {directory.resolve()} (models/, data/)")
