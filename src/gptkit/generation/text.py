"""Text in, text out: the tokenizer wrapped around :mod:`gptkit.generation.decode`; loading a model
for it (:class:`InferenceConfig`), and ``gptkit generate``'s session (:class:`GenerateConfig`).

Prompts longer than the model can take are left-truncated: the last ``context_length - max_new_tokens``
prompt tokens are kept (a warning says how many were dropped), since the end of a prompt is
what the continuation depends on most.
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import torch

from gptkit import hub
from gptkit.generation.decode import generate, stream_ids
from gptkit.generation.incremental import IncrementalText
from gptkit.generation.sampling import DecodeStep, SamplingParams, sampling_params
from gptkit.hardware import (
    DEVICE_HELP,
    Choice,
    Precision,
    has_decoding_layout,
    resolve_device,
    resolve_precision,
)
from gptkit.model import GPT
from gptkit.model.completion import is_generation_adapter, merged_generation_adapter
from gptkit.model.layouts import QUANTIZATIONS, decoding_layout, load_int8
from gptkit.tokenizer import END_OF_TEXT, GPT1_SPECIAL_TOKENS, Tokenizer
from gptkit.tokenizer.chat_template import prompt_text, read_chat_template


@dataclass
class InferenceConfig:
    """How a model runs: where, and with which weights (the settings of generate, serve, perplexity,
    zero-shot and the trade-off sweep). Keyword-only, so that a command's config may add required
    fields before them."""

    dtype: Precision = field(
        default="auto",
        kw_only=True,
        metadata={
            "help": "Weights: auto (what runs fastest on this hardware, printed with its reason; float16 on "
            "a CUDA GPU without bf16), float32, bfloat16 or float16 (a CPU without fp16 instructions "
            "multiplies float16 slowly) (fp32, bf16 and fp16 are the same formats' other names)."
        },
    )
    quantize: Literal["none", "int8"] = field(
        default="none",
        kw_only=True,
        metadata={
            "help": "int8 weights, a quarter of fp32's bytes (fp32 activations, rounded to 8 bits "
            "for each product while decoding)."
        },
    )
    device: str = field(default="auto", kw_only=True, metadata={"help": DEVICE_HELP})

    def load(
        self,
        model_dir: str | Path,
        tokenizer_dir: str | Path | None = None,
        decoding: bool = True,
        verbose: bool = True,
    ) -> tuple[GPT, Tokenizer]:
        """:func:`load_for_generation` with these settings."""
        return load_for_generation(
            model_dir,
            tokenizer_dir,
            dtype=self.dtype,
            device=self.device,
            decoding=decoding,
            verbose=verbose,
            quantize=self.quantize,
        )


def load_for_generation(
    model_dir: str | Path,
    tokenizer_dir: str | Path | None = None,
    dtype: Precision = "float32",
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
    weights as int8 with fp32 activations (see :mod:`gptkit.model.layouts`): for decoding on a CPU.
    Weights loaded for decoding on a CPU (fp32, or bf16 where it is native) are stored in the layouts
    its matrix-vector products stream fastest (:func:`gptkit.model.layouts.decoding_layout`: the same
    values; sums in another order, so fp32 logits agree to ~1e-6).
    """
    if quantize not in QUANTIZATIONS:
        raise ValueError(f"quantize must be one of {', '.join(QUANTIZATIONS)}, got {quantize!r}")
    hub.ensure_available(model_dir, tokenizer_dir)  # a name that cannot be had fails before any measuring
    torch_device = resolve_device(device)
    if quantize == "int8":
        choice = Choice(torch.float32, "int8 weights, fp32 activations (--quantize int8)")
    else:
        choice = resolve_precision(dtype, torch_device, "decoding" if decoding else "scoring")
    if verbose:
        print(f"device: {torch_device}; dtype: {choice.reason}", file=sys.stderr, flush=True)
    adapter = is_generation_adapter(hub.resolve(model_dir))
    if quantize == "int8" and adapter:
        raise ValueError(f"{model_dir}: a LoRA adapter is quantized once merged: `gptkit finetune --merge`")
    if quantize == "int8":
        model = load_int8(model_dir, device=torch_device)  # each block quantized as it is read
    else:
        if adapter:  # a generation run's LoRA adapter, merged into its base
            model = merged_generation_adapter(hub.resolve(model_dir)).to(
                device=torch_device, dtype=choice.dtype
            )
        else:
            model = GPT.from_pretrained(model_dir, dtype=choice.dtype, device=str(torch_device))
        if decoding and has_decoding_layout(choice.dtype, torch_device):
            # The same values, streamed faster on this CPU (gptkit.model.layouts).
            model = decoding_layout(model)
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


def _decode_step(model: GPT, tokenizer: Tokenizer) -> tuple[DecodeStep, int]:
    """The step for text (only ids the tokenizer decodes; its end of text ends), and the id that
    pads: the end of text where there is one, as GPT-2 was trained."""
    step = DecodeStep.for_tokenizer(model.config.total_vocab_size, tokenizer)
    return step, step.end_ids[0] if step.end_ids else 0


