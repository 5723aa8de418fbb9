"""Gradient-health checks inside the trainer: stop a run that cannot learn within its first steps.

G001 no trainable parameters at train start; G002 adapter gradients zero or missing from step 2 on, in
total or per adapted module (frozen, or trainable but cut off from the loss);
G003 optimizer parameters differ from the trainable ones; H001 non-finite loss or gradient norm;
H002 gradient norm above the limit (warn, fatal when sustained); H004 flat loss (warn); P002 the model
wrapped in DataParallel or the trainer's steps per epoch differ from the plan. A fatal finding raises
HealthStop on every rank at the same step (the decision is agreed across ranks), so __main__ exits 42.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Self

import torch
import torch.distributed as dist

from flightdeck.recipe.schema import HealthSpec, Recipe
from flightdeck.worker.train.adapter_norms import AdapterGradNorms
from flightdeck.worker.train.stuck_learning import (
    LOOP_SETTINGS,
    RECIPE_SETTINGS,
    SCRIPT_SETTINGS,
    ClippedEveryStep,
    SettingNames,
    VanishedGradient,
    clipped_fix,
    clipped_message,
    vanished_fix,
    vanished_message,
)

_ADAPTER_MARKERS = (".lora_", ".modules_to_save.")
_SHOWN = 20
# The streaks that end in a fatal finding: while one is open a plain loop's every step is judged at once.
_STOPPING_STREAKS = ("nonfinite", "zero_grad", "grad_limit", "no_tokens", "all_zero_grad")


@dataclass
class HealthEvent:
    """One finding from a run, as written to metrics.jsonl."""

    code: str | None
    severity: str
    message: str
    fix: str | None = None
    step: int | None = None
    data: dict[str, Any] = field(default_factory=dict)


class HealthStop(Exception):
    """A fatal health finding; every rank raises it at the same step."""

    def __init__(self, event: HealthEvent):
        super().__init__(f"{event.code}: {event.message}")
        self.event = event


def is_adapter_param(name: str) -> bool:
    return any(marker in name for marker in _ADAPTER_MARKERS)


def adapted_module_name(name: str) -> str:
    """'...layers.0.self_attn.q_proj.lora_A.default.weight' -> '...layers.0.self_attn.q_proj', whether the
    name is the PeftModel's or that of a DDP (or DataParallel) wrapper around it ('module.' first)."""
    name = name.removeprefix("module.").removeprefix("base_model.model.")
    for marker in _ADAPTER_MARKERS:
        if marker in name:
            return name.split(marker)[0]
    return name


def adapted_weight_name(name: str) -> str:
    """'...q_proj.lora_A.default.weight' -> '...q_proj.weight' (the base weight the adapter belongs to)."""
    name = name.removeprefix("base_model.model.")
    for marker in _ADAPTER_MARKERS:
        if marker in name:
            return name.split(marker)[0] + ".weight"
    return name


