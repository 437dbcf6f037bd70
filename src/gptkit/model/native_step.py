"""A model's blocks in one call of gptkit's native kernels (:mod:`gptkit.native`): the model's
Linears as :class:`NativeLinear` (their weights packed once in the kernels' panels), and
:class:`NativeStep`, which ``GPT.forward`` calls for the tokens of a prompt or a decoding step over
a KV cache, and which a server's engine calls for a step of many sequences over its paged cache.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

import torch
import torch.nn as nn

from gptkit import native
from gptkit.model.linears import (
    DECODING_LAYOUT,
    InferenceLinear,
    Int8Linear,
    fuse_blocks,
    refuse_move_or_cast,
    replace_block_linears,
)
from gptkit.model.network import GPT, KVCache

# The native step's codes for ACTIVATIONS (Step.activation in interface.h).
NATIVE_ACTIVATIONS = {"gelu_tanh": 0, "gelu": 1, "relu": 2}


class NativeLinear(InferenceLinear):
    """x·Wᵀ + b of an fp32 or bf16 matrix packed once in the native kernels' panels
    (:func:`gptkit.native.pack`: 16 outputs a panel, read front to back by every row of a product at
    once), for any number of rows; bf16 products round the activations to bf16 and sum in fp32. The
    original (out, in) weight is not kept. Its results have the input's dtype."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None):
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.weight_dtype = weight.dtype
        self.register_buffer("packed", native.pack(weight.detach()), persistent=False)
        # The native kernels add an fp32 bias (a copy where the bias is bf16).
        self.register_buffer(
            "bias32", None if bias is None else bias.detach().float().contiguous(), persistent=False
        )

    def matrix(self) -> native.Matrix:
        """This matrix as the native kernels take it (built for each call: never stale)."""
        return native.matrix(self.packed, self.out_features, self.in_features, self.bias32)

    def unpacked(self) -> torch.Tensor:
        """The matrix (out, in), unpacked (a copy: for tests and inspection)."""
        return native.unpack(self.packed, self.out_features, self.in_features)

    def _apply(self, fn, recurse=True):
        refuse_move_or_cast("weights packed for the native kernels")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return native.product(self.matrix(), self.weight_dtype, x).to(x.dtype)


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
    dtypes = {linear.weight_dtype for linear in linears}
    if len(dtypes) != 1 or not dtypes <= set(native.FORMATS):
        raise ValueError(f"the native step takes blocks of one dtype among fp32, bf16 and int8, not {dtypes}")
    return dtypes.pop()


@dataclass
class StepTokens:
    """The tokens of one call of :meth:`NativeStep.run` and where their keys and values go.

    ``x`` (tokens, d) holds h_0, fp32, and is overwritten with h_n. Token t belongs to sequence
    ``sequence[t]`` (a row of ``block_table``) and writes its key and value at column ``column[t]``
    of it, attending to its columns 0..column[t]. The cache's ``keys`` and ``values`` are (n_layer,
    pages, n_head, page_size, head_size) in fp32 or bf16; ``block_table`` (sequences, width) int32
    gives the page of each page_size columns of a sequence. ``mask`` (sequences, width) uint8: 0 for a
    padding column (None: every column is real)."""

    x: torch.Tensor
    sequence: torch.Tensor
    column: torch.Tensor
    keys: torch.Tensor
    values: torch.Tensor
    block_table: torch.Tensor
    mask: torch.Tensor | None = None


