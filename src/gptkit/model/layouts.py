"""Inference-only weight formats for decoding, where speed is bounded by the bytes of weights read.

Decoding one token multiplies a vector by every weight matrix once, so its speed is bounded by how
fast the weights stream from memory. Two formats take that bound further than ``nn.Linear``'s:

* **int8** (``quantize_int8``, or ``load_int8`` while loading): each matrix as int8 with one scale per output row
  (w ≈ scale_row · q, q ∈ [-127, 127]) reads a quarter of fp32's bytes. Every Linear of the blocks
  and the (tied) output layer are quantized; LayerNorms, biases, attention and the residual stream
  stay fp32, and the token lookup table is kept in bf16 (a step reads one row of it). The products:
  gptkit's native int8 kernel where :mod:`gptkit.native` is built (each row of activations rounded
  to 7 bits with a zero point, integers multiplied), else FBGEMM's dynamically quantized kernel on
  x86-64 (the same rounding, one scale for every ``INT8_DYNAMIC_MAX_ROWS`` rows), else PyTorch's
  weight-only ``_weight_int8pack_mm`` for a few rows and the matrix dequantized to the dtype the
  device multiplies fastest for many.
* **decoding layout** (``decoding_layout``): the same numbers, set up for the CPU's decoding. With
  :mod:`gptkit.native`, :func:`native_layout`: the weights where they are (fp32 or bf16), and a
  decoding step's blocks in one native call (:class:`NativeStep`). Without it, PyTorch's layouts:
  every matrix (the blocks' and the tied output layer) prepacked once for oneDNN (PyTorch's
  ``mkldnn`` linear ops), whose product runs on both cores where ``nn.Linear``'s BLAS call runs on
  one: GPT-2 small's 48 block matrices, one token, 2 cores: fp32 15.7 against 25.5 ms in
  ``nn.Linear``'s layout (and still ahead for batches of 4-512 rows), bf16 9.7 against 13.0 ms; the
  154 MB fp32 output layer 5-6.6 against 12.7 ms. The token lookup keeps its own table, so the
  embedding is held twice. Where PyTorch lacks the oneDNN ops, or off x86-64 (where the gain was
  not measured), fp32 matrices are stored transposed instead, which ``addmm`` streams faster than
  ``nn.Linear``'s layout (about 1.2× for the blocks, 1.7× for the output layer, which then shares
  its copy with the lookup), and bf16 is left as it is.

In both, a prompt's blocks run as a :class:`FusedBlock`: the same computation in fewer PyTorch
calls, with the activation and the residual add fused into the products where the layout allows.

Both are for inference only: such a model is not trained, saved, copied, moved or cast.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn as nn

from gptkit import native
from gptkit.hardware import has_decoding_layout, packs_for_onednn, release_freed_memory
from gptkit.model.linears import (  # noqa: F401 (the layouts' Linears, importable from here)
    DECODING_LAYOUT,
    FusedBlock,
    InferenceLinear,
    Int8Linear,
    PackedLinear,
    TransposedLinear,
    WideningLinear,
    fuse_blocks,
    replace_block_linears,
    replace_linears,
)
from gptkit.model.native_step import NativeLinear, NativeStep, native_layout  # noqa: F401
from gptkit.model.network import GPT, Block

QUANTIZATIONS = ("none", "int8")


def _int8_linear(linear: nn.Linear) -> Int8Linear:
    return Int8Linear(linear.weight, linear.bias)


def _int8_block(block: Block) -> Block:
    block = replace_linears(block, _int8_linear)
    release_freed_memory()  # the block's fp32 weights and temporaries, freed just now
    return block


def _int8_output_layer(model: GPT) -> None:
    """The tied output layer as its own int8 copy, and the token lookup table in bf16: a step looks
    up one row, added to fp32 positions, fp32 from there on."""
    model.lm_head = Int8Linear(model.wte.weight)
    model.wte.to(torch.bfloat16)


def quantize_int8(model: GPT) -> GPT:
    """Quantize ``model`` in place (and return it): int8 weights in every Linear of the blocks and
    in the output layer, fp32 activations (LayerNorms, biases, attention, the residual stream), and
    the token lookup table in bf16 (each step reads one row of it; the output layer has its own
    int8 copy). To load a model and quantize it, :func:`load_int8` holds less memory on the way."""
    model.float().eval()
    replace_block_linears(model, _int8_linear)
    _int8_output_layer(model)
    return _int8_decoding(model)


def _int8_decoding(model: GPT) -> GPT:
    """The last step of an int8 layout: decoding steps through the native step where the matrices
    were quantized for it, else blocks fused for PyTorch's calls."""
    if model.lm_head.native:
        model.native_step = NativeStep(model)
    fuse_blocks(model)
    model.inference_layout = "int8"
    return model


