"""Unsupervised pre-training: maximise L1(U) = Σ_i log P(u_i | u_{i-k}, …, u_{i-1}) (GPT-1 eq. 1)."""

from __future__ import annotations

import contextlib
import math
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn as nn

from gptkit import hub
from gptkit.config import config_error
from gptkit.data.shards import TokenShard, check_shard_tokenizer
from gptkit.data.windows import WindowSampler, eval_windows
from gptkit.hardware import DEVICE_HELP
from gptkit.io import atomic_write, write_json
from gptkit.model import GPT
from gptkit.model.weights import (
    CONFIG_NAME,
    SAFETENSORS_NAME,
    config_to_hf,
    read_pretrained,
    read_state_dict,
    save_state_dict,
)
from gptkit.tokenizer import Tokenizer
from gptkit.train.checkpoints.export import write_model_files
from gptkit.train.config import TrainConfig
from gptkit.train.distributed.meta_init import build_sharded, meta_init_applies
from gptkit.train.distributed.processes import DistributedContext, wrap_model
from gptkit.train.loop import Trainer, micro_batch_size
from gptkit.train.run import (
    ModelShape,
    adapted,
    base_vocab_size,
    build_model,
    resume_latest,
    resuming,
    run_config,
    run_stage,
)


@dataclass
class PretrainConfig:
    """What to pre-train on, the model (a preset's shape with overrides, or ``init`` weights; its
    ``context_length`` is also the length of the training windows), how, and where to write it."""

    data: str = field(metadata={"help": "Directory written by `gptkit prepare` (required)."})
    model: ModelShape = field(default_factory=ModelShape)
    out: str = field(default="runs/pretrain", metadata={"help": "Run directory."})
    resume: bool = field(
        default=False, metadata={"help": "Continue the run in --out from its latest checkpoint."}
    )
    eval_windows: int = field(default=64, metadata={"help": "Validation windows per evaluation."})
    device: str = field(default="auto", metadata={"help": DEVICE_HELP})
    # GPT-1's pre-training settings (§4.1): TrainConfig's own defaults.
    training: TrainConfig = field(default_factory=TrainConfig)

    def __post_init__(self) -> None:
        if self.eval_windows <= 0:
            raise config_error(self, "eval_windows", f"must be positive, got {self.eval_windows}")


def make_evaluator(shard: TokenShard, context_length: int, max_windows: int, micro_batch_size: int, device):
    """Mean loss and perplexity on the first ``max_windows`` validation windows (always the same ones)."""
    windows = eval_windows(shard, context_length, max_windows)

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
    """Copy the newest checkpoint's model files to the run directory's top level (from a sharded
    checkpoint, rank 0 reads the model's shards alone)."""
    latest = trainer.run_dir.latest_checkpoint()  # just written by this run: no need to verify it
    if latest is None or not trainer.ctx.is_main:
        return
    if not (latest / SAFETENSORS_NAME).exists():  # sharded (FSDP2): one model file, made from shards
        write_model_files(latest, trainer.out_dir)
        return
    for name in (SAFETENSORS_NAME, CONFIG_NAME):
        # Through a temporary file, removed if the copy fails (a full disk leaves no debris).
        atomic_write(trainer.out_dir / name, lambda tmp, name=name: shutil.copyfile(latest / name, tmp))


def build_wrapped(
    shape: ModelShape, vocab_size: int, ctx: DistributedContext, train: TrainConfig
) -> tuple[GPT, nn.Module]:
    """The model (new, or ``shape.init``'s weights) and the model wrapped for this run. Under FSDP2
    it is built on the meta device and each rank makes its own shards only, of the same values."""
    if not meta_init_applies(train) or shape.random_init:
        model = build_model(shape, vocab_size).to(ctx.device)
        return model, wrap_model(model, ctx, train)
    if not shape.init:
        return build_sharded(lambda: build_model(shape, vocab_size), ctx, train)
    weights = read_pretrained(shape.init)  # mapped from the file: each tensor read as its shard is made
    return build_sharded(
        lambda: adapted(GPT(weights.config), shape), ctx, train, weights.state, source=weights.origin
    )


def pretrain(config: PretrainConfig) -> dict[str, float]:
    """Pre-train a GPT on a prepared corpus; returns the last evaluation's metrics."""
    train = config.training
    out_dir = Path(config.out)
    hub.ensure_available(config.model.init)  # a name that cannot be had leaves no run folder
    with run_stage(out_dir, config.resume, "pretrain", config.device, train) as ctx:
        train_shard = TokenShard.open(config.data, "train")
        meta = train_shard.meta
        check_shard_tokenizer(config.data, meta)
        tokenizer = Tokenizer.from_pretrained(Path(config.data) / meta["tokenizer"])
        torch.manual_seed(train.seed)  # the same initial weights on every rank
        model, wrapped = build_wrapped(config.model, base_vocab_size(tokenizer), ctx, train)
        context_length = config.model.context_length or model.config.context_length
        torch.manual_seed(train.seed + ctx.rank)  # dropout differs across ranks

        windows = WindowSampler(
            train_shard, context_length, train.batch_size, train.seed, ctx.rank, ctx.world_size
        )
        micro = micro_batch_size(train, ctx.world_size)
        val_shard = TokenShard.open(config.data, "val")
        evaluate = make_evaluator(val_shard, context_length, config.eval_windows, micro, ctx.device)
        model_config = model.config
        trainer = Trainer(
            wrapped,
            train,
            windows,
            out_dir,
            save_model=lambda directory, state: save_state_dict(model_config, state, directory),
            ctx=ctx,
            evaluate=evaluate,
            run_config=run_config(
                "pretrain", config, train, model_config, data=meta, world_size=ctx.world_size
            ),
        )
        if train.fsdp:  # sharded checkpoints: the shards, and the config that says what they make
            trainer.checkpointer.describe_model = lambda d: write_json(
                d / CONFIG_NAME, config_to_hf(model_config)
            )
        if ctx.is_main:
            tokenizer.save_pretrained(out_dir)
        if resuming(config.resume, out_dir):  # --resume, or a worker group torchrun restarted
            resume_latest(trainer, read_state_dict)
        try:
            metrics = trainer.fit()
        except BaseException:
            # Stopped (a signal, an error): the run directory still gets the newest model, but
            # the error that stopped the run is the one to show, and exporting may fail the
            # same way (a full disk).
            with contextlib.suppress(Exception):
                export_latest(trainer)
            raise
        export_latest(trainer)
        return metrics
