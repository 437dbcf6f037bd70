"""Unsupervised pre-training: maximise L1(U) = Σ_i log P(u_i | u_{i-k}, …, u_{i-1}) (GPT-1 eq. 1)."""

from __future__ import annotations

import dataclasses
import math
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn as nn

from gptkit.checkpoint import CONFIG_NAME, SAFETENSORS_NAME, read_state_dict, save_state_dict
from gptkit.config import GPTConfig
from gptkit.data.shards import TokenShard, WindowSampler, eval_windows
from gptkit.model import GPT
from gptkit.tokenizer import Tokenizer
from gptkit.train.distributed import init_distributed, shutdown_distributed, wrap_model
from gptkit.train.loop import TrainConfig, Trainer


@dataclass
class PretrainConfig:
    """What to pre-train on and where to write it; the model shape and the optimisation settings."""

    data: str = field(default="", metadata={"help": "Directory written by `gptkit prepare`."})
    out: str = field(default="runs/pretrain", metadata={"help": "Run directory."})
    preset: str = field(default="gpt1", metadata={"help": "Model shape: gpt1, gpt2, ..., tiny."})
    context: int | None = field(
        default=None, metadata={"help": "Tokens per training window (default: the preset's)."}
    )
    n_layer: int | None = field(default=None, metadata={"help": "Override the preset's layers."})
    n_head: int | None = field(default=None, metadata={"help": "Override the preset's heads."})
    d_model: int | None = field(default=None, metadata={"help": "Override the preset's width."})
    dropout: float | None = field(default=None, metadata={"help": "Override the preset's dropout."})
    position_encoding: str | None = field(default=None, metadata={"help": "learned or sinusoidal."})
    activation: str | None = field(default=None, metadata={"help": "gelu_tanh, gelu or relu."})
    init: str | None = field(default=None, metadata={"help": "Start from these weights instead of random."})
    resume: bool = field(
        default=False, metadata={"help": "Continue the run in --out from its latest checkpoint."}
    )
    eval_windows: int = field(default=64, metadata={"help": "Validation windows per evaluation."})
    device: str = field(
        default="auto", metadata={"help": "auto (CUDA, then MPS, then CPU), cpu, cuda or mps."}
    )

    def __post_init__(self) -> None:
        if self.dropout is not None and not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"PretrainConfig.dropout (--dropout): must be in [0, 1), got {self.dropout}")
        for name in ("context", "n_layer", "n_head", "d_model", "eval_windows"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise ValueError(
                    f"PretrainConfig.{name} (--{name.replace('_', '-')}): must be positive, got {value}"
                )
        if self.position_encoding not in (None, "learned", "sinusoidal"):
            raise ValueError(
                f"PretrainConfig.position_encoding (--position-encoding): learned or sinusoidal, got {self.position_encoding!r}"
            )
        if self.activation not in (None, "gelu_tanh", "gelu", "relu"):
            raise ValueError(
                f"PretrainConfig.activation (--activation): gelu_tanh, gelu or relu, got {self.activation!r}"
            )


class PretrainBatches:
    """Windows of the training shard, as ``input_ids`` = ``labels`` (the model shifts them)."""

    def __init__(self, sampler: WindowSampler):
        self.sampler = sampler

    def next_batch(self) -> dict:
        ids = self.sampler.next_batch()
        # The loop needs only the loss: skip returning logits so the loss is computed in chunks.
        return {"input_ids": ids, "labels": ids, "compute_logits": False}

    def state_dict(self) -> dict:
        return self.sampler.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.sampler.load_state_dict(state)


def model_config_for(config: PretrainConfig, meta: dict) -> GPTConfig:
    overrides = {
        name: getattr(config, name)
        for name in ("n_layer", "n_head", "d_model", "dropout", "position_encoding", "activation")
        if getattr(config, name) is not None
    }
    # GPT-1's specials (_start_, ...) are added at fine-tuning; a byte-level end-of-text token that is
    # not in the base vocabulary separates documents, so the model needs its row.
    n_special = meta["n_special"] if meta["tokenizer_style"] == "bytelevel" else 0
    overrides["vocab_size"] = meta["vocab_size"] + n_special
    if config.context:
        overrides["context_length"] = config.context
    return GPTConfig.from_preset(config.preset, **overrides)


def make_evaluator(shard: TokenShard, context: int, max_windows: int, micro_batch_size: int, device):
    windows = eval_windows(shard, context, max_windows)

    def evaluate(model: nn.Module) -> dict[str, float]:
        if len(windows) == 0:
            return {}
        total = 0.0
        for start in range(0, len(windows), micro_batch_size):
            ids = windows[start : start + micro_batch_size].to(device)
            total += float(model(input_ids=ids, labels=ids, compute_logits=False).loss) * len(ids)
        val_loss = total / len(windows)
        return {"val_loss": val_loss, "val_ppl": math.exp(min(val_loss, 50.0))}

    return evaluate


def export_latest(trainer: Trainer) -> None:
    """Copy the newest checkpoint's model files to the run directory's top level."""
    latest = trainer.latest_checkpoint()
    if latest is None or not trainer.ctx.is_main:
        return
    for name in (SAFETENSORS_NAME, CONFIG_NAME):
        tmp = trainer.out_dir / f".{name}.tmp"
        shutil.copyfile(latest / name, tmp)
        os.replace(tmp, trainer.out_dir / name)


def pretrain(config: PretrainConfig, train: TrainConfig) -> dict[str, float]:
    """Pre-train a GPT on a prepared corpus; returns the last evaluation's metrics."""
    ctx = init_distributed(config.device)
    try:
        out_dir = Path(config.out)
        if not config.resume and (out_dir / "checkpoints").exists():
            raise FileExistsError(
                f"{out_dir} already holds a run: pass --resume to continue it, or choose another --out"
            )
        train_shard = TokenShard.open(config.data, "train")
        meta = train_shard.meta
        torch.manual_seed(train.seed)  # the same initial weights on every rank
        if config.init:
            model = GPT.from_pretrained(config.init)
            if config.dropout is not None:
                model.set_dropout(config.dropout)  # the layers' rates, not only the recorded one
        else:
            model = GPT(model_config_for(config, meta))
        model_config = model.config
        context = config.context or model_config.context_length
        model.to(ctx.device)
        torch.manual_seed(train.seed + ctx.rank)  # dropout differs across ranks

        sampler = WindowSampler(train_shard, context, train.batch_size, train.seed, ctx.rank, ctx.world_size)
        wrapped = wrap_model(model, ctx, fsdp=train.fsdp)
        per_rank = train.batch_size // ctx.world_size
        micro = min(train.micro_batch_size or per_rank, per_rank)
        evaluate = make_evaluator(
            TokenShard.open(config.data, "val"), context, config.eval_windows, micro, ctx.device
        )
        run_config = {
            "stage": "pretrain",
            "pretrain": dataclasses.asdict(config),
            "train": dataclasses.asdict(train),
            "model": model_config.to_dict(),
            "data": meta,
            "world_size": ctx.world_size,
        }
        trainer = Trainer(
            wrapped,
            train,
            PretrainBatches(sampler),
            out_dir,
            save_model=lambda directory, state: save_state_dict(model_config, state, directory),
            ctx=ctx,
            evaluate=evaluate,
            run_config=run_config,
        )
        if ctx.is_main:
            Tokenizer.from_pretrained(Path(config.data) / meta["tokenizer"]).save_pretrained(out_dir)
        if config.resume:
            checkpoint = trainer.latest_checkpoint()
            if checkpoint is None:
                raise FileNotFoundError(f"--resume: no checkpoint in {out_dir / 'checkpoints'}")
            trainer.resume(checkpoint, read_state_dict)
        try:
            return trainer.fit()
        finally:
            export_latest(trainer)  # also after Ctrl-C: the run directory holds the newest model
    finally:
        shutdown_distributed()
