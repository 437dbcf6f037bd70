"""Text in, text out: the tokenizer wrapped around :mod:`gptkit.generate`.

Prompts longer than the model can take are left-truncated: the last ``context_length - max_new_tokens``
prompt tokens are kept (a warning says how many were dropped), since the end of a prompt is
what the continuation depends on most.
"""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path

import torch

from gptkit.generate import generate, stream_ids
from gptkit.hardware import Choice, has_decoding_layout, resolve_device, resolve_inference_dtype
from gptkit.model import GPT
from gptkit.quantize import QUANTIZATIONS, decoding_layout, quantize_int8
from gptkit.tokenizer import END_OF_TEXT, GPT1_SPECIAL_TOKENS, Tokenizer

# Tokens held back while streaming text: the newest ones may still change how the text reads.
HOLD_BACK = 2


def load_for_generation(
    model_dir: str | Path,
    tokenizer_dir: str | Path | None = None,
    dtype: str = "float32",
    device: str = "auto",
    decoding: bool = True,
    verbose: bool = False,
    quantize: str = "none",
) -> tuple[GPT, Tokenizer]:
    """A model in eval mode and its tokenizer, on ``device`` with weights in ``dtype``.

    ``dtype="auto"`` (the commands' default) picks what runs fastest here (see :mod:`gptkit.hardware`):
    for decoding one token at a time (``decoding=True``) half-size bf16 weights often win even without
    bf16 instructions; for scoring whole sequences, bf16 only where the hardware multiplies it
    natively. The choice rests on a short measurement, so the same seed may sample differently on
    another machine or under other load: fix ``dtype`` for reproducible samples (the default here,
    float32, is exact). ``verbose`` prints the choice and its reason. ``quantize="int8"`` stores the
    weights as int8 with bf16 activations (see :mod:`gptkit.quantize`): for decoding on a CPU.
    Weights loaded for decoding on a CPU (fp32, or bf16 where it is native) are stored in the layouts
    its matrix-vector products stream fastest (:func:`gptkit.quantize.decoding_layout`: the same
    values; sums in another order, so fp32 logits agree to ~1e-6).
    """
    if quantize not in QUANTIZATIONS:
        raise ValueError(f"quantize must be one of {', '.join(QUANTIZATIONS)}, got {quantize!r}")
    torch_device = resolve_device(device)
    if quantize == "int8":
        choice = Choice("bfloat16", "int8 weights, bf16 activations (--quantize int8)")
    else:
        choice = resolve_inference_dtype(dtype, torch_device, decoding=decoding)
    if verbose:
        print(f"device: {torch_device}; dtype: {choice.reason}", file=sys.stderr, flush=True)
    model = GPT.from_pretrained(model_dir, dtype=getattr(torch, choice.value), device=str(torch_device))
    if quantize == "int8":
        model = quantize_int8(model)
    elif decoding and has_decoding_layout(getattr(torch, choice.value), torch_device):
        model = decoding_layout(model)  # the same values, streamed faster on this CPU (quantize.py)
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
    eos = kwargs.get("eos_token_id")
    # Decode the continuation together with the prompt, so word boundaries (GPT-1's </w>) come out right.
    decoded_prompt = decode(ids)

    def continuation(new_ids: list[int]) -> str:
        text = decode(ids + new_ids)
        return text[len(decoded_prompt) :] if text.startswith(decoded_prompt) else decode(new_ids)

    def cut_at_stop(text: str) -> tuple[str, bool]:
        cuts = [text.find(s) for s in stop or () if s in text]
        return (text[: min(cuts)], True) if cuts else (text, False)

    new_ids: list[int] = []
    recent: list[str] = []  # the text after each of the last HOLD_BACK + 1 tokens, oldest first
    emitted = ""
    for step in stream_ids(model, torch.tensor([ids], device=device), max_new_tokens, **kwargs):
        token = int(step[0])
        if token == eos:
            break
        new_ids.append(token)
        recent = [*recent[-HOLD_BACK:], continuation(new_ids)]
        text, stopped = cut_at_stop(recent[-1])
        if stopped:
            break
        # Text can still change while its last tokens are the newest: half a UTF-8 character, or a
        # joining rule of GPT-1's detokenizer ("well -" becomes "well-known"). Emit only what the
        # text shared before the last HOLD_BACK tokens arrived: that much no longer changes.
        stable = recent[0] if len(recent) > HOLD_BACK else ""
        stable_length = len(os.path.commonprefix([text, stable]))
        while stable_length and text[stable_length - 1] == "\ufffd":  # a character still arriving
            stable_length -= 1
        if stable_length > len(emitted) and text.startswith(emitted):
            yield text[len(emitted) : stable_length]
            emitted = text[:stable_length]
    text, _ = cut_at_stop(recent[-1] if recent else "")
    text = text.removesuffix("\ufffd")  # a character cut short by the end of generation
    if text.startswith(emitted) and len(text) > len(emitted):
        yield text[len(emitted) :]


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
