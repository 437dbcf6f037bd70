"""Text in, text out: the tokenizer wrapped around :mod:`gptkit.generate`.

Prompts longer than the model can take are left-truncated: the last ``context - max_new_tokens``
prompt tokens are kept (a warning says how many were dropped), since the end of a prompt is
what the continuation depends on most.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path

import torch

from gptkit.generate import generate, stream_ids
from gptkit.model import GPT
from gptkit.tokenizer import Tokenizer


def load_for_generation(
    model_dir: str | Path, tokenizer_dir: str | Path | None = None, dtype: str = "float32"
) -> tuple[GPT, Tokenizer]:
    """A model in eval mode (weights in ``dtype``; bfloat16 halves the memory read per token) and its tokenizer."""
    model = GPT.from_pretrained(model_dir, dtype=getattr(torch, dtype))
    tokenizer = Tokenizer.from_pretrained(tokenizer_dir or model_dir)
    return model, tokenizer


def _start_ids(model: GPT, tokenizer: Tokenizer) -> list[int]:
    """What an unconditional sample starts from: GPT-1's _start_ or GPT-2's <|endoftext|>."""
    for token in ("_start_", "<|endoftext|>"):
        token_id = tokenizer.special_tokens.get(token)
        if token_id is not None and token_id < model.config.total_vocab_size:
            return [token_id]
    raise ValueError("the prompt is empty and the model has no start token to sample from: give a prompt")


def encode_prompt(model: GPT, tokenizer: Tokenizer, prompt: str, max_new_tokens: int) -> list[int]:
    ids = tokenizer.encode(prompt) if prompt else []
    if not ids:
        ids = _start_ids(model, tokenizer)
    room = model.config.context_length - max_new_tokens
    if room < 1:
        raise ValueError(
            f"max_new_tokens={max_new_tokens} leaves no room for a prompt in the model's context of "
            f"{model.config.context_length} tokens"
        )
    if len(ids) > room:
        warnings.warn(f"prompt of {len(ids)} tokens left-truncated to its last {room}", stacklevel=3)
        ids = ids[-room:]
    return ids


def _sampling_kwargs(tokenizer: Tokenizer, seed: int | None, kwargs: dict) -> dict:
    if seed is not None:
        kwargs["generator"] = torch.Generator().manual_seed(seed)
    eot = tokenizer.special_tokens.get("<|endoftext|>")
    if eot is not None:
        kwargs.setdefault("eos_token_id", eot)
        kwargs.setdefault("pad_token_id", eot)
    return kwargs


def stream_text(
    model: GPT,
    tokenizer: Tokenizer,
    prompt: str,
    max_new_tokens: int = 50,
    stop: Sequence[str] | None = None,
    seed: int | None = None,
    **kwargs,
) -> Iterator[str]:
    """Yield the continuation of ``prompt`` piece by piece, as tokens are decoded.

    ``stop`` strings end the text before them; other keywords are :func:`gptkit.generate.stream_ids`'s
    (``do_sample``, ``temperature``, ``top_k``, ``top_p``, ``repetition_penalty``).
    """
    device = next(model.parameters()).device
    ids = encode_prompt(model, tokenizer, prompt, max_new_tokens)
    kwargs = _sampling_kwargs(tokenizer, seed, kwargs)
    new_ids: list[int] = []
    emitted = ""
    eos = kwargs.get("eos_token_id")
    # Decode the continuation together with the prompt, so word boundaries (GPT-1's </w>) come out right.
    decoded_prompt = tokenizer.decode(ids)
    for step in stream_ids(model, torch.tensor([ids], device=device), max_new_tokens, **kwargs):
        token = int(step[0])
        if token == eos:
            return
        new_ids.append(token)
        text = tokenizer.decode(ids + new_ids)
        text = text[len(decoded_prompt) :] if text.startswith(decoded_prompt) else tokenizer.decode(new_ids)
        if text.endswith("\ufffd"):  # half of a multi-byte character: wait for the rest
            continue
        if stop:
            cut = min((text.find(s) for s in stop if s in text), default=-1)
            if cut >= 0:
                if cut > len(emitted):
                    yield text[len(emitted) : cut]
                return
        if text.startswith(emitted) and len(text) > len(emitted):
            yield text[len(emitted) :]
            emitted = text


def generate_text(
    model: GPT,
    tokenizer: Tokenizer,
    prompts: Sequence[str],
    max_new_tokens: int = 50,
    seed: int | None = None,
    **kwargs,
) -> list[str]:
    """Continuations of several prompts at once (left-padded into one batch)."""
    device = next(model.parameters()).device
    encoded = [encode_prompt(model, tokenizer, p, max_new_tokens) for p in prompts]
    kwargs = _sampling_kwargs(tokenizer, seed, kwargs)
    width = max(len(ids) for ids in encoded)
    pad = kwargs.get("pad_token_id", 0)
    input_ids = torch.tensor([[pad] * (width - len(ids)) + ids for ids in encoded], device=device)
    mask = torch.tensor([[0] * (width - len(ids)) + [1] * len(ids) for ids in encoded], device=device)
    out = generate(model, input_ids, max_new_tokens, attention_mask=mask, **kwargs)
    texts = []
    eos = kwargs.get("eos_token_id")
    for row in out[:, width:].tolist():
        if eos is not None and eos in row:
            row = row[: row.index(eos)]
        texts.append(tokenizer.decode(row))
    return texts
