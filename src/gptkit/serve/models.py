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

from gptkit import hub
from gptkit.data.batching import PADDING_SLACK, length_batches, pad_right
from gptkit.data.tasks import EncodedExample, TaskSpec, build_sequences
from gptkit.generation import load_for_generation
from gptkit.hardware import Precision, resolve_device, resolve_precision
from gptkit.io import read_safetensors
from gptkit.model import GPT
from gptkit.model.completion import is_generation_adapter
from gptkit.model.lora import AdapterSet, is_adapter_dir, read_adapter
from gptkit.model.task import (
    HEAD_NAME,
    SPECIAL_ROWS_NAME,
    TASK_NAME,
    TaskModel,
    adapter_base_dir,
    lora_settings,
    read_task_info,
    with_special_rows,
)
from gptkit.serve.batcher import Batcher
from gptkit.serve.config import ServeLimits
from gptkit.serve.engine import Engine
from gptkit.serve.sizing import cache_pages, choose_max_batch
from gptkit.tokenizer import Tokenizer, tokenizer_digest
from gptkit.tokenizer.chat_template import read_chat_template

COMPLETIONS, CLASSIFY, EMBEDDINGS = "/v1/completions", "/v1/classify", "/v1/embeddings"
CHAT_COMPLETIONS = "/v1/chat/completions"
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
    chat_template: str | None = None  # how /v1/chat/completions lays out messages (None: it refuses)

    @classmethod
    def create(
        cls, name: str, gpt: GPT, tokenizer: Tokenizer, limits: ServeLimits, task: TaskModel | None = None
    ) -> ServedModel:
        batching = dict(max_batch=limits.pooling_batch, max_queue=limits.max_queue)
        batching["max_wait"] = limits.batch_wait_ms / 1000
        batchers = {EMBEDDINGS: Batcher(functools.partial(embed, gpt), name=f"embed-{name}", **batching)}
        if task is None:
            return cls(name, gpt, tokenizer, batchers, engine=create_engine(name, gpt, tokenizer, limits))
        run = functools.partial(classify, task)
        batchers[CLASSIFY] = Batcher(run, name=f"classify-{name}", **batching)
        return cls(name, gpt, tokenizer, batchers, task=task)

    @property
    def endpoints(self) -> tuple[str, ...]:
        return (COMPLETIONS, CHAT_COMPLETIONS, EMBEDDINGS) if self.task is None else (CLASSIFY, EMBEDDINGS)

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


def create_engine(name: str, gpt: GPT, tokenizer: Tokenizer, limits: ServeLimits) -> Engine:
    """The decode loop of a language model, its batch and cache sized from ``limits`` or, where they
    are not given, from the measured step and the memory (:mod:`gptkit.serve.sizing`)."""
    max_batch = limits.max_batch
    if max_batch is None:
        max_batch = choose_max_batch(
            gpt, log=lambda line: print(f"{name}: {line}", file=sys.stderr, flush=True)
        )
    pages = cache_pages(gpt, max_batch, limits.cache_mib) if gpt.native_step is not None else None
    return Engine(
        gpt,
        tokenizer,
        max_batch=max_batch,
        max_queue=limits.max_queue,
        cache_pages=pages,
        step_tokens=limits.step_tokens,
    )


# The forward passes ---------------------------------------------------------------------------------


def embed(gpt: GPT, sequences: list[list[int]]) -> list[list[float]]:
    """h_n at the last token of each sequence, in fp32."""
    return last_hidden_states(gpt, sequences).float().cpu().tolist()


