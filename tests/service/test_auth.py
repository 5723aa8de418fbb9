"""Tokens: generated on first start (0600), hashed, scoped."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from pydantic import ValidationError

from flightdeck.service.api.app import create_app
from flightdeck.service.core.auth import Scope, TokenRegistry, digest
from flightdeck.service.core.config import Settings


def test_first_start_generates_a_token_pair_in_a_private_file(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path / "data")
    with TestClient(create_app(settings)) as client:
        token_file = tmp_path / "data" / "tokens.env"
        assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
        tokens = dict(line.split("=", 1) for line in token_file.read_text().splitlines())
        user, worker = tokens["FLIGHTDECK_USER_TOKENS"], tokens["FLIGHTDECK_WORKER_TOKENS"]
        assert client.get("/jobs", headers={"Authorization": f"Bearer {user}"}).status_code == 200
        assert client.get("/jobs", headers={"Authorization": f"Bearer {worker}"}).status_code == 403
    # A restart reuses the same pair.
    with TestClient(create_app(Settings(data_dir=tmp_path / "data"))) as client:
        assert client.get("/jobs", headers={"Authorization": f"Bearer {user}"}).status_code == 200


def test_tokens_from_the_environment(tmp_path: Path, monkeypatch: object) -> None:
    import pytest

    patch = pytest.MonkeyPatch()
    patch.setenv("FLIGHTDECK_USER_TOKENS", "u1, u2")
    patch.setenv("FLIGHTDECK_WORKER_TOKENS", "w1")
    patch.setenv("FLIGHTDECK_DATA_DIR", str(tmp_path / "env-data"))
    try:
        settings = Settings()
        assert settings.user_tokens == ["u1", "u2"] and settings.worker_tokens == ["w1"]
        with TestClient(create_app(settings)) as client:
            for token, code in [("u2", 200), ("w1", 403), ("nope", 401)]:
                assert client.get("/jobs", headers={"Authorization": f"Bearer {token}"}).status_code == code
            assert not (tmp_path / "env-data" / "tokens.env").exists()
    finally:
        patch.undo()


def test_registry_keeps_only_digests() -> None:
    registry = TokenRegistry()
    registry.add(Scope.user, "secret-user")
    assert "secret-user" not in repr(registry.digests)
    assert registry.digests[Scope.user] == [digest("secret-user")]
    assert registry.scope_of("secret-user") is Scope.user and registry.scope_of("other") is None


def test_missing_or_malformed_credentials(client: TestClient) -> None:
    assert client.get("/jobs").status_code == 401
    assert client.get("/jobs", headers={"Authorization": "Basic dXNlcjpwYXNz"}).status_code == 401
    answer = client.get("/jobs", headers={"Authorization": "Bearer wrong"})
    assert answer.status_code == 401 and answer.json()["detail"] == "unknown token"


def test_an_unsupported_database_url_is_refused_at_start_with_the_url_to_use(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DATABASE_URL", "postgresql://db/flightdeck")  # no driver named: psycopg2's
    with pytest.raises(ValidationError, match=r"postgresql\+psycopg://user:password@host"):
        Settings(data_dir=tmp_path)
    monkeypatch.setenv("DATABASE_URL", "mysql://db/flightdeck")
    with pytest.raises(ValidationError, match=r"sqlite:///path/to/file\.db or postgresql"):
        Settings(data_dir=tmp_path)
    for url in (f"sqlite:///{tmp_path / 'other.db'}", "postgresql+psycopg://fd:secret@db:5432/flightdeck"):
        monkeypatch.setenv("DATABASE_URL", url)
        assert Settings(data_dir=tmp_path).database_url == url


def test_serve_never_prints_the_database_password() -> None:
    from flightdeck.cli.serve_cmd import shown_url

    shown = shown_url("postgresql+psycopg://fd:s3cret@db:5432/flightdeck")
    assert "s3cret" not in shown and shown.startswith("postgresql+psycopg://fd:***@db:5432/flightdeck")
