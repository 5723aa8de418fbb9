"""G013: a tokenizer with more tokens than the model has embedding rows (tokens added, never resized).

(G012, EOS masked as padding, is a property of the collator: the trainer's own collators pad labels by
position, so it is checked at run time on script jobs' collators, worker/train/eos_supervision.py.)"""

from __future__ import annotations

from typing import Any

from flightdeck.preflight.rule_result import RuleResult, error
from flightdeck.recipe.schema import Recipe


def embedding_rows(model: Any) -> int | None:
    """Rows of the input embedding table (a meta-device model: the shape, no storage)."""
    try:
        embeddings = model.get_input_embeddings()
    except (AttributeError, NotImplementedError):
        return None
    weight = getattr(embeddings, "weight", None)
    return int(weight.shape[0]) if weight is not None else None


def tokens_beyond_embeddings(recipe: Recipe, probe: Any) -> list[RuleResult]:
    """G013: the tokenizer has more tokens than the model has embedding rows (tokens added to the
    tokenizer, the embeddings never resized): ids past the table index out of range."""
    tokenizer, rows = probe.tokenizer, probe.embedding_rows
    if tokenizer is None or rows is None or len(tokenizer) <= rows:
        return []
    added = sorted((index, token) for token, index in tokenizer.get_added_vocab().items() if index >= rows)
    shown = ", ".join(repr(token) for _, token in added[:8]) + (" ..." if len(added) > 8 else "")
    lost = (
        " With an adapter, list embed_tokens and lm_head in adapter.modules_to_save, or the new rows are "
        "lost when the adapter is reloaded (G011)."
        if recipe.adapter is not None
        else ""
    )
    return [
        error(
            "G013",
            "model.path",
            f"the tokenizer has {len(tokenizer)} tokens but the model's input embeddings have {rows} rows"
            + (f" (tokens past the table: {shown})" if shown else "")
            + ": a token id past the table fails on GPU with the device-side assert 'srcIndex < "
            "srcSelectDimSize' and reads garbage on CPU (transformers#22778). Resize the embeddings before "
            "saving the model (model.resize_token_embeddings(len(tokenizer)), then save_pretrained), or use "
            f"the tokenizer the model was saved with.{lost}",
            "host",
        )
    ]
