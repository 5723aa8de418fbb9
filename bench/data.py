"""Opening an R3-sized text corpus for masked-LM training: `datasets` (today) against the loader it replaced.

A generated corpus (14.7M lines by default, R3's size; `--lines` for a smaller one; never committed) is
opened the way the trainer opens it under 2 ranks x 2 DataLoader workers (spawned, as the trainer
spawns them): each rank builds its dataset (for `datasets`, local rank 0 first while the other waits,
as RecipeRun does), hands it pickled to 2 loader workers, and takes its first MLM batch through the
trainer's collator and the tiny BERT tokenizer, shuffled by the trainer's sampler (ShuffledIndices for
`datasets`; torch's RandomSampler, which the old trainer used, for the old loader). Measured for the
whole process tree (the ranks and their workers), sampled every 50 ms: peak RSS (shared memory-mapped
pages counted in every process that touched them), peak PSS (shared pages split between the processes:
the RAM the tree really holds), and PSS split into anonymous memory (each process's own heap) and
file-backed pages (mapped files: the Arrow files, libraries), from /proc/PID/smaps_rollup; and the time
from start to every rank's first batch. Baselines in the same command: the size of the corpus file, one
plain read of it, and each loader on a 1,000-line corpus (six interpreters importing torch cost far
more than the data; the corpus's own cost is a run's figures less its loader's baseline).

The old loader is the previous commit's worker/train/data.py (`--old-commit`, read with `git show`),
imported from a temporary file: it is reachable only from here. `datasets` runs twice: with an empty
cache (`cold`: converting and tokenising included) and again on that cache (`warm`, what a second rank
set, attempt or job on the host sees). `streaming` is the source read as a stream (`"streaming": true`,
or automatically above FLIGHTDECK_STREAMING_ABOVE_MB; the output says whether this corpus is): nothing
converted or tokenised ahead, the loader workers tokenise each batch.

    python -m bench.data                       # 14.7M lines (about 900 MB of text; the cold run is long)
    python -m bench.data --lines 200000        # a quick run
    python -m bench.data --variants streaming,old,warm --work-dir W   # warm on the cache a cold run left in W
"""

from __future__ import annotations

import importlib.util
import json
import multiprocessing as mp
import os
import queue
import random
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Annotated, Any

import typer

from bench.harness import run_cli, write_results

R3_LINES = 14_700_000
OLD_COMMIT = "de17649"
_WORDS = [
    "the",
    "of",
    "chart",
    "value",
    "bar",
    "line",
    "year",
    "total",
    "market",
    "share",
    "growth",
    "rate",
    "index",
    "price",
    "region",
    "sales",
]


def write_corpus(path: Path, lines: int, *, seed: int = 0) -> None:
    """`lines` lines of 6-14 words, a blank line every 1,000 (R3's corpus had some)."""
    rng = random.Random(seed)
    with path.open("w", encoding="utf-8") as handle:
        for index in range(lines):
            if index % 1000 == 999:
                handle.write("\n")
                continue
            handle.write(" ".join(rng.choices(_WORDS, k=rng.randint(6, 14))) + f" {index}\n")


def _old_loader(commit: str, directory: Path) -> Path:
    """The previous commit's loader as a file (the benchmark's own copy; nothing else can import it)."""
    source = subprocess.run(
        ["git", "show", f"{commit}:worker/train/data.py"], capture_output=True, text=True, check=True
    ).stdout
    path = directory / "old_data_loader.py"
    path.write_text(_current_imports(source), encoding="utf-8")
    return path


# The old loader predates the one import name (`service.recipe...`, then `flightdeck.service.recipe...`);
# its imports are pointed at where those modules live now (the pure half moved to `flightdeck.*`).
_PURE = r"(recipe|preflight|memory|launch|contracts|inventory|statuses)"


def _current_imports(source: str) -> str:
    source = re.sub(rf"\b(?:flightdeck\.)?service\.{_PURE}\b", r"flightdeck.\1", source)
    return re.sub(r"(?<![\w.])(service|worker|cli)\.", r"flightdeck.\1.", source)


def _import_old(path: str) -> Any:
    """The old loader, importable by name in this process and in the loader workers it spawns (a pickled
    dataset names its class by module): its folder goes on sys.path and PYTHONPATH."""
    folder = str(Path(path).parent)
    if folder not in sys.path:
        sys.path.insert(0, folder)
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (folder, os.environ.get("PYTHONPATH")) if p)
    return importlib.import_module(Path(path).stem)


# R3's set-up: 2 ranks x 2 DataLoader workers, each worker sent the dataset pickled.
LOADER_WORKERS = 2


