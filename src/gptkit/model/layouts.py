"""Inference-only weight formats for decoding, where speed is bounded by the bytes of weights read.

Decoding one token multiplies a vector by every weight matrix once, so its speed is bounded by how
fast the weights stream from memory. Two formats take that bound further than ``nn.Linear``'s:

* **int8** (``quantize_int8``): each matrix as int8 with one scale per output row
  (w ≈ scale_row · q, q ∈ [-127, 127]) reads a quarter of fp32's bytes; activations stay in bf16 and
  PyTorch's ``_weight_int8pack_mm`` kernel multiplies without materialising the dequantized matrix
  (a prompt of ``INT8_KERNEL_MAX_ROWS`` rows or more is multiplied by the dequantized bf16 matrix).
  Every Linear of the blocks and the (tied) output layer are quantized; the embeddings, LayerNorms
  and biases are kept in bf16.
* **decoding layout** (``decoding_layout``): the same numbers in the layouts a CPU's vector-matrix
  products stream fastest. Every matrix (the blocks' and the tied output layer) is prepacked once
  for oneDNN (PyTorch's ``mkldnn`` linear ops), whose product runs on both cores where
  ``nn.Linear``'s BLAS call runs on one: GPT-2 small's 48 block matrices, one token, 2 cores: fp32
  15.7 against 25.5 ms in ``nn.Linear``'s layout (and still ahead for batches of 4-512 rows), bf16
  9.7 against 13.0 ms; the 154 MB fp32 output layer 5-6.6 against 12.7 ms. The token lookup keeps
  its own table, so the embedding is held twice. Where PyTorch lacks the oneDNN ops, or off x86-64
  (where the gain was not measured), fp32 matrices are stored transposed instead, which ``addmm``
  streams faster than ``nn.Linear``'s layout (about 1.2× for the blocks, 1.7× for the output layer,
  which then shares its copy with the lookup), and bf16 is left as it is.

Both are for inference only: such a model is not trained or saved (nor, packed, moved or cast).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn as nn

from gptkit.hardware import has_decoding_layout, onednn_linear, onednn_pack, onednn_packing_available
from gptkit.model.network import GPT

QUANTIZATIONS = ("none", "int8")
# ``_weight_int8pack_mm`` is a matrix-vector kernel: its time grows with the rows (it reads the matrix
# again for every few), while dequantizing the matrix to bf16 once and multiplying costs about the same
# for 1 row as for hundreds. Measured on the 2-core AVX512-BF16 CPU: a 3072×768 matrix breaks even at
# about 32 rows, GPT-2's 50257×768 output layer at about 190; a 512-token GPT-2 small prompt's first
# token came 2× sooner (0.73 → 0.37 s) from 128 rows on. Decoding (a row per sequence) keeps the kernel.
INT8_KERNEL_MAX_ROWS = 128
DECODING_LAYOUT = "decoding-layout"  # GPT.inference_layout of a model in the decoding layout


class Int8Linear(nn.Module):
    """y = x · (scale ⊙ q)ᵀ + b, with int8 ``q`` (out, in) and one bf16 ``scale`` per output row."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None):
        super().__init__()
        weight = weight.detach().float()
        # Symmetric per-row scale: the row's largest magnitude maps to 127 (a zero row stays zero).
        scale = weight.abs().amax(dim=1).clamp(min=1e-12) / 127.0
        self.register_buffer("weight", torch.round(weight / scale[:, None]).to(torch.int8).contiguous())
        self.register_buffer("scale", scale.to(torch.bfloat16))
        self.register_buffer("bias", None if bias is None else bias.detach().to(torch.bfloat16))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, x.size(-1)).to(torch.bfloat16)
        if rows.device.type == "cpu" and rows.size(0) < INT8_KERNEL_MAX_ROWS:
            # PyTorch's fused kernel, which never materialises the matrix: decoding's few rows.
            y = torch.ops.aten._weight_int8pack_mm(rows, self.weight, self.scale)
        else:  # a prompt's many rows (or not a CPU): dequantize once, one bf16 matrix product
            y = rows @ (self.weight.to(torch.bfloat16) * self.scale[:, None]).t()
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*x.shape[:-1], -1)


def _replace_block_linears(model: GPT, convert: Callable[[nn.Linear], nn.Module]) -> None:
    """Put ``convert(linear)`` in place of each block's four Linears (attention in/out, MLP in/out)."""
    for block in model.h:
        for parent, name in (
            (block.attn, "c_attn"),
            (block.attn, "c_proj"),
            (block.mlp, "c_fc"),
            (block.mlp, "c_proj"),
        ):
            setattr(parent, name, convert(getattr(parent, name)))


def quantize_int8(model: GPT) -> GPT:
    """Quantize ``model`` in place (and return it): bf16 everywhere, int8 weights in every Linear
    of the blocks and in the output layer."""
    model.to(torch.bfloat16).eval()
    _replace_block_linears(model, lambda linear: Int8Linear(linear.weight, linear.bias))
    model.lm_head = Int8Linear(model.wte.weight)  # the tied output layer; the lookup keeps wte
    model.inference_layout = "int8"
    return model


class TransposedLinear(nn.Module):
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


class PackedLinear(nn.Module):
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

    def _apply(self, fn, recurse=True):
        # .to(), .float(), .cuda() and the like would fail deep inside PyTorch on the opaque tensor.
        raise ValueError(
            "a model in the decoding layout (oneDNN-packed weights) cannot be moved or cast: "
            "load the original weights again for another device or dtype"
        )


def decoding_layout(model: GPT) -> GPT:
    """Store the model in the layouts CPU decoding streams fastest, in place (and return it). The
    same values; sums in another order (fp32 logits agree to ~1e-6). Inference only, on a CPU.

    With oneDNN: the blocks' Linears and the tied output layer prepacked (the lookup keeps its
    table, so the embedding is held twice). Without (fp32 only): the blocks' matrices transposed,
    the output layer and the lookup sharing one transposed copy of the embedding.
    """
    weight = model.wte.weight
    if not has_decoding_layout(weight.dtype, weight.device):
        raise ValueError(
            f"the decoding layout is for fp32 (or natively supported bf16) models on a CPU, "
            f"not {weight.dtype} on {weight.device}"
        )
    model.eval().requires_grad_(False)  # inference only: packed matrices have no gradient
    with torch.no_grad():
        if onednn_packing_available():
            _replace_block_linears(model, lambda linear: PackedLinear(linear.weight, linear.bias))
            model.lm_head = PackedLinear(weight)
        else:
            _replace_block_linears(
                model, lambda linear: TransposedLinear(linear.weight.t().contiguous(), linear.bias)
            )
            embedding_t = weight.detach().t().contiguous()  # (d, V)
            model.lm_head = TransposedLinear(embedding_t)
            # The lookup reads rows of the same storage (a strided view): no second copy of the table.
            model.wte.weight = nn.Parameter(embedding_t.t(), requires_grad=False)
    model.inference_layout = DECODING_LAYOUT
    return model
