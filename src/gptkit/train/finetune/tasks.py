"""Supervised fine-tuning (GPT-1 §3.2): L3(C) = L2(C) + λ·L1(C).

This module reads the data, builds the task model and trains it through the one training loop:
the model itself (the linear head W_y on h_n, eq. 3, and the loss) is :mod:`gptkit.model.task`,
the input transformations :mod:`gptkit.data.tasks`, the shared run setup :mod:`gptkit.train.run`.
The best dev-set model is kept at the top of the run directory, ready for
``TaskModel.from_pretrained``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn as nn

from gptkit import hub
from gptkit.config import config_error
from gptkit.data.batching import PAD_TO_MULTIPLE
from gptkit.data.examples import GENERATIVE_TASKS, Example
from gptkit.data.registry import DATASETS
from gptkit.data.sampler import EpochSampler
from gptkit.data.tasks import (
    EncodedExample,
    TaskSpec,
    collate,
    encode_examples,
    infer_labels,
    special_token_ids,
    task_metrics,
)
from gptkit.io import write_json
from gptkit.model import GPT
from gptkit.model.lora import LoRASettings, add_lora
from gptkit.model.task import TaskModel, lora_task_info, read_task_state, save_task_model
from gptkit.tokenizer import Tokenizer
from gptkit.train.config import TrainConfig
from gptkit.train.distributed.processes import (
    DistributedContext,
    unwrap,
    wrap_model,
)
from gptkit.train.finetune.common import MERGED_DIR, BestModel, load_examples, trainable_parameters
from gptkit.train.finetune.config import (
    FINETUNING_HELP,
    FinetuneConfig,
    LoRAConfig,
    paper_finetuning,
    resolved_training,
)
from gptkit.train.finetune.generation import finetune_generation
from gptkit.train.loop import Trainer
from gptkit.train.run import (
    base_vocab_size,
    build_model,
    resume_latest,
    resuming,
    run_config,
    run_stage,
    sequence_length,
)
from gptkit.train.rundir import RunDir

# The fine-tuning API, its configs included (they live in finetune_config.py).
__all__ = [
    "FINETUNING_HELP",
    "MERGED_DIR",
    "BestModel",
    "ExampleBatches",
    "FinetuneConfig",
    "LoRAConfig",
    "build_gpt",
    "finetune",
    "load_examples",
    "paper_finetuning",
    "resolved_training",
    "task_spec",
]


class ExampleBatches(EpochSampler):
    """Fine-tuning's batch source: epochs of shuffled examples (the sampler of pre-training's
    windows; examples of similar length batched together with ``group_by_length``), collated. Its
    position is the epoch sampler's ``state_dict``."""

    def __init__(
        self,
        examples: list[EncodedExample],
        spec: TaskSpec,
        train: TrainConfig,
        rank: int,
        world_size: int,
        group_by_length: bool = True,
    ):
        lengths = [max(map(len, e.sequences)) for e in examples] if group_by_length else None
        super().__init__(
            len(examples),
            train.batch_size,
            train.seed,
            rank,
            world_size,
            items="training examples",
            lengths=lengths,
        )
        self.examples, self.regression, self.max_length = examples, spec.regression, spec.max_length

    def next_batch(self) -> dict[str, torch.Tensor]:
        batch = [self.examples[i] for i in self.next_indices()]
        return collate(batch, self.regression, PAD_TO_MULTIPLE, self.max_length)


def build_gpt(config: FinetuneConfig, tokenizer: Tokenizer, specials: dict[str, int]) -> GPT:
    """The transformer: pre-trained (``init``, keeping ``transfer_layers`` blocks) or new, with rows
    for the special tokens of the input transformations."""
    gpt = build_model(config.model, base_vocab_size(tokenizer))
    if config.model.init and config.transfer_layers is not None and not config.model.random_init:
        gpt.reinitialize_blocks(keep=config.transfer_layers)
    return ready_for_task(gpt, specials, config.lora.settings())


def ready_for_task(gpt: GPT, specials: dict[str, int], lora: LoRASettings | None = None) -> GPT:
    """``gpt`` as fine-tuning trains it: rows for the special tokens, LoRA adapters on a LoRA run,
    training mode (the memory estimate and gptkit.testing's adapter runs build theirs through this)."""
    # New rows N(0, 0.02) for _start_, _delimiter_, _classify_ when the model lacks them.
    gpt.add_special_tokens(max(specials.values()) + 1 - gpt.config.total_vocab_size)
    if lora is not None:
        # Everything frozen but the LoRA matrices and the special tokens' rows (the last rows).
        add_lora(gpt, lora, first_trainable_row=min(specials.values()))
    return gpt.train()


