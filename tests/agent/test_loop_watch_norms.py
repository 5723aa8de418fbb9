"""The loop watch's gradient norm when every trainable tensor is an adapter's: read from the adapters'
one fused norm, not taken twice; quick steps written and judged in batches, a step that could stop the
run at once. In-process, with the watch's hooks on one real optimizer."""

from __future__ import annotations

import gc
import math
import re
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from peft import LoraConfig, get_peft_model
from torch import nn

from flightdeck.worker.instrument import loop_watch
from flightdeck.worker.instrument.loop_watch import LoopWatch
from flightdeck.worker.train.adapter_norms import AdapterGradNorms
from flightdeck.worker.train.metrics_file import read_metrics

_TAKE_HELD, _MEASURE = LoopWatch._take_held, AdapterGradNorms.measure


def _watched_lora(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[nn.Module, Any, LoopWatch]:
    """A LoRA model, its SGD optimizer over the adapters, and a fresh watch on that optimizer's steps,
    writing into tmp_path."""
    monkeypatch.setenv("FLIGHTDECK_RUN_DIR", str(tmp_path))
    gc.collect()  # the watch stands down for any LoopMonitor alive in the process: none from other tests
    torch.manual_seed(0)
    base = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 1))
    model = get_peft_model(base, LoraConfig(r=2, target_modules=["0", "2"], lora_dropout=0.0))
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1)
    watch = LoopWatch()
    optimizer.register_step_pre_hook(watch.before_step)
    optimizer.register_step_post_hook(watch.after_step)
    return model, optimizer, watch


