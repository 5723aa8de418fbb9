"""Host data rules through the trainer's own loader and collator (D001-D003, D005, D007-D010, D012, V001, V003)."""

from __future__ import annotations

import stat
from pathlib import Path
from typing import Any

from flightdeck.preflight.rule_result import RuleResult, correction, error
from flightdeck.recipe.schema import DataSource, Recipe
from flightdeck.worker.train.chat import chat_problem, tokenize_chat
from flightdeck.worker.train.collate import prompt_text, supervised_tokens, tokenize_causal
from flightdeck.worker.train.data import (
    DataSourceError,
    blank_rows,
    field_map,
    is_blank,
    iter_numbered_rows,
    iter_samples,
    row_samples,
    row_unit,
)
from flightdeck.worker.train.data_sources import (
    STREAMING_ABOVE_VARIABLE,
    auto_streamed,
    local_path,
    source_base,
    source_bytes,
    streaming_above_bytes,
)
from flightdeck.worker.train.image_chat import encode_sample
from flightdeck.worker.train.image_text import ImageTextProcessor
from flightdeck.worker.train.quoting import quote, quote_all

# Enough rows to see a schema problem or a flattening; few enough to take milliseconds.
SAMPLE_ROWS = 16
# Blank rows are cheap to find (no tokenising): look further.
BLANK_SCAN_ROWS = 1000
# Full eval logits beyond this would be an OOM risk on any GPU worth training on (M003).
EVAL_LOGITS_BYTES = 2 * 2**30
_ERROR_FIELD = {"D001": "fields", "D002": "fields", "D003": "split", "D004": "path", "D007": "path"}


def _sources(recipe: Recipe) -> list[tuple[str, DataSource]]:
    named = [(f"data.train[{i}]", s) for i, s in enumerate(recipe.data.train)]
    return named + [(f"data.eval[{i}]", s) for i, s in enumerate(recipe.data.eval)]


def _source_error(prefix: str, exc: DataSourceError) -> RuleResult:
    message = exc.message
    if exc.available_fields and "exist" not in message:
        message += f"; columns that exist: {quote_all(exc.available_fields)}"
    where = f"{prefix}.{_ERROR_FIELD.get(exc.code or '', 'path')}"
    return error(exc.code or "D001", where, message, "host", fix=exc.fix)


_STREAM_KINDS = (
    (stat.S_ISFIFO, "named pipe"),
    (stat.S_ISSOCK, "socket"),
    (stat.S_ISCHR, "character device"),
    (stat.S_ISBLK, "block device"),
)


def _streamed(prefix: str, source: DataSource, workspace: Path, recipe: Recipe) -> list[RuleResult] | None:
    """D009: a source that is a stream (a named pipe, a socket, a device) has no length until it ends.

    None when the source is a regular file (or cannot be resolved: the other rules report that); else the
    findings, and the source must not be read here (a read would block on a pipe or consume its rows).
    """
    try:
        mode = local_path(source, workspace).stat().st_mode
    except OSError:
        return None
    kind = next((name for test, name in _STREAM_KINDS if test(mode)), None)
    if kind is None:
        return None
    training = recipe.training
    if recipe.entrypoint is not None:
        # A script reads it itself, as an IterableDataset: the Trainer then needs max_steps.
        if training is not None and training.max_steps is not None:
            return []
        return [
            error(
                "D009",
                "training.max_steps",
                f"{prefix}.path ({source.path}) is a {kind}, a stream: your script can only read it as an "
                "iterable dataset without a length, and the HF Trainer refuses one without max_steps ('The "
                "train_dataset does not implement __len__, max_steps has to be specified')",
                "host",
                fix="set training.max_steps (and give your TrainingArguments the same max_steps)",
            )
        ]
    steps = (
        "even with training.max_steps set"
        if training is not None and training.max_steps is not None
        else "and without training.max_steps the HF Trainer refuses a dataset with no length ('max_steps "
        "has to be specified'); setting training.max_steps would not be enough here"
    )
    return [
        error(
            "D009",
            f"{prefix}.path",
            f"{source.path} is a {kind}, a stream: it has no length until it ends and can be read only once, "
            "but the trainer indexes every source as a file it re-reads in each rank and DataLoader worker, "
            f"{steps}",
            "host",
            fix=f"write the stream to a file (jsonl) in the workspace and point {prefix}.path at it",
        )
    ]


