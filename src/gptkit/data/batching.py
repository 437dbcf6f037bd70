"""Batches of similar lengths, and right-padding them: the one place, for training, scoring and serving.

Padding goes to the right of each sequence: with causal attention no real token attends to what
follows it, so the padding changes no logit beyond float rounding (positions count from 0 in every
row, so neither a mask nor position ids are needed). Widths are rounded up to a multiple of
``PAD_TO_MULTIPLE`` tokens: a handful of shapes instead of one per length, since a CPU's matrix
library prepares its kernels per shape (measured at seconds for each new shape).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

PAD_TO_MULTIPLE = 16
# A batch may compute at most this many times the tokens of its own sequences, once padded to its
# longest: SST-2's sentences run from 3 to 60 tokens, and one batch of them all computes twice the
# tokens it needs.
PADDING_SLACK = 1.25


def padded_length(longest: int, max_length: int | None = None, multiple: int = PAD_TO_MULTIPLE) -> int:
    """``longest`` rounded up to a multiple of ``multiple``, but never past ``max_length`` (the
    model's context; None: no limit) unless ``longest`` itself is."""
    rounded = -(-longest // multiple) * multiple
    return max(longest, rounded if max_length is None else min(rounded, max_length))


def pad_right(
    sequences: Sequence[Sequence[int]],
    max_length: int | None = None,
    multiple: int = PAD_TO_MULTIPLE,
    pad_id: int = 0,
) -> torch.Tensor:
    """The sequences as one (N, T) tensor of token ids, each followed by ``pad_id`` up to
    T = :func:`padded_length` of the longest."""
    width = padded_length(max(map(len, sequences), default=0), max_length, multiple)
    ids = torch.full((len(sequences), width), pad_id, dtype=torch.long)
    for row, sequence in enumerate(sequences):
        ids[row, : len(sequence)] = torch.as_tensor(sequence, dtype=torch.long)
    return ids


def length_batches(
    lengths: Sequence[int], batch_size: int, *, longest_first: bool = False, slack: float | None = None
) -> list[list[int]]:
    """Indices of ``lengths`` in batches of similar lengths: sorted (shortest first, or longest
    first, ties in their given order), at most ``batch_size`` a batch, and with ``slack``, a new batch
    wherever one more would make the batch compute more than ``slack`` times its own tokens once
    padded to its longest.

    Longest first (for scoring): a batch too large for the memory fails at once, not at the end.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size}")
    if longest_first:
        order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    else:
        order = sorted(range(len(lengths)), key=lengths.__getitem__)
    batches: list[list[int]] = []
    real = 0  # tokens of the last batch's own sequences
    for i in order:
        batch = batches[-1] if batches else None
        if (
            batch is None
            or len(batch) == batch_size
            or (
                slack is not None
                and (len(batch) + 1) * max(lengths[batch[0]], lengths[i]) > slack * (real + lengths[i])
            )
        ):
            batches.append([i])
            real = lengths[i]
        else:
            batch.append(i)
            real += lengths[i]
    return batches
