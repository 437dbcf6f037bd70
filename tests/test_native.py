"""gptkit.native: the decoding step in one native call, proved to have run (its call counter), against
references that do not call it: transformers' GPT2LMHeadModel and OpenAIGPTLMHeadModel, PyTorch's
blocks, and an int8 model written in PyTorch alone; shapes whose widths leave scalar tails; the AVX2
and generic builds against the same references."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch
import torch.nn as nn
import transformers

from gptkit import GPT, GPTConfig, generate, native
from gptkit.model import KVCache, layouts
from gptkit.model.layouts import Int8Linear, NativeLinear, decoding_layout, quantize_int8

pytestmark = pytest.mark.skipif(not native.available(), reason="the native kernels are not used here")

VOCAB = 211
# (d_model, n_head): head sizes 12, 12, 12 and 16. AVX-512 takes 16 floats and 64 int8 a vector,
# AVX2 8 and 32: 60, 72 and 36 leave scalar tails in every product, 12 in every attention dot.
SHAPES = [(60, 5), (72, 6), (36, 3), (64, 4)]
SHAPE_IDS = [f"d{d}-h{h}" for d, h in SHAPES]


def small_config(**overrides) -> GPTConfig:
    # A larger init than N(0, 0.02): logits far enough apart that a greedy choice is not a near-tie
    # that summing in another order may flip.
    settings = dict(vocab_size=VOCAB, context_length=48, n_layer=3, n_head=4, d_model=64, init_std=0.2)
    return GPTConfig(**(settings | overrides))


def left_padded_batch(rows: int = 3, length: int = 9) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A prompt (rows, length) whose rows after the first are left-padded to other lengths, its mask,
    and one new token a row."""
    prompt = torch.randint(0, VOCAB, (rows, length))
    mask = torch.ones_like(prompt)
    for row in range(1, rows):
        mask[row, : min(length - 1, 4 * row)] = 0
    return prompt, mask, torch.randint(0, VOCAB, (rows, 1))


def with_new_token(mask: torch.Tensor | None) -> torch.Tensor | None:
    return None if mask is None else torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)


def prefilled(model: GPT, prompt: torch.Tensor, mask: torch.Tensor | None, kind: type = None) -> KVCache:
    """A cache holding the prompt's keys and values, computed by ``model`` (``kind``: KVCache or a
    RoundingCache)."""
    cache = (kind or KVCache)(model.config, prompt.size(0), prompt.size(1) + 1, dtype=torch.float32)
    with torch.no_grad():
        model(prompt, attention_mask=mask, cache=cache)
    return cache


