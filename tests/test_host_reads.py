"""The training loop waits for the device once per update.

On a GPU, every read of a tensor's value on the host (``float(t)``, ``.item()``, ``.tolist()``,
``bool(t)``) waits until the device has computed it, and the queue of work runs dry meanwhile. A
CPU has no queue, but the reads are the same calls: here they are counted as the loop makes them,
by a torch function mode that notes each read whose nearest caller outside torch is gptkit's code
(torch's own optimizers read host-side step counters, which are no waits). Token ids are the one
exception, by design: the loop checks them on the host, before they move to the device, and on a
GPU the model's forward leaves them unread (``GPT.check_token_ids``). What the mode cannot see is an
operation that waits inside torch without reading a value into Python (``.cpu()``, ``nonzero``, a
boolean mask's indexing); the first GPU run counts those with CUDA's own sync debug mode
(``scripts/gpu_checks.py``, ``sync_debug``).
"""

from __future__ import annotations

import sys
from collections import Counter

import pytest
import torch
from torch.overrides import TorchFunctionMode

from gptkit import GPT, GPTConfig
from gptkit.train.config import TrainConfig
from gptkit.train.distributed.processes import DistributedContext
from gptkit.train.loop import Trainer

READS = {"__float__", "__int__", "__bool__", "__index__", "item", "tolist", "numpy"}
UPDATES = 5


class HostReads(TorchFunctionMode):
    """Counts gptkit's reads of tensor values, by the function that made them."""

    def __init__(self):
        super().__init__()
        self.by_caller: Counter[str] = Counter()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if getattr(func, "__name__", "") in READS:
            frame = sys._getframe(1)
            while frame is not None and frame.f_globals.get("__name__", "").startswith("torch"):
                frame = frame.f_back
            module = frame.f_globals.get("__name__", "") if frame is not None else ""
            if module.startswith("gptkit") and frame.f_code.co_name != "check_token_ids":
                self.by_caller[f"{module}.{frame.f_code.co_name}"] += 1
        return func(*args, **(kwargs or {}))


class RandomWindows:
    """A BatchSource of random token ids, its position the number of batches drawn."""

    def __init__(self, vocab: int, batch: int, length: int, seed: int):
        self.vocab, self.batch, self.length, self.seed, self.drawn = vocab, batch, length, seed, 0

    def next_batch(self) -> dict[str, torch.Tensor]:
        generator = torch.Generator().manual_seed(self.seed * 1000 + self.drawn)
        self.drawn += 1
        ids = torch.randint(0, self.vocab, (self.batch, self.length), generator=generator)
        return {"input_ids": ids, "labels": ids}

    def state_dict(self) -> dict:
        return {"drawn": self.drawn}

    def load_state_dict(self, state: dict) -> None:
        self.drawn = state["drawn"]


def loop_reads(out_dir, ctx: DistributedContext | None = None, **overrides) -> Counter:
    """The host reads of a short run's loop (its updates, their logging and stop checks: all but
    the setup before and the checkpoint after), a tiny GPT at 2 micro-batches an update."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=64, context_length=16, n_layer=1, n_head=2, d_model=32))
    world = ctx.world_size if ctx else 1
    config = TrainConfig(
        **{"max_steps": UPDATES, "batch_size": 4 * world, "micro_batch_size": 2, "warmup_steps": 1,
           "eval_every": 0, "log_every": 1, "progress": False, "precision": "fp32", **overrides}
    )  # fmt: skip
    data = RandomWindows(64, 4, 16, seed=ctx.rank if ctx else 0)
    trainer = Trainer(model, config, data, out_dir, save_model=lambda *a: None, ctx=ctx)
    trainer.save_checkpoint = lambda: None  # checkpoints are no update's business
    loop, reads = trainer._loop, HostReads()

    def counted_loop(*args):
        with reads:
            loop(*args)

    trainer._loop = counted_loop
    trainer.fit()
    assert trainer.step == UPDATES
    return reads.by_caller


@pytest.mark.parametrize(
    "overrides",
    [{}, {"precision": "fp16"}, {"precision": "fp16", "optimizer": "muon"}, {"grad_clip": 0.0}],
    ids=["fp32", "fp16", "fp16-muon", "no-clip"],
)
def test_one_process_reads_the_device_once_per_update(tmp_path, overrides):
    assert loop_reads(tmp_path, **overrides) == {"gptkit.train.loop._read_update": UPDATES}


def two_ranks(rank: int, world_size: int, port: int, out_dir: str, overrides: dict, results) -> None:
    import torch.distributed as dist

    from gptkit.testing.processes import torchrun_environment
    from gptkit.train.distributed.processes import init_distributed

    torchrun_environment(rank, world_size, port)
    ctx = init_distributed("cpu")
    try:
        results[rank] = dict(loop_reads(f"{out_dir}/{rank}", ctx, **overrides))
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
@pytest.mark.parametrize("budget", [None, "1h"], ids=["no-budget", "time-budget"])
def test_each_of_two_processes_reads_the_device_once_per_update(tmp_path, budget):
    """Under torchrun the stop requests and a time budget's deadline travel in the update's own
    all-reduce: no second read. Planning for the budget (after the 5th update) reads the ranks'
    mean pace, once."""
    import torch.multiprocessing as mp

    from gptkit.testing.processes import free_port

    overrides = {} if budget is None else {"time_budget": budget}
    with mp.Manager() as manager:
        results = manager.dict()
        mp.spawn(two_ranks, args=(2, free_port(), str(tmp_path), overrides, results), nprocs=2, join=True)
        got = dict(results)
    expected = {"gptkit.train.loop._read_update": UPDATES}
    if budget is not None:
        expected["gptkit.train.budget._updates_that_fit"] = 1
    assert got == {0: expected, 1: expected}
