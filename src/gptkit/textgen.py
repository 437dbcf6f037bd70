"""Text in, text out: the tokenizer wrapped around :mod:`gptkit.generate`.

Prompts longer than the model can take are left-truncated: the last ``context - max_new_tokens``
prompt tokens are kept (a warning says how many were dropped), since the end of a prompt is
what the continuation depends on most.
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path

import torch

from gptkit.generate import generate, stream_ids
from gptkit.hardware import resolve_device, resolve_inference_dtype
from gptkit.model import GPT
from gptkit.tokenizer import END_OF_TEXT, GPT1_SPECIAL_TOKENS, Tokenizer


def load_for_generation(
    model_dir: str | Path,
    tokenizer_dir: str | Path | None = None,
    dtype: str = "auto",
    device: str = "auto",
    decoding: bool = True,
    verbose: bool = False,
) -> tuple[GPT, Tokenizer]:
    """A model in eval mode and its tokenizer, on ``device`` with weights in ``dtype``.

    ``auto`` picks what runs fastest here (see :mod:`gptkit.hardware`): for decoding one token at a
    time (``decoding=True``) half-size bf16 weights often win even without bf16 instructions; for
    scoring whole sequences, bf16 only where the hardware multiplies it natively. ``verbose`` prints
    the choice and its reason.
    """
    torch_device = resolve_device(device)
    choice = resolve_inference_dtype(dtype, torch_device, decoding=decoding)
    if verbose:
        print(f"device: {torch_device}; dtype: {choice.reason}", file=sys.stderr, flush=True)
    model = GPT.from_pretrained(model_dir, dtype=getattr(torch, choice.value), device=str(torch_device))
    tokenizer = Tokenizer.from_pretrained(tokenizer_dir or model_dir)
    return model, tokenizer


def start_ids(model: GPT, tokenizer: Tokenizer) -> list[int]:
    """What an unconditional sample or a score starts from: GPT-1's _start_ or GPT-2's <|endoftext|>,
    when the model has a row for it."""
    for token in (GPT1_SPECIAL_TOKENS[0], END_OF_TEXT):
        token_id = tokenizer.special_tokens.get(token)
        if token_id is not None and token_id < model.config.total_vocab_size:
            return [token_id]
    raise ValueError("the prompt is empty and the model has no start token to sample from: give a prompt")


def encode_prompt(model: GPT, tokenizer: Tokenizer, prompt: str, max_new_tokens: int) -> list[int]:
    ids = tokenizer.encode(prompt) if prompt else []
    if not ids:
        ids = start_ids(model, tokenizer)
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
    eot = tokenizer.special_tokens.get(END_OF_TEXT)
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
    raw: bool = False,
    **kwargs,
) -> Iterator[str]:
    """Yield the continuation of ``prompt`` piece by piece, as tokens are decoded.

    ``stop`` strings end the text before them; other keywords are :func:`gptkit.generate.stream_ids`'s
    (``do_sample``, ``temperature``, ``top_k``, ``top_p``, ``repetition_penalty``). The text is joined
    as a person would read it (GPT-1's ``king 's`` becomes ``king's``, see
    :func:`gptkit.tokenizer.detokenize`) unless ``raw``.
    """
    decode = tokenizer.decode if raw else tokenizer.decode_text
    device = next(model.parameters()).device
    ids = encode_prompt(model, tokenizer, prompt, max_new_tokens)
    kwargs = _sampling_kwargs(tokenizer, seed, kwargs)
    new_ids: list[int] = []
    emitted = ""
    eos = kwargs.get("eos_token_id")
    # Decode the continuation together with the prompt, so word boundaries (GPT-1's </w>) come out right.
    decoded_prompt = decode(ids)
    for step in stream_ids(model, torch.tensor([ids], device=device), max_new_tokens, **kwargs):
        token = int(step[0])
        if token == eos:
            return
        new_ids.append(token)
        text = decode(ids + new_ids)
        text = text[len(decoded_prompt) :] if text.startswith(decoded_prompt) else decode(new_ids)
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
    raw: bool = False,
    **kwargs,
) -> list[str]:
    """Continuations of several prompts at once (left-padded into one batch), joined as a person
    reads text unless ``raw`` (see :func:`stream_text`)."""
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
        texts.append(tokenizer.decode(row) if raw else tokenizer.decode_text(row))
    return texts
