"""Exit classification: result.json first, then known log signatures, then signals and exit codes."""

from __future__ import annotations

import pytest

from flightdeck.contracts import FinishReport
from flightdeck.worker.agent.classify import Outcome, classify_exit

TORCHRUN_RANK_KILLED = """
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
======================================================
Failures:
[1]:
  rank      : 0 (local_rank: 0)
  exitcode  : -15 (pid: 4608)  (SIGTERM)
------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-11-21_22:40:54
  rank      : 1 (local_rank: 1)
  exitcode  : -9 (pid: 4609)  (SIGKILL)
  traceback : Signal 9 (SIGKILL) received by PID 4609
======================================================
"""


def test_success() -> None:
    outcome = classify_exit(0, {"status": "succeeded", "output_path": "/r/output/stage-0"}, "done\n")
    assert outcome.status == "succeeded" and outcome.failure_class is None
    assert outcome.output_path == "/r/output/stage-0"


def test_health_code_from_result_json() -> None:
    result = {"status": "failed", "failure_code": "G002", "message": "adapter grads zero", "fix": "unfreeze"}
    outcome = classify_exit(42, result, "step 2\n")
    assert (outcome.status, outcome.failure_class, outcome.failure_code) == ("failed", "health:G002", "G002")
    assert outcome.fix == "unfreeze" and "adapter grads zero" in outcome.message


@pytest.mark.parametrize(
    ("text", "failure_class", "code"),
    [
        ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", "oom", "M001"),
        ("[Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=5)", "nccl", "H005"),
        ("RuntimeError: Cannot re-initialize CUDA in forked subprocess. To use CUDA", "exit:1", "E001"),
        (
            "RuntimeError: expected mat1 and mat2 to have the same dtype, but got: float != c10::BFloat16",
            "exit:1",
            "P002",
        ),
        (
            "ValueError: You can't train a model that has been loaded with `device_map='auto'` in any "
            "distributed mode. Please rerun your script",
            "exit:1",
            "P001",
        ),
        ("RuntimeError: CUDA error: invalid device ordinal", "exit:1", "P004"),
        ("torch.distributed.DistNetworkError: EADDRINUSE: address already in use", "exit:1", "E002"),
        (
            "RuntimeError: DistributedDataParallel is not needed when a module doesn't have any parameter "
            "that requires a gradient.",
            "exit:1",
            "G001",
        ),
        ("RuntimeError: Expected to mark a variable ready only once. This error", "exit:1", "G004"),
        ("RuntimeError: Expected to have finished reduction in the prior iteration", "exit:1", "G005"),
        (
            "Function MmBackward0 returned an invalid gradient at index 1 - expected device meta",
            "exit:1",
            "P003",
        ),
    ],
)
def test_log_signatures(text: str, failure_class: str, code: str) -> None:
    outcome = classify_exit(1, None, f"loading\n{text}\nmore\n")
    assert (outcome.status, outcome.failure_class, outcome.failure_code) == ("failed", failure_class, code)
    assert outcome.fix and outcome.fix in outcome.message
    assert text.splitlines()[0][:30] in outcome.log_tail


def test_rank_killed_by_signal_names_the_rank() -> None:
    outcome = classify_exit(1, None, TORCHRUN_RANK_KILLED)
    assert (outcome.failure_class, outcome.failure_code) == ("exit:1", "H005")
    assert "rank 1 was killed by signal 9 (SIGKILL)" in outcome.message


def test_unknown_exit_keeps_the_code_and_the_tail() -> None:
    log = "\n".join(f"line {i}" for i in range(100))
    outcome = classify_exit(3, None, log)
    assert (outcome.failure_class, outcome.failure_code) == ("exit:3", None)
    assert outcome.log_tail.endswith("line 99") and "line 10\n" not in outcome.log_tail
    assert "line 99" in outcome.message


TORCHRUN_HEALTH_STOP = TORCHRUN_RANK_KILLED.replace("exitcode  : -9 (pid: 4609)  (SIGKILL)", "exitcode  : 42")


