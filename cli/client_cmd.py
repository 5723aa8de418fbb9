"""User commands against a running service: submit, preflight, jobs, show, watch, logs, cancel, workers.

Imports only httpx, typer and rich at module level: the worker image (no FastAPI, no SQLModel)
runs `flightdeck` too. Exit codes: 0 done, 1 the watched job failed or was cancelled, 2 the
request could not be made (bad file, refused recipe, unreachable service, wrong token).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.json import JSON
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table
from rich.text import Text

from flightdeck.cli.client_http import DEFAULT_URL, RecipeRefused, ServiceError, UserClient
from flightdeck.cli.recipe_file import RecipeFileError, read_recipe_file
from flightdeck.recipe import Recipe
from flightdeck.recipe.validate import planned_steps

EXIT_JOB_FAILED = 1
EXIT_ERROR = 2
TERMINAL = {"succeeded", "failed", "cancelled"}
STATUSES = ("queued", "running", "cancelling", *sorted(TERMINAL))
WATCHED_METRICS = ("loss", "grad_norm", "adapter_grad_norm", "tokens_per_second")

out = Console()
err = Console(stderr=True)

UrlOption = Annotated[
    str, typer.Option("--url", envvar="FLIGHTDECK_URL", help="Service URL.", show_default=True)
]
TokenOption = Annotated[
    str | None,
    typer.Option("--token", envvar="FLIGHTDECK_TOKEN", help="User token.", show_default=False),
]
JobId = Annotated[int, typer.Argument(help="Job id (see `flightdeck jobs`).", min=1)]


def register(app: typer.Typer) -> None:
    """Add the user commands to `app`."""
    for command in (submit, preflight, jobs, show, watch, logs, cancel):
        app.command()(command)
    group = typer.Typer(help="Registered workers: list them (no subcommand) or revoke one.")
    group.callback(invoke_without_command=True)(workers)
    group.command("revoke")(revoke_worker)
    app.add_typer(group, name="workers")


# --- shared pieces ---------------------------------------------------------------------------


def _fail(message: str) -> typer.Exit:
    err.print(Text("error: ", style="bold red") + Text(message))
    return typer.Exit(EXIT_ERROR)


@contextmanager
def _service(url: str, token: str | None) -> Iterator[UserClient]:
    """A client for the command's duration; service errors become one clear line and exit 2."""
    if not token:
        raise _fail(
            "no token: pass --token or set FLIGHTDECK_TOKEN to a user token (see <data-dir>/tokens.env)"
        )
    client = UserClient(url, token)
    try:
        yield client
    except RecipeRefused as exc:
        _print_findings(exc.findings, title="the service refused the recipe")
        raise _fail(str(exc)) from None
    except ServiceError as exc:
        raise _fail(str(exc)) from None
    finally:
        client.close()


def _text(value: Any) -> Text:
    """User data as plain text: a name like '[red]x' must never be read as rich markup."""
    return Text("" if value is None else str(value))


def _number(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return "-" if value is None else str(value)


def _age(since: float | None) -> str:
    if since is None:
        return "-"
    seconds = max(0.0, time.time() - since)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f}{unit}"
    return f"{seconds:.0f}s"


def _load_recipe(path: Path) -> Any:
    try:
        return read_recipe_file(path)
    except RecipeFileError as exc:
        raise _fail(str(exc)) from None


def _local_findings(payload: Any) -> list[dict[str, Any]]:
    """The service's own submission check, run here so mistakes show before any network call."""
    from flightdeck.recipe import RecipeInvalid, parse_recipe

    try:
        try:
            from flightdeck.service.jobs import validate_submission
        except ImportError:  # the worker image has no SQLModel: the schema and the static rules alone
            from flightdeck.preflight import run_static_preflight

            findings = run_static_preflight(parse_recipe(payload)).findings
        else:
            _, _, findings = validate_submission(payload)
    except RecipeInvalid as exc:
        findings = exc.findings
    return [f.model_dump(mode="json") for f in findings]


_SEVERITY_STYLE = {"error": "bold red", "fix": "cyan", "warn": "yellow"}


