"""The agent-service contract in one place: what travels over the wire and what lies in a run directory.

Both sides import this module: the service's routes take these models (so the OpenAPI document is
generated from them) and the agent builds its reports with them. It needs only pydantic, so the
worker image imports it without SQLModel or FastAPI. docs/contracts.md describes the same in words.
"""

from __future__ import annotations

import math
import re
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, Field

from flightdeck.inventory import WorkerInventory
from flightdeck.recipe.findings import CODE, CODE_PATTERN, Finding
from flightdeck.recipe.nul import FreeText, Identifier, clean_value

# --- the run directory (written by the agent and the trainer, read by the agent) -------------------

RECIPE_FILE = "recipe.json"  # the effective recipe the trainer runs
PLAN_FILE = "plan.json"  # the launch plan as launched (the free port filled in)
ATTEMPT_FILE = "attempt.json"  # the agent's own bookkeeping: which attempt, whether it still owes a report
LOG_FILE = "output.log"  # torchrun's stdout and stderr, every rank
METRICS_FILE = "metrics.jsonl"  # rank 0's step records and events
RESULT_FILE = "result.json"  # how the run ended, written once by rank 0
CURSOR_FILE = "shipped.json"  # what the service acknowledged of output.log and metrics.jsonl
# The key of the event an agent sends when an instrumented script has ended on every rank (H003 stops).
SCRIPT_END_EVENT = "run:script-end"
OUTPUT_DIR = "output"  # stage outputs: output/stage-<i>/
FLIGHT_RECORDER_PREFIX = "nccl_trace_rank_"  # + rank: PyTorch's NCCL Flight Recorder dumps (H006)
STACKS_DIR = "stacks"  # rank-<RANK>.txt: a trainer rank's faulthandler dumps (SIGUSR1, SIGTERM), H006
# Written by the service into its data directory (database, tokens): a worker refuses every recipe path
# and script inside a directory holding it, whatever the layout (S001).
SERVICE_DATA_MARKER = ".flightdeck-service-data"
# What the trainer exits with when a health check stopped the run (every rank, the same step).
HEALTH_EXIT_CODE = 42
# What the trainer exits with when a signal (SIGUSR1: a time limit or preemption coming, or the agent
# stopping the attempt) made it save a checkpoint and stop (G017); a retry resumes from that checkpoint.
CHECKPOINT_STOP_EXIT_CODE = 43
CHECKPOINT_STOP_CODE = "G017"
# The failure class of such an attempt: the retry policy requeues it (service/leases.py).
INTERRUPTED = "interrupted"
# The same, as a script job's args spell it; replaced by the runner (the service cannot know it).
RESUME_PLACE = "{resume_from}"

# --- numbers JSON cannot carry -------------------------------------------------------------------

# Strict JSON has no NaN or infinity: they travel as these strings.
NAN, POS_INF, NEG_INF = "NaN", "Infinity", "-Infinity"
# What the service reads as a non-finite value (the lower-case spellings are Python's str(float)).
NON_FINITE_IN = {NAN: math.nan, "nan": math.nan, POS_INF: math.inf, "inf": math.inf}
NON_FINITE_IN |= {NEG_INF: -math.inf, "-inf": -math.inf}


def encode_number(value: float | None) -> float | str:
    """A float as strict JSON carries it; None (a stored NaN) and infinities become the strings."""
    if value is None or math.isnan(value):
        return NAN
    if math.isinf(value):
        return POS_INF if value > 0 else NEG_INF
    return value


def json_safe(value: Any) -> Any:
    """`value` with every non-finite float spelled as a string, recursively (dicts, lists, tuples)."""
    if isinstance(value, float) and not math.isfinite(value):
        return encode_number(value)
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    return value


# --- limits (a report over them is refused with 422; the agent cuts or splits before sending) ------

