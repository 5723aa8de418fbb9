"""A live service per test, and a CLI runner wide enough that rich never wraps a line we look for."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.cli.live_service import LiveService, live_service


@pytest.fixture
def service(tmp_path: Path) -> Iterator[LiveService]:
    with live_service(tmp_path / "data") as running:
        yield running


@pytest.fixture
def runner(monkeypatch: pytest.MonkeyPatch) -> CliRunner:
    monkeypatch.setenv("COLUMNS", "200")
    monkeypatch.delenv("FLIGHTDECK_URL", raising=False)
    monkeypatch.delenv("FLIGHTDECK_TOKEN", raising=False)
    return CliRunner()
