"""Weight-only int8: each layer against its float original, and the model's outputs and decoding."""

from __future__ import annotations

import copy

import pytest
import torch

from gptkit import GPT, GPTConfig
from gptkit.quantize import Int8Linear, quantize_int8


def test_int8_linear_is_the_rounded_matrix_times_its_row_scales():
    torch.manual_seed(0)
    linear = torch.nn.Linear(64, 48)
    quantized = Int8Linear(linear.weight, linear.bias)
    # The stored integers and scales reproduce each row within half a quantization step, plus the
    # rounding of the scale to bf16 (8 significant bits), which the kernel needs.
    restored = quantized.weight.float() * quantized.scale.float()[:, None]
    step = linear.weight.abs().amax(dim=1, keepdim=True) / 127
    assert (restored - linear.weight).abs().le(step * 0.5 + restored.abs() * 2**-8).all()
    assert quantized.weight.dtype == torch.int8 and quantized.weight.abs().max() == 127
    x = torch.randn(5, 3, 64)
    expected = x @ restored.t() + linear.bias  # the dequantized product, by hand
    torch.testing.assert_close(quantized(x).float(), expected, atol=0.05, rtol=0.02)
    assert (quantized(x).float() - linear(x)).abs().max() < 0.02 * linear(x).abs().max()


def test_quantized_model_scores_and_decodes_like_the_original():
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=300, context_length=64, n_layer=2, n_head=4, d_model=128)).eval()
    quantized = quantize_int8(copy.deepcopy(model))
    ids = torch.randint(0, 300, (2, 40))
    with torch.no_grad():
        reference = model(ids).logits.log_softmax(-1)
        ours = quantized(ids).logits.float().log_softmax(-1)
    nll = -reference[:, :-1].gather(2, ids[:, 1:, None]).mean()
    nll_q = -ours[:, :-1].gather(2, ids[:, 1:, None]).mean()
    assert abs(float(nll_q / nll) - 1) < 0.01  # perplexity within 1% (log scale: 1% of the NLL)
    agree = (model.generate(ids[:, :8], 16)[:, 8:] == quantized.generate(ids[:, :8], 16)[:, 8:]).float()
    assert agree.mean() > 0.8
    assert {type(b.mlp.c_fc) for b in quantized.h} == {Int8Linear}
    with pytest.raises(ValueError, match="quantized"):
        quantized.save_pretrained("unused")
