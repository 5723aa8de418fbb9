"""One training job on one rank: every stage of the recipe, in order (torchtune-style setup/train/cleanup)."""

from __future__ import annotations

import json
import math
import os
import pickle
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import IterableDataset

from flightdeck.contracts import METRICS_FILE
from flightdeck.recipe import Recipe, expand_stages, parse_recipe
from flightdeck.recipe.schema import PREVIOUS_STAGE
from flightdeck.run_variables import RESUME_VARIABLE, run_workspace
from flightdeck.worker.instrument.script_end import leaving_marked
from flightdeck.worker.path_confinement import model_location
from flightdeck.worker.train.adapter_save_check import AdapterSaveCheck, check_saved_adapter
from flightdeck.worker.train.checkpoint_stop import CheckpointOnSignal, CheckpointStop
from flightdeck.worker.train.collate import CausalLMCollator, MaskedLMCollator, VisionLanguageCollator
from flightdeck.worker.train.data import open_training_data
from flightdeck.worker.train.data_sources import with_auto_streaming
from flightdeck.worker.train.health import HealthEvent, report_event
from flightdeck.worker.train.health_callback import HealthCallback
from flightdeck.worker.train.metered_trainer import MeteredTrainer
from flightdeck.worker.train.metrics_file import MetricsFile
from flightdeck.worker.train.model import LoadedModel, load_model, merge_adapter_output
from flightdeck.worker.train.stack_dumps import dump_stacks_on_signals
from flightdeck.worker.train.step_report import StepReporter


def training_arguments(recipe: Recipe, output_dir: Path, *, use_cpu: bool, distributed: bool) -> Any:
    """The HF TrainingArguments for one stage, with the field-report fixes built in."""
    from transformers import TrainingArguments

    t, d, m = recipe.training, recipe.data, recipe.model
    args = TrainingArguments(
        output_dir=str(output_dir),
        per_device_train_batch_size=t.per_device_batch_size,
        gradient_accumulation_steps=t.gradient_accumulation_steps,
        learning_rate=t.learning_rate,
        num_train_epochs=t.epochs,
        max_steps=t.max_steps or -1,
        bf16=t.precision == "bf16",
        fp16=t.precision == "fp16",
        optim=t.optimizer,
        lr_scheduler_type=t.lr_scheduler,
        warmup_steps=t.warmup_ratio,  # a float below 1 is a ratio of the total steps
        weight_decay=t.weight_decay,
        max_grad_norm=t.max_grad_norm or 0.0,
        seed=t.seed,
        logging_steps=t.logging_steps,
        logging_nan_inf_filter=False,  # H001 must see a NaN loss, not the running average
        save_strategy="steps" if t.save_steps else "no",
        save_steps=t.save_steps or 500,
        # data.eval: evaluated every eval_steps or at each epoch's end (StepReporter adds the last step).
        eval_strategy=("steps" if t.eval_steps else "epoch") if d.eval else "no",
        eval_steps=t.eval_steps,
        per_device_eval_batch_size=t.per_device_batch_size,
        # Keep only the loss per eval batch: accumulating [samples, seq, vocab] logits OOMs (M003).
        prediction_loss_only=True,
        use_cpu=use_cpu,
        # A backend in one process makes accelerate expect a process group that does not exist.
        ddp_backend="gloo" if use_cpu and distributed else None,
        ddp_find_unused_parameters=t.ddp_find_unused_parameters,
        activation_checkpointing=m.gradient_checkpointing,
        activation_checkpointing_kwargs={"use_reentrant": m.gradient_checkpointing_reentrant},
        dataloader_num_workers=d.num_workers,
        # Fork would copy CUDA state into the workers (E001); persistent workers pay spawn once.
        dataloader_multiprocessing_context="spawn" if d.num_workers > 0 else None,
        dataloader_persistent_workers=d.num_workers > 0,
        dataloader_pin_memory=not use_cpu,
        # On, it drops every sample key the model's forward does not take: the image and text (V004).
        remove_unused_columns=t.remove_unused_columns,
        report_to="none",
        disable_tqdm=True,
        # A streamed source (D009): every rank reads its own batches. Dispatching (rank 0 reads and sends
        # each rank its slice) needs batches of one width, and padded MLM/causal batches are not.
        accelerator_config={"dispatch_batches": False} if any(s.streaming for s in d.train) else None,
    )
    if m.device_map is not None:
        one_process_owns_the_gpus(args)
    return args


