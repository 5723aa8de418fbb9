"""Demo datasets shaped like ChartQA, InfoVQA, OCR-VQA (text and with images), alpaca and a text corpus."""

from __future__ import annotations

import csv
import io
import json
import random
from pathlib import Path

_COLOURS = ["red", "blue", "green", "black", "white", "yellow", "orange", "purple"]
_THINGS = ["bar", "line", "pie", "column", "area", "slice", "axis", "legend"]
_COUNTRIES = ["France", "Chile", "Japan", "Kenya", "Peru", "Norway", "India", "Egypt"]
_SENTENCE = (
    "the model reads a chart and answers a question about the value of each bar in the figure "
    "while the trainer watches the loss and the gradient norm of every adapter at every step"
)
_WORDS = tuple(_SENTENCE.split(" "))


def _chart_pair(rng: random.Random) -> tuple[str, str]:
    country, thing = rng.choice(_COUNTRIES), rng.choice(_THINGS)
    value = rng.randint(1, 99)
    return f"What is the value of the {thing} for {country} in {value % 7 + 2010}?", str(value)


def _info_pair(rng: random.Random) -> tuple[str, str]:
    colour, country = rng.choice(_COLOURS), rng.choice(_COUNTRIES)
    return f"Which colour is used for {country} in the infographic?", colour


def _write_jsonl(path: Path, rows: list[dict[str, object]]) -> None:
    with path.open("w", encoding="utf-8") as handle:
        for row in rows:
            handle.write(json.dumps(row) + "\n")


def _chartqa_rows(rng: random.Random, count: int) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    for index in range(count):
        query, answer = _chart_pair(rng)
        # Real ChartQA stores some labels as one-element lists.
        rows.append(
            {"imgname": f"chart_{index}.png", "query": query, "label": [answer] if index % 3 else answer}
        )
    return rows


def _ocrvqa_rows(rng: random.Random, count: int) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    for index in range(count):
        pairs = [
            _info_pair(rng) if rng.random() < 0.5 else _chart_pair(rng) for _ in range(rng.randint(2, 5))
        ]
        rows.append(
            {
                "image_id": f"book_{index}",
                "questions": [q for q, _ in pairs],
                "answers": [a for _, a in pairs],
            }
        )
    return rows


def _text_lines(rng: random.Random, count: int) -> list[str]:
    return [" ".join(rng.choice(_WORDS) for _ in range(rng.randint(6, 16))) for _ in range(count)]


_BAR_COLOURS = {"red": (220, 40, 40), "blue": (40, 70, 220), "green": (40, 170, 60)}