def lora_info(config: FinetuneConfig, specials: dict[str, int]) -> dict:
    """What ``task.json`` records of a LoRA run, to rebuild its model from the base (none: full)."""
    settings = config.lora.settings()
    return {} if settings is None else lora_task_info(settings, config.model.init, min(specials.values()))


def with_dataset_task(config: FinetuneConfig) -> tuple[FinetuneConfig, str]:
    """A copy of ``config`` with the public dataset's task filled in, and the metric to keep the best by."""
    if config.dataset and config.dataset in DATASETS:
        known = DATASETS[config.dataset]
        task, regression = config.task or known.task, config.regression or known.regression
        return dataclasses.replace(config, task=task, regression=regression), known.metric
    return config, "pearson" if config.regression else "accuracy"


def task_labels(config: FinetuneConfig, examples: list[Example]) -> list[str] | None:
    """The head's classes: a public dataset's fixed set (a slice of its training rows may lack a
    class that its dev set has), else the labels of the training rows."""
    known = DATASETS.get(config.dataset or "")
    if known is not None and known.labels and not config.train and not config.regression:
        return list(known.labels)
    return infer_labels(examples, config.task, config.regression)


def task_spec(
    config: FinetuneConfig, examples: list[Example], gpt: GPT, specials: dict[str, int], metric: str
) -> TaskSpec:
    """The task as the model will know it: layout, labels, input limit."""
    multiple_choice = config.task == "multiple_choice" and examples
    return TaskSpec(
        task=config.task,
        labels=task_labels(config, examples),
        regression=config.regression,
        n_choices=len(examples[0].fields["choices"]) if multiple_choice else None,
        # A context shorter than the loaded model's (--context-length) bounds the inputs too.
        max_length=sequence_length(config.model, gpt.config, config.max_length),
        metric=metric,
        specials=specials,
    )


def finetune(config: FinetuneConfig) -> dict:
    """Fine-tune on a task; keeps the best dev model in ``config.out``; returns its results.

    The config is not changed: the task and step counts derived here live in copies.
    """
    config, metric = with_dataset_task(config)
    if not config.task:
        raise config_error(config, "task", "is required (or --dataset NAME)")
    tokenizer_dir = config.tokenizer or config.model.init
    if not tokenizer_dir:
        raise config_error(config, "tokenizer", "is required when training from scratch (no --init)")
    out_dir = Path(config.out)
    hub.ensure_available(config.model.init, tokenizer_dir)  # a name that cannot be had leaves no run folder
    with run_stage(out_dir, config.resume, "finetune", config.device, config.training) as ctx:
        if config.task in GENERATIVE_TASKS:
            return finetune_generation(config, tokenizer_dir, out_dir, ctx)
        return _finetune(config, metric, tokenizer_dir, out_dir, ctx)


@dataclass
class _Prepared:
    """What a fine-tuning trains: the task model over its transformer, the encoded data and the
    training settings with their step counts resolved."""

    tokenizer: Tokenizer
    specials: dict[str, int]
    model: TaskModel
    batches: ExampleBatches
    encoded_dev: list[EncodedExample]
    train: TrainConfig
    skipped: dict[str, int]  # bad rows left out, by split

    @property
    def examples(self) -> dict[str, int]:
        return {"train": len(self.batches.examples), "dev": len(self.encoded_dev)}


