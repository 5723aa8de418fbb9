"""Tiny local models and demo datasets for the demo, the examples and the tests."""

from pathlib import Path

from flightdeck.worker.tiny.demo_data import make_demo_data
from flightdeck.worker.tiny.model import ARCHS, make_tiny_model


def tiny_model_dir(arch: str) -> str:
    """Where the demo workspace keeps the tiny `arch` model: models/tiny-qwen2-vl for qwen2_vl."""
    return f"models/tiny-{arch.replace('_', '-')}"


# Written last into each model directory and into data/: a directory without it was interrupted.
COMPLETE = ".complete"


def make_demo_workspace(
    root: str | Path, *, archs: tuple[str, ...] = ARCHS, text_lines: int = 2000, keep_existing: bool = False
) -> Path:
    """Every tiny model under models/ and the demo datasets under data/: what the examples read.

    One process for all of them (about 5 s; a process per model paid torch's import six times).
    `keep_existing`: leave models and data that are already complete (run.sh on a second start).
    """
    root = Path(root)
    for arch in archs:
        directory = root / tiny_model_dir(arch)
        if not (keep_existing and (directory / COMPLETE).is_file()):
            make_tiny_model(directory, arch)  # type: ignore[arg-type]
            (directory / COMPLETE).touch()
    data = root / "data"
    if not (keep_existing and (data / COMPLETE).is_file()):
        make_demo_data(data, text_lines=text_lines)
        (data / COMPLETE).touch()
    return root


__all__ = ["make_demo_data", "make_demo_workspace", "make_tiny_model", "tiny_model_dir"]
