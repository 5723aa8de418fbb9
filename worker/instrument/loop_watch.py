"""A plain PyTorch loop watched with no edit: torch's global optimizer step hooks.

After each step of the script's (first) optimizer, before its zero_grad: the gradient norm of every
trainable tensor and of the adapters per module, one metrics record (step, loss seen by `backward`,
learning rate, norms, step time) and the run-time health checks of recipe jobs (H001, H002, H004,
H007, D005, G001, G002). When the script called `clip_grad_norm_` over every trainable tensor, that
call's pre-clip total is the step's norm (already paid for) and its max_norm the clip H004 judges
against; the adapters' per-module norms are measured at the steps HealthMonitor plans (every step of
the first ones, a sample after, every step while a zero streak is open), the adapters' total at every
step. After the first steps, steps quicker than BATCH_SECONDS are written and judged in batches,
except a step that could stop the run (HealthMonitor.can_wait), judged at once with those before it;
the batch left when the script's main code ends is written then. Between two steps whose per-module
norms are planned, a quick step whose loss is finite is held: its gradients kept (when the script's
are new tensors at every step and small), its norm taken with its batch's, one norm for all (a norm
right after the step costs three times what it costs there), and its checks with them, at most
BATCH_SECONDS later; the finding still names its step. Each rank judges its own steps, with
no collective: a script whose ranks step unevenly cannot hang on the watch; a rank that finds a fatal
finding writes result.json and exits 42, and torchrun ends the others (under DDP the gradients, and so
the findings, are the same on every rank). Stands down for an HF Trainer (FlightdeckCallback reports
there) and for a script that uses LoopMonitor itself.

Only torch is imported at install: the health and metrics modules load at the first step, and
transformers never (worker/script_run.py says why).
"""

from __future__ import annotations

import functools
import gc
import math
import threading
import time
import weakref
from collections.abc import Callable
from types import ModuleType, SimpleNamespace
from typing import Any, NamedTuple

import torch
from torch._utils import _flatten_dense_tensors

from flightdeck.worker.train import grad_norms

# Losses kept between two steps at most (a loop that calls backward without stepping stays bounded).
MAX_LOSSES = 1024
# Steps quicker than this are written and judged together, in one write and with the checks' code
# warm: after a tiny model's 5 ms step each step's own line and checks cost several times what they
# cost in a batch. A step that could stop the run is judged at once (HealthMonitor.can_wait) unless it
# was held (its norm is taken with the batch's), and a step slower than this (any real model's) is
# never kept waiting. 100 ms: the watch's time per 7.5 ms
# step was 121 us against 139 us with 20 ms batches (bench/README.md), and lines reach the service no
# later for it (the agent ships the run's files once a second).
BATCH_SECONDS = 0.1
# The first steps are written and judged each at once: the service's stall watch (H003) times a run's
# silence against its median step, which it takes once it has 3 steps (service/health_watch.py), and
# a script that hangs in its first steps must have them in the file.
FIRST_STEPS_AT_ONCE = 10
# Held steps at most in a batch, and gradient elements held at most (64 MB of float32): small
# gradients only (grad_norms.joins), a few steps' worth.
MAX_HELD_STEPS = 64
MAX_HELD_ELEMENTS = 1 << 24


class _Waiting(NamedTuple):
    """A step written and judged with the next ones: what its record holds. Kept as a tuple until its
    batch is written: the record's dict is built then, with the code warm (bench/README.md)."""

    step: int
    time: float
    loss: float | None
    learning_rate: float
    grad_norm: float | None  # None: a held step whose gradients were written again (_take_held)
    adapter_grad_norm: float | None  # None without adapters (the checks do not read it then)
    step_time: float


class _Held(NamedTuple):
    """A held step (LoopWatch._held_step): its record but the norm, and its gradients with their versions."""

    step: int
    time: float
    loss: float
    learning_rate: float
    step_time: float
    grads: list[torch.Tensor]
    versions: list[int]


class _Unnamed:
    """Stands in for a model the watch could not find: the optimizer's tensors, numbered."""

    def __init__(self, params: list[torch.nn.Parameter]):
        self.params = params

    def named_parameters(self) -> list[tuple[str, torch.nn.Parameter]]:
        return [(f"param{i}", p) for i, p in enumerate(self.params)]


