"""Runs whose gradient flows but cannot move the loss: a norm clipped at every step (H004) and a gradient
that vanished without being exactly zero (H007). Each judge sees one logged step at a time and says,
with the numbers, when its window shows the run is not learning; HealthMonitor turns that into an event.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass


@dataclass(frozen=True)
class SettingNames:
    """How a fix names the settings to change: a recipe's fields, a script's arguments, a loop's code."""

    learning_rate: str
    max_grad_norm: str
    trainable: str


RECIPE_SETTINGS = SettingNames(
    "training.learning_rate", "training.max_grad_norm", "model.freeze / adapter.target_modules"
)
# HF TrainingArguments as run_clm.py, TRL's sft.py and most scripts take them from the command line.
SCRIPT_SETTINGS = SettingNames(
    "--learning_rate",
    "--max_grad_norm",
    "the parameters the script leaves requires_grad (or its adapter's targets)",
)
# A plain loop watched at its optimizer: the clip is the script's own clip_grad_norm_ call.
LOOP_SETTINGS = SettingNames(
    "the learning rate the script gives its optimizer (--learning_rate where it takes one)",
    "max_norm of the script's clip_grad_norm_ call",
    SCRIPT_SETTINGS.trainable,
)

# A plain loop's norm is read at the optimizer's step, after the script's own clip_grad_norm_, which
# scales the gradient to max_norm / (norm + 1e-6): a clipped norm is the limit again, to ~1e-6 relative,
# step after step. Unclipped norms of a learning run never repeat to 5 digits across consecutive steps.
SAME_NORM = 1e-5


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


@dataclass
class Clipped:
    """A window of steps that were all clipped, ending no lower than the run's start."""

    norm: float  # the last step's gradient norm (pre-clip where known)
    limit: float
    steps: int
    start_loss: float  # median of the run's first START_STEPS logged losses
    last_loss: float  # mean of the window's second half
    spread: (
        float  # (max - min) / mean of the window's losses: a loss that jumps about, or one that barely moves
    )
    inferred: bool  # the limit was read from a repeated post-clip norm (a plain loop), not given


