"""Masked-LM texts tokenised once into the cache (pretokenize): the ids are exactly the tokenizer's own
call's, whether the Rust tokenizer is called directly or the corpus is split over tokenising processes."""

from __future__ import annotations

from pathlib import Path

import pytest

from flightdeck.recipe.schema import DataSource
from flightdeck.worker.train import data
from flightdeck.worker.train.data import open_dataset, pretokenize

# Long lines (truncated), non-ASCII, digits, leading spaces, blank lines (D008: no sample).
TEXTS = [
    "bar",
    "the market share of region 7",
    "",
    " growth rate " * 40,
    "Umsatzwachstum über 12 % – 売上高",
    "   ",
    "index 12345678901234567890",
]


def _corpus(tmp_path: Path, lines: int) -> Path:
    """TEXTS in turn, each numbered; the blank ones as empty lines."""
    corpus = tmp_path / "corpus.txt"
    rows = (TEXTS[i % len(TEXTS)] for i in range(lines))
    corpus.write_text("".join(f"{text} {i}\n" if text.strip() else "\n" for i, text in enumerate(rows)))
    return corpus


@pytest.mark.parametrize("arch", ["bert", "llama"])
def test_token_ids_are_the_tokenizers_own_call_and_leave_its_settings_alone(
    workspace: Path, tmp_path: Path, arch: str
) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(workspace / "models" / f"tiny-{arch}")
    # A tokenizer.json saved with padding on (many Hub tokenizers are): the ids must still not be padded.
    tokenizer.backend_tokenizer.enable_padding(pad_id=tokenizer.pad_token_id or 0, length=64)
    corpus = _corpus(tmp_path, 60)
    texts = [line for line in corpus.read_text().splitlines() if line.strip()]
    dataset = open_dataset(DataSource(path=str(corpus), preset="text"), tmp_path, task="masked_lm")
    pretokenize(dataset, tokenizer, max_seq_length=24)
    ids = [dataset[i]["input_ids"] for i in range(len(dataset))]
    # The caller's tokenizer (the collator's) keeps its own settings: no truncation left on, padding kept.
    assert tokenizer.backend_tokenizer.truncation is None
    assert tokenizer.backend_tokenizer.padding["length"] == 64
    tokenizer.backend_tokenizer.no_padding()
    assert ids == tokenizer(texts, truncation=True, max_length=24)["input_ids"]
    assert max(map(len, ids)) == 24 and min(map(len, ids)) < 24  # truncated, and not padded


def test_a_large_corpus_is_tokenised_by_several_processes_into_the_same_ids(
    workspace: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(workspace / "models" / "tiny-bert")
    corpus = _corpus(tmp_path, 600)
    texts = [line for line in corpus.read_text().splitlines() if line.strip()]
    # 600 rows stand for a large corpus, on a host with two cores.
    monkeypatch.setattr(data, "ROWS_PER_TOKENIZING_PROCESS", 200)
    monkeypatch.setattr(data.os, "cpu_count", lambda: 2)
    source = DataSource(path=str(corpus), preset="text")
    dataset = open_dataset(source, tmp_path, task="masked_lm")
    pretokenize(dataset, tokenizer, max_seq_length=16)
    files = [f["filename"] for f in dataset.samples.cache_files]
    assert len(files) == 2  # one file per tokenising process, read back as one dataset, in order
    assert dataset.samples["input_ids"] == tokenizer(texts, truncation=True, max_length=16)["input_ids"]
    again = open_dataset(source, tmp_path, task="masked_lm")
    pretokenize(again, tokenizer, max_seq_length=16)
    assert [f["filename"] for f in again.samples.cache_files] == files  # a second rank reuses them


def test_tokenising_processes_follow_the_cores_and_the_corpus_size(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(data.os, "cpu_count", lambda: 16)
    # A rank bound to one core counts the host's: every rank must name the cache files alike.
    monkeypatch.setattr(data.os, "sched_getaffinity", lambda pid: {0}, raising=False)
    assert data.tokenizing_processes(400_000) is None  # small: tokenised in this process
    assert data.tokenizing_processes(1_500_000) == 3
    assert data.tokenizing_processes(14_700_000) == 16  # R3's corpus: every core
