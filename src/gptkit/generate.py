"""Autoregressive decoding with a KV cache: greedy, temperature, top-k, top-p, streaming.

The prompt is run through the model once, filling the cache; each further step feeds one token.
Rows of a batch may have prompts of different lengths: they are left-padded and masked.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch

from gptkit.model import GPT, KVCache


def process_logits(
    logits: torch.Tensor,
    *,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    repetition_penalty: float = 1.0,
    previous_ids: torch.Tensor | None = None,
) -> torch.Tensor:
    """Turn next-token logits (B, V) into the logits to sample from; banned tokens get -inf."""
    logits = logits.float()
    if repetition_penalty != 1.0 and previous_ids is not None and previous_ids.numel():
        # CTRL (Keskar et al., 2019): make tokens already in the sequence less likely.
        seen = torch.gather(logits, 1, previous_ids)
        seen = torch.where(seen > 0, seen / repetition_penalty, seen * repetition_penalty)
        logits = logits.scatter(1, previous_ids, seen)
    if temperature != 1.0:
        logits = logits / temperature
    if top_k is not None and top_k < logits.size(-1):
        kth_largest = torch.topk(logits, top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth_largest, float("-inf"))
    if top_p is not None and top_p < 1.0:
        # Nucleus (Holtzman et al., 2020): the smallest set of tokens whose probability reaches top_p.
        sorted_logits, order = torch.sort(logits, descending=True, dim=-1)
        probs = sorted_logits.softmax(-1)
        mass_before = probs.cumsum(-1) - probs  # probability of the tokens ranked above each one
        remove_sorted = mass_before >= top_p  # the top token always has mass_before 0: never removed
        remove = remove_sorted.scatter(1, order, remove_sorted)
        logits = logits.masked_fill(remove, float("-inf"))
    return logits


def _check_sampling_args(
    temperature: float, top_k: int | None, top_p: float | None, repetition_penalty: float
):
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0 (0 means greedy), got {temperature}")
    if top_k is not None and top_k < 1:
        raise ValueError(f"top_k must be >= 1, got {top_k}")
    if top_p is not None and not 0.0 < top_p <= 1.0:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")
    if repetition_penalty <= 0:
        raise ValueError(f"repetition_penalty must be > 0, got {repetition_penalty}")


@torch.no_grad()
def stream_ids(
    model: GPT,
    input_ids: torch.Tensor,
    max_new_tokens: int,
    *,
    do_sample: bool = False,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    repetition_penalty: float = 1.0,
    eos_token_id: int | Sequence[int] | None = None,
    pad_token_id: int = 0,
    attention_mask: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
    use_cache: bool = True,
) -> Iterator[torch.Tensor]:
    """Yield the next token of every row, (B,), one step at a time.

    Rows that produced an end token yield ``pad_token_id`` afterwards; the iteration stops when every
    row has ended or after ``max_new_tokens`` steps.
    """
    _check_sampling_args(temperature, top_k, top_p, repetition_penalty)
    if input_ids.dim() != 2 or input_ids.size(1) == 0:
        raise ValueError(
            f"input_ids must be (batch, prompt length) with at least one token, got {tuple(input_ids.shape)}; "
            "for unconditional samples start from the start/end-of-text token"
        )
    B, T = input_ids.shape
    limit = model.config.context_length
    if T + max_new_tokens > limit:
        raise ValueError(
            f"prompt of {T} tokens + {max_new_tokens} new tokens exceeds the model's context of {limit}; "
            f"shorten the prompt to at most {max(limit - max_new_tokens, 0)} tokens or ask for fewer new tokens"
        )
    greedy = not do_sample or temperature == 0
    stop_ids = torch.tensor([eos_token_id] if isinstance(eos_token_id, int) else list(eos_token_id or []))
    stop_ids = stop_ids.to(input_ids.device)
    finished = torch.zeros(B, dtype=torch.bool, device=input_ids.device)

    was_training = model.training
    model.eval()
    try:
        dtype = next(model.parameters()).dtype
        cache = KVCache(model.config, B, T + max_new_tokens, input_ids.device, dtype) if use_cache else None
        sequence, mask = input_ids, attention_mask
        step_input = input_ids
        for _ in range(max_new_tokens):
            if cache is None:  # recompute the whole sequence each step (the reference path)
                step_input = sequence
            logits = model(step_input, attention_mask=mask, cache=cache).logits[:, -1, :]
            logits = process_logits(
                logits,
                temperature=1.0 if greedy else temperature,
                top_k=None if greedy else top_k,
                top_p=None if greedy else top_p,
                repetition_penalty=repetition_penalty,
                previous_ids=sequence,
            )
            if greedy:
                next_ids = logits.argmax(-1)
            else:
                next_ids = torch.multinomial(logits.softmax(-1), 1, generator=generator).squeeze(1)
            next_ids = torch.where(finished, torch.full_like(next_ids, pad_token_id), next_ids)
            yield next_ids
            if stop_ids.numel():
                finished |= torch.isin(next_ids, stop_ids)
                if bool(finished.all()):
                    return
            sequence = torch.cat([sequence, next_ids[:, None]], dim=1)
            step_input = next_ids[:, None]
            if mask is not None:
                mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
    finally:
        model.train(was_training)


def generate(model: GPT, input_ids: torch.Tensor, max_new_tokens: int, **kwargs) -> torch.LongTensor:
    """Decode ``max_new_tokens`` tokens after ``input_ids`` (B, T); returns (B, T + N).

    N is ``max_new_tokens`` unless every row hit ``eos_token_id`` sooner. Keyword arguments are those
    of :func:`stream_ids` (``do_sample``, ``temperature``, ``top_k``, ``top_p``, ...).
    """
    steps = list(stream_ids(model, input_ids, max_new_tokens, **kwargs))
    if not steps:
        return input_ids
    return torch.cat([input_ids, torch.stack(steps, dim=1)], dim=1)
