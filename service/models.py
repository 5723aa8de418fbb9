"""Database tables (SQLModel) and the public shapes the API returns for them.

Times are UNIX seconds (float): cheap to compare in lease queries and unambiguous in JSON.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Column,
    Index,
    Integer,
    LargeBinary,
    PrimaryKeyConstraint,
    UniqueConstraint,
    column,
    false,
)
from sqlmodel import Field, SQLModel

from flightdeck.recipe.findings import Finding

# Steps reach 2**62 (flightdeck.contracts.STEP_LIMIT): BIGINT on PostgreSQL, whose INTEGER is 32-bit;
# SQLite's INTEGER is already 64-bit and its tables keep that type (migration 0006).
Int64 = BigInteger().with_variant(Integer(), "sqlite")


class JobBase(SQLModel):
    name: str = Field(max_length=200, index=True)
    status: str = Field(default="queued", max_length=16, index=True)
    priority: int = 0
    max_attempts: int = 2
    attempt_count: int = 0
    created_at: float
    updated_at: float
    started_at: float | None = None
    finished_at: float | None = None
    failure_class: str | None = None
    failure_code: str | None = None
    failure_message: str | None = None
    failure_fix: str | None = None
    output_path: str | None = None
    last_step: int | None = Field(default=None, sa_type=Int64)
    last_loss: float | None = None
    worker_name: str | None = None


class Job(JobBase, table=True):
    __tablename__ = "jobs"
    # The claim's order (priority DESC, id): the first fitting job is one index probe (migration 0002).
    __table_args__ = (Index("ix_jobs_claim", "status", column("priority").desc(), "id"),)

    id: int | None = Field(default=None, primary_key=True)
    recipe: dict[str, Any] = Field(sa_column=Column(JSON, nullable=False))
    effective_recipe: dict[str, Any] = Field(sa_column=Column(JSON, nullable=False))
    findings: list[dict[str, Any]] = Field(default_factory=list, sa_column=Column(JSON, nullable=False))
    # What a worker must offer to claim the job, copied out of the recipe so the claim is one query.
    req_accelerator: str = "gpu"
    req_devices: int = 1
    req_min_capability: float = 0.0
    req_gpu_memory_mb: int = 0
    # A script job (recipe entrypoint) runs the user's code: only workers that allow scripts claim it.
    req_script: bool = Field(default=False, sa_column_kwargs={"server_default": false()})
    # resources.nodes: a job with more than one starts only when that many workers joined it (a gang).
    req_nodes: int = Field(default=1, sa_column_kwargs={"server_default": "1"})
    current_attempt_id: int | None = None


class AttemptBase(SQLModel):
    job_id: int = Field(index=True, foreign_key="jobs.id")
    number: int
    worker_id: int | None = Field(default=None, foreign_key="workers.id")
    status: str = Field(default="running", max_length=16)
    started_at: float
    finished_at: float | None = None
    exit_code: int | None = None
    failure_class: str | None = None
    failure_code: str | None = None
    message: str | None = None
    fix: str | None = None
    log_tail: str | None = None
    output_path: str | None = None
    # Set when the service itself orders the attempt stopped for a health finding (H003 stall).
    stop_code: str | None = Field(default=None, max_length=16)
    stop_message: str | None = None
    # The attempt's nodes (its attempt_nodes rows): 1 for one worker's attempt, N for a gang of N workers or
    # for a worker whose scheduler places N nodes (Slurm), which holds all N rows.
    nnodes: int = Field(default=1, sa_column_kwargs={"server_default": "1"})


class Attempt(AttemptBase, table=True):
    __tablename__ = "attempts"

    id: int | None = Field(default=None, primary_key=True)
    plan: dict[str, Any] = Field(sa_column=Column(JSON, nullable=False))
    findings: list[dict[str, Any]] = Field(default_factory=list, sa_column=Column(JSON, nullable=False))


class AttemptNode(SQLModel, table=True):
    """One node of an attempt, and the lease that keeps it (every attempt has at least node 0: a
    single-node attempt is a gang of one, held by its claimer). In a multi-node job of own agents the
    row is first the worker's place while the gang gathers.

    status: waiting (joined, the gang not full) -> assigned (the gang filled: an attempt and a node rank,
    not yet handed to this worker) -> running -> succeeded | failed | cancelled | lost; or waiting ->
    released (the gang did not fill in time: the worker skips this job until `until`).
    """

    __tablename__ = "attempt_nodes"
    __table_args__ = (
        Index("ix_attempt_nodes_job", "job_id", "status"),
        Index("ix_attempt_nodes_worker", "worker_id", "status"),
        UniqueConstraint("attempt_id", "node_rank", name="uq_attempt_nodes_rank"),
    )

    id: int | None = Field(default=None, primary_key=True)
    job_id: int = Field(foreign_key="jobs.id")
    worker_id: int = Field(foreign_key="workers.id")
    attempt_id: int | None = Field(default=None, foreign_key="attempts.id")
    node_rank: int | None = None
    status: str = Field(default="waiting", max_length=16)
    devices: list[int] = Field(default_factory=list, sa_column=Column(JSON, nullable=False))
    joined_at: float
    # waiting: when the worker is released if the gang has not filled; released: when it may join again.
    until: float | None = None
    lease_expires_at: float | None = None
    address: str | None = Field(default=None, max_length=255)
    # The rendezvous port node 0's agent found free on its host and reported with /ready.
    port: int | None = None
    ready_at: float | None = None
    finished_at: float | None = None
    plan: dict[str, Any] | None = Field(default=None, sa_column=Column(JSON, nullable=True))
    # The node's own finish report; the attempt ends once every node has one (service/gangs/).
    report: dict[str, Any] | None = Field(default=None, sa_column=Column(JSON, nullable=True))


class DatabaseIdentity(SQLModel, table=True):
    """One row: the id this database was given when its schema was created (migration 0011).

    Attempt and job ids start again at 1 in a fresh database; run directories live under this id
    (flightdeck/launch/plan.py), so a service on a new database, or two services sharing a workspace,
    never write into, resume from or recover another database's run directory.
    """

    __tablename__ = "database_identity"

    id: int | None = Field(default=None, primary_key=True)
    database_id: str = Field(max_length=64)


class Worker(SQLModel, table=True):
    __tablename__ = "workers"

    id: int | None = Field(default=None, primary_key=True)
    name: str = Field(max_length=200, unique=True)
    inventory: dict[str, Any] = Field(sa_column=Column(JSON, nullable=False))
    registered_at: float
    last_seen_at: float
    # SHA-256 of the worker's own token; None: revoked (or never issued), so no worker call is accepted.
    token_hash: str | None = Field(default=None, max_length=64, unique=True, index=True)


class MetricPoint(SQLModel, table=True):
    """One value of one metric at one step; the key order makes a series one range scan."""

    __tablename__ = "metric_points"
    __table_args__ = {"sqlite_with_rowid": False}

    attempt_id: int = Field(primary_key=True)
    key: str = Field(primary_key=True, max_length=64)
    step: int = Field(primary_key=True, sa_type=Int64)
    job_id: int
    value: float | None = None  # NULL stores NaN: SQLite has no NaN
    time: float | None = None


class MetricKey(SQLModel, table=True):
    """The metric names an attempt has reported, so a page read knows which series to merge."""

    __tablename__ = "metric_keys"
    __table_args__ = {"sqlite_with_rowid": False}

    attempt_id: int = Field(primary_key=True)
    key: str = Field(primary_key=True, max_length=64)


class MetricRollup(SQLModel, table=True):
    """Min, max, count and last value of a series over buckets of 2**level steps, kept at ingest.

    A downsampled read of a million-point series then reads a few hundred rows, not every point.

    Keyed by level and bucket before the metric (migration 0009): a batch's new summaries of every
    metric at a level are neighbours. Keyed by metric first, each (metric, level) pair was its own
    range and a batch added to the end of each: a 1,000-point batch of 10 metrics rewrote about 73
    pages of this table, now about 16 (bench/README.md). A level's rows of all metrics are one range,
    which the dashboard's view of every metric reads in one query.
    """

    __tablename__ = "metric_rollups"
    __table_args__ = (
        PrimaryKeyConstraint("attempt_id", "level", "bucket", "key"),
        {"sqlite_with_rowid": False},
    )

    attempt_id: int = Field(primary_key=True)
    key: str = Field(primary_key=True, max_length=64)
    level: int = Field(primary_key=True)
    bucket: int = Field(primary_key=True, sa_type=Int64)
    lo: float | None = None
    hi: float | None = None
    n: int
    last_step: int = Field(sa_type=Int64)
    last_value: float | None = None


class LogChunk(SQLModel, table=True):
    """Bytes [offset, offset + length) of one node's output.log of an attempt, as UTF-8 text."""

    __tablename__ = "log_chunks"
    __table_args__ = {"sqlite_with_rowid": False}

    attempt_id: int = Field(primary_key=True)
    # 0 for single-node attempts; each node of a multi-node attempt ships its own output.log.
    node_rank: int = Field(default=0, primary_key=True)
    offset: int = Field(primary_key=True, sa_type=Int64)
    job_id: int = Field(index=True)
    length: int
    data: bytes = Field(sa_column=Column(LargeBinary, nullable=False))
    time: float


