"""The optimizer and learning-rate schedules of the paper."""

from __future__ import annotations

import math

import torch
import torch.nn as nn


def build_optimizer(
    model: nn.Module,
    lr: float,
    weight_decay: float,
    betas: tuple[float, float] = (0.9, 0.999),
    eps: float = 1e-8,
) -> torch.optim.AdamW:
    """AdamW; weight decay only on weights of rank >= 2.

    GPT-1 §4.1: "a modified version of L2 regularization with w = 0.01 on all non bias or gain
    weights". Matrices and embedding tables are decayed; biases and LayerNorm gains are not.
    """
    decay, no_decay = [], []
    for param in model.parameters():
        if param.requires_grad:
            (decay if param.dim() >= 2 else no_decay).append(param)
    groups = [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    # The fused kernel exists for CPU and CUDA tensors; DTensors (FSDP) take the foreach path.
    fused = all(type(p) is torch.nn.Parameter or type(p) is torch.Tensor for p in decay + no_decay)
    return torch.optim.AdamW(groups, lr=lr, betas=betas, eps=eps, fused=fused or None)


def learning_rate(step: int, max_lr: float, warmup_steps: int, total_steps: int, schedule: str) -> float:
    """The rate for update number ``step`` (0-based): linear warm-up, then cosine or linear decay to 0.

    Pre-training (GPT-1 §4.1): "increased linearly from zero over the first 2000 updates and annealed
    to 0 using a cosine schedule". Fine-tuning: linear warm-up over 0.2% of training, linear decay.
    """
    if step < warmup_steps:
        return max_lr * (step + 1) / warmup_steps
    decay_steps = max(total_steps - warmup_steps, 1)
    progress = min((step - warmup_steps) / decay_steps, 1.0)
    if schedule == "cosine":
        return max_lr * 0.5 * (1.0 + math.cos(math.pi * progress))
    if schedule == "linear":
        return max_lr * (1.0 - progress)
    if schedule == "constant":
        return max_lr
    raise ValueError(f"schedule must be cosine, linear or constant, got {schedule!r}")
