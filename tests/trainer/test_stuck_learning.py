"""Runs whose gradient flows but cannot move the loss, driven step by step through HealthMonitor:
H004 for a norm clipped at every step while the loss does not fall, H007 (warning) for a gradient that
vanished without reaching 0. The series are what real runs logged (numbers in the tests' comments)."""

from __future__ import annotations

from typing import Any

import pytest
from torch import nn

from flightdeck.recipe import parse_recipe
from flightdeck.recipe.schema import HealthSpec
from flightdeck.worker.train.health import HealthEvent, HealthMonitor

# examples/r2-two-stage.json, stage 1 (the vision tower of a tiny Qwen2-VL under its frozen language
# model, bf16, learning rate 1e-2), as the trainer logged it: (loss, grad_norm) for steps 1-20.
R2_STAGE_1 = [
    (6.1612, 1.90625), (6.0786, 1.796875), (6.0465, 0.06591796875), (6.0405, 0.048828125),
    (6.0356, 0.035400390625), (6.0322, 0.02587890625), (6.0307, 0.0196533203125), (6.0300, 0.015869140625),
    (6.0296, 0.01416015625), (6.0290, 0.01324462890625), (6.0291, 0.0126953125), (6.0293, 0.01220703125),
    (6.0290, 0.01153564453125), (6.0286, 0.01092529296875), (6.0285, 0.01025390625),
    (6.0284, 0.0096435546875), (6.0286, 0.00897216796875), (6.0285, 0.00848388671875),
    (6.0285, 0.00811767578125), (6.0283, 0.00775146484375),
]  # fmt: skip
# The same stage at learning rate 1e-4: the norm falls 4x, the loss keeps falling.
R2_STAGE_1_LR_1E4 = [
    (6.1612, 1.90625), (6.1343, 1.6796875), (6.1135, 1.4296875), (6.0991, 1.25), (6.0871, 1.09375),
    (6.0779, 0.953125), (6.0701, 0.83984375), (6.0640, 0.7421875), (6.0596, 0.66796875),
    (6.0570, 0.62890625), (6.0546, 0.59375), (6.0529, 0.5625), (6.0512, 0.5390625), (6.0500, 0.5234375),
    (6.0491, 0.5078125), (6.0485, 0.5), (6.0479, 0.494140625), (6.0477, 0.48828125), (6.0473, 0.486328125),
    (6.0473, 0.484375),
]  # fmt: skip
# examples/r3-masked-lm.json (tiny BERT, 2 ranks, max_grad_norm 1.0) as the trainer logged it.
R3_MASKED_LM = [
    (12.423, 5.476), (12.29, 6.133), (12.19, 5.753), (12.072, 6.048), (11.941, 5.42), (11.896, 6.321),
    (11.735, 5.725), (11.807, 4.774), (11.791, 5.23), (11.593, 5.315), (11.656, 5.21), (11.634, 4.653),
    (11.482, 5.331), (11.452, 5.183), (11.447, 5.0), (11.552, 4.479), (11.303, 5.172), (11.42, 4.451),
    (11.447, 4.401), (11.421, 4.197),
]  # fmt: skip
# tests/agent/user_scripts/ddp_loop.py --lr 5 --clip_grad_norm 0.5 (SGD, one rank) as the loop watch read
# it at the optimizer's step, after the script's clip: 0.5 whenever the norm was over it.
LOOP_LR_5_CLIP_05 = [
    (0.5237, 0.4999998211860657), (26.053, 0.5), (0.1078, 0.36885038018226624), (4.2718, 0.49999991059303284),
    (0.1443, 0.3884066343307495), (2.5923, 0.49999985098838806), (0.4066, 0.4999995529651642),
    (4.1577, 0.49999988079071045), (0.4135, 0.49999964237213135), (4.7525, 0.49999991059303284),
    (0.141, 0.4335775673389435), (3.5903, 0.49999991059303284), (0.1725, 0.4999993145465851),
    (3.4486, 0.49999985098838806), (0.1786, 0.49999937415122986), (3.6865, 0.49999991059303284),
    (0.6659, 0.49999967217445374), (5.322, 0.49999988079071045), (0.3097, 0.499999463558197),
    (3.934, 0.49999988079071045), (0.3157, 0.4999994933605194), (3.0591, 0.49999985098838806),
]  # fmt: skip


def _full_model() -> nn.Module:
    return nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 1))


