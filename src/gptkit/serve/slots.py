"""The key/value cache of a continuously batched decode loop: one row (slot) per running sequence.

The model reads and writes a cache through three things (see :class:`gptkit.model.KVCache`): one
``length``, ``append(layer, k, v)`` and ``advance(n)``. Here every running row writes its next token at
that same column, ``length``, so each sequence's positions stay contiguous and end there:

    row r holds its len_r keys/values in columns [length - len_r, length)

Columns left of a row's span are another sequence's leftovers and are masked out
(:meth:`attention_mask`); each row has its own position ids (:meth:`position_ids`), so a sequence
reads exactly what it would read alone. Running rows are packed at the top (rows 0..rows-1): the model
sees only those, and a row that leaves is replaced by the last one. When ``length`` reaches the
context, every span is moved left (the longest running sequence then starts at column 0); a
sequence that joins with a longer prefix than ``length`` moves every span right. Neither happens
often, and each is one copy of the cache.
"""

from __future__ import annotations

import torch

from gptkit.config import GPTConfig
from gptkit.model import KVCache


class SlotCache:
    """Preallocated keys/values for ``max_batch`` sequences of up to the model's context each."""

    def __init__(self, config: GPTConfig, max_batch: int, device=None, dtype=None):
        shape = (config.n_layer, max_batch, config.n_head, config.context_length, config.head_size)
        self.keys = torch.zeros(shape, device=device, dtype=dtype)  # (L, slots, nh, capacity, hs)
        self.values = torch.zeros(shape, device=device, dtype=dtype)
        self.capacity = config.context_length
        self.max_batch = max_batch
        self.length = 0  # the column every running row writes next
        self.rows = 0  # running rows, packed at 0..rows-1
        self.lengths: list[int] = [0] * max_batch  # positions filled, per row

    # The model's cache interface ----------------------------------------------------------------

    def append(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store this step's k, v (rows, nh, T, hs) at the shared column; return every column so far."""
        start, end = self.length, self.length + k.size(2)
        self.keys[layer, : self.rows, :, start:end] = k
        self.values[layer, : self.rows, :, start:end] = v
        return self.keys[layer, : self.rows, :, :end], self.values[layer, : self.rows, :, :end]

    def advance(self, n_positions: int) -> None:
        self.length += n_positions
        for row in range(self.rows):
            self.lengths[row] += n_positions

    # What a decoding step feeds the model -------------------------------------------------------

    def attention_mask(self) -> torch.Tensor:
        """(rows, length + 1): each row's own columns and the one it is about to write."""
        device = self.keys.device
        columns = torch.arange(self.length + 1, device=device)
        starts = torch.tensor([self.length - n for n in self.lengths[: self.rows]], device=device)
        return columns[None, :] >= starts[:, None]

    def position_ids(self) -> torch.Tensor:
        """(rows, 1): the position of the token each row feeds next."""
        return torch.tensor(self.lengths[: self.rows], device=self.keys.device)[:, None]

    # Joining and leaving ------------------------------------------------------------------------

    def free_rows(self) -> int:
        return self.max_batch - self.rows

    def make_room(self, prefix_length: int) -> None:
        """Let a sequence of ``prefix_length`` cached positions join: its span must end at ``length``."""
        if prefix_length > self.length:
            self._shift(prefix_length - self.length)

    def reserve_column(self) -> None:
        """Make sure the next step's column exists, moving every span left when the end is reached."""
        if self.length + 1 > self.capacity:
            longest = max(self.lengths[: self.rows], default=0)
            if longest + 1 > self.capacity:
                raise ValueError(f"a sequence of {longest} positions has no room left in the context")
            self._shift(longest - self.length)

    def add(self, source: KVCache, source_row: int, n_positions: int) -> int:
        """Copy the last ``n_positions`` columns of ``source``'s row (a left-padded prefill) into a
        new row; returns the row. Call :meth:`make_room` first."""
        if self.rows == self.max_batch:
            raise RuntimeError("no free row in the cache")
        if n_positions > self.length:
            raise RuntimeError("make_room() first: the sequence would start before column 0")
        row = self.rows
        if n_positions:
            end = source.length
            target = slice(self.length - n_positions, self.length)
            self.keys[:, row, :, target] = source.keys[:, source_row, :, end - n_positions : end]
            self.values[:, row, :, target] = source.values[:, source_row, :, end - n_positions : end]
        self.lengths[row] = n_positions
        self.rows += 1
        return row

    def remove(self, row: int) -> int | None:
        """Free ``row``; the last running row moves into it. Returns the row that moved, if any."""
        last = self.rows - 1
        moved = None
        if row != last:
            span = slice(self.length - self.lengths[last], self.length)
            self.keys[:, row, :, span] = self.keys[:, last, :, span]
            self.values[:, row, :, span] = self.values[:, last, :, span]
            self.lengths[row] = self.lengths[last]
            moved = last
        self.lengths[last] = 0
        self.rows = last
        if self.rows == 0:
            self.length = 0
        return moved

    def _shift(self, offset: int) -> None:
        """Move every running span ``offset`` columns (right if > 0); ``length`` moves with them."""
        longest = max(self.lengths[: self.rows], default=0)
        old = slice(self.length - longest, self.length)
        new = slice(self.length - longest + offset, self.length + offset)
        if longest and self.rows:
            rows = slice(0, self.rows)
            self.keys[:, rows, :, new] = self.keys[:, rows, :, old].clone()
            self.values[:, rows, :, new] = self.values[:, rows, :, old].clone()
        self.length += offset
