"""The on-disk workspace is built once per session (tests/conftest.py's tiny_workspace)."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def workspace(tiny_workspace: Path) -> Path:
    return tiny_workspace