def _code_label(finding: dict[str, Any]) -> str:
    """The catalog code; without one, where it was found ('schema' for a recipe the schema refused)."""
    where = finding.get("where") or "static"
    return str(finding.get("code") or ("schema" if where == "static" else where))


def _print_findings(findings: list[dict[str, Any]], title: str = "findings") -> None:
    if not findings:
        return
    table = Table(title=title, title_justify="left", show_lines=False)
    for column in ("code", "severity", "path", "message", "fix"):
        table.add_column(column, overflow="fold")
    for f in findings:
        severity = f.get("severity", "error")
        table.add_row(
            _text(_code_label(f)),
            Text(severity, style=_SEVERITY_STYLE.get(severity, "")),
            _text(f.get("path") or "-"),
            _text(f.get("message")),
            _text(f.get("fix") or "-"),
        )
    out.print(table)


def _print_failure(job: dict[str, Any]) -> None:
    table = Table.grid(padding=(0, 2))
    table.add_column(style="bold")
    table.add_column(overflow="fold")
    table.add_row("class", _text(job.get("failure_class") or "-"))
    table.add_row("code", _text(job.get("failure_code") or "-"))
    table.add_row("message", _text(job.get("failure_message") or "-"))
    table.add_row("fix", _text(job.get("failure_fix") or "-"))
    out.print(Text(f"job {job['id']} {job['status']}", style="bold red"))
    out.print(table)


def _next_commands(job_id: int) -> None:
    out.print("next:")
    for command, why in (
        (f"flightdeck watch {job_id}", "progress, loss and the outcome"),
        (f"flightdeck logs {job_id} --follow", "the run's output as it arrives"),
        (f"flightdeck cancel {job_id}", "stop it"),
    ):
        out.print(Text(f"  {command:<34}", style="bold") + Text(why))


# --- commands --------------------------------------------------------------------------------


def submit(
    recipe: Annotated[Path, typer.Argument(help="Recipe file: JSON, or YAML (.yaml, .yml).")],
    watch_job: Annotated[bool, typer.Option("--watch", help="Follow the job until it ends.")] = False,
    priority: Annotated[int, typer.Option(min=-1000, max=1000, help="Higher runs first.")] = 0,
    max_attempts: Annotated[int | None, typer.Option(min=1, max=100, help="Tries on a lost lease.")] = None,
    url: UrlOption = DEFAULT_URL,
    token: TokenOption = None,
) -> None:
    """Check a recipe here, submit it, print the job id and what to run next."""
    payload = _load_recipe(recipe)
    findings = _local_findings(payload)
    _print_findings(findings)
    errors = sum(f.get("severity") == "error" for f in findings)
    if errors:
        raise _fail(f"{errors} error(s) in {recipe}; fix each one above (nothing was submitted)")
    with _service(url, token) as client:
        job = client.post("/jobs", payload, priority=priority, max_attempts=max_attempts)
        out.print(
            Text(f"submitted job {job['id']} ", style="bold green")
            + _text(job["name"])
            + Text(f" ({job['status']})")
        )
        _next_commands(job["id"])
        if watch_job:
            raise typer.Exit(_watch(client, job["id"], 1.0))


