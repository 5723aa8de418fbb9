"""Step-time overhead of Flightdeck's monitoring: plain HF Trainer vs MeteredTrainer + health + metrics file
(recipe jobs), vs a plain Trainer with FlightdeckCallback (a user's own script), and vs the same plain
Trainer built under a script job's instrumentation (no edit: the patched Trainer.__init__ adds the
callback, the optimizer step hooks and the backward wrapper are installed); and a plain PyTorch loop
without and with the instrumentation's optimizer step watch (its own baseline), bare (`loop`) and
calling clip_grad_norm_ before each step (`loop_clip`: the watch takes that call's norm), and the bare
loop watched with every step written and judged at once (`loop_unbatched_instrumented`: the watch
without its batches of quick steps, loop_watch.BATCH_SECONDS 0); and the bare loop watched and bare
by turns in blocks of steps within each run (`loop_blocks`, and `loop_clip_blocks` for the loop that
clips: each its own baseline, run_loop_blocks).

Runs the same tiny LoRA training several times each way, interleaved (bench.harness.interleaved), and
prints the median step-time ratio of each against its baseline (goal <= 1.02, issue 33), with the median
of the per-round ratios (each run against its baseline's run of the same round) and the time measured
inside Flightdeck's hooks; for `loop_blocks`, the median ratio of neighbouring blocks with its 95 %
interval and the null beside it (the steadiest view on a shared machine).
Usage: python -m bench.monitor_overhead [--runs 5] [--steps 100] [--variants plain,instrumented];
under DDP: python -m torch.distributed.run --standalone --nproc_per_node 2 -m bench.monitor_overhead
"""

from __future__ import annotations

import contextlib
import io
import itertools
import os
import statistics
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Annotated, Any

import torch
import typer
from transformers import Trainer, TrainerCallback

from bench.harness import RESULTS_DIR, ResultsDir, interleaved, median_interval, run_cli, write_results
from flightdeck.recipe import parse_recipe
from flightdeck.worker.callback import FlightdeckCallback
from flightdeck.worker.tiny import make_demo_data, make_tiny_model
from flightdeck.worker.train.collate import CausalLMCollator
from flightdeck.worker.train.data import open_training_data
from flightdeck.worker.train.health import HealthEvent
from flightdeck.worker.train.health_callback import HealthCallback
from flightdeck.worker.train.metered_trainer import MeteredTrainer
from flightdeck.worker.train.metrics_file import MetricsFile
from flightdeck.worker.train.model import load_model
from flightdeck.worker.train.recipe_run import planned_steps_per_epoch, training_arguments
from flightdeck.worker.train.step_report import StepReporter

GOAL = 1.02
WARMUP_STEPS = 5
# Steps per block of the BLOCK_VARIANTS (run_loop_blocks): about 50 ms of the tiny loop, short against the
# machine's swings, long enough that a batch of the watch's steps (100 ms) is judged in most pairs.
BLOCK_STEPS = 6
RANK = int(os.environ.get("RANK", "0"))
WORLD_SIZE = int(os.environ.get("WORLD_SIZE", "1"))


@dataclass
class RunTimes:
    """Median seconds per step of one run: wall, this process's CPU, and inside Flightdeck's hooks (wall,
    and this thread's CPU: what a loaded machine's preemptions do not inflate)."""

    wall: float
    cpu: float
    hooks: float
    hooks_cpu: float


class StepClock(TrainerCallback):
    """Wall and CPU time stamps at each optimizer step's end; the same in both variants."""

    def __init__(self, hooks: HookTimer | None = None) -> None:
        self.wall: list[float] = []
        self.cpu: list[float] = []
        self.hooks = hooks

    def on_step_end(self, args, state, control, **kw):  # type: ignore[no-untyped-def]
        self.wall.append(time.perf_counter())
        self.cpu.append(time.process_time())
        if self.hooks is not None and len(self.wall) == WARMUP_STEPS:
            self.hooks.reset()  # hooks timed over the steps timed: not train begin's one-off checks

    @staticmethod
    def median_step(stamps: list[float]) -> float:
        return statistics.median(b - a for a, b in itertools.pairwise(stamps[WARMUP_STEPS:]))


