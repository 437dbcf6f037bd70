"""Sharded checkpoints (torch.distributed.checkpoint) under FSDP2: a 2-process run's checkpoint
resumes on 1 and on 3 processes and ends on the run never stopped; its one-folder export is the
model a whole checkpoint holds (same greedy ids); a damaged shard is skipped for the checkpoint
before it; DCP's index is never unpickled beyond its own records."""

from __future__ import annotations

import json
import os
import pickle
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from gptkit import GPT
from gptkit.generation.decode import generate
from gptkit.train.checkpoints.checkpointer import CheckpointConfig, Checkpointer
from gptkit.train.checkpoints.export import CheckpointExportConfig, export_checkpoint
from gptkit.train.checkpoints.sharded import read_model_state
from gptkit.train.distributed.processes import DistributedContext
from gptkit.train.metrics_log import read_metrics
from gptkit.train.rundir import RunDir
from tests.test_train import alice_shards, assert_same_model

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def shards(data_dir, small_tokenizer, tmp_path_factory) -> Path:
    return alice_shards(small_tokenizer, data_dir, tmp_path_factory.mktemp("shards"))


def pretrain(shards: Path, out: Path, nproc: int, *extra: str) -> list[float]:
    """6 updates of 12 windows (12 splits over 1, 2 and 3 processes), a checkpoint every 3;
    FSDP2 whenever there are several processes; no dropout (the random streams of 2 processes
    cannot be those of 3)."""
    args = [
        *("pretrain", "--data", str(shards), "--out", str(out), "--preset", "tiny", "--context-length", "32"),
        *("--dropout", "0", "--batch-size", "12", "--micro-batch-size", "2", "--max-steps", "6"),
        *("--warmup-steps", "2", "--lr", "1e-3", "--log-every", "1", "--eval-every", "0"),
        *("--checkpoint-every", "3", "--precision", "fp32", "--no-progress", *extra),
    ]  # fmt: skip
    if nproc == 1:
        cmd = [sys.executable, "-m", "gptkit", *args]
    else:
        launch = ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"]
        cmd = [sys.executable, *launch, "-m", "gptkit", *args, "--fsdp"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, cwd=REPO)
    assert done.returncode == 0, done.stderr[-3000:]
    return [r["loss"] for r in read_metrics(out / "metrics.jsonl") if "loss" in r]


@pytest.fixture(scope="module")
def straight(shards, tmp_path_factory) -> tuple[Path, list[float]]:
    """Two processes under FSDP2, never stopped: sharded checkpoints at updates 3 and 6."""
    out = tmp_path_factory.mktemp("straight") / "run"
    return out, pretrain(shards, out, 2)


def stopped_after_3(straight_run: Path, copy: Path) -> Path:
    """The run as a stop after update 3 leaves it: its checkpoint of update 3 the newest."""
    shutil.copytree(straight_run, copy)
    shutil.rmtree(copy / "checkpoints" / "step-0000006")
    (copy / "checkpoints" / "latest.json").write_text(json.dumps({"step": 3, "path": "step-0000003"}))
    return copy


@pytest.mark.slow
def test_checkpoints_are_shards_written_by_each_process(straight):
    out, losses = straight
    assert len(losses) == 6
    checkpoint = out / "checkpoints" / "step-0000006"
    names = {p.name for p in checkpoint.iterdir()}
    assert {"__0_0.distcp", "__1_0.distcp", ".metadata", "config.json", "train_state.pt"} <= names
    assert "model.safetensors" not in names  # nothing was gathered
    manifest = json.loads((checkpoint / "manifest.json").read_text())["files"]
    assert set(manifest) == names - {"manifest.json"}
    # The run's top level has the model as one file all the same (exported from the shards).
    assert (
        GPT.from_pretrained(out).config.n_layer
        == GPT.from_pretrained(checkpoint.parent.parent).config.n_layer
    )


@pytest.mark.slow
@pytest.mark.parametrize("nproc", [1, 3])
def test_saved_at_2_resumes_at_another_number_of_processes(shards, straight, tmp_path, nproc):
    out, losses = straight
    run = stopped_after_3(out, tmp_path / "run")
    resumed = pretrain(shards, run, nproc, "--resume")
    assert resumed[:3] == losses[:3]  # the records before the checkpoint are kept
    assert resumed == pytest.approx(losses, abs=1e-5)
    assert_same_model(out, run)
    if nproc == 1:  # one process writes its checkpoints whole, as before
        assert (run / "checkpoints" / "step-0000006" / "model.safetensors").is_file()


def greedy_ids(model_dir: Path) -> list[int]:
    model = GPT.from_pretrained(model_dir).eval()
    return generate(model, torch.tensor([[1, 2, 3]]), 12, temperature=0)[0].tolist()


