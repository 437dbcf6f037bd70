"""Windows of ``context_length`` tokens of a token shard: drawn for training, listed for evaluation.

An epoch is a seeded permutation of the shard's non-overlapping windows; every optimizer step takes
the next ``batch_size`` of them, and rank r of W takes its contiguous share, so the global batch is
the same for any number of processes (the order is :class:`gptkit.data.sampler.EpochSampler`'s,
which fine-tuning's examples follow too).
"""

from __future__ import annotations

import torch

from gptkit.data.sampler import EpochSampler
from gptkit.data.shards import TokenShard


class WindowSampler(EpochSampler):
    """Pre-training's batch source: non-overlapping windows of ``context_length`` tokens, each used
    once per epoch in seeded order. Its position is the epoch sampler's ``state_dict``, which a
    checkpoint saves so that a resumed run draws exactly the batches an uninterrupted one would."""

    def __init__(
        self,
        shard: TokenShard,
        context_length: int,
        batch_size: int,
        seed: int,
        rank: int = 0,
        world_size: int = 1,
    ):
        self.shard, self.context_length = shard, context_length
        windows = f"windows of {context_length} tokens in the training split"
        try:
            super().__init__(
                shard.n_windows(context_length), batch_size, seed, rank, world_size, items=windows
            )
        except ValueError as e:
            raise ValueError(f"{e}: use a larger corpus, a shorter context or a smaller batch") from e

    def next_windows(self) -> torch.Tensor:
        """This rank's share of the next global batch: (batch_size / world_size, context_length) ids."""
        return torch.stack([self.shard.window(i, self.context_length) for i in self.next_indices()])

    def next_batch(self) -> dict[str, torch.Tensor | bool]:
        """The next windows as the language model's inputs and labels (the model shifts them)."""
        ids = self.next_windows()
        # The loop needs only the loss: no logits returned, so the loss is computed in chunks.
        return {"input_ids": ids, "labels": ids, "compute_logits": False}


def eval_windows(shard: TokenShard, context_length: int, max_windows: int | None = None) -> torch.Tensor:
    """The validation windows, in order (evaluation must see the same tokens every time)."""
    n = shard.n_windows(context_length)
    if max_windows is not None:
        n = min(n, max_windows)
    if n == 0:
        return torch.zeros(0, context_length, dtype=torch.long)
    return torch.stack([shard.window(i, context_length) for i in range(n)])