def test_health_stop_seen_through_torchrun() -> None:
    # torchrun itself exits 1; rank 1's own exit 42 is in its failure summary.
    result = {"status": "failed", "failure_code": "H003", "message": "steps too slow", "fix": "profile"}
    outcome = classify_exit(1, result, TORCHRUN_HEALTH_STOP)
    assert (outcome.failure_class, outcome.failure_code) == ("health:H003", "H003")


def test_a_data_error_with_a_code_is_not_a_health_stop() -> None:
    result = {"status": "failed", "failure_code": "D003", "message": "no 'text' field", "fix": "add it"}
    outcome = classify_exit(1, result, "Traceback ...\nValueError: no 'text' field\n")
    assert (outcome.status, outcome.failure_class, outcome.failure_code) == ("failed", "exit:1", "D003")
    assert outcome.fix == "add it" and "no 'text' field" in outcome.message


def test_a_report_always_fits_the_service_limits() -> None:
    outcome = Outcome(
        "failed",
        1,
        failure_class="exit:1",
        failure_code="D003",
        message="start " + "m" * 30_000,
        fix="f" * 30_000,
        log_tail="x" * 70_000 + " the end",
        findings=[],
    )
    report = outcome.report()
    FinishReport.model_validate(report)
    assert report["message"].startswith("start ") and report["log_tail"].endswith(" the end")


def test_a_caught_trainer_error_is_the_message_not_the_exit_code() -> None:
    result = {
        "status": "failed",
        "failure_code": None,
        "message": "ValueError: task: set task to 'vision_language'",
    }
    log = "rank output\nValueError: task\nE1123 12:00 elastic/multiprocessing/api.py:1] failed (exitcode: 1)\nRoot Cause"
    outcome = classify_exit(1, result, log)
    assert outcome.failure_class == "exit:1" and "set task to 'vision_language'" in outcome.message
    assert "exited with code" not in outcome.message and "Root Cause" not in outcome.message


def test_a_killed_rank_outranks_the_error_it_caused_on_the_others() -> None:
    result = {"status": "failed", "failure_code": None, "message": "RuntimeError: Connection reset by peer"}
    log = (
        "step 3\nRuntimeError: Connection reset by peer\n"
        "E1123 elastic/multiprocessing/api.py:1] failed (exitcode: -9)\n"
        "Root Cause (first observed failure):\n[1]:\n  rank      : 1 (local_rank: 1)\n  exitcode  : -9 (pid: 7)\n"
    )
    outcome = classify_exit(1, result, log)
    assert outcome.failure_code == "H005" and "rank 1 was killed by signal 9" in outcome.message
    assert "Root Cause" not in outcome.message


def _trainer_refusal(findings: list[dict[str, object]]) -> dict[str, object]:
    """result.json as flightdeck.worker.train.exit_status writes it for RecipeInvalid."""
    problems = [f"{f['path']}: {f['message']}" for f in findings]
    return {
        "status": "failed",
        "failure_code": next((f["code"] for f in findings if f.get("code")), None),
        "message": f"the trainer refused the recipe ({len(problems)} problem(s)): " + "; ".join(problems),
        "fix": None,
        "output_path": None,
        "findings": findings,
    }


REFUSAL_LOG = (
    "[flightdeck] the trainer refused the recipe\n"
    "E1123 12:00 elastic/multiprocessing/api.py:1] failed (exitcode: 1)\nRoot Cause (first observed failure):\n"
    "  error_file: <N/A>\n"
)


