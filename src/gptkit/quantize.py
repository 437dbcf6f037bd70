"""Inference-only weight formats for decoding, where speed is bounded by the bytes of weights read.

Decoding one token multiplies a vector by every weight matrix once, so its speed is bounded by how
fast the weights stream from memory. Two formats take that bound further than ``nn.Linear``'s:

* **int8** (``quantize_int8``): each matrix as int8 with one scale per output row
  (w ≈ scale_row · q, q ∈ [-127, 127]) reads a quarter of fp32's bytes; activations stay in bf16 and
  PyTorch's ``_weight_int8pack_mm`` kernel multiplies without materialising the dequantized matrix.
  Every Linear of the blocks and the (tied) output layer are quantized; the embeddings, LayerNorms
  and biases are kept in bf16.
* **fp32, transposed** (``transpose_for_decoding``): the same fp32 numbers stored (in, out). On a CPU
  a vector-matrix product over that layout streams the matrix faster than ``nn.Linear``'s (out, in)
  (measured on GPT-2 small's matrices, 2 cores: 29 against 37 ms per token for the matrix products;
  bf16 gains nothing from it, so it is fp32 only). The tied output layer and the token lookup share
  one transposed copy of the embedding.

Both are for inference only: such a model is not trained or saved.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn as nn

from gptkit.model import GPT

QUANTIZATIONS = ("none", "int8")
TRANSPOSED = "fp32-transposed"  # GPT.quantized of a model in the transposed decoding layout


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
        if rows.device.type == "cpu":  # PyTorch's fused kernel: never materialises the matrix
            y = torch.ops.aten._weight_int8pack_mm(rows, self.weight, self.scale)
        else:
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
    model.quantized = "int8"
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


def transpose_for_decoding(model: GPT) -> GPT:
    """Store every Linear of the blocks and the tied output layer transposed, in place (and return
    the model): the same fp32 values, a layout CPU decoding streams faster. Inference only."""
    model.eval()
    with torch.no_grad():
        _replace_block_linears(
            model, lambda linear: TransposedLinear(linear.weight.t().contiguous(), linear.bias)
        )
        embedding_t = model.wte.weight.detach().t().contiguous()  # (d, V)
        model.lm_head = TransposedLinear(embedding_t)
        # The lookup reads rows of the same storage (a strided view): no second copy of the table.
        model.wte.weight = nn.Parameter(embedding_t.t(), requires_grad=False)
    model.quantized = TRANSPOSED
    return model
