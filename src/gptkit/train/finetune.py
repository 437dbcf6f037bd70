"""Supervised fine-tuning (GPT-1 §3.2): L3(C) = L2(C) + λ·L1(C).

A linear head W_y reads the final transformer state h_n at the ``<e>`` token (eq. 3); L2 is the
task's cross-entropy (or MSE for a regression score), L1 the language-model loss on the same input
sequences, weighted by λ = ``lm_coef`` (0.5 in the paper; 0 disables it). Batches come from the
input transformations of ``gptkit.data.tasks`` and run through the one training loop.
"""

from __future__ import annotations

import dataclasses
import math
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import torch
import torch.nn as nn
import torch.nn.functional as F

from gptkit.checkpoint import (
    CONFIG_NAME,
    SAFETENSORS_NAME,
    read_json,
    read_safetensors,
    read_state_dict,
    save_safetensors,
    save_state_dict,
    write_json,
)
from gptkit.config import GPTConfig
from gptkit.data.readers import DATASETS, Example, parse_columns, read_dataset, read_table
from gptkit.data.tasks import (
    EncodedExample,
    TaskSpec,
    collate,
    encode_examples,
    infer_labels,
    special_token_ids,
)
from gptkit.evaluate.metrics import classification_metrics, regression_metrics
from gptkit.hardware import resolve_device
from gptkit.model import GPT
from gptkit.tokenizer import Tokenizer
from gptkit.train.distributed import (
    DistributedContext,
    init_distributed,
    shutdown_distributed,
    unwrap,
    wrap_model,
)
from gptkit.train.loop import TrainConfig, Trainer

HEAD_NAME = "task_head.safetensors"
TASK_NAME = "task.json"
BEST_NAME = "best.json"  # the dev score of the model at the top of the run directory

WARMUP_FRACTION = 0.002


@dataclass
class FinetuneTrainConfig(TrainConfig):
    """Optimisation settings with the paper's fine-tuning defaults (§4.1): lr 6.25e-5, batch 32,
    warm-up over 0.2% of training, linear decay; unset step counts follow the epochs."""

    max_steps: int | None = field(
        default=None, metadata={"help": "Optimizer updates to run (default: epochs × updates per epoch)."}
    )
    batch_size: int = field(default=32, metadata={"help": "Global batch, in examples, per update."})
    lr: float = field(default=6.25e-5, metadata={"help": "Maximum learning rate."})
    warmup_steps: int | None = field(
        default=None, metadata={"help": "Linear warm-up updates from 0 (default: 0.2% of training)."}
    )
    schedule: Literal["cosine", "linear", "constant"] = field(
        default="linear", metadata={"help": "Decay after warm-up, to 0 at max_steps."}
    )
    eval_every: int | None = field(
        default=None, metadata={"help": "Evaluate on the dev set every N updates (default: every epoch)."}
    )
    checkpoint_every: int | None = field(
        default=None, metadata={"help": "Checkpoint every N updates (default: every epoch)."}
    )

    def default_warmup(self, max_steps: int) -> int:
        return max(1, round(WARMUP_FRACTION * max_steps))


def finetune_train_config(**overrides) -> FinetuneTrainConfig:
    """The paper's fine-tuning settings, with any field overridden."""
    return FinetuneTrainConfig(**overrides)


@dataclass
class TaskOutput:
    loss: torch.Tensor | None
    logits: torch.Tensor  # (N, labels), (N, choices) or (N,) for regression
    clf_loss: torch.Tensor | None = None
    lm_loss: torch.Tensor | None = None


