"""One recipe data source opened with Hugging Face `datasets`: files, Hub snapshot layouts, splits, hub ids.

Public API (worker/train/data.py and host preflight use it):
    open_source(source, workspace, *, streaming=False) -> datasets.Dataset | datasets.IterableDataset
        The split the source names, as Arrow (memory-mapped, cached under HF_DATASETS_CACHE) or streamed.
        Image columns come undecoded ({bytes, path} structs): the collator decodes them, so a broken image
        is reported with its row instead of failing the whole load.
    source_base(source, workspace) -> Path: the folder relative image paths are resolved against.
    local_path(source, workspace) -> Path
    with_auto_streaming(recipe, workspace) -> Recipe: sources whose local files total more than the
        worker's threshold (FLIGHTDECK_STREAMING_ABOVE_MB, default 16384: 16 GiB) marked "streaming";
        the host preflight and every rank apply it alike, so D009 asks for max_steps before launch.

What `datasets` resolves, and so what a path may be: a single jsonl/json/csv/parquet/arrow/txt file; a
directory as `huggingface-cli download --repo-type dataset` leaves it (`data/train-00000-of-00002.parquet`
shards, `train/` folders, `train.jsonl`/`val.jsonl` named after splits, a README's configs); a
directory `save_to_disk` wrote (dataset_dict.json or state.json); or a hub id (`org/name`) when the worker
is online.
"""

from __future__ import annotations

import difflib
import json
import os
import re
from pathlib import Path
from typing import Any

from flightdeck.recipe.schema import DataSource, Recipe
from flightdeck.worker.path_confinement import is_hub_id
from flightdeck.worker.train.data_errors import DataSourceError

# The `datasets` builder for each file format a recipe may name.
BUILDERS = {
    "jsonl": "json",
    "json": "json",
    "csv": "csv",
    "parquet": "parquet",
    "arrow": "arrow",
    "txt": "text",
}
EXTENSIONS = {
    ".jsonl": "jsonl",
    ".json": "json",
    ".csv": "csv",
    ".parquet": "parquet",
    ".arrow": "arrow",
    ".txt": "txt",
}
# Compressed files `datasets` decompresses as it reads them (the standard library's codecs): their
# format is the extension before (qa.jsonl.gz is jsonl).
COMPRESSIONS = (".gz", ".bz2", ".xz")


def is_compressed(path: Path) -> bool:
    return path.suffix.lower() in COMPRESSIONS


def format_of(path: Path, given: str | None = None) -> str | None:
    """The source's format: as given, else by the file's extension (under a compression's)."""
    if given:
        return given
    suffix = Path(path.stem).suffix if is_compressed(path) else path.suffix
    return EXTENSIONS.get(suffix.lower())


# Names users give one split and datasets files under another (`val.jsonl` is the split 'validation').
SPLIT_ALIASES = {
    "validation": ("val", "valid", "dev"),
    "val": ("validation", "valid", "dev"),
    "valid": ("validation", "val"),
    "dev": ("validation", "val"),
    "test": ("eval",),
    "eval": ("test", "validation", "val"),
}
_OFFLINE_VARIABLES = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")
# Above this many MB of local files a source is streamed, not converted to Arrow: converting a corpus
# that large costs hours and twice its size on disk before the first step (docs/recipe.md).
STREAMING_ABOVE_VARIABLE = "FLIGHTDECK_STREAMING_ABOVE_MB"
DEFAULT_STREAMING_ABOVE_MB = 16384.0
SNAPSHOT_FIX = (
    "point the source's path at the data file itself, or at a directory laid out as the Hub keeps datasets "
    "(data/<split>-*.parquet, <split>/ folders, files named after splits) or written by save_to_disk"
)


def _quiet() -> None:
    """No progress bars in run logs: one line per 1,000 rows of a 14.7M-line corpus is noise."""
    import datasets

    datasets.disable_progress_bars()
    datasets.logging.set_verbosity_error()


def local_path(source: DataSource, workspace: str | Path) -> Path:
    path = Path(source.path)
    return path if path.is_absolute() else Path(workspace) / path


def source_base(source: DataSource, workspace: str | Path) -> Path:
    """Relative image paths in a row are relative to the dataset file (or the snapshot directory)."""
    path = local_path(source, workspace)
    return path if path.is_dir() else path.parent