def preflight(
    recipe: Annotated[Path, typer.Argument(help="Recipe file: JSON, or YAML (.yaml, .yml).")],
    workspace: Annotated[
        Path | None,
        typer.Option(
            help="Run the worker's host checks here, with recipe paths resolved in this directory (as "
            "`flightdeck worker --workspace`). Default: the current directory when it holds the recipe's "
            "paths; otherwise the checks that need the files are listed as not run."
        ),
    ] = None,
    cpu_slots: Annotated[
        int | None,
        typer.Option(
            min=1, help="With a local workspace: plan this host as `flightdeck worker --cpu-slots N`."
        ),
    ] = None,
    host: Annotated[
        Path | None, typer.Option(help="A worker inventory JSON: adds host rules and the launch plan there.")
    ] = None,
    model_config: Annotated[
        Path | None,
        typer.Option(
            help="The model's config.json: adds the memory estimate (by default read from the model "
            "directory the recipe, or a script job's --model_name_or_path, names under --workspace)."
        ),
    ] = None,
    url: UrlOption = DEFAULT_URL,
    token: TokenOption = None,
) -> None:
    """Dry run: findings, memory estimate, launch plan; the worker's host checks where the files are.

    Exit 1 on errors found, 2 if the service refused the recipe before its rules (schema, E006) or
    could not be asked."""
    payload = _load_recipe(recipe)
    local, not_local = (
        (None, "a worker inventory was given (--host)")
        if host
        else _local_host(payload, workspace, cpu_slots)
    )
    body: dict[str, Any] = {"recipe": payload}
    if host:
        body["host"] = _load_recipe(host)
    elif local is not None:
        body["host"] = local.inventory.model_dump(mode="json")
    if model_config is None and (local is None or local.model_config is None):
        # a script job's --model_name_or_path (or a recipe's model) under the workspace
        model_config = _local_model_config(body["recipe"], workspace or Path("."))
        if model_config is not None:
            out.print(Text("model config: ", style="bold") + _text(str(model_config)))
    if model_config:
        body["model_config"] = _load_recipe(model_config)
    elif local is not None and local.model_config is not None:
        body["model_config"] = local.model_config
    with _service(url, token) as client:
        answer = client.post("/preflight", body)
    findings = list(answer.get("findings", []))
    if local is not None and answer.get("effective_recipe"):
        findings += _new_findings(findings, _worker_host_check(answer["effective_recipe"], local))
    _print_findings(findings)
    _print_memory(answer.get("memory"))
    if answer.get("plan"):
        plan_on = (
            f"this host '{local.inventory.hostname}': {local.inventory.facts()}"
            if local
            else answer.get("plan_on")
        )
        if plan_on:
            out.print(Text("launch plan on ", style="bold") + _text(plan_on))
        _print_plan(answer["plan"])
    if answer.get("plan_error"):
        out.print(Text("launch plan: ", style="bold red") + _text(answer["plan_error"]))
    for note in local.notes if local else []:
        out.print(Text("note: ", style="bold") + _text(note))
    failed = not answer.get("ok", True) or any(f.get("severity") == "error" for f in findings)
    if failed:
        out.print(Text("preflight found errors: fix them before submitting", style="bold red"))
        raise typer.Exit(EXIT_JOB_FAILED)
    if local is not None:
        out.print(
            Text("preflight passed", style="bold green")
            + _text(f": static rules and the worker's host checks, run here on {local.workspace}")
        )
        return
    _print_not_run(not_local)


def _local_host(payload: Any, workspace: Path | None, cpu_slots: int | None) -> tuple[Any, str]:
    """(this host as a worker with a local workspace, or None; why not) for the worker's host checks."""
    from flightdeck.recipe import RecipeInvalid, parse_recipe

    if workspace is not None and not workspace.is_dir():
        raise _fail(f"--workspace {workspace}: not a directory")
    try:
        parsed = parse_recipe(payload)
    except RecipeInvalid:
        return None, "the recipe is refused"  # the service's answer lists why
    try:
        from flightdeck.cli.local_preflight import describe_local_host, workspace_holding

        root = workspace_holding(parsed, workspace, Path.cwd())
        if root is None:
            return None, "the current directory holds none of the recipe's paths; pass --workspace DIR"
        return describe_local_host(parsed, root, cpu_slots), ""
    except ImportError as exc:
        return (
            None,
            f"this installation lacks the worker's libraries ({exc.name}); install the [worker] extra",
        )


def _worker_host_check(effective: dict[str, Any], local: Any) -> list[dict[str, Any]]:
    from flightdeck.cli.local_preflight import run_worker_host_check

    return run_worker_host_check(effective, local)


