"""Processes of a test's own process group (torch.multiprocessing, gloo on the CPU), set up as
torchrun would set them up: its environment variables, then gptkit's init_distributed."""

from __future__ import annotations

import os


def torchrun_environment(rank: int, world_size: int, port: int) -> None:
    """The variables torchrun gives process ``rank`` of ``world_size`` meeting on 127.0.0.1:``port``."""
    os.environ.update(
        WORLD_SIZE=str(world_size),
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )
