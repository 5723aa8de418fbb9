"""Training data: open a recipe DataSource and yield canonical samples, loaded lazily in each process.

Public API (host preflight imports it):
    iter_samples(source, workspace, *, task="causal_lm", limit=8) -> Iterator[dict[str, Any]]
        The first `limit` canonical samples of one source without reading the whole file:
        {"question", "answer"[, "input"]} for causal_lm, {"text"} for masked_lm.
    open_dataset(source, workspace, *, task) -> SourceDataset     (a map-style torch dataset)
    open_training_data(sources, workspace, *, task) -> ConcatDataset
    DataSourceError: .code ("D001" fields missing, "D002" question/answer lists differ, "D003" split
        missing, "D004" an example arrived empty, None unreadable), .message, .available_fields,
        .available_splits.
Presets map canonical fields to dataset columns (PRESET_FIELDS); a source's `fields` override them.
Datasets pickle only the path, the field map and the length (D004, field report R3 in docs/failures.md): the row index
is rebuilt lazily in each process that reads, so DataLoader workers and ranks never get an empty copy.
"""

from __future__ import annotations

import csv
import difflib
import io
import json
import os
import re
from array import array
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from torch.utils.data import ConcatDataset, Dataset

from service.recipe.schema import DataSource

# 'a|b': the first of these columns a row has (InfoVQA ships as query/answer and as question/answers).
PRESET_FIELDS: dict[str, dict[str, str]] = {
    "chartqa": {"question": "query", "answer": "label", "image": "image"},
    "infovqa": {"question": "query|question", "answer": "answer|answers", "image": "image"},
    "ocrvqa": {"question": "questions", "answer": "answers", "image": "image"},
    "alpaca": {"question": "instruction", "input": "input", "answer": "output"},
    "text": {"text": "text"},
}
TASK_FIELDS = {
    "causal_lm": ("question", "answer"),
    "masked_lm": ("text",),
    "vision_language": ("question", "answer", "image"),
}
_EXTENSIONS = {".jsonl": "jsonl", ".json": "json", ".csv": "csv", ".parquet": "parquet", ".txt": "txt"}
# Fields a preset may name that are allowed to be absent from a row (a text-only row has no image).
_OPTIONAL_FIELDS = {"input", "image"}
_SPLIT_ALIASES = {
    "validation": ("val", "valid", "dev"),
    "val": ("validation", "valid", "dev"),
    "test": ("eval",),
}


_CODED_TEXT = re.compile(r"([A-Z]\d{3}): (.*)", re.DOTALL)


class DataSourceError(Exception):
    """A data source cannot be read as the recipe describes; `code` is the docs/failures.md code.

    `DataSourceError(text)` (one string) rebuilds the error from its text: how PyTorch re-raises an
    exception of a DataLoader worker in the main process (`type(text)`, text ending with the worker's
    traceback, `...DataSourceError: V001: ...`) and how pickle rebuilds it. Without that the collator's
    code was lost: the rebuild failed and PyTorch raised a plain RuntimeError (an uncoded failure).
    """

    def __init__(
        self,
        code: str | None,
        message: str | None = None,
        *,
        available_fields: Sequence[str] = (),
        available_splits: Sequence[str] = (),
    ):
        if message is None:  # rebuilt from text: "[...DataSourceError: ][CODE: ]message"
            text = (code or "").rpartition(f"{type(self).__name__}: ")[2].strip()
            coded = _CODED_TEXT.fullmatch(text)
            code, message = (coded.group(1), coded.group(2)) if coded else (None, text)
        super().__init__(f"{code}: {message}" if code else message)
        self.code = code
        self.message = message
        self.available_fields = list(available_fields)
        self.available_splits = list(available_splits)


def field_map(source: DataSource, task: str) -> dict[str, str]:
    """Canonical field -> column for `source`: the preset's map, then the source's own `fields`."""
    base = dict(PRESET_FIELDS[source.preset]) if source.preset else {name: name for name in TASK_FIELDS[task]}
    return base | (source.fields or {})