def one_process_owns_the_gpus(args: Any) -> None:
    """P002 (R2): a device-mapped model is model parallel; the Trainer must see one device.

    transformers sets _n_gpu = 1 itself only when it detects model parallelism (an hf_device_map over
    several devices), which R2's local-checkpoint load hid; it then wrapped the model in DataParallel and
    doubled the batch. The Trainer computes its batch size from n_gpu in __init__, so this runs before
    the Trainer exists.
    """
    _ = args.n_gpu  # resolves the devices first, or a later access would recompute _n_gpu
    args._n_gpu = 1


def planned_steps_per_epoch(samples: int, recipe: Recipe, world_size: int) -> int:
    """Optimizer steps per epoch the recipe implies: what the Trainer must agree with (P002)."""
    batches = math.ceil(samples / (recipe.training.per_device_batch_size * world_size))
    return max(math.ceil(batches / recipe.training.gradient_accumulation_steps), 1)


def build_collator(recipe: Recipe, loaded: LoadedModel) -> Any:
    """The task's collator; it runs in DataLoader workers, so it holds no CUDA state (E001)."""
    tokenizer = loaded.tokenizer
    if recipe.task == "vision_language":
        return VisionLanguageCollator(
            loaded.processor,
            max_seq_length=recipe.data.max_seq_length,
            blank_image_for_text_rows=recipe.data.blank_image_for_text_rows,
        )
    if recipe.task == "causal_lm":
        return CausalLMCollator(
            tokenizer, prompt_template=recipe.data.prompt_template, max_seq_length=recipe.data.max_seq_length
        )
    return MaskedLMCollator(tokenizer, max_seq_length=recipe.data.max_seq_length)