class HookTimer:
    """Seconds spent inside wrapped methods (Flightdeck's callbacks and token meter)."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.cpu_seconds = 0.0

    def reset(self) -> None:
        self.seconds = self.cpu_seconds = 0.0

    def wrap(self, owner: Any, name: str) -> None:
        inner = getattr(owner, name)

        def timed(*args: Any, **kwargs: Any) -> Any:
            start, start_cpu = time.perf_counter(), time.thread_time()
            try:
                return inner(*args, **kwargs)
            finally:
                self.cpu_seconds += time.thread_time() - start_cpu
                self.seconds += time.perf_counter() - start

        setattr(owner, name, timed)


def _recipe(steps: int) -> Any:
    return parse_recipe(
        {
            "name": "bench",
            "model": {"path": "models/tiny-llama", "dtype": "float32", "gradient_checkpointing": False},
            "adapter": {"r": 8, "alpha": 16, "dropout": 0.0, "target_modules": ["q_proj", "v_proj"]},
            "data": {"train": [{"path": "data/infovqa.parquet", "preset": "infovqa"}], "num_workers": 0},
            "training": {
                "per_device_batch_size": 4,
                "gradient_accumulation_steps": 1,
                "learning_rate": 1e-3,
                "max_steps": steps,
                "precision": "fp32",
                "logging_steps": 1,
            },
            "resources": {"accelerator": "any"},
        }
    )


VARIANTS = (
    "plain",
    "monitored",
    "callback",
    "instrumented",
    "loop",
    "loop_instrumented",
    "loop_unbatched_instrumented",
    "loop_clip",
    "loop_clip_instrumented",
    "loop_blocks",
    "loop_clip_blocks",
)
# The variants timed watched and bare by turns within each run: their own baselines.
BLOCK_VARIANTS = ("loop_blocks", "loop_clip_blocks")
# Each variant's baseline: the Trainer variants against the plain Trainer, a loop against the same loop
# bare (`loop_clip`: the loop calls clip_grad_norm_ before each step, as most loops do). `loop_blocks`
# and `loop_clip_blocks` are their own: the loop watched and bare by turns within each run.
BASELINE = {
    "monitored": "plain",
    "callback": "plain",
    "instrumented": "plain",
    "loop_instrumented": "loop",
    "loop_unbatched_instrumented": "loop",
    "loop_clip_instrumented": "loop_clip",
}


def timed_watch(hooks: HookTimer | None = None) -> Any:
    """A fresh loop watch, its step hooks timed by `hooks` (wrapped before install, which binds them)."""
    from flightdeck.worker.instrument import loop_watch

    watch = loop_watch.LoopWatch()
    if hooks is not None:
        hooks.wrap(watch, "before_step")
        hooks.wrap(watch, "after_step")
    return watch


@contextlib.contextmanager
def instrumentation(run_dir: Path, hooks: HookTimer | None = None, watch: Any = None) -> Iterator[None]:
    """What an instrumented rank has installed (worker/instrument), for one run, then removed again.
    `watch`: the loop watch to install (a run that installs and removes it again and again keeps one)."""
    import transformers.trainer

    from flightdeck.worker.instrument import loop_watch, trainer_patch

    init, backward = transformers.trainer.Trainer.__init__, torch.Tensor.backward
    clip = torch.nn.utils.clip_grad_norm_
    previous_watch = loop_watch.WATCH
    loop_watch.WATCH = watch if watch is not None else timed_watch(hooks)
    handles = loop_watch.install(torch)
    trainer_patch.patch(transformers.trainer)
    previous = os.environ.get("FLIGHTDECK_RUN_DIR")
    os.environ["FLIGHTDECK_RUN_DIR"] = str(run_dir)  # records written as under Flightdeck
    try:
        yield
    finally:
        transformers.trainer.Trainer.__init__ = init  # type: ignore[method-assign]
        torch.Tensor.backward = backward  # type: ignore[method-assign]
        torch.nn.utils.clip_grad_norm_ = torch.nn.utils.clip_grad.clip_grad_norm_ = clip
        for handle in handles:
            handle.remove()
        loop_watch.WATCH = previous_watch
        if previous is None:
            os.environ.pop("FLIGHTDECK_RUN_DIR", None)
        else:
            os.environ["FLIGHTDECK_RUN_DIR"] = previous


def run_once(workspace: Path, steps: int, variant: str) -> RunTimes | BlockTimes:
    """One training run: plain, with the trainer's monitoring, with FlightdeckCallback, instrumented, or
    a plain loop (bare, instrumented, or both by turns)."""
    if variant in BLOCK_VARIANTS:
        return run_loop_blocks(workspace, steps, clip=variant == "loop_clip_blocks")
    if variant.startswith("loop"):
        return run_loop_once(
            workspace,
            steps,
            instrumented=variant.endswith("_instrumented"),
            clip="_clip" in variant,
            batched="_unbatched" not in variant,
        )
    if variant == "instrumented":
        run_dir = workspace / "run-instrumented-dir"
        run_dir.mkdir(exist_ok=True)
        hooks = HookTimer()
        with instrumentation(run_dir, hooks):
            return _run_trainer(workspace, steps, variant, hooks)
    return _run_trainer(workspace, steps, variant)


@contextlib.contextmanager
def _restored(owner: Any, name: str) -> Iterator[None]:
    value = getattr(owner, name)
    try:
        yield
    finally:
        setattr(owner, name, value)


class _Loop:
    """A plain PyTorch loop over the benchmark's model and data: AdamW, backward, (clip_grad_norm_ to
    1.0,) step, zero_grad; what a user's script does, with no Flightdeck import."""

    def __init__(self, workspace: Path, steps: int, *, clip: bool = False) -> None:
        recipe = _recipe(steps)
        loaded = load_model(recipe, str(workspace / "models/tiny-llama"), local_rank=0, use_cpu=True)
        dataset = open_training_data(recipe.data.train, workspace, task="causal_lm")
        collator = CausalLMCollator(
            loaded.tokenizer, prompt_template=recipe.data.prompt_template, max_seq_length=64
        )
        loader = torch.utils.data.DataLoader(dataset, batch_size=4, collate_fn=collator)
        self.model = loaded.model
        self.trainable = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(self.trainable, lr=1e-3)
        self.batches = itertools.cycle(loader)
        self.clip = clip

    def step(self) -> None:
        batch = next(self.batches)
        loss = self.model(
            **{k: v for k, v in batch.items() if k in ("input_ids", "attention_mask", "labels")}
        ).loss
        loss.backward()
        if self.clip:  # looked up at the call, as a script's `torch.nn.utils.clip_grad_norm_(...)` is
            torch.nn.utils.clip_grad_norm_(self.trainable, 1.0)
        self.optimizer.step()
        self.optimizer.zero_grad()