class RoundingCache(KVCache):
    """An fp32 cache whose every key and value is rounded to bf16 as it is stored: what a native bf16
    step's bf16 cache holds, for PyTorch's blocks in fp32 (the new token's own key and value too)."""

    def append(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return super().append(layer, k.bfloat16().float(), v.bfloat16().float())


def copied(
    cache: KVCache, config: GPTConfig, dtype: torch.dtype | None = None, kind: type = KVCache
) -> KVCache:
    """A copy of ``cache`` (in ``dtype``: a native bf16 model's cache is bf16)."""
    copy_ = kind(config, cache.keys.size(1), cache.capacity, dtype=dtype or cache.keys.dtype)
    copy_.keys.copy_(cache.keys)
    copy_.values.copy_(cache.values)
    copy_.length = cache.length
    return copy_


def step(
    model: GPT, cache: KVCache, new: torch.Tensor, mask: torch.Tensor | None, kind: type = KVCache
) -> torch.Tensor:
    """Logits (B, 1, V) of one decoding step of ``new`` on a copy of ``cache`` (in the model's cache
    dtype; ``kind`` RoundingCache for a bf16 reference)."""
    with torch.no_grad():
        ours = copied(cache, model.config, model.cache_dtype, kind)
        return model(new, attention_mask=with_new_token(mask), cache=ours).logits


def native_step(model: GPT, cache: KVCache, new: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """``step`` through the native step, which must have run (once)."""
    before = model.native_step.calls
    logits = step(model, cache, new, mask)
    assert model.native_step.calls == before + 1, "the decoding step did not run through the native step"
    return logits


def step_logits(
    model: GPT, prompt: torch.Tensor, mask: torch.Tensor | None, new: torch.Tensor
) -> torch.Tensor:
    """The prompt through ``model``, then one decoding step: logits (B, 1, V)."""
    return step(model, prefilled(model, prompt, mask), new, mask)


@pytest.fixture(params=[1, 2], ids=["1-thread", "2-threads"])
def threads(request):
    """The tests run on one thread (conftest); the native step splits its work between the threads
    PyTorch is set to use, so its tests run on two as well."""
    before = torch.get_num_threads()
    torch.set_num_threads(request.param)
    yield request.param
    torch.set_num_threads(before)


# Against transformers ------------------------------------------------------------------------------


def positions(mask: torch.Tensor) -> torch.Tensor:
    """Left-padded rows count positions from their first real token (as gptkit does)."""
    return (mask.cumsum(-1) - 1).clamp(min=0)


@pytest.mark.parametrize(("d_model", "n_head"), SHAPES, ids=SHAPE_IDS)
def test_native_step_matches_gpt2_lm_head_model(d_model, n_head, tmp_path, threads):
    """GPT-2's pre-LN blocks, four layers, left-padded rows: the native step's logits within 1e-4 of
    GPT2LMHeadModel's at the new token, which reads the whole padded sequence."""
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        vocab_size=VOCAB, n_positions=48, n_embd=d_model, n_layer=4, n_head=n_head, initializer_range=0.2
    )
    reference = transformers.GPT2LMHeadModel(config).eval()
    reference.save_pretrained(tmp_path)
    ours = decoding_layout(GPT.from_pretrained(tmp_path))
    prompt, mask, new = left_padded_batch()
    got = native_step(ours, prefilled(ours, prompt, mask), new, mask)
    full, full_mask = torch.cat([prompt, new], dim=1), with_new_token(mask)
    with torch.no_grad():
        expected = reference(full, attention_mask=full_mask, position_ids=positions(full_mask)).logits[:, -1:]
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-4)


@pytest.mark.parametrize(("d_model", "n_head"), SHAPES, ids=SHAPE_IDS)
def test_native_gpt1_post_ln_step_matches_openai_gpt_lm_head_model(d_model, n_head, tmp_path, threads):
    """GPT-1's post-LN blocks (LN(x + f(x)), erf GELU, no final LayerNorm), three layers, left-padded
    rows: the native step's logits within 1e-4 of OpenAIGPTLMHeadModel's."""
    torch.manual_seed(0)
    config = transformers.OpenAIGPTConfig(
        vocab_size=VOCAB, n_positions=48, n_embd=d_model, n_layer=3, n_head=n_head, initializer_range=0.2
    )
    reference = transformers.OpenAIGPTLMHeadModel(config).eval()
    reference.save_pretrained(tmp_path)
    ours = decoding_layout(GPT.from_pretrained(tmp_path))
    assert ours.config.ln_position == "post" and ours.native_step.sizes["pre_ln"] == 0
    prompt, mask, new = left_padded_batch()
    got = native_step(ours, prefilled(ours, prompt, mask), new, mask)
    full, full_mask = torch.cat([prompt, new], dim=1), with_new_token(mask)
    with torch.no_grad():
        expected = reference(full, attention_mask=full_mask, position_ids=positions(full_mask)).logits[:, -1:]
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-4)


