"""Turns a finished torchrun (exit code, result.json, log tail) into a status, failure class and code."""

from __future__ import annotations

import re
import signal
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from flightdeck.contracts import (
    CHECKPOINT_STOP_CODE,
    HEALTH_EXIT_CODE,
    INTERRUPTED,
    MAX_FINDINGS,
    MAX_LOG_TAIL,
    MAX_TEXT,
    FinishReport,
)
from flightdeck.recipe.findings import Finding
from flightdeck.recipe.nul import clean_text, clean_value
from flightdeck.worker.agent.script_signatures import SCRIPT_SIGNATURES

TAIL_LINES = 40


@dataclass(frozen=True)
class LogSignature:
    """A known failure recognised by text in the log."""

    pattern: re.Pattern[str]
    failure_class: str | None  # None: exit:<n>
    code: str
    what: str
    fix: str


def _sig(pattern: str, failure_class: str | None, code: str, what: str, fix: str) -> LogSignature:
    return LogSignature(re.compile(pattern, re.IGNORECASE), failure_class, code, what, fix)


# Order matters: the first match wins, most specific first.
SIGNATURES = (
    _sig(
        r"CUDA out of memory|torch\.(cuda\.)?OutOfMemoryError",
        "oom",
        "M001",
        "CUDA ran out of memory",
        "use gradient checkpointing, 4-bit quantisation, batch 1 with accumulation, or shorter sequences",
    ),
    _sig(
        r"Watchdog caught collective operation timeout|NCCL (communicator|operation).*time ?out|"
        r"ProcessGroupNCCL.*[Tt]imeout|NCCL timeout",
        "nccl",
        "H005",
        "an NCCL collective timed out (a rank hung or died)",
        "check the other ranks' errors; on consumer GPUs set NCCL_P2P_DISABLE=1 (E005)",
    ),
    _sig(
        r"Cannot re-initialize CUDA in forked subprocess",
        None,
        "E001",
        "CUDA was used inside a forked DataLoader worker",
        "keep collate CPU-only and use the spawn start method, or data.num_workers 0",
    ),
    _sig(
        r"expected mat1 and mat2 to have the same dtype",
        None,
        "P002",
        "the Trainer wrapped a device-mapped model in DataParallel (dtype mismatch at a linear layer)",
        "run a device-mapped model in one process with _n_gpu = 1, or drop model.device_map for DDP",
    ),
    _sig(
        r"can't train a model that has been loaded with `?device_map='auto'`? in any distributed mode",
        None,
        "P001",
        "a device-mapped model was launched under multi-process DDP",
        "set model.device_map to null (SHIRG_NO_DEVICE_MAP=1) for DDP, or run one process",
    ),
    _sig(
        r"invalid device ordinal",
        None,
        "P004",
        "more processes than visible GPUs",
        "lower resources.gpus_per_node to the GPUs the worker has",
    ),
    _sig(
        r"EADDRINUSE|address already in use",
        None,
        "E002",
        "the master port was already in use",
        "leave MASTER_PORT out of the recipe so the agent picks a free port",
    ),
    _sig(
        r"DistributedDataParallel is not needed when a module doesn't have any parameter that requires",
        None,
        "G001",
        "no parameter requires a gradient, so DDP refused to wrap the model",
        "freeze the base before the adapter is added, then re-enable requires_grad on every adapter "
        "parameter (or on what should train)",
    ),
    _sig(
        r"Expected to mark a variable ready only once",
        None,
        "G004",
        "reentrant gradient checkpointing under DDP reached a parameter twice",
        "set model.gradient_checkpointing_reentrant false and training.ddp_find_unused_parameters false",
    ),
    _sig(
        r"Expected to have finished reduction in the prior iteration",
        None,
        "G005",
        "trainable parameters outside the forward path under DDP",
        "freeze the unused modules, or set training.ddp_find_unused_parameters true",
    ),
    _sig(
        r"expected device meta",
        None,
        "P003",
        "offloaded (meta) weights reached training",
        "drop CPU/disk offload: quantise, lower the batch or use more GPUs",
    ),
)

# Users' scripts' own failures (D004, E001 in a loader worker, E007), after the ones above.
SCRIPT_LOG_SIGNATURES = tuple(_sig(*row) for row in SCRIPT_SIGNATURES)

