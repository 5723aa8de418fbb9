"""What an end-to-end test shows when it fails: the jobs as the service has them, the end of every
process's log, and where each agent's live processes are (py-spy), taken before they are stopped.

A timeout in CI otherwise says only "timed out waiting for job 1"; this says which attempt, which step,
which event came last and which call each rank was in.
"""

from __future__ import annotations

import shutil
import subprocess
from typing import Any

import httpx
import psutil

from .processes import Managed, Service

LOG_LINES = 25
STACKS = 6  # py-spy dumps at most: ranks, torchrun, the agent


def _jobs(service: Service) -> list[str]:
    lines: list[str] = []
    try:
        with service.api() as api:
            for job in api.get("/jobs", params={"limit": 20}).json()["data"]:
                detail = api.get(f"/jobs/{job['id']}").json()
                attempts = [
                    f"{a.get('id')} {a.get('status')} on {a.get('worker_name')} steps {a.get('first_step')}-{a.get('last_step')}"
                    for a in detail.get("attempts", [])
                ]
                lines.append(
                    f"job {job['id']} {detail.get('status')} last_step={detail.get('last_step')} "
                    f"failure={detail.get('failure_code')} attempts={attempts}"
                )
                for event in api.get(f"/jobs/{job['id']}/events").json()["events"][-8:]:
                    lines.append(f"  event {event.get('code') or ''} {str(event.get('message'))[:160]}")
                log = api.get(f"/jobs/{job['id']}/logs", params={"max_bytes": 4096}).json().get("text", "")
                lines += [f"  log| {line[:200]}" for line in log.splitlines()[-LOG_LINES:]]
    except (httpx.HTTPError, ValueError) as error:
        lines.append(f"the service did not answer: {error!r}")
    return lines


def _live(started: list[Managed]) -> list[psutil.Process]:
    """The test's agents and everything under them (torchrun and its ranks run in sessions of their own,
    still below the agent)."""
    found = []
    for managed in started:
        if managed.proc is None or managed.proc.poll() is not None or isinstance(managed, Service):
            continue
        try:
            root = psutil.Process(managed.proc.pid)
            found += [root, *root.children(recursive=True)]
        except psutil.Error:
            continue
    return found


def _stack(pid: int) -> str:
    spy = shutil.which("py-spy")
    if spy is None:
        return "  (py-spy not installed)"
    try:
        out = subprocess.run(
            [spy, "dump", "--native", "--pid", str(pid)], capture_output=True, text=True, timeout=15
        )
    except subprocess.TimeoutExpired:
        return "  (py-spy timed out)"
    return "\n".join("  " + line for line in (out.stdout or out.stderr).splitlines()[:25])


def describe(started: list[Managed]) -> str:
    parts: list[str] = []
    for managed in started:
        if isinstance(managed, Service):
            parts += ["== jobs ==", *_jobs(managed)]
    for managed in started:
        tail = managed.log().splitlines()[-LOG_LINES:]
        parts += [f"== {managed.log_path.name} (last {len(tail)} lines) ==", *tail]
    live = _live(started)
    parts.append(f"== {len(live)} live processes of this test ==")
    for proc in live:
        try:
            parts.append(
                f"{proc.pid} (parent {proc.ppid()}) {proc.status()}: {' '.join(proc.cmdline())[:200]}"
            )
        except psutil.Error:
            continue
    # Ranks first: the deepest processes are where a hang is.
    for proc in sorted(live, key=lambda p: -len(_ancestors(p)))[:STACKS]:
        if "watchdog" in " ".join(_cmdline(proc)):
            continue
        parts += [f"-- stack of {proc.pid} --", _stack(proc.pid)]
    return "\n".join(parts)


def _cmdline(proc: psutil.Process) -> list[str]:
    try:
        return proc.cmdline()
    except psutil.Error:
        return []


def _ancestors(proc: psutil.Process) -> list[Any]:
    try:
        return proc.parents()
    except psutil.Error:
        return []
