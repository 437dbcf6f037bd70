"""FSDP2 pre-training with CPU offload and meta-device initialisation, its sharded (DCP) checkpoint
resumed elsewhere: saved on the GPUs, resumed on 2 CPU processes over gloo.

The run is `gptkit pretrain --fsdp --fsdp-offload`, called through its Python API
(:func:`gptkit.train.pretrain.pretrain`) on the corpus and BPE of :mod:`~.common`: on one GPU the
process shards over a group of itself, as the command does without torchrun; with ``--nproc N``,
N processes under torchrun. It checkpoints after updates 3 and 6. A copy of its folder as a stop
after update 3 leaves it is then resumed by torchrun on 2 CPU processes and must reach the losses of
updates 4 to 6 that the uninterrupted run logged.

Why :data:`TOLERANCE` is 1e-3 on the loss: both runs are fp32 with dropout off, start update 4
from the same weights and moments (DCP reads them exactly) and draw the same batches (the global
batch does not depend on the processes). Under CPU offload the optimizer steps on the host in both;
only the forward and backward passes differ, in the GPU's summation order and kernels against the
CPU's (TF32 is off for fp32 products by default), about 1e-6 relative each. Three updates of AdamW
carry that to about 1e-5 on a loss near 5 (two CPU runs, 1 process against 2, differ by 5e-7); 1e-3
leaves room for it, yet is far below what a wrong resume costs: the loss moves by about 0.07 from
one update to the next here (the JSON reports the smallest move), so another batch, lost moments
or a step off shows.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

from gptkit.testing.gpu_checks.common import Settings, prepared_shards, torchrun
from gptkit.train.config import TrainConfig
from gptkit.train.metrics_log import read_metrics
from gptkit.train.pretrain import PretrainConfig, pretrain
from gptkit.train.run import ModelShape
from gptkit.train.rundir import RunDir

TOLERANCE = 1e-3
UPDATES, SAVED_AT = 6, 3
RESUMED_ON = 2  # CPU processes over gloo


def pretrain_config(
    data: Path, out: Path, device: str, batch: int, resume: bool = False, stand_in: bool = False
) -> PretrainConfig:
    """The run, as `gptkit pretrain --fsdp --fsdp-offload --precision fp32 --dropout 0 ...` sets it."""
    width = 64 if stand_in else 256
    shape = ModelShape(preset="gpt2", n_layer=2, n_head=2, d_model=width, context_length=64, dropout=0.0)
    train = TrainConfig(
        max_steps=UPDATES, batch_size=batch, lr=1e-3, warmup_steps=2, precision="fp32", fsdp=True,
        fsdp_offload=True, checkpoint_every=SAVED_AT, keep_checkpoints=UPDATES, eval_every=0, log_every=1,
        progress=False, seed=0,
    )  # fmt: skip
    return PretrainConfig(
        data=str(data),
        model=shape,
        out=str(out),
        device=device,
        resume=resume,
        eval_windows=4,
        training=train,
    )


def _losses(out: Path) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in read_metrics(out / "metrics.jsonl") if "loss" in r}


def stopped_after(run: Path, copy: Path, step: int) -> None:
    """``run`` copied to ``copy`` as a stop after ``step`` leaves it: the later checkpoints gone,
    and the pointer to the newest with them (a resume then takes the newest complete one)."""
    shutil.copytree(run, copy)
    run_dir = RunDir(copy)
    for later in range(step + 1, UPDATES + 1):
        shutil.rmtree(run_dir.checkpoint(later), ignore_errors=True)
    run_dir.latest_pointer.unlink(missing_ok=True)


def check_fsdp_resume(settings: Settings) -> dict[str, Any]:
    """The run straight through on ``settings.nproc`` devices, then resumed from update 3 on 2 CPU
    processes: the losses of updates 4 to 6 against each other."""
    data, straight, resumed = (
        prepared_shards(settings.work),
        settings.work / "straight",
        settings.work / "resumed",
    )
    batch = settings.global_batch(settings.nproc, RESUMED_ON)
    if settings.nproc == 1:  # one process sharding over a group of itself, as `gptkit pretrain --fsdp`
        pretrain(pretrain_config(data, straight, settings.device, batch, stand_in=settings.stand_in))
    else:
        args = ["pretrain", str(data), str(straight), settings.device, str(batch), str(settings.stand_in)]
        torchrun(settings.nproc, args, timeout=240)
    stopped_after(straight, resumed, SAVED_AT)
    checkpoints = straight / "checkpoints"
    sharded = sorted(str(p.relative_to(checkpoints)) for p in checkpoints.rglob("*.distcp"))
    args = ["pretrain", str(data), str(resumed), "cpu", str(batch), str(settings.stand_in), "resume"]
    torchrun(RESUMED_ON, args, timeout=240, threads=max(1, (os.cpu_count() or 2) // RESUMED_ON))
    expected, got = _losses(straight), _losses(resumed)
    steps = range(SAVED_AT + 1, UPDATES + 1)
    if not all(step in got for step in steps):
        return {"passed": False, "error": f"the resumed run logged updates {sorted(got)}"}
    difference = max(abs(expected[step] - got[step]) for step in steps)
    # What the tolerance is against: how much the loss moves from one update to the next.
    moves = min(abs(expected[step] - expected[step - 1]) for step in range(2, UPDATES + 1))
    return {
        "passed": bool(sharded) and difference <= TOLERANCE,
        "saved_on": f"{settings.nproc} x {settings.device}",
        "resumed_on": f"{RESUMED_ON} x cpu (gloo)",
        "batch_size": batch,
        "dcp_files": sharded,
        "losses_straight": [round(expected[s], 6) for s in steps],
        "losses_resumed": [round(got[s], 6) for s in steps],
        "largest_loss_difference": difference,
        "tolerance": TOLERANCE,
        "smallest_change_between_updates": round(moves, 6),
    }