# torchrun's failure summary lists each failed rank's own exit code (torchrun itself exits 1).
_RANK_EXIT = re.compile(r"exitcode\s*:\s*(-?\d+)")
_ROOT_CAUSE = re.compile(r"Root Cause.*?rank\s*:\s*(\d+).*?exitcode\s*:\s*(-?\d+)", re.DOTALL)


class Outcome(FinishReport):
    """How the attempt ended, as the agent works it out: the contract's FinishReport itself, built
    without its limits (a long log, a NUL in a path must never leave a run's end unreported) and cut
    to them by `report()`. `message` and `log_tail` start empty rather than None."""

    def __init__(self, status: str, exit_code: int | None = None, **fields: Any) -> None:
        built = FinishReport.model_construct(
            status=status, exit_code=exit_code, **{"message": "", "log_tail": "", **fields}
        )
        for name in ("__dict__", "__pydantic_fields_set__", "__pydantic_extra__", "__pydantic_private__"):
            object.__setattr__(self, name, getattr(built, name))

    def report(self) -> dict[str, Any]:
        """The finish body, cut to the contract's limits: a longer field would be refused with 422 and
        a run that succeeded would go unreported. The start of the texts, the end of the log; NUL
        replaced in all of them (a log's bytes never decide the outcome)."""
        message, fix, log_tail, ranks = self.message or "", self.fix, self.log_tail or "", self.ranks
        return {
            **self.__dict__,
            "message": clean_text(message[:MAX_TEXT]),
            "fix": clean_text(fix[:MAX_TEXT]) if fix is not None else None,
            "log_tail": clean_text(log_tail[-MAX_LOG_TAIL:]),
            "findings": clean_value(list(self.findings)[:MAX_FINDINGS]),
            "ranks": clean_text(ranks[:MAX_TEXT]) if ranks is not None else None,
        }


def tail_lines(text: str, count: int = TAIL_LINES) -> str:
    return "\n".join(text.rstrip("\n").splitlines()[-count:])


# Where torchrun's own failure report starts: its "failed (exitcode: N)" line, then its traceback and the
# ChildFailedError block ("Root Cause ... error_file: <N/A>"), which say nothing about the cause.
_TORCHRUN_REPORT = re.compile(r"elastic/multiprocessing/api\.py.*failed \(exitcode|ChildFailedError")


def without_launcher_report(log_text: str) -> str:
    """The log up to torchrun's own failure report: what the ranks said, for the user-facing message."""
    lines = log_text.splitlines()
    cut = next((i for i, line in enumerate(lines) if _TORCHRUN_REPORT.search(line)), len(lines))
    # Its traceback starts on the line before the ChildFailedError when no api.py line came first.
    while cut > 0 and cut < len(lines) and lines[cut - 1].startswith(("Traceback", "  File ", "    ")):
        cut -= 1
    return "\n".join(lines[:cut])


def classify_exit(exit_code: int, result: dict[str, Any] | None, log_text: str) -> Outcome:
    """The outcome of a torchrun that exited with `exit_code` after writing `result` and `log_text`."""
    tail = tail_lines(log_text)
    said = tail_lines(without_launcher_report(log_text))
    output_path = result.get("output_path") if result else None
    if exit_code == 0 and (result is None or result.get("status") != "failed"):
        message = (result or {}).get("message") or "training finished"
        return Outcome("succeeded", 0, message=str(message), log_tail=tail, output_path=output_path)
    findings = trainer_findings(result)
    if result and result.get("status") == "failed" and findings:
        # A trainer refusal (RecipeInvalid) lists its problems in result.json: the attempt keeps them, and
        # the failure carries the code and fix of the first error among them.
        first = next((f for f in findings if f["severity"] == "error"), findings[0])
        coded = next((f for f in findings if f["severity"] == "error" and f.get("code")), first)
        result = {
            **result,
            "failure_code": result.get("failure_code") or coded.get("code"),
            "fix": result.get("fix") or coded.get("fix") or _finding_text(coded),
        }
    if result and result.get("status") == "failed" and result.get("failure_code"):
        # Only a health check's stop (exit 42) is health:<code>; a data error that exits 1 still
        # carries the trainer's code, message and fix, under exit:<n>.
        code = str(result["failure_code"])
        failure_class = f"health:{code}" if _health_stop(exit_code, log_text) else f"exit:{exit_code}"
        if code == CHECKPOINT_STOP_CODE:
            # Saved and stopped on a signal (time limit, preemption, a stop): retried, and it resumes.
            failure_class = INTERRUPTED
        return _failed(
            exit_code,
            failure_class,
            code,
            str(result.get("message") or ""),
            result.get("fix"),
            tail,
            output_path,
            said,
            findings,
        )
    for signature in (*SIGNATURES, *SCRIPT_LOG_SIGNATURES):
        if signature.pattern.search(log_text):
            failure_class = signature.failure_class or f"exit:{exit_code}"
            return _failed(
                exit_code,
                failure_class,
                signature.code,
                signature.what,
                signature.fix,
                tail,
                output_path,
                said,
            )
    killed = _killed_rank(log_text)
    if killed is not None:
        rank, signum = killed
        what = f"rank {rank} was killed by signal {signum} ({_signal_name(signum)})"
        fix = "SIGKILL usually means host memory ran out (kernel OOM killer): lower the batch or data workers"
        return _failed(exit_code, f"exit:{exit_code}", "H005", what, fix, tail, output_path, said)
    if exit_code < 0:
        what = f"torchrun was killed by signal {-exit_code} ({_signal_name(-exit_code)})"
        return _failed(exit_code, f"exit:{exit_code}", "H005", what, None, tail, output_path, said)
    if result and result.get("status") == "failed" and result.get("message"):
        # The trainer said what went wrong (an exception it caught): that, not "exited with code 1".
        # After the killed-rank check: a rank killed under the others makes them fail with their own error.
        return _failed(
            exit_code,
            f"exit:{exit_code}",
            None,
            str(result["message"]),
            result.get("fix"),
            tail,
            output_path,
            said,
            findings,
        )
    return _failed(
        exit_code,
        f"exit:{exit_code}",
        None,
        f"torchrun exited with code {exit_code}",
        None,
        tail,
        output_path,
        said,
    )


