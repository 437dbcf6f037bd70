"""`--log-to wandb`: a W&B run in offline mode holds metrics.jsonl's numbers at metrics.jsonl's steps,
read back with W&B's own reader of its transaction log (`wandb leet inspect --json`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gptkit.data.prepare import prepare
from gptkit.train.metrics_log import read_metrics
from tests.test_train import loop_config, make_trainer

wandb = pytest.importorskip("wandb")


@pytest.fixture
def offline_wandb(tmp_path, monkeypatch):
    """W&B in offline mode with its settings and caches under tmp_path; afterwards its background
    service (wandb-core) is shut down and must be gone."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    for variable in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR", "WANDB_ARTIFACT_DIR"):
        monkeypatch.setenv(variable, str(tmp_path / "wandb-home"))
    monkeypatch.delenv("WANDB_PROJECT", raising=False)
    yield
    wandb.teardown()
    assert wandb_children() == []


def wandb_children() -> list[str]:
    """The command names of this process's children that belong to W&B (read from /proc)."""
    children = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)
        except OSError:  # the process ended while we looked
            continue
        name, parent = fields[0].split("(", 1)[1], int(fields[1].split()[1])
        if parent == os.getpid() and "wandb" in name:
            children.append(name)
    return children


def read_wandb_run(run_dir: Path) -> tuple[dict, list[dict]]:
    """The configuration and history rows of the offline run in ``run_dir``, as W&B's inspector
    decodes its .wandb file."""
    (log,) = run_dir.glob("wandb/offline-run-*/run-*.wandb")
    command = [sys.executable, "-m", "wandb", "leet", "inspect", "--json", str(log)]
    lines = subprocess.run(command, capture_output=True, text=True, check=True, timeout=60).stdout
    records = [json.loads(line) for line in lines.splitlines() if line.strip()]
    (run,) = [r["run"] for r in records if r["type"] == "run"]
    return run["config"]["update"], [r["history"] for r in records if r["type"] == "history"]


@pytest.fixture(scope="module")
def small_shards(data_dir, small_tokenizer, tmp_path_factory) -> Path:
    """About 13k tokens of Alice in Wonderland in the small tokenizer (test_train's small_model's
    vocabulary): enough for a few updates of 8 windows of 32."""
    out = tmp_path_factory.mktemp("shards")
    text = out / "alice.txt"
    text.write_text((data_dir / "gutenberg" / "pg11.txt").read_text(encoding="utf-8")[:30_000])
    prepare(small_tokenizer, [text], out / "shards", val_fraction=0.1, show_progress=False)
    return out / "shards"


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="counts W&B's processes in /proc")
def test_wandb_offline_run_gets_the_same_numbers_as_metrics_jsonl(small_shards, tmp_path, offline_wandb):
    run_dir = tmp_path / "run"
    config = loop_config(max_steps=4, eval_every=2, checkpoint_every=None, log_to=["wandb"])
    run_config = {"model": {"n_layer": 2, "d_model": 32}, "lr": 3e-3}
    trainer, _ = make_trainer(small_shards, run_dir, config, run_config=run_config)
    trainer.fit()
    records = read_metrics(run_dir / "metrics.jsonl")
    wandb_config, history = read_wandb_run(run_dir)
    assert {name: wandb_config[name] for name in run_config} == run_config
    steps = [row["step"]["num"] for row in history]
    assert steps == sorted({r["step"] for r in records})  # one W&B row per logged step
    for name in ("loss", "lr", "grad_norm", "tokens_per_s", "tokens_seen", "val_loss", "val_ppl"):
        expected = [(r["step"], r[name]) for r in records if name in r]
        got = [(row["step"]["num"], row["item"][name]) for row in history if name in row["item"]]
        assert got == expected and len(expected) >= 2, name  # float64 both ways: exactly equal


def test_without_wandb_or_a_login_the_error_says_what_to_do(
    small_shards, tmp_path, monkeypatch, offline_wandb
):
    monkeypatch.setenv("WANDB_MODE", "online")  # and no API key anywhere W&B looks
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    with pytest.raises(ValueError, match=r"^--log-to wandb: .*set WANDB_MODE=offline to keep the W&B run in"):
        make_trainer(small_shards, tmp_path / "online", loop_config(log_to=["wandb"]))
    monkeypatch.setitem(sys.modules, "wandb", None)  # not installed
    with pytest.raises(
        ImportError, match=r"^--log-to wandb needs the wandb package: pip install -e '\.\[wandb\]'$"
    ):
        make_trainer(small_shards, tmp_path / "missing", loop_config(log_to=["wandb"]))