def run_loop_once(
    workspace: Path, steps: int, *, instrumented: bool, clip: bool = False, batched: bool = True
) -> RunTimes:
    """The plain loop for `steps` steps, watched or bare. `batched` False: the watch writes and judges
    every step at once."""
    from flightdeck.worker.instrument import loop_watch

    loop = _Loop(workspace, steps, clip=clip)
    run_dir = workspace / "run-loop-dir"
    run_dir.mkdir(exist_ok=True)
    hooks = HookTimer()
    clock = StepClock(hooks)
    context = instrumentation(run_dir, hooks) if instrumented else contextlib.nullcontext()
    with context, contextlib.redirect_stdout(io.StringIO()), _restored(loop_watch, "BATCH_SECONDS"):
        if not batched:
            loop_watch.BATCH_SECONDS = 0.0
        for _ in range(steps):
            loop.step()
            clock.on_step_end(None, None, None)  # the first step finds the model and takes its inventory
    return RunTimes(
        StepClock.median_step(clock.wall),
        StepClock.median_step(clock.cpu),
        hooks.seconds / (steps - WARMUP_STEPS),
        hooks.cpu_seconds / (steps - WARMUP_STEPS),
    )


@dataclass
class BlockTimes:
    """One run of the loop watched and bare in alternating blocks: the ratio of each watched block's
    mean step to its neighbouring bare block's, and the same ratio between two neighbouring bare
    blocks (the null: what the method reads where nothing differs); seconds in the hooks per watched
    step."""

    watched: list[float]
    null: list[float]
    hooks: float