def _rank(
    rank: int,
    loader: str,
    corpus: str,
    tokenizer_dir: str,
    workers: int,
    barrier: Any,
    ready: Any,
    done: Any,
) -> None:
    """One 'rank': open the dataset, pickle it to `workers` spawned loader workers, take the first batch."""
    import torch
    from transformers import AutoTokenizer

    from flightdeck.recipe.schema import DataSource
    from flightdeck.worker.train.collate import MaskedLMCollator

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    sources = [DataSource(path=corpus, preset="text", streaming=loader == "streaming")]
    collate = MaskedLMCollator(tokenizer, max_seq_length=64)
    if loader == "streaming":
        _first_streamed_batch(rank, sources, tokenizer, collate, workers, ready, done)
        return
    if loader == "datasets":
        from flightdeck.worker.train.data import open_training_data

        if rank != 0:
            barrier.wait()
        dataset = open_training_data(sources, "/", task="masked_lm", tokenizer=tokenizer, max_seq_length=64)
        if rank == 0:
            barrier.wait()
    else:
        dataset = _import_old(loader).open_training_data(sources, "/", task="masked_lm")
    if loader == "datasets":  # the trainer's sampler (MeteredTrainer); the old trainer used RandomSampler
        from flightdeck.worker.train.shuffled_indices import ShuffledIndices

        order: dict[str, Any] = {"sampler": ShuffledIndices(dataset, seed=0)}
    else:
        order = {"shuffle": True}
    batches = torch.utils.data.DataLoader(
        dataset,
        batch_size=16,
        **order,
        num_workers=workers,
        multiprocessing_context="spawn",
        collate_fn=collate,
    )
    iterator = iter(batches)
    next(iterator)
    ready.put((rank, time.perf_counter(), len(dataset)))
    done.wait()  # keep the tree alive (workers included) until the parent has sampled it


def _first_streamed_batch(
    rank: int, sources: list[Any], tokenizer: Any, collate: Any, workers: int, ready: Any, done: Any
) -> None:
    """A rank of a streamed source (`"streaming": true`, or a corpus above FLIGHTDECK_STREAMING_ABOVE_MB):
    nothing is converted or tokenised ahead; the collator tokenises each batch in the loader workers. Each
    rank reads the one-file stream from its start and keeps its share of the rows (split_dataset_by_node;
    the trainer's accelerate does the same with IterableDatasetShard, dispatch_batches off, as RecipeRun
    sets for streams). A stream has no length: the first batch's rows are reported instead."""
    import torch
    from datasets.distributed import split_dataset_by_node

    from flightdeck.worker.train.data import open_training_data

    stream = open_training_data(sources, "/", task="masked_lm", tokenizer=tokenizer, max_seq_length=64)
    stream = split_dataset_by_node(stream, rank=rank, world_size=2)
    batches = torch.utils.data.DataLoader(
        stream, batch_size=16, num_workers=workers, multiprocessing_context="spawn", collate_fn=collate
    )
    batch = next(iter(batches))
    ready.put((rank, time.perf_counter(), int(batch["input_ids"].shape[0])))
    done.wait()


def _rollup(pid: int) -> dict[str, int]:
    """RSS, PSS, Pss_Anon (the process's own heap: Python objects, lists of indices) and Pss_File (pages of
    mapped files, Arrow included, split between the processes that map them), from /proc/PID/smaps_rollup:
    the kernel's own sums, 3.3 ms for a process that imported torch, transformers and datasets. psutil's
    memory_full_info parses the full smaps as well (11.8 ms more): for the tree's seven processes every
    50 ms that took about 70 % of a core from the ranks being measured, on a 2-core machine."""
    wanted = {"Rss": "rss", "Pss": "pss", "Pss_Anon": "pss_anon", "Pss_File": "pss_file"}
    found = dict.fromkeys(wanted.values(), 0)
    try:
        with open(f"/proc/{pid}/smaps_rollup", encoding="ascii") as handle:
            for line in handle:
                key = line.split(":", 1)[0]
                if key in wanted:
                    found[wanted[key]] = int(line.split()[1]) * 1024
    except OSError:
        pass
    return found


def _tree_memory(root: Any) -> dict[str, int]:
    import psutil

    total = {"rss": 0, "pss": 0, "pss_anon": 0, "pss_file": 0}
    try:
        tree = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return total
    for process in tree:
        for key, value in _rollup(process.pid).items():
            total[key] += value
    return total