MAX_TEXT = 20_000  # a message or fix
MAX_LOG_TAIL = 64_000  # the finish report's log tail
MAX_FINDINGS = 500
MAX_POINTS_PER_BATCH = 100_000  # metric values in one batch
MAX_EVENTS_PER_BATCH = 10_000
MAX_LOG_CHUNK_BYTES = 4 * 1024 * 1024
STEP_LIMIT = 2**62  # steps, offsets and cursors below this fit a signed 64-bit column with room to add
MAX_ATTEMPT_NUMBER = 1000  # a job has at most 100 attempts (max_attempts); numbers above are no attempt
METRIC_KEY = re.compile(r"^[A-Za-z][A-Za-z0-9_./-]{0,63}$")
# Distinct metric names per attempt (FLIGHTDECK_MAX_METRIC_KEYS): reads cost a query per name, and
# 100,000 names once made one page of metrics take 51 s. Reads of every name stop at the limit too.
DEFAULT_MAX_METRIC_KEYS = 256
EVENT_SEVERITIES = ("info", "warn", "error", "fatal", "fix")
Severity = Literal["info", "warn", "error", "fatal", "fix"]


# --- a worker's registration, heartbeat and claim ------------------------------------------------

MAX_DEVICE_INDEX = 1023


class Registration(BaseModel):
    """POST /workers: a worker's name and what its host offers."""

    name: str = Field(min_length=1, max_length=200, pattern=r"^[A-Za-z0-9_.:@-]+$")
    inventory: WorkerInventory
    # A restarted worker that authenticates with its own token (a Slurm executor's saved identity):
    # keep that token, which its scheduler's running jobs also hold, instead of issuing a new one.
    keep_token: bool = False
    # The attempts it still runs (Slurm jobs it finds again): kept and given a full lease if the
    # service still has them running on this worker, otherwise named in the answer's `stop`.
    held: list[int] = Field(default_factory=list, max_length=1024)


class Registered(BaseModel):
    """The answer to a registration."""

    id: int
    name: str
    lease_seconds: float
    heartbeat_interval: float
    token: str = Field(
        description="This worker's own token, shown once: every later worker call sends it "
        "(the enrolment token only registers)."
    )
    database: str = Field(
        description="The id of the service's database: run directories are kept under "
        "`<runs>/<database>/`, and a worker recovers only the runs of this one."
    )
    stop: list[int] = Field(
        default_factory=list,
        description="Of the registration's `held` attempts, those the service no longer has running on "
        "this worker (ended, requeued, or not its own): the worker stops them, so no job runs twice.",
    )


class Heartbeat(BaseModel):
    """POST /workers/{id}/heartbeat: the attempts the worker still runs (their leases are renewed)."""

    attempts: list[int] = Field(default_factory=list, max_length=1024)


class HeartbeatAnswer(BaseModel):
    """The attempts the worker must stop, and the lease a heartbeat buys."""

    cancel: list[int]
    lease_seconds: float


class ClaimRequest(BaseModel):
    """POST /workers/{id}/claim: the devices free on the worker now (omitted or null: all of them)."""

    devices: list[Annotated[int, Field(ge=0, le=MAX_DEVICE_INDEX)]] | None = Field(None, max_length=1024)
    nodes: int | None = Field(
        None,
        ge=1,
        le=100_000,  # WorkerInventory.nodes' bound
        description="A worker of several nodes (a Slurm partition): how many of its nodes have `devices` "
        "free; it is given only a job of at most that many nodes. Omitted or null: all of them.",
    )


# --- worker -> service ---------------------------------------------------------------------------


class MetricPoint(BaseModel):
    """One logged step: metric name -> value (a number, null, or 'NaN'/'Infinity'/'-Infinity')."""

    step: int = Field(ge=0, lt=STEP_LIMIT)
    values: dict[str, float | str | None]
    time: float | None = Field(
        None, allow_inf_nan=False, description="UNIX seconds; the arrival time when missing."
    )


class MetricBatch(BaseModel):
    """POST /attempts/{id}/metrics. The route parses it by hand for speed (service/reports/metric_ingest.py,
    same limits); this model is its published schema."""

    points: list[MetricPoint] = Field(description=f"At most {MAX_POINTS_PER_BATCH} values in all.")