def any_rank(flag: bool, device: torch.device) -> bool:
    """True on every rank when `flag` is true on any rank."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return flag
    tensor = torch.tensor([1 if flag else 0], device=device)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return bool(tensor.item())


def agreed_fatal(event: HealthEvent | None, device: torch.device) -> HealthEvent | None:
    """The agreed fatal event: this rank's, or the first rank's that found one."""
    if not any_rank(event is not None, device):
        return None
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return event
    gathered: list[HealthEvent | None] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, event)
    return next(e for e in gathered if e is not None)


def _finite(value: float | None) -> bool:
    return value is not None and math.isfinite(value)


class HealthMonitor:
    """Runs the run-time checks of the failure catalog (docs/failures.md) and raises HealthStop on a fatal one.

    It knows nothing of recipes beyond what the checks need, so a user's script gets the same checks
    (flightdeck.worker.callback, worker/loop_monitor.py, the loop watch); `for_recipe` builds it for the
    trainer's own runs. Its hooks take the Trainer's events' arguments, but it is not a TrainerCallback:
    a plain loop's ranks import it, and transformers' trainer module would come with that base class
    (worker/script_run.py). HealthCallback (health_callback.py) registers it with a Trainer.
    """

    # The adapters' per-tensor norms (G002 per module, bench/README.md "Monitor overhead") are taken at
    # every step of a run's first judged steps, where R1's freeze shows, at every step while a module's
    # or the total's zero streak is open, and at one judged step in NORMS_SAMPLE_EVERY after that. Between
    # samples a Trainer's run whose trainable tensors are all adapters takes the adapters' total from the
    # Trainer's own pre-clip grad_norm (the same norm over the same tensors); any other run, and a plain
    # loop (no Trainer norm), measures every step.
    NORMS_EVERY_STEP_FOR = 10
    NORMS_SAMPLE_EVERY = 10
    # A plain loop's quiet steps at most between two calls when there are no adapters (quiet_steps):
    # the watch's batch of quick steps (BATCH_SECONDS) ends them long before.
    QUIET_STEPS_WITHOUT_ADAPTERS = 1 << 20

    def __init__(
        self,
        health: HealthSpec,
        *,
        planned_steps_per_epoch: int | None,
        emit: Callable[[HealthEvent], None],
        step_offset: int = 0,
        device: torch.device | None = None,
        max_grad_norm: float | None = None,
        freeze: Sequence[str] = (),
        full_finetune: bool = False,
        settings: SettingNames = SCRIPT_SETTINGS,
    ):
        self.health = health
        # How fixes name what to change: a script's arguments unless built for a recipe (for_recipe).
        self.settings = settings
        # None: the run's plan is unknown (a user's script), so P002 judges only the DataParallel wrap.
        self.planned_steps_per_epoch = planned_steps_per_epoch
        # The clip limit, to undo clipping in the adapters' norm (None: norms are taken before clipping).
        self.max_grad_norm = max_grad_norm
        self.freeze = list(freeze)
        self.full_finetune = full_finetune
        self.emit = emit
        self.step_offset = step_offset
        self.trainer: Any = None
        self.trainable_params = 0
        self._adapter: list[tuple[str, torch.nn.Parameter]] = []
        # G002 per module group: the adapted module each adapter tensor belongs to (per layer).
        self._groups: list[str] = []
        self._group_streaks: list[int] = []
        self._adapter_params: list[torch.nn.Parameter] = []
        self._norms = AdapterGradNorms([], [], 0)
        self._adapters_only = False  # every trainable tensor is an adapter's: the Trainer's norm is theirs
        self._judged = 0  # logged steps judged by on_log (a Trainer's)
        self._norms_next = True  # measure the per-tensor norms until the next judged step
        self._groups_dying = False  # a module's zero streak is open (G002 per module)
        self._alone = False  # one process (set at train begin): no other rank to agree a stop with
        self._device = device or torch.device("cpu")
        self._streaks = {
            "nonfinite": 0,
            "zero_grad": 0,
            "grad_limit": 0,
            "flat": 0,
            "no_tokens": 0,
            "all_zero_grad": 0,
        }
        self._flat_from: float | None = None
        # H004 pinned (clipped every step, loss not falling); H007 near zero (a vanished gradient).
        self._clipped = ClippedEveryStep(max_grad_norm, health.flat_loss_patience)
        self._vanished = VanishedGradient(health.zero_grad_patience)
        self._warned: set[str] = set()

    @classmethod
    def for_recipe(cls, recipe: Recipe, **kwargs: Any) -> Self:
        """The monitor of one recipe stage: its health limits, clip norm and freeze patterns."""
        return cls(
            recipe.health,
            max_grad_norm=recipe.need_training().max_grad_norm,
            freeze=recipe.need_model().freeze,
            full_finetune=recipe.adapter is None,
            settings=RECIPE_SETTINGS,
            **kwargs,
        )

    @property
    def has_adapter(self) -> bool:
        return bool(self._adapter)

    @property
    def adapter_tensors(self) -> int:
        return len(self._adapter)

    # --- train start: G001, G003, P002 -----------------------------------------------------------

    def take_inventory(self, model: torch.nn.Module) -> list[tuple[str, torch.nn.Parameter]]:
        named = list(model.named_parameters())
        self.trainable_params = sum(p.numel() for _, p in named if p.requires_grad)
        self._adapter = [(n, p) for n, p in named if is_adapter_param(n)]
        groups = [adapted_module_name(n) for n, _ in self._adapter]
        self._groups = list(dict.fromkeys(groups))
        index = {g: i for i, g in enumerate(self._groups)}
        self._group_streaks = [0] * len(self._groups)
        self._adapter_params = [p for _, p in self._adapter]
        self._norms = AdapterGradNorms(self._adapter_params, [index[g] for g in groups], len(self._groups))
        self._adapters_only = bool(self._adapter) and all(
            is_adapter_param(n) for n, p in named if p.requires_grad
        )
        return named

    def check_model(self, model: torch.nn.Module) -> None:
        """G001 before the Trainer exists: DDP itself refuses a model with nothing to train."""
        self.take_inventory(model)
        event = self._no_trainable_event() if self.trainable_params == 0 else None
        fatal = agreed_fatal(event, self._device)
        if fatal is not None:
            self._stop(fatal)

    def on_train_begin(self, args, state, control, model=None, optimizer=None, train_dataloader=None, **kw):  # type: ignore[no-untyped-def]
        self._device = args.device
        self._alone = not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1
        named = self.take_inventory(model)
        event = self.start_checks(named, optimizer, train_dataloader, args)
        fatal = agreed_fatal(event, self._device)
        if fatal is not None:
            self._stop(fatal)
        wrapped = self.trainer.model_wrapped if self.trainer is not None else model
        wrapper = type(wrapped).__name__
        self.emit(
            HealthEvent(
                None,
                "info",
                f"training started: {self.trainable_params:,} trainable parameters, "
                f"{self.planned_steps_per_epoch or '?'} steps per epoch, "
                f"{wrapping_description(wrapper, args.world_size)}",
                step=self.step_offset,
                data={
                    "trainable_params": self.trainable_params,
                    "adapter_tensors": len(self._adapter),
                    "wrapper": wrapper,
                    "steps_per_epoch": self.planned_steps_per_epoch,
                    "max_steps": state.max_steps,
                    "world_size": args.world_size,
                    # bitsandbytes keeps quantised weights in its own parameter classes.
                    "quantized_tensors": sum(
                        1 for _, p in named if type(p).__name__ in ("Params4bit", "Int8Params")
                    ),
                },
            )
        )

    def start_checks(
        self, named: list[tuple[str, torch.nn.Parameter]], optimizer, dataloader, args
    ) -> HealthEvent | None:  # type: ignore[no-untyped-def]
        """The first fatal finding before step 1, or None."""
        if self.trainable_params == 0:
            return self._no_trainable_event()
        wrapped = self.trainer.model_wrapped if self.trainer is not None else None
        if isinstance(wrapped, torch.nn.DataParallel) or args.n_gpu > 1:
            return HealthEvent(
                "P002",
                "fatal",
                f"the trainer wrapped the model in DataParallel over {args.n_gpu} GPUs in one process: activations "
                "lose their autocast dtype and the batch silently grows",
                fix="a device-mapped model must run with training_args._n_gpu = 1; under DDP use one process per GPU",
                step=self.step_offset,
            )
        if dataloader is not None and self.planned_steps_per_epoch is not None:
            actual = math.ceil(len(dataloader) / args.gradient_accumulation_steps)
            if actual != self.planned_steps_per_epoch:
                return HealthEvent(
                    "P002",
                    "fatal",
                    f"the trainer plans {actual} steps per epoch but the recipe gives {self.planned_steps_per_epoch} "
                    "(the batch was multiplied: DataParallel or a wrong world size)",
                    fix="run one process per GPU (DDP) or set _n_gpu = 1 for a device-mapped model",
                    step=self.step_offset,
                    data={
                        "trainer_steps_per_epoch": actual,
                        "planned_steps_per_epoch": self.planned_steps_per_epoch,
                    },
                )
        if optimizer is not None:
            in_optimizer = {id(p) for group in optimizer.param_groups for p in group["params"]}
            trainable = {id(p): n for n, p in named if p.requires_grad}
            missing = [n for i, n in trainable.items() if i not in in_optimizer]
            if missing or len(in_optimizer - set(trainable)) > 0:
                return HealthEvent(
                    "G003",
                    "fatal",
                    f"the optimizer holds {len(in_optimizer)} tensors but {len(trainable)} require gradients",
                    fix="select trainable parameters on the unwrapped model (no 'module.' prefix) before the "
                    "optimizer is built",
                    step=self.step_offset,
                    data={"not_in_optimizer": missing[:_SHOWN]},
                )
        return None

    def _no_trainable_event(self) -> HealthEvent:
        frozen_adapters = [n for n, p in self._adapter if not p.requires_grad]
        culprits = [
            pattern
            for pattern in self.freeze
            if any(re.search(pattern, n.removeprefix("base_model.model.")) for n in frozen_adapters)
        ]
        if culprits:
            fix = (
                f"remove {', '.join(repr(c) for c in culprits)} from model.freeze: it matches the adapter "
                "parameters themselves. Freeze base modules before the adapter is added and leave every adapter "
                "parameter trainable"
            )
        elif self.full_finetune:
            fix = "model.freeze matches every parameter of a full fine-tune; narrow it or add an adapter"
        elif not self._adapter:
            fix = "nothing requires a gradient: call requires_grad_(True) on what should train, or add an adapter"
        else:
            fix = "freeze the base before the adapter is added, then re-enable requires_grad on every adapter parameter"
        return HealthEvent(
            "G001",
            "fatal",
            f"no trainable parameters at train start ({len(frozen_adapters)} adapter tensors are frozen)",
            fix=fix,
            step=self.step_offset,
            data={"frozen_adapter_tensors": frozen_adapters[:_SHOWN], "freeze": self.freeze},
        )

    # --- every step: G002, H001, H002, H004 -------------------------------------------------------

    def on_pre_optimizer_step(self, args, state, control, **kw):  # type: ignore[no-untyped-def]
        # Runs every optimizer step: one fused norm and a stack, no host sync, when the step is measured
        # (NORMS_EVERY_STEP_FOR). Clipped already; adapter_grad_norm() undoes the clip factor from the
        # logged pre-clip grad norm.
        if self._norms_next:
            self._norms.measure()
        else:
            self._norms.skip()

    def adapter_grad_norm(self, grad_norm: float | None) -> float | None:
        """The adapters' pre-clip gradient norm for the last optimizer step (None: no adapter gradient).
        `grad_norm` is the step's pre-clip norm of every trainable tensor (None: unknown)."""
        if self._norms.skipped:  # only adapters train (_plan_norms): the Trainer's norm is theirs
            return grad_norm
        norm = self._norms.total()
        if norm is None:
            return None
        limit = self.max_grad_norm
        if limit and _finite(grad_norm) and grad_norm > limit:  # type: ignore[operator]
            norm *= (grad_norm + 1e-6) / limit  # type: ignore[operator]
        return norm

    def on_log(self, args, state, control, logs=None, **kw):  # type: ignore[no-untyped-def]
        if not logs or "loss" not in logs:
            return
        step = self.step_offset + state.global_step
        loss, grad_norm = logs.get("loss"), logs.get("grad_norm")
        event = self.step_checks(state.global_step, step, loss, grad_norm, self.adapter_grad_norm(grad_norm))
        if event is not None or not self._alone:  # ranks agree at every step; one process has no one to ask
            fatal = agreed_fatal(event, self._device)
            if fatal is not None:
                self._stop(fatal)
        self._plan_norms(grad_norm)

    def clipped_at(self, limit: float) -> None:
        """The run's clip limit, learnt after the fact (a plain loop's own clip_grad_norm_ call): norms
        given from now on are pre-clip, judged against it (H004) and used to undo the clip."""
        if self.max_grad_norm != limit:
            self.max_grad_norm = limit
            self._clipped.limit = limit

    def measure_planned_norms(self) -> bool:
        """At a plain loop's step, after the optimizer's step and before zero_grad: the adapters' per-tensor
        norms, when this step is planned to measure them (on_pre_optimizer_step's work); whether it was."""
        if self._norms_next:
            self._norms.measure()
            return True
        self._norms.skip()
        return False

    def loop_step_done(self, grad_norm: float | None) -> float | None:
        """After a plain loop's step is measured: the adapters' pre-clip norm (None without adapters), and
        the next step's plan. `grad_norm` is the step's total over every trainable tensor (pre-clip when
        the script's clip gave it), None when unknown (the next step is measured)."""
        adapter_norm = self.adapter_grad_norm(grad_norm) if self._adapter else None
        self._plan_norms(grad_norm)
        return adapter_norm

    def quiet_steps(self) -> int:
        """How many of a plain loop's next steps may go by with no call here (the loop watch's held steps,
        each judged later by step_checks): the steps before the next one whose per-tensor norms are
        planned. 0 while a streak that ends in a stop is open (its every step is judged at once) or every
        step's norms are planned (the first steps, a module's adapters dying, adapters beside other
        trainable tensors); with no adapters there is nothing per tensor to plan."""
        if any(self._streaks[name] for name in _STOPPING_STREAKS):
            return 0
        if not self._adapter:
            return self.QUIET_STEPS_WITHOUT_ADAPTERS
        if self._norms_next or not self._adapters_only:
            return 0
        # _plan_norms plans step k after this one when (judged + k - 1) % every is every - 1.
        return self.NORMS_SAMPLE_EVERY - 1 - self._judged % self.NORMS_SAMPLE_EVERY

    def quiet_steps_done(self, count: int, grad_norm: float | None) -> None:
        """`count` quiet steps went by (count <= quiet_steps()); `grad_norm` is the last one's (None:
        unknown). What the calls would have left: their per-tensor norms not measured, the plan after
        the last one (the same steps measured as when each step makes the calls)."""
        self._norms.skip()
        self._judged += count - 1
        self._plan_norms(grad_norm)

    def _plan_norms(self, grad_norm: float | None) -> None:
        """Whether the steps up to the next judged one measure the adapters' per-tensor norms."""
        self._judged += 1
        self._norms_next = (
            not self._adapters_only
            or not isinstance(grad_norm, (int, float))  # no Trainer norm to stand for the adapters' total
            or self._judged < self.NORMS_EVERY_STEP_FOR
            or self._streaks["zero_grad"] > 0
            or self._groups_dying
            or self._judged % self.NORMS_SAMPLE_EVERY == self.NORMS_SAMPLE_EVERY - 1
        )

    def can_wait(self, loss: float | None, grad_norm: float | None, adapter_norm: float | None) -> bool:
        """Whether this step's judgement may come later, with later steps': its checks cannot stop the run.

        Every fatal check needs a streak of steps that are not like this one (a non-finite value, a zero
        or missing gradient, a norm above the limit) or this step's own per-module norms, and a step like
        this one ends every such streak. Warnings judged later are emitted later, with this step's number.
        """
        return (
            (loss is None or _finite(loss))
            and grad_norm is not None
            and _finite(grad_norm)
            and 0.0 < grad_norm <= self.health.grad_norm_limit
            and (
                not self._adapter
                or (adapter_norm is not None and _finite(adapter_norm) and adapter_norm > 0.0)
            )
            and (self._norms.skipped or len(self._groups) < 2)
        )

    def step_checks(
        self,
        global_step: int,
        step: int,
        loss: float | None,
        grad_norm: float | None,
        adapter_norm: float | None,
        *,
        its_norms: bool = True,
    ) -> HealthEvent | None:
        """Update the streaks with one logged step; the fatal finding, if any (warnings are emitted).
        `its_norms` False: a step judged after a later one, whose per-module norms are not its own."""
        h = self.health
        # An unknown loss (a loop whose backward was not seen) is no evidence of a non-finite one.
        nonfinite = (loss is not None and not _finite(loss)) or (
            grad_norm is not None and not _finite(grad_norm)
        )
        self._streaks["nonfinite"] = self._streaks["nonfinite"] + 1 if nonfinite else 0
        if self._streaks["nonfinite"] >= h.nonfinite_patience:
            return HealthEvent(
                "H001",
                "fatal",
                f"loss {loss} / grad norm {grad_norm} not finite for {self._streaks['nonfinite']} step(s)",
                fix=f"lower {self.settings.learning_rate}, keep {self.settings.max_grad_norm} set, use bf16 "
                "instead of fp16, and check that every batch has supervised tokens (D005)",
                step=step,
                data={"loss": loss, "grad_norm": grad_norm},
            )
        unlearnable = self._cannot_learn(global_step, step, loss, grad_norm, adapter_norm)
        if unlearnable is not None:
            return unlearnable
        if self._adapter and global_step >= 2:
            # lora_B starts at zero so lora_A's gradient is legitimately 0 at step 1: judge from step 2.
            partial = self._dead_groups(step) if its_norms else None
            if partial is not None:
                return partial
            dead = adapter_norm is None or adapter_norm == 0.0
            # Not measured and no total norm: a Trainer's step between samples with no norm logged, or a
            # plain loop's held step whose gradients were written again before its batch (LoopWatch).
            unknown = dead and grad_norm is None and (self._norms.skipped or not its_norms)
            if not unknown:
                self._streaks["zero_grad"] = self._streaks["zero_grad"] + 1 if dead else 0
            if self._streaks["zero_grad"] >= h.zero_grad_patience:
                frozen = [n for n, p in self._adapter if not p.requires_grad]
                missing = "" if self._norms.skipped else f", {self._norms.missing} without a gradient"
                return HealthEvent(
                    "G002",
                    "fatal",
                    f"adapter gradient norm is {adapter_norm} for {self._streaks['zero_grad']} step(s) while the "
                    f"loss is finite: the adapters are not learning ({len(frozen)} adapter tensors frozen"
                    f"{missing})",
                    fix="re-enable requires_grad on every adapter parameter after the adapter is added, call "
                    "enable_input_require_grads() with gradient checkpointing, and keep frozen modules out of "
                    "the adapter's path",
                    step=step,
                    data={"frozen_adapter_tensors": frozen[:_SHOWN], "adapter_grad_norm": adapter_norm},
                )
        if grad_norm is not None and grad_norm > h.grad_norm_limit:
            self._streaks["grad_limit"] += 1
            if self._streaks["grad_limit"] >= h.grad_norm_patience:
                return HealthEvent(
                    "H002",
                    "fatal",
                    f"gradient norm above {h.grad_norm_limit} for {self._streaks['grad_limit']} steps ({grad_norm:.4g})",
                    fix=f"lower {self.settings.learning_rate} or {self.settings.max_grad_norm}, or raise "
                    "health.grad_norm_limit",
                    step=step,
                    data={"grad_norm": grad_norm},
                )
            self._warn_once(
                "H002",
                f"gradient norm {grad_norm:.4g} is above health.grad_norm_limit {h.grad_norm_limit}",
                step,
                f"lower {self.settings.learning_rate} if it persists",
            )
        else:
            self._streaks["grad_limit"] = 0
        judged = adapter_norm if self._adapter else grad_norm
        self._check_flat(loss, judged, step)
        self._check_stuck(loss, grad_norm, judged, step)
        return None

    def _check_stuck(
        self, loss: float | None, grad_norm: float | None, judged: float | None, step: int
    ) -> None:
        """H004 pinned: clipped at every step while the loss does not fall (the total norm: clipping is
        applied to it); H007 near zero: the judged norm vanished while the loss stays where it started."""
        clipped = self._clipped.observe(loss, grad_norm)
        if clipped is not None:
            names = LOOP_SETTINGS if clipped.inferred else self.settings
            self._warn_once(
                "H004",
                clipped_message(clipped),
                step,
                clipped_fix(clipped, names),
                data={
                    "grad_norm": clipped.norm,
                    "max_grad_norm": clipped.limit,
                    "steps": clipped.steps,
                    "start_loss": clipped.start_loss,
                    "loss": clipped.last_loss,
                },
            )
        vanished = self._vanished.observe(step, loss, judged)
        if vanished is not None:
            self._warn_once(
                "H007",
                vanished_message(vanished),
                step,
                vanished_fix(self.settings),
                data={
                    "grad_norm": vanished.norm,
                    "peak_grad_norm": vanished.peak,
                    "peak_step": vanished.peak_step,
                    "steps": vanished.steps,
                    "loss": vanished.loss,
                    "loss_moved": vanished.moved,
                    "first_loss": vanished.first_loss,
                },
            )

    def _cannot_learn(
        self,
        global_step: int,
        step: int,
        loss: float | None,
        grad_norm: float | None,
        adapter_norm: float | None,
    ) -> HealthEvent | None:
        """D005 at run time (loss exactly 0 and no gradient: no supervised token) with or without an adapter;
        H007 (every trainable gradient exactly 0 while the loss is not) for a run without one (G002 judges
        adapters). Fatal after health.zero_grad_patience steps."""
        zero_grad = grad_norm == 0.0 and (not self._adapter or adapter_norm in (None, 0.0))
        no_tokens = zero_grad and loss == 0.0
        self._streaks["no_tokens"] = self._streaks["no_tokens"] + 1 if no_tokens else 0
        patience = self.health.zero_grad_patience
        if self._streaks["no_tokens"] >= patience:
            return HealthEvent(
                "D005",
                "fatal",
                f"loss is exactly 0 and every gradient is 0 for {self._streaks['no_tokens']} step(s): no token "
                "of the batches is supervised (every label -100)",
                fix="check the labels your data code builds: a prompt longer than the maximum length, a chat "
                "template or assistant marker that never matches, or a collator masking everything leaves no "
                "label that is not -100",
                step=step,
                data={"loss": loss, "grad_norm": grad_norm},
            )
        dead = zero_grad and not self._adapter and loss is not None and _finite(loss) and loss != 0.0
        self._streaks["all_zero_grad"] = self._streaks["all_zero_grad"] + 1 if dead else 0
        if self._streaks["all_zero_grad"] >= patience:
            return HealthEvent(
                "H007",
                "fatal",
                f"every trainable gradient is exactly 0 for {self._streaks['all_zero_grad']} step(s) while the "
                f"loss is {loss:.6g}: the model cannot learn ({self.trainable_params:,} trainable parameters)",
                fix="a learning rate so large that the weights saturated (lower --learning_rate), parameters "
                "frozen or detached from the loss (requires_grad, torch.no_grad(), .detach()), or an output "
                "that does not depend on the weights",
                step=step,
                data={"loss": loss, "grad_norm": grad_norm, "trainable_params": self.trainable_params},
            )
        return None

    def _dead_groups(self, step: int) -> HealthEvent | None:
        """G002 per adapted module: some modules' adapters get no gradient while others learn. Fatal after
        health.zero_grad_patience steps (from step 2), naming the dead adapter tensors, whether they were
        frozen after the adapter was added (R1: a tower frozen by the model's own code) or are trainable but
        cut off from the loss (a part run under torch.no_grad(), a detached output, an unused module)."""
        squares = self._norms.group_squares()
        if squares is None or len(self._groups) < 2:
            return None
        dead = [square == 0 for square in squares]
        if all(dead):
            self._group_streaks = [0] * len(self._groups)
            self._groups_dying = False
            return None  # every adapter is dead: the total-norm check below reports it
        self._group_streaks = [(n + 1) if d else 0 for n, d in zip(self._group_streaks, dead, strict=True)]
        self._groups_dying = any(dead)
        stuck = [i for i, n in enumerate(self._group_streaks) if n >= self.health.zero_grad_patience]
        if not stuck:
            return None
        modules = {self._groups[i] for i in stuck}
        tensors = [(n, p) for n, p in self._adapter if adapted_module_name(n) in modules]
        frozen = [n for n, p in tensors if not p.requires_grad]
        names = [n for n, _ in tensors]
        alive = len(self._groups) - len(stuck)
        head = (
            f"adapters of {len(stuck)} module(s) received no gradient for {self.health.zero_grad_patience} "
            f"step(s) while {alive} others learn"
        )
        data = {
            "dead_modules": sorted(modules)[:_SHOWN],
            "dead_adapter_tensors": names[:_SHOWN],
            "frozen_adapter_tensors": frozen[:_SHOWN],
        }
        if not frozen:
            return HealthEvent(
                "G002",
                "fatal",
                f"{head}; their {len(names)} tensors are trainable but cut off from the loss (run under "
                "torch.no_grad(), a detached output, or a layer whose output the model never uses, such as a "
                f"vision tower's last layer with vision_feature_layer -2): {', '.join(names[:3])}",
                fix="let the gradient reach these modules (no torch.no_grad() or .detach() around the part they "
                "sit in), or drop them from adapter.target_modules if that part is meant to stay fixed (e.g. "
                "'language_model.q_proj' adapts only the language model)",
                step=step,
                data=data,
            )
        return HealthEvent(
            "G002",
            "fatal",
            f"{head}; {len(frozen)} of their tensors were frozen after the adapter was added "
            f"(e.g. {', '.join(frozen[:3])})",
            fix="something froze these adapters after get_peft_model (the model's own code freezing a "
            "sub-module, e.g. a lazily loaded vision tower calling requires_grad_(False)): freeze the base "
            "before adding the adapter, then re-enable requires_grad on every adapter parameter, or leave "
            "that part out of adapter.target_modules",
            step=step,
            data=data,
        )

    def _check_flat(self, loss: float | None, norm: float | None, step: int) -> None:
        if not _finite(loss) or not norm:
            self._flat_from, self._streaks["flat"] = None, 0
            return
        if self._flat_from is not None and abs(loss - self._flat_from) <= self.health.flat_loss_epsilon:  # type: ignore[operator]
            self._streaks["flat"] += 1
        else:
            self._flat_from, self._streaks["flat"] = loss, 1
        if self._streaks["flat"] >= self.health.flat_loss_patience:
            self._warn_once(
                "H004",
                f"loss has stayed at {loss:.6g} for {self._streaks['flat']} steps while gradients flow "
                f"(gradient norm {norm:.4g})",
                step,
                "check that labels are not all masked and that the learning rate is not too small "
                f"({self.settings.learning_rate})",
                data={"loss": loss, "grad_norm": norm, "steps": self._streaks["flat"]},
            )

    def _warn_once(
        self, code: str, message: str, step: int, fix: str, data: dict[str, Any] | None = None
    ) -> None:
        if code not in self._warned:
            self._warned.add(code)
            self.emit(HealthEvent(code, "warn", message, fix=fix, step=step, data=data or {}))

    def _stop(self, event: HealthEvent) -> None:
        self.emit(event)
        raise HealthStop(event)


def wrapping_description(wrapper: str, world_size: int) -> str:
    """What the Trainer wrapped the model in, said so a one-process run does not read as data parallel.

    torchrun starts even a one-process job, so the Trainer runs in distributed mode with a process
    group of one and wraps the model in DistributedDataParallel: no replica, no DataParallel.
    """
    if wrapper == "DistributedDataParallel":
        if world_size == 1:
            return "model wrapped as DistributedDataParallel over 1 process (torchrun's group of one: no replica)"
        return f"model wrapped as DistributedDataParallel over {world_size} processes"
    return f"model wrapped as {wrapper}"


def event_record(event: HealthEvent) -> dict[str, Any]:
    """The metrics.jsonl form of an event."""
    return asdict(event)


def report_event(metrics: Any, event: HealthEvent) -> None:
    """Rank 0's record of an event: a metrics.jsonl line (when there is a file) and a log line."""
    if metrics is not None:
        metrics.event(event_record(event))
    print(f"[flightdeck] {event.severity} {event.code or ''} {event.message}".rstrip(), flush=True)