def _new_findings(shown: list[dict[str, Any]], more: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`more` less what `shown` has: the service already ran the inventory rules the host check repeats."""
    seen = {(f.get("code"), f.get("path"), f.get("message")) for f in shown}
    return [f for f in more if (f.get("code"), f.get("path"), f.get("message")) not in seen]


def _print_not_run(why: str) -> None:
    """Never a bare 'passed' when the checks that read the model and the data did not run."""
    from flightdeck.preflight.worker_checks import worker_check_lines

    out.print(
        Text("not run here", style="bold yellow") + _text(f" ({why}); the worker runs these after the claim:")
    )
    for line in worker_check_lines():
        out.print(_text(f"  - {line}"))
    out.print(
        Text("static checks passed", style="bold green")
        + _text("; the worker's host checks above have not run (the job can still fail them)")
    )


def _local_model_config(payload: Any, workspace: Path) -> Path | None:
    """config.json of the model the recipe (or a script job's HF arguments) names, when it is a local
    directory: the service never reads the worker's files, so the estimate needs it sent."""
    from flightdeck.recipe import RecipeInvalid, parse_recipe
    from flightdeck.recipe.script_args import described_recipe

    try:
        recipe = parse_recipe(payload)
    except RecipeInvalid:
        return None  # the service names what is wrong
    try:
        described = described_recipe(recipe) if recipe.model is None else None
    except ValueError:
        return None  # the service's findings name the argument
    model = described[0].model if described is not None else recipe.model
    if model is None:
        return None
    config = (
        (workspace / model.path / "config.json")
        if not Path(model.path).is_absolute()
        else Path(model.path, "config.json")
    )
    return config if config.is_file() else None


def _print_memory(memory: Any) -> None:
    if isinstance(memory, str):
        out.print(Text("memory estimate: ", style="bold") + _text(memory))
    elif isinstance(memory, list) and memory:
        parts = ("weights", "adapter", "gradients", "optimizer", "activations", "overhead", "total")
        table = Table(title="memory estimate per GPU (GB)", title_justify="left")
        table.add_column("stage")
        for part in parts:
            table.add_column(part, justify="right")
        for index, stage in enumerate(memory):
            table.add_row(str(index), *(_number(stage.get(f"{part}_gb")) for part in parts))
        out.print(table)


def _print_plan(plan: dict[str, Any]) -> None:
    out.print(Text("launch plan", style="bold"))
    out.print(_text(" ".join(str(a) for a in plan.get("argv", []))))
    table = Table(title_justify="left")
    for column in ("variable", "value", "reason"):
        table.add_column(column, overflow="fold")
    for var in plan.get("env", []):
        table.add_row(_text(var.get("name")), _text(var.get("value")), _text(var.get("reason")))
    out.print(table)


def jobs(
    status: Annotated[
        str | None, typer.Option(help="queued, running, cancelling, succeeded, failed or cancelled.")
    ] = None,
    limit: Annotated[int, typer.Option(min=1, max=500)] = 50,
    url: UrlOption = DEFAULT_URL,
    token: TokenOption = None,
) -> None:
    """List jobs, newest first."""
    if status is not None and status not in STATUSES:
        raise _fail(f"--status {status!r}: use one of {', '.join(STATUSES)}")
    with _service(url, token) as client:
        page = client.get("/jobs", status=status, limit=limit)
    table = Table()
    for column in ("id", "status", "name", "worker", "step", "loss", "age"):
        table.add_column(column, justify="right" if column in ("id", "step", "loss") else "left")
    for job in page["data"]:
        table.add_row(
            str(job["id"]),
            job["status"],
            _text(job["name"]),
            _text(job.get("worker_name") or "-"),
            _number(job.get("last_step")),
            _number(job.get("last_loss")),
            _age(job["created_at"]),
        )
    out.print(table)


def show(
    job_id: JobId,
    as_json: Annotated[bool, typer.Option("--json", help="The API's answer as JSON.")] = False,
    url: UrlOption = DEFAULT_URL,
    token: TokenOption = None,
) -> None:
    """A job in full: status, failure, findings and fixes, recipes, launch plan, attempts."""
    with _service(url, token) as client:
        job = client.get(f"/jobs/{job_id}")
        events = _latest_events(client, job) if not as_json else []
        host_fixes = _host_fixes(events)
        scheduler = [e for e in events if e["kind"] == "slurm"]
    if as_json:
        typer.echo(json.dumps(job, indent=2))
        return
    out.print(Text(f"job {job['id']} ", style="bold") + _text(job["name"]) + Text(f"  {job['status']}"))
    out.print(
        f"worker {job.get('worker_name') or '-'}  step {_number(job.get('last_step'))}  "
        f"loss {_number(job.get('last_loss'))}  attempts {job['attempt_count']}/{job['max_attempts']}  "
        f"age {_age(job['created_at'])}",
        markup=False,
    )
    if job.get("failure_class") or job.get("failure_code"):
        _print_failure(job)
    if job.get("waiting"):
        out.print(Text("waiting: ", style="bold yellow") + _text(job["waiting"]))
    if scheduler:
        # What the cluster's scheduler last said of the latest attempt: `Slurm job 12: PENDING (Resources)`.
        out.print(Text("slurm: ", style="bold") + _text(scheduler[-1]["message"]))
    _print_findings(job.get("findings", []))
    out.print(Text("recipe (as submitted)", style="bold"))
    out.print(JSON.from_data(job["recipe"]))
    if job["effective_recipe"] != job["recipe"]:
        out.print(
            Text(f"effective recipe ({len(job.get('fixes_applied', []))} fix(es) applied)", style="bold")
        )
        out.print(JSON.from_data(job["effective_recipe"]))
    _print_host_fixes(job, host_fixes)
    attempts = job.get("attempts", [])
    if attempts:
        _print_plan(attempts[-1]["plan"])
        # Under the database's own folder (<runs>/<database>/job-<id>-attempt-<n>): print it, not guess it,
        # on one line however narrow the terminal, to be copied whole (`docker compose cp worker:<it>/output`).
        run_dir = _text(attempts[-1]["plan"].get("run_dir"))
        out.print(Text("run directory ", style="bold") + run_dir, soft_wrap=True)
        table = Table(title="attempts", title_justify="left")
        for column in ("#", "status", "worker", "started", "steps", "exit", "failure", "message"):
            table.add_column(column, overflow="fold")
        for a in attempts:
            failure = "/".join(x for x in (a.get("failure_class"), a.get("failure_code")) if x) or "-"
            table.add_row(
                str(a["number"]),
                a["status"],
                _text(a.get("worker_name") or a.get("worker_id")),
                _age(a["started_at"]) + " ago",
                _steps(a),
                _number(a.get("exit_code")),
                _text(failure),
                _text(a.get("message") or "-"),
            )
        out.print(table)
        _print_nodes(attempts[-1])


def _latest_events(client: UserClient, job: dict[str, Any]) -> list[dict[str, Any]]:
    """The latest attempt's events, oldest first."""
    attempts = job.get("attempts") or []
    if not attempts:
        return []
    latest = attempts[-1]["id"]
    events = client.get(f"/jobs/{job['id']}/events", limit=10_000)["events"]
    return [e for e in events if e["attempt_id"] == latest]


def _host_fixes(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The fixes the latest attempt's host preflight applied (preflight events of severity info).

    The effective recipe above was made at submit, before a host read the model: what only the model
    tells (model.freeze's part names as module prefixes, a free port) arrives as the attempt's events.
    """
    return [e for e in events if e["kind"] == "preflight" and e["severity"] == "info"]


def _print_host_fixes(job: dict[str, Any], fixes: list[dict[str, Any]]) -> None:
    if not fixes:
        return
    attempt = job["attempts"][-1]
    title = f"host preflight fixes (attempt {attempt['number']} on {attempt.get('worker_name') or '-'})"
    table = Table(title=title, title_justify="left")
    for column in ("code", "path", "value", "why"):
        table.add_column(column, overflow="fold")
    for e in fixes:
        data = e.get("data") or {}
        path = data.get("path") or "-"
        # The value as a recipe spells it (JSON); the fix's own words where the event carries none.
        value = json.dumps(data["value"]) if "value" in data else e.get("fix") or "-"
        why = str(e.get("message") or "").removeprefix(f"{path}: ")
        table.add_row(_text(e.get("code") or "-"), _text(path), _text(value), _text(why))
    out.print(table)


def _steps(attempt: dict[str, Any]) -> str:
    """First and last step of an attempt ('41-80' for a retry that resumed after checkpoint 40)."""
    first, last = attempt.get("first_step"), attempt.get("last_step")
    return "-" if first is None else f"{first}-{last}"


def _print_nodes(attempt: dict[str, Any]) -> None:
    """The nodes of a multi-node attempt: which worker runs which rank, where, and how each ended (one
    node, every single-node attempt's, would repeat the attempt's own line)."""
    nodes = attempt.get("nodes") or []
    if len(nodes) < 2:
        return
    table = Table(title=f"nodes of attempt {attempt['number']}", title_justify="left")
    for column in ("rank", "worker", "address", "devices", "status", "message"):
        table.add_column(column, overflow="fold")
    for n in nodes:
        table.add_row(
            str(n["node_rank"]),
            _text(n.get("worker_name") or n["worker_id"]),
            _text(n.get("address") or "-"),
            _text(",".join(str(d) for d in n.get("devices") or []) or "-"),
            n["status"],
            _text(n.get("message") or "-"),
        )
    out.print(table)


def watch(
    job_id: JobId,
    interval: Annotated[float, typer.Option(min=0.1, help="Seconds between polls.")] = 1.0,
    url: UrlOption = DEFAULT_URL,
    token: TokenOption = None,
) -> None:
    """Live progress until the job ends: exit 0 if it succeeded, 1 if it failed or was cancelled."""
    with _service(url, token) as client:
        code = _watch(client, job_id, interval)
    raise typer.Exit(code)


class _LineProgress:
    """watch without a terminal (a pipe, CI logs): a plain line whenever the status or step changes,
    at most every `every` seconds, where rich's bar would print nothing until the end."""

    def __init__(self, every: float = 5.0):
        self.every = every
        self.total: int | None = None
        self._last: tuple[str, Any] | None = None
        self._printed_at = 0.0

    def __enter__(self) -> _LineProgress:
        return self

    def __exit__(self, *_: object) -> None:
        return None

    def add_task(self, description: str, total: int | None, stats: str) -> int:
        # Nothing printed yet: the first update has the job's real step (a finished job's first line
        # would otherwise be "step 0/30", and its last one held back by the rate limit).
        self.total = total
        return 0

    def update(self, _: int, *, description: str, completed: int, stats: str) -> None:
        now = time.monotonic()
        if (description, completed) == self._last or (
            self._last and now - self._printed_at < self.every and description == self._last[0]
        ):
            return
        self._last, self._printed_at = (description, completed), now
        of = f"/{self.total}" if self.total else ""
        typer.echo(f"{description}  step {completed}{of}  {stats}".rstrip())


def _planned_total(recipe: dict[str, Any]) -> int | None:
    """Steps over every stage (a two-stage job of 10 + 10 steps is 20, not 10)."""
    try:
        return planned_steps(Recipe.model_validate(recipe))
    except (ValidationError, ValueError):
        return None


def _watch(client: UserClient, job_id: int, interval: float) -> int:
    job = client.get(f"/jobs/{job_id}")
    total = _planned_total(job["effective_recipe"])
    waited = False
    latest: dict[str, Any] = {}
    after, attempt_id = -1, None
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[stats]}"),
        TimeRemainingColumn(),
    )
    progress: Any = Progress(*columns, console=out) if out.is_terminal else _LineProgress()
    with progress:
        task = progress.add_task(f"job {job_id} {job['status']}", total=total, stats="")
        while True:
            if job["status"] == "queued" and job.get("waiting") and not waited:
                out.print(Text("waiting: ", style="bold yellow") + _text(job["waiting"]))
                waited = True
            # Jump to the newest step: watch shows where the run is, not its history.
            after = max(after, (job.get("last_step") or 0) - 1)
            page = client.get(f"/jobs/{job_id}/metrics", after=after, keys=",".join(WATCHED_METRICS))
            if page["attempt_id"] != attempt_id:
                attempt_id, after, latest = page["attempt_id"], -1, {}
            for point in page["points"]:
                latest.update(point["values"])
                after = point["step"]
            stats = "  ".join(f"{k} {_number(latest[k])}" for k in WATCHED_METRICS if k in latest)
            progress.update(
                task,
                description=f"job {job_id} {job['status']}",
                completed=job.get("last_step") or 0,
                stats=stats,
            )
            if job["status"] in TERMINAL:
                break
            time.sleep(interval)
            job = client.get(f"/jobs/{job_id}")
    if job["status"] == "succeeded":
        out.print(
            Text(f"job {job_id} succeeded", style="bold green")
            + _text(f"; output: {job.get('output_path') or '-'}"),
            soft_wrap=True,  # the path on one line, to be copied whole
        )
        return 0
    _print_failure(job)
    return EXIT_JOB_FAILED


def logs(
    job_id: JobId,
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Stream until the job ends.")] = False,
    attempt: Annotated[int | None, typer.Option(min=1, help="Attempt number (default: the latest).")] = None,
    node: Annotated[
        int, typer.Option(min=0, help="Node rank of a multi-node job (each has its own log).")
    ] = 0,
    url: UrlOption = DEFAULT_URL,
    token: TokenOption = None,
) -> None:
    """Print a job's output log; with --follow, stream it live (server-sent events)."""
    with _service(url, token) as client:
        if follow:
            _follow_log(client, job_id, attempt, node)
            return
        offset = 0
        while True:
            page = client.get(f"/jobs/{job_id}/logs", offset=offset, attempt=attempt, node=node)
            typer.echo(page["text"], nl=False)
            if page["next_offset"] <= offset:
                return
            offset = page["next_offset"]


def _follow_log(client: UserClient, job_id: int, attempt: int | None, node: int = 0) -> None:
    offset, attempt_id = 0, None
    while True:  # the service closes a stream now and then; reconnect from the cursor until `end`
        for event in client.stream(
            f"/jobs/{job_id}/logs/stream", attempt=attempt, offset=offset, attempt_id=attempt_id, node=node
        ):
            if event.event == "log":
                typer.echo(event.data["text"], nl=False)
                offset = event.data["next_offset"]
            elif event.event == "attempt" and event.data["attempt_id"] != attempt_id:
                if attempt_id is not None:
                    err.print(f"--- attempt {event.data['attempt_id']} (job requeued) ---", markup=False)
                attempt_id, offset = event.data["attempt_id"], 0
            elif event.event == "end":
                err.print(f"--- job {job_id} {event.data['status']} ---", markup=False)
                return


def cancel(job_id: JobId, url: UrlOption = DEFAULT_URL, token: TokenOption = None) -> None:
    """Cancel a job: at once if queued; a running one stops when its worker confirms."""
    with _service(url, token) as client:
        job = client.post(f"/jobs/{job_id}/cancel")
    out.print(f"job {job_id} {job['status']}", markup=False)
    if job["status"] == "cancelling":
        out.print(
            f"the worker is stopping the run; `flightdeck watch {job_id}` shows when it ends", markup=False
        )


def revoke_worker(
    name: Annotated[str, typer.Argument(help="The worker's name (see `flightdeck workers`).")],
    url: UrlOption = DEFAULT_URL,
    token: TokenOption = None,
) -> None:
    """Revoke a worker: its token stops working at once, its running attempts are lost as for an
    expired lease (requeued while attempts remain). It may register again with the enrolment token."""
    with _service(url, token) as client:
        found = [w for w in client.get("/workers") if w["name"] == name]
        if not found:
            raise _fail(f"no worker named {name!r}; `flightdeck workers` lists them")
        client.post(f"/workers/{found[0]['id']}/revoke")
    out.print(
        Text(f"worker {name} revoked", style="bold")
        + _text("; its attempts are lost as for an expired lease")
    )


def workers(ctx: typer.Context, url: UrlOption = DEFAULT_URL, token: TokenOption = None) -> None:
    """Registered workers: devices, liveness and what they run."""
    if ctx.invoked_subcommand is not None:
        return
    with _service(url, token) as client:
        found = client.get("/workers")
    table = Table()
    for column in ("id", "name", "alive", "devices", "scripts", "running", "last seen"):
        table.add_column(column)
    for w in found:
        inventory = w.get("inventory", {})
        gpus = inventory.get("gpus") or []
        devices = (
            f"{len(gpus)} x {gpus[0].get('name', 'gpu')}"
            if gpus
            else f"cpu x {inventory.get('cpu_slots', 0)}"
        )
        table.add_row(
            str(w["id"]),
            _text(w["name"]),
            "yes" if w["alive"] else "no",
            _text(devices),
            "yes" if inventory.get("runs_scripts", True) else "no",
            _text(", ".join(str(a) for a in w["running_attempts"]) or "-"),
            _age(w["last_seen_at"]) + " ago",
        )
    out.print(table)
