"""Published configurations of the models the estimator is calibrated against (the figures in docs/failures.md).

Built from the models' public config.json dimensions; no weights are involved.
"""

from __future__ import annotations

from typing import Any

LLAMA2_7B: dict[str, Any] = {
    "model_type": "llama",
    "hidden_size": 4096,
    "intermediate_size": 11008,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 32,
    "vocab_size": 32000,
    "max_position_embeddings": 4096,
    "tie_word_embeddings": False,
    "torch_dtype": "float16",
}

QWEN25_7B: dict[str, Any] = {
    "model_type": "qwen2",
    "hidden_size": 3584,
    "intermediate_size": 18944,
    "num_hidden_layers": 28,
    "num_attention_heads": 28,
    "num_key_value_heads": 4,
    "vocab_size": 152064,
    "max_position_embeddings": 32768,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}
