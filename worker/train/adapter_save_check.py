"""G014: an adapter saved empty or incomplete, checked against the trained model after each save.

The save can lose training silently: ZeRO-3 or FSDP write 0-sized or all-zero tensors when parameters
are not gathered first (peft#2892, DeepSpeed#7900), and a module trained outside the adapter (a head or
embedding unfrozen by hand, not in `modules_to_save`) is not written at all (trl#4416). The file is read
back and compared with the live tensors: every one present, the same shape, and not all zero where the
trained tensor is not.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from transformers import TrainerCallback

from flightdeck.worker.checkpoints import mark_complete
from flightdeck.worker.train.health import HealthEvent

ADAPTER_FILES = ("adapter_model.safetensors", "adapter_model.bin")
_SHOWN = 6


def _saved_tensors(directory: Path) -> dict[str, torch.Tensor] | None:
    for name in ADAPTER_FILES:
        path = directory / name
        if path.is_file():
            if name.endswith(".safetensors"):
                from safetensors.torch import load_file

                return load_file(str(path))
            loaded = torch.load(path, map_location="cpu", weights_only=True)
            return dict(loaded)
    return None


def _trained_outside_adapter(model: Any, saved_ptrs: set[int]) -> list[str]:
    """Trainable parameters the adapter's state dict does not hold: trained, never written."""
    return [
        name
        for name, param in model.named_parameters()
        if param.requires_grad and param.data_ptr() not in saved_ptrs
    ]


def adapter_save_problems(model: Any, directory: Path) -> tuple[list[str], int]:
    """What is wrong with the adapter saved in `directory` compared with `model` (a PeftModel), and how
    many tensors were checked. Not a PeftModel: nothing to check."""
    from peft import PeftModel, get_peft_model_state_dict

    if not isinstance(model, PeftModel):
        return [], 0
    expected = get_peft_model_state_dict(model)
    saved = _saved_tensors(directory)
    if saved is None:
        return [f"no adapter file ({' or '.join(ADAPTER_FILES)}) in {directory}"], 0
    problems: list[str] = []
    missing = [key for key in expected if key not in saved]
    if missing:
        problems.append(f"{len(missing)} trained tensor(s) missing from the file: {_names(missing)}")
    wrong = [
        f"{key} saved as {list(saved[key].shape)}, trained {list(live.shape)}"
        for key, live in expected.items()
        if key in saved and saved[key].shape != live.shape
    ]
    if wrong:
        problems.append(f"{len(wrong)} tensor(s) saved with another shape: {'; '.join(wrong[:_SHOWN])}")
    zero = [
        key
        for key, live in expected.items()
        if key in saved
        and saved[key].shape == live.shape
        and saved[key].numel() > 0
        and not saved[key].float().abs().sum()
        and live.detach().float().abs().sum()
    ]
    if zero:
        problems.append(f"{len(zero)} tensor(s) saved all zero though trained non-zero: {_names(zero)}")
    outside = _trained_outside_adapter(model, {t.data_ptr() for t in expected.values()})
    if outside:
        problems.append(
            f"{len(outside)} trained parameter(s) outside the adapter are not saved with it: {_names(outside)}"
        )
    return problems, len(expected)


def _names(keys: list[str]) -> str:
    return ", ".join(keys[:_SHOWN]) + (f" (+{len(keys) - _SHOWN} more)" if len(keys) > _SHOWN else "")


def adapter_save_event(model: Any, directory: Path, step: int | None) -> HealthEvent | None:
    """A fatal G014 event when the save lost training, an info record when it was verified, else None."""
    problems, checked = adapter_save_problems(model, directory)
    if problems:
        return HealthEvent(
            "G014",
            "fatal",
            f"the adapter saved in {directory.name} does not hold what was trained: " + "; ".join(problems),
            fix="gather sharded parameters before saving (ZeRO-3: stage3_gather_16bit_weights_on_model_save; "
            "FSDP: a full state dict), and train extra modules through adapter.modules_to_save "
            "(LoraConfig(modules_to_save=[...])) instead of unfreezing them by hand",
            step=step,
            data={"directory": str(directory), "problems": problems},
        )
    if checked:
        return HealthEvent(
            None,
            "info",
            f"adapter save in {directory.name} verified: {checked} trained tensors, shapes and values",
            step=step,
            data={"directory": str(directory), "tensors": checked},
        )
    return None


def check_saved_adapter(
    model: Any, directory: Path, *, step: int | None, is_main: bool, device: torch.device, emit: Any
) -> None:
    """Rank 0 reads the save back; every rank learns the verdict (so all stop at once, HealthStop)."""
    from flightdeck.worker.train.health import HealthStop, agreed_fatal

    event = adapter_save_event(model, directory, step) if is_main else None
    fatal = agreed_fatal(event if event is not None and event.severity == "fatal" else None, device)
    if event is not None:
        emit(event)
    if fatal is not None:
        raise HealthStop(fatal)


class AdapterSaveCheck(TrainerCallback):
    """After each checkpoint the Trainer writes (save_steps), check the adapter in it (G014); then, the
    check's collective passed (every rank's files are written), rank 0 marks the checkpoint complete
    (worker/checkpoints.py): the one a retry may resume from."""

    def __init__(self, emit: Any, *, step_offset: int = 0):
        self.emit = emit
        self.step_offset = step_offset

    def on_save(self, args, state, control, model=None, **kwargs):  # type: ignore[no-untyped-def]
        from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

        directory = Path(args.output_dir) / f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}"
        check_saved_adapter(
            model,
            directory,
            step=self.step_offset + state.global_step,
            is_main=args.process_index == 0,
            device=args.device,
            emit=self.emit,
        )
        if args.process_index == 0:
            mark_complete(directory, state.global_step)
