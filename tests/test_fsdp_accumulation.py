"""Gradient accumulation under FSDP2, on 2 gloo processes: by default each micro-batch's gradients
are reduce-scattered, so a rank holds only its shard of the gradient between micro-batches, and the
losses are one process's on the same global batch; with ``fsdp_defer_gradient_sync`` every rank
holds the whole fp32 gradient until the last micro-batch, as the estimate then counts."""

from __future__ import annotations

import math
import tempfile

import pytest
import torch
import torch.multiprocessing as mp

from gptkit import GPT, GPTConfig
from gptkit.testing.processes import free_port, torchrun_environment
from gptkit.train.config import TrainConfig
from gptkit.train.memory.estimate import EstimateOptions, PretrainEstimateConfig, estimate_pretrain
from gptkit.train.memory.simulation import NoBatches
from tests.test_estimate import SHAPE, parameter_shapes

# 37 rows of the token embedding: the two shards differ, as they do for GPT-2's 50,257.
CONFIG = GPTConfig(vocab_size=37, context_length=16, n_layer=2, n_head=2, d_model=16, dropout=0.0)
BATCH, MICRO, UPDATES, WORLD = 8, 2, 2, 2  # 2 micro-batches per rank, 4 for one process
SETTINGS = [(precision, defer) for precision in ("fp32", "bf16") for defer in (False, True)]


def global_batches() -> list[dict]:
    generator = torch.Generator().manual_seed(3)
    ids = torch.randint(0, CONFIG.vocab_size, (UPDATES, BATCH, CONFIG.context_length), generator=generator)
    return [{"input_ids": update, "labels": update} for update in ids]


def fsdp_params(model: torch.nn.Module) -> list:
    """FSDP2's record of each parameter: its shard, its gathered form, their gradients."""
    from torch.distributed.fsdp import FSDPModule

    groups = [m._get_fsdp_state()._fsdp_param_group for m in model.modules() if isinstance(m, FSDPModule)]
    return [fsdp_param for group in groups if group for fsdp_param in group.fsdp_params]


def held_gradient_bytes(model: torch.nn.Module) -> int:
    """The bytes of gradient this rank holds: its shard of each parameter's, and the unsharded
    gradients FSDP2 keeps when a backward does not reduce them: an fp32 copy
    (``unsharded_accumulated_grad``) of a gradient computed in a lower precision, else the gathered
    parameter's own ``.grad``. Read from FSDP2 itself, as the module's parameters are the gathered
    ones during its forward."""
    total = 0
    for fsdp_param in fsdp_params(model):
        shard = fsdp_param.sharded_param.grad
        unsharded = getattr(fsdp_param, "_unsharded_param", None)
        held = (fsdp_param.unsharded_accumulated_grad, None if unsharded is None else unsharded.grad)
        total += 0 if shard is None else shard.to_local().nbytes
        total += sum(grad.nbytes for grad in held if grad is not None)
    return total


def train(ctx, precision: str, defer: bool = False) -> dict:
    """UPDATES updates of the Trainer's own micro-batch loop on this rank's share of each global
    batch (FSDP2 over more than one process): the losses, and the gradient bytes held after the
    first micro-batch's backward and after the last."""
    from gptkit.train.distributed.processes import wrap_model
    from gptkit.train.loop import Trainer

    sharded = ctx.world_size > 1
    config = TrainConfig(
        batch_size=BATCH, micro_batch_size=MICRO, precision=precision, fsdp=sharded,
        fsdp_defer_gradient_sync=defer, max_steps=UPDATES,
    )  # fmt: skip
    torch.manual_seed(0)
    model = wrap_model(GPT(CONFIG), ctx, config)
    seen: list[int] = []  # at each forward: what the micro-batches before it left
    if sharded:
        model.register_forward_pre_hook(lambda *args: seen.append(held_gradient_bytes(model)))
    result = {"losses": [], "after_first": [], "after_last": []}
    share = BATCH // ctx.world_size
    with tempfile.TemporaryDirectory() as out_dir:
        trainer = Trainer(model, config, NoBatches(), out_dir, save_model=lambda *a: None, ctx=ctx)
        for batch in global_batches():
            mine = {k: v[ctx.rank * share : (ctx.rank + 1) * share] for k, v in batch.items()}
            seen.clear()
            loss, _, _ = trainer.compute_gradients(mine)
            result["losses"].append(float(loss))
            if sharded:
                result["after_first"].append(seen[1])
                result["after_last"].append(held_gradient_bytes(model))
                result["shard_bytes"] = sum(p.sharded_param.to_local().nbytes for p in fsdp_params(model))
            for optimizer in trainer.optimizers:  # a plain step: the schedule is not under test
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
    return result


