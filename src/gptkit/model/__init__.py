"""The model: the network, its weights in and out, the fine-tuned task model, inference layouts.

- :mod:`~gptkit.model.network`: :class:`GPT` (GPT-1's and GPT-2's blocks, one readable file) and its
  :class:`KVCache`.
- :mod:`~gptkit.model.weights`: Hugging Face, gptkit and OpenAI-release weights in and out.
- :mod:`~gptkit.model.task`: :class:`TaskModel`, the GPT with the paper's linear head W_y.
- :mod:`~gptkit.model.layouts`: inference-only layouts (int8 weights, oneDNN-packed matrices).
"""

from gptkit.model.network import (
    GPT,
    Block,
    GPTOutput,
    KVCache,
    fused_next_token_loss,
    next_token_loss,
    sinusoidal_positions,
)

__all__ = [
    "GPT",
    "Block",
    "GPTOutput",
    "KVCache",
    "fused_next_token_loss",
    "next_token_loss",
    "sinusoidal_positions",
]