def streaming_above_bytes() -> float:
    """The worker's auto-streaming threshold in bytes (FLIGHTDECK_STREAMING_ABOVE_MB)."""
    value = os.environ.get(STREAMING_ABOVE_VARIABLE, "").strip()
    if not value:
        return DEFAULT_STREAMING_ABOVE_MB * 2**20
    try:
        megabytes = float(value)
    except ValueError:
        megabytes = -1.0
    if not megabytes > 0:
        raise DataSourceError(
            "D012",
            f"{STREAMING_ABOVE_VARIABLE}={value[:16]!r} on this worker is not a positive number of MB",
            fix=f"set {STREAMING_ABOVE_VARIABLE} on the worker to the source size in MB above which data is "
            f"streamed (default {DEFAULT_STREAMING_ABOVE_MB:.0f}), or unset it",
        )
    return megabytes * 2**20


def source_bytes(source: DataSource, workspace: str | Path) -> int | None:
    """The size of the source's local files (a directory's files summed); None for a hub id or a path
    that is not there (the loader reports those)."""
    path = local_path(source, workspace)
    try:
        if path.is_file():
            return path.stat().st_size
        if path.is_dir():
            return sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and ".cache" not in f.parts)
    except OSError:
        return None
    return None


def auto_streamed(source: DataSource, workspace: str | Path) -> bool:
    """True for a source not marked "streaming" whose local files exceed the worker's threshold."""
    size = source_bytes(source, workspace)
    return not source.streaming and size is not None and size > streaming_above_bytes()


def with_auto_streaming(recipe: Recipe, workspace: str | Path) -> Recipe:
    """`recipe` with every source above the threshold marked "streaming" (the same recipe if none)."""
    data = recipe.data

    def marked(sources: list[DataSource]) -> list[DataSource]:
        return [
            s.model_copy(update={"streaming": True}) if auto_streamed(s, workspace) else s for s in sources
        ]

    train, evaluation = marked(data.train), marked(data.eval)
    if train == data.train and evaluation == data.eval:
        return recipe
    return recipe.model_copy(update={"data": data.model_copy(update={"train": train, "eval": evaluation})})


def open_source(source: DataSource, workspace: str | Path, *, streaming: bool = False) -> Any:
    """The source's split as a `datasets` Dataset (or IterableDataset when streaming)."""
    _quiet()
    path = local_path(source, workspace)
    if path.is_dir():
        if (path / "dataset_dict.json").is_file() or (path / "state.json").is_file():
            dataset = _saved_to_disk(path, source.split)
            dataset = dataset.to_iterable_dataset() if streaming else dataset
        else:
            dataset = _snapshot(path, source.split, streaming, source.path)
    elif path.exists():
        dataset = _single_file(path, source.format, streaming)
    elif is_hub_id(source.path, workspace) and not _meant_local(path):
        dataset = _hub(source.path, source.split, streaming)
    else:
        raise _missing_file(path, source.path)
    return _undecoded_images(dataset)


def _meant_local(path: Path) -> bool:
    """An `org/name` that is a missing local file, not a Hub id: a data file's extension (a typo of
    data/train.jsonl), or an `org` that is a folder of the workspace (hdata/train.parqet)."""
    return format_of(path) is not None or path.parent.is_dir()


def _nearest_file(name: str, beside: list[str]) -> list[str]:
    """The file beside that `name` most likely meant, as a list of none or one: of the names close as a
    whole, the one whose stem (the name before its first dot) is closest. A whole name weighs the
    extension as much as the stem, so `qa_typo.jsonl` came nearer `chat.jsonl` than `qa.jsonl.gz`."""
    close = difflib.get_close_matches(name, beside, n=max(1, len(beside)), cutoff=0.6)
    stem = name.split(".", 1)[0]
    ranked = sorted(close, key=lambda c: -difflib.SequenceMatcher(None, stem, c.split(".", 1)[0]).ratio())
    return ranked[:1]


def _missing_file(path: Path, given: str) -> DataSourceError:
    """A data path that is not there, with the nearest names beside it (a typo's likely target)."""
    try:
        beside = [entry.name for entry in path.parent.iterdir()] if path.parent.is_dir() else []
    except OSError:
        beside = []
    near = _nearest_file(path.name, beside)
    hint = f"; did you mean '{str(Path(given).parent / near[0]).removeprefix('./')}'?" if near else ""
    fix = (
        f"set the source's path to '{str(Path(given).parent / near[0]).removeprefix('./')}'"
        if near
        else "put the file (or the dataset's directory) in the workspace and give its path relative to "
        "the workspace, or an absolute path on the worker"
    )
    return DataSourceError("D012", f"data file {given} does not exist{hint}", fix=fix)


