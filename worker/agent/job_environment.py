"""A script job's own environment (`entrypoint.requirements`), layered over the worker's, torch kept.

The job's interpreter is a virtualenv whose site-packages holds one `.pth` that adds the worker's
own site directories after it (`site.addsitedir`, so their `.pth` files, editable installs included,
work as in the worker). Whatever the requirements file installs lands in the job's virtualenv and
wins; everything else, torch and its CUDA build first, is the worker's. `--system-site-packages`
would not do: a virtualenv made from the worker's own virtualenv sees the base interpreter's
packages, not the worker's.

pip runs as the job's interpreter (the worker's pip, reached through the `.pth`), so it sees the
worker's packages as installed and leaves them alone ("Requirement already satisfied"), never
uninstalls outside the job's virtualenv, and resolves against a constraints file that pins torch
to the worker's version: a dependency that needs another torch fails the build (E008), it cannot
replace it. A pin of torch in the file itself that the worker's torch does not satisfy is refused
before anything is built (E009, worker/host_preflight/requirements.py).

Built once per digest (the requirements file's bytes and those of the files it includes with `-r`/`-c`,
the worker's interpreter and torch) under
`<runs>/.envs/<digest>`, behind a file lock so two attempts never build one environment at once;
a build that did not finish leaves no ready marker and is built again. pip's output is the
attempt's log (output.log) before torchrun's.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import time
from collections.abc import Callable
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from flightdeck.worker.agent.requirements_includes import included_files

# Bump when the layout of an environment changes: older ones are then built again.
LAYOUT_VERSION = "1"
READY_MARKER = ".flightdeck-ready.json"
ENVS_DIR_NAME = ".envs"
# pip's own tail that says why it failed; the whole output is in the attempt's log.
FAILURE_TAIL_LINES = 12
BUILD_TIMEOUT_SECONDS = 1800.0


class RequirementsFailed(Exception):
    """pip could not install the requirements: `reason` is pip's own last lines."""

    def __init__(self, requirements: str, reason: str):
        super().__init__(reason)
        self.requirements = requirements
        self.reason = reason


@dataclass
class JobEnvironment:
    python: Path
    digest: str
    reused: bool
    seconds: float  # building it, or 0 when reused


def worker_torch_version() -> str | None:
    """The worker's torch as installed (read from its metadata: the agent never imports torch)."""
    try:
        return metadata.version("torch")
    except metadata.PackageNotFoundError:
        return None


def worker_site_dirs() -> list[str]:
    """The agent's interpreter's site directories (purelib, platlib), in order, once each."""
    dirs: list[str] = []
    for name in ("purelib", "platlib"):
        path = sysconfig.get_path(name)
        if path and path not in dirs:
            dirs.append(path)
    return dirs


def environment_digest(requirements: Path) -> str:
    """What decides whether an environment can be reused: the file and every file it includes with
    `-r`/`-c` (worker/agent/requirements_includes.py), and the worker it layers over."""
    h = hashlib.sha256()
    for part in (
        LAYOUT_VERSION,
        sys.executable,
        sys.version,
        worker_torch_version() or "",
        *worker_site_dirs(),
    ):
        h.update(part.encode() + b"\0")
    top = requirements.resolve().parent
    for file in included_files(requirements):
        # The name as pip reaches it from the top file: moving an include is a different environment too.
        h.update(os.path.relpath(file, top).encode() + b"\0" + file.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def job_environment(
    requirements: Path,
    envs_dir: Path,
    log_path: Path,
    *,
    cwd: Path,
    should_stop: Callable[[], bool] = lambda: False,
) -> JobEnvironment:
    """The job's interpreter, built (pip's output appended to `log_path`) or reused; raises
    RequirementsFailed when pip cannot install the file."""
    digest = environment_digest(requirements)
    home = envs_dir / digest
    envs_dir.mkdir(parents=True, exist_ok=True)
    with open(envs_dir / f"{digest}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # a second attempt with the same file waits, then reuses it
        python = home / "bin" / "python"
        if (home / READY_MARKER).is_file():
            _log(log_path, f"flightdeck: job environment {digest} ({requirements.name}) reused: {home}\n")
            return JobEnvironment(python, digest, reused=True, seconds=0.0)
        started = time.monotonic()
        shutil.rmtree(home, ignore_errors=True)  # a build that stopped half-way
        _log(
            log_path,
            f"flightdeck: building the job environment {digest} from {requirements.name} in {home}\n",
        )
        try:
            _build(home, requirements, log_path, cwd, should_stop)
        except BaseException:
            shutil.rmtree(home, ignore_errors=True)
            raise
        seconds = time.monotonic() - started
        (home / READY_MARKER).write_text(
            json.dumps({"digest": digest, "requirements": str(requirements), "seconds": round(seconds, 2)})
        )
        _log(log_path, f"flightdeck: job environment {digest} built in {seconds:.1f} s\n")
        return JobEnvironment(python, digest, reused=False, seconds=seconds)


def _build(
    home: Path, requirements: Path, log_path: Path, cwd: Path, should_stop: Callable[[], bool]
) -> None:
    _run(
        [sys.executable, "-m", "venv", "--without-pip", str(home)],
        log_path,
        cwd,
        should_stop,
        str(requirements),
    )
    python = home / "bin" / "python"
    site_dir = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    # After the job's own site-packages: what the requirements install shadows the worker's packages.
    lines = "".join(f"import site; site.addsitedir({d!r})\n" for d in worker_site_dirs())
    Path(site_dir, "_flightdeck_worker_site.pth").write_text(lines)
    constraints = home / "flightdeck-constraints.txt"
    torch = worker_torch_version()
    constraints.write_text(f"torch=={torch}\n" if torch else "")
    _run(
        [
            str(python), "-m", "pip", "install", "--no-input", "--disable-pip-version-check",
            "-r", str(requirements), "-c", str(constraints),
        ],
        log_path,
        cwd,
        should_stop,
        str(requirements),
    )  # fmt: skip


def _run(argv: list[str], log_path: Path, cwd: Path, should_stop: Callable[[], bool], what: str) -> None:
    """Run one build step with its output in the attempt's log; RequirementsFailed on a non-zero exit."""
    start = log_path.stat().st_size if log_path.exists() else 0
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT
        )
        deadline = time.monotonic() + BUILD_TIMEOUT_SECONDS
        while proc.poll() is None:
            if should_stop() or time.monotonic() > deadline:
                proc.kill()
                proc.wait()
                raise RequirementsFailed(what, "the build was stopped (cancelled, or past its time limit)")
            time.sleep(0.1)
    if proc.returncode != 0:
        with open(log_path, "rb") as log:
            log.seek(start)
            output = log.read().decode(errors="replace")
        raise RequirementsFailed(what, _why(output) or f"exit {proc.returncode}")


def _why(output: str) -> str:
    """pip's reason: from its first ERROR line on when it wrote one, else its last lines."""
    lines = [line for line in output.splitlines() if line.strip()]
    errors = [i for i, line in enumerate(lines) if line.startswith("ERROR:")]
    return "\n".join(lines[errors[0] :][:FAILURE_TAIL_LINES] if errors else lines[-FAILURE_TAIL_LINES:])


def _log(log_path: Path, text: str) -> None:
    with open(log_path, "a") as log:
        log.write(text)
