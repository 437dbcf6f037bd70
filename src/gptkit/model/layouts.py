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

import ctypes
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

from gptkit import native
from gptkit.hardware import (
    fbgemm_pack,
    has_decoding_layout,
    matmul_dtype,
    onednn_linear,
    onednn_linear_add,
    onednn_pack,
    packs_for_onednn,
    release_freed_memory,
)
from gptkit.model.network import ACTIVATIONS, GPT, Block, KVCache

QUANTIZATIONS = ("none", "int8")
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


def _refuse_move_or_cast(what: str) -> None:
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
        # With gptkit's native kernels the integers are held as they are, with each row's sum (the
        # activations' zero point needs it); else, on a CPU with FBGEMM, once, prepacked for its
        # int8 product; elsewhere as they are (``weight``, None when packed).
        on_cpu = integers.device.type == "cpu"
        self.native = native.available(integers.device)
        self.packed = fbgemm_pack(integers, scale, self.bias) if on_cpu and not self.native else None
        self.register_buffer("weight", integers if self.packed is None else None)
        self.register_buffer("row_sum", integers.sum(dim=1, dtype=torch.int32) if self.native else None)

    def integers(self) -> torch.Tensor:
        """The int8 matrix q (out, in)."""
        if self.packed is None:
            return self.weight
        return torch.ops.quantized.linear_unpack(self.packed)[0].int_repr()

    def _apply(self, fn, recurse=True):
        if self.native:
            _refuse_move_or_cast("int8 weights the native step reads in place")
        return super()._apply(fn, recurse)

    def matrix(self) -> native.Matrix:
        """This matrix as the native kernels take it."""
        return native_matrix(self.weight, self.bias, self.scale, self.row_sum)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.float()
        on_cpu = x.device.type == "cpu"
        if on_cpu and self.native:
            return native_product(self.matrix(), torch.int8, x)
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


def _replace_linears(block: Block, convert: Callable[[nn.Linear], nn.Module]) -> Block:
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


def _replace_block_linears(model: GPT, convert: Callable[[nn.Linear], nn.Module]) -> None:
    for block in model.h:
        _replace_linears(block, convert)


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


def _fuse_blocks(model: GPT) -> None:
    for i, block in enumerate(model.h):
        model.h[i] = FusedBlock(block, model.config.activation)


def _int8_linear(linear: nn.Linear) -> Int8Linear:
    return Int8Linear(linear.weight, linear.bias)


def _int8_block(block: Block) -> Block:
    block = _replace_linears(block, _int8_linear)
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
    _replace_block_linears(model, _int8_linear)
    _int8_output_layer(model)
    return _int8_decoding(model)


def _int8_decoding(model: GPT) -> GPT:
    """The last step of an int8 layout: decoding steps through the native step where the matrices
    were quantized for it, else blocks fused for PyTorch's calls."""
    if model.lm_head.native:
        model.native_step = NativeStep(model)
    _fuse_blocks(model)
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


# --- gptkit's native kernels (gptkit.native): the decoding step in one call -------------------------

# decode_step.cpp's codes for ACTIVATIONS.
NATIVE_ACTIVATIONS = {"gelu_tanh": 0, "gelu": 1, "relu": 2}


def native_matrix(
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    scale: torch.Tensor | None = None,
    row_sum: torch.Tensor | None = None,
) -> native.Matrix:
    """A matrix (out, in) as the native kernels take it: fp32 weights, or int8 with each row's scale
    and integer sum. The tensors must outlive the matrix (the model holds them)."""
    pointer = native.pointer
    return native.Matrix(
        pointer(weight), pointer(bias), pointer(scale), pointer(row_sum), weight.size(0), weight.size(1)
    )