def measure(
    loader: str, corpus: Path, tokenizer_dir: Path, cache: Path, workers: int = LOADER_WORKERS
) -> dict[str, Any]:
    """Peak RSS/PSS of the process tree and the time to the last rank's first batch."""
    import psutil

    os.environ["HF_DATASETS_CACHE"] = str(cache)
    context = mp.get_context("spawn")
    barrier, ready, done = context.Barrier(2), context.Queue(), context.Event()
    start = time.perf_counter()
    ranks = [
        context.Process(
            target=_rank, args=(r, loader, str(corpus), str(tokenizer_dir), workers, barrier, ready, done)
        )
        for r in range(2)
    ]
    for process in ranks:
        process.start()
    me = psutil.Process()
    peak = {"rss": 0, "pss": 0, "pss_anon": 0, "pss_file": 0}
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            for key, value in _tree_memory(me).items():
                peak[key] = max(peak[key], value)
            time.sleep(0.1)  # a tree's sample is ~25 ms of kernel time: a fifth of a core at this rate

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    firsts = []
    try:
        while len(firsts) < len(ranks):
            try:
                firsts.append(ready.get(timeout=1.0))
            except queue.Empty:
                # A rank that died (its error is above, on stderr) never answers: stop, do not wait an hour.
                dead = [p for p in ranks if p.exitcode is not None and p.exitcode != 0]
                if dead or time.perf_counter() - start > 3600:
                    raise RuntimeError(
                        f"bench.data: {loader}: rank(s) exited {[p.exitcode for p in dead]} before their "
                        "first batch (the traceback is above)"
                    ) from None
    except BaseException:
        stop.set()
        for process in ranks:
            process.kill()
        raise
    time.sleep(0.5)  # a few more samples with every worker alive
    stop.set()
    sampler.join()
    done.set()
    for process in ranks:
        process.join(timeout=60)
    return {
        "first_batch_s": max(t for _, t, _ in firsts) - start,
        **{f"peak_{key}_mb": value / 2**20 for key, value in peak.items()},
        "samples": firsts[0][2],
    }


BASELINE_LINES = 1_000


def _corpus(work: Path, name: str, lines: int) -> Path:
    corpus = work / name
    if not corpus.exists() or sum(1 for _ in corpus.open("rb")) != lines:
        write_corpus(corpus, lines)
    return corpus


def _over(row: dict[str, Any], base: dict[str, Any]) -> dict[str, Any]:
    """What the corpus itself costs: a run's figures less the same loader's on a 1,000-line corpus (the six
    processes' interpreters, torch, transformers, pyarrow and their start-up, which no loader can avoid)."""
    keys = ("first_batch_s", "peak_rss_mb", "peak_pss_mb", "peak_pss_anon_mb", "peak_pss_file_mb")
    return {key: row[key] - base[key] for key in keys}


VARIANTS = ("streaming", "old", "cold", "warm")


def _variants(given: str) -> list[str]:
    chosen = [name.strip() for name in given.split(",") if name.strip()]
    unknown = [name for name in chosen if name not in VARIANTS]
    if unknown or not chosen:
        raise typer.BadParameter(f"--variants takes a comma list of {', '.join(VARIANTS)}; got {given!r}")
    return chosen