def test_native_greedy_decoding_matches_transformers(tmp_path):
    """24 greedy tokens through the native step equal GPT2LMHeadModel's; every one was a native step."""
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        vocab_size=VOCAB, n_positions=64, n_embd=60, n_layer=3, n_head=5, initializer_range=0.2
    )
    reference = transformers.GPT2LMHeadModel(config).eval()
    reference.save_pretrained(tmp_path)
    ours = decoding_layout(GPT.from_pretrained(tmp_path))
    prompt = torch.randint(0, VOCAB, (1, 8))
    with torch.no_grad():
        expected = reference.generate(
            prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=24, do_sample=False, pad_token_id=0
        )
    assert torch.equal(generate(ours, prompt, 24, temperature=0), expected)
    assert ours.native_step.calls == 24  # the prompt's pass, then 23 decoding steps


# Against PyTorch's blocks --------------------------------------------------------------------------


@pytest.mark.parametrize(("d_model", "n_head"), SHAPES, ids=SHAPE_IDS)
@pytest.mark.parametrize("activation", ["gelu_tanh", "gelu", "relu"])
@pytest.mark.parametrize("ln_position", ["pre", "post"])
def test_native_step_computes_what_the_blocks_compute(ln_position, activation, d_model, n_head, threads):
    """fp32 logits of a decoding step within 1e-4 of PyTorch's blocks on the same cache, rows
    left-padded to different lengths and not, GPT-2's layout and GPT-1's, each activation; the step
    writes the keys and values the blocks write."""
    torch.manual_seed(0)
    config = small_config(ln_position=ln_position, activation=activation, d_model=d_model, n_head=n_head)
    original = GPT(config).eval()
    native_model = decoding_layout(copy.deepcopy(original))
    prompt, mask, new = left_padded_batch()
    for m in (mask, None):
        cache = prefilled(original, prompt, m)
        ours, theirs = copied(cache, config), copied(cache, config)
        with torch.no_grad():
            expected = original(new, attention_mask=with_new_token(m), cache=theirs).logits
            calls = native_model.native_step.calls
            got = native_model(new, attention_mask=with_new_token(m), cache=ours).logits
        assert native_model.native_step.calls == calls + 1
        torch.testing.assert_close(got, expected, rtol=0, atol=1e-4)
        torch.testing.assert_close(ours.keys, theirs.keys, rtol=0, atol=1e-5)
        torch.testing.assert_close(ours.values, theirs.values, rtol=0, atol=1e-5)


def test_native_step_reads_masks_as_the_blocks_do_and_leaves_what_it_cannot_to_them():
    """Masks wider than the positions so far, one mask for every row, a padded new token (it still
    sees itself): the blocks' numbers, through the native step. A full cache, or a cache of another
    shape, goes to the blocks, which say what is wrong, and so does a call without a cache; a
    product's input of the wrong width is refused."""
    torch.manual_seed(0)
    original = GPT(small_config()).eval()
    native_model = decoding_layout(copy.deepcopy(original))
    prompt, new = torch.randint(0, VOCAB, (2, 9)), torch.randint(0, VOCAB, (2, 1))

    def decode(model, mask):
        cache = KVCache(model.config, 2, 10, dtype=torch.float32)
        with torch.no_grad():
            model(prompt, cache=cache)
            return model(new, attention_mask=mask, cache=cache).logits

    wide = torch.ones(2, 14, dtype=torch.long)
    wide[0, :3] = 0
    padded_new = torch.ones(2, 10, dtype=torch.long)
    padded_new[1, 9] = 0
    for mask in (wide, torch.ones(1, 10, dtype=torch.long), padded_new):
        calls = native_model.native_step.calls
        torch.testing.assert_close(decode(native_model, mask), decode(original, mask), rtol=0, atol=1e-4)
        assert native_model.native_step.calls == calls + 2  # the prompt, then the new token
    full = KVCache(native_model.config, 2, 9, dtype=torch.float32)
    with torch.no_grad():
        native_model(prompt, cache=full)
        with pytest.raises(RuntimeError):  # PyTorch's cache append: no room for a 10th position
            native_model(new, cache=full)
        fits = KVCache(native_model.config, 2, 12, dtype=torch.float32)
        other = KVCache(dataclasses.replace(native_model.config, n_head=2), 2, 12, dtype=torch.float32)
        x = torch.zeros(2, 1, 64)
        # Asked without a gradient, where a decoding step runs: the right cache applies, the others not.
        assert native_model.native_step.applies(x, fits, None)
        assert native_model.native_step.applies(torch.zeros(2, 2, 64), fits, None)  # a prompt's tokens too
        assert not native_model.native_step.applies(x, other, None)
        assert not native_model.native_step.applies(x, None, None)  # no cache (scoring): the blocks
    with torch.enable_grad():
        assert not native_model.native_step.applies(x, fits, None)  # training: PyTorch's blocks
    with pytest.raises(ValueError, match="input of 32 features for a matrix of 64 inputs"):
        native_model.h[0].attn.c_attn(torch.randn(1, 32))


