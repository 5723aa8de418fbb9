"""Delete each fix the trainer applies, run the tests, and say which deletions no test noticed.

A finding that says "fixed" must be backed by code, and that code by a test that fails without it.
Each mutant below removes (or neuters) the one line that applies a fix; the tests run with -x, so a
detected mutant costs only the time to its first failing test. The mutants are made in a copy of the
working tree (a temporary folder), never in the checkout; an unmutated baseline run must pass first.
Run: `python scripts/mutation_pass.py` (about 45 minutes on 2 cores; `--only G007 X004 --no-baseline`
for some). Exit status 1 if a mutant survives.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TESTS = ["tests/trainer", "tests/preflight", "tests/agent/test_classify.py"]


@dataclass(frozen=True)
class Mutant:
    code: str
    path: str
    line: str
    replacement: str


MUTANTS = (
    Mutant("G001", "worker/train/model.py", "        enable_adapter_params(model, freeze)", "        pass"),
    Mutant(
        "G004",
        "worker/train/recipe_run.py",
        '{"use_reentrant": m.gradient_checkpointing_reentrant}',
        '{"use_reentrant": True}',
    ),
    Mutant("G007", "worker/train/model.py", "        model.enable_input_require_grads()", "        pass"),
    Mutant(
        "G008",
        "worker/train/model.py",
        "    model.config.use_cache = use_cache\n    model.config.get_text_config().use_cache = use_cache",
        "    pass",
    ),
    Mutant(
        "G009",
        "worker/train/model.py",
        "        tokenizer.pad_token = reuse\n",
        "        tokenizer.add_special_tokens({'pad_token': '<pad>'})\n",
    ),
    Mutant(
        "G011",
        "worker/train/model.py",
        "modules_to_save=list(dict.fromkeys([*spec.modules_to_save, *extra_modules_to_save])) or None",
        "modules_to_save=spec.modules_to_save or None",
    ),
    Mutant("P002", "worker/train/recipe_run.py", "        one_process_owns_the_gpus(args)", "        pass"),
    Mutant(
        "P006",
        "worker/train/model.py",
        '        return {"": "cpu" if use_cpu else local_rank}',
        "        return None",
    ),
    Mutant(
        "E001",
        "worker/train/recipe_run.py",
        'dataloader_multiprocessing_context="spawn" if d.num_workers > 0 else None',
        "dataloader_multiprocessing_context=None",
    ),
    Mutant("X003", "worker/train/model.py", "        upcast_trainable(model)  # X003", "        pass"),
    Mutant(
        "D004",
        "worker/train/data.py",
        "    def __getstate__(self) -> dict[str, Any]:",
        "    def _unused_getstate(self) -> dict[str, Any]:",
    ),
    Mutant(
        "D008",
        "worker/train/data.py",
        "                if is_blank(sample, self.task):\n                    self.blank_rows.append(number)\n"
        "                    continue\n",
        "",
    ),
    Mutant(
        "H001",
        "worker/train/recipe_run.py",
        "        logging_nan_inf_filter=False,",
        "        logging_nan_inf_filter=True,",
    ),
    Mutant(
        "V003",
        "worker/train/collate.py",
        '                sample = {**sample, "images": [blank_image()]}',
        "                pass",
    ),
    Mutant(
        "V005-skip",
        "worker/train/model.py",
        "            llm_int8_skip_modules=skip,",
        "            llm_int8_skip_modules=None,",
    ),
    Mutant(
        "V005-verify",
        "worker/train/model.py",
        "            raise quantised_tower(still, tower)",
        "            pass",
    ),
    Mutant(
        "V006",
        "worker/train/model.py",
        "    tolerant_loss = attach_tolerant_loss(model)  # V006",
        "    tolerant_loss = None",
    ),
    Mutant(
        "M003",
        "worker/train/recipe_run.py",
        "        prediction_loss_only=True,",
        "        prediction_loss_only=False,",
    ),
    Mutant(
        "G002",
        "worker/train/health.py",
        "            partial = self._dead_groups(step)",
        "            partial = None",
    ),
    Mutant(
        "G002-no-grad",
        "worker/train/health.py",
        "        if not frozen:\n            return HealthEvent(",
        "        if not frozen:\n            return None\n            return HealthEvent(",
    ),
    Mutant(
        "G011-recipe",
        "worker/host_preflight/model_probe.py",
        '            {"adapter.modules_to_save": saved},',
        "            {},",
    ),
    Mutant(
        "X004",
        "worker/train/model.py",
        '        kwargs["attn_implementation"] = spec.attn_implementation',
        "        pass",
    ),
    Mutant(
        "D002",
        "worker/train/data.py",
        "        pairs = list(zip(question, answer, strict=True))",
        "        pairs = [(question[0], answer[0])]",
    ),
    Mutant(
        "D006-cap",
        "flightdeck/preflight/environment_rules.py",
        '            {"data.max_seq_length": limit},',
        "            {},",
    ),
    Mutant(
        "D006-truncate",
        "worker/train/collate.py",
        "    input_ids = (prompt_ids + answer_ids)[:max_seq_length]\n"
        "    labels = ([IGNORE_INDEX] * len(prompt_ids) + answer_ids)[:max_seq_length]\n",
        "    input_ids = prompt_ids + answer_ids\n    labels = [IGNORE_INDEX] * len(prompt_ids) + answer_ids\n",
    ),
    Mutant(
        "V004",
        "worker/train/recipe_run.py",
        "        remove_unused_columns=t.remove_unused_columns,",
        "        remove_unused_columns=True,",
    ),
)


def snapshot() -> Path:
    """A copy of the working tree (tracked and untracked, not ignored files) to mutate: the checkout itself
    is never edited, so nobody else's tests see a mutant and nobody's edits are overwritten on restore.
    Run from the copy, `python -m pytest` imports the copy's packages (the current folder comes first)."""
    files = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.split(b"\0")
    copy = Path(tempfile.mkdtemp(prefix="mutation-pass-"))
    for name in filter(None, files):
        source = ROOT / os.fsdecode(name)
        if source.is_file():
            target = copy / os.fsdecode(name)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
    return copy


