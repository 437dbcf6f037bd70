"""A decoding step's blocks in one call of gptkit's native kernels (:mod:`gptkit.native`): the
model's Linears as :class:`NativeLinear` (the weights where they are, read by the native kernels for a
decoding step and by oneDNN or PyTorch for a prompt), and :class:`NativeStep`, which
``GPT.forward`` calls for a decoding step it applies to.
"""

from __future__ import annotations

import ctypes

import torch
import torch.nn as nn
import torch.nn.functional as F

from gptkit import native
from gptkit.hardware import matmul_dtype, onednn_linear, onednn_linear_add, packs_for_onednn
from gptkit.model.linears import (
    DECODING_LAYOUT,
    ONEDNN_ACTIVATIONS,
    InferenceLinear,
    Int8Linear,
    fuse_blocks,
    refuse_move_or_cast,
    replace_block_linears,
)
from gptkit.model.network import ACTIVATIONS, GPT, KVCache

# The native step's codes for ACTIVATIONS (Step.activation in interface.h).
NATIVE_ACTIVATIONS = {"gelu_tanh": 0, "gelu": 1, "relu": 2}


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
        return native.matrix(self.weight.detach(), self.bias32)

    def _apply(self, fn, recurse=True):
        refuse_move_or_cast("weights the native step reads in place")

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
            return native.product(self.matrix(), self.weight.dtype, x).to(x.dtype)
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


def _blocks_dtype(linears: list[nn.Module]) -> torch.dtype:
    """The one dtype of the blocks' layers, which the native step takes: all NativeLinear (fp32 or
    bf16) or all int8 quantized for the native kernels."""
    kinds = {type(linear) for linear in linears}
    if kinds not in ({NativeLinear}, {Int8Linear}):
        raise ValueError(
            f"the native step takes NativeLinear or native int8 blocks, not {sorted(k.__name__ for k in kinds)}"
        )
    if kinds == {Int8Linear} and not all(linear.native for linear in linears):
        raise ValueError("the int8 blocks were quantized without the native kernels")
    dtypes = {linear.weight.dtype for linear in linears}
    if len(dtypes) != 1 or not dtypes <= set(native.FORMATS):
        raise ValueError(f"the native step takes blocks of one dtype among fp32, bf16 and int8, not {dtypes}")
    return dtypes.pop()


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
        self.dtype = _blocks_dtype([linear for four in linears for linear in four])
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
    replace_block_linears(model, lambda linear: NativeLinear(linear.weight, linear.bias))
    model.lm_head = NativeLinear(weight)
    model.native_step = NativeStep(model)
    fuse_blocks(model)  # a prompt's blocks: oneDNN's fused activation and residual add
    model.inference_layout = DECODING_LAYOUT
    return model