def _script_monitor(max_grad_norm: float | None, **health: Any) -> tuple[HealthMonitor, list[HealthEvent]]:
    """As FlightdeckCallback (a Trainer script: max_grad_norm from its arguments) or the loop watch (None)."""
    events: list[HealthEvent] = []
    monitor = HealthMonitor(
        HealthSpec(**health), planned_steps_per_epoch=None, emit=events.append, max_grad_norm=max_grad_norm
    )
    monitor.check_model(_full_model())
    return monitor, events


def _recipe_monitor(**health: Any) -> tuple[HealthMonitor, list[HealthEvent]]:
    recipe = parse_recipe(
        {
            "name": "t",
            "model": {"path": "m"},
            "data": {"train": [{"path": "d.jsonl"}]},
            "training": {"max_grad_norm": 1.0},
            "health": health,
        }
    )
    events: list[HealthEvent] = []
    monitor = HealthMonitor.for_recipe(recipe, planned_steps_per_epoch=None, emit=events.append)
    monitor.check_model(_full_model())
    return monitor, events


def _feed(monitor: HealthMonitor, series: list[tuple[float, float]]) -> None:
    for step, (loss, norm) in enumerate(series, start=1):
        assert monitor.step_checks(step, step, loss, norm, None) is None


# A loss that jumps about (learning rate too high) under a norm always over the limit of 1.0.
OVERSHOOTING = [
    (2.31, 3.4), (2.95, 5.1), (2.12, 2.7), (3.40, 6.3), (2.60, 4.4), (3.05, 5.0), (2.80, 3.9), (3.30, 5.6),
    (2.45, 4.2), (3.10, 4.8),
]  # fmt: skip


def test_a_norm_clipped_at_every_step_while_the_loss_does_not_fall_warns_h004_with_the_numbers() -> None:
    monitor, events = _recipe_monitor(flat_loss_patience=8)
    _feed(monitor, OVERSHOOTING)
    (warning,) = [e for e in events if e.code == "H004"]
    assert (warning.severity, warning.step) == ("warn", 8)
    assert (
        "max_grad_norm 1" in warning.message
        and "5.6" in warning.message
        and "last 8 steps" in warning.message
    )
    assert "from the run's start (2.31, median of its first steps)" in warning.message
    assert warning.data["max_grad_norm"] == 1.0 and warning.data["steps"] == 8
    assert "lower training.learning_rate" in (warning.fix or "") and "training.max_grad_norm" in (
        warning.fix or ""
    )


def test_a_clipped_run_whose_loss_falls_or_levels_off_below_its_start_is_healthy() -> None:
    # examples/r3-masked-lm.json as logged: clipped at all 20 steps (max_grad_norm 1.0), a noisy masked-LM
    # loss that falls 8%: no window of it is flagged, down to the shortest one the rule takes.
    monitor, events = _recipe_monitor(flat_loss_patience=2)
    _feed(monitor, R3_MASKED_LM)
    assert events == []
    # A run that learned, then levelled off while clipped, for longer than the window.
    monitor, events = _recipe_monitor(flat_loss_patience=8)
    _feed(monitor, [(6.2 * 0.97**step, 3.0) for step in range(10)] + [(4.6, 2.5), (4.65, 2.7)] * 10)
    assert events == []


def test_one_unclipped_step_restarts_the_window() -> None:
    monitor, events = _recipe_monitor(flat_loss_patience=8)
    series = [*OVERSHOOTING[:5], (2.7, 0.9), *OVERSHOOTING[:5]]  # 0.9 <= 1.0: not clipped
    _feed(monitor, series)
    assert events == []


def test_a_trainer_scripts_fix_names_its_arguments() -> None:
    monitor, events = _script_monitor(1.0, flat_loss_patience=8)
    _feed(monitor, OVERSHOOTING)
    (warning,) = events
    assert "--learning_rate" in (warning.fix or "") and "--max_grad_norm" in (warning.fix or "")


def test_a_plain_loops_clip_is_read_from_the_norm_it_repeats() -> None:
    # The loop watch reads the norm after the script's clip_grad_norm_(max_norm=0.5): 0.5 every step.
    monitor, events = _script_monitor(None, flat_loss_patience=8)
    _feed(monitor, [(loss, 0.49999990463) for loss, _ in OVERSHOOTING])
    (warning,) = events  # step 9: the first step's norm has nothing to repeat
    assert warning.code == "H004" and "the same 0.5 at every optimizer step" in warning.message
    assert "clip_grad_norm_" in (warning.fix or "") and warning.data["max_grad_norm"] == pytest.approx(0.5)
    # The measured loop: clipped from step 12 on (the norm repeats from 13); its step-2 spike (26.1) does not
    # stand for its start.
    monitor, events = _script_monitor(None, flat_loss_patience=8)
    _feed(monitor, LOOP_LR_5_CLIP_05)
    (warning,) = events
    assert warning.step == 20 and "(0.5237, median of its first steps)" in warning.message  # 13-20 repeat 12
    # Unclipped norms never repeat step after step: no limit is read from them.
    monitor, events = _script_monitor(None, flat_loss_patience=8)
    _feed(monitor, OVERSHOOTING)
    assert events == []