def check_lines(tree: Path, mutants: Sequence[Mutant]) -> None:
    """Every line to mutate is in its file exactly once (checked before anything runs)."""
    stale = [m.code for m in mutants if (tree / m.path).read_text(encoding="utf-8").count(m.line) != 1]
    if stale:
        raise SystemExit(f"the line to mutate is not in its file exactly once: {stale}")


def pytest_run(tree: Path) -> subprocess.CompletedProcess[str]:
    """The tests, stopping at the first failure."""
    argv = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "-m", "not browser", *TESTS]
    return subprocess.run(argv, cwd=tree, capture_output=True, text=True)


def run(mutant: Mutant, tree: Path = ROOT) -> tuple[bool, float, str]:
    """(detected, seconds, the first failing test) for one mutant in `tree`; the file is restored afterwards."""
    path = tree / mutant.path
    original = path.read_text(encoding="utf-8")
    if original.count(mutant.line) != 1:
        raise SystemExit(f"{mutant.code}: the line to mutate is not in {mutant.path} exactly once")
    started = time.monotonic()
    try:
        path.write_text(original.replace(mutant.line, mutant.replacement), encoding="utf-8")
        proc = pytest_run(tree)
    finally:
        path.write_text(original, encoding="utf-8")
    failed = next((line for line in proc.stdout.splitlines() if line.startswith("FAILED")), "")
    return proc.returncode != 0, time.monotonic() - started, failed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", help="mutant codes to run (default: all)")
    parser.add_argument("--in-place", action="store_true", help="mutate the checkout itself, not a copy")
    parser.add_argument("--no-baseline", action="store_true", help="skip the unmutated run of the tests")
    options = parser.parse_args()
    chosen = [m for m in MUTANTS if not options.only or m.code in options.only]
    tree = ROOT if options.in_place else snapshot()
    survivors = []
    try:
        check_lines(tree, chosen)
        if not options.no_baseline:
            # Unmutated, the tests must pass, or every mutant would look detected.
            started = time.monotonic()
            baseline = pytest_run(tree)
            if baseline.returncode != 0:
                print(baseline.stdout[-3000:])
                raise SystemExit("the tests fail without any mutant: fix them before the mutation pass")
            print(f"{'baseline':14s} {'passed':9s} {time.monotonic() - started:6.1f}s", flush=True)
        for mutant in chosen:
            detected, seconds, failed = run(mutant, tree)
            print(
                f"{mutant.code:14s} {'detected' if detected else 'SURVIVED':9s} {seconds:6.1f}s  {failed}",
                flush=True,
            )
            if not detected:
                survivors.append(mutant.code)
    finally:
        if tree != ROOT:
            shutil.rmtree(tree, ignore_errors=True)
    print(
        f"{len(chosen) - len(survivors)} of {len(chosen)} mutants detected"
        + (f"; survived: {survivors}" if survivors else "")
    )
    return 1 if survivors else 0


if __name__ == "__main__":
    sys.exit(main())
