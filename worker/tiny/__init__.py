"""Tiny local models and demo datasets for the demo, the examples and the tests."""

from pathlib import Path

from worker.tiny.demo_data import make_demo_data
from worker.tiny.model import ARCHS, make_tiny_model


def tiny_model_dir(arch: str) -> str:
    """Where the demo workspace keeps the tiny `arch` model: models/tiny-qwen2-vl for qwen2_vl."""
    return f"models/tiny-{arch.replace('_', '-')}"


def make_demo_workspace(root: str | Path, *, archs: tuple[str, ...] = ARCHS, text_lines: int = 2000) -> Path:
    """Every tiny model under models/ and the demo datasets under data/: what the examples read."""
    root = Path(root)
    for arch in archs:
        make_tiny_model(root / tiny_model_dir(arch), arch)  # type: ignore[arg-type]
    make_demo_data(root / "data", text_lines=text_lines)
    return root


__all__ = ["make_demo_data", "make_demo_workspace", "make_tiny_model", "tiny_model_dir"]
