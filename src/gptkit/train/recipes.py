"""Named pre-training recipes: `gptkit pretrain --recipe NAME`, `make paper` and `gptkit demo`.

A recipe is a model shape and its optimisation, chosen for a budget of CPU minutes rather than for
GPT-1's 100,000 updates (``benchmarks/time_to_quality.py`` measures each lever). On the command line
it sits under everything else: a ``--config`` file's values and the flags given override it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gptkit.config import check_choices
from gptkit.train.config import OptimizerName, Schedule, TrainConfig
from gptkit.train.pretrain import PretrainConfig
from gptkit.train.run import ModelShape

RECIPE_PRESET = "gpt2"  # the shape comes from the recipe; the preset gives pre-LN blocks


@dataclass(frozen=True)
class PretrainRecipe:
    """How to pre-train for a budget of minutes: the vocabulary's size, the model's shape and the
    optimisation. ``warmup_steps`` None: a tenth of the updates that fit."""

    vocab_size: int  # of the tokenizer the recipe was chosen with (the demo trains one this size)
    n_layer: int
    d_model: int
    n_head: int
    context_length: int
    batch_size: int
    lr: float
    schedule: Schedule
    optimizer: OptimizerName
    dropout: float | None  # None: the preset's 0.1
    adamw_lr_scale: float = 1.0  # with Muon: AdamW's rate (embeddings, biases, gains) as a share of lr
    weight_decay: float = 0.01  # decoupled, on matrices and embeddings (the paper's 0.01 by default)
    warmup_steps: int | None = None
    eval_every: int | None = None  # None: only at the end

    def __post_init__(self) -> None:
        check_choices(self)  # schedule, optimizer: TrainConfig's own Literal types

    def model(self) -> ModelShape:
        return ModelShape(
            preset=RECIPE_PRESET,
            context_length=self.context_length,
            n_layer=self.n_layer,
            n_head=self.n_head,
            d_model=self.d_model,
            dropout=self.dropout,
        )

    def values(self) -> dict[str, Any]:
        """The recipe by flag name, as ``gptkit pretrain --recipe`` applies it (the vocabulary's size
        is the tokenizer's, not a pre-training flag; a None leaves the command's default)."""
        model, shape = self.model(), ("preset", "context_length", "n_layer", "n_head", "d_model", "dropout")
        values = {name: getattr(model, name) for name in shape}
        optimisation = (
            "batch_size",
            "lr",
            "schedule",
            "optimizer",
            "adamw_lr_scale",
            "weight_decay",
            "warmup_steps",
        )
        values |= {name: getattr(self, name) for name in optimisation}
        values["eval_every"] = self.eval_every or 0  # None: only at the end, as configs() runs it
        return {name: value for name, value in values.items() if value is not None}

    def configs(
        self,
        shards: Path,
        out: Path,
        time_budget: str | None,
        max_steps: int,
        precision: str = "auto",
        device: str = "auto",
        progress: bool = True,
    ) -> PretrainConfig:
        """The pre-training command's config for this recipe, checkpointed only at the end."""
        train = TrainConfig(
            max_steps=max_steps,
            batch_size=self.batch_size,
            lr=self.lr,
            warmup_steps=self.warmup_steps,
            schedule=self.schedule,
            optimizer=self.optimizer,
            adamw_lr_scale=self.adamw_lr_scale,
            weight_decay=self.weight_decay,
            eval_every=self.eval_every or 0,
            checkpoint_every=max_steps,
            precision=precision,
            time_budget=time_budget,
            log_every=5,
            progress=progress,
        )
        return PretrainConfig(
            data=str(shards), model=self.model(), out=str(out), eval_windows=64, device=device, training=train
        )


RECIPES = {
    # GPT-2-small-like settings scaled down, never tuned for minutes: the reference the levers are measured against.
    "baseline": PretrainRecipe(
        vocab_size=8000, n_layer=4, d_model=256, n_head=4, context_length=128, batch_size=32, lr=1e-3,
        schedule="cosine", optimizer="adamw", dropout=None, eval_every=50,
    ),
    # Chosen lever by lever on 2-minute runs (docs/results.md, "Time to quality"): two blocks instead
    # of four (a minutes-long run is far from needing depth: twice the updates), Muon for the blocks'
    # matrices at a high rate held until the last 20%, half the batch (twice the updates again), no
    # dropout (the run sees its corpus about once), no warm-up. The vocabulary stays at 8,000:
    # 4,000 and 16,000 both measured worse. The embeddings learn at 1e-3 (AdamW), not 6e-3: at the
    # higher rate they grow to 8x their initial scale, and fine-tuning at a paper-like rate can no
    # longer move them (random weights scaled so fine-tune to chance: docs/experiments.md). Weight
    # decay 0.3, not 0.01, for the same reason: Muon's steps grew the blocks' matrices to 7x their
    # initial scale, where fine-tuning hardly moves them; at 0.3 they stay at 3.5x, and bits per byte
    # improve.
    "minutes": PretrainRecipe(
        vocab_size=8000, n_layer=2, d_model=256, n_head=4, context_length=128, batch_size=16, lr=6e-3,
        schedule="wsd", optimizer="muon", dropout=0.0, adamw_lr_scale=1 / 6, warmup_steps=0,
        weight_decay=0.3,
    ),
}  # fmt: skip