def run(
    lines: Annotated[int, typer.Option(help="corpus lines (R3: 14,700,000)")] = R3_LINES,
    old_commit: Annotated[
        str, typer.Option(help="commit whose worker/train/data.py is the old loader")
    ] = OLD_COMMIT,
    results_dir: Annotated[Path, typer.Option()] = Path("bench/results"),
    work_dir: Annotated[Path | None, typer.Option(help="keep the corpus and caches here")] = None,
    variants: Annotated[
        str,
        typer.Option(
            help="which loaders, in this order: streaming (the source streamed), old (the previous loader), "
            "cold (datasets, empty cache), warm (datasets on the cache cold left, or one in --work-dir)"
        ),
    ] = ",".join(VARIANTS),
    loader_workers: Annotated[
        int,
        typer.Option(
            min=1,
            help="DataLoader workers per rank (R3 had 2; the smoke test takes 1 to halve its processes)",
        ),
    ] = LOADER_WORKERS,
) -> dict[str, Any]:
    from flightdeck.recipe.schema import DataSource
    from flightdeck.worker.tiny import make_tiny_model
    from flightdeck.worker.train.data_sources import auto_streamed, streaming_above_bytes

    chosen = _variants(variants)
    work = Path(work_dir or tempfile.mkdtemp(prefix="bench-data-"))
    work.mkdir(parents=True, exist_ok=True)
    cache = work / "cache"
    if "warm" in chosen and "cold" not in chosen and not any(cache.rglob("*.arrow")):
        raise typer.BadParameter(f"--variants warm without cold needs the cache a cold run left in {cache}")
    corpus = _corpus(work, "corpus.txt", lines)
    small = _corpus(work, "baseline.txt", BASELINE_LINES)
    tokenizer_dir = work / "tiny-bert"
    if not tokenizer_dir.exists():
        make_tiny_model(tokenizer_dir, "bert")
    started = time.perf_counter()
    with corpus.open("rb") as handle:
        read_lines = sum(1 for _ in handle)
    one_read_s = time.perf_counter() - started
    file_mb = corpus.stat().st_size / 2**20
    # What a recipe naming this corpus gets by default: streamed only above the worker's threshold.
    streamed_by_default = auto_streamed(DataSource(path=str(corpus), preset="text"), "/")
    runs: dict[str, dict[str, Any]] = {}
    loaders = {"streaming": "streaming", "cold": "datasets", "warm": "datasets"}
    loaders["old"] = str(_old_loader(old_commit, work)) if "old" in chosen else ""
    for variant in chosen:
        name, loader = ("datasets" if variant in ("cold", "warm") else variant), loaders[variant]
        if f"{name}_baseline" not in runs:
            # The baseline first, on its own cache: the corpus's cold run must find an empty one.
            baseline_cache = work / f"cache-{name}-baseline"
            runs[f"{name}_baseline"] = measure(loader, small, tokenizer_dir, baseline_cache, loader_workers)
        key = f"datasets_{variant}" if name == "datasets" else name
        runs[key] = measure(
            loader,
            corpus,
            tokenizer_dir,
            cache if name == "datasets" else work / f"cache-{name}",
            loader_workers,
        )
        print(f"{key}: first batch {runs[key]['first_batch_s']:.2f} s", flush=True)
        # What is measured so far, in the work directory: a run stopped early (time, memory) keeps it.
        (work / "partial-results.json").write_text(json.dumps({"lines": read_lines, **runs}, indent=2))
    for name, row in runs.items():
        if not name.endswith("_baseline"):
            row["corpus"] = _over(row, runs[f"{name.split('_')[0]}_baseline"])
    arrow_mb = sum(f.stat().st_size for f in cache.rglob("*.arrow")) / 2**20
    threshold_mb = streaming_above_bytes() / 2**20
    result = {
        "benchmark": "data",
        "lines": read_lines,
        "loader_workers": loader_workers,
        "file_mb": file_mb,
        "arrow_cache_mb": arrow_mb,
        "one_read_s": one_read_s,
        "streaming_above_mb": threshold_mb,
        "streamed_by_default": streamed_by_default,
        **runs,
    }
    print(
        f"corpus: {read_lines:,} lines, {file_mb:,.1f} MB; one read of the file: {one_read_s:.2f} s; "
        f"datasets cache (Arrow: raw, canonical, tokenised): {arrow_mb:,.1f} MB; streamed by default "
        f"(above FLIGHTDECK_STREAMING_ABOVE_MB={threshold_mb:g}): {'yes' if streamed_by_default else 'no'}"
    )
    for name, row in runs.items():
        print(
            f"{name:17s} first batch {row['first_batch_s']:7.2f} s  peak RSS {row['peak_rss_mb']:8.1f} MB"
            f"  PSS {row['peak_pss_mb']:8.1f} MB (anon {row['peak_pss_anon_mb']:7.1f}, file "
            f"{row['peak_pss_file_mb']:7.1f})  samples {row['samples']:,}"
            + (" (a stream: the first batch's rows)" if name.startswith("streaming") else "")
        )
    for name, row in runs.items():
        if "corpus" in row:
            c = row["corpus"]
            print(
                f"{name:17s} less its baseline: first batch +{c['first_batch_s']:7.2f} s "
                f"({c['first_batch_s'] / one_read_s:6.1f}x one read)  PSS +{c['peak_pss_mb']:8.1f} MB "
                f"({c['peak_pss_mb'] / file_mb:5.2f}x the file; anon +{c['peak_pss_anon_mb']:7.1f}, "
                f"file +{c['peak_pss_file_mb']:7.1f})  RSS +{c['peak_rss_mb']:8.1f} MB "
                f"({c['peak_rss_mb'] / file_mb:5.2f}x)"
            )
    write_results("data", result, results_dir)
    return result


def main(argv: list[str] | None = None) -> dict[str, Any]:
    return run_cli(run, argv, __doc__)


if __name__ == "__main__":
    main()
