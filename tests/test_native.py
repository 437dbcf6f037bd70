"""gptkit.native: the decoding step in one native call, against PyTorch's blocks, transformers and a
hand computation of its int8 rounding; its AVX2 and generic builds; its build cache and fallback."""

from __future__ import annotations

import copy
import ctypes
import dataclasses
import warnings

import pytest
import torch
import transformers

from gptkit import GPT, GPTConfig, generate, native
from gptkit.model import KVCache, layouts
from gptkit.model.layouts import Int8Linear, NativeLinear, decoding_layout, native_matrix, quantize_int8

pytestmark = pytest.mark.skipif(not native.available(), reason="the native kernels could not be built here")


def small_config(**overrides) -> GPTConfig:
    # A larger init than N(0, 0.02): logits far enough apart that a greedy choice is not a near-tie
    # that summing in another order may flip.
    settings = dict(vocab_size=211, context_length=48, n_layer=3, n_head=4, d_model=64, init_std=0.2)
    return GPTConfig(**(settings | overrides))


def step_logits(
    model: GPT, prompt: torch.Tensor, mask: torch.Tensor | None, new: torch.Tensor
) -> torch.Tensor:
    """Logits of one decoding step of ``new`` (B, 1) after ``prompt``, through ``model``'s cache."""
    cache = KVCache(model.config, prompt.size(0), prompt.size(1) + 1, dtype=torch.float32)
    with torch.no_grad():
        model(prompt, attention_mask=mask, cache=cache)
        if mask is not None:
            mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
        return model(new, attention_mask=mask, cache=cache).logits


@pytest.fixture(params=[1, 2], ids=["1-thread", "2-threads"])
def threads(request):
    """The tests run on one thread (conftest); the native step splits its work between the threads
    PyTorch is set to use, so its tests run on two as well."""
    before = torch.get_num_threads()
    torch.set_num_threads(request.param)
    yield request.param
    torch.set_num_threads(before)


@pytest.mark.parametrize("activation", ["gelu_tanh", "gelu", "relu"])
@pytest.mark.parametrize("ln_position", ["pre", "post"])
def test_native_step_computes_what_the_blocks_compute(ln_position, activation, threads):
    """fp32 logits of a decoding step within 1e-4 of PyTorch's blocks, rows left-padded to different
    lengths, GPT-2's layout and GPT-1's, each activation; the cache holds the same keys and values."""
    torch.manual_seed(0)
    original = GPT(small_config(ln_position=ln_position, activation=activation)).eval()
    native_model = decoding_layout(copy.deepcopy(original))
    assert native_model.native_step is not None
    prompt = torch.randint(0, 211, (3, 9))
    mask = torch.ones_like(prompt)
    mask[1, :4] = 0  # left padding
    mask[2, :8] = 0
    new = torch.randint(0, 211, (3, 1))
    expected = step_logits(original, prompt, mask, new)
    torch.testing.assert_close(step_logits(native_model, prompt, mask, new), expected, rtol=0, atol=1e-4)
    torch.testing.assert_close(
        step_logits(native_model, prompt, None, new),
        step_logits(original, prompt, None, new),
        rtol=0,
        atol=1e-4,
    )