def test_a_trainer_refusal_forwards_its_findings_with_the_first_errors_code_and_fix() -> None:
    findings = [
        {
            "code": None,
            "severity": "warn",
            "path": "training.warmup_ratio",
            "message": "unusual",
            "fix": None,
        },
        {
            "code": "E006",
            "severity": "error",
            "path": "env.LD_PRELOAD",
            "message": "LD_PRELOAD is not allowed in a recipe",
            "fix": "remove env.LD_PRELOAD",
        },
        {"code": "P001", "severity": "error", "path": "stages[1].model.device_map", "message": "same map"},
    ]
    outcome = classify_exit(1, _trainer_refusal(findings), REFUSAL_LOG)
    assert (outcome.failure_class, outcome.failure_code, outcome.fix) == (
        "exit:1",
        "E006",
        "remove env.LD_PRELOAD",
    )
    assert [(f["code"], f["path"]) for f in outcome.findings] == [(f["code"], f["path"]) for f in findings]
    assert all(f["where"] == "run" for f in outcome.findings)
    report = outcome.report()
    FinishReport.model_validate(report)
    assert report["findings"] and report["failure_code"] == "E006"
    assert outcome.message.count("remove env.LD_PRELOAD") == 1 and "Root Cause" not in outcome.message


def test_a_refusal_without_a_code_still_carries_its_first_problem_as_the_fix() -> None:
    """R2's refusal (stage env): no catalog code, but the job says what to change, once."""
    findings = [
        {
            "code": None,
            "severity": "error",
            "path": "stages[0].env",
            "message": "all stages run in the job's one launch; set env at the top level",
        }
    ]
    outcome = classify_exit(1, _trainer_refusal(findings), REFUSAL_LOG)
    assert outcome.failure_code is None and outcome.fix and "set env at the top level" in outcome.fix
    assert outcome.fix.startswith("stages[0].env: ")
    assert [f["path"] for f in outcome.report()["findings"]] == ["stages[0].env"]
    assert outcome.message.count("set env at the top level") == 1


def test_findings_the_service_would_refuse_are_dropped_not_the_report() -> None:
    result = _trainer_refusal([{"code": "D001", "severity": "error", "path": "data", "message": "x"}])
    result["findings"] = [*result["findings"], {"severity": "bogus", "message": "y"}, "not a finding"]  # type: ignore[list-item]
    outcome = classify_exit(1, result, REFUSAL_LOG)
    assert [f["code"] for f in outcome.findings] == ["D001"] and outcome.failure_code == "D001"
    FinishReport.model_validate(outcome.report())


def test_the_finish_report_carries_no_nul_whatever_the_log_held() -> None:
    """The agent cleans what it reports: an older service (or any store) never sees the NUL."""
    outcome = Outcome(
        "succeeded",
        message="done \x00",
        fix="fix \x00",
        log_tail="training done \x00\n",
        findings=[{"path": "data", "message": "m\x00", "value": {"k\x00": "v\x00"}}],
    )
    report = outcome.report()
    assert "\x00" not in repr(report)
    assert FinishReport.model_validate(report).log_tail == "training done \ufffd\n"


def test_a_health_stop_printed_by_every_rank_is_told_once_in_the_failure_message() -> None:
    what = "adapter gradients are zero or missing for 2 steps: vision_tower.q_proj lora_A/lora_B (4 tensors)"
    fix = "freeze the tower before get_peft_model, or leave its adapters out of target_modules"
    # What the ranks of a script job write when FlightdeckCallback stops them (stdout and stderr of both).
    log = "\n".join(
        [
            "{'loss': 6.1, 'grad_norm': 0.9, 'epoch': 0.1}",
            f"[flightdeck] error G002 {what}",
            f"[flightdeck] stopped: G002: {what}",
            f"[flightdeck] fix: {fix}",
            f"[flightdeck] stopped: G002: {what}",
            f"[flightdeck] fix: {fix}",
            "rank 1: checkpoint not written",
            "rank 1: checkpoint not written",
        ]
    )
    result = {"status": "failed", "failure_code": "G002", "message": what, "fix": fix}
    outcome = classify_exit(42, result, log)
    assert outcome.message.count(what) == 1, outcome.message
    assert outcome.message.count(fix) == 1, outcome.message
    assert outcome.message.count("rank 1: checkpoint not written") == 1, outcome.message
    assert "'loss': 6.1" in outcome.message  # the lines that add something stay
    assert outcome.log_tail.count(what) == 3  # the stored tail keeps the log as it was