def _chart_image(rng: random.Random, size: int = 56) -> tuple[bytes, dict[str, int]]:
    """A PNG bar chart: one bar per colour, its height the value asked about (so answers are learnable)."""
    from PIL import Image, ImageDraw

    values = {colour: rng.randint(1, 99) for colour in _BAR_COLOURS}
    image = Image.new("RGB", (size, size), "white")
    draw = ImageDraw.Draw(image)
    width = size // (2 * len(values) + 1)
    for index, (colour, value) in enumerate(values.items()):
        left = width * (2 * index + 1)
        draw.rectangle(
            (left, size - 2 - value * (size - 4) // 100, left + width, size - 2), fill=_BAR_COLOURS[colour]
        )
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue(), values


def _chart_question(rng: random.Random, values: dict[str, int]) -> tuple[str, str]:
    colour = rng.choice(list(values))
    return f"What is the value of the {colour} bar?", str(values[colour])


def make_image_data(root: Path, rng: random.Random) -> dict[str, Path]:
    """Image QA sets in the shapes the real ones come in (R1, R2): ChartQA as HF parquet splits with an
    {bytes, path} image struct and list labels; InfoVQA as jsonl with image paths and question/answers;
    OCR-VQA as parquet with raw image bytes and several questions per image."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    paths: dict[str, Path] = {}
    chartqa = root / "chartqa-vl"
    chartqa.mkdir(exist_ok=True)
    for split, count in (("train", 96), ("val", 24), ("test", 24)):
        rows = []
        for index in range(count):
            png, values = _chart_image(rng)
            query, label = _chart_question(rng, values)
            name = f"{split}_{index}.png"
            rows.append(
                {"imgname": name, "image": {"bytes": png, "path": name}, "query": query, "label": [label]}
            )
        pq.write_table(pa.Table.from_pylist(rows), chartqa / f"{split}.parquet")
    paths["chartqa_vl"] = chartqa

    images = root / "infovqa-vl"
    images.mkdir(exist_ok=True)
    info_rows = []
    for index in range(64):
        png, values = _chart_image(rng)
        (images / f"info_{index}.png").write_bytes(png)
        question, answer = _chart_question(rng, values)
        info_rows.append({"image": f"infovqa-vl/info_{index}.png", "question": question, "answers": [answer]})
    _write_jsonl(root / "infovqa-vl.jsonl", info_rows)
    paths["infovqa_vl"] = root / "infovqa-vl.jsonl"

    ocr_rows = []
    for index in range(32):
        png, values = _chart_image(rng)
        pairs = [_chart_question(rng, values) for _ in range(rng.randint(2, 3))]
        ocr_rows.append(
            {
                "image_id": f"cover_{index}",
                "image": png,
                "questions": [q for q, _ in pairs],
                "answers": [a for _, a in pairs],
            }
        )
    pq.write_table(pa.Table.from_pylist(ocr_rows), root / "ocrvqa-vl.parquet")
    paths["ocrvqa_vl"] = root / "ocrvqa-vl.parquet"
    return paths


def make_demo_data(directory: str | Path, *, seed: int = 0, text_lines: int = 2000) -> dict[str, Path]:
    """Write the demo datasets under `directory` and return {name: path}."""
    rng = random.Random(seed)
    root = Path(directory)
    root.mkdir(parents=True, exist_ok=True)
    paths: dict[str, Path] = {}

    import pyarrow as pa
    import pyarrow.parquet as pq

    # ChartQA as `huggingface-cli download --repo-type dataset` leaves it: Hub-sharded parquet under data/,
    # labels as lists; the validation split is named 'val' (D003).
    chartqa = root / "chartqa"
    (chartqa / "data").mkdir(parents=True, exist_ok=True)
    for split, count in (("train", 200), ("val", 40)):
        rows = [
            row | {"label": [row["label"]] if isinstance(row["label"], str) else row["label"]}
            for row in _chartqa_rows(rng, count)
        ]
        pq.write_table(pa.Table.from_pylist(rows), chartqa / "data" / f"{split}-00000-of-00001.parquet")
    paths["chartqa"] = chartqa

    # InfoVQA: query/answer, in parquet and csv.
    info_rows = [dict(zip(("query", "answer"), _info_pair(rng), strict=True)) for _ in range(200)]

    pq.write_table(pa.Table.from_pylist(info_rows), root / "infovqa.parquet")
    paths["infovqa"] = root / "infovqa.parquet"
    with (root / "infovqa.csv").open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=["query", "answer"])
        writer.writeheader()
        writer.writerows(info_rows)
    paths["infovqa_csv"] = root / "infovqa.csv"

    # OCR-VQA: several questions/answers per row, to be flattened (D002).
    _write_jsonl(root / "ocrvqa.jsonl", _ocrvqa_rows(rng, 80))
    paths["ocrvqa"] = root / "ocrvqa.jsonl"

    alpaca = []
    for _ in range(100):
        query, answer = _chart_pair(rng)
        alpaca.append(
            {"instruction": "Answer the question about the chart.", "input": query, "output": answer}
        )
    (root / "alpaca.json").write_text(json.dumps(alpaca), encoding="utf-8")
    paths["alpaca"] = root / "alpaca.json"

    paths |= make_image_data(root, random.Random(seed + 1))
    # Written last: its presence means the whole set is there (compose's demo-assets checks it).
    (root / "corpus.txt").write_text("\n".join(_text_lines(rng, text_lines)) + "\n", encoding="utf-8")
    paths["text"] = root / "corpus.txt"
    return paths


def corpus_lines(count: int, *, seed: int = 0) -> list[str]:
    """`count` lines of demo text, for tokenizer training and large-corpus tests."""
    return _text_lines(random.Random(seed), count)