def stream_text(
    model: GPT,
    tokenizer: Tokenizer,
    prompt: str,
    max_new_tokens: int | None = None,
    params: SamplingParams | None = None,
    raw: bool = False,
    generator: torch.Generator | None = None,
    **settings,
) -> Iterator[str]:
    """Yield the continuation of ``prompt`` piece by piece, as tokens are decoded.

    ``params`` (or :class:`SamplingParams`' fields as keywords: ``temperature``, ``top_k``, ``top_p``,
    ``repetition_penalty``, ``seed``, ``stop``; their defaults otherwise) say how; ``max_new_tokens``
    overrides ``params.max_tokens``. Tokens the tokenizer cannot decode are never chosen. Stop
    strings end the text before them. The text is joined as a person would read it (GPT-1's ``king 's`` becomes ``king's``, see
    :func:`gptkit.tokenizer.detokenize`) unless ``raw``. ``generator``: draws the samples (default: a
    new one seeded with ``params.seed``; pass one to draw several different seeded samples). See
    :class:`~gptkit.generation.incremental.IncrementalText` for what is held back while streaming.
    """
    params = sampling_params(params, max_new_tokens, **settings)
    device = next(model.parameters()).device
    ids = encode_prompt(model, tokenizer, prompt, params.max_tokens)
    step, pad = _decode_step(model, tokenizer)
    text = IncrementalText(tokenizer, ids, params.stop, raw=raw)
    for next_ids in stream_ids(
        model,
        torch.tensor([ids], device=device),
        params=params,
        generator=generator,
        step=step,
        pad_token_id=pad,
    ):
        token = int(next_ids[0])
        if token in step.end_ids:
            break
        piece = text.push(token)
        if piece:
            yield piece
        if text.stopped:
            return
    rest = text.flush()
    if rest:
        yield rest


def generate_text(
    model: GPT,
    tokenizer: Tokenizer,
    prompts: str | Sequence[str],
    max_new_tokens: int | None = None,
    params: SamplingParams | None = None,
    raw: bool = False,
    generator: torch.Generator | None = None,
    **settings,
) -> str | list[str]:
    """Continuations of several prompts at once (left-padded into one batch), joined as a person
    reads text unless ``raw``, each cut at its first stop string (see :func:`stream_text`).

    One prompt (a string) gives one string; a list of prompts, a list in the same order.
    """
    if isinstance(prompts, str):  # not a sequence of one-character prompts
        return generate_text(model, tokenizer, [prompts], max_new_tokens, params, raw, generator, **settings)[
            0
        ]
    params = sampling_params(params, max_new_tokens, **settings)
    device = next(model.parameters()).device
    encoded = [encode_prompt(model, tokenizer, p, params.max_tokens) for p in prompts]
    step, pad = _decode_step(model, tokenizer)
    width = max(len(ids) for ids in encoded)
    input_ids = torch.tensor([[pad] * (width - len(ids)) + ids for ids in encoded], device=device)
    mask = torch.tensor([[0] * (width - len(ids)) + [1] * len(ids) for ids in encoded], device=device)
    out = generate(
        model, input_ids, params=params, attention_mask=mask, generator=generator, step=step, pad_token_id=pad
    )
    texts = []
    for ids, row in zip(encoded, out[:, width:].tolist()):
        ended = [i for i, token in enumerate(row) if token in step.end_ids]
        if ended:
            row = row[: ended[0]]
        text = IncrementalText(tokenizer, ids, params.stop, raw=raw)
        texts.append("".join(text.push(token) for token in row) + text.flush())
    return texts


@dataclass
class GenerateConfig(InferenceConfig):
    """Generate text from a prompt, printing it as it is decoded."""

    model: str = field(
        metadata={
            "help": "Model folder (HF, gptkit or converted GPT-1 release) or Hub name (gpt2, openai-gpt, org/name@rev)."
        }
    )
    prompt: str = field(
        default="", metadata={"help": "Text to continue (empty: start from the start/end-of-text token)."}
    )
    tokenizer: str | None = field(
        default=None, metadata={"help": "Tokenizer folder or Hub name (default: the model's)."}
    )
    interactive: bool = field(
        default=False, metadata={"help": "Read prompts from stdin, one a line, until EOF."}
    )
    sampling: SamplingParams = field(default_factory=SamplingParams)
    num_samples: int = field(default=1, metadata={"help": "Samples per prompt."})
    raw: bool = field(
        default=False,
        metadata={"help": "Print GPT-1's raw token text (`did n't`) instead of text as written."},
    )
    plain_prompt: bool = field(
        default=False,
        metadata={
            "help": "Continue the prompt as it is written, not as a user's turn of the model's chat "
            "template (a model fine-tuned with --task generation has one)."
        },
    )


def generation_session(config: GenerateConfig, prompts: Iterable[str] | None = None) -> Iterator[str]:
    """What ``gptkit generate`` prints, piece by piece as it is decoded: for each prompt,
    ``num_samples`` times the prompt, its continuation and a newline.

    ``prompts``: default ``config.prompt``, or with ``interactive`` the lines of stdin until EOF
    (read as the session reaches them). One generator, seeded with ``config.sampling.seed``, draws
    the whole session's samples: several samples of a prompt differ, and the same seed repeats the
    session (without a seed: torch's global generator).
    """
    model, tokenizer = config.load(config.model, config.tokenizer)
    generator = config.sampling.generator(next(model.parameters()).device)
    # A model that declares a chat template answers prompts laid out as it was trained on them.
    template = None if config.plain_prompt else read_chat_template(hub.resolve(config.model))
    if prompts is None:
        prompts = (line.rstrip("\n") for line in sys.stdin) if config.interactive else [config.prompt]
    for prompt in prompts:
        text = prompt_text(template, prompt, END_OF_TEXT) if template and prompt else prompt
        for _ in range(config.num_samples):
            yield text
            yield from stream_text(
                model, tokenizer, text, params=config.sampling, raw=config.raw, generator=generator
            )
            yield "\n"
