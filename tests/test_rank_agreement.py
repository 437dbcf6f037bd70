"""Under torchrun, what reaches one process stops all of them after the same update: a SIGTERM
delivered to rank 1 alone (a node's own pre-emption), and a time budget only rank 1's clock says is
spent. Both travel in the update's shared values; no process is left in a collective."""

from __future__ import annotations

import os
import signal
import time

import pytest
import torch

from gptkit import GPT, GPTConfig
from gptkit.train.config import TrainConfig
from gptkit.train.loop import Interrupted, Trainer
from tests.test_host_reads import RandomWindows

AT = 3  # the update during which rank 1 alone is signalled, or finds its budget spent


class SignalledAt(RandomWindows):
    """Rank 1's batches: while drawing update ``AT``'s, the process sends itself SIGTERM."""

    def next_batch(self) -> dict[str, torch.Tensor]:
        if self.drawn + 1 == AT:
            os.kill(os.getpid(), signal.SIGTERM)
        return super().next_batch()


def run_rank(rank: int, world_size: int, port: int, out_dir: str, case: str, results) -> None:
    import torch.distributed as dist

    from gptkit.testing.processes import torchrun_environment
    from gptkit.train.distributed.processes import init_distributed

    torchrun_environment(rank, world_size, port)
    ctx = init_distributed("cpu")
    try:
        torch.manual_seed(0)
        model = GPT(GPTConfig(vocab_size=64, context_length=16, n_layer=1, n_head=2, d_model=32))
        config = TrainConfig(
            max_steps=8, batch_size=8, micro_batch_size=2, warmup_steps=1, eval_every=0, log_every=1,
            progress=False, precision="fp32", time_budget="1h" if case == "deadline" else None,
        )  # fmt: skip
        source = SignalledAt if case == "signal" and rank == 1 else RandomWindows
        data = source(64, 4, 16, seed=rank)
        trainer = Trainer(model, config, data, out_dir, save_model=lambda *a: None, ctx=ctx)
        saved: list[int] = []
        trainer.save_checkpoint = lambda: saved.append(trainer.step)
        if case == "deadline" and rank == 1:  # a day later, as far as rank 1 can tell, from update AT on
            trainer.clock = lambda: time.perf_counter() + (86_400.0 if data.drawn >= AT else 0.0)
        try:
            trainer.fit()
            exit_code = 0
        except Interrupted as e:
            exit_code = e.exit_code
        results[rank] = (trainer.step, exit_code, sorted(set(saved)))  # (the stand-in never "holds" one)
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
@pytest.mark.parametrize(("case", "exit_code"), [("signal", 128 + signal.SIGTERM), ("deadline", 0)])
def test_what_reaches_one_rank_stops_both_after_the_same_update(tmp_path, case, exit_code):
    import torch.multiprocessing as mp

    from gptkit.testing.processes import free_port

    with mp.Manager() as manager:
        results = manager.dict()
        mp.spawn(run_rank, args=(2, free_port(), str(tmp_path), case, results), nprocs=2, join=True)
        got = dict(results)
    assert got == {0: (AT, exit_code, [AT]), 1: (AT, exit_code, [AT])}