def run_loop_blocks(
    workspace: Path, steps: int, block: int = BLOCK_STEPS, *, clip: bool = False
) -> BlockTimes:
    """The loop (`clip`: the one that clips), watched and unwatched by turns in blocks of `block` steps,
    in one process: W B B W W B B W ... (each pair of neighbours is one watched and one bare block, in both orders, so a drift
    in the machine's speed weighs on both alike). On this shared VM the step time swings by a third
    within minutes and by 5-10 % from one step to the next: runs compared as wholes, seconds apart,
    differ by more than the 1-2 % measured. Blocks tens of milliseconds apart share the machine's
    state of the moment; their ratios, many of them, give a median a few tenths of a point wide.
    Each step is timed from its start to its end: installing and removing the watch between blocks is
    not counted, a batch of steps the watch writes and judges is. One watch throughout: it takes its
    inventory at its first step (block 0, not timed) and counts the watched steps."""
    loop = _Loop(workspace, steps, clip=clip)
    run_dir = workspace / "run-blocks-dir"
    run_dir.mkdir(exist_ok=True)
    hooks = HookTimer()
    watch = timed_watch(hooks)
    # A block's mean, not its median: the batch the watch writes and judges every 100 ms is its cost.
    means: list[tuple[bool, float]] = []
    with contextlib.redirect_stdout(io.StringIO()):
        for index in range(steps // block):
            watched = index % 4 in (0, 3)
            context = instrumentation(run_dir, watch=watch) if watched else contextlib.nullcontext()
            times = []
            with context:
                for _ in range(block):
                    start = time.perf_counter()
                    loop.step()
                    times.append(time.perf_counter() - start)
            if index == 0:  # warm-up: the watch's first step takes the model's inventory
                hooks.reset()
                continue
            means.append((watched, statistics.fmean(times)))
    watched_ratios, null = [], []
    for (first_watched, first), (second_watched, second) in itertools.pairwise(means):
        if first_watched != second_watched:
            watched_ratios.append(first / second if first_watched else second / first)
        elif not first_watched:
            null.append(first / second)
    watched_steps = sum(block for watched, _ in means if watched)
    return BlockTimes(watched_ratios, null, hooks.seconds / max(watched_steps, 1))


def _run_trainer(workspace: Path, steps: int, variant: str, hooks: HookTimer | None = None) -> RunTimes:
    recipe = _recipe(steps)
    monitored = variant == "monitored"
    out = workspace / f"run-{variant}"
    args = training_arguments(recipe, out, use_cpu=True, distributed=WORLD_SIZE > 1)
    loaded = load_model(recipe, str(workspace / "models/tiny-llama"), local_rank=0, use_cpu=True)
    dataset = open_training_data(recipe.data.train, workspace, task="causal_lm")
    collator = CausalLMCollator(
        loaded.tokenizer, prompt_template=recipe.data.prompt_template, max_seq_length=64
    )
    hooks = hooks or HookTimer()
    clock = StepClock(hooks)
    common = {"model": loaded.model, "args": args, "train_dataset": dataset, "data_collator": collator}
    metrics = MetricsFile(workspace / "metrics.jsonl") if monitored and RANK == 0 else None
    if monitored:

        def emit(event: HealthEvent) -> None:
            if metrics is not None:
                metrics.event({"code": event.code, "severity": event.severity, "message": event.message})

        planned = planned_steps_per_epoch(len(dataset), recipe, WORLD_SIZE)
        monitor = HealthCallback.for_recipe(
            recipe, planned_steps_per_epoch=planned, emit=emit, device=args.device
        )
        monitor.check_model(loaded.model)
        reporter = StepReporter(monitor, metrics, stage=0, stages=1, world_size=WORLD_SIZE)
        metered = MeteredTrainer(**common, callbacks=[reporter, monitor, clock])
        monitor.trainer = reporter.trainer = metered
        for callback in (monitor, reporter):
            for hook in ("on_train_begin", "on_pre_optimizer_step", "on_log"):
                hooks.wrap(callback, hook)
        hooks.wrap(metered, "meter")
        trainer: Trainer = metered
    elif variant == "callback":
        path = workspace / "callback-metrics.jsonl"
        callback = FlightdeckCallback(path if RANK == 0 else None)
        for hook in ("on_train_begin", "on_pre_optimizer_step", "on_step_end", "on_log"):
            hooks.wrap(callback, hook)
        trainer = Trainer(**common, callbacks=[callback, clock])
    else:
        trainer = Trainer(**common, callbacks=[clock])
        for injected in trainer.callback_handler.callbacks:  # the instrumented variant's own callback
            if isinstance(injected, FlightdeckCallback):
                for hook in ("on_train_begin", "on_pre_optimizer_step", "on_step_end", "on_log"):
                    hooks.wrap(injected, hook)
    with contextlib.redirect_stdout(io.StringIO()):
        trainer.train()
    if metrics is not None:
        metrics.close()
    return RunTimes(
        StepClock.median_step(clock.wall),
        StepClock.median_step(clock.cpu),
        hooks.seconds / (steps - WARMUP_STEPS),
        hooks.cpu_seconds / (steps - WARMUP_STEPS),
    )


def run(
    runs_per_variant: Annotated[int, typer.Option("--runs", help="runs of each variant")] = 5,
    steps: Annotated[int, typer.Option(help="optimizer steps per run")] = 100,
    variants: Annotated[
        str, typer.Option(help=f"comma-separated, from {','.join(VARIANTS)}; each one's baseline is added")
    ] = ",".join(VARIANTS),
    results_dir: ResultsDir = RESULTS_DIR,
) -> dict[str, Any]:
    options = SimpleNamespace(runs=runs_per_variant, steps=steps, results_dir=results_dir)
    chosen = chosen_variants(variants)
    if steps <= WARMUP_STEPS + 1:
        raise typer.BadParameter(f"at least {WARMUP_STEPS + 2} steps: the first {WARMUP_STEPS} are warm-up")
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        workspace = Path(tmp)
        make_tiny_model(workspace / "models/tiny-llama", "llama")
        make_demo_data(workspace / "data", text_lines=10)
        runs = interleaved(options.runs, chosen, lambda variant: run_once(workspace, options.steps, variant))
    results: dict[str, Any] = {
        "processes": WORLD_SIZE,
        "runs": options.runs,
        "steps": options.steps,
        "goal": GOAL,
        "torch": torch.__version__,
    }
    results |= {
        variant: [vars(r) for r in measured]
        for variant, measured in runs.items()
        if variant not in BLOCK_VARIANTS
    }
    if RANK != 0:
        return results
    for baseline in ("plain", "loop"):
        if baseline in runs:
            median = statistics.median(r.wall for r in runs[baseline])
            print(f"{WORLD_SIZE} process(es): median step {median * 1000:.2f} ms {baseline}")
    for variant, baseline in BASELINE.items():
        if variant in runs:
            results |= compare(variant, runs[variant], baseline, runs[baseline])  # type: ignore[arg-type]
    for variant in BLOCK_VARIANTS:
        if variant in runs:
            results |= compare_blocks(variant, runs[variant])  # type: ignore[arg-type]
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    write_results("monitor_overhead", results, options.results_dir)
    return results


def chosen_variants(given: str) -> list[str]:
    """The variants asked for, each with its baseline, in VARIANTS' order."""
    names = {name.strip() for name in given.split(",") if name.strip()}
    unknown = sorted(names - set(VARIANTS))
    if unknown:
        raise typer.BadParameter(
            f"unknown variant(s) {', '.join(unknown)}; choose from {', '.join(VARIANTS)}",
            param_hint="--variants",
        )
    names |= {BASELINE[name] for name in names if name in BASELINE}
    return [variant for variant in VARIANTS if variant in names]


def compare(variant: str, measured: list[RunTimes], baseline: str, base: list[RunTimes]) -> dict[str, Any]:
    """One variant against its baseline: printed, and the figures for the results file."""
    wall, wall_base = [r.wall for r in measured], [r.wall for r in base]
    ratio = statistics.median(wall) / statistics.median(wall_base)
    # Runs of one round ran next to each other: their ratio cancels the load drift between rounds.
    paired = sorted(a / b for a, b in zip(wall, wall_base, strict=True))
    paired_ratio = statistics.median(paired)
    quartiles = statistics.quantiles(paired, n=4) if len(paired) > 1 else [paired[0]] * 3
    # On a shared machine other load swamps a 2 % effect, so steadier views go alongside: the
    # least-disturbed run of each, this process's CPU time, and the time measured inside the hooks.
    min_ratio = min(wall) / min(wall_base)
    cpu_ratio = statistics.median(r.cpu for r in measured) / statistics.median(r.cpu for r in base)
    hook_seconds = statistics.median(r.hooks for r in measured)
    hook_cpu = statistics.median(r.hooks_cpu for r in measured)
    hook_ratio = 1 + hook_seconds / min(wall_base)
    print(
        f"{variant} (vs {baseline}, {statistics.median(wall_base) * 1000:.2f} ms): median step "
        f"{statistics.median(wall) * 1000:.2f} ms, median ratio {ratio:.3f}, paired ratio {paired_ratio:.3f} "
        f"(quartiles {quartiles[0]:.3f}-{quartiles[2]:.3f}; goal <= {GOAL}) -> "
        f"{'ok' if paired_ratio <= GOAL else 'over'}; min ratio {min_ratio:.3f}, CPU-time ratio "
        f"{cpu_ratio:.3f}, hooks {hook_seconds * 1e3:.3f} ms/step ({hook_cpu * 1e3:.3f} ms CPU) -> {hook_ratio:.3f}"
    )
    # "monitored" keeps its historical top-level keys; the others go under their own prefix.
    prefix = "" if variant == "monitored" else f"{variant}_"
    return {
        f"{prefix}ratio": ratio,
        f"{prefix}paired_ratio": paired_ratio,
        f"{prefix}paired_quartiles": [quartiles[0], quartiles[2]],
        f"{prefix}min_ratio": min_ratio,
        f"{prefix}cpu_ratio": cpu_ratio,
        f"{prefix}hook_s_per_step": hook_seconds,
        f"{prefix}hook_cpu_s_per_step": hook_cpu,
        f"{prefix}hook_ratio": hook_ratio,
    }


def compare_blocks(variant: str, measured: list[BlockTimes]) -> dict[str, Any]:
    """The watched blocks against their bare neighbours over every run, with the null beside them:
    printed, and the figures for the results file."""
    ratios = [r for run in measured for r in run.watched]
    null = [r for run in measured for r in run.null]
    if len(ratios) < 2 or len(null) < 2:
        raise typer.BadParameter(
            f"too few blocks for {variant}: {len(ratios)} watched pairs; give --steps at least "
            f"{8 * BLOCK_STEPS} (blocks of {BLOCK_STEPS} steps) or more --runs",
            param_hint="--steps",
        )
    ratio, null_ratio = statistics.median(ratios), statistics.median(null)
    low, high = median_interval(ratios)
    null_low, null_high = median_interval(null)
    hooks = statistics.median(run.hooks for run in measured)
    verdict = (
        "ok" if high <= GOAL else "ok by its median; its interval reaches over" if ratio <= GOAL else "over"
    )
    loop = "loop that clips" if variant == "loop_clip_blocks" else "bare loop"
    print(
        f"{variant} (the {loop} watched and bare by turns, {BLOCK_STEPS}-step blocks, {len(ratios)} "
        f"pairs): median ratio {ratio:.4f} (95 % interval {low:.4f}-{high:.4f}; goal <= {GOAL}) -> "
        f"{verdict}; two bare blocks (null): {null_ratio:.4f} ({null_low:.4f}-{null_high:.4f}); hooks "
        f"{hooks * 1e3:.3f} ms per watched step"
    )
    return {
        f"{variant}_ratio": ratio,
        f"{variant}_interval": [low, high],
        f"{variant}_pairs": len(ratios),
        f"{variant}_null_ratio": null_ratio,
        f"{variant}_null_interval": [null_low, null_high],
        f"{variant}_hook_s_per_step": hooks,
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    return run_cli(run, argv, __doc__)


if __name__ == "__main__":
    main()