class Event(SQLModel, table=True):
    """A finding, health event or status change on a job's timeline."""

    __tablename__ = "events"
    __table_args__ = (UniqueConstraint("attempt_id", "key", name="uq_events_attempt_key"),)

    id: int | None = Field(default=None, primary_key=True)
    job_id: int = Field(index=True)
    attempt_id: int | None = None
    key: str | None = Field(default=None, max_length=200)
    kind: str = Field(max_length=32)
    code: str | None = Field(default=None, max_length=16)
    severity: str = Field(default="info", max_length=16)
    message: str
    fix: str | None = None
    step: int | None = Field(default=None, sa_type=Int64)
    data: dict[str, Any] = Field(default_factory=dict, sa_column=Column(JSON, nullable=False))
    time: float


# --- public shapes -----------------------------------------------------------------------------


class AttemptNodePublic(SQLModel):
    """A node of an attempt, as the API shows it."""

    node_rank: int
    worker_id: int
    worker_name: str | None = None
    address: str | None
    devices: list[int]
    status: str
    message: str | None = None


class AttemptPublic(AttemptBase):
    id: int
    plan: dict[str, Any]
    findings: list[Finding]
    worker_name: str | None = None
    # The attempt's first and last reported step: a retry that resumed starts after its checkpoint.
    first_step: int | None = None
    last_step: int | None = None
    # When the attempt's first node lease runs out (the nodes hold the leases); None once it ended.
    lease_expires_at: float | None = None
    nodes: list[AttemptNodePublic] = Field(default_factory=list)


class JobPublic(JobBase):
    id: int
    recipe: dict[str, Any]
    effective_recipe: dict[str, Any]
    findings: list[Finding]
    fixes_applied: list[Finding]


class JobDetail(JobPublic):
    attempts: list[AttemptPublic]
    waiting: str | None = None  # a queued job: why it has not started (service/why_waiting.py)


class JobSummary(JobBase):
    """A job in a list: its state and progress, not its recipes (GET /jobs/{id} has those)."""

    id: int
    findings_count: int = 0


class JobsPublic(SQLModel):
    data: list[JobSummary]
    count: int
    next_cursor: int | None


class WorkerPublic(SQLModel):
    id: int
    name: str
    inventory: dict[str, Any]
    registered_at: float
    last_seen_at: float
    alive: bool
    running_attempts: list[int]


class EventPublic(SQLModel):
    id: int
    job_id: int
    attempt_id: int | None
    kind: str
    code: str | None
    severity: str
    message: str
    fix: str | None
    step: int | None
    data: dict[str, Any]
    time: float