def _streaming_without_max_steps(
    prefix: str, source: DataSource, recipe: Recipe, workspace: Path
) -> list[RuleResult]:
    """D009: a source read as a stream has no length; the Trainer needs max_steps to know when to stop.
    A source above the worker's size threshold is streamed without asking (with_auto_streaming)."""
    if recipe.training is None or recipe.training.max_steps is not None:
        return []
    if not source.streaming and auto_streamed(source, workspace):
        size, limit = source_bytes(source, workspace) or 0, streaming_above_bytes()
        return [
            error(
                "D009",
                "training.max_steps",
                f"{prefix} ({source.path}) holds {size / 2**20:,.1f} MB, more than this worker's streaming "
                f"threshold ({STREAMING_ABOVE_VARIABLE}={limit / 2**20:g} MB), so it is read as a stream: "
                "it has no length, and the HF Trainer refuses it without max_steps ('max_steps has to be "
                "specified')",
                "host",
                fix=f"set training.max_steps, or raise {STREAMING_ABOVE_VARIABLE} on the worker above "
                f"{size / 2**20:,.0f} MB to convert it to a memory-mapped Arrow file (docs/recipe.md)",
            )
        ]
    if not source.streaming:
        return []
    return [
        error(
            "D009",
            "training.max_steps",
            f'{prefix} is read as a stream ("streaming": true): it has no length, so the number of steps '
            "cannot come from epochs and the HF Trainer refuses it ('max_steps has to be specified')",
            "host",
            fix='set training.max_steps, or drop "streaming" to load the source as a memory-mapped Arrow file',
        )
    ]


def _flattening(prefix: str, source: DataSource, workspace: Path, task: str) -> list[RuleResult]:
    """D002: rows holding several question/answer pairs become one sample per pair; report counts."""
    fields = field_map(source, task)
    rows = samples = 0
    for number, row in iter_numbered_rows(source, workspace, SAMPLE_ROWS):
        rows = number
        samples += len(row_samples(row, fields, task, base=source_base(source, workspace)))
    if samples <= rows:
        return []
    return [
        correction(
            "D002",
            f"{prefix}.fields",
            f"rows of {source.path} hold several question/answer pairs: the first {rows} rows give "
            f"{samples} samples.",
            "each pair is flattened into its own sample",
            where="host",
        )
    ]


def _unsupervised(
    prefix: str, recipe: Recipe, samples: list[dict[str, str]], tokenizer: Any
) -> list[RuleResult]:
    """D005: a sample whose labels are all masked (prompt fills max_seq_length, or empty answer); D010 when
    a chat sample has no supervised token at any length (no chat template, assistant turns not found)."""
    for number, sample in enumerate(samples):
        if "messages" in sample:
            problem = chat_problem(sample, tokenizer)
            if problem is not None:
                what, fix = problem
                return [
                    error("D010", f"{prefix}.preset", f"sample {number} of {prefix}: {what}", "host", fix)
                ]
        try:
            encoded = tokenize_causal(
                sample,
                tokenizer,
                prompt_template=recipe.data.prompt_template,
                max_seq_length=recipe.data.max_seq_length,
            )
        except DataSourceError as exc:
            return [error(exc.code or "D001", "data.prompt_template", exc.message, "host", exc.fix)]
        if supervised_tokens(encoded) == 0:
            return [_no_supervised_token(prefix, number, recipe, sample, tokenizer)]
    return []


def _no_supervised_token(
    prefix: str, number: int, recipe: Recipe, sample: dict[str, str], tokenizer: Any
) -> RuleResult:
    """D005 with the length the sample needs: a chat sample's first assistant token (the whole
    conversation rendered, uncut), or a question/answer sample's prompt."""
    length = recipe.data.max_seq_length
    where = (
        f"sample {number} of {prefix} has no supervised token (every label is -100, the loss would be NaN)"
    )
    if "messages" in sample:
        labels = tokenize_chat(sample, tokenizer, max_seq_length=None)["labels"]
        first = next(i for i, label in enumerate(labels) if label != -100)  # D010 ruled out none at all
        return error(
            "D005",
            "data.max_seq_length",
            f"{where}: its first assistant token is token {first + 1} of the conversation, past "
            f"max_seq_length {length}",
            "host",
            fix=f"raise data.max_seq_length above {first} tokens (the turns before the first assistant "
            "answer), or shorten those turns (a long system prompt)",
        )
    prompt_tokens = len(tokenizer(prompt_text(sample, recipe.data.prompt_template))["input_ids"])
    shorten = "the source's prompts" if sample.get("untemplated") else "data.prompt_template"
    return error(
        "D005",
        "data.max_seq_length",
        f"{where}: its prompt is {prompt_tokens} tokens for max_seq_length {length}, answer "
        f"{quote(sample.get('answer', ''))}",
        "host",
        fix=f"raise data.max_seq_length above {prompt_tokens} tokens (the prompt's), shorten "
        f"{shorten}, or fix the answer field of the source",
    )