def test_a_loss_that_barely_moves_under_clipping_asks_for_a_larger_step() -> None:
    # TRL's sft.py on the tiny Llama at its default learning rate 2e-5 (AdamW), 8 steps as logged: clipped at
    # every step (max_grad_norm 1.0), the loss within 0.6% of 6.18. A longer run would be flagged at 50 steps.
    sft = [(6.1741, 3.3052), (6.188, 3.0684), (6.1986, 3.1074), (6.1944, 3.3643), (6.1813, 2.9872),
           (6.1629, 2.9839), (6.168, 2.9923), (6.1925, 3.0881)]  # fmt: skip
    monitor, events = _script_monitor(1.0, flat_loss_patience=8)
    _feed(monitor, sft)
    (warning,) = events
    assert "barely moves: raise --learning_rate" in (warning.fix or "") and "--max_grad_norm" in (
        warning.fix or ""
    )
    monitor, events = _script_monitor(1.0)  # the default window (50): the test's own 8-step run says nothing
    _feed(monitor, sft)
    assert events == []


def test_r2_stage_1s_vanished_gradient_is_an_h007_warning_with_the_numbers() -> None:
    monitor, events = _recipe_monitor()
    _feed(monitor, R2_STAGE_1)
    (warning,) = events
    assert (warning.code, warning.severity, warning.step) == ("H007", "warn", 12)
    assert "156x below its peak 1.906 at step 1" in warning.message and "6.0293" in warning.message
    assert "model.freeze" in (warning.fix or "") and "training.learning_rate" in (warning.fix or "")
    assert warning.data["peak_grad_norm"] == 1.90625 and warning.data["steps"] == 5


def test_the_same_stage_at_a_learning_rate_that_keeps_its_gradient_says_nothing() -> None:
    monitor, events = _recipe_monitor()
    _feed(monitor, R2_STAGE_1_LR_1E4)
    assert events == []


def test_a_run_that_converged_is_not_a_vanished_gradient() -> None:
    # Memorising a few samples: the norm 1000x down, the loss flat to 1e-3, but near 0, not where it began.
    monitor, events = _recipe_monitor()
    _feed(monitor, [(2.0, 4.0), (1.0, 2.0), *[(0.01 * 0.9999**s, 0.004) for s in range(10)]])
    assert events == []


def test_a_gradient_far_below_its_peak_while_the_loss_still_falls_is_learning() -> None:
    # A spike at step 1, then a norm 200x smaller under which the loss keeps falling 0.5% a step.
    monitor, events = _recipe_monitor()
    _feed(monitor, [(6.0, 2.0), *[(6.0 * 0.995**s, 0.01) for s in range(1, 15)]])
    assert events == []


def test_an_exactly_zero_gradient_stays_the_fatal_h007() -> None:
    monitor, _ = _recipe_monitor(zero_grad_patience=2)
    assert monitor.step_checks(1, 1, 6.17, 3.3, None) is None
    assert monitor.step_checks(2, 2, 6.19, 0.0, None) is None
    event = monitor.step_checks(3, 3, 6.19, 0.0, None)
    assert event is not None and (event.code, event.severity) == ("H007", "fatal")


def test_h001_and_h002_fixes_name_the_setting_the_job_has() -> None:
    # A script's fix names its argument (--learning_rate), a recipe's its field: neither names the other's.
    for build, name, other in (
        (
            lambda: _script_monitor(1.0, nonfinite_patience=1, grad_norm_limit=10.0, grad_norm_patience=1),
            "--learning_rate",
            "training.",
        ),
        (
            lambda: _recipe_monitor(nonfinite_patience=1, grad_norm_limit=10.0, grad_norm_patience=1),
            "training.learning_rate",
            "--",
        ),
    ):
        monitor, _ = build()
        nonfinite = monitor.step_checks(1, 1, float("nan"), 1.0, None)
        monitor, _ = build()
        too_big = monitor.step_checks(1, 1, 2.0, 50.0, None)
        for event, code in ((nonfinite, "H001"), (too_big, "H002")):
            assert event is not None and event.code == code, event
            assert name in (event.fix or "") and other not in (event.fix or ""), event.fix