def _prepare(config: FinetuneConfig, metric: str, tokenizer_dir: str, ctx: DistributedContext) -> _Prepared:
    """The tokenizer, the transformer (pre-trained or new), the task read and encoded, the head W_y
    drawn from the seed alone (pre-trained and random sides share it), and the batches."""
    tokenizer = Tokenizer.from_pretrained(tokenizer_dir)
    specials = special_token_ids(tokenizer)
    train = config.training
    torch.manual_seed(train.seed)
    gpt = build_gpt(config, tokenizer, specials)
    train_examples = load_examples(config, "train")[: config.max_train_examples]
    dev_examples = load_examples(config, "dev")[: config.max_eval_examples]
    spec = task_spec(config, train_examples, gpt, specials, metric)
    encoded_train, skipped_train = encode_examples(
        train_examples, spec, tokenizer.encode, skip_bad_rows=config.skip_bad_rows
    )
    encoded_dev, skipped_dev = encode_examples(
        dev_examples, spec, tokenizer.encode, skip_bad_rows=config.skip_bad_rows
    )
    if ctx.is_main and (skipped_train or skipped_dev):
        print(f"skipped bad rows: {skipped_train} in train, {skipped_dev} in dev")
    torch.manual_seed(train.seed)  # W_y from the seed alone: pre-trained and random sides share it
    model = TaskModel(gpt, spec, config.clf_dropout, config.lm_coef, tokenizer).to(ctx.device)
    torch.manual_seed(train.seed + ctx.rank)
    batches = ExampleBatches(
        encoded_train, spec, train, ctx.rank, ctx.world_size, group_by_length=config.group_by_length
    )
    train = resolved_training(train, config.epochs, batches.steps_per_epoch)
    skipped = {"train": skipped_train, "dev": skipped_dev}
    return _Prepared(tokenizer, specials, model, batches, encoded_dev, train, skipped)


def _finetune(
    config: FinetuneConfig,
    metric: str,
    tokenizer_dir: str,
    out_dir: Path,
    ctx: DistributedContext,
) -> dict:
    """:func:`finetune`'s work, while the run directory is held and the process group runs."""
    run = _prepare(config, metric, tokenizer_dir, ctx)
    model, spec, encoded_dev = run.model, run.model.spec, run.encoded_dev

    def save_model(directory: Path, state: dict[str, torch.Tensor]) -> None:
        info = {**model.task_info(), **lora_info(config, run.specials)}
        save_task_model(directory, model.gpt.config, state, info)

    def load_model_state(checkpoint: Path) -> dict[str, torch.Tensor]:
        # A LoRA checkpoint holds the adapter alone: the frozen rest is the model's own.
        return read_task_state(checkpoint, model.state_dict())

    trained, total = trainable_parameters(model)
    if ctx.is_main and config.lora.rank is not None:
        print(f"LoRA: training {trained:,} of {total:,} parameters ({100 * trained / total:.2f}%)")

    def evaluate(module: nn.Module) -> dict[str, float]:
        logits = unwrap(module).logits(encoded_dev, config.eval_batch_size)
        metrics = task_metrics(spec, logits, [e.target for e in encoded_dev])
        return {f"dev_{k}": v for k, v in metrics.items()}

    best = BestModel(out_dir, metric, save_model, ctx, resuming(config.resume, out_dir))
    described = run_config(
        "finetune",
        config,
        run.train,
        model.gpt.config,
        task=spec.to_dict(),
        examples=run.examples,
        skipped_rows=run.skipped,
    )
    trainer = Trainer(
        wrap_model(model, ctx, run.train),
        run.train,
        run.batches,
        out_dir,
        save_model,
        ctx=ctx,
        evaluate=evaluate,
        after_evaluate=best,
        run_config=described,
    )
    if ctx.is_main:
        run.tokenizer.save_pretrained(out_dir)
    if resuming(config.resume, out_dir):  # --resume, or a worker group torchrun restarted
        resume_latest(trainer, load_model_state)
    trainer.fit()
    if ctx.is_main and config.merge and best.best.get("step") is not None:
        # The best adapter, applied to its base and merged: a full model like any other.
        TaskModel.from_pretrained(out_dir, device="cpu").save_pretrained(out_dir / MERGED_DIR)
    return _results(config, metric, run, best, trainer.step, (trained, total), out_dir, ctx)


def _results(
    config: FinetuneConfig,
    metric: str,
    run: _Prepared,
    best: BestModel,
    steps: int,
    parameters: tuple[int, int],
    out_dir: Path,
    ctx: DistributedContext,
) -> dict:
    """What the run returns and keeps in results.json: the best dev scores and their step, with
    what it trained (``parameters``: trained, all)."""
    results = {
        "task": run.model.spec.task,
        "metric": metric,
        "best_step": best.best.get("step"),
        "best": best.best.get("metrics", {}),
        "steps": steps,
        "examples": run.examples,
        "lm_coef": config.lm_coef,
        "init": config.model.init,
        "trainable_parameters": parameters[0],
        "parameters": parameters[1],
    }
    if ctx.is_main:
        write_json(RunDir(out_dir).results, results)
    return results
