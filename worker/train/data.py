"""Training data: recipe DataSources through Hugging Face `datasets`, mapped onto canonical samples.

Public API (host preflight imports it):
    iter_samples(source, workspace, *, task="causal_lm", limit=8) -> Iterator[dict[str, Any]]
        The first `limit` canonical samples of one source, streamed (nothing is converted or cached):
        {"question", "answer"[, "input"], <the mapped columns by their own names>} for causal_lm,
        {"messages"} (a JSON list of {role, content}) for chat presets, {"text"} for masked_lm,
        + "images" ({bytes, path} references) for vision_language. prompt_completion rows are
        {"question", "answer", "untemplated": True} (text) or {"messages", "prompt_turns"} (turns).
    open_dataset(source, workspace, *, task) -> SourceDataset     (a map-style torch dataset)
    open_training_data(sources, workspace, *, task) -> ConcatDataset, or an IterableDataset when a source
        streams (`"streaming": true`: no length, training.max_steps required, D009).
    DataSourceError: .code ("D001" fields missing, "D002" question/answer lists differ, "D003" split
        missing, "D008" blank rows or a missing image, None unreadable), .message, .available_fields.
Presets map canonical fields to dataset columns (PRESET_FIELDS); a source's `fields` override them.

Why `datasets`: the canonical samples are written once per host to an Arrow file in the datasets cache
(HF_DATASETS_CACHE), named by the content's fingerprint, and memory-mapped by every rank and DataLoader
worker. A pickled SourceDataset is a reference to that file, never the rows: the empty copies of field
report R3 (D004) cannot happen, and the corpus is in RAM once per host (the page cache), not per process.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from torch.utils.data import ConcatDataset, Dataset, IterableDataset

from flightdeck.recipe.schema import DataSource
from flightdeck.worker.train.data_errors import DataSourceError
from flightdeck.worker.train.data_sources import open_source, source_base
from flightdeck.worker.train.quoting import quote, quote_all

__all__ = ["DataSourceError", "iter_samples", "open_dataset", "open_training_data", "row_samples"]

# 'a|b': the first of these columns a row has (InfoVQA ships as query/answer and as question/answers).
PRESET_FIELDS: dict[str, dict[str, str]] = {
    "chartqa": {"question": "query", "answer": "label", "image": "image"},
    "infovqa": {"question": "query|question", "answer": "answer|answers", "image": "image"},
    "ocrvqa": {"question": "questions", "answer": "answers", "image": "image"},
    "alpaca": {"question": "instruction", "input": "input", "answer": "output"},
    "messages": {"messages": "messages", "image": "images"},
    "sharegpt": {"messages": "conversations", "image": "images"},
    "text": {"text": "text"},
    # TRL's prompt-completion rows: text (the prompt given whole, no prompt_template around it) or
    # conversations (lists of turns: the completion's turns are supervised, the prompt's are not).
    "prompt_completion": {"prompt": "prompt", "completion": "completion", "image": "images"},
}
CHAT_PRESETS = ("messages", "sharegpt")
# Columns that give a dataset away: D001 names the preset that reads it.
PRESET_SIGNATURES: tuple[tuple[str, frozenset[str]], ...] = (
    ("messages", frozenset({"messages"})),
    ("sharegpt", frozenset({"conversations"})),
    ("alpaca", frozenset({"instruction", "output"})),
    ("prompt_completion", frozenset({"prompt", "completion"})),
    ("ocrvqa", frozenset({"questions", "answers"})),
    ("chartqa", frozenset({"query", "label"})),
    ("infovqa", frozenset({"query", "answer"})),
    ("infovqa", frozenset({"question", "answers"})),
    ("text", frozenset({"text"})),
)
TASK_FIELDS = {
    "causal_lm": ("question", "answer"),
    "masked_lm": ("text",),
    "vision_language": ("question", "answer", "image"),
}
# Fields a preset may name that are allowed to be absent from a row (a text-only row has no image).
_OPTIONAL_FIELDS = {"input", "image"}
# ShareGPT speakers as chat roles.
_SHAREGPT_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant"}
_SHAREGPT_ROLES |= {"system": "system", "tool": "tool", "function_call": "assistant", "observation": "tool"}
CHAT_TURNS_FIX = (
    'write each row\'s turns as a list of {"role": "user"|"assistant"|"system", "content": ...} '
    '(preset \'messages\'), or ShareGPT\'s {"from": "human"|"gpt", "value": ...} (preset \'sharegpt\')'
)
# Bumped when the canonical samples change shape: a new cache file instead of a stale one.
_CANONICAL_VERSION = "3"


def field_map(source: DataSource, task: str) -> dict[str, str]:
    """Canonical field -> column for `source`: the preset's map, then the source's own `fields`."""
    base = dict(PRESET_FIELDS[source.preset]) if source.preset else {name: name for name in TASK_FIELDS[task]}
    return base | (source.fields or {})


def is_chat(fields: dict[str, str]) -> bool:
    return "messages" in fields


def is_prompt_completion(fields: dict[str, str]) -> bool:
    return "completion" in fields


def suggested_preset(columns: Sequence[str]) -> str | None:
    """The preset whose columns a dataset has, if any (D001's hint)."""
    present = set(columns)
    return next((name for name, needed in PRESET_SIGNATURES if needed <= present), None)


def _as_text(value: Any) -> str:
    return value if isinstance(value, str) else "" if value is None else str(value)


def _column(row: dict[str, Any], spec: str) -> str:
    """The column a field spec names in this row ('query|question': the first one present)."""
    return next((c for c in spec.split("|") if c in row), spec)


def _image_refs(value: Any, base: Path | None) -> list[dict[str, Any]]:
    """A row's image value as {bytes, path} references, relative paths made absolute against `base`."""
    values = value if isinstance(value, list) else [] if value is None else [value]
    refs = []
    for ref in values:
        if isinstance(ref, (bytes, bytearray)):
            ref = {"bytes": bytes(ref), "path": None}
        elif isinstance(ref, str):
            ref = {"bytes": None, "path": ref}
        elif not isinstance(ref, dict):
            continue
        path = ref.get("path")
        if not ref.get("bytes") and path and base is not None and not Path(path).is_absolute():
            path = str(base / path)
        refs.append({"bytes": ref.get("bytes"), "path": path})
    return refs


def _missing_fields_error(missing: list[str], row: dict[str, Any]) -> DataSourceError:
    columns = [str(key) for key in row]
    preset = suggested_preset(columns)
    if preset:
        hint = f"these columns are the '{preset}' preset's: set the source's \"preset\": \"{preset}\""
    elif len(columns) == 1 and "\t" in columns[0]:
        hint = "the file looks tab-separated and was read as comma-separated: save it with commas or as jsonl"
    else:
        hint = "set the source's 'preset' or its 'fields' map (recipe field -> dataset column)"
    return DataSourceError(
        "D001",
        f"fields missing from the data: {', '.join(missing)}; columns that exist: {quote_all(columns)}",
        available_fields=columns,
        fix=hint,
    )


def _image_parts(messages: list[dict[str, Any]], column: list[dict[str, Any]], base: Path | None) -> Any:
    """vision_language chat: (turns with every image part reduced to {"type": "image"}, the images in the
    order of those parts). An image part holds its image (`"image"`: a path, bytes or {bytes, path}, the
    way TRL's and LLaVA's conversations write it) or takes the next one of the row's images column."""
    turns, images, taken = [], [], 0
    for turn in messages:
        content = turn.get("content")
        if isinstance(content, list):
            parts = []
            for part in content:
                if isinstance(part, dict) and part.get("type") == "image":
                    inline = part.get("image") or part.get("path")
                    if inline is not None:
                        images += _image_refs(inline, base)
                    elif taken < len(column):
                        images.append(column[taken])
                        taken += 1
                    parts.append({"type": "image"})
                elif isinstance(part, dict):
                    parts.append({k: v for k, v in part.items() if v is not None})
            turn = {**turn, "content": parts}
        turns.append(turn)
    # Images with no part of their own (a column beside plain-text turns) are counted by the processor
    # against the template's placeholders: D011 names the row.
    return turns, images + column[taken:]


def _chat_messages(value: Any) -> list[dict[str, Any]]:
    """A row's turns as [{role, content}]: the messages format as it is, ShareGPT's {from, value} mapped."""
    turns = json.loads(value) if isinstance(value, str) else value
    if not isinstance(turns, list):
        raise DataSourceError(
            "D001",
            f"a chat row's turns are a {type(turns).__name__}, not a list of {{role, content}} (or {{from, value}})",
            fix=CHAT_TURNS_FIX,
        )
    messages = []
    for turn in turns:
        if not isinstance(turn, dict):
            raise DataSourceError(
                "D001", "a chat turn must be an object with role/content (or from/value)", fix=CHAT_TURNS_FIX
            )
        if "role" in turn:
            messages.append({"role": str(turn["role"]), "content": turn.get("content")})
        elif "from" in turn:
            speaker = str(turn["from"])
            if speaker not in _SHAREGPT_ROLES:
                raise DataSourceError(
                    "D001",
                    f"a ShareGPT turn is from {quote(speaker)}; known speakers: {', '.join(_SHAREGPT_ROLES)}",
                    fix=f"rename the speaker to one of {', '.join(_SHAREGPT_ROLES)} (human: the user, gpt: the "
                    "assistant), or drop the turn",
                )
            messages.append({"role": _SHAREGPT_ROLES[speaker], "content": turn.get("value")})
        else:
            raise DataSourceError(
                "D001",
                f"a chat turn has keys {quote_all(turn)}; it needs role/content (or from/value)",
                fix=CHAT_TURNS_FIX,
            )
    return messages


def numbered_row_samples(
    number: int, row: dict[str, Any], fields: dict[str, str], task: str, *, base: Path | None = None
) -> list[dict[str, Any]]:
    """row_samples of the split's 1-based row `number`; an error names the row (found past the host's
    sample rows, it is the trainer's only clue to which row of a large file to fix)."""
    try:
        return row_samples(row, fields, task, base=base)
    except DataSourceError as exc:
        raise DataSourceError(
            exc.code,
            f"row {number}: {exc.message}",
            available_fields=exc.available_fields,
            available_splits=exc.available_splits,
            fix=exc.fix,
        ) from exc


def row_samples(
    row: dict[str, Any], fields: dict[str, str], task: str, *, base: Path | None = None
) -> list[dict[str, Any]]:
    """Canonical samples from one row: list-valued question/answer pairs are flattened (D002).

    vision_language samples carry "images": {bytes, path} references (relative paths resolved against
    `base`, the dataset's folder); the pixels are decoded in the collator, in the DataLoader worker.
    """
    if task != "vision_language":
        fields = {name: column for name, column in fields.items() if name != "image"}
    # Columns a prompt_template may also name by their own names ({instruction}, {output}): plain ones.
    aliases = {name: column for name, column in fields.items() if "|" not in column and column != name}
    fields = {name: _column(row, column) for name, column in fields.items()}
    missing = [f"{name}<-'{column}'" for name, column in fields.items() if column not in row]
    missing = [m for m in missing if m.split("<-")[0] not in _OPTIONAL_FIELDS]
    if missing:
        raise _missing_fields_error(missing, row)
    values = {name: row.get(column) for name, column in fields.items()}
    if task == "masked_lm":
        return [{"text": _as_text(values["text"])}]
    if is_chat(fields):
        turns = _chat_messages(values["messages"])
        if task != "vision_language":
            return [{"messages": json.dumps(turns)}]
        turns, images = _image_parts(turns, _image_refs(values.get("image"), base), base)
        return [{"messages": json.dumps(turns), "images": images}]
    if is_prompt_completion(fields):
        return [_prompt_completion_sample(values, task, base)]
    question, answer = values["question"], values["answer"]
    if any(_is_turns(v) or (isinstance(v, str) and _is_turns(_json_turns(v))) for v in (question, answer)):
        raise DataSourceError(
            "D001",
            "a question or answer field holds chat turns (objects with role/content), which would be "
            "trained on as their printed form",
            fix='for conversations set the source\'s "preset": "messages" (one list of turns) or '
            '"prompt_completion" (TRL\'s prompt and completion turns)',
        )
    if isinstance(question, list):
        if not isinstance(answer, list) or len(answer) != len(question):
            raise DataSourceError(
                "D002",
                f"a row has {len(question)} questions but "
                f"{len(answer) if isinstance(answer, list) else 'one'} answer(s); they must pair up",
                fix="give every question of a row its answer at the same position (lists of equal length), or "
                "split the row into one row per question/answer pair",
            )
        pairs = list(zip(question, answer, strict=True))
    else:
        # ChartQA-style labels are one-element lists: the first answer is the target.
        pairs = [(question, answer[0] if isinstance(answer, list) and answer else answer)]
    extra: dict[str, Any] = {
        name: _as_text(v) for name, v in values.items() if name not in ("question", "answer", "image")
    }
    if task == "vision_language":
        extra["images"] = _image_refs(values.get("image"), base)
    samples = []
    for q, a in pairs:
        sample = extra | {"question": _as_text(q), "answer": _as_text(a)}
        sample |= {column: sample[name] for name, column in aliases.items() if name in sample}
        if sample.get("input"):
            sample["question"] = f"{sample['question']}\n{sample['input']}"
        samples.append(sample)
    return samples


def _is_turns(value: Any) -> bool:
    """A chat turn, or a list of them: what a conversation's column holds."""
    first = value[0] if isinstance(value, list) and value else value
    return isinstance(first, dict) and bool({"role", "from"} & set(first))


def _prompt_completion_sample(values: dict[str, Any], task: str, base: Path | None) -> dict[str, Any]:
    """TRL's prompt-completion row as one sample. Text: {"question": prompt, "answer": completion,
    "untemplated": True} (the prompt is used whole: the collator puts no prompt_template around it).
    Conversational (lists of turns): {"messages": prompt + completion turns, "prompt_turns": how many
    are the prompt's}; only what the completion adds to the rendered prompt is supervised."""
    prompt, completion = values["prompt"], values["completion"]
    # A null (a filtered row in Parquet) takes the other column's form: the row is blank (D008), left out.
    prompt = ([] if isinstance(completion, list) else "") if prompt is None else prompt
    completion = ([] if isinstance(prompt, list) else "") if completion is None else completion
    if isinstance(prompt, str) and isinstance(completion, str):
        # Turns saved as JSON text (a csv file's cells): conversations only when both parse as turns.
        parsed = _json_turns(prompt), _json_turns(completion)
        if all(_is_turns(p) for p in parsed):
            prompt, completion = parsed
    if isinstance(prompt, list) != isinstance(completion, list):
        kinds = ["turns" if isinstance(v, list) else "text" for v in (prompt, completion)]
        raise DataSourceError(
            "D001",
            f"a prompt-completion row's prompt is {kinds[0]} and its completion is {kinds[1]}",
            fix="give both as text (standard) or both as lists of {role, content} turns (conversational), "
            "as TRL's prompt-completion format does",
        )
    if not isinstance(prompt, list):
        sample: dict[str, Any] = {"question": _as_text(prompt), "answer": _as_text(completion)}
        if task == "vision_language":
            return sample | {"images": _image_refs(values.get("image"), base)}
        return sample | {"untemplated": True}
    prompt_turns, completion_turns = _chat_messages(prompt), _chat_messages(completion)
    turns = prompt_turns + completion_turns
    if task == "vision_language":
        turns, images = _image_parts(turns, _image_refs(values.get("image"), base), base)
        return {"messages": json.dumps(turns), "prompt_turns": len(prompt_turns), "images": images}
    return {"messages": json.dumps(turns), "prompt_turns": len(prompt_turns)}


def _json_turns(value: str) -> Any:
    if not value.lstrip().startswith("["):
        return None
    try:
        return json.loads(value)
    except ValueError:
        return None


def canonical_features(fields: dict[str, str], task: str) -> Any:
    """The Arrow schema of the canonical samples (+ row, blank): stated, because a first batch whose rows
    have no image would otherwise fix `images` as a list of nulls and the next batch would not fit."""
    from datasets import Features, Value

    string = Value("string")
    images = {"images": [{"bytes": Value("binary"), "path": string}]}
    if task != "vision_language":
        fields = {name: column for name, column in fields.items() if name != "image"}
    if task == "masked_lm":
        names: dict[str, Any] = {"text": string}
    elif is_prompt_completion(fields):
        # One dataset holds one of the two forms; a sample's columns of the other are null (dropped).
        names = {"question": string, "answer": string, "untemplated": Value("bool")}
        names |= {"messages": string, "prompt_turns": Value("int64")}
        names |= images if task == "vision_language" else {}
    elif is_chat(fields):
        names = {"messages": string} | (images if task == "vision_language" else {})
    else:
        names = {name: string for name in fields if name != "image"}
        names |= {column: string for name, column in fields.items() if "|" not in column and name != "image"}
        names |= {"question": string, "answer": string}
        names |= images if task == "vision_language" else {}
    return Features(names | {"row": Value("int64"), "blank": Value("bool")})


def is_blank(sample: dict[str, Any], task: str) -> bool:
    """D008: a sample whose text is empty (an empty line of text, a question or answer missing, no turns)."""
    if sample.get("messages") is not None:
        turns = json.loads(sample["messages"]) if isinstance(sample["messages"], str) else sample["messages"]
        answer = turns[sample.get("prompt_turns") or 0 :]  # a prompt-completion row: its completion's
        return not any(turn.get("role") == "assistant" and turn.get("content") for turn in answer)
    if task == "masked_lm":
        return not str(sample.get("text", "")).strip()
    return not str(sample.get("question", "")).strip() or not str(sample.get("answer", "")).strip()


def _line_format(source: DataSource, workspace: str | Path) -> str | None:
    """'jsonl', 'txt' or 'csv' when the source is one such file: its rows can be numbered by file line."""
    from flightdeck.worker.train.data_sources import format_of, is_compressed, local_path

    path = local_path(source, workspace)
    fmt = format_of(path, source.format)
    # A compressed file's lines are not the bytes on disk an editor would number.
    return fmt if fmt in ("jsonl", "txt", "csv") and path.is_file() and not is_compressed(path) else None


def row_unit(source: DataSource, workspace: str | Path) -> str:
    """What blank-row numbers count: 'line' (the file's 1-based lines, as an editor shows them) for one
    jsonl, txt or csv file; 'row' (1-based records of the split) for everything else."""
    return "line" if _line_format(source, workspace) else "row"


def file_lines(source: DataSource, workspace: str | Path, rows: Sequence[int]) -> list[int]:
    """The 1-based record numbers `rows` as the file's own line numbers (row_unit 'line'): a jsonl file's
    empty lines hold no record, a csv file's header is line 1; a txt file's records are its lines."""
    from flightdeck.worker.train.data_sources import local_path

    fmt = _line_format(source, workspace)
    if fmt is None or fmt == "txt" or not rows:
        return list(rows)
    if fmt == "csv":
        return [row + 1 for row in rows]
    wanted, found, record = set(rows), {}, 0
    with local_path(source, workspace).open("rb") as handle:
        for number, raw in enumerate(handle, start=1):
            if raw.strip():
                record += 1
                if record in wanted:
                    found[record] = number
                    if len(found) == len(wanted):
                        break
    return [found.get(row, row) for row in rows]


def iter_numbered_rows(
    source: DataSource, workspace: str | Path, limit: int | None = None
) -> Iterator[tuple[int, dict[str, Any]]]:
    """(1-based row number, row) for the first `limit` rows, streamed: nothing is converted or cached."""
    from flightdeck.worker.train.data_sources import local_path, unreadable

    dataset = open_source(source, workspace, streaming=True)
    rows = enumerate(dataset, start=1)
    while True:
        try:
            number, row = next(rows)
        except StopIteration:
            return
        except DataSourceError:
            raise
        except Exception as exc:  # a stream reads the file only now: its errors are data findings too
            raise unreadable(
                local_path(source, workspace), exc, json_lines=source.format in ("jsonl", "json")
            ) from exc
        if limit is not None and number > limit:
            return
        yield number, row


def iter_samples(
    source: DataSource, workspace: str | Path, *, task: str = "causal_lm", limit: int | None = 8
) -> Iterator[dict[str, Any]]:
    """The first `limit` canonical samples of `source` (all when None), reading no more than needed."""
    fields, base = field_map(source, task), source_base(source, workspace)
    produced = 0
    for number, row in iter_numbered_rows(source, workspace):
        for sample in numbered_row_samples(number, row, fields, task, base=base):
            if limit is not None and produced >= limit:
                return
            produced += 1
            # An image that fails to load is reported with its row (D008), as the training samples are.
            yield sample | {"row": number} if "images" in sample else sample


def blank_rows(source: DataSource, workspace: str | Path, *, task: str, limit: int) -> tuple[list[int], int]:
    """(numbers of the blank rows, rows read) among the first `limit` rows of `source` (D008), numbered as
    row_unit says (a jsonl file's own lines)."""
    fields, base = field_map(source, task), source_base(source, workspace)
    found, rows = [], 0
    for rows, row in iter_numbered_rows(source, workspace, limit):
        if any(is_blank(sample, task) for sample in numbered_row_samples(rows, row, fields, task, base=base)):
            found.append(rows)
    return file_lines(source, workspace, found), rows


def _canonical_batch(
    batch: dict[str, list[Any]], indices: list[int], *, fields: dict[str, str], task: str, base: Path
) -> dict[str, list[Any]]:
    """`datasets.map` body: a batch of rows -> canonical samples, with a `row` number and a `blank` flag."""
    names = list(batch)
    samples = []
    for position, index in enumerate(indices):
        row = {name: batch[name][position] for name in names}
        for sample in numbered_row_samples(index + 1, row, fields, task, base=base):
            samples.append(sample | {"row": index + 1, "blank": is_blank(sample, task)})
    keys = list(canonical_features(fields, task))
    return {key: [sample.get(key) for sample in samples] for key in keys}


def _not_blank(blank: list[bool]) -> list[bool]:
    return [not flag for flag in blank]


def canonical_dataset(raw: Any, source: DataSource, workspace: str | Path, *, task: str) -> Any:
    """The source's canonical samples (+ row, blank) as a cached Arrow dataset (or lazily, streamed)."""
    from datasets.fingerprint import Hasher

    fields, base = field_map(source, task), source_base(source, workspace)
    kwargs: dict[str, Any] = {
        "batched": True,
        "with_indices": True,
        "remove_columns": list(raw.column_names or []),
        "fn_kwargs": {"fields": fields, "task": task, "base": base},
        "features": canonical_features(fields, task),
    }
    if source.streaming:
        return raw.map(_canonical_batch, **kwargs)
    fingerprint = Hasher.hash([raw._fingerprint, fields, task, str(base), _CANONICAL_VERSION])
    text = _plain_text_column(raw, fields, task)
    if text is not None:
        # Masked-LM text is already canonical: renamed and flagged by Arrow compute, never a Python row.
        arrow_kwargs = kwargs | {"fn_kwargs": {"column": text}, "batch_size": ARROW_BATCH_ROWS}
        return (
            raw.with_format("arrow")
            .map(_canonical_text_table, new_fingerprint=fingerprint, desc=None, **arrow_kwargs)
            .with_format(None)
        )
    return raw.map(_canonical_batch, new_fingerprint=fingerprint, desc=None, **kwargs)


# Rows per Arrow batch where no Python object is made per row: big batches, few writer calls.
ARROW_BATCH_ROWS = 100_000


def _plain_text_column(raw: Any, fields: dict[str, str], task: str) -> str | None:
    """The masked_lm text column when it is a plain string column (then no row needs Python); else None."""
    from datasets import Value

    column = fields.get("text", "")
    feature = (raw.features or {}).get(column)
    plain = isinstance(feature, Value) and feature.dtype in ("string", "large_string")
    return column if task == "masked_lm" and "|" not in column and plain else None


def _canonical_text_table(table: Any, indices: list[int], *, column: str) -> Any:
    """The Arrow twin of _canonical_batch for masked_lm: {text, row, blank} of a batch of text rows."""
    import pyarrow as pa
    import pyarrow.compute as pc

    text = pc.fill_null(table[column], "").cast(pa.string())
    blank = pc.equal(pc.utf8_trim_whitespace(text), "")
    rows = pa.array(indices, type=pa.int64())
    return pa.table({"text": text, "row": pc.add(rows, 1), "blank": blank})


class SourceDataset(Dataset[dict[str, Any]]):
    """One data source's non-blank samples, backed by a memory-mapped Arrow file (pickles as its path)."""

    def __init__(self, source: DataSource, workspace: str | Path, *, task: str):
        self.path = Path(source.path)
        self.task = task
        canonical = canonical_dataset(open_source(source, workspace), source, workspace, task=task)
        self.unit = row_unit(source, workspace)
        self.blank_rows = file_lines(source, workspace, _blank_row_numbers(canonical))
        self.canonical = canonical  # every row, blank ones flagged: what pretokenize reads
        self.max_samples = source.max_samples
        kept = canonical.filter(_not_blank, input_columns="blank", batched=True)
        if source.max_samples:
            kept = kept.select(range(min(source.max_samples, len(kept))))
        self.samples = kept.remove_columns(["blank"])
        self.length = len(self.samples)

    def __getstate__(self) -> dict[str, Any]:
        # The rows stay in the Arrow files (pickled as their paths); the parent reports blank rows (D008).
        return self.__dict__ | {"blank_rows": [], "canonical": None}

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> dict[str, Any]:
        sample = dict(self.samples[index])
        if "images" not in sample:
            sample.pop("row", None)  # kept where an image may fail to load: its finding names the row
        return {key: value for key, value in sample.items() if value is not None}


def _blank_row_numbers(canonical: Any) -> list[int]:
    import pyarrow.compute as pc

    table = canonical.data.table
    return [int(n) for n in pc.filter(table["row"], table["blank"]).to_pylist()] if len(table) else []


class StreamedSource:
    """A source read as a stream (`"streaming": true`): no length, rows read as training consumes them."""

    def __init__(self, source: DataSource, workspace: str | Path, *, task: str):
        self.path = Path(source.path)
        self.blank_rows: list[int] = []
        canonical = canonical_dataset(
            open_source(source, workspace, streaming=True), source, workspace, task=task
        )
        kept = canonical.filter(_not_blank, input_columns="blank", batched=True)
        self.samples = kept.remove_columns(["blank", "row"])
        if source.max_samples:
            self.samples = self.samples.take(source.max_samples)


def open_dataset(source: DataSource, workspace: str | Path, *, task: str) -> SourceDataset:
    """Open one source for training; raises DataSourceError when it does not match the recipe."""
    dataset = SourceDataset(source, workspace, task=task)
    if len(dataset) == 0:
        blank = f" ({len(dataset.blank_rows)} blank rows left out, D008)" if dataset.blank_rows else ""
        raise DataSourceError(
            "D007",
            f"{source.path} has no samples{blank}",
            fix=f"give {source.path} rows with the mapped fields filled in, or remove it from the recipe",
        )
    return dataset


def _id_type(tokenizer: Any) -> Any:
    """The narrowest Arrow integer for the vocabulary's ids: uint16 for BERT's 30,522 or RoBERTa's 50,265
    (a quarter of int64's file, the pages every loader worker reads), int32 above 65,536."""
    import pyarrow as pa

    return pa.uint16() if len(tokenizer) <= 2**16 else pa.int32()


class IdsEncoder:
    """texts -> token ids, as `tokenizer(texts, truncation=True, max_length=max_seq_length)["input_ids"]`.

    A fast tokenizer's Rust tokenizer is called directly (its own copy, so the caller's truncation and
    padding settings stay as they were), with encode_batch_fast where tokenizers has it (no character
    offsets): the transformers call also builds attention masks and token type ids as Python lists, about
    half the time of tokenising a corpus. A slow tokenizer is called as it is. Picklable: the tokenising
    processes of pretokenize each receive one."""

    def __init__(self, tokenizer: Any, max_seq_length: int):
        self.max_seq_length = max_seq_length
        backend = getattr(tokenizer, "backend_tokenizer", None)
        self.tokenizer = tokenizer if backend is None else None
        self.backend = None
        if backend is not None:
            from tokenizers import Tokenizer

            self.backend = Tokenizer.from_str(backend.to_str())
            self.backend.no_padding()
            self.backend.enable_truncation(max_seq_length)

    def __call__(self, texts: list[str]) -> list[list[int]]:
        if self.backend is None:
            return list(self.tokenizer(texts, truncation=True, max_length=self.max_seq_length)["input_ids"])
        encode = getattr(self.backend, "encode_batch_fast", self.backend.encode_batch)
        return [encoding.ids for encoding in encode(texts, add_special_tokens=True)]


def _id_lists(ids: list[list[int]], id_type: Any) -> Any:
    """Lists of token ids as one Arrow list array, built from flat numpy arrays: pyarrow's conversion of
    nested Python lists into uint16 checks every int, 10x slower than this."""
    import itertools

    import numpy as np
    import pyarrow as pa

    offsets = np.zeros(len(ids) + 1, dtype=np.int64)
    np.cumsum(np.fromiter(map(len, ids), dtype=np.int64, count=len(ids)), out=offsets[1:])
    values = np.fromiter(
        itertools.chain.from_iterable(ids), dtype=id_type.to_pandas_dtype(), count=int(offsets[-1])
    )
    return pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)), pa.array(values, type=id_type))


