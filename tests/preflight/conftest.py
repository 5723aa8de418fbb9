"""The on-disk workspace is built once per session (tiny models take about a second)."""

from __future__ import annotations

from pathlib import Path

import pytest

from .workspace import build_workspace


@pytest.fixture(scope="session")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_workspace(tmp_path_factory.mktemp("preflight-workspace"))