class TaskModel(nn.Module):
    """A GPT with a linear head on h_n at the extract token, trained on L2 + λ·L1."""

    def __init__(self, gpt: GPT, spec: TaskSpec, clf_dropout: float = 0.1, lm_coef: float = 0.5):
        super().__init__()
        self.gpt, self.spec, self.lm_coef = gpt, spec, lm_coef
        self.clf_dropout = nn.Dropout(clf_dropout)
        self.head = nn.Linear(gpt.config.d_model, spec.n_outputs)  # W_y
        nn.init.normal_(self.head.weight, 0.0, gpt.config.init_std)
        nn.init.zeros_(self.head.bias)

    def forward(
        self,
        input_ids: torch.Tensor,  # (N, C, T): C sequences per example
        clf_positions: torch.Tensor,  # (N, C): where each sequence's <e> is
        lm_labels: torch.Tensor | None = None,
        targets: torch.Tensor | None = None,
    ) -> TaskOutput:
        N, C, T = input_ids.shape
        want_lm = self.lm_coef > 0 and lm_labels is not None
        out = self.gpt(
            input_ids.view(N * C, T),
            labels=lm_labels.view(N * C, T) if want_lm else None,
            compute_logits=False,
        )
        hidden = out.hidden_states.view(N, C, T, -1)
        h_e = hidden[torch.arange(N)[:, None], torch.arange(C)[None, :], clf_positions]  # (N, C, d)
        task = self.spec.task
        if task == "multiple_choice":
            logits = self.head(self.clf_dropout(h_e)).squeeze(-1)  # one score per answer → softmax over C
        elif task == "similarity":
            logits = self.head(self.clf_dropout(h_e.sum(dim=1)))  # both orders, added element-wise
        else:
            logits = self.head(self.clf_dropout(h_e[:, 0]))
        if self.spec.regression:
            logits = logits.squeeze(-1)
        clf_loss = None
        if targets is not None:
            if self.spec.regression:
                clf_loss = F.mse_loss(logits.float(), targets.float())
            else:
                clf_loss = F.cross_entropy(logits.float(), targets)
        loss = clf_loss
        if clf_loss is not None and want_lm:
            loss = clf_loss + self.lm_coef * out.loss  # L3 = L2 + λ·L1
        return TaskOutput(loss=loss, logits=logits, clf_loss=clf_loss, lm_loss=out.loss if want_lm else None)


def reinitialize_blocks(gpt: GPT, keep: int) -> None:
    """Keep the embeddings and the first ``keep`` blocks; fresh N(0, 0.02) weights for the rest
    (the paper's layer-transfer analysis, §5 and Figure 2)."""
    if not 0 <= keep <= gpt.config.n_layer:
        raise ValueError(f"--transfer-layers must be in 0..{gpt.config.n_layer}, got {keep}")
    for block in gpt.h[keep:]:
        block.apply(gpt._init_weights)
        if gpt.config.scale_residual_init:
            std = gpt.config.init_std / math.sqrt(2 * gpt.config.n_layer)
            nn.init.normal_(block.attn.c_proj.weight, 0.0, std)
            nn.init.normal_(block.mlp.c_proj.weight, 0.0, std)
    if gpt.ln_f is not None and keep < gpt.config.n_layer:
        gpt.ln_f.apply(gpt._init_weights)


# Saving and loading ------------------------------------------------------------------------------


def save_task_model(
    directory: Path, gpt_config: GPTConfig, state: dict[str, torch.Tensor], extra: dict
) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    gpt_state = {k.removeprefix("gpt."): v for k, v in state.items() if k.startswith("gpt.")}
    save_state_dict(gpt_config, gpt_state, directory)
    save_safetensors({"weight": state["head.weight"], "bias": state["head.bias"]}, directory / HEAD_NAME)
    write_json(directory / TASK_NAME, extra)


def read_task_state(directory: Path) -> dict[str, torch.Tensor]:
    state = {f"gpt.{k}": v for k, v in read_state_dict(directory).items()}
    state.update({f"head.{k}": v for k, v in read_safetensors(directory / HEAD_NAME).items()})
    return state