def _undecoded_images(dataset: Any) -> Any:
    """Image features as {bytes, path} structs: decoded later, per sample, with the row named on failure."""
    from datasets import Image, List, Sequence

    features = dataset.features or {}
    for name, feature in features.items():
        if isinstance(feature, Image) and feature.decode:
            dataset = dataset.cast_column(name, Image(decode=False))
        # TRL's vision chat sets: an `images` column that is a list of images, one per {"type": "image"}.
        inner = feature.feature if isinstance(feature, (List, Sequence)) else None
        if isinstance(inner, Image) and inner.decode:
            dataset = dataset.cast_column(name, type(feature)(Image(decode=False)))
    return dataset


def _load(builder: str, data_files: Any, split: str, streaming: bool, where: Path) -> Any:
    from datasets import load_dataset

    try:
        return load_dataset(builder, data_files={split: data_files}, split=split, streaming=streaming)
    except Exception as exc:  # datasets wraps every reader's error (DatasetGenerationError and others)
        raise unreadable(where, exc, json_lines=builder == "json") from exc


def _single_file(path: Path, given_format: str | None, streaming: bool) -> Any:
    fmt = format_of(path, given_format)
    if fmt is None:
        raise DataSourceError(
            "D012",
            f"cannot tell the format of {path.name} from its extension",
            fix=f"set the source's 'format' ({', '.join(BUILDERS)}) or give the file one of those extensions",
        )
    return _load(BUILDERS[fmt], str(path), "train", streaming, path)


def unreadable(path: Path, exc: Exception, *, json_lines: bool = False) -> DataSourceError:
    """A file `datasets` could not read (when opened, or when a stream's rows are read). The reader's own
    message may quote the file's content, so only its type is named; for JSON lines (by format or by
    extension) the first bad line is found and named with its byte offset."""
    cause = exc.__cause__ or exc
    json_lines = json_lines or path.suffix.lower() in (".jsonl", ".json")
    where = _first_bad_json_line(path) if path.is_file() and json_lines and not is_compressed(path) else None
    detail = f": {where}" if where else f" ({type(cause).__name__})"
    if where:
        fix = f"make every line of {path.name} one JSON object (a jsonl file), or fix the line named"
    elif path.is_dir():
        fix = SNAPSHOT_FIX
    else:
        fix = (
            f"check that {path.name} is a complete file of the format its extension says (or set the source's "
            "'format'); rewrite it with the tool that made it"
        )
    return DataSourceError("D012", f"{path.name} cannot be read as a dataset{detail}", fix=fix)


def _first_bad_json_line(path: Path) -> str | None:
    """'line N (byte offset B) is not a JSON object' for the first line of a jsonl file that is not one."""
    offset = 0
    with path.open("rb") as handle:
        for number, raw in enumerate(handle, start=1):
            line = raw.strip()
            if line:
                try:
                    ok = isinstance(json.loads(line), dict)
                except ValueError:
                    ok = False
                if not ok:
                    return f"line {number} (byte offset {offset}) is not a JSON object"
            offset += len(raw)
    return None


def _saved_to_disk(path: Path, split: str | None) -> Any:
    from datasets import DatasetDict, load_from_disk

    saved = load_from_disk(str(path))
    if not isinstance(saved, DatasetDict):
        return saved
    return saved[_pick_split(split, {name: [name] for name in saved}, path)]


def _snapshot(path: Path, split: str | None, streaming: bool, given: str) -> Any:
    """A directory laid out the way the Hub keeps datasets: the builder and data files `datasets` infers."""
    from datasets import load_dataset_builder

    try:
        builder = load_dataset_builder(str(path))
    except Exception as exc:
        several = _configurations(path, given)
        if several:
            raise several from exc
        raise DataSourceError(
            "D012",
            f"{path} holds no data files datasets can read (jsonl, json, csv, parquet, arrow, txt, or a "
            f"save_to_disk directory) ({type(exc).__name__})",
            fix=SNAPSHOT_FIX,
        ) from exc
    files = {str(name): list(found) for name, found in (builder.config.data_files or {}).items()}
    name = _pick_split(split, files, path)
    return _load(builder.name, files[name], name, streaming, path)