def each_setting(rank: int, world_size: int, port: int, results) -> None:
    from gptkit.train.distributed.processes import init_distributed, shutdown_distributed

    torchrun_environment(rank, world_size, port)
    torch.set_num_threads(1)
    ctx = init_distributed("cpu", fsdp=True)
    try:
        for precision, defer in SETTINGS:
            results[(rank, precision, defer)] = train(ctx, precision, defer)
    finally:
        shutdown_distributed()


@pytest.fixture(scope="module")
def ranks() -> dict:
    """Every setting's results on each of 2 processes, keyed by (rank, precision, defer)."""
    with mp.Manager() as manager:
        results = manager.dict()
        mp.spawn(each_setting, args=(WORLD, free_port(), results), nprocs=WORLD, join=True)
        return dict(results)


def whole_gradient_bytes() -> int:
    return 4 * sum(p.numel() for p in GPT(CONFIG).parameters())  # fp32, FSDP2's reduce dtype


@pytest.mark.slow
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_each_rank_holds_a_shard_of_the_gradient_between_micro_batches(ranks, precision):
    """Reduced after every micro-batch: after the first, a rank holds its shard's fp32 gradient
    (about half the model's), and nothing unsharded."""
    shards = []
    for rank in range(WORLD):
        result = ranks[(rank, precision, False)]
        assert result["after_first"] == result["after_last"] == [result["shard_bytes"]] * UPDATES
        shards.append(result["shard_bytes"])
    assert sum(shards) == whole_gradient_bytes() and shards[0] != shards[1]


@pytest.mark.slow
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_deferred_sync_holds_the_whole_fp32_gradient_between_micro_batches(ranks, precision):
    """Not reduced until the last micro-batch: between micro-batches every rank holds every
    parameter's gradient, unsharded, in fp32 (even when computed in bf16); its shard after."""
    for rank in range(WORLD):
        result = ranks[(rank, precision, True)]
        assert result["after_first"] == [whole_gradient_bytes()] * UPDATES
        assert result["after_last"] == [result["shard_bytes"]] * UPDATES


@pytest.mark.slow
def test_reducing_every_micro_batch_keeps_one_process_losses(ranks):
    """The default reduces each micro-batch's gradients (a rank holds its shard after the first) and
    its losses are one process's on the same global batch, to fp32's rounding of the sums; so are
    the deferred run's."""
    from gptkit.train.distributed.processes import DistributedContext

    single = train(DistributedContext(), "fp32")["losses"]
    for rank in range(WORLD):
        default = ranks[(rank, "fp32", False)]
        assert default["after_first"] == [default["shard_bytes"]] * UPDATES
        assert default["losses"] == pytest.approx(single, abs=1e-5)
        assert ranks[(rank, "fp32", True)]["losses"] == pytest.approx(single, abs=1e-5)


def fsdp_estimate(precision: str, micro: int | None, defer: bool) -> int:
    training = TrainConfig(
        batch_size=16, micro_batch_size=micro, precision=precision, fsdp=True, fsdp_defer_gradient_sync=defer
    )
    return estimate_pretrain(PretrainEstimateConfig(SHAPE, training, EstimateOptions(devices=8))).peak_bytes


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_the_estimate_counts_the_whole_gradient_a_deferred_sync_holds(precision):
    """8 devices, 2 sequences each. Accumulating over 2 micro-batches, deferring the reduction
    raises the device's peak by the whole fp32 gradient (4 bytes a parameter) less the shard of it
    the default holds instead (4 bytes a parameter / 8): at least that, as the whole gradient is
    held through the last micro-batch, where the default holds its shard; at most 4 bytes a
    parameter. Without accumulation the two are one run."""
    weights = sum(math.prod(shape) for shape in parameter_shapes())
    shard = sum(math.ceil(shape[0] / 8) * math.prod(shape[1:]) for shape in parameter_shapes())
    raised = fsdp_estimate(precision, 1, True) - fsdp_estimate(precision, 1, False)
    assert 4 * weights - 4 * shard <= raised <= 4 * weights
    assert fsdp_estimate(precision, None, True) == fsdp_estimate(precision, None, False)


def test_deferring_the_sync_needs_fsdp():
    with pytest.raises(ValueError, match=r"fsdp_defer_gradient_sync.*add --fsdp, or drop --fsdp-defer"):
        TrainConfig(fsdp_defer_gradient_sync=True)