def _tokenize_table(table: Any, *, encode: Any, id_type: Any) -> Any:
    """A batch of canonical rows -> the token ids of its non-blank texts, as one Arrow list column of the
    vocabulary's narrowest integer. Blank rows are dropped here, not through filter()'s indices file:
    reading through an indices mapping gathers row by row in Python, minutes for R3's 14.7M lines."""
    import pyarrow as pa
    import pyarrow.compute as pc

    texts = pc.filter(table["text"], pc.invert(table["blank"])).to_pylist()
    return pa.table({"input_ids": _id_lists(encode(texts) if texts else [], id_type)})


# Rows each tokenising process takes at least: below this, starting a process costs more than it saves.
ROWS_PER_TOKENIZING_PROCESS = 500_000


def tokenizing_processes(rows: int) -> int | None:
    """Processes to tokenise `rows` with: the host's cores, one per 500k rows (None: one, in this
    process). Only local rank 0 tokenises while the host's other ranks wait, so the cores are free;
    launches set TOKENIZERS_PARALLELISM=false (E004), which keeps the tokenizer to one thread. The host's
    count, not this rank's CPU affinity: the cache files are named by the number of processes, and a rank
    bound to other cores must find the files local rank 0 wrote, not tokenise again."""
    cores = os.cpu_count() or 1
    processes = min(cores, rows // ROWS_PER_TOKENIZING_PROCESS)
    return processes if processes > 1 else None


def pretokenize(source: SourceDataset, tokenizer: Any, *, max_seq_length: int) -> None:
    """masked_lm: the source's texts tokenised once into the datasets cache, in a file named by the
    content, the tokenizer and max_seq_length: a second rank, attempt or job on this host reuses it.
    The file holds only the token ids: the texts are in the canonical file already, and a sample that
    carried both would double the pages every loader worker touches."""
    from datasets.fingerprint import Hasher

    canonical = source.canonical
    fingerprint = Hasher.hash([canonical._fingerprint, Hasher.hash(tokenizer), max_seq_length, "mlm-3"])
    tokenized = (
        canonical.with_format("arrow")
        .map(
            _tokenize_table,
            batched=True,
            batch_size=10_000,  # an Arrow-format map's output replaces the columns: ids only
            fn_kwargs={"encode": IdsEncoder(tokenizer, max_seq_length), "id_type": _id_type(tokenizer)},
            num_proc=tokenizing_processes(len(canonical)),
            new_fingerprint=fingerprint,
            desc=None,
        )
        .with_format(None)
    )
    if source.max_samples:
        tokenized = tokenized.select(range(min(source.max_samples, len(tokenized))))  # a slice, no indices
    assert len(tokenized) == source.length, "the tokenised file holds the source's non-blank samples"
    source.samples = tokenized
    # The rank no longer maps the texts: their pages leave its memory (they stay in the page cache).
    source.canonical = None


def open_training_data(
    sources: Sequence[DataSource],
    workspace: str | Path,
    *,
    task: str,
    tokenizer: Any = None,
    max_seq_length: int | None = None,
) -> Any:
    """All sources of a recipe's data.train (or data.eval) mixed into one dataset: a ConcatDataset of
    map-style sources, or, when any source streams, the streams read in order (no length). With a
    tokenizer, masked_lm texts are tokenised once into the cache (pretokenize)."""
    if not any(source.streaming for source in sources):
        opened = [open_dataset(source, workspace, task=task) for source in sources]
        if task == "masked_lm" and tokenizer is not None and max_seq_length is not None:
            for dataset in opened:
                pretokenize(dataset, tokenizer, max_seq_length=max_seq_length)
        return ConcatDataset(opened)
    streams = []
    for source in sources:
        if source.streaming:
            streams.append(StreamedSource(source, workspace, task=task).samples)
        else:
            streams.append(
                open_dataset(source, workspace, task=task)
                .samples.remove_columns(["row"])
                .to_iterable_dataset()
            )
    return streams[0] if len(streams) == 1 else StreamChain(streams)


class StreamChain(IterableDataset[dict[str, Any]]):
    """Several streams read one after another. Unlike torch's ChainDataset it has no __len__ (which would
    raise): the Trainer must see a dataset without a length. Each `datasets` stream shards itself over
    DataLoader workers and ranks inside its own __iter__."""

    def __init__(self, streams: Sequence[Any]):
        self.streams = list(streams)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for stream in self.streams:
            yield from stream