def test_native_step_reads_masks_as_the_blocks_do_and_leaves_what_it_cannot_to_them():
    """Masks wider than the positions so far, one mask for every row, a padded new token (it still
    sees itself): the blocks' numbers. A full cache, or a cache of another shape, goes to the
    blocks, which say what is wrong; a product's input of the wrong width is refused."""
    torch.manual_seed(0)
    original = GPT(small_config()).eval()
    native_model = decoding_layout(copy.deepcopy(original))
    prompt, new = torch.randint(0, 211, (2, 9)), torch.randint(0, 211, (2, 1))

    def step(model, mask):
        cache = KVCache(model.config, 2, 10, dtype=torch.float32)
        with torch.no_grad():
            model(prompt, cache=cache)
            return model(new, attention_mask=mask, cache=cache).logits

    wide = torch.ones(2, 14, dtype=torch.long)
    wide[0, :3] = 0
    padded_new = torch.ones(2, 10, dtype=torch.long)
    padded_new[1, 9] = 0
    for mask in (wide, torch.ones(1, 10, dtype=torch.long), padded_new):
        torch.testing.assert_close(step(native_model, mask), step(original, mask), rtol=0, atol=1e-4)
    full = KVCache(native_model.config, 2, 9, dtype=torch.float32)
    with torch.no_grad():
        native_model(prompt, cache=full)
        with pytest.raises(RuntimeError):  # PyTorch's cache append: no room for a 10th position
            native_model(new, cache=full)
    other = KVCache(dataclasses.replace(native_model.config, n_head=2), 2, 12, dtype=torch.float32)
    assert not native_model.native_step.applies(torch.zeros(2, 1, 64), other, None)
    with pytest.raises(ValueError, match="input of 32 features for a matrix of 64 inputs"):
        native_model.h[0].attn.c_attn(torch.randn(1, 32))


def test_native_greedy_decoding_matches_transformers(tmp_path):
    """GPT-2's shape in small: greedy ids through the native step equal GPT2LMHeadModel's."""
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        vocab_size=211, n_positions=64, n_embd=64, n_layer=3, n_head=4, initializer_range=0.2
    )
    reference = transformers.GPT2LMHeadModel(config).eval()
    reference.save_pretrained(tmp_path)
    ours = decoding_layout(GPT.from_pretrained(tmp_path))
    assert ours.native_step is not None
    prompt = torch.randint(0, 211, (1, 8))
    with torch.no_grad():
        expected = reference.generate(
            prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=24, do_sample=False, pad_token_id=0
        )
    assert torch.equal(generate(ours, prompt, 24, temperature=0), expected)


def rounded_to_7_bits(x: torch.Tensor) -> torch.Tensor:
    """Each row of ``x`` as the native int8 product rounds it, by hand: 128 levels over [min(x, 0),
    max(x, 0)], the zero point on the grid."""
    low = x.amin(dim=1, keepdim=True).clamp(max=0)
    high = x.amax(dim=1, keepdim=True).clamp(min=0)
    step = (high - low) / 127
    zero = torch.round(-low / step)
    return (torch.clamp(torch.round(x / step) + zero, 0, 127) - zero) * step


def test_native_int8_product_rounds_each_row_of_activations_to_7_bits(threads):
    torch.manual_seed(0)
    linear = torch.nn.Linear(256, 96)
    quantized = Int8Linear(linear.weight, linear.bias)
    assert quantized.native and quantized.packed is None
    restored = quantized.integers().float() * quantized.scale[:, None]
    x = torch.randn(7, 256)
    x[0] *= 100  # a row far larger than the rest coarsens its own rounding only
    with torch.no_grad():
        ours = quantized(x)
    exact = x @ restored.t() + linear.bias
    by_hand = rounded_to_7_bits(x) @ restored.t() + linear.bias
    error = (ours - exact).abs().amax(dim=1)
    assert ((ours - by_hand).abs().amax(dim=1) < 1e-3 * by_hand.abs().amax(dim=1)).all()  # the same rounding
    assert error[0] > 10 * error[1:].max()
    # Fewer rows than a tile, a tile, and a tile and some: the same numbers row by row.
    with torch.no_grad():
        for rows in (1, 4, 6):
            torch.testing.assert_close(quantized(x[:rows]), ours[:rows], rtol=0, atol=1e-5)