@torch.inference_mode()
def last_hidden_states(gpt: GPT, sequences: list[list[int]]) -> torch.Tensor:
    """h_n at the last token of each sequence (N, d), from one right-padded forward pass (causal
    attention: no real token sees the padding after it)."""
    # Not wte.weight: under LoRA adapters that joins the embedding's parts, a copy of the table.
    device = next(gpt.parameters()).device
    ids = pad_right(sequences, max_length=gpt.config.context_length).to(device)
    hidden = gpt(ids, compute_logits=False).hidden_states  # (N, T, d)
    last = torch.tensor([len(sequence) - 1 for sequence in sequences], device=device)  # (N,)
    return hidden[torch.arange(len(sequences), device=device), last]


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
    dtype: Precision = "auto",
    device: str = "auto",
    quantize: str = "none",
) -> ServedModel:
    """A language model, or a fine-tuned one (a directory with ``task.json``), ready to serve.
    ``quantize`` applies to language models; a fine-tuned model carries its own tokenizer."""
    if not (Path(directory) / TASK_NAME).is_file():
        gpt, tokenizer = load_for_generation(
            directory, tokenizer_dir, dtype=dtype, device=device, verbose=True, quantize=quantize
        )
        served = ServedModel.create(name, gpt, tokenizer, limits)
        served.chat_template = read_chat_template(hub.resolve(directory))
        return served
    if tokenizer_dir is not None:
        raise ValueError(
            f"{directory} is a fine-tuned model: it is served with its own tokenizer (no --tokenizer)"
        )
    task = TaskModel.from_pretrained(directory, device=device)
    choice = resolve_precision(dtype, task.device, "scoring")
    task = task.to(choice.dtype)
    print(f"{name}: device: {task.device}; dtype: {choice.reason}", file=sys.stderr, flush=True)
    return ServedModel.create(name, task.gpt, task.tokenizer, limits, task=task)


def load_models(models: Mapping[str, str | Path], limits: ServeLimits, **options) -> list[ServedModel]:
    """:func:`load_model` for each name and directory, in order; LoRA adapters of one base share one
    copy of it (:func:`load_adapters`)."""
    # Hub names (gpt2, org/name@rev) become their cached folders once, here, before anything loads.
    models = {name: hub.resolve(source) for name, source in models.items()}
    by_base: dict[Path, dict[str, Path]] = defaultdict(dict)
    for name, directory in models.items():
        if is_adapter_dir(directory) and not is_generation_adapter(directory):
            # A fine-tuned task's adapter; a generation run's is merged into its base (load_model).
            base = adapter_base_dir(Path(directory), read_task_info(Path(directory))).resolve()
            by_base[base][name] = Path(directory)
    served = {}
    for base, adapters in by_base.items():
        for model in load_adapters(
            base, adapters, limits, dtype=options.get("dtype", "auto"), device=options.get("device", "auto")
        ):
            served[model.name] = model
    for name, directory in models.items():
        if name not in served:
            served[name] = load_model(name, directory, limits, **options)
    return [served[name] for name in models]


# Many adapters, one base -----------------------------------------------------------------------------


def load_adapters(
    base: Path,
    adapters: Mapping[str, Path],
    limits: ServeLimits,
    *,
    dtype: Precision = "auto",
    device: str = "auto",
) -> list[ServedModel]:
    """LoRA adapters of ``base`` served over one copy of its weights. Their classify requests share
    one batcher: a batch mixes adapters, each row adding its own adapter's terms (:func:`classify_mixed`)."""
    infos = {name: read_task_info(directory) for name, directory in adapters.items()}
    first, first_info = next(iter(adapters.values())), next(iter(infos.values()))
    gpt, _ = with_special_rows(GPT.from_pretrained(base), first, first_info)
    resolved = resolve_device(device)
    choice = resolve_precision(dtype, resolved, "scoring")
    gpt = gpt.to(device=resolved, dtype=choice.dtype).eval()
    adapter_set = AdapterSet(gpt, int(first_info["lora"]["first_trainable_row"]))
    tasks, tokenizers = {}, {}
    for name, directory in adapters.items():
        info = infos[name]
        if int(info["lora"]["first_trainable_row"]) != adapter_set.first_row:
            raise ValueError(
                f"{directory}: its special tokens start at another row than {first}'s, over the same base"
            )
        _, _, lora_state = read_adapter(directory)
        rows = read_safetensors(directory / SPECIAL_ROWS_NAME)["rows"]
        adapter_set.add(name, lora_settings(info), lora_state, rows)
        tokenizer = shared_tokenizer(directory, tokenizers)
        task = TaskModel(gpt, TaskSpec(**info["spec"]), 0.0, 0.0, tokenizer)
        task.head.load_state_dict(read_safetensors(directory / HEAD_NAME))
        tasks[name] = task.to(device=resolved, dtype=gpt.wte.frozen.dtype).eval()
    print(
        f"{', '.join(adapters)}: {len(adapters)} LoRA adapter(s) over one copy of {base.name}; "
        f"device: {resolved}; dtype: {choice.reason}",
        file=sys.stderr,
        flush=True,
    )
    batching = dict(
        max_batch=limits.pooling_batch, max_queue=limits.max_queue, max_wait=limits.batch_wait_ms / 1000
    )
    shared = Batcher(
        functools.partial(classify_mixed, adapter_set, tasks), name=f"classify-{base.name}", **batching
    )
    served = []
    for name, task in tasks.items():
        embed_one = functools.partial(embed_with_adapter, adapter_set, name)
        batchers = {
            EMBEDDINGS: Batcher(embed_one, name=f"embed-{name}", **batching),
            CLASSIFY: AdapterBatcher(shared, name),
        }
        served.append(ServedModel(name, gpt, task.tokenizer, batchers, task=task))
    return served


