"""A failure on one process of a run fails every process together, within seconds, instead of
leaving the others waiting forever in a collective the failed one never reaches: a checkpoint that
rank 0 cannot write (whole, or after the shards), a shard that rank 1 cannot write, and the best dev
model when the ranks' scores disagree. Two gloo processes on the CPU each time; a process still
running after ``TIMEOUT`` s is a hang, and fails the test."""

from __future__ import annotations

import contextlib
import errno
import json
import time
from pathlib import Path
from unittest import mock

import pytest
import torch
import torch.multiprocessing as mp

from gptkit import GPT, GPTConfig
from gptkit.testing.processes import free_port, torchrun_environment

pytestmark = pytest.mark.slow

TIMEOUT = 120.0  # seconds for both processes, their start included, on a loaded 2-core machine
CONFIG = GPTConfig(vocab_size=32, context_length=8, n_layer=1, n_head=2, d_model=32)
FULL = "No space left on device"


def run_two(worker, *args) -> dict[int, dict]:
    """``worker(rank, world_size, port, *args, results)`` in 2 processes: what each put in
    ``results``. Processes still running after ``TIMEOUT`` s fail the test, and are killed."""
    with mp.Manager() as manager:
        results = manager.dict()
        context = mp.spawn(worker, args=(2, free_port(), *args, results), nprocs=2, join=False)
        deadline = time.monotonic() + TIMEOUT
        try:
            while not context.join(timeout=max(deadline - time.monotonic(), 0.1)):
                if time.monotonic() >= deadline:
                    running = [rank for rank, p in enumerate(context.processes) if p.is_alive()]
                    pytest.fail(
                        f"hung: rank(s) {running} still running after {TIMEOUT:.0f} s; {dict(results)}"
                    )
        finally:
            for process in context.processes:
                if process.is_alive():
                    process.kill()
                process.join()
        return dict(results)


def outcome(call) -> dict:
    """How ``call`` ended: the error's type, errno and message, or none."""
    try:
        call()
    except BaseException as e:  # whatever it is, the test says what it was
        return {"error": type(e).__name__, "errno": getattr(e, "errno", None), "message": str(e)}
    return {"error": None}


def in_step(ctx) -> bool:
    """Whether the processes still meet in the same collective after what happened."""
    return ctx.all_gather_object(ctx.rank) == list(range(ctx.world_size))


def wrapped_model(rank: int, world_size: int, port: int, fsdp: bool):
    """The process group as torchrun starts it, and the tiny model DDP- or FSDP2-wrapped."""
    from gptkit.train.config import TrainConfig
    from gptkit.train.distributed.processes import init_distributed, wrap_model

    torchrun_environment(rank, world_size, port)
    torch.set_num_threads(1)
    ctx = init_distributed("cpu")
    torch.manual_seed(0)
    return ctx, wrap_model(GPT(CONFIG), ctx, TrainConfig(max_steps=1, fsdp=fsdp, precision="fp32"))


def one_update(model: torch.nn.Module) -> torch.optim.Optimizer:
    """An optimizer with moments to save."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ids = torch.randint(0, CONFIG.vocab_size, (2, CONFIG.context_length))
    model(ids, labels=ids).loss.backward()
    optimizer.step()
    return optimizer


# Checkpoints -----------------------------------------------------------------------------------------


def full_disk(path: Path):
    """A writer (of anything, with any arguments) that finds the disk full writing ``path``."""

    def write(*_) -> None:
        raise OSError(errno.ENOSPC, FULL, str(path))

    return write


def describe(directory: Path) -> None:
    (directory / "config.json").write_text("{}")


def save_failing(rank: int, world_size: int, port: int, out: Path, failing: str, results) -> None:
    """One checkpoint whose write fails as ``failing`` says: ``whole`` (rank 0 writes the model
    whole, under DDP), ``rank 0 after the shards`` (its model description) or ``rank 1's shard``."""
    import torch.distributed.checkpoint as dcp

    from gptkit.train.checkpoints.checkpointer import CheckpointConfig, Checkpointer
    from gptkit.train.distributed.processes import shutdown_distributed
    from gptkit.train.rundir import RunDir

    ctx, model = wrapped_model(rank, world_size, port, fsdp=failing != "whole")
    try:
        optimizer = one_update(model)
        run_dir = RunDir(out)
        staging = run_dir.staging(run_dir.checkpoint(2))
        checkpointer = Checkpointer(
            run_dir, full_disk(staging / "model.safetensors"), CheckpointConfig(), ctx
        )
        if failing != "whole":  # sharded checkpoints: rank 0 describes the model after the shards
            full = failing == "rank 0 after the shards"
            checkpointer.describe_model = full_disk(staging / "config.json") if full else describe
        with contextlib.ExitStack() as patches:
            if failing == "rank 1's shard" and rank == 1:
                shard = full_disk(staging / f"__{rank}_0.distcp")
                patches.enter_context(mock.patch.object(dcp.FileSystemWriter, "write_data", shard))
            results[rank] = outcome(lambda: checkpointer.save(2, model, [optimizer], {}))
        results[rank] = {**results[rank], "in_step": in_step(ctx)}
    finally:
        shutdown_distributed()


