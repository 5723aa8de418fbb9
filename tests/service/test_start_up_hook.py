"""The app's start-up hook (`flightdeck serve` tunes the GC from it)."""

from __future__ import annotations

from pathlib import Path

from fastapi.testclient import TestClient

from flightdeck.service.api.app import create_app
from tests.service.conftest import make_settings


def test_start_up_hook_runs_once_after_the_migrations(tmp_path: Path) -> None:
    """`flightdeck serve` freezes the GC from this hook: it must see the migrated database, and run once."""
    settings = make_settings(tmp_path / "data")
    calls: list[bool] = []
    app = create_app(
        settings, on_started=lambda: calls.append((settings.data_dir / "flightdeck.db").exists())
    )
    assert calls == []  # not while the app is only built
    with TestClient(app) as client:
        assert calls == [True]
        assert client.get("/healthz").status_code == 200
    assert calls == [True]