class LoopWatch:
    def __init__(self) -> None:
        self.active = True
        # The optimizer watched, weakly: a script's next stage may free it and build another, which
        # can get the freed one's id (an id would take it for the old one, with the old tensors).
        self.optimizer: weakref.ref[torch.optim.Optimizer] | None = None
        self.losses: list[torch.Tensor] = []
        self.global_step = 0
        self.trainable: list[torch.Tensor] = []
        self.adapters_only = False
        self.adapted = False  # the model has adapters: a record's adapter norm is not None
        self.most_held = 0  # held steps at most in a batch, for the trainable tensors' size
        # The script's last clip_grad_norm_ since the optimizer's previous step: (its parameters, the
        # pre-clip total norm, max_norm); whether its parameters cover every trainable tensor (once).
        self.clip: tuple[list[torch.Tensor], torch.Tensor, float] | None = None
        self.clip_covers: bool | None = None
        self.spread = False  # the trainable tensors are on several devices (a device-mapped model)
        self.join = True  # the adapters' total taken by joining their gradients (grad_norms.joins)
        self.monitor: Any = None
        self.files: Any = None
        self.device = torch.device("cpu")
        self.last_time = time.perf_counter()
        self.waiting: list[_Waiting] = []
        self.judged_time = self.last_time
        # Held steps (_held_step): how many more may go by with no call to the monitor
        # (HealthMonitor.quiet_steps), and those since the last call, gradients held for one norm.
        self.quiet_left = 0
        self.held: list[_Held] = []
        # Whether the script's gradients are new tensors at every step (zero_grad's default), seen over
        # the first steps: only then can a step's gradients be held past it unchanged. None: not yet known.
        self.fresh_grads: bool | None = None
        self.last_grads: list[Callable[[], torch.Tensor | None]] = []

    def stand_down(self, why: str) -> None:
        self.active = False
        self.losses = []

    def saw_loss(self, loss: torch.Tensor) -> None:
        if len(self.losses) < MAX_LOSSES:
            self.losses.append(loss.detach())

    def saw_clip(self, parameters: list[torch.Tensor], total: torch.Tensor, max_norm: float) -> None:
        self.clip = (parameters, total, max_norm)

    def _take_clip(self) -> tuple[torch.Tensor, float] | None:
        """This step's pre-clip total norm and limit, when the script's clip covered every trainable tensor."""
        clip, self.clip = self.clip, None
        if clip is None:
            return None
        parameters, total, limit = clip
        if self.clip_covers is None:
            held = {id(p) for p in parameters}
            self.clip_covers = all(id(p) in held for p in self.trainable)
        return (total, limit) if self.clip_covers else None

    def before_step(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        if not self.active:
            return
        watched = self.optimizer() if self.optimizer is not None else None
        if watched is None:  # the first step, or the optimizer watched so far is gone (a next stage)
            self._start(optimizer)

    def after_step(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        if not self.active or self.optimizer is None or self.optimizer() is not optimizer:
            return
        if self.quiet_left and self._held_step(optimizer):
            return
        self._take_held()
        self.global_step += 1
        losses, self.losses = self.losses, []
        if len(losses) == 1:
            loss: float | None = float(losses[0])
        else:
            loss = float(torch.stack([x.float() for x in losses]).mean()) if losses else None
        monitor = self.monitor
        # No gradient on any trainable tensor is a zero gradient, not an unknown one.
        grad_norm = self._grad_norm(monitor)
        adapter_norm = monitor.loop_step_done(grad_norm)
        now = time.perf_counter()
        self.waiting.append(
            _Waiting(
                self.global_step,
                time.time(),
                loss,
                float(optimizer.param_groups[0]["lr"]),
                grad_norm,
                adapter_norm,
                now - self.last_time,
            )
        )
        self.last_time = now
        if not (
            self.global_step > FIRST_STEPS_AT_ONCE
            and now - self.judged_time < BATCH_SECONDS
            and monitor.can_wait(loss, grad_norm, adapter_norm)
        ):
            self.judge_waiting()
        if self.join and self.most_held and self.fresh_grads is not False:  # else never held: no need
            self._saw_grads()
        holds = self.join and self.fresh_grads and self.global_step >= FIRST_STEPS_AT_ONCE
        self.quiet_left = min(monitor.quiet_steps(), self.most_held) if holds else 0

    def _held_step(self, optimizer: torch.optim.Optimizer) -> bool:
        """A quick step between two of the monitor's planned ones, its loss finite: its loss read, its
        gradients held (zero_grad's default leaves them as they are and gives the next step new ones),
        and its record kept, with no call to the monitor. Its norm is taken with its batch's, when the
        batch is written (_take_held): on the tiny benchmark loop a norm right after the step costs
        three times its cost there, about half a point of the step (bench/README.md). Its checks come
        with the batch's too, at most BATCH_SECONDS later. False, with nothing changed, for any other
        step: the script clipped (its norm is already paid for), the batch is due, a tensor has no
        gradient, the loss is not finite (judged at once, H001)."""
        losses = self.losses
        now = time.perf_counter()
        if len(losses) != 1 or self.clip is not None or now - self.judged_time >= BATCH_SECONDS:
            return False
        grads = [p.grad for p in self.trainable]
        if any(g is None for g in grads):
            return False
        loss = float(losses[0])
        if not math.isfinite(loss):
            return False
        self.losses = []
        self.global_step += 1
        self.quiet_left -= 1
        self.held.append(
            _Held(
                self.global_step,
                time.time(),
                loss,
                float(optimizer.param_groups[0]["lr"]),
                now - self.last_time,
                grads,
                [g._version for g in grads],
            )
        )
        self.last_time = now
        return True

    def _take_held(self) -> None:
        """The held steps' norms, taken together (one joined vector, one norm per step's row), and their
        records queued; the monitor told of them, before its next call. A gradient written again since
        its step (its version moved) leaves its step's norm unknown, and no step is held after that."""
        held, self.held = self.held, []
        if not held:
            return
        if any(g._version != v for h in held for g, v in zip(h.grads, h.versions, strict=True)):
            self.fresh_grads = False
            norms: list[float | None] = [None] * len(held)
        else:
            joined = _flatten_dense_tensors([g for h in held for g in h.grads])
            rows = joined.view(len(held), -1)
            norms = torch.linalg.vector_norm(rows, dim=1, dtype=torch.float32).tolist()
        for h, norm in zip(held, norms, strict=True):
            self.waiting.append(
                _Waiting(
                    h.step, h.time, h.loss, h.learning_rate, norm, norm if self.adapted else None, h.step_time
                )
            )
        self.monitor.quiet_steps_done(len(held), norms[-1])

    def _saw_grads(self) -> None:
        """At a step the monitor sees: whether this step's gradients are new tensors, not the last seen
        ones written again in place (`zero_grad(set_to_none=False)`, DDP's gradient_as_bucket_view).
        Once one is the same tensor, no step is held."""
        grads = [p.grad for p in self.trainable]
        if self.last_grads and self.fresh_grads is not False:
            self.fresh_grads = not any(
                g is not None and seen() is g for g, seen in zip(grads, self.last_grads, strict=True)
            )
        self.last_grads = [weakref.ref(g) if g is not None else _no_tensor for g in grads]

    def judge_waiting(self) -> None:
        """Write and judge the steps not yet judged, in order: at a step that cannot wait, when the batch
        is BATCH_SECONDS old, before a next optimizer's first step and when the script's main code ends.
        Only the last can be fatal: the others could wait."""
        self._take_held()
        waiting, self.waiting = self.waiting, []
        self.judged_time = time.perf_counter()
        if not waiting:
            return
        monitor = self.monitor
        if self.files.metrics is not None:
            trainable = monitor.trainable_params
            self.files.metrics.steps(
                [
                    (
                        w.step,
                        w.time,
                        {
                            "loss": w.loss,
                            "learning_rate": w.learning_rate,
                            "grad_norm": w.grad_norm,
                            "adapter_grad_norm": w.adapter_grad_norm,
                            "trainable_params": trainable,
                            "step_time": w.step_time,
                            "stage": 0,
                        },
                    )
                    for w in waiting
                ]
            )
        last = waiting[-1]
        for w in waiting:
            event = monitor.step_checks(
                w.step, w.step, w.loss, w.grad_norm, w.adapter_grad_norm, its_norms=w is last
            )
            if event is not None and event.severity == "fatal":
                self._stop(event)

    def _grad_norm(self, monitor: Any) -> float:
        """The step's total gradient norm over every trainable tensor; the adapters' per-tensor norms
        taken too at the steps HealthMonitor plans.

        Read after the optimizer's step, before the script's zero_grad: the gradients are the ones the
        step used (torch's optimizers leave them as they are; a fused one unscales AMP's in place), and
        the step has just read them, so this read finds them in cache (before the step, the first op on
        them paid twice what it does here: 40 against 21 us on the benchmark's loop).
        """
        clip = self._take_clip() if self.clip is not None else None
        measured = monitor.measure_planned_norms()
        total: torch.Tensor | None = None
        if clip is not None:  # the script's clip_grad_norm_ took the total already (pre-clip)
            total = clip[0]
            monitor.clipped_at(clip[1])
        elif not self.adapters_only:
            grads = [p.grad for p in self.trainable if p.grad is not None]
            if grads:
                total = self._norm_of(grads)
        elif measured:
            return monitor.adapter_grad_norm(None) or 0.0  # their measured total: no second norm
        else:  # a step the per-module norms skip: the adapters' total alone
            grads = [p.grad for p in self.trainable if p.grad is not None]
            if grads:
                total = self._norm_of(grads)
        return float(total) if total is not None else 0.0

    def _norm_of(self, grads: list[torch.Tensor]) -> torch.Tensor:
        """The total norm of these gradients, the cheaper way for their sizes (small ones on the CPU
        joined into one vector: a per-tensor norm costs an op per tensor there)."""
        return (
            grad_norms.joined_norm(grads) if self.join else grad_norms.total_norm(grads, spread=self.spread)
        )

    def _stop(self, event: Any) -> None:
        """This rank's fatal finding: result.json (whichever rank found it), then HealthStop -> exit 42."""
        from flightdeck.worker.train.health import HealthStop
        from flightdeck.worker.train.result import write_result

        self.files.emit(event)
        if self.files.run_dir is not None:
            write_result(
                self.files.run_dir,
                status="failed",
                failure_code=event.code,
                message=event.message,
                fix=event.fix,
            )
        self.files.stopped(event)  # the exit hook: an uncaught HealthStop ends the process with 42
        self.files.close()
        self.active = False
        raise HealthStop(event)

    def _start(self, optimizer: torch.optim.Optimizer) -> None:
        """At an optimizer's first step: find the model, take its inventory, run the checks before its
        first step (steps go on counting from the previous optimizer's, if any)."""
        # The callback's own answers to "which rank, how many, where do collectives run": one source.
        from flightdeck.worker.loop_monitor import LoopMonitor
        from flightdeck.worker.script_run import RunFiles, collective_device, health_limits, rank, world_size
        from flightdeck.worker.train.health import HealthEvent, HealthMonitor
        from flightdeck.worker.train.stuck_learning import LOOP_SETTINGS

        self.judge_waiting()  # the previous optimizer's last steps, with its inventory
        self.optimizer = weakref.ref(optimizer)
        self.clip_covers = None  # judged again for this optimizer's tensors
        self.fresh_grads, self.last_grads = None, []  # and whether its gradients are new at each step
        params = [p for group in optimizer.param_groups for p in group["params"]]
        model = _model_of(params)
        if any(issubclass(type(o), LoopMonitor) for o in gc.get_objects()):
            self.stand_down("the script reports through LoopMonitor")
            return
        self.device = collective_device()
        if self.files is None:
            self.files = RunFiles(None, None)
            self.files.open(rank())
        self.monitor = HealthMonitor(
            health_limits(None, self.files.run_dir),
            planned_steps_per_epoch=None,
            emit=self.files.emit,
            device=self.device,
            settings=LOOP_SETTINGS,  # fixes name the script's own code: its optimizer, its clip call
        )
        named = self.monitor.take_inventory(model if model is not None else _Unnamed(params))
        self.trainable = [p for p in params if p.requires_grad]
        self.spread = len({p.device for p in self.trainable}) > 1
        self.join = grad_norms.joins(self.trainable)
        adapters = {id(p) for p in self.monitor._adapter_params}
        self.adapters_only = bool(adapters) and all(id(p) in adapters for p in self.trainable)
        self.adapted = self.monitor.has_adapter
        elements = sum(p.numel() for p in self.trainable)
        self.most_held = min(MAX_HELD_STEPS, MAX_HELD_ELEMENTS // max(elements, 1))
        wrapped = isinstance(model, torch.nn.DataParallel)
        loop_args = SimpleNamespace(n_gpu=len(model.device_ids or []) if wrapped else 1)  # type: ignore[union-attr]
        fatal = self.monitor.start_checks(named, None, None, loop_args)
        if fatal is not None:
            self._stop(fatal)
        self.files.emit(
            HealthEvent(
                None,
                "info",
                f"training started: {self.monitor.trainable_params:,} trainable parameters in "
                f"{type(model).__name__ if model is not None else 'an unnamed model'}, watched at the "
                "optimizer's step (no edit to the script)",
                step=self.global_step,
                data={
                    "trainable_params": self.monitor.trainable_params,
                    "adapter_tensors": self.monitor.adapter_tensors,
                    "wrapper": type(model).__name__ if model is not None else None,
                    "world_size": world_size(),
                    "source": "optimizer_hook",
                },
            )
        )
        self.last_time = time.perf_counter()


def _no_tensor() -> None:
    """Stands in for a weak reference where a tensor had no gradient."""


def _model_of(params: list[torch.Tensor]) -> torch.nn.Module | None:
    """The module holding most of the optimizer's tensors, the outermost of those that tie: DDP's or
    DataParallel's wrapper, a PeftModel over its LoraModel and base model. They hold the very same
    tensors, and the garbage collector lists them in no set order: without the rule, P002's
    DataParallel check and the module names in the watch's findings would depend on that order."""
    wanted = {id(p) for p in params}
    best: tuple[int, int] = (0, 0)
    found: torch.nn.Module | None = None
    for obj in gc.get_objects():
        if not issubclass(type(obj), torch.nn.Module):  # type(): isinstance may touch deprecated objects
            continue
        held = [id(p) for p in obj.parameters()]
        score = (sum(1 for i in held if i in wanted), len(held))
        if score[0] > best[0] or (
            score[0] == best[0]
            and score[0]
            and (score[1] > best[1] or (score[1] == best[1] and _wraps(obj, found)))
        ):
            best, found = score, obj
    return found


def _wraps(outer: torch.nn.Module, inner: torch.nn.Module | None) -> bool:
    return inner is not None and outer is not inner and any(m is inner for m in outer.modules())


WATCH = LoopWatch()
_END_REGISTERED = False  # the end's callback, once per process (it judges whichever WATCH is current)


def install(torch_module: ModuleType) -> list[Any]:
    """Register the global optimizer step hooks and see each scalar loss that `backward` is called on;
    the hooks' removable handles."""
    from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

    handles = [
        register_optimizer_step_pre_hook(WATCH.before_step),
        register_optimizer_step_post_hook(WATCH.after_step),
    ]
    original = torch.Tensor.backward

    @functools.wraps(original)
    def backward(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        if WATCH.active and self.numel() == 1:
            WATCH.saw_loss(self)
        return original(self, *args, **kwargs)

    torch.Tensor.backward = backward  # type: ignore[method-assign]
    _watch_clip(torch_module)
    # When the script's main code has returned (or raised): its last steps are written, before its
    # end marker (threading's exit callbacks run last-registered first; the marker's was registered
    # at the rank's start).
    global _END_REGISTERED
    register = getattr(threading, "_register_atexit", None)
    if register is not None and not _END_REGISTERED:
        register(lambda: WATCH.judge_waiting())
        _END_REGISTERED = True
    return handles


def _watch_clip(torch_module: ModuleType) -> None:
    """See the script's `clip_grad_norm_` calls (where scripts call it from, and its home module): the
    pre-clip total norm it returns is the step's norm, already paid for."""
    utils = torch_module.nn.utils
    original = utils.clip_grad_norm_
    if getattr(original, "flightdeck_clip", False):
        return

    @functools.wraps(original)
    def clip_grad_norm_(
        parameters: Any, max_norm: float, norm_type: float = 2.0, *args: Any, **kwargs: Any
    ) -> Any:
        if not WATCH.active:
            return original(parameters, max_norm, norm_type, *args, **kwargs)
        listed = [parameters] if isinstance(parameters, torch.Tensor) else list(parameters)
        total = original(listed, max_norm, norm_type, *args, **kwargs)
        if float(norm_type) == 2.0:
            WATCH.saw_clip(listed, total, float(max_norm))
        return total

    clip_grad_norm_.flightdeck_clip = True  # type: ignore[attr-defined]
    utils.clip_grad_norm_ = clip_grad_norm_
    home = getattr(utils, "clip_grad", None)
    if home is not None:
        home.clip_grad_norm_ = clip_grad_norm_