def _configurations(path: Path, given: str) -> DataSourceError | None:
    """The error for a snapshot whose README declares several configurations (subsets) and no default: a
    recipe names one by pointing at its files' folder (a source has no configuration field)."""
    from datasets import get_dataset_config_names, load_dataset_builder

    try:
        names = get_dataset_config_names(str(path))
        if len(names) < 2:
            return None
        files = load_dataset_builder(str(path), names[0]).config.data_files or {}
        first = Path(next(iter(next(iter(files.values())))))
        folder = first.parent.relative_to(path.resolve())
    except Exception:  # not a configured snapshot, or one laid out otherwise: the caller's error stands
        return None
    return DataSourceError(
        "D012",
        f"{given} holds {len(names)} configurations ({', '.join(names[:8])}) and none is the default",
        fix=f"point the source's path at one configuration's files, e.g. {given.rstrip('/')}/{folder} for "
        f"'{names[0]}' (its README's data_files say where each one's files are)",
    )


def _names_in_files(files: list[str], root: Path) -> set[str]:
    """The split names a user sees in the file names: 'val' for val.jsonl, data/val-00000-of-00001.parquet
    and val/part-0.csv."""
    names = set()
    for file in files:
        try:
            parts = Path(file).relative_to(root).parts
        except ValueError:
            continue
        if len(parts) > 1 and parts[0] != "data":
            names.add(parts[0])
        stem = Path(parts[-1]).name.split(".")[0]
        names.add(re.split(r"[-_]", stem)[0])
    return names


def _pick_split(requested: str | None, files: dict[str, list[str]], root: Path) -> str:
    """The split the recipe names, as datasets names it or as its files are named; D003 otherwise."""
    splits = list(files)
    if requested is None:
        if "train" in splits or len(splits) == 1:
            return "train" if "train" in splits else splits[0]
        raise DataSourceError(
            "D003",
            f"{root} holds several splits ({', '.join(splits)}) and none is 'train'",
            available_splits=splits,
            fix=f"set the source's 'split' to one of: {', '.join(splits)}",
        )
    if requested in splits:
        return requested
    named = [split for split in splits if requested in _names_in_files(files[split], root)]
    if len(named) == 1:
        return named[0]
    near = [name for name in SPLIT_ALIASES.get(requested, ()) if name in splits]
    near += difflib.get_close_matches(requested, splits, n=1, cutoff=0.5)
    hint = f"; did you mean '{near[0]}'?" if near else ""
    fix = (
        f"set the source's 'split' to '{near[0]}'"
        if near
        else f"set the source's 'split' to one of: {', '.join(splits)}"
        if splits
        else "point the source's path at a file or directory that holds the split's data files"
    )
    raise DataSourceError(
        "D003",
        f"split '{requested}' not found in {root}; splits that exist: {', '.join(splits) or 'none'}{hint}",
        available_splits=splits,
        fix=fix,
    )


def _offline() -> str | None:
    return next(
        (name for name in _OFFLINE_VARIABLES if os.environ.get(name, "").lower() in ("1", "true", "yes")),
        None,
    )


def _hub(dataset_id: str, split: str | None, streaming: bool) -> Any:
    from datasets import load_dataset

    variable = _offline()
    if variable is not None:
        raise DataSourceError(
            "D012",
            f"'{dataset_id}' is not a path in the workspace, so it would be a Hugging Face Hub dataset, but "
            f"this worker is offline ({variable}=1)",
            fix="download it where the network is reachable "
            f"(`huggingface-cli download --repo-type dataset {dataset_id} --local-dir data/{dataset_id.split('/')[-1]}`) "
            f"and point the source's path at that directory, or run the worker with {variable} unset",
        )
    try:
        return load_dataset(dataset_id, split=split or "train", streaming=streaming)
    except ValueError as exc:  # datasets: 'Unknown split "val". Should be one of [...]'
        raise DataSourceError(
            "D003", f"{dataset_id}: {str(exc)[:300]}", fix="set the source's 'split' to one the message names"
        ) from exc
    except Exception as exc:
        raise DataSourceError(
            "D012",
            f"the Hub dataset '{dataset_id}' cannot be loaded ({type(exc).__name__})",
            fix="check the dataset id and that the worker reaches the Hub (and has a token for a gated "
            "dataset), or download it and point the source's path at the directory",
        ) from exc
