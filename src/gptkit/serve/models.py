"""The models one server answers for, each under its name, and the forward passes of their pooling
endpoints.

A language model answers ``/v1/completions`` (its :class:`Engine`) and ``/v1/embeddings``; a model
written by `gptkit finetune` (a directory with ``task.json``, loaded as a :class:`TaskModel`) answers
``/v1/classify`` and ``/v1/embeddings``. Each of these pooling endpoints has a :class:`Batcher`.

The embedding of a text is h_n, the final hidden state (after GPT-2's last LayerNorm), at its last
token: in a causal model the only position that has read the whole text. A fine-tuned model reads
the text in its classification layout, ``_start_ text _classify_``, so its embedding is the vector
its head W_y reads (GPT-1 §3.2): ``softmax(embedding · W_y)`` is a classification model's answer.
"""

from __future__ import annotations

import functools
import re
import sys
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from gptkit.data.tasks import EncodedExample, build_sequences, collate
from gptkit.generation import load_for_generation
from gptkit.hardware import resolve_inference_dtype
from gptkit.model import GPT
from gptkit.model.task import PAD_TO_MULTIPLE, TASK_NAME, TaskModel
from gptkit.serve.batcher import Batcher
from gptkit.serve.config import ServeLimits
from gptkit.serve.engine import Engine
from gptkit.tokenizer import Tokenizer

COMPLETIONS, CLASSIFY, EMBEDDINGS = "/v1/completions", "/v1/classify", "/v1/embeddings"
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]*")


@dataclass(eq=False)
class ServedModel:
    """A model under its API name, with the loops that answer for it."""

    name: str
    gpt: GPT
    tokenizer: Tokenizer
    # By endpoint: /v1/embeddings (token-id sequences → embeddings) and, for a fine-tuned model,
    # /v1/classify (encoded examples → TaskModel records).
    batchers: dict[str, Batcher]
    task: TaskModel | None = None  # a fine-tuned model
    engine: Engine | None = None  # a language model's decode loop (/v1/completions)

    @classmethod
    def create(
        cls, name: str, gpt: GPT, tokenizer: Tokenizer, limits: ServeLimits, task: TaskModel | None = None
    ) -> ServedModel:
        batching = dict(max_batch=limits.max_batch, max_queue=limits.max_queue)
        batching["max_wait"] = limits.batch_wait_ms / 1000
        batchers = {EMBEDDINGS: Batcher(functools.partial(embed, gpt), name=f"embed-{name}", **batching)}
        if task is None:
            engine = Engine(gpt, tokenizer, max_batch=limits.max_batch, max_queue=limits.max_queue)
            return cls(name, gpt, tokenizer, batchers, engine=engine)
        run = functools.partial(classify, task)
        batchers[CLASSIFY] = Batcher(run, name=f"classify-{name}", **batching)
        return cls(name, gpt, tokenizer, batchers, task=task)

    @property
    def endpoints(self) -> tuple[str, ...]:
        return (COMPLETIONS, EMBEDDINGS) if self.task is None else (CLASSIFY, EMBEDDINGS)

    def describe(self) -> str:
        """ "a language model", "a fine-tuned entailment model", ..."""
        if self.task is None:
            return "a language model"
        spec = self.task.spec
        return f"a fine-tuned {spec.task}{' (regression)' if spec.regression else ''} model"

    @property
    def max_input_tokens(self) -> int:
        """The longest text (in tokens) /v1/embeddings takes: the context, less _start_ and _classify_."""
        if self.task is None:
            return self.gpt.config.context_length
        return self.task.spec.max_length - 2

    def embedding_input(self, ids: list[int]) -> list[int]:
        """The tokens the model reads for a text of ``ids``: a fine-tuned model's classification layout."""
        if self.task is None:
            return ids
        spec = self.task.spec
        return build_sequences("classification", {"text": ids}, spec.specials, spec.max_length)[0]

    def start(self) -> None:
        """Start the loops, on the server's event loop."""
        if self.engine is not None and not self.engine.alive:
            self.engine.start()
        for batcher in self.batchers.values():
            batcher.start()

    async def stop(self) -> None:
        for batcher in self.batchers.values():
            await batcher.stop()
        if self.engine is not None:
            self.engine.stop()

    @property
    def alive(self) -> bool:
        loops = [*self.batchers.values(), *([self.engine] if self.engine is not None else [])]
        return all(loop.alive for loop in loops)


