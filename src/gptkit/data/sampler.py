"""One sampler for both stages: epochs of a seeded permutation, without replacement, split by rank.

Pre-training draws windows of a token shard, fine-tuning draws labelled examples; both ask the same
of their order. Every optimizer step takes the next ``batch_size`` items of the epoch's permutation
(the remainder of an epoch is dropped) and rank r of W takes its contiguous share, so the global
batch is the same for any number of processes. The state is two integers, so a resumed run draws
exactly the batches an uninterrupted one would have.
"""

from __future__ import annotations

import torch


class EpochSampler:
    """Indices 0..n_items-1, each used once per epoch, in a seeded order per epoch.

    Args:
        n_items: how many items there are (windows, examples).
        batch_size: items per optimizer step, over all processes.
        seed: the order's seed; epoch e uses ``seed * 100_003 + e``.
        rank, world_size: this process's share of each batch.
        items: what the items are called, for the error when there are too few.
    """

    def __init__(
        self,
        n_items: int,
        batch_size: int,
        seed: int,
        rank: int = 0,
        world_size: int = 1,
        items: str = "items",
    ):
        if n_items < batch_size:
            raise ValueError(f"{n_items} {items} are fewer than one batch of {batch_size}")
        if batch_size % world_size:
            raise ValueError(f"batch size {batch_size} is not divisible by the {world_size} processes")
        self.n_items, self.batch_size, self.seed = n_items, batch_size, seed
        self.rank, self.world_size = rank, world_size
        self.epoch, self.position = 0, 0
        self._order = self._permutation(0)

    @property
    def steps_per_epoch(self) -> int:
        return self.n_items // self.batch_size

    def _permutation(self, epoch: int) -> list[int]:
        generator = torch.Generator().manual_seed(self.seed * 100_003 + epoch)
        return torch.randperm(self.n_items, generator=generator).tolist()

    def next_indices(self) -> list[int]:
        """This rank's share of the next global batch: ``batch_size / world_size`` indices."""
        if self.position + self.batch_size > self.n_items:  # drop the remainder, start a new epoch
            self.epoch, self.position = self.epoch + 1, 0
            self._order = self._permutation(self.epoch)
        share = self.batch_size // self.world_size
        start = self.position + self.rank * share
        self.position += self.batch_size
        return self._order[start : start + share]

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self.position = int(state["epoch"]), int(state["position"])
        self._order = self._permutation(self.epoch)
