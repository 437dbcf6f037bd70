"""The distributed training paths at 8 ranks in one process: a fake process group (collectives
return at once) and, for FSDP2, fake tensors (shapes and dtypes, no storage), the machinery of
`gptkit estimate`. The Trainer's own step runs; what is checked is what the ranks would do.

What cannot be simulated here, and why:
- DDP on fake tensors: its C++ reducer allocates real buckets. DDP runs on real (tiny) tensors over
  the fake group instead; the values are meaningless (no rank sends anything), the calls are real.
- The numbers a reduction computes: the fake group moves no data. The equal-loss checks against one
  process are the 2-process gloo tests (tests/test_fsdp.py, tests/test_train.py).
- CPU offload's placement: on a CPU, the device memory is host memory, so the shards are on the
  host with or without it; the policy in force is checked, and the step runs under it.
- CUDA placement: fake CUDA tensors can be made in a CPU build of PyTorch (shapes first, then
  ``to_empty(device="cuda")``), but little runs on them: attention and autograd's gradient
  accumulators abort the process (no CUDA device guard), and an in-place copy such as the KV
  cache's write raises that PyTorch is not linked with CUDA. So the training step, KV-cached
  generation and the server's batched step cannot be run on fake CUDA tensors here; they run on a
  GPU in benchmarks/gpu.sh.
"""

from __future__ import annotations

import math
import tempfile
import warnings

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.distributed.fsdp import CPUOffloadPolicy
from torch.distributed.tensor import DTensor, Shard
from torch.distributed.tensor.debug import CommDebugMode

from gptkit.train.config import TrainConfig
from gptkit.train.distributed.processes import wrap_model
from gptkit.train.finetune.tasks import FinetuneConfig
from gptkit.train.loop import Trainer
from gptkit.train.memory.estimate import (
    EstimateOptions,
    FinetuneEstimateConfig,
    PretrainEstimateConfig,
    finetune_simulation,
    pretrain_simulation,
)
from gptkit.train.memory.simulation import build_trainer, simulated_ranks
from gptkit.train.run import ModelShape

RANKS, PER_RANK = 8, 2
SHAPE = ModelShape(preset="tiny", n_head=4)  # 2 blocks, d 32
c10d = torch.ops.c10d


def simulation(stage: str, **train):
    training = TrainConfig(batch_size=RANKS * PER_RANK, **train)
    options = EstimateOptions(devices=RANKS, target="cpu")
    if stage == "pretrain":
        return pretrain_simulation(PretrainEstimateConfig(SHAPE, training, options))
    finetune = FinetuneConfig(model=SHAPE, max_length=16, training=training)
    return finetune_simulation(FinetuneEstimateConfig(finetune, options))


def gathered_dtypes(model) -> list[torch.dtype]:
    """The dtype of a block's weight each time the block computes (forward, and recomputation)."""
    seen = []
    gpt = model.gpt if hasattr(model, "gpt") else model
    gpt.h[0].mlp.c_fc.register_forward_pre_hook(lambda module, args: seen.append(module.weight.dtype))
    return seen


@pytest.mark.parametrize("stage", ["pretrain", "finetune"])
@pytest.mark.parametrize(
    ("precision", "offload", "checkpointing"),
    [("fp32", False, "none"), ("bf16", False, "selective"), ("bf16", True, "full"), ("fp32", True, "none")],
)
def test_fsdp2_at_8_ranks(stage, precision, offload, checkpointing):
    sim = simulation(
        stage, precision=precision, fsdp=True, fsdp_offload=offload, activation_checkpointing=checkpointing
    )
    with (
        tempfile.TemporaryDirectory() as out_dir,
        simulated_ranks(RANKS) as ctx,
        FakeTensorMode(),
        warnings.catch_warnings(),
    ):
        warnings.simplefilter("ignore")  # CommDebugMode's module hooks on a dataclass output
        trainer = build_trainer(sim, ctx, PER_RANK, out_dir)
        model = trainer.model
        params = dict(model.named_parameters())
        # Every parameter sharded along its first dimension: rank 0 holds the first ceil(rows / 8).
        for name, param in params.items():
            assert isinstance(param, DTensor) and param.placements == (Shard(0),), name
            local = param.to_local()
            assert local.shape == (math.ceil(param.shape[0] / RANKS), *param.shape[1:]), name
            assert local.dtype == torch.float32, name  # the shards stay fp32 under mixed precision
        seen = gathered_dtypes(model)
        with CommDebugMode() as comm:
            trainer.compute_gradients(sim.make_batch(PER_RANK))
        expected = torch.bfloat16 if precision == "bf16" else torch.float32
        recomputed = checkpointing != "none"
        assert seen == [expected] * (2 if recomputed else 1)
        # One all-gather per unit in the forward pass (2 blocks, the root), the blocks' again in the
        # backward pass; one reduce-scatter per unit: every gradient is reduced, sharded, in fp32.
        counts = comm.get_comm_counts()
        assert counts[c10d._allgather_base_] == 3 + 2
        assert counts[c10d._reduce_scatter_base_] == 3
        for name, param in params.items():
            grad = param.grad
            assert grad is not None, name
            assert isinstance(grad, DTensor) and grad.to_local().shape == param.to_local().shape, name
            assert grad.dtype == torch.float32, name
        trainer.apply_gradients()
        # AdamW's moments are sharded as their parameters are.
        for name, param in params.items():
            state = trainer.optimizers[0].state[param]
            for moment in ("exp_avg", "exp_avg_sq"):
                assert state[moment].to_local().shape == param.to_local().shape, (name, moment)
        offload_policy = model._get_fsdp_state()._fsdp_param_group.offload_policy
        assert isinstance(offload_policy, CPUOffloadPolicy) == offload


@pytest.mark.parametrize("stage", ["pretrain", "finetune"])
@pytest.mark.parametrize("checkpointing", ["none", "full"])
def test_ddp_at_8_ranks_reduces_every_gradient(stage, checkpointing):
    """DDP on real tiny tensors over the fake group: every trained parameter's gradient is in a
    bucket that is all-reduced, once per update (after the last micro-batch only)."""
    sim = simulation(stage, precision="fp32", micro_batch_size=1, activation_checkpointing=checkpointing)
    reduced: list[torch.Tensor] = []

    def count(state, bucket):
        reduced.extend(bucket.parameters())
        future = torch.futures.Future()
        future.set_result(bucket.buffer())
        return future

    with tempfile.TemporaryDirectory() as out_dir, simulated_ranks(RANKS) as ctx:
        torch.manual_seed(0)
        train = sim.train
        model = sim.build()
        wrapped = wrap_model(model, ctx, train)
        wrapped.register_comm_hook(None, count)
        trainer = Trainer(wrapped, train, None, out_dir, save_model=lambda *a: None, ctx=ctx)
        trainer.compute_gradients(sim.make_batch(PER_RANK))
    trained = [p for p in model.parameters() if p.requires_grad]
    assert sorted(map(id, reduced)) == sorted(map(id, trained))
    assert all(p.grad is not None for p in trained)