def load_task_model(directory: str | Path, device: str | None = "auto") -> tuple[TaskModel, Tokenizer]:
    """A fine-tuned model (and its tokenizer) saved by ``gptkit finetune``."""
    directory = Path(directory)
    if not (directory / TASK_NAME).exists():
        raise FileNotFoundError(f"{directory}: no {TASK_NAME}; is this a fine-tuned model directory?")
    info = read_json(directory / TASK_NAME)
    spec = TaskSpec(**info["spec"])
    model = TaskModel(
        GPT.from_pretrained(directory), spec, info.get("clf_dropout", 0.1), info.get("lm_coef", 0.5)
    )
    model.load_state_dict(read_task_state(directory))
    return model.to(resolve_device(device)).eval(), Tokenizer.from_pretrained(directory)


# Data --------------------------------------------------------------------------------------------


class FinetuneBatches:
    """Epochs of shuffled examples; every update takes the next ``batch_size``, rank r its share."""

    def __init__(
        self,
        examples: list[EncodedExample],
        batch_size: int,
        seed: int,
        ctx: DistributedContext,
        regression: bool,
    ):
        if len(examples) < batch_size:
            raise ValueError(f"{len(examples)} training examples are fewer than one batch of {batch_size}")
        self.examples, self.batch_size, self.seed = examples, batch_size, seed
        self.ctx, self.regression = ctx, regression
        self.epoch, self.position = 0, 0
        self._order = self._permutation(0)

    @property
    def steps_per_epoch(self) -> int:
        return len(self.examples) // self.batch_size

    def _permutation(self, epoch: int) -> list[int]:
        generator = torch.Generator().manual_seed(self.seed * 100_003 + epoch)
        return torch.randperm(len(self.examples), generator=generator).tolist()

    def next_batch(self) -> dict[str, torch.Tensor]:
        if self.position + self.batch_size > len(self.examples):
            self.epoch, self.position = self.epoch + 1, 0
            self._order = self._permutation(self.epoch)
        share = self.batch_size // self.ctx.world_size
        start = self.position + self.ctx.rank * share
        self.position += self.batch_size
        return collate([self.examples[i] for i in self._order[start : start + share]], self.regression)

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self.position = int(state["epoch"]), int(state["position"])
        self._order = self._permutation(self.epoch)


@torch.no_grad()
def predict_logits(model: nn.Module, examples: list[EncodedExample], batch_size: int, device) -> torch.Tensor:
    """Task logits for every example, in order."""
    outputs = []
    for start in range(0, len(examples), batch_size):
        batch = collate(examples[start : start + batch_size])
        batch.pop("targets", None)
        batch.pop("lm_labels")
        outputs.append(model(**{k: v.to(device) for k, v in batch.items()}).logits.float().cpu())
    return torch.cat(outputs) if outputs else torch.zeros(0)


def task_metrics(spec: TaskSpec, logits: torch.Tensor, targets: list) -> dict[str, float]:
    if spec.regression:
        return regression_metrics(logits.tolist(), [float(t) for t in targets])
    predictions = logits.argmax(-1).tolist()
    n_classes = logits.size(-1) if spec.task != "multiple_choice" else 0
    return classification_metrics(predictions, list(targets), n_classes)


def load_examples(config: FinetuneConfig, split: str) -> list[Example]:
    """The train or dev split: a named public dataset or the user's file."""
    path = config.train if split == "train" else config.dev
    if path:
        return read_table(path, config.task, parse_columns(config.columns))
    if config.dataset:
        return read_dataset(config.dataset, split, config.data_dir)
    raise ValueError(f"no {split} data: give --{split} FILE or --dataset NAME")


# The command -------------------------------------------------------------------------------------


