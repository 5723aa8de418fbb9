"""Bearer tokens with two scopes, kept only as SHA-256 digests and compared in constant time."""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path


class Scope(StrEnum):
    user = "user"
    worker = "worker"


def digest(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


@dataclass
class TokenRegistry:
    """The digests of every accepted token, per scope."""

    digests: dict[Scope, list[str]] = field(default_factory=lambda: {Scope.user: [], Scope.worker: []})

    def add(self, scope: Scope, token: str) -> None:
        self.digests[scope].append(digest(token))

    def scope_of(self, token: str) -> Scope | None:
        """The scope a token belongs to; every digest is compared so timing reveals nothing."""
        presented = digest(token)
        found: Scope | None = None
        for scope, digests in self.digests.items():
            for known in digests:
                if hmac.compare_digest(presented, known):
                    found = scope
        return found


def load_or_create_tokens(data_dir: Path, user_tokens: list[str], worker_tokens: list[str]) -> TokenRegistry:
    """Configured tokens, or on first start a generated pair saved to <data_dir>/tokens.env (0600)."""
    registry = TokenRegistry()
    token_file = data_dir / "tokens.env"
    if not user_tokens or not worker_tokens:
        saved = _read_token_file(token_file)
        if not saved:
            saved = {
                "FLIGHTDECK_USER_TOKENS": secrets.token_urlsafe(32),
                "FLIGHTDECK_WORKER_TOKENS": secrets.token_urlsafe(32),
            }
            _write_token_file(token_file, saved)
            print(f"flightdeck: generated a user and a worker token in {token_file} (mode 0600)", flush=True)
        user_tokens = user_tokens or [saved["FLIGHTDECK_USER_TOKENS"]]
        worker_tokens = worker_tokens or [saved["FLIGHTDECK_WORKER_TOKENS"]]
    for token in user_tokens:
        registry.add(Scope.user, token)
    for token in worker_tokens:
        registry.add(Scope.worker, token)
    return registry


def _read_token_file(path: Path) -> dict[str, str]:
    if not path.exists():
        return {}
    pairs = (line.split("=", 1) for line in path.read_text().splitlines() if "=" in line)
    return {k.strip(): v.strip() for k, v in pairs}


def _write_token_file(path: Path, tokens: dict[str, str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write("".join(f"{k}={v}\n" for k, v in tokens.items()))
    os.chmod(path, 0o600)
