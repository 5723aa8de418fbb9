"""Static rules about the data pipeline and process environment (E001, E004, D004, D006)."""

from __future__ import annotations

from service.memory.architecture import ModelShape
from service.preflight.outcome import Outcome, correction
from service.recipe.schema import Recipe


def cuda_in_forked_workers(recipe: Recipe, shape: ModelShape | None) -> list[Outcome]:
    """E001: DataLoader workers forked after CUDA init cannot touch CUDA."""
    if recipe.data.num_workers == 0:
        return []
    return [
        correction(
            "E001",
            "data.num_workers",
            f"num_workers={recipe.data.num_workers}: a collate that touches CUDA in forked workers fails "
            "with 'Cannot re-initialize CUDA in forked subprocess'.",
            "the trainer uses the 'spawn' multiprocessing context, persistent workers and a CPU-only collate",
        )
    ]


def tokenizers_parallelism(recipe: Recipe, shape: ModelShape | None) -> list[Outcome]:
    """E004: fast tokenizers used before a fork deadlock or warn in every worker."""
    if "TOKENIZERS_PARALLELISM" in recipe.env:
        return []
    return [
        correction(
            "E004",
            "env.TOKENIZERS_PARALLELISM",
            "TOKENIZERS_PARALLELISM is unset: tokenizers used before DataLoader workers fork can deadlock.",
            "TOKENIZERS_PARALLELISM=false",
            {"env.TOKENIZERS_PARALLELISM": "false"},
        )
    ]


def pickled_datasets(recipe: Recipe, shape: ModelShape | None) -> list[Outcome]:
    """D004: a dataset pickled to workers or ranks must not carry the corpus."""
    if recipe.data.num_workers == 0 and recipe.world_size == 1:
        return []
    return [
        correction(
            "D004",
            "data.train",
            f"{recipe.world_size} process(es) x {max(recipe.data.num_workers, 1)} loader worker(s): an "
            "in-memory dataset pickled to them can arrive empty ('Example 0 is missing 'text' key').",
            "datasets pickle only path + row offsets and open the file lazily in each process",
        )
    ]


def sequence_beyond_positions(recipe: Recipe, shape: ModelShape | None) -> list[Outcome]:
    """D006: sequences longer than the model's position table (needs the model's config)."""
    if shape is None or shape.max_positions is None or recipe.data.max_seq_length <= shape.max_positions:
        return []
    return [
        correction(
            "D006",
            "data.max_seq_length",
            f"max_seq_length {recipe.data.max_seq_length} exceeds the model's max_position_embeddings "
            f"{shape.max_positions} (index errors or garbage positions).",
            f"max_seq_length capped at {shape.max_positions}",
            {"data.max_seq_length": shape.max_positions},
        )
    ]


ENVIRONMENT_RULES = (
    cuda_in_forked_workers,
    tokenizers_parallelism,
    pickled_datasets,
    sequence_beyond_positions,
)
