"""fp16's loss scaler against the rules a GPU holds it to: the gradients are unscaled with finished
values even where a copy to the host would land late, and one overflow decision covers every
optimizer of the run (Muon's and AdamW's alike)."""

from __future__ import annotations

import math

import pytest
import torch
from torch.overrides import TorchFunctionMode

from gptkit import GPT, GPTConfig
from gptkit.train.optim import build_optimizers
from gptkit.train.precision import LossScaler


class LateCopies(TorchFunctionMode):
    """Every copy made with ``non_blocking=True`` lands late: read at once, its memory still holds
    what it held before (zeros here). On a GPU that is what a host kernel reading an asynchronous
    copy from the device may see; on a CPU the copy is synchronous, so it is emulated."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        result = func(*args, **kwargs)
        if getattr(func, "__name__", "") in ("to", "copy_", "cpu") and kwargs.get("non_blocking"):
            if isinstance(result, torch.Tensor) and result is not args[0]:
                with torch.no_grad():
                    result.zero_()
        return result


def parameter_with_scaled_gradient(
    scale: float, overflow: bool
) -> tuple[torch.nn.Parameter, torch.optim.SGD]:
    param = torch.nn.Parameter(torch.ones(4))
    param.grad = torch.full((4,), 0.5 * scale)  # the true gradient, 0.5, times the scale
    if overflow:
        param.grad[0] = math.inf
    return param, torch.optim.SGD([param], lr=1.0)


@pytest.mark.parametrize("overflow", [False, True])
def test_unscaling_waits_for_no_copy_that_lands_late(overflow):
    scaler = LossScaler(torch.float16, torch.device("cpu"))
    scale = scaler.scale(torch.ones(())).item()  # the first scale, as backward saw it
    param, optimizer = parameter_with_scaled_gradient(scale, overflow)
    with LateCopies():
        scaler.unscale([optimizer])
        applied = scaler.step([optimizer])
    assert applied is not overflow
    if overflow:  # skipped, the weights as they were, the scale halved
        assert torch.equal(param.detach(), torch.ones(4))
        assert scaler.metrics() == {"loss_scale": scale / 2, "skipped_updates": 1}
    else:  # the true gradient, 0.5, stepped with lr 1
        assert torch.equal(param.detach(), torch.full((4,), 0.5))
        assert scaler.metrics() == {"loss_scale": scale, "skipped_updates": 0}


@pytest.mark.parametrize("overflowing", ["a block's matrix (Muon's)", "the embedding (AdamW's)"])
def test_an_overflow_in_one_optimizers_gradients_skips_every_optimizer(overflowing):
    """Muon steps the blocks' matrices and AdamW the rest: an inf in either's gradients skips the
    whole update, which is counted once."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=64, context_length=16, n_layer=1, n_head=2, d_model=32))
    optimizers = build_optimizers(model, "muon", lr=0.1, weight_decay=0.0)
    assert len(optimizers) == 2
    scaler = LossScaler(torch.float16, torch.device("cpu"))
    scale = scaler.scale(torch.ones(())).item()  # the first scale, as backward saw it
    for param in model.parameters():
        param.grad = torch.full_like(param, 0.5 * scale)
    target = model.h[0].mlp.c_fc.weight if "Muon" in overflowing else model.wte.weight
    target.grad[0, 0] = math.inf
    owner = next(o for o in optimizers for g in o.param_groups for p in g["params"] if p is target)
    assert type(owner).__name__ == ("Muon" if "Muon" in overflowing else "AdamW")
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    scaler.unscale(optimizers)
    assert scaler.step(optimizers) is False
    moved = [name for name, p in model.named_parameters() if not torch.equal(p.detach(), before[name])]
    assert moved == []
    assert scaler.metrics() == {"loss_scale": scale / 2, "skipped_updates": 1}


def test_a_scale_saved_by_torchs_gradscaler_resumes_here():
    """Checkpoints keep GradScaler's keys: one it wrote (with the skipped count beside) resumes."""
    theirs = torch.amp.GradScaler("cpu", init_scale=2.0**10, growth_interval=7)
    theirs.scale(torch.ones(()))  # its scale exists from the first scale() on
    saved = {**theirs.state_dict(), "skipped": 3}
    scaler = LossScaler(torch.float16, torch.device("cpu"))
    scaler.load_state_dict(saved, "step-0000004")
    assert scaler.metrics() == {"loss_scale": 2.0**10, "skipped_updates": 3}
    assert scaler.state_dict() == saved


def test_a_step_before_unscaling_unscales_first():
    scaler = LossScaler(torch.float16, torch.device("cpu"))
    scale = scaler.scale(torch.ones(())).item()
    param, optimizer = parameter_with_scaled_gradient(scale, overflow=False)
    assert scaler.step([optimizer]) is True
    assert torch.equal(param.detach(), torch.full((4,), 0.5))


def test_fp16_weights_are_refused_with_a_reason():
    scaler = LossScaler(torch.float16, torch.device("cpu"))
    scaler.scale(torch.ones(()))
    param = torch.nn.Parameter(torch.ones(4, dtype=torch.float16))
    param.grad = torch.ones(4, dtype=torch.float16)
    with pytest.raises(ValueError, match="needs fp32 weights"):
        scaler.unscale([torch.optim.SGD([param], lr=1.0)])