def _too_small(recipe: Recipe, workspace: Path) -> list[RuleResult]:
    """D007: fewer training samples than one global batch means zero optimizer steps."""
    training = recipe.training
    if training is None:
        return []  # a script job that does not say its batch size: nothing to compare with
    needed = training.per_device_batch_size * recipe.world_size * training.gradient_accumulation_steps
    total = 0
    for source in recipe.data.train:
        count = sum(1 for _ in iter_samples(source, workspace, task=recipe.task, limit=needed))
        total += min(count, source.max_samples or count)
        if total >= needed:
            return []
    return [
        error(
            "D007",
            "training.gradient_accumulation_steps",
            f"{total} training samples but one optimizer step needs {needed} (per_device_batch_size "
            f"{training.per_device_batch_size} x {recipe.world_size} process(es) x accumulation "
            f"{training.gradient_accumulation_steps}): zero steps",
            "host",
            fix=_too_small_fix(total, training.per_device_batch_size, recipe.world_size),
        )
    ]


def _too_small_fix(samples: int, batch: int, world: int) -> str:
    """The accumulation that gives one step with these samples, or the batch when even 1 is too much."""
    accumulation = samples // (batch * world)
    if accumulation >= 1:
        return (
            f"set training.gradient_accumulation_steps to {accumulation} or less, or add training data "
            f"(at least {batch * world} samples per unit of accumulation)"
        )
    fitting = samples // world
    smaller = (
        f"set training.per_device_batch_size to {fitting} or less with gradient_accumulation_steps 1"
        if fitting >= 1
        else f"run on fewer processes than {world}"
    )
    return f"{smaller}, or add training data"


def _image_tokens_truncated(
    prefix: str, recipe: Recipe, samples: list[dict[str, Any]], processor: ImageTextProcessor
) -> list[RuleResult]:
    """V001: prompt + image tokens (+ answer) of sample rows, through the real processor and images."""
    longest, problem = 0, None
    for number, sample in enumerate(samples):
        try:
            encoded = encode_sample(processor, sample, max_seq_length=1_048_576)
        except DataSourceError as exc:
            return [_source_error(prefix, exc)]
        if len(encoded.input_ids) > longest:
            longest, problem = len(encoded.input_ids), (number, encoded)
    if problem is None or longest <= recipe.data.max_seq_length:
        return []
    number, encoded = problem
    prompt = len(encoded.input_ids) - sum(1 for label in encoded.labels if label != -100)
    images = sum(1 for token in encoded.input_ids if token == processor.image_token_id)
    if prompt < recipe.data.max_seq_length:
        return []  # only the answer's tail is cut: the image tokens survive
    return [
        error(
            "V001",
            "data.max_seq_length",
            f"sample {number} of {prefix} needs {longest} tokens ({images} of them image tokens, {prompt} "
            f"before the answer) but max_seq_length is {recipe.data.max_seq_length}: truncation would cut "
            "image tokens and the run would fail with 'Image features and image tokens do not match'",
            "host",
            fix=f"raise data.max_seq_length to at least {longest}, or shrink the images (data.max_pixels)",
        )
    ]


def _eval_logits(recipe: Recipe, workspace: Path, tokenizer: Any) -> list[RuleResult]:
    """M003: evaluation that kept [samples, seq, vocab] logits would need this much memory."""
    if not recipe.data.eval or tokenizer is None:
        return []
    per_sample = recipe.data.max_seq_length * len(tokenizer) * 4  # float32 logits
    needed = EVAL_LOGITS_BYTES // per_sample + 1
    samples = 0
    for source in recipe.data.eval:
        try:
            samples += sum(
                1 for _ in iter_samples(source, workspace, task=recipe.task, limit=needed - samples)
            )
        except DataSourceError:
            continue  # reported for this source already (D001, D003, ...)
        if samples >= needed:
            break
    if samples < needed:
        return []
    return [
        correction(
            "M003",
            "data.eval",
            f"keeping the evaluation logits ([samples, {recipe.data.max_seq_length}, {len(tokenizer)}] in "
            f"float32) would take over {EVAL_LOGITS_BYTES / 2**30:.0f} GB for {samples}+ eval samples: "
            "evaluation would run out of memory where training did not.",
            "the trainer evaluates with prediction_loss_only: each batch's loss is kept, never its logits",
            where="host",
        )
    ]


