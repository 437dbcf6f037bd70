"""FSDP2 with its policies on 2 gloo processes against one process, same global batch: CPU offload
and activation checkpointing change no number; a bf16 gather with an fp32 reduction stays within
bf16's rounding of the one-process bf16 run."""

from __future__ import annotations

import pytest
import torch

from gptkit import GPT
from tests.test_train import assert_same_model, run_pretrain, shards  # noqa: F401 (shards: the module's fixture)


@pytest.mark.slow
def test_offload_and_checkpointing_match_one_process(shards, tmp_path):  # noqa: F811
    single = run_pretrain(shards, tmp_path / "one")
    sharded = run_pretrain(
        shards, tmp_path / "two", "--fsdp", "--fsdp-offload", "--activation-checkpointing", "full", nproc=2
    )
    assert len(single) == len(sharded) == 6
    assert sharded == pytest.approx(single, abs=1e-5)
    # Checkpoints are full-state and load into a single process.
    assert_same_model(tmp_path / "one", tmp_path / "two")


@pytest.mark.slow
def test_bf16_mixed_precision_matches_one_process_bf16(shards, tmp_path):  # noqa: F811
    """One process: fp32 weights, bf16 autocast. Two: the blocks' weights gathered in bf16 (what
    autocast would cast them to anyway, but the LayerNorms' and embeddings' too), gradients reduced
    in fp32, fp32 shards stepped: the same losses to bf16's precision, not to fp32's."""
    single = run_pretrain(shards, tmp_path / "one", "--precision", "bf16")
    sharded = run_pretrain(
        shards, tmp_path / "two", "--precision", "bf16", "--fsdp", "--activation-checkpointing", "selective",
        nproc=2,
    )  # fmt: skip
    assert len(single) == len(sharded) == 6
    assert sharded == pytest.approx(single, abs=0.03)
    assert sharded != pytest.approx(single, abs=1e-6)  # the gather's rounding is visible
    # The weights written are fp32: the shards are stepped in fp32, and gathered so.
    assert GPT.from_pretrained(tmp_path / "two").wte.weight.dtype == torch.float32


def test_fsdp_over_one_process_with_offload_matches_the_plain_run(shards, tmp_path):  # noqa: F811
    """One process shards over a group of itself (no torchrun): FSDP2 with CPU offload on one
    device, the same losses as the plain run, and a sharded checkpoint the other commands read."""
    single = run_pretrain(shards, tmp_path / "one")
    sharded = run_pretrain(shards, tmp_path / "fsdp", "--fsdp", "--fsdp-offload")
    assert len(single) == len(sharded) == 6
    assert sharded == pytest.approx(single, abs=1e-5)
    assert any((tmp_path / "fsdp" / "checkpoints").glob("step-*/*.distcp"))
    assert_same_model(tmp_path / "one", tmp_path / "fsdp")