def native_product(matrix: native.Matrix, dtype: torch.dtype, x: torch.Tensor) -> torch.Tensor:
    """x·Wᵀ + b through the native kernels, W stored in ``dtype``, for any leading shape of ``x``;
    fp32 out."""
    if x.size(-1) != matrix.in_:
        raise ValueError(f"input of {x.size(-1)} features for a matrix of {matrix.in_} inputs")
    rows = x.reshape(-1, x.size(-1)).float().contiguous()
    y = torch.empty(rows.size(0), matrix.out, dtype=torch.float32)
    native.loaded().product(matrix, native.FORMATS[dtype], rows.data_ptr(), rows.size(0), y.data_ptr())
    return y.view(*x.shape[:-1], matrix.out)


class NativeLinear(InferenceLinear):
    """x·Wᵀ + b of an fp32 or bf16 matrix held as nn.Linear holds it (the same Parameters, not a
    copy): a few rows (decoding) through the native product, which streams the matrix on every
    core; more rows (a prompt) through oneDNN on the same weights where PyTorch has its ops and the
    CPU multiplies the dtype natively (the activation or the residual add fused in; 1.05-1.5×
    ``F.linear`` for GPT-2 small's fp32 matrices and 512 rows, no faster prepacked), else
    ``F.linear``, bf16 widened to fp32 where bf16 is not native. The output layer's weight is the
    token table itself. Its results have the input's dtype."""

    def __init__(self, weight: nn.Parameter, bias: nn.Parameter | None = None):
        super().__init__()
        self.weight, self.bias = weight, bias
        # The native kernels add an fp32 bias (a copy only where the bias is bf16).
        self.bias32 = None if bias is None else bias.detach().float()
        self._onednn = packs_for_onednn(weight.dtype, weight.device)

    def matrix(self) -> native.Matrix:
        """This matrix as the native kernels take it (built for each call: never stale)."""
        return native_matrix(self.weight.detach(), self.bias32)

    def _apply(self, fn, recurse=True):
        _refuse_move_or_cast("weights the native step reads in place")

    def _few_rows(self, x: torch.Tensor) -> bool:
        return x.numel() <= NATIVE_MAX_ROWS * x.size(-1) and x.device.type == "cpu"

    def _many_rows(self, x: torch.Tensor, activation: str | None = None) -> torch.Tensor:
        if self._onednn:
            post_op = ("none", "") if activation is None else ONEDNN_ACTIVATIONS[activation]
            return onednn_linear(x.to(self.weight.dtype), self.weight, self.bias, post_op)
        # PyTorch's own product, in fp32 where bf16 is not native (its bf16 products crawl there).
        dtype = matmul_dtype(x.device) if self.weight.dtype == torch.bfloat16 else self.weight.dtype
        bias = None if self.bias is None else self.bias.to(dtype)
        y = F.linear(x.to(dtype), self.weight.to(dtype), bias)
        return (y if activation is None else ACTIVATIONS[activation](y)).to(x.dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self._few_rows(x):
            return native_product(self.matrix(), self.weight.dtype, x).to(x.dtype)
        return self._many_rows(x)

    def activated(self, x: torch.Tensor, activation: str) -> torch.Tensor:
        if self._few_rows(x):
            return ACTIVATIONS[activation](self(x))
        return self._many_rows(x, activation)

    def add_to(self, residual: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        if self._onednn and not self._few_rows(x):
            return onednn_linear_add(x, self.weight, self.bias, residual)
        return residual + self(x)


# The native float product runs at most this many rows; more (a prompt) go to a matrix product,
# which blocks for the caches where the native one reads each matrix row once per row.
NATIVE_MAX_ROWS = 16


class NativeStep:
    """Every block of a GPT (and GPT-2's final LayerNorm) for the one new token of each row, in one
    call of ``gptkit.native``'s decoding step: what ``GPT.forward`` runs for a decoding step (one
    token a row, a KV cache, no gradient) of a model in a native layout. The same computation as the
    blocks (fp32 hidden states within ~1e-6): the products on this CPU's vector units, split between
    the cores, and the work between them without PyTorch's per-operator overhead (GPT-2 small: ~200
    operator calls a token)."""

    def __init__(self, model: GPT):
        config = model.config
        linears = [
            (block.attn.c_attn, block.attn.c_proj, block.mlp.c_fc, block.mlp.c_proj) for block in model.h
        ]
        kinds = {type(linear) for four in linears for linear in four}
        if kinds not in ({NativeLinear}, {Int8Linear}):
            raise ValueError(
                f"the native step takes NativeLinear or native int8 blocks, not {sorted(k.__name__ for k in kinds)}"
            )
        if kinds == {Int8Linear} and not all(linear.native for four in linears for linear in four):
            raise ValueError("the int8 blocks were quantized without the native kernels")
        dtypes = {linear.weight.dtype for four in linears for linear in four}
        if len(dtypes) != 1 or not dtypes <= set(native.FORMATS):
            raise ValueError(
                f"the native step takes blocks of one dtype among fp32, bf16 and int8, not {dtypes}"
            )
        self.dtype = dtypes.pop()
        self.shape = (config.n_layer, config.n_head, config.head_size)
        # Every tensor the step points at, held here too: the addresses stay valid even if the
        # model's modules are replaced (the LayerNorms as fp32 copies where the model is bf16).
        self.tensors: list[torch.Tensor] = [
            t
            for four in linears
            for linear in four
            for t in (
                linear.weight,
                getattr(linear, "bias32", linear.bias),
                getattr(linear, "scale", None),
                getattr(linear, "row_sum", None),
            )
            if t is not None
        ]

        def fp32(tensor: torch.Tensor | None) -> int | None:
            if tensor is None:
                return None
            self.tensors.append(tensor.detach().float().contiguous())
            return native.pointer(self.tensors[-1])

        self.layers = (native.Layer * config.n_layer)()
        for layer, block, (qkv, attn_out, fc, mlp_out) in zip(self.layers, model.h, linears):
            layer.ln1_weight, layer.ln1_bias = fp32(block.ln_1.weight), fp32(block.ln_1.bias)
            layer.ln2_weight, layer.ln2_bias = fp32(block.ln_2.weight), fp32(block.ln_2.bias)
            layer.qkv, layer.attn_out = qkv.matrix(), attn_out.matrix()
            layer.fc, layer.mlp_out = fc.matrix(), mlp_out.matrix()
        final = model.ln_f
        self.sizes = dict(
            n_layer=config.n_layer,
            d_model=config.d_model,
            n_head=config.n_head,
            pre_ln=int(config.ln_position == "pre"),
            activation=NATIVE_ACTIVATIONS[config.activation],
            format=native.FORMATS[self.dtype],
            eps=config.layer_norm_eps,
            layers=ctypes.addressof(self.layers),
            lnf_weight=None if final is None else fp32(final.weight),
            lnf_bias=None if final is None else fp32(final.bias),
        )
        self.library = native.loaded()
        # Decoding steps this step has run (the tests' proof that a model decoded through it).
        self.calls = 0

    def __deepcopy__(self, memo):
        # The step holds the addresses of the model's tensors: a copy would read the original's.
        raise TypeError(
            "a model in a native decoding layout cannot be copied: copy the original model, then apply the layout"
        )

    def applies(self, x: torch.Tensor, cache: KVCache | None, attention_mask: torch.Tensor | None) -> bool:
        """Whether this call of GPT.forward is a decoding step the native step runs: one new token a
        row, no gradient, a CPU cache of this model's fp32 keys and values (a server's has a slot per
        sequence, the first in use) with room for the token, and a mask the step can read. Anything
        else (a full cache among it) takes PyTorch's blocks, which say what is wrong."""
        if cache is None or x.size(1) != 1 or torch.is_grad_enabled() or x.device.type != "cpu":
            return False
        keys, values = getattr(cache, "keys", None), getattr(cache, "values", None)
        if not isinstance(keys, torch.Tensor) or not isinstance(values, torch.Tensor):
            return False
        layers, heads, head_size = self.shape
        past, rows = cache.length, x.size(0)
        return (
            x.dtype in (torch.float32, torch.bfloat16)
            and keys.shape == values.shape
            and keys.dim() == 5
            and (keys.size(0), keys.size(2), keys.size(4)) == (layers, heads, head_size)
            and keys.size(1) >= rows
            and past < keys.size(3)
            and keys.dtype == values.dtype == torch.float32
            and keys.device.type == values.device.type == "cpu"
            and keys.is_contiguous()
            and values.is_contiguous()
            and (
                attention_mask is None
                or (
                    attention_mask.dim() == 2
                    and attention_mask.size(0) in (1, rows)
                    and attention_mask.size(1) > past
                )
            )
        )

    def __call__(self, x: torch.Tensor, cache: KVCache, attention_mask: torch.Tensor | None) -> torch.Tensor:
        """h_n (B, 1, d), fp32, from h_0 (B, 1, d), writing the new keys and values at
        ``cache.length`` (the caller advances the cache)."""
        x = x.to(torch.float32, copy=True).contiguous()  # written in place
        mask, positions = None, cache.length + 1
        if attention_mask is not None:  # (rows, past + 1), as the blocks read it
            mask = (
                attention_mask[:, :positions].ne(0).expand(x.size(0), positions).to(torch.uint8).contiguous()
            )
        step = native.Step(
            **self.sizes,
            rows=x.size(0),
            capacity=cache.keys.size(3),
            past=cache.length,
            cache_rows=cache.keys.size(1),
            keys=cache.keys.data_ptr(),
            values=cache.values.data_ptr(),
            mask=None if mask is None else mask.data_ptr(),
            x=x.data_ptr(),
        )
        self.library.decode_step(step)
        self.calls += 1
        return x

    def products(self, rows: int = 1) -> None:
        """The step's block products alone, for ``rows`` rows (their results discarded): how long a
        step spends streaming its matrices, measured apart from what it spends around them."""
        self.library.step_products(native.Step(**self.sizes, rows=rows))


def native_layout(model: GPT) -> GPT:
    """An fp32 or bf16 model (on a CPU, with ``gptkit.native`` at hand) set up to decode through the
    native step, in place: the weights stay where they are, read by the native kernels for a
    decoding step and by a matrix product for a prompt (:class:`NativeLinear`); the output layer
    reads the token table itself. A decoding step's hidden states are fp32 in both (a bf16 model's
    logits come out fp32). Inference only."""
    weight = model.wte.weight
    if weight.dtype not in (torch.float32, torch.bfloat16) or not native.available(weight.device):
        raise ValueError(
            f"the native layout is for fp32 or bf16 models on a CPU with gptkit.native, not {weight.dtype} on {weight.device}"
        )
    model.eval().requires_grad_(False)
    _replace_block_linears(model, lambda linear: NativeLinear(linear.weight, linear.bias))
    model.lm_head = NativeLinear(weight)
    model.native_step = NativeStep(model)
    _fuse_blocks(model)  # a prompt's blocks: oneDNN's fused activation and residual add
    model.inference_layout = DECODING_LAYOUT
    return model


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
        _refuse_move_or_cast("oneDNN-packed weights")


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
            _replace_block_linears(model, lambda linear: PackedLinear(linear.weight, linear.bias))
            model.lm_head = PackedLinear(weight)
        elif weight.dtype == torch.float32:
            _replace_block_linears(
                model, lambda linear: TransposedLinear(linear.weight.t().contiguous(), linear.bias)
            )
            embedding_t = weight.detach().t().contiguous()  # (d, V)
            model.lm_head = TransposedLinear(embedding_t)
            # The lookup reads rows of the same storage (a strided view): no second copy of the table.
            model.wte.weight = nn.Parameter(embedding_t.t(), requires_grad=False)
        else:
            _replace_block_linears(model, lambda linear: WideningLinear(linear.weight, linear.bias))
            model.lm_head = WideningLinear(weight)  # the lookup's own table, not a copy
        _fuse_blocks(model)
    model.inference_layout = DECODING_LAYOUT
    return model
