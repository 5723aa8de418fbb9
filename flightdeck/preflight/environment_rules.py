"""Static rules about the data pipeline and process environment (E001, E004, D006).

D004 is no static rule: datasets always pickle as path + offsets; the trainer reports what a worker
receives and fails with D004 only when a worker finds other samples than the process that built it.
"""

from __future__ import annotations

from flightdeck.memory.architecture import ModelShape
from flightdeck.preflight.rule_result import RuleResult, Where, correction, error
from flightdeck.recipe.schema import DataSpec, Recipe

# The shortest data.max_seq_length a recipe may hold: a cap below it would write a recipe the trainer refuses.
SHORTEST_SEQUENCE: int = next(
    m.ge for m in DataSpec.model_fields["max_seq_length"].metadata if hasattr(m, "ge")
)


def cuda_in_forked_workers(recipe: Recipe, shape: ModelShape | None) -> list[RuleResult]:
    """E001: DataLoader workers forked after CUDA init cannot touch CUDA."""
    data = recipe.data
    if data is None or data.num_workers == 0:
        return []
    return [
        correction(
            "E001",
            "data.num_workers",
            f"num_workers={data.num_workers}: a collate that touches CUDA in forked workers fails "
            "with 'Cannot re-initialize CUDA in forked subprocess'.",
            "the trainer uses the 'spawn' multiprocessing context, persistent workers and a CPU-only collate",
        )
    ]


def tokenizers_parallelism(recipe: Recipe, shape: ModelShape | None) -> list[RuleResult]:
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


def sequence_beyond_positions(recipe: Recipe, shape: ModelShape | None) -> list[RuleResult]:
    """D006 from the model's config.json when the service was given it (the host checks the real one)."""
    return capped_sequence(recipe, shape.max_positions if shape is not None else None, "static")


def capped_sequence(recipe: Recipe, limit: int | None, where: Where) -> list[RuleResult]:
    """D006: sequences longer than the model's position table, capped to it and recorded."""
    data = recipe.data
    if data is None or limit is None or data.max_seq_length <= limit:
        return []
    if limit < SHORTEST_SEQUENCE:
        return [
            error(
                "D006",
                "data.max_seq_length",
                f"the model's max_position_embeddings is {limit}, below the shortest max_seq_length a recipe "
                f"may ask for ({SHORTEST_SEQUENCE}): no sequence fits",
                where,
                fix="use a model with a longer position table (max_position_embeddings in its config.json)",
            )
        ]
    return [
        correction(
            "D006",
            "data.max_seq_length",
            f"max_seq_length {data.max_seq_length} exceeds the model's max_position_embeddings {limit} "
            "(index errors or garbage positions).",
            f"max_seq_length capped at {limit}",
            {"data.max_seq_length": limit},
            where,
        )
    ]


ENVIRONMENT_RULES = (
    cuda_in_forked_workers,
    tokenizers_parallelism,
    sequence_beyond_positions,
)
