"""scripts/gpu_checks.py without a GPU: the CPU stand-in's one JSON line, checks skipped by name
(a missing package, a CUDA-only check, a multi-process check in one process), and the one-line
refusal of a torch without a feature the checks need. The whole stand-in run takes minutes: it is
not run here."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from gptkit.testing.gpu_checks.common import Settings
from gptkit.testing.gpu_checks.requirements import refusal, skipped_for
from gptkit.testing.scripts import load_script

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "gpu_checks.py"


@pytest.mark.slow
def test_the_stand_in_prints_one_json_line_and_says_why_each_skipped_check_did_not_run(tmp_path):
    """tiktoken made unimportable (a package of that name that raises): the check that needs it is
    skipped naming it, and so are the CUDA-only check and the one that needs several processes."""
    (tmp_path / "tiktoken").mkdir()
    (tmp_path / "tiktoken" / "__init__.py").write_text("raise ImportError('hidden by the test')\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO / "src")])}
    only = ["selective_checkpointing", "fsdp_resume", "sync_debug", "estimate_fsdp_offload"]
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--device", "cpu", "--only", *only],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert {"gpu_checks", "device", "torch", "seconds", "stand_in", "missing_packages"} <= set(summary)
    assert summary["stand_in"] is True and summary["torch"] == torch.__version__
    assert "tiktoken" in summary["missing_packages"]
    checks = summary["gpu_checks"]
    assert list(checks) == only
    assert checks["selective_checkpointing"]["passed"] is True
    assert checks["selective_checkpointing"]["measured"]["float32"]["selective_vs_unchecked"] >= 0
    for name, why in [
        ("fsdp_resume", "tiktoken"),
        ("sync_debug", "CUDA"),
        ("estimate_fsdp_offload", "--nproc"),
    ]:
        assert checks[name]["passed"] is None
        assert why in checks[name]["skipped"]


def test_a_torch_without_public_fsdp2_is_refused_in_one_line(monkeypatch, capsys):
    monkeypatch.delattr("torch.distributed.fsdp.fully_shard")
    line = refusal()
    assert line is not None and "\n" not in line
    assert "torch.distributed.fsdp.fully_shard" in line and torch.__version__ in line
    assert load_script("gpu_checks").main(["--device", "cpu", "--only", "sync_debug"]) == 2
    said = capsys.readouterr()
    assert said.out == "" and said.err.strip() == line


def test_this_torch_is_not_refused():
    assert refusal() is None


def test_a_missing_package_or_torch_piece_skips_its_check_by_name(monkeypatch):
    missing = {"transformers": "ModuleNotFoundError: No module named 'transformers'"}
    assert skipped_for("", ("transformers",), missing).startswith("needs transformers")
    assert skipped_for("", ("tiktoken",), missing) is None
    monkeypatch.delattr(torch.cuda, "set_sync_debug_mode")
    assert "torch.cuda.set_sync_debug_mode" in skipped_for("sync_debug", (), {})


@pytest.mark.parametrize(("asked", "world_sizes", "used"), [(8, (1, 2), 8), (5, (3, 2), 6), (7, (8, 2), 8)])
def test_the_global_batch_splits_over_every_world_size(asked, world_sizes, used):
    assert Settings(batch_size=asked).global_batch(*world_sizes) == used
