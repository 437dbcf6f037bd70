"""Autoregressive decoding with a KV cache: token ids in, token ids out, one step at a time.

The prompt is run through the model once, filling the cache; each further step feeds one token and
picks the next with :class:`gptkit.generation.sampling.DecodeStep`, the step the server takes too.
Rows of a batch may have prompts of different lengths: they are left-padded and masked.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch

from gptkit.generation.sampling import DecodeStep, SamplingParams, sampling_params
from gptkit.model import GPT, KVCache


@torch.no_grad()
def stream_ids(
    model: GPT,
    input_ids: torch.Tensor,
    max_new_tokens: int | None = None,
    params: SamplingParams | None = None,
    *,
    eos_token_id: int | Sequence[int] | None = None,
    pad_token_id: int = 0,
    attention_mask: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
    use_cache: bool = True,
    step: DecodeStep | None = None,
    **settings,
) -> Iterator[torch.Tensor]:
    """Yield the next token of every row, (B,), one step at a time.

    How tokens are chosen: ``params``, or :class:`SamplingParams`' fields as keywords (``temperature``,
    ``top_k``, ``top_p``, ``repetition_penalty``; their defaults otherwise). ``max_new_tokens``
    overrides ``params.max_tokens``. ``generator`` (default: one seeded with ``params.seed``, if any)
    draws the samples. Which ids may be chosen and which end a row: ``step`` (the text functions'
    masks what their tokenizer cannot decode), or ``eos_token_id`` (one id or several; every id may
    be chosen). Rows that produced an end token yield ``pad_token_id`` afterwards; the iteration
    stops when every row has ended or after ``max_tokens`` steps. Stop strings are the text
    functions' job.
    """
    if step is not None and eos_token_id is not None:
        raise TypeError("give step or eos_token_id, not both (a DecodeStep holds its end ids)")
    step = step or DecodeStep.for_ids(eos_token_id)
    params = sampling_params(params, max_new_tokens, **settings)
    max_new_tokens = params.max_tokens
    generator = generator or params.generator(input_ids.device)
    _check_prompt(input_ids, max_new_tokens, model.config.context_length)
    B, T = input_ids.shape
    finished = torch.zeros(B, dtype=torch.bool, device=input_ids.device)
    was_training = model.training
    model.eval()
    try:
        size = (model.config, B, T + max_new_tokens, input_ids.device, model.cache_dtype)
        cache = KVCache(*size) if use_cache else None
        sequence, mask, step_input = input_ids, attention_mask, input_ids
        for _ in range(max_new_tokens):
            if cache is None:  # recompute the whole sequence each step (the reference path)
                step_input = sequence
            # Only the last position is scored: a prompt's other rows never meet the output layer.
            hidden = model(step_input, attention_mask=mask, cache=cache, compute_logits=False).hidden_states
            logits = model.output_layer(hidden[:, -1, :])
            previous = sequence if params.repetition_penalty != 1.0 else None
            next_ids, ends = step(logits, params, generator, previous)
            next_ids = torch.where(finished, torch.full_like(next_ids, pad_token_id), next_ids)
            yield next_ids
            if step.end_ids:
                finished |= ends
                if bool(finished.all()):
                    return
            sequence = torch.cat([sequence, next_ids[:, None]], dim=1)
            step_input = next_ids[:, None]
            if mask is not None:
                mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
    finally:
        model.train(was_training)


def _check_prompt(input_ids: torch.Tensor, max_new_tokens: int, limit: int) -> None:
    """A (batch, length) prompt of at least one token that leaves room for ``max_new_tokens`` in a
    context of ``limit``."""
    if input_ids.dim() != 2 or input_ids.size(1) == 0:
        raise ValueError(
            f"input_ids must be (batch, prompt length) with at least one token, got {tuple(input_ids.shape)}; "
            "for unconditional samples start from the start/end-of-text token"
        )
    T = input_ids.size(1)
    if T + max_new_tokens > limit:
        raise ValueError(
            f"prompt of {T} tokens + {max_new_tokens} new tokens exceeds the model's context of {limit}; "
            f"shorten the prompt to at most {max(limit - max_new_tokens, 0)} tokens or ask for fewer new tokens"
        )


def generate(
    model: GPT,
    input_ids: torch.Tensor,
    max_new_tokens: int | None = None,
    params: SamplingParams | None = None,
    **kwargs,
) -> torch.LongTensor:
    """Decode up to ``max_new_tokens`` tokens after ``input_ids`` (B, T); returns (B, T + N).

    N is ``max_new_tokens`` unless every row hit ``eos_token_id`` sooner. ``params`` and the keyword
    arguments are those of :func:`stream_ids` (``temperature``, ``top_k``, ``top_p``, ...;
    :class:`SamplingParams`' defaults otherwise: ``temperature=0`` for greedy).
    """
    steps = list(stream_ids(model, input_ids, max_new_tokens, params, **kwargs))
    if not steps:
        return input_ids
    return torch.cat([input_ids, torch.stack(steps, dim=1)], dim=1)