def load_int8(source: str | Path, *, device: str | torch.device | None = None, n_head: int = 12) -> GPT:
    """``quantize_int8(GPT.from_pretrained(source))`` with less memory on the way: the output layer
    is quantized as soon as the embedding is read, then each block as soon as it is read, so the
    load holds the fp32 embedding or one fp32 block beside what is already int8, never the whole
    fp32 model. The same numbers: every weight is read in fp32 and rounded once."""
    model = GPT.from_pretrained(
        source,
        dtype=torch.float32,
        device=device,
        n_head=n_head,
        convert_embeddings=_int8_output_layer,
        convert_block=_int8_block,
    )
    return _int8_decoding(model)


def decoding_layout(model: GPT) -> GPT:
    """Store the model in the layouts CPU decoding streams fastest, in place (and return it). The
    same values; sums in another order (fp32 logits agree to ~1e-6). Inference only, on a CPU.

    With gptkit's native kernels (:mod:`gptkit.native`, built on first use): :func:`native_layout`,
    the weights where they are and every decoding step in one native call. Where they are not used
    (not built, or without vector code and threads for this CPU; one warning says why), PyTorch's
    layouts: fp32, and bf16 where the CPU multiplies it natively, with oneDNN: the
    blocks' Linears and the tied output layer prepacked (the lookup keeps its table, so the
    embedding is held twice). fp32 without oneDNN: the blocks' matrices transposed, the output
    layer and the lookup sharing one transposed copy of the embedding. bf16 without native bf16:
    :class:`WideningLinear`, the output layer sharing the lookup's table. Each block then runs as a
    :class:`FusedBlock`.
    """
    weight = model.wte.weight
    if not has_decoding_layout(weight.dtype, weight.device):
        raise ValueError(
            f"the decoding layout is for fp32 or bf16 models on a CPU, not {weight.dtype} on {weight.device}"
        )
    if native.available(weight.device):
        return native_layout(model)
    model.eval().requires_grad_(False)  # inference only: packed matrices have no gradient
    with torch.no_grad():
        if packs_for_onednn(weight.dtype, weight.device):
            replace_block_linears(model, lambda linear: PackedLinear(linear.weight, linear.bias))
            model.lm_head = PackedLinear(weight)
        elif weight.dtype == torch.float32:
            replace_block_linears(
                model, lambda linear: TransposedLinear(linear.weight.t().contiguous(), linear.bias)
            )
            embedding_t = weight.detach().t().contiguous()  # (d, V)
            model.lm_head = TransposedLinear(embedding_t)
            # The lookup reads rows of the same storage (a strided view): no second copy of the table.
            model.wte.weight = nn.Parameter(embedding_t.t(), requires_grad=False)
        else:
            replace_block_linears(model, lambda linear: WideningLinear(linear.weight, linear.bias))
            model.lm_head = WideningLinear(weight)  # the lookup's own table, not a copy
        fuse_blocks(model)
    model.inference_layout = DECODING_LAYOUT
    return model
