"""The inference-only Linears of gptkit's decoding layouts (:mod:`gptkit.model.layouts` sets them
up): int8 (:class:`Int8Linear`), oneDNN-packed (:class:`PackedLinear`), transposed
(:class:`TransposedLinear`), bf16 widened for prompts (:class:`WideningLinear`), and the block that
runs them in fewer PyTorch calls (:class:`FusedBlock`). None is trained, saved, copied, moved or
cast.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from gptkit import native
from gptkit.hardware import (
    fbgemm_pack,
    matmul_dtype,
    onednn_linear,
    onednn_linear_add,
    onednn_pack,
)
from gptkit.model.network import ACTIVATIONS, GPT, Block, KVCache

# ``_weight_int8pack_mm`` is a matrix-vector kernel: its time grows with the rows (it reads the matrix
# again for every few), while dequantizing the matrix to bf16 once and multiplying costs about the same
# for 1 row as for hundreds. Measured on the 2-core AVX512-BF16 CPU: a 3072×768 matrix breaks even at
# about 32 rows, GPT-2's 50257×768 output layer at about 190; a 512-token GPT-2 small prompt's first
# token came 2× sooner (0.73 → 0.37 s) from 128 rows on. Used where FBGEMM is missing.
INT8_KERNEL_MAX_ROWS = 128
# int8 products go through FBGEMM's dynamically quantized kernel, which streams the int8 matrix at
# close to the memory's bandwidth where ``_weight_int8pack_mm`` reaches about two thirds of it
# (GPT-2 small's 49 matrices in turn, one row: 3.4 against 4.6 ms). The activations of the rows
# multiplied together share one 8-bit scale, so a call takes at most this many rows: a decoding
# batch in one, a prompt in several, each reading the matrix again (a 512-token prompt of GPT-2 small
# took 0.22 s against 0.35 s through the dequantized matrix).
INT8_DYNAMIC_MAX_ROWS = 16
# Int8Linear quantizes this many rows at a time (4 MB of fp32 temporaries for GPT-2's 768 columns).
QUANTIZE_ROWS_AT_ONCE = 1024
# oneDNN's post-op (name, algorithm) for each activation of ACTIVATIONS, fused into the product.
ONEDNN_ACTIVATIONS = {"gelu_tanh": ("gelu", "tanh"), "gelu": ("gelu", "none"), "relu": ("relu", "")}
# WideningLinear multiplies up to this many rows in bf16, more in fp32 (bf16 weights, bf16 not native).
# A 3072×768 matrix with PyTorch held to AVX2: 4 rows 0.38 ms in bf16 against 0.54 widened, 8 rows
# 0.78 against 0.62, 32 rows 3.1 against 1.1.
WIDENING_MAX_BF16_ROWS = 4
DECODING_LAYOUT = "decoding-layout"  # GPT.inference_layout of a model in the decoding layout


def refuse_move_or_cast(what: str) -> None:
    # .to(), .float(), .cuda() and the like would fail deep inside PyTorch on an opaque tensor, or
    # leave the native step reading memory that the move freed.
    raise ValueError(
        f"a model in the decoding layout ({what}) cannot be moved or cast: "
        "load the original weights again for another device or dtype"
    )


class InferenceLinear(nn.Module):
    """A Linear in an inference layout: ``forward(x)`` = x·Wᵀ + b, and the two products a block
    takes whole, which a layout may fuse into one call (:class:`FusedBlock`)."""

    def activated(self, x: torch.Tensor, activation: str) -> torch.Tensor:
        """act(x·Wᵀ + b), ``activation`` a name of ``ACTIVATIONS``."""
        return ACTIVATIONS[activation](self(x))

    def add_to(self, residual: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """residual + x·Wᵀ + b."""
        return residual + self(x)


class Int8Linear(InferenceLinear):
    """y = x · (scale ⊙ q)ᵀ + b, with int8 ``q`` (out, in) and one fp32 ``scale`` per output row;
    fp32 in and out."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None):
        super().__init__()
        weight = weight.detach()
        integers = torch.empty(weight.shape, dtype=torch.int8, device=weight.device)
        scale = torch.empty(weight.size(0), dtype=torch.float32, device=weight.device)
        # A few rows at a time, so that the fp32 temporaries stay small (for GPT-2's output layer,
        # whole-matrix ones would add twice its 154 MB to the peak memory of loading a model).
        for start in range(0, weight.size(0), QUANTIZE_ROWS_AT_ONCE):
            rows = weight[start : start + QUANTIZE_ROWS_AT_ONCE].float()
            # Symmetric per-row scale: the row's largest magnitude maps to 127 (a zero row stays zero).
            row_scale = rows.abs().amax(dim=1).clamp(min=1e-12) / 127.0
            scale[start : start + rows.size(0)] = row_scale
            integers[start : start + rows.size(0)] = torch.round(rows / row_scale[:, None])
        self.register_buffer("scale", scale)
        self.register_buffer("bias", None if bias is None else bias.detach().float())
        self.out_features, self.in_features = integers.shape
        self.weight_dtype = torch.int8
        # With gptkit's native kernels the integers are packed in their panels, with each row's sum
        # (the activations' zero point needs it); else, on a CPU with FBGEMM, once, prepacked for
        # its int8 product; elsewhere as they are (``weight``, None when packed).
        on_cpu = integers.device.type == "cpu"
        self.native = native.available(integers.device)
        self.packed = fbgemm_pack(integers, scale, self.bias) if on_cpu and not self.native else None
        self.register_buffer("panels", native.pack(integers) if self.native else None)
        self.register_buffer("weight", integers if self.packed is None and not self.native else None)
        self.register_buffer("row_sum", integers.sum(dim=1, dtype=torch.int32) if self.native else None)

    def integers(self) -> torch.Tensor:
        """The int8 matrix q (out, in)."""
        if self.native:
            return native.unpack(self.panels, self.out_features, self.in_features)
        if self.packed is None:
            return self.weight
        return torch.ops.quantized.linear_unpack(self.packed)[0].int_repr()

    def _apply(self, fn, recurse=True):
        if self.native:
            refuse_move_or_cast("int8 weights the native step reads in place")
        return super()._apply(fn, recurse)

    def matrix(self) -> native.Matrix:
        """This matrix as the native kernels take it."""
        return native.matrix(
            self.panels, self.out_features, self.in_features, self.bias, self.scale, self.row_sum
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.float()
        on_cpu = x.device.type == "cpu"
        if on_cpu and self.native:
            return native.product(self.matrix(), torch.int8, x)
        if on_cpu and self.packed is not None:
            # The activations quantized to 8 bits as they come, one scale for every
            # INT8_DYNAMIC_MAX_ROWS rows (a decoding batch: one call), an integer product reading
            # the packed matrix once a call, the bias added.
            if x.numel() <= INT8_DYNAMIC_MAX_ROWS * x.size(-1):
                return torch.ops.quantized.linear_dynamic(x, self.packed, True)
            groups = x.reshape(-1, x.size(-1)).split(INT8_DYNAMIC_MAX_ROWS)
            y = torch.cat([torch.ops.quantized.linear_dynamic(g, self.packed, True) for g in groups])
            return y.view(*x.shape[:-1], -1)
        rows = x.reshape(-1, x.size(-1))
        if on_cpu and rows.size(0) < INT8_KERNEL_MAX_ROWS:
            # Without FBGEMM: PyTorch's weight-only kernel, which never materialises the matrix.
            y = torch.ops.aten._weight_int8pack_mm(rows, self.weight, self.scale)
        else:
            # A prompt's many rows (or not a CPU): the matrix dequantized once, in the dtype this
            # device multiplies fastest (bf16 where it is native), then one matrix product.
            dtype = matmul_dtype(rows.device)
            y = (rows.to(dtype) @ (self.weight.to(dtype) * self.scale.to(dtype)[:, None]).t()).float()
        if self.bias is not None:
            y = y + self.bias
        return y.view(*x.shape[:-1], -1)


class TransposedLinear(InferenceLinear):
    """y = x · W + b with ``weight_t`` = W stored (in, out): ``nn.Linear``'s numbers, another layout."""

    def __init__(self, weight_t: torch.Tensor, bias: torch.Tensor | None = None):
        super().__init__()
        # Parameters (frozen) rather than buffers: the weights are what the model's parameters list.
        self.weight_t = nn.Parameter(weight_t, requires_grad=False)
        self.bias = None if bias is None else nn.Parameter(bias.detach(), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, x.size(-1))
        y = rows @ self.weight_t if self.bias is None else torch.addmm(self.bias, rows, self.weight_t)
        return y.view(*x.shape[:-1], -1)


class PackedLinear(InferenceLinear):
    """y = x · Wᵀ + b through oneDNN, with W prepacked once into its blocked layout (an opaque
    tensor: inference only, on the CPU and in the dtype it was built in, not saved or copied;
    ``in_features``/``out_features`` as nn.Linear's)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None):
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.register_buffer("packed_weight", onednn_pack(weight), persistent=False)
        self.bias = None if bias is None else nn.Parameter(bias.detach(), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return onednn_linear(x, self.packed_weight, self.bias)

    def activated(self, x: torch.Tensor, activation: str) -> torch.Tensor:
        # oneDNN applies the activation as the product's results are written (a post-op).
        return onednn_linear(x, self.packed_weight, self.bias, ONEDNN_ACTIVATIONS[activation])

    def add_to(self, residual: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return onednn_linear_add(x, self.packed_weight, self.bias, residual)

    def _apply(self, fn, recurse=True):
        refuse_move_or_cast("oneDNN-packed weights")


class WideningLinear(InferenceLinear):
    """bf16 weights on a CPU without native bf16: a few rows (decoding) multiplied in bf16, where
    reading half of fp32's bytes wins; more rows (a prompt) in fp32, the matrix widened for the
    product, where PyTorch's bf16 matrix products crawl (GPT-2 small, a 512-token prompt, AVX2:
    1.87 s in bf16 against 0.51 s for fp32 weights)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None):
        super().__init__()
        self.weight = nn.Parameter(weight.detach(), requires_grad=False)
        self.bias = None if bias is None else nn.Parameter(bias.detach(), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.numel() <= WIDENING_MAX_BF16_ROWS * x.size(-1) or matmul_dtype(x.device) == self.weight.dtype:
            return F.linear(x, self.weight, self.bias)
        bias = None if self.bias is None else self.bias.float()
        return F.linear(x.float(), self.weight.float(), bias).to(x.dtype)


def replace_linears(block: Block, convert: Callable[[nn.Linear], nn.Module]) -> Block:
    """Put ``convert(linear)`` in place of the block's four Linears (attention in/out, MLP in/out);
    return the block."""
    for parent, name in (
        (block.attn, "c_attn"),
        (block.attn, "c_proj"),
        (block.mlp, "c_fc"),
        (block.mlp, "c_proj"),
    ):
        setattr(parent, name, convert(getattr(parent, name)))
    return block


def replace_block_linears(model: GPT, convert: Callable[[nn.Linear], nn.Module]) -> None:
    for block in model.h:
        replace_linears(block, convert)


class FusedBlock(Block):
    """A Block whose Linears are in an inference layout (:class:`InferenceLinear`): the same
    computation in fewer PyTorch calls, which is what a decoding step of one token a row spends
    beside reading the weights. Attention is CausalSelfAttention's own; the activation and the
    residual add are fused into the products where the layout can (oneDNN's post-ops); the dropouts,
    which inference skips, are not called.
    GPT-2 small, one token, bf16 oneDNN-packed, a step making these calls against Block's: 6.9
    against 9.8 ms."""

    def __init__(self, block: Block, activation: str):
        nn.Module.__init__(self)
        self.pre_ln, self.activation = block.pre_ln, activation
        self.ln_1, self.attn, self.ln_2, self.mlp = block.ln_1, block.attn, block.ln_2, block.mlp

    def forward(self, x, mask=None, cache: KVCache | None = None, layer: int = 0) -> torch.Tensor:
        attn, mlp = self.attn, self.mlp
        if self.pre_ln:  # GPT-2: x + f(LN(x))
            x = attn.c_proj.add_to(x, attn.attend(self.ln_1(x), mask, cache, layer))
            return mlp.c_proj.add_to(x, mlp.c_fc.activated(self.ln_2(x), self.activation))
        # GPT-1: LN(x + f(x))
        x = self.ln_1(attn.c_proj.add_to(x, attn.attend(x, mask, cache, layer)))
        return self.ln_2(mlp.c_proj.add_to(x, mlp.c_fc.activated(x, self.activation)))


def fuse_blocks(model: GPT) -> None:
    for i, block in enumerate(model.h):
        model.h[i] = FusedBlock(block, model.config.activation)
