"""The model: the network, its weights in and out, the fine-tuned task model, inference layouts.

- :mod:`~gptkit.model.network`: :class:`GPT` (GPT-1's and GPT-2's blocks, one readable file) and its
  :class:`KVCache`.
- :mod:`~gptkit.model.weights`: Hugging Face, gptkit and OpenAI-release files ↔ config and parameters
  (it never imports the network: :meth:`GPT.from_pretrained` builds the model from what it reads).
- :mod:`~gptkit.model.positions`: the sinusoidal position table both of them need.
- :mod:`~gptkit.model.convert`: ``gptkit convert``.
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
)
from gptkit.model.positions import sinusoidal_positions

__all__ = [
    "GPT",
    "Block",
    "GPTOutput",
    "KVCache",
    "fused_next_token_loss",
    "next_token_loss",
    "sinusoidal_positions",
]