def _blank_rows(prefix: str, source: DataSource, workspace: Path, task: str) -> list[RuleResult]:
    """D008: blank rows (an empty text, a missing answer) in the first rows; the trainer leaves them out."""
    rows, read = blank_rows(source, workspace, task=task, limit=BLANK_SCAN_ROWS)
    if not rows:
        return []
    shown = ", ".join(map(str, rows[:20])) + (" ..." if len(rows) > 20 else "")
    unit = row_unit(source, workspace)  # the file's lines (jsonl, txt, csv) or the split's records
    return [
        correction(
            "D008",
            f"{prefix}.path",
            f"{len(rows)} of the first {read} rows of {source.path} are blank ({unit}s {shown}): an empty "
            "text or a missing question/answer trains on nothing.",
            "blank rows are left out of training; the run reports how many it skipped",
            where="host",
        )
    ]


def _text_rows_with_trainable_tower(
    recipe: Recipe, samples: list[dict[str, Any]], tower_trains: bool
) -> list[RuleResult]:
    """V003: under DDP, a rank whose batch has no image skips the trainable tower (or projector) and the
    ranks disagree."""
    if not tower_trains or recipe.world_size < 2 or recipe.data.blank_image_for_text_rows:
        return []
    if all(sample.get("images") for sample in samples):
        return []
    return [
        correction(
            "V003",
            "data.blank_image_for_text_rows",
            f"the vision tower or projector trains under DDP ({recipe.world_size} processes) and some rows "
            "have no image: a rank whose batch holds none skips both, the ranks disagree on which parameters "
            "get gradients, and DDP hangs or fails ('Detected mismatch between collectives'). Freezing them "
            "('vision_tower' and 'projector' in model.freeze) is the other way out.",
            "text-only rows get a blank image, so every rank runs the tower and projector in every step",
            {"data.blank_image_for_text_rows": True},
            "host",
        )
    ]


def check_data(
    recipe: Recipe,
    workspace: Path,
    tokenizer: Any | None,
    *,
    processor: ImageTextProcessor | None = None,
    tower_trains: bool = False,
) -> list[RuleResult]:
    """Read the first rows of every source as the trainer will; tokenise them if a tokenizer is given
    (vision_language: through `processor`, with the real images)."""
    results: list[RuleResult] = []
    readable = True
    train_samples: list[dict[str, Any]] = []
    for prefix, source in _sources(recipe):
        try:
            results += _streaming_without_max_steps(prefix, source, recipe, workspace)
        except DataSourceError as exc:  # the worker's threshold variable is not a number
            return [error("D009", f"{prefix}.streaming", exc.message, "host", exc.fix)]
        streamed = _streamed(prefix, source, workspace, recipe)
        if streamed is not None:
            results += streamed
            readable = False  # never read a stream here: it would block, or take rows from the run
            continue
        try:
            samples = list(iter_samples(source, workspace, task=recipe.task, limit=SAMPLE_ROWS))
            samples = [sample for sample in samples if not is_blank(sample, recipe.task)]
            results += _flattening(prefix, source, workspace, recipe.task)
            results += _blank_rows(prefix, source, workspace, recipe.task)
        except DataSourceError as exc:
            results.append(_source_error(prefix, exc))
            readable = readable and not prefix.startswith("data.train")
            continue
        if prefix.startswith("data.train"):
            train_samples += samples
        if tokenizer is not None and recipe.task == "causal_lm":
            results += _unsupervised(prefix, recipe, samples, tokenizer)
        if processor is not None:
            results += _image_tokens_truncated(prefix, recipe, samples, processor)
    if recipe.task == "vision_language":
        results += _text_rows_with_trainable_tower(recipe, train_samples, tower_trains)
    if readable:
        results += _too_small(recipe, workspace)
        results += _eval_logits(recipe, workspace, tokenizer)
    return results