class ClippedEveryStep:
    """H004, pinned form: the gradient norm at or above max_grad_norm (clipped) for `window` steps in a
    row while the loss is no lower than where the run started.

    Clipping on its own is healthy: the text stand-in of R2 (stage 1) and the masked-LM example of R3
    are clipped at every one of their 10 and 20 steps while their loss falls 4% and 8%, an HF Trainer
    script (tests/agent/user_scripts/train_qa.py at its default 5e-5) at all of 60 steps while its loss
    falls 7.8%; a full fine-tune is often clipped for thousands of steps. Nor is a plateau while clipped a finding (a run
    that learned and levelled off): a window whose second half is more than MIN_FALL below the run's
    first losses has learned. What is left is a run whose every step overshoots (a learning rate too
    high: the loss jumps about or rises from the start) - the half-means of a 10-step window alone
    flagged R3's healthy noisy loss, the run's start does not.
    """

    MIN_FALL = 0.01
    # The run's start: the median of its first logged losses (one alone is one batch's noise, and a mean
    # took in a plain loop's step-2 spike of 26.1 between 0.52 and 0.11 and cleared a loop that never learned).
    START_STEPS = 3
    # Windows of 2 and 4 steps flagged those healthy runs in their first steps (the start still in the
    # window); from 6 none did. 8 whatever health.flat_loss_patience says, for a margin.
    MIN_WINDOW = 8

    def __init__(self, limit: float | None, window: int):
        self.limit = limit  # None: norms are post-clip (a plain loop), the limit is read from them
        self.window = max(self.MIN_WINDOW, window)
        self.losses: deque[float] = deque(maxlen=self.window)
        self.start: list[float] = []
        self._previous_norm: float | None = None

    def observe(self, loss: float | None, grad_norm: float | None) -> Clipped | None:
        finite = loss is not None and math.isfinite(loss)
        if finite and len(self.start) < self.START_STEPS:
            self.start.append(loss)  # type: ignore[arg-type]
        limit = self._clipped_at(grad_norm)
        if limit is None or not finite:
            self.losses.clear()
            return None
        self.losses.append(loss)  # type: ignore[arg-type]
        if len(self.losses) < self.window:
            return None
        start, last = statistics.median(self.start), _mean(list(self.losses)[-(self.window // 2) :])
        if last < start - self.MIN_FALL * abs(start):
            return None
        assert grad_norm is not None
        spread = (max(self.losses) - min(self.losses)) / max(abs(_mean(list(self.losses))), 1e-12)
        return Clipped(grad_norm, limit, len(self.losses), start, last, spread, inferred=self.limit is None)

    def _clipped_at(self, grad_norm: float | None) -> float | None:
        """The limit this step was clipped at, or None when it was not clipped (or cannot be told)."""
        if grad_norm is None or not math.isfinite(grad_norm) or grad_norm <= 0:
            self._previous_norm = None
            return None
        if self.limit is not None:
            return self.limit if grad_norm >= self.limit else None
        previous, self._previous_norm = self._previous_norm, grad_norm
        if previous is not None and abs(grad_norm - previous) <= SAME_NORM * previous:
            return grad_norm
        return None


def clipped_message(found: Clipped) -> str:
    how = (
        f"the same {found.norm:.6g} at every optimizer step (a norm clipped to max_norm {found.limit:.6g} by the "
        "script)"
        if found.inferred
        else f"{found.norm:.4g}, at or above max_grad_norm {found.limit:.4g} (clipped)"
    )
    moved = "rose" if found.last_loss > found.start_loss else "did not fall"
    return (
        f"the gradient norm has been clipped at every one of the last {found.steps} steps (now {how}) while the "
        f"loss {moved} from the run's start ({found.start_loss:.6g}, median of its first steps) to {found.last_loss:.6g} "
        f"(the last {found.steps // 2} steps)"
    )


# A window whose losses all lie within 2% of their mean is barely moving (TRL's sft.py at its default 2e-5
# on the tiny Llama: 6.163-6.199, 0.6%); one that jumps about overshoots (a loop at learning rate 5: 0.14-5.3).
BARELY_MOVING = 0.02


def clipped_fix(found: Clipped, names: SettingNames) -> str:
    if found.spread <= BARELY_MOVING:
        # Adam's step does not shrink when the gradient is scaled down; plain SGD's does, by the clip.
        return (
            f"the loss barely moves: raise {names.learning_rate} (an adaptive optimizer such as AdamW takes "
            f"steps of the learning rate's size whatever the clip), or, with plain SGD, raise "
            f"{names.max_grad_norm} (each step is cut to the limit, {found.norm / found.limit:.3g}x shorter "
            "than the gradient asks)"
        )
    # Adam's step barely changes when the whole gradient is scaled down, so clipping does not shorten
    # it: a norm that stays over the limit while the loss jumps about is a step that overshoots.
    return (
        f"lower {names.learning_rate} (e.g. 10x): the loss jumps about, every step overshoots, and clipping "
        f"keeps the norm from H002 but not the steps from overshooting; if a norm of {found.norm:.3g} is normal "
        f"for this model, raise {names.max_grad_norm} so that clipping catches only spikes"
    )


@dataclass
class Vanished:
    """A window of steps whose gradient norm fell far below its peak while the loss stayed put."""

    norm: float
    peak: float
    peak_step: int
    steps: int
    moved: float  # the loss's range over the window
    loss: float
    first_loss: float  # the run's first logged loss


class VanishedGradient:
    """H007, near-zero form: the gradient norm RATIO times below the run's peak for `window` steps while
    the loss moves less than FLAT (relative) and still holds KEPT of where the run started.

    Thresholds from measurements (tiny Qwen2-VL, examples/r2-two-stage.json stage 1: the vision tower
    trained under a frozen language model, bf16, 8 samples): at learning rate 1e-2 the norm fell from
    1.906 (step 1) to 0.066 at step 3 (29x) and 0.0159 at step 8 (120x), 0.0078 at step 20 (245x), while
    the loss went 6.0300 -> 6.0283 over steps 8-20 (2.8e-4 relative) and never left 97.8% of its first
    6.161; at 1e-3 the same stage reached the same floor (6.026) with the norm 60x down by step 20.
    The healthy examples (tiny-demo, R1 text and vision, R2 text, R3, R4, multinode) never fell more than
    3.2x below their peak; R2's stage 2 (LoRA) 2.2x; the tests' healthy scripts (TRL's sft.py, 8 steps;
    train_qa.py, 10 and 60 steps) 1.6x, and the plain DDP loop (user_scripts/ddp_loop.py) 22x over 20 steps
    and 31x over 100, its loss by then at 26% of its start (the 90% guard alone clears it). A loss that falls by more than 10% is learning,
    however small its gradient (a run that memorised its data).
    An exactly zero norm is the fatal H007 (HealthMonitor._cannot_learn), not this.
    """

    RATIO = 100.0
    FLAT = 1e-3
    KEPT = 0.9
    MIN_WINDOW = 5

    def __init__(self, patience: int):
        self.window = max(self.MIN_WINDOW, patience)
        self.losses: deque[float] = deque(maxlen=self.window)
        self.peak = 0.0
        self.peak_step = 0
        self.first_loss: float | None = None

    def observe(self, step: int, loss: float | None, grad_norm: float | None) -> Vanished | None:
        if loss is None or grad_norm is None or not (math.isfinite(loss) and math.isfinite(grad_norm)):
            self.losses.clear()
            return None
        if self.first_loss is None:
            self.first_loss = loss
        if grad_norm > self.peak:
            self.peak, self.peak_step = grad_norm, step
        if not 0 < grad_norm * self.RATIO <= self.peak:
            self.losses.clear()
            return None
        self.losses.append(loss)
        if len(self.losses) < self.window:
            return None
        moved = max(self.losses) - min(self.losses)
        if moved > self.FLAT * abs(self.losses[0]) or abs(loss) < self.KEPT * abs(self.first_loss):
            return None
        return Vanished(grad_norm, self.peak, self.peak_step, self.window, moved, loss, self.first_loss)


def vanished_message(found: Vanished) -> str:
    return (
        f"the gradient norm has vanished without reaching 0: {found.norm:.3g}, {found.peak / found.norm:.0f}x "
        f"below its peak {found.peak:.4g} at step {found.peak_step}, for {found.steps} steps, while the loss "
        f"stays at {found.loss:.6g} (it moved {found.moved:.2g} in those steps and still holds "
        f"{found.loss / found.first_loss:.1%} of the first step's {found.first_loss:.6g}): what trains has "
        "reached the lowest loss it can reach, and that is where the run started"
    )


def vanished_fix(names: SettingNames) -> str:
    return (
        f"train a part of the model that can lower this loss ({names.trainable}): a part trained under a frozen, "
        "untrained one (a vision tower under a frozen language model) stops where the frozen part lets it; or, "
        f"if the norm collapsed within a few steps, lower {names.learning_rate} (the weights saturated)"
    )