class NativeStep:
    """Every block of a GPT (and GPT-2's final LayerNorm, and where asked the output layer and its
    argmax) in one call of ``gptkit.native``'s step, for tokens of any sequences: what
    ``GPT.forward`` runs over a KV cache for a model in a native layout (:meth:`__call__`), and what
    a server's engine runs for a step of many sequences over its paged cache (:meth:`run`). The
    same computation as the blocks; a token's numbers do not depend on the tokens beside it."""

    def __init__(self, model: GPT):
        config = model.config
        linears = [
            (block.attn.c_attn, block.attn.c_proj, block.mlp.c_fc, block.mlp.c_proj) for block in model.h
        ]
        self.dtype = _blocks_dtype([linear for four in linears for linear in four])
        # The cache the step reads: bf16 with bf16 weights (half the bytes of attention's reads), fp32
        # with fp32 or int8 weights.
        self.cache_dtype = torch.bfloat16 if self.dtype == torch.bfloat16 else torch.float32
        self.shape = (config.n_layer, config.n_head, config.head_size)
        self.lm_head = model.lm_head
        self.tensors: list[torch.Tensor] = []  # every tensor the step points at, held here too

        def fp32(tensor: torch.Tensor | None) -> int | None:
            if tensor is None:
                return None
            self.tensors.append(tensor.detach().float().contiguous())
            return native.pointer(self.tensors[-1])

        self.layers = (native.Layer * config.n_layer)()
        for layer, block, (qkv, attn_out, fc, mlp_out) in zip(self.layers, model.h, linears):
            self.tensors += [t for linear in (qkv, attn_out, fc, mlp_out) for t in linear.buffers()]
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
        # Calls this step has run (the tests' proof that a model ran through it).
        self.calls = 0

    def __deepcopy__(self, memo):
        # The step holds the addresses of the model's tensors: a copy would read the original's.
        raise TypeError(
            "a model in a native decoding layout cannot be copied: copy the original model, then apply the layout"
        )

    def applies(self, x: torch.Tensor, cache: KVCache | None, attention_mask: torch.Tensor | None) -> bool:
        """Whether this call of GPT.forward runs here: no gradient, a CPU cache of this model's keys
        and values in the step's dtype, contiguous (a server's may have more rows than the batch),
        with room for the tokens, and a mask the step can read. Anything else (no cache, a full cache)
        takes PyTorch's blocks, which say what is wrong."""
        if cache is None or torch.is_grad_enabled() or x.device.type != "cpu":
            return False
        keys, values = getattr(cache, "keys", None), getattr(cache, "values", None)
        if not isinstance(keys, torch.Tensor) or not isinstance(values, torch.Tensor):
            return False
        layers, heads, head_size = self.shape
        past, (rows, length) = cache.length, x.shape[:2]
        return (
            x.dtype in (torch.float32, torch.bfloat16)
            and keys.shape == values.shape
            and keys.dim() == 5
            and (keys.size(0), keys.size(2), keys.size(4)) == (layers, heads, head_size)
            and keys.size(1) >= rows
            and past + length <= keys.size(3)
            and keys.dtype == values.dtype == self.cache_dtype
            and keys.device.type == values.device.type == "cpu"
            and keys.is_contiguous()
            and values.is_contiguous()
            and (
                attention_mask is None
                or (
                    attention_mask.dim() == 2
                    and attention_mask.size(0) in (1, rows)
                    and attention_mask.size(1) >= past + length
                )
            )
        )

    def __call__(self, x: torch.Tensor, cache: KVCache, attention_mask: torch.Tensor | None) -> torch.Tensor:
        """h_n (B, T, d), fp32, from h_0 (B, T, d), writing the tokens' keys and values at
        ``cache.length`` onwards (the caller advances the cache): each row of the cache a sequence of
        one page holding all its columns."""
        rows, length, d = x.shape
        flat = x.reshape(rows * length, d).to(torch.float32, copy=True).contiguous()  # written in place
        sequence = torch.arange(rows, dtype=torch.int32).repeat_interleave(length)
        column = (cache.length + torch.arange(length, dtype=torch.int32)).repeat(rows)
        mask = None
        if attention_mask is not None:
            mask = attention_mask.ne(0).expand(rows, attention_mask.size(1)).to(torch.uint8).contiguous()
        tokens = StepTokens(
            flat,
            sequence,
            column,
            cache.keys,
            cache.values,
            torch.arange(rows, dtype=torch.int32)[:, None].contiguous(),
            mask,
        )
        self.run(tokens)
        return flat.view(rows, length, d)

    def run(
        self,
        tokens: StepTokens,
        logit_tokens: torch.Tensor | None = None,
        logits: torch.Tensor | None = None,
        argmax: torch.Tensor | None = None,
        n_choosable: int | None = None,
    ) -> None:
        """One call for ``tokens`` (see :class:`StepTokens`); with ``logit_tokens`` (n,) int32 the
        output layer's logits of those tokens into ``logits`` (n, V) fp32 and, with ``argmax`` (n,)
        int32, the most likely id among the first ``n_choosable`` of each."""
        keys = tokens.keys
        n_logits = 0 if logit_tokens is None else logit_tokens.numel()
        head = self.lm_head.matrix() if n_logits else None
        step = native.Step(
            **self.sizes,
            tokens=tokens.x.size(0),
            x=native.pointer(tokens.x),
            sequence=native.pointer(tokens.sequence),
            column=native.pointer(tokens.column),
            keys=native.pointer(keys),
            values=native.pointer(tokens.values),
            cache_format=native.FORMATS[keys.dtype],
            pages=keys.size(1),
            page_size=keys.size(3),
            block_table=native.pointer(tokens.block_table),
            table_width=tokens.block_table.size(1),
            mask=native.pointer(tokens.mask),
            mask_width=0 if tokens.mask is None else tokens.mask.size(1),
            lm_head=None if head is None else ctypes.addressof(head),
            lm_format=native.FORMATS[self.lm_head.weight_dtype] if n_logits else 0,
            n_logits=n_logits,
            logit_tokens=native.pointer(logit_tokens) if n_logits else None,
            logits=native.pointer(logits) if n_logits else None,
            n_choosable=self.lm_head.out_features if n_choosable is None else n_choosable,
            argmax=native.pointer(argmax) if n_logits and argmax is not None else None,
        )
        self.library.step(step)
        self.calls += 1


def native_layout(model: GPT) -> GPT:
    """An fp32 or bf16 model (on a CPU, with ``gptkit.native`` at hand) set up to run through the
    native step, in place: every matrix packed in the kernels' panels (:class:`NativeLinear`), the
    output layer a packed copy of the token table (which the lookup keeps). A prompt or a decoding
    step over a KV cache runs in one native call; without a cache (scoring), the blocks call the
    native products. Inference only."""
    weight = model.wte.weight
    if weight.dtype not in (torch.float32, torch.bfloat16) or not native.available(weight.device):
        raise ValueError(
            f"the native layout is for fp32 or bf16 models on a CPU with gptkit.native, not {weight.dtype} on {weight.device}"
        )
    model.eval().requires_grad_(False)
    replace_block_linears(model, lambda linear: NativeLinear(linear.weight, linear.bias))
    model.lm_head = NativeLinear(weight)
    model.native_step = NativeStep(model)
    fuse_blocks(model)  # scoring without a cache: the blocks in fewer PyTorch calls
    model.inference_layout = DECODING_LAYOUT
    return model