def shared_tokenizer(directory: Path, loaded: dict[str, Tokenizer]) -> Tokenizer:
    """The tokenizer of ``directory``, loaded once for every directory with the same files (adapters
    of one base carry copies of its tokenizer: each a few tens of MB in memory once loaded)."""
    key = tokenizer_digest(directory)
    if key not in loaded:
        loaded[key] = Tokenizer.from_pretrained(directory)
    return loaded[key]


@torch.inference_mode()
def classify_mixed(
    adapters: AdapterSet, tasks: Mapping[str, TaskModel], items: list[tuple[str, EncodedExample]]
) -> list[dict]:
    """:func:`classify` of a batch whose inputs are ``(adapter, example)``, whatever their adapters:
    every sequence of every input runs in one pass of the base (one per group of similar lengths, as
    in :meth:`TaskModel.logits`), adding its own adapter's terms (:meth:`AdapterSet.per_row`); then
    each input's h_e goes through its own adapter's head."""
    owners = [name for name, example in items for _ in example.sequences]  # each sequence's adapter
    sequences = [sequence for _, example in items for sequence in example.sequences]
    h_n: list[torch.Tensor] = [torch.empty(0)] * len(sequences)
    lengths = [len(sequence) for sequence in sequences]
    # All in one pass unless the padding would cost too much (at least 1: an empty batch has no size).
    for indices in length_batches(lengths, max(len(sequences), 1), slack=PADDING_SLACK):
        with adapters.per_row([owners[i] for i in indices]) as gpt:
            hidden = last_hidden_states(gpt, [sequences[i] for i in indices])
        for i, h in zip(indices, hidden):
            h_n[i] = h
    first = [0]  # where each input's sequences start
    groups: dict[tuple[str, int], list[int]] = defaultdict(list)  # inputs of one adapter and one C
    for i, (name, example) in enumerate(items):
        first.append(first[-1] + len(example.sequences))
        groups[name, len(example.sequences)].append(i)
    records: list[dict] = [{}] * len(items)
    for (name, _), indices in groups.items():
        h_e = torch.stack([torch.stack(h_n[first[i] : first[i + 1]]) for i in indices])  # (n, C, d)
        logits = tasks[name].read_out(h_e).float().cpu()
        for i, record in zip(indices, tasks[name].records(logits)):
            records[i] = record
    return records


def embed_with_adapter(adapters: AdapterSet, name: str, sequences: list[list[int]]) -> list[list[float]]:
    with adapters.using(name) as gpt:
        return embed(gpt, sequences)


class AdapterBatcher:
    """One adapter's door into the batcher its base's adapters share: its inputs go in tagged."""

    def __init__(self, shared: Batcher, adapter: str):
        self.shared, self.adapter = shared, adapter

    async def submit(self, items: Sequence, timeout: float) -> list:
        return await self.shared.submit([(self.adapter, item) for item in items], timeout)

    def start(self) -> None:
        if not self.shared.alive:
            self.shared.start()

    async def stop(self) -> None:
        if self.shared.alive:
            await self.shared.stop()

    def __getattr__(self, name: str):  # alive, queue_length and the counters: the shared batcher's
        return getattr(self.shared, name)