class RecipeRun:
    """Runs every stage of a recipe; rank 0 writes metrics.jsonl and the stage outputs."""

    def __init__(self, recipe_path: Path):
        self.recipe_path = recipe_path.resolve()
        self.run_dir = self.recipe_path.parent
        self.workspace = run_workspace()
        self.rank = int(os.environ.get("RANK", "0"))
        self.local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        self.world_size = int(os.environ.get("WORLD_SIZE", "1"))
        self.use_cpu = not torch.cuda.is_available()
        self.metrics: MetricsFile | None = None
        self.stages: list[Recipe] = []
        self.step_offset = 0
        self.output_path: Path | None = None
        self.on_signal = CheckpointOnSignal()

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def setup(self) -> None:
        self.stages = expand_stages(parse_recipe(json.loads(self.recipe_path.read_text(encoding="utf-8"))))
        checkpoints = any(stage.training.save_steps for stage in self.stages)
        if checkpoints:
            self.on_signal.install()  # SIGUSR1: a checkpoint, then a stop (G017)
        # H006: where this rank is, when asked or ended
        dump_stacks_on_signals(self.run_dir, self.rank, chain_usr1=checkpoints)
        if self.world_size > 1 and not dist.is_initialized():
            if not self.use_cpu:
                torch.cuda.set_device(self.local_rank)
            dist.init_process_group("gloo" if self.use_cpu else "nccl")
        if self.is_main:
            self.metrics = MetricsFile(self.run_dir / METRICS_FILE)

    def emit(self, event: HealthEvent) -> None:
        """Record an event (rank 0 only) and echo it in the log."""
        if self.is_main:
            report_event(self.metrics, event)

    def train(self) -> Path:
        """Run the stages in order; the last stage's output directory."""
        for index, recipe in enumerate(self.stages):
            self.output_path = self._run_stage(index, recipe)
        assert self.output_path is not None
        return self.output_path

    def _model_path(self, index: int, recipe: Recipe) -> str:
        if recipe.model.path != PREVIOUS_STAGE:
            return str(model_location(recipe.model.path, self.workspace))
        previous = self.run_dir / "output" / f"stage-{index - 1}"
        if not (previous / "adapter_config.json").exists():
            return str(previous)
        if self.is_main:
            merge_adapter_output(previous, recipe.model.dtype, recipe.task)
        self._barrier()
        return str(previous / "merged")

    def _run_stage(self, index: int, recipe: Recipe) -> Path:
        from transformers import PrinterCallback, set_seed

        output_dir = self.run_dir / "output" / f"stage-{index}"
        sized = with_auto_streaming(recipe, self.workspace)  # the host preflight decided the same (D009)
        if sized is not recipe:
            names = [s.path for s in (*sized.data.train, *sized.data.eval) if s.streaming]
            print(f"[flightdeck] rank {self.rank}: streaming {', '.join(names)} (above the size threshold)")
            recipe = sized
        set_seed(recipe.training.seed)
        args = training_arguments(recipe, output_dir, use_cpu=self.use_cpu, distributed=self.world_size > 1)
        loaded = load_model(
            recipe, self._model_path(index, recipe), local_rank=self.local_rank, use_cpu=self.use_cpu
        )
        for code, message in loaded.fixes:
            self.emit(HealthEvent(code, "info", message, step=self.step_offset))
        if loaded.tolerant_loss is not None:
            loaded.tolerant_loss.note = lambda message: self.emit(
                HealthEvent("V006", "info", message, step=self.step_offset)
            )
        dataset = self._open_data(recipe.data.train, recipe, loaded.tokenizer)
        streamed = isinstance(dataset, IterableDataset)
        size = "a stream (no length; training.max_steps ends it)" if streamed else f"{len(dataset)} samples"
        print(f"[flightdeck] rank {self.rank}: stage {index + 1} dataset has {size}", flush=True)
        self._report_data(dataset, recipe)
        # A stream has no epochs to plan: max_steps ends it (D009), so there is no P002 count to compare.
        steps_per_epoch = None if streamed else planned_steps_per_epoch(len(dataset), recipe, self.world_size)
        monitor = HealthCallback.for_recipe(
            recipe,
            planned_steps_per_epoch=steps_per_epoch,
            emit=self.emit,
            step_offset=self.step_offset,
            device=args.device,
        )
        monitor.check_model(loaded.model)
        reporter = StepReporter(
            monitor,
            self.metrics,
            stage=index,
            stages=len(self.stages),
            step_offset=self.step_offset,
            world_size=self.world_size,
        )
        eval_dataset = (
            self._open_data(recipe.data.eval, recipe, loaded.tokenizer) if recipe.data.eval else None
        )
        trainer = MeteredTrainer(
            model=loaded.model,
            args=args,
            train_dataset=dataset,
            eval_dataset=eval_dataset,
            data_collator=build_collator(recipe, loaded),
            callbacks=[
                reporter,
                monitor,
                AdapterSaveCheck(self.emit, step_offset=self.step_offset),
                *([self.on_signal] if recipe.training.save_steps else []),
            ],
        )
        monitor.trainer = reporter.trainer = trainer
        reporter.evaluates = eval_dataset is not None
        trainer.remove_callback(PrinterCallback)  # StepReporter prints the progress line instead
        trainer.train(resume_from_checkpoint=self._resume_point(index))
        if self.on_signal.stopped_at is not None:
            raise CheckpointStop(
                self.on_signal.requested or "a signal", self.step_offset + trainer.state.global_step
            )
        self.step_offset += trainer.state.global_step
        trainer.save_model(str(output_dir))
        check_saved_adapter(  # G014: the output holds what was trained
            loaded.model,
            output_dir,
            step=self.step_offset,
            is_main=self.is_main,
            device=args.device,
            emit=self.emit,
        )
        if self.is_main:
            loaded.tokenizer.save_pretrained(output_dir)
            if loaded.processor is not None:  # the next stage loads the image processor from here
                loaded.processor.image_processor.save_pretrained(output_dir)
        self._barrier()
        return output_dir

    def _resume_point(self, index: int) -> str | None:
        """The checkpoint a retry resumes this stage from (FLIGHTDECK_RESUME_FROM, found by the runner):
        only one of this stage's own (output/stage-<index>/checkpoint-<step>)."""
        resume = os.environ.get(RESUME_VARIABLE, "")
        if not resume:
            return None
        stage = Path(resume).parent.name
        if stage == f"stage-{index}":
            print(f"[flightdeck] rank {self.rank}: resuming stage {index + 1} from {resume}", flush=True)
            return resume
        if index == 0:  # said once: a later stage's checkpoint needs the earlier stages' outputs too
            self.emit(
                HealthEvent(
                    None,
                    "warn",
                    f"the checkpoint to resume from ({resume}) is not one of stage 1's: a multi-stage recipe "
                    "resumes only within its first stage; training starts from step 0",
                    step=0,
                )
            )
        return None

    def _open_data(self, sources: Any, recipe: Recipe, tokenizer: Any) -> Any:
        """The sources' canonical samples, written to the datasets cache by local rank 0 of each host while
        the other ranks wait, then memory-mapped by every rank: mapped once per host, never per process."""
        if self.local_rank != 0:
            self._barrier()
        try:
            return open_training_data(
                sources,
                self.workspace,
                task=recipe.task,
                tokenizer=tokenizer,
                max_seq_length=recipe.data.max_seq_length,
            )
        finally:
            if self.local_rank == 0:
                self._barrier()

    def _report_data(self, dataset: Any, recipe: Recipe) -> None:
        """D008: blank rows left out; and what each loader worker or rank receives when the dataset is
        pickled (R3: references to the Arrow files, never the corpus)."""
        if isinstance(dataset, IterableDataset):
            return  # a stream: its blank rows are skipped as they pass, nothing was indexed
        for source in dataset.datasets:
            if source.blank_rows:
                shown = ", ".join(map(str, source.blank_rows[:20]))
                unit = source.unit  # the file's lines (jsonl, txt, csv) or the split's records
                self.emit(
                    HealthEvent(
                        "D008",
                        "warn",
                        f"{len(source.blank_rows)} blank row(s) of {source.path.name} left out ({unit}s {shown})",
                        fix=f"nothing stops the run; to train on those rows, fill in their empty fields in "
                        f"{source.path.name}",
                        step=self.step_offset,
                        data={"rows": source.blank_rows[:100], "numbered_by": unit},
                    )
                )
        if recipe.data.num_workers > 0 or self.world_size > 1:
            size = len(pickle.dumps(dataset))
            self.emit(
                HealthEvent(
                    None,
                    "info",
                    f"the dataset pickles to {size:,} bytes for each loader worker ({len(dataset):,} samples)",
                    step=self.step_offset,
                    data={"pickled_bytes": size, "samples": len(dataset)},
                )
            )

    def _barrier(self) -> None:
        if dist.is_initialized():
            dist.barrier()

    def cleanup(self) -> None:
        if self.metrics is not None:
            self.metrics.close()
        if dist.is_initialized():
            # Marked while it runs: NCCL's can hang when the ranks leave apart (pytorch/pytorch#75097), and
            # a rank that is leaving has trained to its end (the agent's teardown watch, H008).
            leaving_marked(dist.destroy_process_group)()
