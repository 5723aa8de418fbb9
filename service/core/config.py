"""Service settings, read from the environment (pydantic-settings)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import AliasChoices, Field, computed_field, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from flightdeck.contracts import DEFAULT_MAX_METRIC_KEYS
from flightdeck.service.core.db import url_problem


class Settings(BaseSettings):
    # populate_by_name: the tests (and anyone constructing Settings) may pass database_url_override.
    model_config = SettingsConfigDict(env_prefix="FLIGHTDECK_", extra="ignore", populate_by_name=True)

    data_dir: Path = Field(Path("flightdeck-data"), description="Where the SQLite file and tokens live.")
    database_url_override: str | None = Field(
        None, validation_alias=AliasChoices("DATABASE_URL", "FLIGHTDECK_DATABASE_URL")
    )
    user_tokens: Annotated[list[str], NoDecode] = Field(default_factory=list)
    worker_tokens: Annotated[list[str], NoDecode] = Field(default_factory=list)
    lease_seconds: float = Field(30.0, gt=0, description="How long an attempt lives without a heartbeat.")
    reaper_interval_seconds: float = Field(2.0, gt=0, description="How often expired leases are looked for.")
    stall_min_seconds: float = Field(
        300.0,
        ge=0,
        description="Least silence before a stalled run is stopped (H003); warnings come earlier.",
    )
    stall_warn_min_seconds: float = Field(
        30.0,
        ge=0,
        description="Least silence before a possible stall is warned about (H003): a 30 ms-per-step run "
        "pausing 1 s to save is 30x its median step time, and no stall.",
    )
    claim_max_wait_seconds: float = Field(30.0, ge=0)
    claim_path: Literal["batched", "plain"] = Field(
        "batched",
        description="How claims reach the database: 'batched' (claims arriving together share one "
        "transaction, service/api/claim_batcher.py) or 'plain' (one transaction per claim, "
        "service/api/claim_plain.py); bench/README.md says which load each is for.",
    )
    gang_wait_seconds: float = Field(
        30.0,
        gt=0,
        description="How long a worker waits in the gang of a multi-node job for the other workers before "
        "it is released (and skips that job as long again, so single-node jobs behind it run).",
    )
    stream_seconds: float = Field(
        30.0,
        gt=0,
        description="How long one server-sent-events stream stays open before the client reconnects with "
        "its cursors; bounds how long a restart waits on open streams.",
    )
    default_max_attempts: int = Field(2, ge=1, le=100)
    max_body_bytes: int = Field(8 * 1024 * 1024, ge=1024, description="Largest request body accepted.")
    max_recipe_bytes: int = Field(256 * 1024, ge=1024, description="Largest recipe accepted at POST /jobs.")
    max_metric_keys: int = Field(
        DEFAULT_MAX_METRIC_KEYS,
        ge=1,
        le=100_000,
        description="Distinct metric names an attempt may report; a batch that brings more is refused "
        "(422) and reads of every metric stop there.",
    )
    otel: bool = Field(
        False,
        description="FastAPI's native OpenTelemetry traces, metrics and logs (exported as the OTEL_* "
        "variables say). Off by default: GET /metrics serves Prometheus, and the per-request check "
        "for configured providers cost about 5% of a claim's CPU.",
    )

    @field_validator("user_tokens", "worker_tokens", mode="before")
    @classmethod
    def _split_tokens(cls, value: object) -> object:
        if isinstance(value, str):
            return [t.strip() for t in value.split(",") if t.strip()]
        return value

    @field_validator("database_url_override")
    @classmethod
    def _supported_database(cls, url: str | None) -> str | None:
        # Refused at start-up with the fix, rather than by a driver's error on the first request.
        problem = url_problem(url) if url else None
        if problem:
            raise ValueError(problem)
        return url

    @computed_field  # type: ignore[prop-decorator]
    @property
    def database_url(self) -> str:
        if self.database_url_override:
            return self.database_url_override
        return f"sqlite:///{(self.data_dir / 'flightdeck.db').resolve()}"

    @property
    def heartbeat_interval_seconds(self) -> float:
        # Three heartbeats per lease: one lost request never costs a lease.
        return max(0.2, self.lease_seconds / 3)