@pytest.mark.parametrize(
    "how",
    [
        "joined",  # a tiny model's adapters on the CPU
        "fused",  # large adapters, or any on a GPU (grad_norms.joins false)
        "fake_spread",  # a device-mapped model's adapters on several GPUs: faked on one CPU
    ],
)
def test_every_step_records_the_adapters_true_norm_after_the_planned_ones(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    """An adapter-only loop records the adapters' norm before each step. Past the first 10 steps the
    per-module norms are sampled and the adapters' total is taken alone: every step's record still
    holds their norm, whichever way it is taken (before, adapters on several devices recorded 0.0 at
    each step between samples)."""
    model, optimizer, watch = _watched_lora(tmp_path, monkeypatch)
    optimizer.param_groups[0]["lr"] = 0.01  # 25 steps of the helper's 0.1 diverge to NaN
    expected = []
    for step in range(25):
        model(torch.randn(4, 8)).pow(2).mean().backward()
        grads = [p.grad for p in model.parameters() if p.requires_grad and p.grad is not None]
        expected.append(math.sqrt(sum(float(g.double().pow(2).sum()) for g in grads)))
        optimizer.step()
        optimizer.zero_grad()
        if step == 0:  # the watch took its inventory at the first step
            assert watch.adapters_only and watch.join and not watch.spread
            watch.join = how == "joined"
            watch.spread = how == "fake_spread"
    watch.judge_waiting()  # as the script's end does (an exit callback)
    watch.files.close()
    steps = [r for r in read_metrics(tmp_path / "metrics.jsonl") if r["type"] == "step"]
    assert [r["grad_norm"] for r in steps] == pytest.approx(expected, rel=1e-5)
    assert [r["adapter_grad_norm"] for r in steps] == pytest.approx(expected, rel=1e-5)
    assert expected[1] > 0  # lora_B has moved off zero: a norm that 0.0 could not pass for


def test_a_loop_whose_next_stage_builds_a_new_optimizer_is_watched_on_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Stage 1's optimizer is freed and stage 2 builds another (over another model): the watch follows
    the new one, its steps counting on, its gradients its own; while the first lives, another that
    steps beside it is not watched."""
    monkeypatch.setenv("FLIGHTDECK_RUN_DIR", str(tmp_path))
    gc.collect()
    torch.manual_seed(0)
    watch = LoopWatch()

    def stage(model: nn.Module, steps: int, extra: torch.optim.Optimizer | None = None) -> list[float]:
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        optimizer.register_step_pre_hook(watch.before_step)
        optimizer.register_step_post_hook(watch.after_step)
        norms = []
        for _ in range(steps):
            model(torch.randn(4, 8)).pow(2).mean().backward()
            norms.append(math.sqrt(sum(float(p.grad.double().pow(2).sum()) for p in model.parameters())))
            optimizer.step()
            optimizer.zero_grad()
            if extra is not None:
                extra.step()  # another optimizer stepping beside the watched one: not its steps
        return norms

    first = stage(nn.Linear(8, 1), 2)
    gc.collect()  # stage 1's optimizer is gone
    side = nn.Linear(8, 2)
    side_optimizer = torch.optim.SGD(side.parameters(), lr=0.01)
    side_optimizer.register_step_pre_hook(watch.before_step)
    side_optimizer.register_step_post_hook(watch.after_step)
    second = stage(nn.Sequential(nn.Linear(8, 4), nn.Linear(4, 1)), 3, extra=side_optimizer)
    watch.judge_waiting()  # as the script's end does (an exit callback)
    watch.files.close()
    steps = [r for r in read_metrics(tmp_path / "metrics.jsonl") if r["type"] == "step"]
    assert [r["step"] for r in steps] == [1, 2, 3, 4, 5]
    assert [r["grad_norm"] for r in steps] == pytest.approx(first + second, rel=1e-5)
    assert [r["trainable_params"] for r in steps] == [9, 9, 41, 41, 41]


def test_a_loop_that_clips_gives_its_pre_clip_norm_and_limit_and_the_adapters_are_sampled(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The script's clip_grad_norm_ over every trainable tensor already computed the step's total norm:
    the watch records that (pre-clip, as a Trainer's), learns max_norm as the run's clip, and measures
    the adapters' per-module norms only at the steps HealthMonitor plans (every step of the first ones,
    a sample after), undoing the clip on them."""
    from flightdeck.worker.instrument import loop_watch
    from flightdeck.worker.train.adapter_norms import AdapterGradNorms
    from flightdeck.worker.train.health import HealthMonitor

    model, optimizer, watch = _watched_lora(tmp_path, monkeypatch)
    monkeypatch.setattr(loop_watch, "WATCH", watch)
    for home in (torch.nn.utils, torch.nn.utils.clip_grad):  # put back after the test
        monkeypatch.setattr(home, "clip_grad_norm_", home.clip_grad_norm_)
    loop_watch._watch_clip(torch)
    measured = []
    measure = AdapterGradNorms.measure
    monkeypatch.setattr(AdapterGradNorms, "measure", lambda self: measured.append(1) or measure(self))
    steps, limit, expected = 25, 1e-3, []
    for _ in range(steps):
        model(torch.randn(4, 8)).pow(2).mean().backward()
        total = torch.nn.utils.clip_grad_norm_(model.parameters(), limit)  # through the watched name
        grads = [p.grad for p in model.parameters() if p.requires_grad and p.grad is not None]
        assert math.sqrt(sum(float(g.double().pow(2).sum()) for g in grads)) <= limit * 1.001  # clipped
        expected.append(float(total))
        optimizer.step()
        optimizer.zero_grad()
    watch.judge_waiting()  # as the script's end does (an exit callback)
    watch.files.close()
    records = [r for r in read_metrics(tmp_path / "metrics.jsonl") if r["type"] == "step"]
    assert all(n > limit for n in expected[1:])
    assert [r["grad_norm"] for r in records] == pytest.approx(expected, rel=1e-5)
    assert [r["adapter_grad_norm"] for r in records] == pytest.approx(expected, rel=1e-4)
    assert watch.monitor.max_grad_norm == limit
    assert HealthMonitor.NORMS_EVERY_STEP_FOR <= len(measured) < steps


def _watched_adapter_loop(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[LoopWatch, Any]:
    """A fresh watch on a LoRA model's SGD optimizer, and one step of that loop (its loss times `scale`)."""
    model, optimizer, watch = _watched_lora(tmp_path, monkeypatch)

    def step(scale: float = 1.0) -> None:
        loss = model(torch.randn(4, 8)).pow(2).mean() * scale
        watch.saw_loss(loss)  # what the backward wrapper does
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()

    return watch, step


def _lines(tmp_path: Path) -> list[dict[str, Any]]:
    return read_metrics(tmp_path / "metrics.jsonl") if (tmp_path / "metrics.jsonl").exists() else []


def test_quick_healthy_steps_are_written_together_and_a_step_that_could_stop_the_run_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Steps quicker than BATCH_SECONDS wait (one write and one pass of the checks for the batch); a
    non-finite step is judged at once with those before it, and the run stops at that step."""
    from flightdeck.worker.train.health import HealthStop

    watch, step = _watched_adapter_loop(tmp_path, monkeypatch)
    monkeypatch.setattr(sys, "excepthook", sys.excepthook)  # the stop sets its exit-42 hook: put back
    monkeypatch.setattr(loop_watch, "BATCH_SECONDS", 3600.0)  # every healthy step is quick
    for _ in range(12):  # the first 10 are judged each at once (and measure the per-module norms)
        step()
    steps = [r["step"] for r in _lines(tmp_path) if r["type"] == "step"]
    assert steps == list(range(1, 11)) and [w.step for w in (*watch.waiting, *watch.held)] == [11, 12]
    with pytest.raises(HealthStop) as stop:  # health.nonfinite_patience is 1
        step(float("nan"))
    assert (stop.value.event.code, stop.value.event.step) == ("H001", 13)
    steps = [r["step"] for r in _lines(tmp_path) if r["type"] == "step"]
    assert steps == list(range(1, 14)) and watch.waiting == [] and watch.held == []


def test_steps_slower_than_the_batch_are_judged_each_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    watch, step = _watched_adapter_loop(tmp_path, monkeypatch)
    monkeypatch.setattr(loop_watch, "BATCH_SECONDS", 0.0)  # every step is slower than the batch
    for _ in range(12):
        step()
    assert [r["step"] for r in _lines(tmp_path) if r["type"] == "step"] == list(range(1, 13))
    assert watch.waiting == []


def test_a_loops_first_steps_are_written_at_once_for_the_stall_watch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A full fine-tune's quick steps could all wait; its first ones do not, so that a script hanging
    in its first steps has the steps the service's stall watch needs to time its silence (H003)."""
    from flightdeck.service.health_watch import MIN_STEPS

    monkeypatch.setenv("FLIGHTDECK_RUN_DIR", str(tmp_path))
    monkeypatch.setattr(loop_watch, "BATCH_SECONDS", 3600.0)
    gc.collect()
    model = nn.Linear(8, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    watch = LoopWatch()
    optimizer.register_step_pre_hook(watch.before_step)
    optimizer.register_step_post_hook(watch.after_step)
    for _ in range(loop_watch.FIRST_STEPS_AT_ONCE + 3):
        model(torch.randn(4, 8)).pow(2).mean().backward()
        optimizer.step()
        optimizer.zero_grad()
    written = [r["step"] for r in _lines(tmp_path) if r["type"] == "step"]
    assert written == list(range(1, loop_watch.FIRST_STEPS_AT_ONCE + 1)) and len(watch.waiting) == 3
    assert loop_watch.FIRST_STEPS_AT_ONCE >= MIN_STEPS


def test_a_module_dead_from_inside_a_batch_counts_once_per_measured_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Quick steps wait; the sampled step that first finds a module's adapters dead is judged last of
    its batch. The waiting steps before it do not read its per-module norms: the module's streak is 1
    there, and the stop (G002, patience 2) comes at the next measured step, not at once."""
    from flightdeck.worker.train.adapter_norms import AdapterGradNorms
    from flightdeck.worker.train.health import HealthStop

    watch, step = _watched_adapter_loop(tmp_path, monkeypatch)
    monkeypatch.setattr(sys, "excepthook", sys.excepthook)  # the stop sets its exit-42 hook: put back
    monkeypatch.setattr(loop_watch, "BATCH_SECONDS", 3600.0)
    measured: list[int] = []  # the steps whose per-module norms were taken (inside their own step hook)
    measure = AdapterGradNorms.measure
    monkeypatch.setattr(
        AdapterGradNorms, "measure", lambda self: measured.append(watch.global_step) or measure(self)
    )
    for _ in range(12):
        step()
    for name, p in watch.monitor._adapter:  # module 2's adapters cut off from here on
        if re.search(r"(^|\.)2\.lora_", name):
            p.requires_grad_(False)
    dead_from = watch.global_step + 1
    with pytest.raises(HealthStop) as stop:
        for _ in range(40):
            step()
    dead_measured = [s for s in measured if s >= dead_from]
    assert len(dead_measured) == 2, f"stopped at {stop.value.event.step}: waiting steps read its norms"
    first, second = dead_measured
    assert first - dead_from >= 2  # steps waited in the batch the measured step ended
    assert (stop.value.event.code, stop.value.event.step) == ("G002", second)


@pytest.mark.parametrize("order", [1, -1], ids=["inner_first", "outer_first"])
def test_the_model_found_is_the_outermost_of_the_wrappers_holding_the_same_tensors(
    monkeypatch: pytest.MonkeyPatch, order: int
) -> None:
    """A PeftModel, its LoraModel and the base module hold the very same tensors, as DataParallel and
    the module it wraps do: whatever order the garbage collector lists them in, the watch finds the
    outermost (the adapters are named as the script's model names them; P002 sees DataParallel)."""
    base = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 1))
    peft_model = get_peft_model(base, LoraConfig(r=2, target_modules=["0", "2"], lora_dropout=0.0))
    chain = [base, peft_model.base_model, peft_model][::order]
    monkeypatch.setattr(loop_watch.gc, "get_objects", lambda: [nn.Linear(2, 2), *chain])
    adapters = [p for p in peft_model.parameters() if p.requires_grad]
    assert loop_watch._model_of(adapters) is peft_model
    wrapped = nn.DataParallel(nn.Linear(8, 1))  # on a CPU-only host it wraps without replicating
    chain = [wrapped.module, wrapped][::order]
    monkeypatch.setattr(loop_watch.gc, "get_objects", lambda: chain)
    assert loop_watch._model_of(list(wrapped.parameters())) is wrapped


def _held_loop(
    run_dir: Path, monkeypatch: pytest.MonkeyPatch, *, to_none: bool = True, rewrite: bool = False
) -> tuple[LoopWatch, Any, list[float], list[int], list[int]]:
    """The adapter loop with its loss seen and every healthy step quick: a fresh watch, one step (`cut`:
    the adapters cut off from the loss, every gradient exactly 0 under a finite loss), each step's true
    norm (taken by the test before the step), the steps the watch held, and the steps whose per-module
    norms it measured. `to_none` False: zero_grad writes the gradients to 0 in place; `rewrite`: the
    script halves them in place after the step (new tensors at each step all the same)."""
    run_dir.mkdir()
    model, optimizer, watch = _watched_lora(run_dir, monkeypatch)
    monkeypatch.setattr(loop_watch, "BATCH_SECONDS", 3600.0)
    optimizer.param_groups[0]["lr"] = 0.01  # the helper's 0.1 diverges within 40 steps
    expected: list[float] = []
    held: list[int] = []
    measured: list[int] = []
    take, measure = _TAKE_HELD, _MEASURE  # the originals: a second loop in one test wraps them anew
    monkeypatch.setattr(
        LoopWatch, "_take_held", lambda self: held.extend(h.step for h in self.held) or take(self)
    )
    monkeypatch.setattr(
        AdapterGradNorms, "measure", lambda self: measured.append(watch.global_step) or measure(self)
    )
    trainable = [p for p in model.parameters() if p.requires_grad]

    def step(cut: bool = False) -> None:
        loss = model(torch.randn(4, 8)).pow(2).mean()
        if cut:
            loss = loss.detach() + 0.0 * sum(p.sum() for p in trainable)
        watch.saw_loss(loss)  # what the backward wrapper does
        loss.backward()
        expected.append(math.sqrt(sum(float(p.grad.double().pow(2).sum()) for p in trainable)))
        optimizer.step()
        if rewrite:
            for p in trainable:
                p.grad.mul_(0.5)
        optimizer.zero_grad(set_to_none=to_none)

    return watch, step, expected, held, measured


def _norms_written(watch: LoopWatch, run_dir: Path) -> list[float | None]:
    watch.judge_waiting()  # as the script's end does (an exit callback)
    watch.files.close()
    return [r["grad_norm"] for r in read_metrics(run_dir / "metrics.jsonl") if r["type"] == "step"]


def test_quick_steps_hold_their_gradients_and_each_records_its_own_norm(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past the first steps, a quick step between two planned ones holds its gradients and its norm is
    taken with its batch's: each record holds its own step's norm, and the per-module norms are
    measured at the very steps they are when every step's norm is taken at once."""
    watch, step, expected, held, measured = _held_loop(tmp_path / "held", monkeypatch)
    for _ in range(40):
        step()
    assert _norms_written(watch, tmp_path / "held") == pytest.approx(expected, rel=1e-5)
    assert len(held) >= 25 and min(held) > loop_watch.FIRST_STEPS_AT_ONCE
    monkeypatch.setattr(loop_watch, "MAX_HELD_STEPS", 0)  # every step's norm at once
    watch, step, expected, none_held, at_once = _held_loop(tmp_path / "at_once", monkeypatch)
    for _ in range(40):
        step()
    assert _norms_written(watch, tmp_path / "at_once") == pytest.approx(expected, rel=1e-5)
    assert none_held == [] and measured == at_once and len(at_once) < 20


def test_gradients_zero_grad_writes_in_place_are_never_held(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """zero_grad(set_to_none=False) (and DDP's gradient_as_bucket_view) writes the next step's gradients
    into the same tensors: held past its step, a step's gradients would be gone. The watch sees the
    same tensor at two steps and takes every norm at once."""
    watch, step, expected, held, _ = _held_loop(tmp_path / "run", monkeypatch, to_none=False)
    for _ in range(30):
        step()
    assert _norms_written(watch, tmp_path / "run") == pytest.approx(expected, rel=1e-5)
    assert held == [] and watch.fresh_grads is False


def test_a_held_gradient_written_again_leaves_its_norm_unknown_and_no_step_is_held_after(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """New gradient tensors at every step, but the script writes them again after the step (halved in
    place here): a held step's gradients are no longer its own when its batch is taken. Its norm is
    recorded as unknown, never as the changed tensors' norm, and the watch holds no step after that."""
    watch, step, expected, held, _ = _held_loop(tmp_path / "run", monkeypatch, rewrite=True)
    for _ in range(30):
        step()
    written = _norms_written(watch, tmp_path / "run")
    unknown = [i + 1 for i, norm in enumerate(written) if norm is None]
    assert unknown and unknown == sorted(held) and watch.fresh_grads is False
    known = [(n, e) for n, e in zip(written, expected, strict=True) if n is not None]
    assert [n for n, _ in known] == pytest.approx([e for _, e in known], rel=1e-5)
    assert max(held) < len(written)  # the steps after the batch: each norm at once


def test_a_gradient_gone_between_two_planned_steps_stops_the_run_at_the_step_it_would_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The adapters cut off from the loss in the middle of a run of held steps: the finding (G002) names
    the same step as when every step's norm is taken at once, and comes when the batch is taken (at
    most BATCH_SECONDS after that step, here at the next planned step)."""
    from flightdeck.worker.train.health import HealthStop

    monkeypatch.setattr(sys, "excepthook", sys.excepthook)  # the stop sets its exit-42 hook: put back
    stops = []
    for run, most in (("held", loop_watch.MAX_HELD_STEPS), ("at_once", 0)):
        monkeypatch.setattr(loop_watch, "MAX_HELD_STEPS", most)
        _, step, _, held, _ = _held_loop(tmp_path / run, monkeypatch)
        for _ in range(22):
            step()
        with pytest.raises(HealthStop) as stop:
            for _ in range(30):
                step(cut=True)
        stops.append((stop.value.event.code, stop.value.event.step, bool(set(held) & set(range(23, 60)))))
    assert stops[0][:2] == stops[1][:2] and stops[0][0] == "G002"
    assert stops[0][2] and not stops[1][2]  # cut steps were held in the first run only


def test_gradients_too_large_to_hold_for_a_batch_are_normed_at_their_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The gradients held are bounded (MAX_HELD_ELEMENTS): a model whose one step's gradients pass the
    bound holds none, each step's norm taken at once."""
    monkeypatch.setattr(loop_watch, "MAX_HELD_ELEMENTS", 49)  # the LoRA's 50 trainable elements
    watch, step, expected, held, _ = _held_loop(tmp_path / "run", monkeypatch)
    for _ in range(30):
        step()
    assert _norms_written(watch, tmp_path / "run") == pytest.approx(expected, rel=1e-5)
    assert held == [] and watch.most_held == 0