# int8, against a reference in PyTorch alone -------------------------------------------------------


def rounded_to_7_bits(x: torch.Tensor) -> torch.Tensor:
    """Each row of ``x`` as the native int8 product rounds it, by hand: 128 levels over [min(x, 0),
    max(x, 0)], the zero point on the grid."""
    low = x.amin(dim=-1, keepdim=True).clamp(max=0)
    high = x.amax(dim=-1, keepdim=True).clamp(min=0)
    step_ = (high - low) / 127
    zero = torch.round(-low / step_)
    return (torch.clamp(torch.round(x / step_) + zero, 0, 127) - zero) * step_


class Rounded7BitLinear(nn.Module):
    """An int8 matrix's product in PyTorch alone: each row of activations rounded to 7 bits, then
    multiplied by the restored weights (scale ⊙ q) in fp32, the bias added."""

    def __init__(self, int8: Int8Linear):
        super().__init__()
        self.weight = int8.integers().float() * int8.scale[:, None]
        self.bias = int8.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = rounded_to_7_bits(x.float()) @ self.weight.t()
        return y if self.bias is None else y + self.bias


def int8_reference(original: GPT, quantized: GPT) -> GPT:
    """``original``'s blocks with ``quantized``'s int8 matrices as Rounded7BitLinear, its bf16 token
    lookup and its int8 output layer: the int8 model's numbers, no native product called."""
    reference = copy.deepcopy(original)
    for ours, theirs in zip(reference.h, quantized.h):
        ours.attn.c_attn = Rounded7BitLinear(theirs.attn.c_attn)
        ours.attn.c_proj = Rounded7BitLinear(theirs.attn.c_proj)
        ours.mlp.c_fc = Rounded7BitLinear(theirs.mlp.c_fc)
        ours.mlp.c_proj = Rounded7BitLinear(theirs.mlp.c_proj)
    with torch.no_grad():
        reference.wte.weight.copy_(quantized.wte.weight.float())
    reference.lm_head = Rounded7BitLinear(quantized.lm_head)
    return reference


@pytest.mark.parametrize(("d_model", "n_head"), SHAPES, ids=SHAPE_IDS)
def test_native_int8_step_computes_what_a_pytorch_int8_reference_computes(d_model, n_head, threads):
    """The int8 step (in one native call) against the same integers, scales and 7-bit rounding in
    PyTorch alone, on the same cache, left-padded rows: within 1e-3 of the logits' range (a level of
    rounding apart now and then: the step and the reference divide in another order); and near the
    fp32 model."""
    torch.manual_seed(0)
    original = GPT(small_config(d_model=d_model, n_head=n_head)).eval()
    quantized = quantize_int8(copy.deepcopy(original))
    assert quantized.native_step.dtype == torch.int8
    reference = int8_reference(original, quantized)
    prompt, mask, new = left_padded_batch()
    cache = prefilled(reference, prompt, mask)
    got, expected = native_step(quantized, cache, new, mask), step(reference, cache, new, mask)
    scale = expected.abs().max()
    assert (got - expected).abs().max() < 1e-3 * scale
    fp32 = step(original, prefilled(original, prompt, mask), new, mask)
    assert (got - fp32).abs().max() < 0.2 * fp32.abs().max()  # 7-bit activations, 8-bit weights