def resolve_path(source: DataSource, workspace: str | Path) -> tuple[Path, str]:
    """The file to read (resolving a split directory) and its format."""
    path = Path(source.path)
    if not path.is_absolute():
        path = Path(workspace) / path
    if path.is_dir():
        path = _split_file(path, source.split or "train")
    elif not path.exists():
        raise DataSourceError(None, f"data file {path} does not exist")
    fmt = source.format or _EXTENSIONS.get(path.suffix.lower())
    if fmt is None:
        raise DataSourceError(
            None, f"cannot tell the format of {path.name}; set 'format' (jsonl, json, csv, ...)"
        )
    return path, fmt


def _split_file(directory: Path, split: str) -> Path:
    files = {p.stem: p for p in sorted(directory.iterdir()) if p.suffix.lower() in _EXTENSIONS}
    if split in files:
        return files[split]
    near = [name for name in _SPLIT_ALIASES.get(split, ()) if name in files]
    near += difflib.get_close_matches(split, list(files), n=1, cutoff=0.5)
    hint = f"; did you mean '{near[0]}'?" if near else ""
    raise DataSourceError(
        "D003",
        f"split '{split}' not found in {directory}; splits that exist: {', '.join(files) or 'none'}{hint}",
        available_splits=list(files),
    )


def _as_text(value: Any) -> str:
    return value if isinstance(value, str) else "" if value is None else str(value)


def _column(row: dict[str, Any], spec: str) -> str:
    """The column a field spec names in this row ('query|question': the first one present)."""
    return next((c for c in spec.split("|") if c in row), spec)


def _image_refs(value: Any, base: Path | None) -> list[Any]:
    """A row's image value as a list of references (path, bytes or {bytes, path}), paths made absolute."""
    values = value if isinstance(value, list) else [] if value is None else [value]
    refs = []
    for ref in values:
        if isinstance(ref, str) and base is not None and not Path(ref).is_absolute():
            ref = str(base / ref)
        elif isinstance(ref, dict) and not ref.get("bytes") and ref.get("path") and base is not None:
            ref = str(base / ref["path"]) if not Path(ref["path"]).is_absolute() else ref["path"]
        refs.append(ref)
    return refs