@pytest.mark.skipif("fbgemm" not in torch.backends.quantized.supported_engines, reason="no FBGEMM")
def test_native_int8_row_matches_fbgemm(monkeypatch):
    """One row (a decoding step): the same rounding as FBGEMM's dynamically quantized product with
    its x86 range, so the same numbers to fp32's last bits."""
    torch.manual_seed(0)
    linear = torch.nn.Linear(768, 300)
    ours = Int8Linear(linear.weight, linear.bias)
    monkeypatch.setenv("GPTKIT_NATIVE", "0")
    theirs = Int8Linear(linear.weight, linear.bias)
    assert theirs.packed is not None and ours.native
    with torch.no_grad():
        for _ in range(5):
            x = torch.randn(1, 768)
            torch.testing.assert_close(ours(x), theirs(x), rtol=1e-5, atol=1e-5)


def test_native_int8_step_computes_what_the_int8_blocks_compute(threads):
    """The int8 step in one call against the same int8 model's blocks run one operator at a time
    (each product rounding its rows as the step does), and near the fp32 model."""
    torch.manual_seed(0)
    original = GPT(small_config()).eval()
    quantized = quantize_int8(copy.deepcopy(original))
    assert quantized.native_step is not None and quantized.native_step.dtype == torch.int8
    prompt, new = torch.randint(0, 211, (2, 9)), torch.randint(0, 211, (2, 1))
    fused = step_logits(quantized, prompt, None, new)
    quantized.native_step = None  # the blocks one by one
    torch.testing.assert_close(fused, step_logits(quantized, prompt, None, new), rtol=0, atol=1e-4)
    fp32 = step_logits(original, prompt, None, new)
    assert (fused - fp32).abs().max() < 0.1 * fp32.abs().max()  # 7-bit activations, 8-bit weights


def test_native_bf16_step_multiplies_the_bf16_weights_in_fp32(threads):
    """A bf16 model's decoding step reads bf16 weights and computes in fp32: near the fp32 model
    whose weights are those bf16 numbers (the prompt's blocks and the first sum still run in bf16),
    and its greedy tokens mostly those of the plain bf16 model."""
    torch.manual_seed(0)
    original = GPT(small_config()).eval()
    bf16 = original.to(torch.bfloat16)
    rounded = copy.deepcopy(bf16).float()  # fp32 arithmetic on the bf16 weights
    native_model = decoding_layout(copy.deepcopy(bf16))
    assert native_model.native_step is not None and native_model.native_step.dtype == torch.bfloat16
    prompt, new = torch.randint(0, 211, (2, 9)), torch.randint(0, 211, (2, 1))
    ours, reference = step_logits(native_model, prompt, None, new), step_logits(rounded, prompt, None, new)
    assert ours.dtype == torch.float32
    assert (ours - reference).abs().max() < 0.03 * reference.abs().max()
    agree = generate(native_model, prompt, 16, temperature=0) == generate(bf16, prompt, 16, temperature=0)
    assert agree.float().mean() > 0.9