def test_native_int8_product_rounds_each_row_of_activations_to_7_bits(threads):
    torch.manual_seed(0)
    linear = torch.nn.Linear(252, 95)  # tails: 252 = 3·64 + 60 bytes, an odd number of rows
    quantized = Int8Linear(linear.weight, linear.bias)
    assert quantized.native and quantized.packed is None
    restored = quantized.integers().float() * quantized.scale[:, None]
    x = torch.randn(7, 252)
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


# bf16 ------------------------------------------------------------------------------------------


class RoundToBF16(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.bfloat16().float()


def bf16_reference(bf16: GPT) -> GPT:
    """A bf16 model's numbers in fp32 arithmetic, as its native step computes them: the bf16 weights
    widened, every product's input rounded to bf16 (the output layer's too), and h_0 (token +
    position, added in bf16 by the bf16 model) rounded to bf16. Its cache: a RoundingCache."""
    reference = copy.deepcopy(bf16).float()
    reference.drop = RoundToBF16()  # what GPT.forward applies to h_0 (a no-op Dropout in eval)
    for block in reference.h:
        for parent, name in (
            (block.attn, "c_attn"),
            (block.attn, "c_proj"),
            (block.mlp, "c_fc"),
            (block.mlp, "c_proj"),
        ):
            setattr(parent, name, nn.Sequential(RoundToBF16(), getattr(parent, name)))
    output = nn.Linear(reference.config.d_model, reference.config.total_vocab_size, bias=False)
    output.weight = reference.wte.weight
    reference.lm_head = nn.Sequential(RoundToBF16(), output)
    return reference


def test_native_bf16_step_multiplies_bf16_activations_and_weights_summed_in_fp32(threads):
    """A bf16 model's decoding step multiplies bf16 weights by activations rounded to bf16 (the
    CPU's bf16 or matrix units), sums in fp32 and keeps bf16 keys and values: on the same cache,
    the fp32 computation on those bf16 numbers, up to an activation that a last-bit difference of
    the fp32 sums rounds to the neighbouring bf16 value now and then (within 2e-3 of the logits'
    range, and at most a quarter of how far PyTorch's own bf16 model is from it); its greedy tokens
    mostly those of the plain bf16 model."""
    torch.manual_seed(0)
    original = GPT(small_config(d_model=60, n_head=5)).eval()
    bf16 = original.to(torch.bfloat16)
    rounded = bf16_reference(bf16)  # fp32 arithmetic on the bf16 numbers
    native_model = decoding_layout(copy.deepcopy(bf16))
    assert native_model.native_step.dtype == native_model.cache_dtype == torch.bfloat16
    prompt, mask, new = left_padded_batch()
    for m in (mask, None):
        cache = prefilled(rounded, prompt, m, RoundingCache)
        ours, reference = (
            native_step(native_model, cache, new, m),
            step(rounded, cache, new, m, RoundingCache),
        )
        assert ours.dtype == torch.float32
        error, scale = (ours - reference).abs().max(), reference.abs().max()
        plain = (step(bf16, cache, new, m).float() - reference).abs().max()
        assert error < 2e-3 * scale and error < plain / 4, (error, scale, plain)
    agree = generate(native_model, prompt[:1], 16, temperature=0) == generate(
        bf16, prompt[:1], 16, temperature=0
    )
    assert agree.float().mean() > 0.9


@pytest.mark.parametrize("rows", [1, 3, 16, 40])
def test_native_linear_computes_what_nn_linear_does(rows, threads):
    torch.manual_seed(0)
    linear = torch.nn.Linear(84, 121)
    ours = NativeLinear(linear.weight, linear.bias)
    x = torch.randn(rows, 84)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), linear(x), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(
            ours.activated(x, "gelu_tanh"),
            torch.nn.functional.gelu(linear(x), approximate="tanh"),
            rtol=1e-5,
            atol=1e-5,
        )
        residual = torch.randn(rows, 121)
        torch.testing.assert_close(ours.add_to(residual, x), residual + linear(x), rtol=1e-5, atol=1e-5)


