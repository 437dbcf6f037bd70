"""Activation checkpointing: the same gradients as the unchecked run, and what each mode recomputes."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn
from torch.utils._python_dispatch import TorchDispatchMode

from gptkit import GPT, GPTConfig
from gptkit.train.config import TrainConfig
from gptkit.train.memory.activation_checkpointing import apply_activation_checkpointing

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


# A fused attention that draws its dropout mask from the global generator, as CUDA's flash and
# memory-efficient kernels do (on a CPU, attention with dropout runs unfused, so torch's own
# kernels cannot show it here). Like them it is tagged nondeterministic_seeded, has a dropout_p
# argument, and has a backward of its own that reads the mask it drew (flash reads its philox
# seed and offset), so checkpointing sees one op, as it sees flash attention.
@torch.library.custom_op(
    "gptkit_test::seeded_attention", mutates_args=(), tags=(torch.Tag.nondeterministic_seeded,)
)
def seeded_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dropout_p: float
) -> tuple[torch.Tensor, torch.Tensor]:
    keep = (torch.rand(q.shape[:-1] + (k.shape[-2],)) >= dropout_p).to(q.dtype) / (1 - dropout_p)
    return _masked_attention(q, k, v, keep), keep


@seeded_attention.register_fake
def _(q, k, v, dropout_p):
    return torch.empty_like(q), q.new_empty(q.shape[:-1] + (k.shape[-2],))


def _masked_attention(q, k, v, keep):
    scores = (q @ k.transpose(-2, -1)) / q.size(-1) ** 0.5
    causal = torch.ones(q.size(-2), k.size(-2), dtype=torch.bool).tril()
    weights = scores.masked_fill(~causal, float("-inf")).softmax(-1) * keep
    return weights @ v


def _seeded_attention_context(ctx, inputs, output):
    q, k, v, _ = inputs
    ctx.save_for_backward(q, k, v, output[1])


def _seeded_attention_backward(ctx, grad, _grad_keep):
    q, k, v, keep = ctx.saved_tensors
    with torch.enable_grad():
        q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
        return (*torch.autograd.grad(_masked_attention(q, k, v, keep), (q, k, v), grad), None)


seeded_attention.register_autograd(_seeded_attention_backward, setup_context=_seeded_attention_context)


def test_selective_draws_every_dropout_mask_as_the_unchecked_run_with_a_seeded_fused_attention(monkeypatch):
    """A kept op that draws random numbers is not run again in the recomputation, so the dropouts
    after it would draw at other generator offsets than in the forward pass: gradients of other
    masks, with nothing to flag it. Such an op is recomputed while it draws (dropout_p > 0)."""
    from gptkit.train.memory import activation_checkpointing

    def attention(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False):
        assert attn_mask is None and is_causal, "the tiny model's training forward: causal, no mask"
        return torch.ops.gptkit_test.seeded_attention(q, k, v, dropout_p)[0]

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", attention)
    seeded = torch.ops.gptkit_test.seeded_attention.default
    monkeypatch.setattr(activation_checkpointing, "_KEPT_OPS", {*activation_checkpointing._KEPT_OPS, seeded})
    plain = tiny_gpt("pre")
    loss, expected = gradients(plain)
    for mode in ("full", "selective"):
        checked = apply_activation_checkpointing(copy.deepcopy(plain), mode)
        checked_loss, got = gradients(checked)
        assert checked_loss == loss
        for name in expected:
            torch.testing.assert_close(got[name], expected[name], rtol=1e-6, atol=1e-7, msg=f"{mode}: {name}")
    # Without dropout the same op draws nothing, and selective keeps it (its products are not redone).
    plain.set_dropout(0.0)
    selective = apply_activation_checkpointing(copy.deepcopy(plain), "selective")
    with CountOps(seeded) as counter:
        gradients(selective)
    assert counter.counts[seeded] == N_LAYER
