"""Generation: one contract for choosing tokens, decoding with a KV cache, and text in and out.

- :mod:`~gptkit.generation.sampling`: :class:`SamplingParams` (the only defaults) and
  :class:`DecodeStep` (logits → mask → sample → stop), used by every door (library, CLI, server,
  the creativity sweep); greedy is ``temperature=0``.
- :mod:`~gptkit.generation.decode`: :func:`generate` / :func:`stream_ids`, token ids in and out.
- :mod:`~gptkit.generation.incremental`: :class:`IncrementalText`, the one streaming detokenizer.
- :mod:`~gptkit.generation.text`: :func:`generate_text` / :func:`stream_text` and loading a model
  for generation.
"""

from gptkit.generation.decode import generate, stream_ids
from gptkit.generation.incremental import IncrementalText
from gptkit.generation.sampling import (
    GREEDY,
    DecodeStep,
    SamplingParams,
    process_logits,
    sample,
    sampling_params,
)
from gptkit.generation.text import encode_prompt, generate_text, load_for_generation, start_ids, stream_text

__all__ = [
    "GREEDY",
    "DecodeStep",
    "IncrementalText",
    "SamplingParams",
    "encode_prompt",
    "generate",
    "generate_text",
    "load_for_generation",
    "process_logits",
    "sample",
    "sampling_params",
    "start_ids",
    "stream_ids",
    "stream_text",
]
