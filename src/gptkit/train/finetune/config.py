"""Fine-tuning's settings: what to fine-tune, on which task and data, how (the paper's defaults,
§4.1), with LoRA or every weight; and the step counts they resolve to. :mod:`gptkit.train.finetune.tasks`
runs them."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import ClassVar

from gptkit.config import config_error
from gptkit.data.registry import DATASETS
from gptkit.hardware import DEVICE_HELP
from gptkit.model.lora import LORA_TARGETS, LoRASettings
from gptkit.train.config import TrainConfig
from gptkit.train.run import ModelShape

WARMUP_FRACTION = 0.002  # the paper's warm-up: 0.2% of training


@dataclass
class LoRAConfig:
    """LoRA adapters (Hu et al., 2021) on a frozen pre-trained model instead of full fine-tuning."""

    flag_prefix: ClassVar[str] = "lora_"  # its flags: --lora-rank, --lora-alpha, --lora-targets

    rank: int | None = field(
        default=None,
        metadata={
            "help": "Train LoRA adapters of rank R on the frozen --init model (with the task head and the "
            "special tokens' rows) instead of every weight; the run saves the adapter alone (default: "
            "full fine-tuning)."
        },
    )
    alpha: float | None = field(
        default=None,
        metadata={"help": "LoRA's α: updates are scaled by α/R (default: 2 × R)."},
    )
    targets: list[str] = field(
        default_factory=lambda: list(LORA_TARGETS),
        metadata={
            "help": "Projections LoRA adapts: c_attn (q, k, v), c_proj (both outputs), c_fc (MLP in) "
            "(default: all three)."
        },
    )

    def __post_init__(self) -> None:
        if self.rank is None:
            if self.alpha is not None:
                raise config_error(self, "alpha", "applies to LoRA runs only: give --lora-rank R too")
            return
        try:
            self.settings()
        except ValueError as e:
            raise config_error(self, "targets" if "targets" in str(e) else "rank", str(e)) from e

    def settings(self) -> LoRASettings | None:
        """The adapter to train, or None for full fine-tuning."""
        if self.rank is None:
            return None
        alpha = 2.0 * self.rank if self.alpha is None else self.alpha
        return LoRASettings(self.rank, alpha, tuple(self.targets))


def paper_finetuning() -> TrainConfig:
    """The training loop's settings for fine-tuning: the paper's (§4.1), lr 6.25e-5, batch 32, linear
    decay; the step counts, the warm-up (0.2%), evaluations and checkpoints follow the epochs
    (:func:`finetune` resolves the Nones)."""
    return TrainConfig(
        max_steps=None,
        batch_size=32,
        lr=6.25e-5,
        schedule="linear",
        eval_every=None,
        checkpoint_every=None,
    )


# Fine-tuning's wording of the training loop's flags whose defaults mean something else here.
FINETUNING_HELP = {
    "max_steps": "Optimizer updates to run (default: epochs × updates per epoch).",
    "batch_size": "Global batch, in examples, per update.",
    "warmup_steps": "Linear warm-up updates from 0 (default: 0.2% of training).",
    "schedule": "Decay after warm-up, to 0 at max_steps.",
    "eval_every": "Evaluate on the dev set every N updates (default: every epoch).",
    "checkpoint_every": "Checkpoint every N updates (default: every epoch).",
}


@dataclass
class FinetuneConfig:
    """What to fine-tune, on which task and data, how, and where to write it. The model is
    ``model.init``'s pre-trained weights, or a preset's shape trained from scratch; ``training``
    defaults to the paper's fine-tuning settings (:func:`paper_finetuning`), not pre-training's."""

    model: ModelShape = field(default_factory=ModelShape)
    task: str | None = field(
        default=None,
        metadata={
            "help": "classification, entailment, similarity, multiple_choice, or generation: prompt → "
            "completion, the loss on the completion (default: the dataset's)."
        },
    )
    dataset: str | None = field(default=None, metadata={"help": f"A public dataset: {', '.join(DATASETS)}."})
    data_dir: str = field(
        default="data", metadata={"help": "Where the public datasets live (for --dataset)."}
    )
    train: str | None = field(
        default=None, metadata={"help": "Training file (CSV/TSV with a header, JSONL or parquet)."}
    )
    dev: str | None = field(default=None, metadata={"help": "Dev file, evaluated after every epoch."})
    columns: str | None = field(
        default=None,
        metadata={
            "help": "field=column,... e.g. premise=s1,hypothesis=s2,label=gold; for multiple choice "
            "context=story,question=q,choices=a|b|c|d,label=answer; for generation "
            "prompt=question,completion=answer (default: the field names)."
        },
    )
    regression: bool = field(default=False, metadata={"help": "The label is a real-valued score (MSE loss)."})
    tokenizer: str | None = field(
        default=None, metadata={"help": "Tokenizer folder or Hub name (default: --init)."}
    )
    out: str = field(default="runs/finetune", metadata={"help": "Run directory."})
    epochs: int = field(default=3, metadata={"help": "Passes over the training data."})
    lm_coef: float = field(
        default=0.5, metadata={"help": "λ, the weight of the auxiliary LM loss (0 disables it)."}
    )
    clf_dropout: float = field(default=0.1, metadata={"help": "Dropout before the classifier."})
    transfer_layers: int | None = field(
        default=None, metadata={"help": "Keep only the first K pre-trained blocks (default: all)."}
    )
    max_length: int | None = field(
        default=None, metadata={"help": "Longest input sequence (default: the model's context)."}
    )
    skip_bad_rows: bool = field(
        default=False, metadata={"help": "Skip and count bad rows instead of stopping."}
    )
    max_train_examples: int | None = field(
        default=None, metadata={"help": "Use only the first N training examples (default: all)."}
    )
    max_eval_examples: int | None = field(
        default=None, metadata={"help": "Evaluate on only the first N dev examples (default: all)."}
    )
    eval_batch_size: int = field(default=64, metadata={"help": "Examples per forward pass at evaluation."})
    group_by_length: bool = field(
        default=True,
        metadata={
            "help": "Batch examples of similar length together (batches still in random order): "
            "far less padding, so faster updates (--no-group-by-length: random batches)."
        },
    )
    resume: bool = field(
        default=False, metadata={"help": "Continue the run in --out from its latest checkpoint."}
    )
    lora: LoRAConfig = field(default_factory=LoRAConfig)
    merge: bool = field(
        default=False,
        metadata={"help": "With --lora-rank, also write the adapter merged into a full model in OUT/merged."},
    )
    device: str = field(default="auto", metadata={"help": DEVICE_HELP})
    training: TrainConfig = field(
        default_factory=paper_finetuning,
        metadata={
            "help": "Optimisation settings with the paper's fine-tuning defaults (§4.1): lr 6.25e-5, "
            "batch 32, warm-up over 0.2% of training, linear decay; unset step counts follow the epochs.",
            "field_help": FINETUNING_HELP,
        },
    )

    def __post_init__(self) -> None:
        if self.lora.rank is not None:
            if not self.model.init or self.model.random_init:
                raise config_error(self.lora, "rank", "LoRA adapts a pre-trained model: give --init DIR")
            if self.transfer_layers is not None:
                # Re-initialised blocks would be frozen random weights that no adapter file records.
                raise config_error(self, "transfer_layers", "does not combine with LoRA (--lora-rank)")
        elif self.merge:
            raise config_error(self, "merge", "applies to LoRA runs only: give --lora-rank R too")
        for name in ("epochs", "eval_batch_size"):
            if getattr(self, name) <= 0:
                raise config_error(self, name, f"must be positive, got {getattr(self, name)}")
        for name in ("max_length", "max_train_examples", "max_eval_examples"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise config_error(self, name, f"must be positive, got {value}")
        if not 0.0 <= self.clf_dropout < 1.0:
            raise config_error(self, "clf_dropout", f"must be in [0, 1), got {self.clf_dropout}")
        if self.lm_coef < 0:
            raise config_error(self, "lm_coef", f"λ must be >= 0, got {self.lm_coef}")
        if self.transfer_layers is not None and self.transfer_layers < 0:
            raise config_error(self, "transfer_layers", f"must be >= 0, got {self.transfer_layers}")


def resolved_training(train: TrainConfig, epochs: int, steps_per_epoch: int) -> TrainConfig:
    """A copy of ``train`` with fine-tuning's step counts filled in: left unset, the updates follow
    the epochs, the warm-up is 0.2% of them (at least one), and the dev set is evaluated and a
    checkpoint written every epoch."""
    max_steps = train.max_steps or epochs * steps_per_epoch
    warmup = train.warmup_steps
    return dataclasses.replace(
        train,
        max_steps=max_steps,
        warmup_steps=max(1, round(WARMUP_FRACTION * max_steps)) if warmup is None else warmup,
        eval_every=steps_per_epoch if train.eval_every is None else train.eval_every,
        checkpoint_every=train.checkpoint_every or steps_per_epoch,
    )
