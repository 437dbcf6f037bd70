"""One run setup for both stages: the model's shape, the run directory and process group, resume,
run_config.json.

Pre-training and fine-tuning build a model the same way (a preset with overrides, or loaded weights
with a new dropout rate), hold the run directory and start the process group in one order
(:func:`run_stage`), refuse to overwrite a run unless asked to resume, continue from the latest
checkpoint, and record what defines the run. Those steps live here once.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from gptkit.config import Activation, GPTConfig, PositionEncoding, check_choices, config_error, flat_fields
from gptkit.io import read_json
from gptkit.model import GPT
from gptkit.tokenizer import Tokenizer
from gptkit.train.config import TrainConfig, parse_duration
from gptkit.train.distributed.processes import DistributedContext, init_distributed, shutdown_distributed
from gptkit.train.loop import Trainer
from gptkit.train.rundir import RunDir


@dataclass
class ModelShape:
    """The model: a preset's shape with overrides, or loaded weights (``init``)."""

    preset: str = field(default="gpt1", metadata={"help": "Model shape: gpt1, gpt2, ..., tiny."})
    init: str | None = field(
        default=None,
        metadata={
            "help": "Start from these weights instead of random: a model folder or Hub name (gpt2, openai-gpt, org/name@rev)."
        },
    )
    context_length: int | None = field(
        default=None,
        metadata={"help": "Longest sequence, in tokens (default: the preset's, or the loaded model's)."},
    )
    n_layer: int | None = field(default=None, metadata={"help": "Override the preset's layers."})
    n_head: int | None = field(default=None, metadata={"help": "Override the preset's heads."})
    d_model: int | None = field(default=None, metadata={"help": "Override the preset's width."})
    dropout: float | None = field(
        default=None, metadata={"help": "Override the dropout rate (also of loaded weights)."}
    )
    position_encoding: PositionEncoding | None = field(
        default=None, metadata={"help": "Override the preset's position encoding."}
    )
    activation: Activation | None = field(
        default=None, metadata={"help": "Override the preset's activation."}
    )
    random_init: bool = field(
        default=False,
        metadata={"help": "Take --init's shape but not its weights: the no-pre-training ablation (Table 5)."},
    )

    def __post_init__(self) -> None:
        if self.random_init and not self.init:
            raise config_error(self, "random_init", "needs --init, the model whose shape to take")
        for name in ("context_length", "n_layer", "n_head", "d_model"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise config_error(self, name, f"must be positive, got {value}")
        if self.dropout is not None and not 0.0 <= self.dropout < 1.0:
            raise config_error(self, "dropout", f"must be in [0, 1), got {self.dropout}")
        check_choices(self)  # position_encoding, activation: GPTConfig's own Literal types

    _OVERRIDES = (
        "context_length",
        "n_layer",
        "n_head",
        "d_model",
        "dropout",
        "position_encoding",
        "activation",
    )

    def overrides(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self._OVERRIDES if getattr(self, name) is not None}


def build_model(shape: ModelShape, vocab_size: int) -> GPT:
    """A new GPT of ``shape`` with ``vocab_size`` rows, or the weights of ``shape.init`` (new
    weights of its shape with ``random_init``).

    Loaded weights keep their shape: an override that disagrees with it is an error (a context
    shorter than the model's is allowed: training then uses shorter sequences); dropout applies.
    """
    if not shape.init:
        return GPT(GPTConfig.from_preset(shape.preset, vocab_size=vocab_size, **shape.overrides()))
    model = GPT.from_pretrained(shape.init)
    if shape.random_init:
        # Every format's config is read by the loader, so the weights are loaded and then replaced.
        model = GPT(model.config)
    return adapted(model, shape)


def adapted(model: GPT, shape: ModelShape) -> GPT:
    """A model of loaded weights (``shape.init``) with ``shape``'s dropout; an override that
    disagrees with its shape is an error (see :func:`build_model`)."""
    check_loaded_shape(model.config, shape)
    if shape.dropout is not None:
        model.set_dropout(shape.dropout)  # the layers' rates, not only the recorded one
    return model


def check_loaded_shape(loaded: GPTConfig, shape: ModelShape) -> None:
    """Refuse an override of ``shape`` that disagrees with ``loaded``, the config of ``shape.init``'s
    weights: they keep their shape. A shorter context (training on shorter sequences) and dropout
    are allowed. The runs and the estimate check with this one rule."""
    for name, value in shape.overrides().items():
        if name == "dropout" or (name == "context_length" and value <= loaded.context_length):
            continue
        if getattr(loaded, name) != value:
            raise config_error(
                shape,
                name,
                f"{value} differs from the loaded model's {getattr(loaded, name)} ({shape.init}): "
                "loaded weights keep their shape; drop the flag or --init",
            )


def sequence_length(shape: ModelShape, config: GPTConfig, max_length: int | None = None) -> int:
    """The longest sequence a run of a model of ``config`` trains on: its context, or the shorter
    one ``shape`` asks for, and at most a task's ``max_length``."""
    length = min(shape.context_length or config.context_length, config.context_length)
    return min(max_length or length, length)


def base_vocab_size(tokenizer: Tokenizer) -> int:
    """Token rows a language model needs for this tokenizer before fine-tuning.

    GPT-1's special tokens (_start_, _delimiter_, _classify_) only appear in fine-tuning inputs, so
    they get rows then; a byte-level end-of-text token separates documents in pre-training, so it
    needs its row from the start.
    """
    return tokenizer.vocab_size + (tokenizer.n_special if tokenizer.style == "bytelevel" else 0)


TORCHRUN_JOB = "torchrun_job"  # run_config.json's record of the torchrun job that started the run


def restarted_by_torchrun(out_dir: Path) -> bool:
    """Whether this process belongs to a worker group that torchrun started again after a failure
    (``--max-restarts``: a lost worker, a killed node) of the job that started the run in
    ``out_dir``. Its command is the first group's, without --resume, yet it must continue the run.
    A run that another job started is not this job's to continue: a group that refused the
    directory refuses it again when torchrun starts it again."""
    if int(os.environ.get("TORCHELASTIC_RESTART_COUNT") or 0) == 0:
        return False
    try:
        recorded = read_json(RunDir(out_dir).run_config).get(TORCHRUN_JOB)
    except (OSError, ValueError, AttributeError):  # no run recorded, or not one gptkit can read
        return False
    return recorded is not None and recorded == os.environ.get("TORCHELASTIC_RUN_ID")


def resuming(resume: bool, out_dir: Path) -> bool:
    """Whether a stage continues the run in ``out_dir``: asked to (--resume), or restarted by the
    torchrun job that started it, which then continues from the newest complete checkpoint."""
    return resume or restarted_by_torchrun(out_dir)


def check_run_dir(out_dir: Path, resume: bool) -> None:
    """A run directory is never overwritten: it must be new, or resumed."""
    if not resume and RunDir(out_dir).holds_a_run():
        raise FileExistsError(
            f"{out_dir} already holds a run: pass --resume to continue it, or choose another --out"
        )


@contextlib.contextmanager
def run_stage(
    out_dir: Path, resume: bool, command: str, device: str | None, train: TrainConfig | None = None
) -> Iterator[DistributedContext]:
    """A stage's run (``command``: pretrain, finetune) in ``out_dir``: the directory held by its only
    writer and checked (new, or resumed), then the process group started on ``device`` as ``train``
    needs it (FSDP2, its offload, the collectives' timeout); on the way
    out, an error or a stop included, the process group goes first and the directory is let go last.

    The lock comes first so that a run refused at it (another writer, an existing run without
    --resume) never starts a process group. Under torchrun, rank 0 alone holds the lock, read from
    torchrun's RANK since no process group exists yet; the other ranks wait for it when the group
    starts, and torchrun stops them if rank 0 is refused. SIGTERM and Ctrl-C during training reach
    here as :class:`~gptkit.train.loop.Interrupted`, after the checkpoint, and Ctrl-C elsewhere as
    KeyboardInterrupt: both are torn down as any error. SIGTERM outside the loop ends the process
    at once (its default action), and the system releases the lock (``flock``).
    """
    is_main = int(os.environ.get("RANK", "0")) == 0
    with RunDir(out_dir).writer_lock(command) if is_main else contextlib.nullcontext():
        check_run_dir(out_dir, resuming(resume, out_dir))
        train = train or TrainConfig()
        ctx = init_distributed(
            device,
            train.fsdp,
            train.fsdp_offload,
            parse_duration(train.collective_timeout, "collective timeout"),
        )
        try:
            yield ctx
        finally:
            shutdown_distributed()


def resume_latest(trainer: Trainer, load_model_state: Callable[[Path], dict[str, torch.Tensor]]) -> None:
    """Continue ``trainer``'s run from its newest complete checkpoint; a run that stopped before its
    first checkpoint starts again from update 0 (the same run: its seeds decide everything). Called
    where :func:`resuming` says so."""
    checkpoint = trainer.latest_checkpoint()
    if checkpoint is not None:
        trainer.resume(checkpoint, load_model_state)
        return
    if not trainer.run_dir.run_config.exists():  # no run started here: a mistyped --out, say
        raise FileNotFoundError(f"--resume: no checkpoint in {trainer.run_dir.checkpoints}")
    if trainer.ctx.is_main:
        print(
            f"--resume: {trainer.run_dir.root} holds no checkpoint yet (its run stopped before the first): "
            "starting it again from update 0",
            file=sys.stderr,
        )


def run_config(
    stage: str, config: object, train: TrainConfig, model: GPTConfig, **extra: Any
) -> dict[str, Any]:
    """What defines a run, for ``run_config.json``: the stage's settings by flag name (a nested
    config's fields at the top level: the layout runs have always written), the loop's as the run
    resolved them (``train``; a stage config's own TrainConfig is not recorded twice), the model's."""
    settings: dict[str, Any] = {}
    for f in dataclasses.fields(config):  # type: ignore[arg-type]
        value = getattr(config, f.name)
        if isinstance(value, TrainConfig):
            continue
        settings.update(flat_fields(value) if dataclasses.is_dataclass(value) else {f.name: value})
    job = {TORCHRUN_JOB: os.environ["TORCHELASTIC_RUN_ID"]} if "TORCHELASTIC_RUN_ID" in os.environ else {}
    return {
        "stage": stage,
        stage: settings,
        "train": dataclasses.asdict(train),
        "model": model.to_dict(),
        **extra,
        **job,
    }