@pytest.mark.slow
def test_export_generates_the_greedy_ids_of_the_whole_checkpoint(shards, straight, tmp_path):
    out, _ = straight
    whole = stopped_after_3(out, tmp_path / "whole")
    pretrain(shards, whole, 1, "--resume")  # its step-6 checkpoint is written whole, by one process
    exported = tmp_path / "exported"
    done = subprocess.run(
        [sys.executable, "-m", "gptkit", "checkpoint", "export", str(out), "--out", str(exported)],
        capture_output=True, text=True, cwd=REPO, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "step-0000006" in done.stdout
    assert greedy_ids(exported) == greedy_ids(whole / "checkpoints" / "step-0000006")
    assert_same_model(whole / "checkpoints" / "step-0000006", exported)
    assert (exported / "encoder.json").is_file()  # the run's tokenizer, for gptkit generate


@pytest.mark.slow
def test_a_damaged_shard_falls_back_to_the_checkpoint_before(straight, tmp_path):
    out, _ = straight
    run = tmp_path / "run"
    shutil.copytree(out, run)
    shard = run / "checkpoints" / "step-0000006" / "__1_0.distcp"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size: only the checksum can tell
    shard.write_bytes(bytes(data))
    checkpointer = Checkpointer(RunDir(run), lambda *_: None, CheckpointConfig(), DistributedContext())
    with pytest.warns(UserWarning, match=r"step-0000006 \(__1_0.distcp does not match its checksum\)"):
        assert checkpointer.latest().name == "step-0000003"
    with pytest.raises(ValueError, match="damaged"):
        export_checkpoint(
            CheckpointExportConfig(str(run / "checkpoints" / "step-0000006"), str(tmp_path / "x"))
        )


class _Hostile:
    def __reduce__(self):
        return (os.system, ("echo pwned",))


def test_the_shards_index_unpickles_nothing_but_dcp_records(tmp_path):
    (tmp_path / ".metadata").write_bytes(pickle.dumps(_Hostile()))
    with pytest.raises(ValueError, match=r"\.metadata: not the index of a sharded checkpoint.*refusing"):
        read_model_state(tmp_path)


def test_a_dotted_name_through_an_allowed_module_is_refused(tmp_path):
    """Pickle resolves a dotted name attribute by attribute: ``os.getpid`` reached through a DCP
    module that imports os must be refused like ``os.getpid`` itself."""

    def text(value: str) -> bytes:
        return b"\x8c" + bytes([len(value)]) + value.encode()  # SHORT_BINUNICODE

    crafted = (
        b"\x80\x04" + text("torch.distributed.checkpoint.metadata") + text("os.getpid")
        + b"\x93" + b")" + b"R" + b"."  # STACK_GLOBAL, EMPTY_TUPLE, REDUCE, STOP
    )  # fmt: skip
    assert pickle.loads(crafted) == os.getpid()  # what an unchecked unpickler would run
    (tmp_path / ".metadata").write_bytes(crafted)
    with pytest.raises(
        ValueError, match=r"refusing to load torch\.distributed\.checkpoint\.metadata\.os\.getpid"
    ):
        read_model_state(tmp_path)


class _RunsOnLoad:
    def __reduce__(self):
        return (os.getpid, ())


def test_the_shards_plain_values_are_read_weights_only(tmp_path):
    """A shard's non-tensor values (the optimizer's settings) are unpickled by DCP's own planner
    with weights_only=False: a crafted shard would run code on --resume. gptkit's planner refuses."""
    import torch.distributed.checkpoint as dcp

    from gptkit.train.checkpoints.sharded import CheckedReader, load_state

    saved = {"optimizer": {"lr": _RunsOnLoad(), "eps": 1e-8, "betas": (0.9, 0.95)}}
    with pytest.warns(UserWarning):  # one process, no group: DCP says it assumes so
        dcp.save(saved, storage_writer=dcp.FileSystemWriter(tmp_path), no_dist=True)
    unchecked = {"optimizer": {"lr": 0.0, "eps": 0.0, "betas": (0.0, 0.0)}}
    dcp.load(unchecked, storage_reader=CheckedReader(tmp_path), no_dist=True)
    assert unchecked["optimizer"]["lr"] == os.getpid()  # DCP's planner ran the pickled call
    checked = {"optimizer": {"lr": 0.0, "eps": 0.0, "betas": (0.0, 0.0)}}
    with pytest.raises(
        ValueError, match=r"a shard could not be read \(UnpicklingError: Weights only load failed"
    ):
        load_state(checked, tmp_path)
    plain = {"optimizer": {"eps": 0.0, "betas": (0.0, 0.0)}}  # plain values load as they were
    load_state(plain, tmp_path)
    assert plain["optimizer"] == {"eps": 1e-8, "betas": (0.9, 0.95)}
