"""Activation checkpointing, applied to a model's blocks from outside the model.

The backward pass needs what each block's forward computed. ``full`` keeps only each block's input
and runs the block's forward again during the backward pass; ``selective`` keeps the outputs of
the matrix products and of attention (the expensive operations) and recomputes the rest: LayerNorm,
GELU, dropout and the residual adds, which cost a few percent of a block's FLOPs but hold most of
its saved bytes (GELU's input and output alone are two tensors four times the model's width).
An operation that draws random numbers is never kept while it draws: fused attention with dropout
(CUDA's flash and memory-efficient kernels draw their masks from the generator) is recomputed, so
that every mask of the block is drawn again at the offsets of the forward pass.

The block's forward is replaced on the instance, so the model's class, its parameter names and its
state dict are unchanged (checkpoints load anywhere); FSDP2 and DDP wrap the block as before.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
import torch.nn as nn
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

# What `selective` keeps: the linear layers' products (addmm or mm after autograd's decomposition)
# and every fused attention kernel's output (CPU, flash, memory-efficient, cuDNN) when it draws no
# dropout mask (see _keep_products). Attention that
# falls back to the unfused path (dropout on a CPU) is recomputed whole: its products (bmm) are the
# (T × T) scores of every head, the largest tensors of a block.
_aten = torch.ops.aten
_KEPT_OPS = {
    _aten.mm.default,
    _aten.addmm.default,
    _aten._scaled_dot_product_flash_attention_for_cpu.default,
    _aten._scaled_dot_product_flash_attention.default,
    _aten._scaled_dot_product_efficient_attention.default,
    _aten._scaled_dot_product_cudnn_attention.default,
}


def _draws_random_numbers(op, args: tuple, kwargs: dict) -> bool:
    """Whether this call of ``op`` draws from the generator: an op torch tags as seeded, unless its
    ``dropout_p`` is 0 (fused attention draws only for its dropout mask)."""
    if torch.Tag.nondeterministic_seeded not in op.tags:
        return False
    names = [argument.name for argument in op._schema.arguments]
    if "dropout_p" not in names:
        return True
    index = names.index("dropout_p")
    dropout_p = args[index] if index < len(args) else kwargs.get("dropout_p", 0.0)
    return dropout_p > 0.0


def _keep_products(ctx, op, *args, **kwargs) -> CheckpointPolicy:
    # The recomputation starts from the forward pass's generator state (preserve_rng_state) and
    # replays every op it does not find kept: a kept op that drew random numbers would draw nothing
    # there, and every dropout after it in the block would take another mask than in the forward
    # pass, silently. So a kept op is kept only when it draws nothing.
    if op in _KEPT_OPS and not _draws_random_numbers(op, args, kwargs):
        return CheckpointPolicy.MUST_SAVE
    return CheckpointPolicy.PREFER_RECOMPUTE


def _selective_contexts():
    return create_selective_checkpoint_contexts(_keep_products)


def _checkpointed(forward: Callable, selective: bool) -> Callable:
    @functools.wraps(forward)
    def run(*args, **kwargs):
        # Nothing to keep for a backward pass (evaluation, generation): the plain forward.
        if not torch.is_grad_enabled():
            return forward(*args, **kwargs)
        context_fn = _selective_contexts if selective else None
        extra = {"context_fn": context_fn} if context_fn is not None else {}
        # The RNG state is saved and restored around the recomputation, so dropout draws the same
        # masks twice: the gradients are the unchecked run's.
        return checkpoint(forward, *args, use_reentrant=False, preserve_rng_state=True, **extra, **kwargs)

    return run


def transformer_blocks(model: nn.Module) -> list[nn.Module]:
    """The GPT's blocks, in a GPT or in a model holding one as ``gpt`` (a task model)."""
    gpt = model if hasattr(model, "h") else getattr(model, "gpt", None)
    return list(getattr(gpt, "h", []))


def apply_activation_checkpointing(model: nn.Module, mode: str) -> nn.Module:
    """Checkpoint every transformer block of ``model`` (``mode``: none, full or selective), in place;
    returns the model. Apply before FSDP2's ``fully_shard``, as torch's own examples order them."""
    if mode not in ("none", "full", "selective"):
        raise ValueError(f"activation_checkpointing must be none, full or selective, got {mode!r}")
    if mode == "none":
        return model
    blocks = transformer_blocks(model)
    if not blocks:
        raise ValueError(f"activation checkpointing: {type(model).__name__} has no transformer blocks (.h)")
    for block in blocks:
        if getattr(block, "activation_checkpointing", "none") != "none":
            raise ValueError("activation checkpointing is already applied to this model")
        block.forward = _checkpointed(block.forward, selective=mode == "selective")
        block.activation_checkpointing = mode
    return model