def row_samples(
    row: dict[str, Any], fields: dict[str, str], task: str, *, base: Path | None = None
) -> list[dict[str, Any]]:
    """Canonical samples from one row: list-valued question/answer pairs are flattened (D002).

    vision_language samples carry "images": a list of references (relative paths resolved against
    `base`, the dataset file's folder); the pixels are decoded in the collator, in the DataLoader worker.
    """
    if task != "vision_language":
        fields = {name: column for name, column in fields.items() if name != "image"}
    fields = {name: _column(row, column) for name, column in fields.items()}
    missing = [f"{name}<-'{column}'" for name, column in fields.items() if column not in row]
    missing = [m for m in missing if m.split("<-")[0] not in _OPTIONAL_FIELDS]
    if missing:
        raise DataSourceError(
            "D001",
            f"fields missing from the data: {', '.join(missing)}; fields that exist: {', '.join(map(str, row))}. "
            "Set the source's 'preset' or 'fields' map (recipe field -> dataset column)",
            available_fields=[str(key) for key in row],
        )
    values = {name: row.get(column) for name, column in fields.items()}
    if task == "masked_lm":
        return [{"text": _as_text(values["text"])}]
    question, answer = values["question"], values["answer"]
    if isinstance(question, list):
        if not isinstance(answer, list) or len(answer) != len(question):
            raise DataSourceError(
                "D002",
                f"a row has {len(question)} questions but "
                f"{len(answer) if isinstance(answer, list) else 'one'} answer(s); they must pair up",
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
        sample = {"question": _as_text(q), "answer": _as_text(a)} | extra
        if sample.get("input"):
            sample["question"] = f"{sample['question']}\n{sample['input']}"
        samples.append(sample)
    return samples


def iter_rows(path: Path, fmt: str, limit: int | None = None) -> Iterator[tuple[int, dict[str, Any]]]:
    """(byte offset or -1, row) for each row; offsets only for line formats."""
    for _, offset, row in iter_numbered_rows(path, fmt, limit):
        yield offset, row


def row_unit(fmt: str) -> str:
    """What the numbers of iter_numbered_rows count in a file of this format: 'line' (1-based line of
    the file, blank lines and a csv header included) or 'row' (1-based record of a json list or parquet)."""
    return "line" if fmt in ("jsonl", "txt", "csv") else "row"


def iter_numbered_rows(
    path: Path, fmt: str, limit: int | None = None
) -> Iterator[tuple[int, int, dict[str, Any]]]:
    """(number, byte offset or -1, row) for each row. The number is the one a user finds in the file
    (row_unit): the 1-based line for jsonl, txt and csv, the 1-based record for json and parquet. A
    jsonl file's empty lines hold no row; a txt file's empty line is a row with an empty text (D008)."""
    if fmt in ("jsonl", "txt"):
        with path.open("rb") as handle:
            offset = 0
            for number, raw in enumerate(handle, start=1):
                line = raw.strip()
                if line:
                    yield number, offset, _parse_line(line, fmt, path, number)
                elif fmt == "txt":
                    yield number, offset, {"text": ""}
                offset += len(raw)
    elif fmt == "json":
        rows = json.loads(path.read_text(encoding="utf-8"))
        if isinstance(rows, dict) and isinstance(rows.get("data"), list):
            rows = rows["data"]
        if not isinstance(rows, list):
            raise DataSourceError(None, f"{path.name}: a json dataset must be a list of objects")
        yield from ((number, -1, row) for number, row in enumerate(rows, start=1))
    elif fmt == "csv":
        with path.open(newline="", encoding="utf-8") as handle:
            reader = csv.DictReader(handle)
            for row in reader:
                yield reader.line_num, -1, row  # the line the record ends on (the header is line 1)
    elif fmt == "parquet":
        import pyarrow.parquet as pq

        number = 0
        for batch in pq.ParquetFile(path).iter_batches(batch_size=limit or 4096):
            for row in batch.to_pylist():
                number += 1
                yield number, -1, row
    else:
        raise DataSourceError(None, f"unknown data format '{fmt}'")


def _parse_line(line: bytes, fmt: str, path: Path, number: int) -> dict[str, Any]:
    text = line.decode("utf-8")
    if fmt == "txt":
        return {"text": text}
    try:
        row = json.loads(text)
    except json.JSONDecodeError as exc:
        raise DataSourceError(None, f"{path.name} line {number} is not valid JSON ({exc})") from exc
    if not isinstance(row, dict):
        raise DataSourceError(None, f"{path.name} line {number} is not a JSON object")
    return row


def iter_samples(
    source: DataSource, workspace: str | Path, *, task: str = "causal_lm", limit: int | None = 8
) -> Iterator[dict[str, Any]]:
    """The first `limit` canonical samples of `source` (all when None), reading no more than needed."""
    path, fmt = resolve_path(source, workspace)
    fields = field_map(source, task)
    produced = 0
    for _, row in iter_rows(path, fmt, limit):
        for sample in row_samples(row, fields, task, base=path.parent):
            if limit is not None and produced >= limit:
                return
            produced += 1
            yield sample


def is_blank(sample: dict[str, Any], task: str) -> bool:
    """D008: a sample whose text is empty (an empty line of text, a question or answer missing)."""
    if task == "masked_lm":
        return not str(sample.get("text", "")).strip()
    return not str(sample.get("question", "")).strip() or not str(sample.get("answer", "")).strip()


def blank_rows(source: DataSource, workspace: str | Path, *, task: str, limit: int) -> tuple[list[int], int]:
    """(numbers of the blank rows, rows read) among the first `limit` rows of `source` (D008); the numbers
    are the ones a user finds in the file (row_unit: the 1-based line for jsonl, txt and csv)."""
    path, fmt = resolve_path(source, workspace)
    fields = field_map(source, task)
    found, rows = [], 0
    for rows, (number, _, row) in enumerate(iter_numbered_rows(path, fmt, limit), start=1):
        if any(is_blank(sample, task) for sample in row_samples(row, fields, task, base=path.parent)):
            found.append(number)
        if rows >= limit:
            break
    return found, rows


class SourceDataset(Dataset[dict[str, Any]]):
    """One data source as a map-style dataset; pickles as path + field map + length, reloads per process."""

    def __init__(self, source: DataSource, workspace: str | Path, *, task: str):
        self.path, self.format = resolve_path(source, workspace)
        self.fields = field_map(source, task)
        self.task = task
        self.max_samples = source.max_samples
        self.length = self._load()

    def _load(self) -> int:
        """Build this process's index: line offsets for jsonl/txt, the samples themselves otherwise.
        Blank samples (D008) are left out and their numbers in the file (row_unit) kept for the report."""
        offsets, pair_index, samples = array("q"), array("l"), []
        self.blank_rows: list[int] = []
        for number, offset, row in iter_numbered_rows(self.path, self.format):
            found = row_samples(row, self.fields, self.task, base=self.path.parent)
            for index, sample in enumerate(found):
                if is_blank(sample, self.task):
                    self.blank_rows.append(number)
                    continue
                if offset >= 0:
                    offsets.append(offset)
                    pair_index.append(index)
                else:
                    samples.append(sample)
            if self.max_samples and max(len(offsets), len(samples)) >= self.max_samples:
                break
        self._offsets, self._pair_index, self._samples = offsets, pair_index, samples
        self._handle: io.BufferedReader | None = None
        self._pid = os.getpid()
        count = len(offsets) if offsets else len(samples)
        return min(count, self.max_samples) if self.max_samples else count

    def __getstate__(self) -> dict[str, Any]:
        # Only what is cheap: the receiving process rebuilds the index on first access (R3).
        skip = ("_offsets", "_pair_index", "_samples", "blank_rows")
        state = {k: v for k, v in self.__dict__.items() if k not in skip}
        state["_handle"] = None
        state["_pid"] = None
        state["blank_rows"] = []  # the parent reports them (D008); a reader rebuilds them with its index
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> dict[str, Any]:
        if self._pid != os.getpid():
            expected = self.length
            found = self._load()
            if found != expected:
                # The parent indexed `expected` samples; this process (a rank or a loader worker that
                # received the pickled dataset) found another number: what R3's empty copies looked like.
                raise DataSourceError(
                    "D004",
                    f"{self.path.name} had {expected} samples in the process that built the dataset but "
                    f"{found} in process {os.getpid()}: the dataset did not arrive intact (or the file changed)",
                )
        if not 0 <= index < self.length:
            raise IndexError(index)
        if self._samples:
            sample = self._samples[index]
        else:
            if self._handle is None:
                self._handle = self.path.open("rb")
            self._handle.seek(self._offsets[index])
            row = _parse_line(self._handle.readline().strip(), self.format, self.path, index + 1)
            sample = row_samples(row, self.fields, self.task, base=self.path.parent)[self._pair_index[index]]
        if is_blank(sample, self.task):
            raise DataSourceError(
                "D004",
                f"example {index} of {self.path.name} was not blank when indexed but is empty in process "
                f"{os.getpid()} (the file changed under the run?)",
            )
        return sample


def open_dataset(source: DataSource, workspace: str | Path, *, task: str) -> SourceDataset:
    """Open one source for training; raises DataSourceError when it does not match the recipe."""
    dataset = SourceDataset(source, workspace, task=task)
    if len(dataset) == 0:
        blank = f" ({len(dataset.blank_rows)} blank rows left out, D008)" if dataset.blank_rows else ""
        raise DataSourceError("D007", f"{dataset.path} has no samples{blank}")
    return dataset


def open_training_data(
    sources: Sequence[DataSource], workspace: str | Path, *, task: str
) -> ConcatDataset[dict[str, Any]]:
    """All sources of a recipe's data.train (or data.eval) mixed into one dataset."""
    return ConcatDataset([open_dataset(source, workspace, task=task) for source in sources])
