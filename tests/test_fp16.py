"""fp16 training: the fused loss's gradients under fp16 autocast, dynamic loss scaling in the loop
(an overflow skips exactly its update and halves the scale), and its exact resume."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from gptkit.model import fused_next_token_loss


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got - want).norm() / want.norm())


def scaled_gradients(loss_of, leaves, loss_scale: float) -> list[torch.Tensor]:
    """d loss / d leaves under fp16 autocast, the loss times ``loss_scale`` before backward (as a
    GradScaler has it) and the gradients divided by it after."""
    for leaf in leaves:
        leaf.grad = None
    with torch.autocast("cpu", dtype=torch.float16):
        loss = loss_of()
    (loss * loss_scale).backward()
    return [leaf.grad / loss_scale for leaf in leaves]


# 2¹⁶ is torch.amp.GradScaler's first scale (inf in fp16); 2⁸, one it may have halved down to.
@pytest.mark.parametrize("loss_scale", [2.0**16, 2.0**8])
def test_fused_loss_gradients_under_fp16_autocast_match_cross_entropys(loss_scale):
    """The fused output layer + loss against torch's unfused F.linear + F.cross_entropy, both under
    fp16 autocast with the loss scaled; and at the scale a run starts with, against fp32 at the
    points autocast rounds to fp16. A GPT-2-sized vocabulary: at initialisation each softmax
    probability is about 1/50257, and a token that is no target gets only those (over the
    positions counted) as its gradient."""
    torch.manual_seed(0)
    vocab, positions, d = 50257, 512, 64
    hidden = torch.randn(positions + 1, d, requires_grad=True)
    weight = (torch.randn(vocab, d) * 0.02).requires_grad_()
    labels = torch.randint(0, vocab, (positions + 1,))
    no_target = torch.ones(vocab, dtype=torch.bool)
    no_target[labels[1:]] = False
    fused = scaled_gradients(
        lambda: fused_next_token_loss(hidden[None], weight, labels[None]), (hidden, weight), loss_scale
    )
    assert all(torch.isfinite(g).all() for g in fused)
    unfused = scaled_gradients(
        lambda: F.cross_entropy(F.linear(hidden[:-1], weight), labels[1:]), (hidden, weight), loss_scale
    )
    # Both round the same values to fp16 (a relative step of 5e-4), summed in other orders.
    assert relative_error(fused[0], unfused[0]) < 2e-4
    assert relative_error(fused[1], unfused[1]) < 2e-4
    # The reference: fp32 at the points autocast rounds to fp16 (the product's inputs and output).
    rounded_hidden = hidden.detach().half().float().requires_grad_()
    rounded_weight = weight.detach().half().float().requires_grad_()
    logits = rounded_hidden[:-1] @ rounded_weight.t()
    logits = logits + (logits.half().float() - logits).detach()  # rounded, its gradient not
    F.cross_entropy(logits, labels[1:]).backward()
    # The gradients of tokens that are no target: at the first scale both are within 1e-3 of it;
    # at a small one, the probabilities times the scale fall among fp16's subnormals in torch's
    # own path too, and the fused one is to be no worse.
    errors = [relative_error(g[1][no_target], rounded_weight.grad[no_target]) for g in (fused, unfused)]
    assert errors[0] < max(1e-3, 1.25 * errors[1])
    if loss_scale == 2.0**16:
        assert relative_error(fused[0], rounded_hidden.grad) < 1e-3
        assert relative_error(fused[1], rounded_weight.grad) < 1e-3
        assert errors[1] < 1e-3