class AttemptEvent(BaseModel):
    """A finding or fact about an attempt (preflight, launch, health); idempotent by `key`."""

    key: Identifier = Field(min_length=1, max_length=200)
    kind: Identifier = Field(min_length=1, max_length=32)
    code: str | None = Field(None, pattern=CODE_PATTERN)
    severity: Severity = "info"
    message: FreeText = Field(max_length=MAX_TEXT)
    fix: FreeText | None = Field(None, max_length=MAX_TEXT)
    step: int | None = Field(None, ge=0, lt=STEP_LIMIT)
    data: Annotated[dict[str, Any], AfterValidator(clean_value)] = Field(default_factory=dict)
    time: float | None = Field(None, allow_inf_nan=False, description="UNIX seconds (finite).")


def attempt_event(
    key: str,
    kind: str,
    message: str,
    *,
    code: str | None = None,
    severity: str = "info",
    fix: str | None = None,
    step: int | None = None,
    data: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """An event as POST /attempts/{id}/events takes it, cut to the limits: a report the service would
    refuse (422) is never built. An unknown severity reads as 'warn', a malformed code as none."""
    event = AttemptEvent(
        key=key[:200],
        kind=(kind or "event")[:32],
        code=code if isinstance(code, str) and CODE.fullmatch(code) else None,
        severity=severity if severity in EVENT_SEVERITIES else "warn",
        message=message[:MAX_TEXT],
        fix=fix[:MAX_TEXT] if isinstance(fix, str) else None,
        step=step
        if isinstance(step, int) and not isinstance(step, bool) and 0 <= step < STEP_LIMIT
        else None,
        data=json_safe(data) if isinstance(data, dict) else {},
    )
    return event.model_dump(mode="json", exclude={"time"})


class EventBatch(BaseModel):
    """POST /attempts/{id}/events."""

    events: list[AttemptEvent] = Field(max_length=MAX_EVENTS_PER_BATCH)


class LogChunk(BaseModel):
    """POST /attempts/{id}/logs: bytes [offset, offset + length) of output.log, decoded."""

    offset: int = Field(ge=0, lt=STEP_LIMIT, description="byte offset of the chunk in output.log")
    text: str = Field(max_length=MAX_LOG_CHUNK_BYTES)
    length: int | None = Field(
        None,
        ge=0,
        le=MAX_LOG_CHUNK_BYTES,
        description="the chunk's size in bytes in the file: the text's UTF-8 size, less where undecodable "
        "bytes (1 byte each) became U+FFFD (3 bytes each)",
    )
    node: int | None = Field(
        None,
        ge=0,
        le=1023,
        description="whose output.log: the node rank, for a worker that holds several nodes of the attempt "
        "(a Slurm executor's job of several nodes, where a runner on each node ships its own log); "
        "default: the caller's first node",
    )


class FinishReport(BaseModel):
    """POST /attempts/{id}/finish: how the attempt ended."""

    status: Literal["succeeded", "failed", "cancelled"]
    # A process's exit status (0-255, or minus a signal's number): a 32-bit bound refuses anything else
    # at the edge, before the report is kept as JSON on the node (where a huge integer comes back a float).
    exit_code: int | None = Field(None, ge=-(2**31), le=2**31 - 1)
    failure_class: Identifier | None = Field(None, max_length=64)
    failure_code: Identifier | None = Field(None, max_length=16)
    message: FreeText | None = Field(None, max_length=MAX_TEXT)
    fix: FreeText | None = Field(None, max_length=MAX_TEXT)
    log_tail: FreeText | None = Field(None, max_length=MAX_LOG_TAIL)
    output_path: Identifier | None = Field(None, max_length=4096)
    findings: list[Finding] = Field(default_factory=list, max_length=MAX_FINDINGS)
    ranks: FreeText | None = Field(
        None,
        max_length=MAX_TEXT,
        description="Where each rank was when the attempt stopped or a rank died, from their Python "
        "stacks ('rank 0 in `evaluate()` at train.py:57; rank 1 in `barrier` ...'), H006.",
    )
    ranks_apart: bool = Field(
        False, description="The ranks were in different places (one busy alone while others wait): H006."
    )


# --- service -> worker ---------------------------------------------------------------------------


class NodeAssignment(BaseModel):
    """The claimer's place in a multi-node attempt (service/gangs/)."""

    rank: int = Field(ge=0, description="This worker's node rank (0 hosts the rendezvous).")
    nnodes: int = Field(ge=2)
    master_addr: str | None = Field(None, description="Node 0's registered address.")


class ClaimedAttempt(BaseModel):
    """The answer to a claim: the attempt, its effective recipe and its launch plan (this node's, in a
    multi-node attempt: then `node` says which node, and the agent waits at
    POST /attempts/{id}/nodes/{rank}/ready until every node is ready)."""

    id: int
    job_id: int
    number: int
    recipe: dict[str, Any]
    plan: dict[str, Any]
    lease_seconds: float
    node: NodeAssignment | None = None
    # When the service made the attempt (its started_at). With the id it names the attempt for good: a
    # database restored from a backup hands out the same ids again, never the same moment.
    claimed_at: float | None = None
    # When the job's first attempt was made (the job's started_at): which run of the job this is. The
    # worker records it in attempt.json, and a retry's checkpoint search skips a run directory of the same
    # name that records another (a database restored from a backup made the job again; worker/checkpoints.py).
    job_started_at: float | None = None

    def wire(self) -> dict[str, Any]:
        """The answer as JSON takes it (`node` left out for a single-node attempt), without pydantic's
        serialiser: the recipe and plan are plain JSON already, and walking them per claim cost more
        than the claim's SQL."""
        fields = {name: getattr(self, name) for name in _CLAIMED_FIELDS}
        if self.node is not None:
            fields["node"] = {
                "rank": self.node.rank,
                "nnodes": self.node.nnodes,
                "master_addr": self.node.master_addr,
            }
        return fields


_CLAIMED_FIELDS = (
    "id",
    "job_id",
    "number",
    "recipe",
    "plan",
    "lease_seconds",
    "claimed_at",
    "job_started_at",
)


def claimed_attempt(
    attempt_id: int,
    job_id: int,
    number: int,
    recipe: dict[str, Any],
    plan: dict[str, Any],
    lease_seconds: float,
    node: tuple[int, int, str | None] | None = None,
    *,
    claimed_at: float,
    job_started_at: float,
) -> ClaimedAttempt:
    """The one builder of a claim's answer, for one worker's attempt and for a node of a gang's
    (`node`: rank, nnodes, node 0's address). Built from values the service checked (the stored
    recipe, the plan it just made), so it is constructed without validating them again."""
    assignment = (
        None
        if node is None
        else NodeAssignment.model_construct(rank=node[0], nnodes=node[1], master_addr=node[2])
    )
    return ClaimedAttempt.model_construct(
        id=attempt_id,
        job_id=job_id,
        number=number,
        recipe=recipe,
        plan=plan,
        lease_seconds=lease_seconds,
        node=assignment,
        claimed_at=claimed_at,
        job_started_at=job_started_at,
    )


class Claimed(BaseModel):
    """The 200 body of a claim."""

    attempt: ClaimedAttempt


# --- the start barrier of a multi-node attempt -----------------------------------------------------


class NodeReady(BaseModel):
    """A node passed host preflight; node 0 sends the rendezvous port it found free on its host."""

    port: int | None = Field(None, ge=1, le=65535)


class NodeStart(BaseModel):
    """Whether the node may start torchrun: every node is ready (`start`), or the attempt stops (`abort`,
    naming the node that failed). Until then the agent asks again."""

    start: bool
    abort: str | None
    master_addr: str | None
    master_port: int | None
    waiting_for: list[int]


class NameTaken(Exception):
    """Another live worker holds the name a registration asks for: the service refuses it (409), and
    the agent's client raises the same when it reads that answer."""


class AttemptNotRunning(Exception):
    """The attempt already has a final status: the service refuses a finish (409 with the status), and
    the agent's client raises the same when it reads that answer."""

    def __init__(self, status: str):
        super().__init__(f"the attempt is already {status}")
        self.status = status