@dataclass
class FinetuneConfig:
    """What to fine-tune, on which task and data, and where to write it."""

    task: str | None = field(
        default=None, metadata={"help": "classification, entailment, similarity or multiple_choice."}
    )
    dataset: str | None = field(default=None, metadata={"help": f"A public dataset: {', '.join(DATASETS)}."})
    data_dir: str = field(
        default="data", metadata={"help": "Where the public datasets live (for --dataset)."}
    )
    train: str | None = field(
        default=None, metadata={"help": "Training file (CSV/TSV with a header, or JSONL)."}
    )
    dev: str | None = field(default=None, metadata={"help": "Dev file, evaluated after every epoch."})
    columns: str | None = field(
        default=None,
        metadata={"help": "field=column,... e.g. premise=s1,hypothesis=s2,label=gold; choices=a|b|c."},
    )
    regression: bool = field(default=False, metadata={"help": "The label is a real-valued score (MSE loss)."})
    init: str | None = field(
        default=None, metadata={"help": "Pre-trained model directory (omit to train from scratch)."}
    )
    tokenizer: str | None = field(default=None, metadata={"help": "Tokenizer directory (default: --init)."})
    preset: str = field(default="gpt1", metadata={"help": "Model shape when training from scratch."})
    n_layer: int | None = field(default=None, metadata={"help": "From scratch: layers."})
    n_head: int | None = field(default=None, metadata={"help": "From scratch: heads."})
    d_model: int | None = field(default=None, metadata={"help": "From scratch: width."})
    context: int | None = field(default=None, metadata={"help": "From scratch: context length."})
    out: str = field(default="runs/finetune", metadata={"help": "Run directory."})
    epochs: int = field(default=3, metadata={"help": "Passes over the training data."})
    lm_coef: float = field(
        default=0.5, metadata={"help": "λ, the weight of the auxiliary LM loss (0 disables it)."}
    )
    clf_dropout: float = field(default=0.1, metadata={"help": "Dropout before the classifier."})
    transfer_layers: int | None = field(
        default=None, metadata={"help": "Keep only the first K pre-trained blocks."}
    )
    max_length: int | None = field(
        default=None, metadata={"help": "Longest input sequence (default: the model's context)."}
    )
    skip_bad_rows: bool = field(
        default=False, metadata={"help": "Skip and count bad rows instead of stopping."}
    )
    max_train_examples: int | None = field(
        default=None, metadata={"help": "Use only the first N training examples."}
    )
    eval_batch_size: int = field(default=64, metadata={"help": "Examples per forward pass at evaluation."})
    resume: bool = field(
        default=False, metadata={"help": "Continue the run in --out from its latest checkpoint."}
    )
    device: str = field(
        default="auto", metadata={"help": "auto (CUDA, then MPS, then CPU), cpu, cuda or mps."}
    )

    def __post_init__(self) -> None:
        for name in ("epochs", "eval_batch_size"):
            if getattr(self, name) <= 0:
                raise ValueError(
                    f"FinetuneConfig.{name} (--{name.replace('_', '-')}): must be positive, got {getattr(self, name)}"
                )
        for name in ("max_length", "max_train_examples", "n_layer", "n_head", "d_model", "context"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise ValueError(
                    f"FinetuneConfig.{name} (--{name.replace('_', '-')}): must be positive, got {value}"
                )
        if not 0.0 <= self.clf_dropout < 1.0:
            raise ValueError(
                f"FinetuneConfig.clf_dropout (--clf-dropout): must be in [0, 1), got {self.clf_dropout}"
            )
        if self.lm_coef < 0:
            raise ValueError(f"FinetuneConfig.lm_coef (--lm-coef): λ must be >= 0, got {self.lm_coef}")
        if self.transfer_layers is not None and self.transfer_layers < 0:
            raise ValueError(
                f"FinetuneConfig.transfer_layers (--transfer-layers): must be >= 0, got {self.transfer_layers}"
            )


def _build_gpt(config: FinetuneConfig, tokenizer: Tokenizer) -> GPT:
    if config.init:
        gpt = GPT.from_pretrained(config.init)
        if config.transfer_layers is not None:
            reinitialize_blocks(gpt, config.transfer_layers)
        return gpt.train()
    overrides = {
        k: getattr(config, k) for k in ("n_layer", "n_head", "d_model") if getattr(config, k) is not None
    }
    if config.context:
        overrides["context_length"] = config.context
    vocab = len(tokenizer) - (tokenizer.n_special if tokenizer.style == "gpt1" else 0)
    return GPT(GPTConfig.from_preset(config.preset, vocab_size=vocab, **overrides))


def finetune(config: FinetuneConfig, train: TrainConfig) -> dict:
    """Fine-tune on a task; keeps the best dev checkpoint in ``config.out``; returns its results."""
    ctx = init_distributed(config.device)
    try:
        return _finetune(config, train, ctx)
    finally:
        shutdown_distributed()


def _finetune(config: FinetuneConfig, train: TrainConfig, ctx: DistributedContext) -> dict:
    if config.dataset and config.dataset in DATASETS:
        spec_info = DATASETS[config.dataset]
        config = dataclasses.replace(  # a copy: the caller's config stays as given
            config, task=config.task or spec_info.task, regression=config.regression or spec_info.regression
        )
        metric = spec_info.metric
    else:
        metric = "pearson" if config.regression else "accuracy"
    if not config.task:
        raise ValueError("--task is required (or --dataset NAME)")
    tokenizer_dir = config.tokenizer or config.init
    if not tokenizer_dir:
        raise ValueError("--tokenizer is required when training from scratch (no --init)")
    out_dir = Path(config.out)
    if not config.resume and (out_dir / "checkpoints").exists():
        raise FileExistsError(
            f"{out_dir} already holds a run: pass --resume to continue it, or choose another --out"
        )
    tokenizer = Tokenizer.from_pretrained(tokenizer_dir)
    torch.manual_seed(train.seed)
    gpt = _build_gpt(config, tokenizer)
    specials = special_token_ids(tokenizer)
    missing_rows = max(specials.values()) + 1 - gpt.config.total_vocab_size
    gpt.add_special_tokens(missing_rows)  # new rows N(0, 0.02) for _start_, _delimiter_, _classify_

    train_examples = load_examples(config, "train")
    if config.max_train_examples:
        train_examples = train_examples[: config.max_train_examples]
    dev_examples = load_examples(config, "dev")
    n_choices = (
        len(train_examples[0].fields["choices"])
        if config.task == "multiple_choice" and train_examples
        else None
    )
    spec = TaskSpec(
        task=config.task,
        labels=infer_labels(train_examples, config.task, config.regression),
        regression=config.regression,
        n_choices=n_choices,
        max_length=min(config.max_length or gpt.config.context_length, gpt.config.context_length),
        metric=metric,
        specials=specials,
    )
    encoded_train, skipped_train = encode_examples(
        train_examples, spec, tokenizer.encode, skip_bad_rows=config.skip_bad_rows
    )
    encoded_dev, skipped_dev = encode_examples(
        dev_examples, spec, tokenizer.encode, skip_bad_rows=config.skip_bad_rows
    )
    if ctx.is_main and (skipped_train or skipped_dev):
        print(f"skipped bad rows: {skipped_train} in train, {skipped_dev} in dev")

    model = TaskModel(gpt, spec, config.clf_dropout, config.lm_coef).to(ctx.device)
    torch.manual_seed(train.seed + ctx.rank)
    data = FinetuneBatches(encoded_train, train.batch_size, train.seed, ctx, spec.regression)
    # Step counts left unset follow the epochs; a copy, so the caller's config is never changed.
    max_steps = train.max_steps or config.epochs * data.steps_per_epoch
    train = dataclasses.replace(
        train,
        max_steps=max_steps,
        warmup_steps=train.warmup_for(max_steps),
        eval_every=data.steps_per_epoch if train.eval_every is None else train.eval_every,
        checkpoint_every=train.checkpoint_every or data.steps_per_epoch,
    )
    wrapped = wrap_model(model, ctx, fsdp=train.fsdp)
    task_info = {"spec": spec.to_dict(), "clf_dropout": config.clf_dropout, "lm_coef": config.lm_coef}
    best = {"score": -math.inf}
    if config.resume and (out_dir / BEST_NAME).exists():  # the best epoch before the interruption
        best.update(read_json(out_dir / BEST_NAME))

    def save_model(directory: Path, state: dict[str, torch.Tensor]) -> None:
        save_task_model(directory, gpt.config, state, task_info)

    def evaluate(module: nn.Module) -> dict[str, float]:
        logits = predict_logits(module, encoded_dev, config.eval_batch_size, ctx.device)
        metrics = task_metrics(spec, logits, [e.target for e in encoded_dev])
        metrics = {f"dev_{k}": v for k, v in metrics.items()}
        score = metrics.get(f"dev_{metric}", metrics.get("dev_accuracy", -math.inf))
        if score > best["score"]:
            best.update(score=score, step=trainer.step, metrics=metrics)
            if ctx.is_main:  # keep the best model at the top of the run directory
                state = {k: v.detach().cpu() for k, v in unwrap(module).state_dict().items()}
                save_model(out_dir / ".best.tmp", state)
                for name in (CONFIG_NAME, SAFETENSORS_NAME, HEAD_NAME, TASK_NAME):
                    os.replace(out_dir / ".best.tmp" / name, out_dir / name)
                shutil.rmtree(out_dir / ".best.tmp", ignore_errors=True)
                write_json(out_dir / BEST_NAME, best)
        return metrics

    run_config = {
        "stage": "finetune",
        "finetune": dataclasses.asdict(config),
        "train": dataclasses.asdict(train),
        "model": gpt.config.to_dict(),
        "task": spec.to_dict(),
        "examples": {"train": len(encoded_train), "dev": len(encoded_dev)},
        "skipped_rows": {"train": skipped_train, "dev": skipped_dev},
    }
    trainer = Trainer(
        wrapped, train, data, out_dir, save_model, ctx=ctx, evaluate=evaluate, run_config=run_config
    )
    if ctx.is_main:
        out_dir.mkdir(parents=True, exist_ok=True)
        tokenizer.save_pretrained(out_dir)
    if config.resume:
        checkpoint = trainer.latest_checkpoint()
        if checkpoint is None:
            raise FileNotFoundError(f"--resume: no checkpoint in {out_dir / 'checkpoints'}")
        trainer.resume(checkpoint, read_task_state)
    trainer.fit()
    results = {
        "task": spec.task,
        "metric": metric,
        "best_step": best.get("step"),
        "best": best.get("metrics", {}),
        "steps": trainer.step,
        "examples": run_config["examples"],
        "lm_coef": config.lm_coef,
        "init": config.init,
    }
    if ctx.is_main:
        write_json(out_dir / "results.json", results)
    return results


# Evaluation and prediction with a saved model ---------------------------------------------------


def _examples_for(model: TaskModel, tokenizer: Tokenizer, examples: list[Example], require_labels: bool):
    encoded, _ = encode_examples(examples, model.spec, tokenizer.encode, require_labels=require_labels)
    return encoded


def evaluate_model(
    model_dir: str | Path, examples: list[Example], batch_size: int = 64, device: str = "auto"
) -> dict[str, float]:
    model, tokenizer = load_task_model(model_dir, device)
    encoded = _examples_for(model, tokenizer, examples, require_labels=True)
    logits = predict_logits(model, encoded, batch_size, next(model.parameters()).device)
    return {"examples": len(encoded), **task_metrics(model.spec, logits, [e.target for e in encoded])}


def predict(
    model_dir: str | Path, examples: list[Example], batch_size: int = 64, device: str = "auto"
) -> list[dict]:
    """One record per example, in order: ``label`` (the original label string, the choice index, or
    the score) and ``probabilities``."""
    model, tokenizer = load_task_model(model_dir, device)
    encoded = _examples_for(model, tokenizer, examples, require_labels=False)
    logits = predict_logits(model, encoded, batch_size, next(model.parameters()).device)
    spec, records = model.spec, []
    for row in logits:
        if spec.regression:
            records.append({"label": float(row)})
            continue
        probs = row.softmax(-1).tolist()
        names = spec.labels if spec.task != "multiple_choice" else [str(i) for i in range(len(probs))]
        best = int(row.argmax())
        records.append(
            {
                "label": names[best] if spec.task != "multiple_choice" else best,
                "probabilities": dict(zip(names, probs)),
            }
        )
    return records
