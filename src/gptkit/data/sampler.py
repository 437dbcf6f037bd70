"""One sampler for both stages: epochs of a seeded permutation, without replacement, split by rank.

Pre-training draws windows of a token shard, fine-tuning draws labelled examples; both ask the same
of their order. Every optimizer step takes the next ``batch_size`` items of the epoch's permutation
(the remainder of an epoch is dropped) and rank r of W takes its contiguous share, so the global
batch is the same for any number of processes. The state is two integers, so a resumed run draws
exactly the batches an uninterrupted one would have.

Given the items' lengths, an epoch groups items of similar length into the same batch (as
``transformers``' ``group_by_length``): the permutation is cut into windows of
``GROUP_WINDOW`` batches, each window is sorted by length and cut into batches, and the batches are
shuffled. Every item is still used once per epoch in a seeded order, but a batch padded to its
longest item carries far less padding (SST-2: 2.07x the real tokens in random batches, 1.03x grouped).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

GROUP_WINDOW = (
    64  # batches per sorting window: long enough to find equal lengths, short enough to stay random
)


class EpochSampler:
    """Indices 0..n_items-1, each used once per epoch, in a seeded order per epoch.

    Args:
        n_items: how many items there are (windows, examples).
        batch_size: items per optimizer step, over all processes.
        seed: the order's seed; epoch e uses ``seed * 100_003 + e``.
        rank, world_size: this process's share of each batch.
        items: what the items are called, for the error when there are too few.
        lengths: each item's length, to batch items of similar length together (None: random batches).
    """

    def __init__(
        self,
        n_items: int,
        batch_size: int,
        seed: int,
        rank: int = 0,
        world_size: int = 1,
        items: str = "items",
        lengths: Sequence[int] | None = None,
    ):
        if lengths is not None and len(lengths) != n_items:
            raise ValueError(f"{len(lengths)} lengths for {n_items} {items}")
        if n_items < batch_size:
            raise ValueError(f"{n_items} {items} are fewer than one batch of {batch_size}")
        if batch_size % world_size:
            raise ValueError(f"batch size {batch_size} is not divisible by the {world_size} processes")
        self.n_items, self.batch_size, self.seed = n_items, batch_size, seed
        self.rank, self.world_size = rank, world_size
        self.lengths = None if lengths is None else torch.as_tensor(lengths)
        self.epoch, self.position = 0, 0
        self._order = self._permutation(0)

    @property
    def steps_per_epoch(self) -> int:
        return self.n_items // self.batch_size

    def _permutation(self, epoch: int) -> list[int]:
        generator = torch.Generator().manual_seed(self.seed * 100_003 + epoch)
        order = torch.randperm(self.n_items, generator=generator)
        if self.lengths is None:
            return order.tolist()
        window = self.batch_size * GROUP_WINDOW
        grouped = torch.cat(
            [chunk[torch.argsort(self.lengths[chunk], stable=True)] for chunk in order.split(window)]
        )
        # Shuffle whole batches; the remainder that next_indices drops stays at the end.
        full = self.steps_per_epoch * self.batch_size
        batches = grouped[:full].view(-1, self.batch_size)
        batches = batches[torch.randperm(len(batches), generator=generator)]
        return torch.cat([batches.flatten(), grouped[full:]]).tolist()

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
