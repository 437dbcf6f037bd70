"""Inference weight formats: weight-only int8 and the decoding layout (oneDNN-packed and
transposed matrices), each layer against its float original, and the model's outputs and decoding."""

from __future__ import annotations

import copy

import pytest
import torch

from gptkit import GPT, GPTConfig, hardware, native
from gptkit.generation import generate, load_for_generation
from gptkit.hardware import Support, onednn_packing_available, packs_for_onednn
from gptkit.model import KVCache, linears
from gptkit.model import layouts as quantize
from gptkit.model.layouts import (
    DECODING_LAYOUT,
    FusedBlock,
    Int8Linear,
    NativeLinear,
    PackedLinear,
    TransposedLinear,
    WideningLinear,
    decoding_layout,
    has_decoding_layout,
    load_int8,
    quantize_int8,
)
from gptkit.model.linears import INT8_DYNAMIC_MAX_ROWS, INT8_KERNEL_MAX_ROWS
from tests.conftest import SMALL_VOCAB


def test_int8_linear_is_the_rounded_matrix_times_its_row_scales(monkeypatch):
    torch.manual_seed(0)
    linear = torch.nn.Linear(64, 48)
    monkeypatch.setattr(linears, "QUANTIZE_ROWS_AT_ONCE", 5)  # quantized in uneven groups of rows
    quantized = Int8Linear(linear.weight, linear.bias)
    # Each row: its largest magnitude maps to 127, every entry to the nearest multiple of that step.
    row_scale = linear.weight.detach().abs().amax(dim=1) / 127
    torch.testing.assert_close(quantized.scale, row_scale, atol=0, rtol=1e-6)
    by_hand = torch.round(linear.weight.detach() / quantized.scale[:, None]).to(torch.int8)
    assert torch.equal(quantized.integers(), by_hand)
    # The stored integers and fp32 scales reproduce each row within half a quantization step.
    restored = quantized.integers().float() * quantized.scale.float()[:, None]
    step = linear.weight.abs().amax(dim=1, keepdim=True) / 127
    assert (restored - linear.weight).abs().le(step * 0.5 * (1 + 1e-5)).all()
    integers = quantized.integers()
    assert integers.dtype == torch.int8 and integers.abs().max() == 127
    # A few rows (decoding) and many (a prompt), each near the dequantized product.
    for x in (torch.randn(5, 3, 64), torch.randn(2, INT8_KERNEL_MAX_ROWS, 64)):
        expected = x @ restored.t() + linear.bias  # the dequantized product, by hand
        torch.testing.assert_close(quantized(x).float(), expected, atol=0.05, rtol=0.02)
        assert (quantized(x).float() - linear(x)).abs().max() < 0.02 * linear(x).abs().max()


@pytest.mark.skipif(
    "fbgemm" not in torch.backends.quantized.supported_engines, reason="this PyTorch lacks FBGEMM"
)
def test_int8_rows_round_the_activations_to_8_bits_and_no_more(monkeypatch):
    """Without the native kernels, rows go through FBGEMM: the product of the stored integers with
    the activations rounded to 8 bits (7 bits and a zero point, FBGEMM's range on x86, one scale a
    group of rows). Its error stays within what that rounding allows, and below the bound a coarser
    rounding would break: the kernel neither skips the rounding nor rounds more."""
    monkeypatch.setenv("GPTKIT_NATIVE", "0")
    torch.manual_seed(0)
    linear = torch.nn.Linear(256, 96)
    quantized = Int8Linear(linear.weight, linear.bias)
    assert quantized.packed is not None
    restored = quantized.integers().float() * quantized.scale[:, None]
    x = torch.randn(INT8_DYNAMIC_MAX_ROWS, 256)
    exact = x @ restored.t() + linear.bias

    def rounded(levels: int) -> torch.Tensor:  # x on `levels` steps over its range, 0 on the grid
        low, high = min(float(x.min()), 0.0), max(float(x.max()), 0.0)
        step = (high - low) / (levels - 1)
        zero = round(-low / step)
        return (torch.clamp(torch.round(x / step) + zero, 0, levels - 1) - zero) * step

    with torch.no_grad():
        ours = quantized(x)
    by_hand = rounded(128) @ restored.t() + linear.bias
    error = (ours - exact).abs().max()
    assert (ours - by_hand).abs().max() < 0.1 * error  # the same rounding, to the kernel's sums
    assert error < (rounded(32) @ restored.t() + linear.bias - exact).abs().max()
    # A prompt's rows are rounded INT8_DYNAMIC_MAX_ROWS at a time: a row 100× larger than the rest
    # coarsens the rounding of its own group only.
    many = torch.randn(3 * INT8_DYNAMIC_MAX_ROWS, 256)
    many[0] *= 100
    with torch.no_grad():
        groups = [quantized(group) for group in many.split(INT8_DYNAMIC_MAX_ROWS)]
        assert torch.equal(quantized(many), torch.cat(groups))
    errors = [
        (y - (g @ restored.t() + linear.bias)).abs().max()
        for y, g in zip(groups, many.split(INT8_DYNAMIC_MAX_ROWS))
    ]
    assert errors[0] > 10 * max(errors[1:]) and max(errors[1:]) < 2 * error