def trainer_findings(result: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The findings result.json lists (a trainer refusal names each problem), in the finish report's
    shape; an entry the service would refuse is dropped rather than failing the whole report."""
    raw = result.get("findings") if result else None
    if not isinstance(raw, list):
        return []
    findings = []
    for item in raw:
        try:
            finding = Finding.model_validate({**item, "where": "run"} if isinstance(item, dict) else item)
        except ValidationError:
            continue
        findings.append(finding.model_dump(mode="json"))
    return findings


def _finding_text(finding: dict[str, Any]) -> str:
    return f"{finding['path']}: {finding['message']}" if finding.get("path") else str(finding["message"])


def _failed(
    exit_code: int,
    failure_class: str,
    code: str | None,
    what: str,
    fix: str | None,
    tail: str,
    output_path: str | None,
    said: str | None = None,
    findings: list[dict[str, Any]] | None = None,
) -> Outcome:
    """A failure: the message says the cause, the fix once, and the ranks' last lines (not torchrun's
    report); log_tail keeps the whole tail."""
    head = f"{failure_class}" + (f" {code}" if code else "") + f": {what}"
    shown = tail_lines(_adding_to(tail if said is None else said, what, fix), 10)
    # A refusal's fix is often one of the problems the head already lists: said once, not twice.
    told = f"\nFix: {fix}" if fix and fix not in what else ""
    message = head + told + (f"\nLast log lines:\n{shown}" if shown else "")
    return Outcome(
        "failed",
        exit_code,
        failure_class=failure_class,
        failure_code=code,
        message=message,
        fix=fix,
        log_tail=tail,
        output_path=output_path,
        findings=findings or [],
    )


def _adding_to(log_text: str, *told: str | None) -> str:
    """The log lines that add to what the message tells: none repeating its cause or fix (every rank
    prints a health stop's message, some twice), and each line once."""
    keys = [t.splitlines()[0][:80] for t in told if t and len(t) >= 20]
    seen: set[str] = set()
    kept = []
    for line in log_text.splitlines():
        if line in seen or any(key in line for key in keys):
            continue
        seen.add(line)
        kept.append(line)
    return "\n".join(kept)


def _health_stop(exit_code: int, log_text: str) -> bool:
    """Whether a health check stopped the run: exit 42 from the trainer, directly or via torchrun."""
    if exit_code == HEALTH_EXIT_CODE:
        return True
    return any(int(code) == HEALTH_EXIT_CODE for code in _RANK_EXIT.findall(log_text))


def _killed_rank(log_text: str) -> tuple[int, int] | None:
    match = _ROOT_CAUSE.search(log_text)
    if match and int(match.group(2)) < 0:
        return int(match.group(1)), -int(match.group(2))
    return None


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return "unknown signal"