# The AVX2 and generic builds, against PyTorch -----------------------------------------------------


@pytest.mark.parametrize(
    ("flags", "isa"), [(("-mavx2", "-mfma"), "avx2"), ((), "generic")], ids=["avx2", "generic"]
)
def test_avx2_and_generic_builds_compute_what_pytorch_computes(flags, isa, tmp_path, monkeypatch, threads):
    """The kernels a CPU without AVX-512 runs (AVX2 and FMA; byte-pair sums for int8) and the plain
    loops (the generic build, which gptkit builds but does not decode with), built here with those
    flags and called for every product and step: products, and whole steps on PyTorch's cache, as
    PyTorch computes them (fp32; bf16 against fp32 on the bf16 numbers; int8 against the PyTorch
    int8 reference)."""
    kernels = native.load(native.compile_library(tmp_path / "kernels.so", (*flags, "-fopenmp")))
    assert (kernels.info.isa, kernels.info.openmp > 0) == (isa, True)
    monkeypatch.setattr(native, "loaded", lambda: kernels)  # every native call through this build
    torch.manual_seed(0)
    weight, bias, x = torch.randn(71, 204), torch.randn(71), torch.randn(5, 204)
    y, packed = torch.empty(5, 71), native.pack(weight)
    kernels.product(
        native.matrix(packed, 71, 204, bias), native.FORMATS[torch.float32], x.data_ptr(), 5, y.data_ptr()
    )
    torch.testing.assert_close(y, x @ weight.t() + bias, rtol=1e-5, atol=1e-4)
    half = native.pack(weight.bfloat16())
    kernels.product(
        native.matrix(half, 71, 204, bias), native.FORMATS[torch.bfloat16], x.data_ptr(), 5, y.data_ptr()
    )
    torch.testing.assert_close(
        y, x.bfloat16().float() @ weight.bfloat16().float().t() + bias, rtol=1e-5, atol=1e-4
    )
    quantized = Int8Linear(weight, bias)
    kernels.product(quantized.matrix(), native.FORMATS[torch.int8], x.data_ptr(), 5, y.data_ptr())
    torch.testing.assert_close(y, Rounded7BitLinear(quantized)(x), rtol=1e-4, atol=1e-3)

    original = GPT(small_config(d_model=60, n_head=5)).eval()
    prompt, mask, new = left_padded_batch()
    bf16 = copy.deepcopy(original).to(torch.bfloat16)
    quantized_model = quantize_int8(copy.deepcopy(original))
    for model, reference, atol, kind in (
        (decoding_layout(copy.deepcopy(original)), original, 1e-4, KVCache),
        (decoding_layout(copy.deepcopy(bf16)), bf16_reference(bf16), 1e-4, RoundingCache),
        (quantized_model, int8_reference(original, quantized_model), None, KVCache),
    ):
        assert model.native_step.library is kernels
        cache = prefilled(reference, prompt, mask, kind)
        got, expected = native_step(model, cache, new, mask), step(reference, cache, new, mask, kind)
        if atol is None:  # int8: a level of rounding apart now and then
            assert (got - expected).abs().max() < 1e-3 * expected.abs().max()
        else:
            torch.testing.assert_close(got, expected, rtol=0, atol=atol)


# The off switch --------------------------------------------------------------------------------


def test_gptkit_native_off_switch(monkeypatch):
    monkeypatch.setenv("GPTKIT_NATIVE", "0")
    assert not native.available()
    model = decoding_layout(GPT(small_config()).eval())
    assert model.native_step is None
    quantized = layouts.Int8Linear(torch.randn(8, 16))
    assert not quantized.native and quantized.row_sum is None
    if "fbgemm" in torch.backends.quantized.supported_engines:  # FBGEMM's packing, as before the kernels
        assert quantized.packed is not None
