"""Activation checkpointing: the same gradients as the unchecked run, and what each mode recomputes."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn
from torch.utils._python_dispatch import TorchDispatchMode

from gptkit import GPT, GPTConfig
from gptkit.train.activation_checkpointing import apply_activation_checkpointing
from gptkit.train.config import TrainConfig

N_LAYER = 3


def tiny_gpt(ln_position: str) -> GPT:
    torch.manual_seed(0)
    config = GPTConfig(
        vocab_size=97, context_length=16, n_layer=N_LAYER, n_head=2, d_model=32, dropout=0.1,
        ln_position=ln_position, scale_residual_init=ln_position == "pre",
    )  # fmt: skip
    return GPT(config).train()


def gradients(model: nn.Module, seed: int = 7) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Loss and gradients of one forward and backward, dropout drawn from ``seed``."""
    ids = torch.randint(0, 97, (4, 16), generator=torch.Generator().manual_seed(1))
    torch.manual_seed(seed)
    loss = model(ids, labels=ids, compute_logits=False).loss
    loss.backward()
    return loss.detach(), {name: p.grad.clone() for name, p in model.named_parameters()}


@pytest.mark.parametrize("ln_position", ["pre", "post"])
@pytest.mark.parametrize("mode", ["full", "selective"])
def test_gradients_equal_the_unchecked_runs(ln_position, mode):
    """Dropout on: the recomputation draws the same masks, so the gradients are the same ones."""
    plain = tiny_gpt(ln_position)
    checked = apply_activation_checkpointing(copy.deepcopy(plain), mode)
    loss, expected = gradients(plain)
    checked_loss, got = gradients(checked)
    assert checked_loss == loss
    assert got.keys() == expected.keys()
    for name in expected:
        torch.testing.assert_close(got[name], expected[name], rtol=1e-6, atol=1e-7, msg=name)
    # Another dropout draw gives other gradients: the equality above is not the absence of dropout.
    _, other = gradients(tiny_gpt(ln_position), seed=8)
    assert not torch.equal(other["h.0.mlp.c_fc.weight"], expected["h.0.mlp.c_fc.weight"])


class CountOps(TorchDispatchMode):
    def __init__(self, *ops):
        super().__init__()
        self.counts = dict.fromkeys(ops, 0)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in self.counts:
            self.counts[func] += 1
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize(
    ("mode", "gelu_runs", "product_runs"),
    [
        ("none", 1, 1),  # nothing recomputed
        ("full", 2, 2),  # each block's forward runs again in the backward pass
        ("selective", 2, 1),  # GELU again, the products kept
    ],
)
def test_what_each_mode_recomputes(mode, gelu_runs, product_runs):
    """Counted: a block's GELU and its four linear layers' products (addmm: the backward pass's own
    products are mm), per block, in one forward and backward."""
    model = apply_activation_checkpointing(tiny_gpt("pre"), mode)
    aten = torch.ops.aten
    with CountOps(aten.gelu.default, aten.addmm.default) as counter:
        gradients(model)
    assert counter.counts[aten.gelu.default] == gelu_runs * N_LAYER
    assert counter.counts[aten.addmm.default] == product_runs * 4 * N_LAYER


def test_names_state_and_evaluation_are_unchanged():
    """Checkpoints written with checkpointing load without it; evaluation (no gradients) and
    decoding with a KV cache run the plain forward."""
    plain = tiny_gpt("pre")
    checked = apply_activation_checkpointing(copy.deepcopy(plain), "full")
    assert list(checked.state_dict()) == list(plain.state_dict())
    ids = torch.randint(0, 97, (2, 16))
    plain.eval(), checked.eval()
    with torch.no_grad(), CountOps(torch.ops.aten.gelu.default) as counter:
        torch.testing.assert_close(checked(ids).logits, plain(ids).logits, rtol=0, atol=0)
    assert counter.counts[torch.ops.aten.gelu.default] == 2 * N_LAYER  # once per block per model
    with pytest.raises(ValueError, match="already applied"):
        apply_activation_checkpointing(checked, "selective")


def test_the_config_field_is_checked():
    with pytest.raises(ValueError, match=r"activation_checkpointing.*must be one of none, full, selective"):
        TrainConfig(activation_checkpointing="some")
    with pytest.raises(ValueError, match=r"fsdp_offload.*add --fsdp"):
        TrainConfig(fsdp_offload=True)
