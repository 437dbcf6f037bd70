"""Position tables that are computed, not learned.

Its own module because two others need it: the network adds the table to its embeddings, and the
weights writer stores it as a learned table for readers (transformers) that know no other kind.
"""

from __future__ import annotations

import math

import torch


def sinusoidal_positions(n_positions: int, d_model: int) -> torch.Tensor:
    """Vaswani et al. (2017): PE(p, 2i) = sin(p / 10000^(2i/d)), PE(p, 2i+1) = cos(p / 10000^(2i/d))."""
    position = torch.arange(n_positions, dtype=torch.float64).unsqueeze(1)
    inv_freq = torch.exp(torch.arange(0, d_model, 2, dtype=torch.float64) * (-math.log(10000.0) / d_model))
    table = torch.zeros(n_positions, d_model, dtype=torch.float64)
    table[:, 0::2] = torch.sin(position * inv_freq)
    table[:, 1::2] = torch.cos(position * inv_freq)[:, : d_model // 2]
    return table.float()
