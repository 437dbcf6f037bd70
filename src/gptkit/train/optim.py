"""The optimizers and learning-rate schedules: the paper's AdamW, and Muon as an option."""

from __future__ import annotations

import math

import torch
import torch.nn as nn

from gptkit.model import Block

OPTIMIZERS = ("adamw", "muon")


def build_optimizer(
    model: nn.Module,
    lr: float,
    weight_decay: float,
    betas: tuple[float, float] = (0.9, 0.999),
    eps: float = 1e-8,
    params: list[nn.Parameter] | None = None,
) -> torch.optim.AdamW:
    """AdamW; weight decay only on weights of rank >= 2.

    GPT-1 §4.1: "a modified version of L2 regularization with w = 0.01 on all non bias or gain
    weights". Matrices and embedding tables are decayed; biases and LayerNorm gains are not.
    ``params``: only these of the model's parameters (default: all that require gradients).
    """
    decay, no_decay = [], []
    for param in model.parameters() if params is None else params:
        if param.requires_grad:
            (decay if param.dim() >= 2 else no_decay).append(param)
    groups = [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    # The fused kernel exists for CPU and CUDA tensors; DTensors (FSDP) take the foreach path.
    fused = all(type(p) is torch.nn.Parameter or type(p) is torch.Tensor for p in decay + no_decay)
    return torch.optim.AdamW(groups, lr=lr, betas=betas, eps=eps, fused=fused or None)


def block_matrices(model: nn.Module) -> list[nn.Parameter]:
    """The weight matrices of the transformer blocks' linear layers (attention and MLP): what Muon
    orthogonalises. Embeddings, the tied output layer, a task head, biases and gains are not."""
    return [
        module.weight
        for block in model.modules()
        if isinstance(block, Block)
        for module in block.modules()
        if isinstance(module, nn.Linear) and module.weight.requires_grad
    ]


# The quintic Newton–Schulz iteration's coefficients (Jordan et al., 2024; torch.optim.Muon's too).
NEWTON_SCHULZ = (3.4445, -4.7750, 2.0315)


def orthogonalize(matrix: torch.Tensor, steps: int = 5, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Approximately U·Vᵀ of ``matrix`` = U·S·Vᵀ (singular values pushed towards 1, roughly within
    0.5–1.5, which is all Muon needs), by ``steps`` Newton–Schulz iterations computed in ``dtype``."""
    a, b, c = NEWTON_SCHULZ
    x = matrix.to(dtype)
    wide = x.size(0) <= x.size(1)
    if not wide:  # iterate on the short side's Gram matrix
        x = x.t()
    x = x / x.norm().clamp(min=1e-7)  # spectral norm <= Frobenius norm = 1: inside the basin
    for _ in range(steps):
        gram = x @ x.t()
        x = a * x + (b * gram + c * gram @ gram) @ x
    return x if wide else x.t()


class Muon(torch.optim.Optimizer):
    """Momentum, orthogonalised (Newton–Schulz), for 2-D weight matrices: the update of the fastest
    public GPT-2 training runs, with the same rule as ``torch.optim.Muon``: an exponential moving
    average of gradients with Nesterov's look-ahead, decoupled weight decay, and the step scaled to
    AdamW's update size (0.2·sqrt(max(rows, columns)), Moonshot's ``match_rms_adamw``), so that one
    learning rate and schedule serve both optimizers.

    Unlike torch's, which always iterates in bf16, the iteration runs in ``ns_dtype``: the training
    loop passes its resolved precision, bf16 only where autocast runs in bf16 (on an AVX2-only CPU a
    bf16 product is 30-65x slower, which would make each update take seconds).
    """

    def __init__(
        self,
        params,
        lr: float,
        weight_decay: float = 0.0,
        momentum: float = 0.95,
        nesterov: bool = True,
        ns_steps: int = 5,
        ns_dtype: torch.dtype = torch.float32,
    ):
        super().__init__(params, dict(lr=lr, weight_decay=weight_decay, momentum=momentum, nesterov=nesterov))
        self.ns_steps, self.ns_dtype = ns_steps, ns_dtype
        for group in self.param_groups:
            for param in group["params"]:
                if param.dim() != 2:
                    raise ValueError(
                        f"Muon updates 2-D matrices only, got a parameter of shape {tuple(param.shape)}"
                    )

    @torch.no_grad()
    def step(self, closure=None):
        loss = closure() if closure is not None else None
        for group in self.param_groups:
            lr, momentum = group["lr"], group["momentum"]
            for param in group["params"]:
                if param.grad is None:
                    continue
                state = self.state[param]
                if "momentum_buffer" not in state:
                    state["momentum_buffer"] = torch.zeros_like(param.grad)
                average = state["momentum_buffer"].lerp_(param.grad, 1 - momentum)
                update = param.grad.lerp(average, momentum) if group["nesterov"] else average
                direction = orthogonalize(update, self.ns_steps, self.ns_dtype)
                param.mul_(1 - lr * group["weight_decay"])
                param.add_(direction.to(param.dtype), alpha=-lr * 0.2 * math.sqrt(max(param.shape)))
        return loss


def build_optimizers(
    model: nn.Module,
    kind: str,
    lr: float,
    weight_decay: float,
    betas: tuple[float, float] = (0.9, 0.999),
    eps: float = 1e-8,
    ns_dtype: torch.dtype = torch.float32,
    adamw_lr_scale: float = 1.0,
) -> list[torch.optim.Optimizer]:
    """The optimizers of a run: ``adamw`` (the paper's: one AdamW for every parameter), or ``muon``
    (:class:`Muon` for the blocks' weight matrices, AdamW for the rest: embeddings, biases, gains,
    a task head). Both follow the same schedule; with Muon, AdamW's rate is ``adamw_lr_scale`` times
    the schedule's (each group's ``lr_scale``, which the training loop applies). ``ns_dtype``: see
    :class:`Muon`."""
    if kind == "adamw":
        return [build_optimizer(model, lr, weight_decay, betas, eps)]
    if kind != "muon":
        raise ValueError(f"optimizer must be one of {', '.join(OPTIMIZERS)}, got {kind!r}")
    matrices = block_matrices(model)
    chosen = {id(p) for p in matrices}
    rest = [p for p in model.parameters() if p.requires_grad and id(p) not in chosen]
    muon = Muon(matrices, lr=lr, weight_decay=weight_decay, ns_dtype=ns_dtype)
    adamw = build_optimizer(model, lr * adamw_lr_scale, weight_decay, betas, eps, params=rest)
    for group in adamw.param_groups:
        group["lr_scale"] = adamw_lr_scale
    return [muon, adamw]


def learning_rate(
    step: int,
    max_lr: float,
    warmup_steps: int,
    total_steps: int,
    schedule: str,
    decay_fraction: float = 0.2,
) -> float:
    """The rate for update number ``step`` (0-based): linear warm-up, then the schedule's decay to 0.

    Pre-training (GPT-1 §4.1): "increased linearly from zero over the first 2000 updates and annealed
    to 0 using a cosine schedule". Fine-tuning: linear warm-up over 0.2% of training, linear decay.
    ``wsd`` (warm-up, stable, decay) holds the maximum rate and decays linearly to 0 over the last
    ``decay_fraction`` of training: a short run keeps its high rate for longer.
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
    if schedule == "wsd":
        decay_from = max(total_steps - warmup_steps - max(round(decay_fraction * decay_steps), 1), 0)
        done = step - warmup_steps
        if done < decay_from:
            return max_lr
        return max_lr * max(1.0 - (done - decay_from) / max(decay_steps - decay_from, 1), 0.0)
    raise ValueError(f"schedule must be cosine, linear, wsd or constant, got {schedule!r}")