@pytest.mark.parametrize("rows", [1, 3, 16, 40])
def test_native_linear_computes_what_nn_linear_does(rows, threads):
    torch.manual_seed(0)
    linear = torch.nn.Linear(80, 120)
    ours = NativeLinear(linear.weight, linear.bias)
    x = torch.randn(rows, 80)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), linear(x), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(
            ours.activated(x, "gelu_tanh"),
            torch.nn.functional.gelu(linear(x), approximate="tanh"),
            rtol=1e-5,
            atol=1e-5,
        )
        residual = torch.randn(rows, 120)
        torch.testing.assert_close(ours.add_to(residual, x), residual + linear(x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("flags", [("-mavx2", "-mfma"), ()], ids=["avx2", "generic"])
def test_avx2_and_generic_builds_compute_the_same(flags, tmp_path, threads):
    """The kernels a CPU without AVX-512 runs (AVX2 and FMA), and the plain loops of any other CPU,
    built here with those flags: products and whole steps as PyTorch computes them."""
    library = native.load(native.compile_library(tmp_path / "kernels.so", (*flags, "-fopenmp")))
    torch.manual_seed(0)
    weight, bias, x = torch.randn(70, 200), torch.randn(70), torch.randn(5, 200)
    y = torch.empty(5, 70)
    matrix = native_matrix(weight, bias)
    library.gptkit_product(ctypes.byref(matrix), native.FORMATS[torch.float32], x.data_ptr(), 5, y.data_ptr())
    torch.testing.assert_close(y, x @ weight.t() + bias, rtol=1e-5, atol=1e-4)
    half = weight.bfloat16()
    library.gptkit_product(
        ctypes.byref(native_matrix(half, bias)), native.FORMATS[torch.bfloat16], x.data_ptr(), 5, y.data_ptr()
    )
    torch.testing.assert_close(y, x @ half.float().t() + bias, rtol=1e-5, atol=1e-4)
    quantized = Int8Linear(weight, bias)
    library.gptkit_product(
        ctypes.byref(quantized.matrix()), native.FORMATS[torch.int8], x.data_ptr(), 5, y.data_ptr()
    )
    restored = quantized.integers().float() * quantized.scale[:, None]
    torch.testing.assert_close(y, rounded_to_7_bits(x) @ restored.t() + bias, rtol=1e-4, atol=1e-3)

    original = GPT(small_config()).eval()
    for model in (
        decoding_layout(copy.deepcopy(original)),
        decoding_layout(copy.deepcopy(original).to(torch.bfloat16)),
        quantize_int8(copy.deepcopy(original)),
    ):
        prompt, new = torch.randint(0, 211, (2, 9)), torch.randint(0, 211, (2, 1))
        expected = step_logits(model, prompt, None, new)
        model.native_step.library = library
        torch.testing.assert_close(step_logits(model, prompt, None, new), expected, rtol=0, atol=1e-4)


def test_the_library_is_built_once_per_source_and_machine(tmp_path, monkeypatch):
    monkeypatch.setenv("GPTKIT_NATIVE_CACHE", str(tmp_path))
    first = native.build()
    assert first.parent == tmp_path and first.exists()
    built = first.stat().st_mtime_ns
    assert native.build() == first and first.stat().st_mtime_ns == built  # found, not compiled again
    assert not list(tmp_path.glob("*.partial"))  # nothing half-written left beside it


def test_without_a_compiler_decoding_keeps_pytorchs_layouts_with_one_warning(tmp_path, monkeypatch):
    monkeypatch.setenv("GPTKIT_NATIVE_CACHE", str(tmp_path))
    with pytest.raises(RuntimeError, match="could not compile"):
        native.build(compiler="false")  # a "compiler" that always fails
    assert not list(tmp_path.iterdir())

    def no_compiler(compiler=None):
        raise RuntimeError("no C++ compiler found (set CXX, or install g++)")

    monkeypatch.setattr(native, "build", no_compiler)
    native._library.cache_clear()
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert not native.available()
            assert not native.available()  # asked again: the same answer, no second warning
        assert [str(w.message) for w in caught] == [
            "gptkit: the native decoding kernels are not available (no C++ compiler found (set CXX, "
            "or install g++)); decoding uses PyTorch's kernels"
        ]
        model = decoding_layout(GPT(small_config()).eval())
        assert model.native_step is None and not isinstance(model.lm_head, NativeLinear)
        assert quantize_int8(GPT(small_config()).eval()).native_step is None
    finally:
        native._library.cache_clear()


def test_gptkit_native_off_switch(monkeypatch):
    monkeypatch.setenv("GPTKIT_NATIVE", "0")
    assert not native.available()
    model = decoding_layout(GPT(small_config()).eval())
    assert model.native_step is None
    quantized = layouts.Int8Linear(torch.randn(8, 16))
    assert not quantized.native and quantized.row_sum is None
    if "fbgemm" in torch.backends.quantized.supported_engines:  # FBGEMM's packing, as before the kernels
        assert quantized.packed is not None
