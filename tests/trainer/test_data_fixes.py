"""Every data error carries its fix in a field of its own (the failure's fix, `flightdeck show`'s fix
column), not only inside its message: one case per place a data error is built, with the data that
raises it; and the fix survives the text a DataLoader worker's error crosses into the main process as."""

from __future__ import annotations

import ast
import gzip
import json
import pickle
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from flightdeck.preflight.environment_rules import capped_sequence
from flightdeck.recipe import parse_recipe
from flightdeck.recipe.schema import DataSource
from flightdeck.worker.train.chat import tokenize_chat
from flightdeck.worker.train.collate import check_not_empty, tokenize_causal
from flightdeck.worker.train.data import PRESET_FIELDS, open_dataset, row_samples
from flightdeck.worker.train.data_errors import DataSourceError
from flightdeck.worker.train.data_sources import STREAMING_ABOVE_VARIABLE, open_source, streaming_above_bytes
from flightdeck.worker.train.image_text import load_image

REPO = Path(__file__).resolve().parents[2]


def _rows(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def _open(tmp: Path, path: str, **source: Any) -> Callable[[], Any]:
    return lambda: open_source(DataSource(path=path, **source), tmp)


def _chat(value: Any, preset: str = "messages") -> Callable[[], Any]:
    column = PRESET_FIELDS[preset]["messages"]
    return lambda: row_samples({column: value}, PRESET_FIELDS[preset], "causal_lm")


class _NoTemplate:
    chat_template = None


def _write_data(tmp: Path) -> None:
    """The files the cases read, each broken in its own way."""
    _rows(tmp / "qa.jsonl", [{"question": "q", "answer": "a"}])
    (tmp / "rows.dat").write_text("x\n")
    (tmp / "bad.jsonl").write_text('{"question": "q"}\nnot json\n')
    (tmp / "bad.parquet").write_bytes(b"PAR1 not really a parquet file")
    (tmp / "empty-dir").mkdir()
    (tmp / "empty-dir" / "notes.md").write_text("nothing here\n")
    for split in ("val", "test"):
        _rows(tmp / "two-splits" / f"{split}.jsonl", [{"question": "q", "answer": "a"}])
    _rows(tmp / "mine" / "chat.jsonl", [{"messages": []}])
    (tmp / "mine" / "qa.jsonl.gz").write_bytes(gzip.compress(b'{"question": "q", "answer": "a"}\n'))
    (tmp / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n not an image")
    # A Hub snapshot with two configurations (subsets) in its README and no default, as the Hub keeps them.
    for name in ("en", "fr"):
        (tmp / "subsets" / name).mkdir(parents=True)
        pq.write_table(
            pa.table({"question": ["q"], "answer": ["a"]}),
            tmp / "subsets" / name / "train-00000-of-00001.parquet",
        )
    (tmp / "subsets" / "README.md").write_text(
        "---\nconfigs:\n"
        + "".join(
            f"- config_name: {name}\n  data_files:\n  - split: train\n    path: {name}/train-*.parquet\n"
            for name in ("en", "fr")
        )
        + "---\n"
    )


def _cases(tmp: Path) -> dict[str, tuple[Callable[[], Any], str | None, str]]:
    """name -> (what raises, the code, the start of its fix)."""
    return {
        "D001 columns of another preset": (
            lambda: row_samples(
                {"query": "q", "label": ["a"]}, {"question": "question", "answer": "answer"}, "causal_lm"
            ),
            "D001",
            "these columns are the 'chartqa' preset's: set the source's \"preset\": \"chartqa\"",
        ),
        "D001 TRL's prompt-completion columns": (
            lambda: row_samples(
                {"prompt": "2+2=", "completion": "4"},
                {"question": "question", "answer": "answer"},
                "causal_lm",
            ),
            "D001",
            "these columns are the 'prompt_completion' preset's: set the source's \"preset\": "
            '"prompt_completion"',
        ),
        "D001 a tab-separated file read as csv": (
            lambda: row_samples(
                {"question\tanswer": "q\ta"}, {"question": "question", "answer": "answer"}, "causal_lm"
            ),
            "D001",
            "the file looks tab-separated",
        ),
        "D001 chat turns not a list": (_chat(5), "D001", "write each row's turns as a list of"),
        "D001 chat turn not an object": (_chat(["hi"]), "D001", "write each row's turns as a list of"),
        "D001 chat turn without role or from": (_chat([{"speaker": "x"}]), "D001", "write each row's turns"),
        "D001 sharegpt speaker unknown": (
            _chat([{"from": "bot", "value": "x"}], "sharegpt"),
            "D001",
            "rename the speaker to one of human",
        ),
        "D001 prompt_template names a missing field": (
            lambda: tokenize_causal(
                {"question": "q", "answer": "a"}, None, prompt_template="{instruction}", max_seq_length=8
            ),
            "D001",
            "use only these names in data.prompt_template",
        ),
        "D001 image of no known kind": (lambda: load_image(5, row=4), "D001", "give the image column a path"),
        "D002 questions and answers do not pair": (
            lambda: row_samples(
                {"questions": ["a", "b"], "answers": ["x"]}, PRESET_FIELDS["ocrvqa"], "causal_lm"
            ),
            "D002",
            "give every question of a row its answer",
        ),
        "D003 several splits, none train": (
            _open(tmp, "two-splits"),
            "D003",
            "set the source's 'split' to one of: ",
        ),
        "D003 a near split name": (
            _open(tmp, "two-splits", split="dev"),
            "D003",
            "set the source's 'split' to 'validation'",
        ),
        "D003 no near split name": (
            _open(tmp, "two-splits", split="xyz"),
            "D003",
            "set the source's 'split' to one of:",
        ),
        "D004 an example arrived empty": (lambda: check_not_empty({}, ("text",)), "D004", "load the dataset"),
        "D008 a blank example": (
            lambda: check_not_empty({"text": " "}, ("text",)),
            "D008",
            "fill in or remove",
        ),
        "D008 image bytes that do not decode": (
            lambda: load_image(b"not an image", row=3),
            "D008",
            "row 3: store a complete PNG or JPEG",
        ),
        "D008 a missing image file": (
            lambda: load_image(str(tmp / "imgs" / "nope.png"), row=2),
            "D008",
            "row 2: put 'nope.png' where the row's image path points",
        ),
        "D008 an image file that does not decode": (
            lambda: load_image(str(tmp / "broken.png"), row=1),
            "D008",
            "row 1: replace 'broken.png' with a complete PNG or JPEG",
        ),
        "D010 a model without a chat template": (
            lambda: tokenize_chat({"messages": "[]"}, _NoTemplate(), max_seq_length=8),
            "D010",
            "use a model whose tokenizer_config.json (or chat_template.jinja) has a chat template",
        ),
        "no such data file": (_open(tmp, "data/missing.jsonl"), "D012", "put the file"),
        # Shaped like a Hub id (org/name) but with a data file's extension: a typo, named as one.
        "a typo of a data file's name": (
            _open(tmp, "two-splits/vla.jsonl"),
            "D012",
            "set the source's path to 'two-splits/val.jsonl'",
        ),
        # The stem says which file: the whole name came nearer chat.jsonl (its extension the same).
        "a typo of a data file's name beside files of other kinds": (
            _open(tmp, "mine/qa_typo.jsonl"),
            "D012",
            "set the source's path to 'mine/qa.jsonl.gz'",
        ),
        # Not a data file's extension, but its folder is the workspace's: a typo too, not a Hub id.
        "a typo of a data file's extension": (
            _open(tmp, "two-splits/val.jsnl"),
            "D012",
            "set the source's path to 'two-splits/val.jsonl'",
        ),
        "a format not told by the extension": (_open(tmp, "rows.dat"), "D012", "set the source's 'format'"),
        "a jsonl line that is not JSON": (
            _open(tmp, "bad.jsonl"),
            "D012",
            "make every line of bad.jsonl one JSON",
        ),
        "a file that is not what its extension says": (
            _open(tmp, "bad.parquet"),
            "D012",
            "check that bad.parquet is a complete file",
        ),
        "a snapshot of several configurations": (
            _open(tmp, "subsets"),
            "D012",
            "point the source's path at one configuration's files, e.g. subsets/en for 'en'",
        ),
        "a directory without data files": (
            _open(tmp, "empty-dir"),
            "D012",
            "point the source's path at the data",
        ),
        "a hub id on an offline worker": (
            _open(tmp, "someone/chartqa"),
            "D012",
            "download it where the network is reachable (`huggingface-cli download",
        ),
    }


CASE_NAMES = list(_cases(Path("/nonexistent")))


@pytest.mark.parametrize("name", CASE_NAMES)
def test_each_data_error_has_its_fix_in_the_fix_field(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # the hub id's case: this worker is offline
    _write_data(tmp_path)
    raises, code, fix = _cases(tmp_path)[name]
    with pytest.raises(DataSourceError) as caught:
        raises()
    error = caught.value
    assert error.code == code, error
    assert error.fix is not None and error.fix.startswith(fix), error.fix
    assert fix not in error.message  # said once, in the fix field, not again in the message


def test_a_rows_error_found_while_converting_the_file_names_the_row(tmp_path: Path) -> None:
    """What the trainer finds past the host preflight's sample rows: the row to fix, and the fix."""
    rows = [{"questions": ["title?", "author?"], "answers": ["t", "a"]}] * 5
    rows[2] = {"questions": ["title?", "author?"], "answers": ["t"]}
    _rows(tmp_path / "ocr.jsonl", rows)
    with pytest.raises(DataSourceError) as caught:
        open_dataset(DataSource(path="ocr.jsonl", preset="ocrvqa"), tmp_path, task="causal_lm")
    assert caught.value.code == "D002" and caught.value.message.startswith("row 3: a row has 2 questions")
    assert caught.value.fix and caught.value.fix.startswith("give every question of a row its answer")


def test_the_trainers_blank_rows_warning_carries_its_fix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """D008 at run time (blank rows left out): the event rank 0 writes has the fix in its fix field."""
    from flightdeck.worker.train.data import open_training_data
    from flightdeck.worker.train.metrics_file import MetricsFile, read_metrics
    from flightdeck.worker.train.recipe_run import RecipeRun

    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    _rows(tmp_path / "qa.jsonl", [{"question": "q", "answer": "a"}, {"question": "q", "answer": ""}])
    recipe = parse_recipe(
        {"name": "x", "model": {"path": "m"}, "data": {"train": [{"path": "qa.jsonl"}], "num_workers": 0}}
    )
    (tmp_path / "recipe.json").write_text("{}")
    run = RecipeRun(tmp_path / "recipe.json")
    run.metrics = MetricsFile(tmp_path / "metrics.jsonl")
    run._report_data(open_training_data(recipe.data.train, tmp_path, task="causal_lm"), recipe)
    run.metrics.close()
    (event,) = [r for r in read_metrics(tmp_path / "metrics.jsonl") if r.get("code") == "D008"]
    assert "lines 2" in event["message"] and event["fix"].startswith("nothing stops the run"), event


def test_a_threshold_variable_that_is_no_number_has_a_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(STREAMING_ABOVE_VARIABLE, "lots")
    with pytest.raises(DataSourceError) as caught:
        streaming_above_bytes()
    assert caught.value.fix and caught.value.fix.startswith(f"set {STREAMING_ABOVE_VARIABLE} on the worker")


def test_d006_without_any_sequence_that_fits_has_a_fix() -> None:
    recipe = parse_recipe({"name": "x", "model": {"path": "m"}, "data": {"train": [{"path": "d.jsonl"}]}})
    (finding,) = capped_sequence(recipe, 4, "host")
    assert finding.code == "D006" and finding.severity == "error"
    assert finding.fix and finding.fix.startswith("use a model with a longer position table")


def test_the_fix_survives_the_text_a_loader_workers_error_crosses_as() -> None:
    """PyTorch re-raises a DataLoader worker's exception as `type(exc)(text)`, the text ending with the
    worker's traceback; pickle rebuilds from args alike. The fix must come back apart, not in the message."""
    try:
        raise DataSourceError(
            "D008", "row 3: image file 'x.png' does not exist", fix="row 3: put 'x.png' there"
        )
    except DataSourceError as exc:
        worker_text = "Caught DataSourceError in DataLoader worker process 0.\nOriginal " + "".join(
            traceback.format_exception(exc)
        )
        original = exc
    for rebuilt in (DataSourceError(worker_text), pickle.loads(pickle.dumps(original))):
        assert (rebuilt.code, rebuilt.message, rebuilt.fix) == (
            "D008",
            "row 3: image file 'x.png' does not exist",
            "row 3: put 'x.png' there",
        )
    plain = DataSourceError("Caught DataSourceError ...\nDataSourceError: D001: no field")
    assert (plain.code, plain.message, plain.fix) == ("D001", "no field", None)


# Where data errors are built: each with a message must give a fix (a new one without is caught here).
_ERROR_MODULES = [
    *sorted((REPO / "worker" / "train").glob("*.py")),
    REPO / "worker" / "host_preflight" / "data_rules.py",
]


def _calls_without_fix(path: Path) -> list[str]:
    missing = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.Call):
            continue
        name = node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", "")
        keywords = {k.arg for k in node.keywords}
        if name == "DataSourceError" and len(node.args) >= 2 and "fix" not in keywords:
            missing.append(f"{path.name}:{node.lineno}")
        coded = node.args and isinstance(node.args[0], ast.Constant) and str(node.args[0].value)[:1] in "DV"
        if name == "error" and coded and len(node.args) < 5 and "fix" not in keywords:
            missing.append(f"{path.name}:{node.lineno}")
    return missing


def test_every_data_error_is_built_with_a_fix() -> None:
    missing = [where for path in _ERROR_MODULES for where in _calls_without_fix(path)]
    assert missing == [], f"data errors built without a fix: {missing}"