# The forward passes ---------------------------------------------------------------------------------


@torch.inference_mode()
def embed(gpt: GPT, sequences: list[list[int]]) -> list[list[float]]:
    """h_n at the last token of each sequence, in fp32, from one right-padded forward pass (causal
    attention: no real token sees the padding after it)."""
    examples = [EncodedExample([sequence], None) for sequence in sequences]
    batch = collate(examples, pad_to_multiple=PAD_TO_MULTIPLE, max_length=gpt.config.context_length)
    device = gpt.wte.weight.device
    hidden = gpt(batch["input_ids"][:, 0].to(device), compute_logits=False).hidden_states  # (N, T, d)
    last = batch["clf_positions"][:, 0].to(device)  # (N,)
    return hidden[torch.arange(len(sequences), device=device), last].float().cpu().tolist()


def classify(task: TaskModel, examples: list[EncodedExample]) -> list[dict]:
    """:meth:`TaskModel.records` of each example; examples with another number of sequences (of
    choices) than the others run in a forward pass of their own."""
    groups: dict[int, list[int]] = defaultdict(list)
    for i, example in enumerate(examples):
        groups[len(example.sequences)].append(i)
    records: list[dict] = [{}] * len(examples)
    for indices in groups.values():
        logits = task.logits([examples[i] for i in indices], batch_size=len(indices))
        for i, record in zip(indices, task.records(logits)):
            records[i] = record
    return records


# Loading --------------------------------------------------------------------------------------------


def name_models(specs: Sequence[str], model_name: str | None = None) -> dict[str, str]:
    """``--model`` values, ``NAME=DIR`` or ``DIR``, as {name: DIR}. A bare ``DIR`` is named after its
    last folder, or ``model_name`` when it is the only model."""
    if model_name is not None and len(specs) > 1:
        raise ValueError("--model-name names a single model: with several, give each as --model NAME=DIR")
    named: dict[str, str] = {}
    for spec in specs:
        name, sep, directory = spec.partition("=")
        if not (sep and _NAME.fullmatch(name) and directory) or Path(spec).exists():
            name, directory = model_name or Path(spec).name or "gptkit", spec
        if name in named:
            raise ValueError(f"two models are named {name!r}: name them with --model NAME=DIR")
        named[name] = directory
    return named


def load_model(
    name: str,
    directory: str | Path,
    limits: ServeLimits,
    *,
    tokenizer_dir: str | Path | None = None,
    dtype: str = "auto",
    device: str = "auto",
    quantize: str = "none",
) -> ServedModel:
    """A language model, or a fine-tuned one (a directory with ``task.json``), ready to serve.
    ``quantize`` applies to language models; a fine-tuned model carries its own tokenizer."""
    if not (Path(directory) / TASK_NAME).is_file():
        gpt, tokenizer = load_for_generation(
            directory, tokenizer_dir, dtype=dtype, device=device, verbose=True, quantize=quantize
        )
        return ServedModel.create(name, gpt, tokenizer, limits)
    if tokenizer_dir is not None:
        raise ValueError(
            f"{directory} is a fine-tuned model: it is served with its own tokenizer (no --tokenizer)"
        )
    task = TaskModel.from_pretrained(directory, device=device)
    choice = resolve_inference_dtype(dtype, task.device, decoding=False)
    task = task.to(getattr(torch, choice.value))
    print(f"{name}: device: {task.device}; dtype: {choice.reason}", file=sys.stderr, flush=True)
    return ServedModel.create(name, task.gpt, task.tokenizer, limits, task=task)


def load_models(models: Mapping[str, str | Path], limits: ServeLimits, **options) -> list[ServedModel]:
    """:func:`load_model` for each name and directory, in order."""
    return [load_model(name, directory, limits, **options) for name, directory in models.items()]