@pytest.mark.parametrize("activation", ["gelu_tanh", "gelu", "relu"])
@pytest.mark.parametrize("ln_position", ["pre", "post"])
def test_fused_block_computes_what_block_does(ln_position, activation):
    """FusedBlock (the decoding layout's fp32 blocks) against Block: a padded batch's prompt into a
    cache, then a step of one token a row, each under the attention mask."""
    torch.manual_seed(0)
    config = GPTConfig(
        vocab_size=97,
        context_length=32,
        n_layer=2,
        n_head=2,
        d_model=32,
        ln_position=ln_position,
        activation=activation,
    )
    original = GPT(config).eval()
    fused = decoding_layout(copy.deepcopy(original))
    assert {type(b) for b in fused.h} == {FusedBlock}
    ids = torch.randint(0, 97, (2, 9))
    mask = torch.ones_like(ids)
    mask[1, :3] = 0  # the second row left-padded
    caches = [KVCache(config, 2, 9, dtype=torch.float32) for _ in range(2)]
    with torch.no_grad():
        for model, cache in zip((original, fused), caches):
            model.logits = model(ids[:, :8], attention_mask=mask[:, :8], cache=cache).logits
            model.step = model(ids[:, 8:], attention_mask=mask, cache=cache).logits
    torch.testing.assert_close(fused.logits, original.logits, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(fused.step, original.step, rtol=1e-5, atol=1e-5)


def test_a_cpu_cache_holds_fp32_for_a_bf16_model():
    """A bf16 model's cache on a CPU holds fp32 (its attention runs faster there); a step through
    it gives the logits that a bf16 cache gives, to bf16's resolution."""
    torch.manual_seed(0)
    model = GPT(GPTConfig.from_preset("tiny")).to(torch.bfloat16).eval()
    assert model.cache_dtype == torch.float32
    ids = torch.randint(0, 512, (2, 6))
    with torch.no_grad():
        steps = []
        for dtype in (torch.float32, torch.bfloat16):
            cache = KVCache(model.config, 2, 6, dtype=dtype)
            model(ids[:, :5], cache=cache)
            steps.append(model(ids[:, 5:], cache=cache).logits.float())
    torch.testing.assert_close(steps[0], steps[1], rtol=3e-2, atol=3e-2)


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
    agree = (
        generate(model, ids[:, :8], 16, temperature=0)[:, 8:]
        == generate(quantized, ids[:, :8], 16, temperature=0)[:, 8:]
    ).float()
    assert agree.mean() > 0.8
    assert {type(b.mlp.c_fc) for b in quantized.h} == {Int8Linear}
    with pytest.raises(ValueError, match=r"inference-only format \(int8\)"):
        quantized.save_pretrained("unused")


def test_load_int8_quantizes_as_quantize_int8_does_after_loading(tmp_path):
    """Each block quantized as it is read: the same integers, scales and logits as quantizing the
    loaded fp32 model."""
    torch.manual_seed(0)
    GPT(GPTConfig.from_preset("tiny")).save_pretrained(tmp_path)
    streamed, after = load_int8(tmp_path), quantize_int8(GPT.from_pretrained(tmp_path))
    assert streamed.inference_layout == after.inference_layout == "int8"
    assert all(isinstance(block, FusedBlock) for block in streamed.h)
    for (name, ours), (_, theirs) in zip(streamed.named_modules(), after.named_modules(), strict=True):
        if isinstance(ours, Int8Linear):
            assert torch.equal(ours.integers(), theirs.integers()), name
            assert torch.equal(ours.scale, theirs.scale), name
    ids = torch.randint(0, 512, (2, 12))
    with torch.no_grad():
        assert torch.equal(streamed(ids).logits, after(ids).logits)


def test_transposed_linear_computes_what_nn_linear_does():
    torch.manual_seed(0)
    linear = torch.nn.Linear(24, 40)
    x = torch.randn(3, 5, 24)
    transposed = TransposedLinear(linear.weight.detach().t().contiguous(), linear.bias)
    torch.testing.assert_close(transposed(x), linear(x), rtol=1e-6, atol=1e-6)
    no_bias = TransposedLinear(linear.weight.detach().t().contiguous())
    torch.testing.assert_close(no_bias(x), x @ linear.weight.t(), rtol=1e-6, atol=1e-6)


needs_onednn = pytest.mark.skipif(
    not onednn_packing_available(), reason="this PyTorch lacks oneDNN's linear ops"
)


@needs_onednn
@pytest.mark.parametrize("rows", [(1,), (7,), (2, 5), (300,)], ids=str)
def test_packed_linear_computes_what_nn_linear_does(rows):
    """One row (decoding), a few (a served batch), 3-D input, many (a prompt): nn.Linear's result."""
    torch.manual_seed(0)
    for linear in (torch.nn.Linear(24, 40), torch.nn.Linear(24, 40, bias=False)):
        packed = PackedLinear(linear.weight, linear.bias)
        x = torch.randn(*rows, 24)
        with torch.no_grad():
            torch.testing.assert_close(packed(x), linear(x), rtol=1e-5, atol=1e-6)
        assert (packed.in_features, packed.out_features) == (24, 40)


@pytest.mark.parametrize("layout", ["native", "onednn-packed", "transposed-fallback"])
@pytest.mark.parametrize("ln_position", ["pre", "post"])
def test_decoding_layout_scores_and_decodes_like_the_original(ln_position, layout, tmp_path, monkeypatch):
    if layout == "native" and not native.available():
        pytest.skip("the native kernels could not be built here")
    if layout == "onednn-packed" and not onednn_packing_available():
        pytest.skip("this PyTorch lacks oneDNN's linear ops")
    if layout != "native":  # PyTorch's layouts, as where the native kernels cannot be built
        monkeypatch.setenv("GPTKIT_NATIVE", "0")
        monkeypatch.setattr(quantize, "packs_for_onednn", lambda dtype, device: layout == "onednn-packed")
    kind = {"native": NativeLinear, "onednn-packed": PackedLinear, "transposed-fallback": TransposedLinear}[
        layout
    ]
    torch.manual_seed(0)
    config = GPTConfig(
        vocab_size=97, context_length=32, n_layer=2, n_head=2, d_model=32, ln_position=ln_position
    )
    original = GPT(config).eval()
    decoding = decoding_layout(copy.deepcopy(original))
    assert {type(b.mlp.c_fc) for b in decoding.h} == {kind}
    assert (decoding.native_step is not None) == (layout == "native")
    ids = torch.randint(0, 97, (2, 12))
    with torch.no_grad():
        torch.testing.assert_close(decoding(ids).logits, original(ids).logits, rtol=1e-5, atol=1e-5)
    prompt = ids[:, :4]
    assert torch.equal(
        generate(decoding, prompt, 16, temperature=0), generate(original, prompt, 16, temperature=0)
    )
    assert isinstance(decoding.lm_head, kind)
    if layout == "transposed-fallback":  # one transposed copy of the embedding serves both
        assert decoding.wte.weight.data_ptr() == decoding.lm_head.weight_t.data_ptr()
    if layout == "native":  # the output layer: the token table, packed in the kernels' panels
        assert torch.equal(decoding.lm_head.unpacked(), decoding.wte.weight)
    with pytest.raises(ValueError, match="inference-only format"):
        decoding.save_pretrained(tmp_path / "no")
    assert not any(p.requires_grad for p in decoding.parameters())
    if layout != "transposed-fallback":  # packed matrices, or ones the native step points at
        with pytest.raises(ValueError, match="cannot be moved or cast"):
            decoding.to(torch.bfloat16)


@pytest.mark.skipif(
    not packs_for_onednn(torch.bfloat16, torch.device("cpu")), reason="no native bf16 or oneDNN here"
)
def test_bf16_decoding_layout_scores_and_decodes_like_the_bf16_original(monkeypatch):
    monkeypatch.setenv("GPTKIT_NATIVE", "0")  # PyTorch's layout, as where the native kernels cannot be built
    torch.manual_seed(0)
    config = GPTConfig(vocab_size=97, context_length=32, n_layer=2, n_head=2, d_model=32)
    original = GPT(config).to(torch.bfloat16).eval()
    decoding = decoding_layout(copy.deepcopy(original))
    assert isinstance(decoding.lm_head, PackedLinear) and {type(b.attn.c_attn) for b in decoding.h} == {
        PackedLinear
    }
    ids = torch.randint(0, 97, (2, 12))
    with torch.no_grad():  # bf16 sums in another order: agreement to bf16's resolution
        torch.testing.assert_close(decoding(ids).logits, original(ids).logits, rtol=2e-2, atol=2e-2)
    prompt = ids[:, :4]
    agree = (
        (generate(decoding, prompt, 16, temperature=0) == generate(original, prompt, 16, temperature=0))
        .float()
        .mean()
    )
    assert agree > 0.9


def test_decoding_layout_refuses_what_it_is_not_for(monkeypatch):
    with pytest.raises(ValueError, match="not torch.float16 on cpu"):
        decoding_layout(GPT(GPTConfig.from_preset("tiny")).to(torch.float16))
    monkeypatch.setattr(hardware, "cpu_bf16_native", lambda: Support(False, "no bf16 here"))
    assert has_decoding_layout(torch.bfloat16, torch.device("cpu"))
    assert not packs_for_onednn(torch.bfloat16, torch.device("cpu"))
    assert not has_decoding_layout(torch.float32, torch.device("meta"))


def test_bf16_without_native_bf16_multiplies_a_prompt_in_fp32(monkeypatch):
    """Where bf16 is not native, the decoding layout keeps bf16 weights, multiplies a decoding
    step's few rows in bf16 (as the plain model does) and a prompt's many in fp32 from the same bf16
    numbers, the output layer sharing the lookup's table (PyTorch's layout, as where the native
    kernels cannot be built)."""
    monkeypatch.setenv("GPTKIT_NATIVE", "0")
    monkeypatch.setattr(hardware, "cpu_bf16_native", lambda: Support(False, "no bf16 here"))
    monkeypatch.setattr(hardware, "matmul_dtype", lambda device: torch.float32)
    monkeypatch.setattr(linears, "matmul_dtype", lambda device: torch.float32)
    torch.manual_seed(0)
    config = GPTConfig(vocab_size=97, context_length=32, n_layer=2, n_head=2, d_model=32)
    original = GPT(config).to(torch.bfloat16).eval()
    decoding = decoding_layout(copy.deepcopy(original))
    assert {type(b.mlp.c_fc) for b in decoding.h} == {WideningLinear}
    assert decoding.lm_head.weight.data_ptr() == decoding.wte.weight.data_ptr()
    linear = decoding.h[0].mlp.c_fc
    w, b = linear.weight, linear.bias
    few, many = torch.randn(1, 3, 32).bfloat16(), torch.randn(2, 12, 32).bfloat16()
    with torch.no_grad():
        assert torch.equal(linear(few), torch.nn.functional.linear(few, w, b))
        widened = torch.nn.functional.linear(many.float(), w.float(), b.float()).bfloat16()
        assert torch.equal(linear(many), widened)
        ids = torch.randint(0, 97, (2, 12))
        torch.testing.assert_close(decoding(ids).logits, original(ids).logits, rtol=2e-2, atol=2e-2)


def test_load_for_generation_uses_the_decoding_layout_for_cpu_decoding_only(tmp_path, small_tokenizer):
    torch.manual_seed(0)
    config = GPTConfig(vocab_size=SMALL_VOCAB, context_length=16, n_layer=1, n_head=2, d_model=16)
    GPT(config).save_pretrained(tmp_path)
    for file in ("encoder.json", "vocab.bpe"):
        (tmp_path / file).write_bytes((small_tokenizer / file).read_bytes())
    decoding, _ = load_for_generation(tmp_path, device="cpu")
    scoring, _ = load_for_generation(tmp_path, device="cpu", decoding=False)
    bf16, _ = load_for_generation(tmp_path, device="cpu", dtype="bfloat16")
    assert decoding.inference_layout == DECODING_LAYOUT
    assert scoring.inference_layout is None
    assert bf16.inference_layout == DECODING_LAYOUT