@pytest.mark.parametrize("failing", ["whole", "rank 0 after the shards", "rank 1's shard"])
def test_a_checkpoint_one_rank_cannot_write_fails_every_rank(tmp_path, failing):
    """One rank's failed write reaches the other, which would otherwise wait at the end of ``save``
    in a barrier; a shard's failure, which DCP raises on every process, becomes the one-line
    CheckpointWriteError on both."""
    got = run_two(save_failing, tmp_path, failing)
    checkpoints = tmp_path / "checkpoints"
    failed = 1 if failing == "rank 1's shard" else 0
    file = {"whole": "model.safetensors", "rank 0 after the shards": "config.json"}.get(
        failing, "__1_0.distcp"
    )
    cause = f"{FULL} ({checkpoints / '.step-0000002.tmp' / file})"
    said = f"could not write checkpoint step-0000002 in {checkpoints}: {cause}; "
    assert got[failed]["error"] == "CheckpointWriteError", got
    assert got[failed]["errno"] == errno.ENOSPC
    assert got[failed]["message"].startswith(f"[Errno 28] {said}"), got
    assert got[failed]["message"].endswith("No checkpoint was written yet: free space, then run again")
    other = got[1 - failed]
    assert other["error"] == "CheckpointWriteError" and other["errno"] == errno.ENOSPC, got
    if failing == "rank 1's shard":  # DCP told rank 0 too: its own write failed, with rank 1's cause
        assert other["message"].startswith(f"[Errno 28] {said.replace(FULL, FULL + ' on rank 1')}"), got
    else:
        assert other["message"] == got[failed]["message"].replace("[Errno 28] ", "[Errno 28] rank 0 failed: ")
    assert got[0]["in_step"] and got[1]["in_step"]
    assert not list(tmp_path.rglob("*.tmp")), "debris left"
    assert not (checkpoints / "step-0000002").exists() and not (checkpoints / "latest.json").exists()


# The best dev model ------------------------------------------------------------------------------------


def keep_best(rank: int, world_size: int, port: int, out: Path, improved: int, results) -> None:
    """Two evaluations: both ranks score 0.5, then only rank ``improved`` scores better (0.75)."""
    from gptkit.train.distributed.processes import shutdown_distributed
    from gptkit.train.finetune.common import BestModel

    ctx, model = wrapped_model(rank, world_size, port, fsdp=True)
    try:

        def save_model(directory: Path, state: dict[str, torch.Tensor]) -> None:
            directory.mkdir(parents=True, exist_ok=True)
            torch.save(state, directory / "model.pt")

        best = BestModel(out, "accuracy", save_model, ctx, resume=False)
        best(1, {"dev_accuracy": 0.5}, model)  # both improve on nothing: both gather
        score = 0.75 if rank == improved else 0.5
        results[rank] = outcome(lambda: best(2, {"dev_accuracy": score}, model))
        results[rank] = {**results[rank], "best": dict(best.best), "in_step": in_step(ctx)}
    finally:
        shutdown_distributed()


@pytest.mark.parametrize("improved", [0, 1])
def test_the_best_model_follows_rank_0s_score_on_every_rank(tmp_path, improved):
    """Both ranks follow rank 0's score: a rank whose own score improved would otherwise gather the
    FSDP2 shards alone, and wait forever."""
    got = run_two(keep_best, tmp_path, improved)
    assert got[0]["error"] is None and got[1]["error"] is None, got
    assert got[0]["in_step"] and got[1]["in_step"]
    expected = {"score": 0.75, "step": 2} if improved == 0 else {"score": 0.5, "step": 1}
    for rank in (0, 1):
        assert {k: got[rank]["best"][k] for k in ("score", "step")} == expected, got
    assert json.loads((tmp_path / "best.json").read_text())["step"] == expected["step"]
    assert (tmp_path / "model.pt").is_file()
