"""``gptkit checkpoint export``: a checkpoint's model as the one folder every other command reads.

A sharded checkpoint (FSDP2's, :mod:`gptkit.train.checkpoints.sharded`) holds the model in pieces,
one file per process that wrote it. Exporting reads the model's pieces alone (not the optimizer's
moments) into one process and writes ``config.json`` + ``model.safetensors``, the Hugging Face
layout that ``gptkit generate``, ``finetune --init``, ``export`` and transformers read; with the
run's tokenizer files beside them. A whole checkpoint (DDP, one process) is exported the same way.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import torch

from gptkit.io import read_json, read_train_state
from gptkit.model.weights import CONFIG_NAME, config_from_hf, read_state_dict, save_state_dict
from gptkit.train.checkpoints.checkpointer import CheckpointConfig, Checkpointer, verify_manifest
from gptkit.train.checkpoints.sharded import SHARDED_FORMAT, read_model_state
from gptkit.train.distributed.processes import DistributedContext
from gptkit.train.rundir import CHECKPOINTS, TRAIN_STATE, RunDir


@dataclass
class CheckpointExportConfig:
    """Write a training checkpoint's model (sharded or whole) as one model folder."""

    source: str = field(
        metadata={
            "help": "A run directory (its newest intact checkpoint) or one of its checkpoints/step-NNNNNNN folders.",
            "positional": True,
        }
    )
    out: str = field(
        metadata={
            "help": "Folder to write config.json, model.safetensors and the run's tokenizer files into."
        }
    )


def find_checkpoint(source: str | Path) -> Path:
    """``source`` itself if it is a checkpoint whose files match its manifest, else a run
    directory's newest intact checkpoint (skipping damaged ones with a warning)."""
    source = Path(source)
    if (source / TRAIN_STATE).is_file():
        problem = verify_manifest(source)
        if problem is not None:
            raise ValueError(f"{source}: the checkpoint is damaged ({problem}); export an earlier one")
        return source
    if not RunDir(source).checkpoints.is_dir():
        raise FileNotFoundError(
            f"{source}: neither a checkpoint (no {TRAIN_STATE}) nor a run directory (no {CHECKPOINTS}/)"
        )
    checkpointer = Checkpointer(RunDir(source), lambda *_: None, CheckpointConfig(), DistributedContext())
    checkpoint = checkpointer.latest()
    if checkpoint is None:
        raise FileNotFoundError(f"{source}: no checkpoint in {RunDir(source).checkpoints}")
    return checkpoint


def checkpoint_model_state(checkpoint: Path) -> dict[str, torch.Tensor]:
    """The whole model of ``checkpoint``, keyed by parameter name: gathered from its shards, or
    read from its model file."""
    if read_train_state(checkpoint / TRAIN_STATE).get("format") == SHARDED_FORMAT:
        return read_model_state(checkpoint)
    return read_state_dict(checkpoint)


def write_model_files(checkpoint: Path, out: Path) -> None:
    """``checkpoint``'s model as ``config.json`` + ``model.safetensors`` in ``out``: written into a
    hidden folder of ``out`` first, then each file renamed into place (nothing half-written), the
    config last: a stop between the two renames leaves the folder's former config, which a loader
    checks the new weights against (a shape that differs is an error naming the file)."""
    config_path = checkpoint / CONFIG_NAME
    config = config_from_hf(read_json(config_path), str(config_path))
    state = checkpoint_model_state(checkpoint)
    out.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".export-", suffix=".tmp", dir=out))
    try:
        save_state_dict(config, state, staging)
        for path in sorted(staging.iterdir(), key=lambda path: path.name == CONFIG_NAME):
            os.replace(path, out / path.name)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def export_checkpoint(config: CheckpointExportConfig) -> Path:
    """Write ``config.source``'s checkpoint as a model folder in ``config.out``, with the run's
    tokenizer files when the checkpoint lies in a run directory that has them; returns it."""
    from gptkit.tokenizer import Tokenizer

    checkpoint = find_checkpoint(config.source)
    out = Path(config.out)
    write_model_files(checkpoint, out)
    run_dir = checkpoint.parent.parent if checkpoint.parent.name == CHECKPOINTS else None
    if run_dir is not None and run_dir.resolve() != out.resolve():
        try:
            tokenizer = Tokenizer.from_pretrained(run_dir)
        except (OSError, ValueError):  # a run directory without its tokenizer files: the model alone
            return checkpoint
        tokenizer.save_pretrained(out)
    return checkpoint


def cmd_checkpoint_export(config: CheckpointExportConfig) -> None:
    """The CLI's ``checkpoint export``: export, and say what was written."""
    checkpoint = export_checkpoint(config)
    print(f"wrote {config.out} (the model of {checkpoint})")
