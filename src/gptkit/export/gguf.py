"""A GPT-2-family model as GGUF, the file llama.cpp runs: its ``gpt2`` architecture, the tokenizer inside.

llama.cpp's ``gpt2`` graph is GPT-2's: token plus learned position embeddings, pre-LN blocks (LayerNorm,
fused q/k/v, attention scaled by 1/sqrt(head size), output projection; LayerNorm, 4·d GELU MLP), a
final LayerNorm and the output layer. The tensors are those llama.cpp's own converter writes for
``GPT2LMHeadModel`` (``convert_hf_to_gguf.py``), under the names of the ``gguf`` package's tables:

    token_embd, position_embd, blk.N.{attn_norm, attn_qkv, attn_output, ffn_norm, ffn_up, ffn_down},
    output_norm, output      (each with .weight, and .bias where the model has one)

Matrices are stored as ``nn.Linear`` holds them, (out, in) in numpy's order: GGUF lists dimensions the
other way round, so llama.cpp reads ``{in, out}``; its converter transposes Hugging Face's Conv1D
weights to reach the same layout. The output layer is tied to the token embedding in GPT-2 and is
written as its own tensor, which every llama.cpp version reads (newer ones would also fall back on
``token_embd``). Sinusoidal positions are written as the table they compute.

Weights (``quantize``): ``f32``; ``f16`` or ``bf16`` (matrices in half precision, rounded to
nearest even); ``q8_0`` (matrices in llama.cpp's Q8_0: blocks of 32 weights of a row as int8 with one
fp16 scale, w ≈ d·q, d = max|w|/127, 34 bytes a block). The choice of tensors is llama.cpp's converter's
(``convert_hf_to_gguf.py`` with ``--outtype f16|bf16|q8_0``): every 2-D weight is converted, the token
embedding (and so the tied output layer) included; 1-D tensors (LayerNorms, biases) stay f32, and so
does the position table, which llama.cpp keeps in f32 whatever the file type; a matrix whose rows are
not a multiple of 32 long falls back from q8_0 to f16, as the converter's does.

GPT-1 cannot be written: llama.cpp has no architecture with its post-LN blocks (LayerNorm after each
residual add, no final LayerNorm), nor a tokenizer for its ``</w>`` BPE; see :func:`check_gguf_support`.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Literal, get_args

import numpy as np

from gptkit.config import GPTConfig
from gptkit.export import require_extra
from gptkit.io import atomic_write
from gptkit.model import GPT, sinusoidal_positions
from gptkit.tokenizer import END_OF_TEXT, Tokenizer

if TYPE_CHECKING:
    from gguf import GGMLQuantizationType

ARCHITECTURE = "gpt2"
GGUFQuantize = Literal["f32", "f16", "bf16", "q8_0"]
# llama.cpp's pre-tokenizer for GPT-2's regex, the one every byte-level gptkit tokenizer uses.
PRE_TOKENIZER = "gpt-2"
Q8_0_BLOCK = 32

# Our parameter names (per block after "h.N.") against the gguf package's tensor kinds.
_BLOCK_TENSORS = {
    "ln_1": "ATTN_NORM",
    "attn.c_attn": "ATTN_QKV",
    "attn.c_proj": "ATTN_OUT",
    "ln_2": "FFN_NORM",
    "mlp.c_fc": "FFN_UP",
    "mlp.c_proj": "FFN_DOWN",
}

GPT1_REFUSAL = (
    "GGUF export is for the GPT-2 family: llama.cpp has no architecture for GPT-1's post-LN blocks "
    "(LayerNorm after each residual add, no final LayerNorm), so its 'gpt2' graph would compute another "
    "model, nor a tokenizer for GPT-1's BPE with </w> word ends; export GPT-1 with --format onnx"
)


def check_gguf_support(config: GPTConfig) -> None:
    """Raise a one-line ValueError unless llama.cpp's ``gpt2`` architecture computes this model."""
    if config.ln_position != "pre":
        raise ValueError(GPT1_REFUSAL)
    if config.activation != "gelu_tanh":
        raise ValueError(
            f"llama.cpp's gpt2 architecture computes the MLP with GELU's tanh form (gelu_tanh); this "
            f"model uses {config.activation}, so it would compute another function there"
        )


def tensors(model: GPT) -> Iterator[tuple[str, np.ndarray]]:
    """(GGUF name, float32 array in numpy's order) for every tensor of the file, in llama.cpp's order."""
    gguf = require_extra("gguf", "GGUF export")
    names = gguf.TENSOR_NAMES
    kinds = gguf.MODEL_TENSOR
    state = {name: t.detach().float().cpu().numpy() for name, t in model.state_dict().items()}
    config = model.config
    yield f"{names[kinds.TOKEN_EMBD]}.weight", state["wte.weight"]
    if config.position_encoding == "learned":
        yield f"{names[kinds.POS_EMBD]}.weight", state["wpe.weight"]
    else:
        yield (
            f"{names[kinds.POS_EMBD]}.weight",
            sinusoidal_positions(config.context_length, config.d_model).numpy(),
        )
    for layer in range(config.n_layer):
        for ours, kind in _BLOCK_TENSORS.items():
            base = names[getattr(kinds, kind)].format(bid=layer)
            for part in ("weight", "bias"):
                yield f"{base}.{part}", state[f"h.{layer}.{ours}.{part}"]
    yield f"{names[kinds.OUTPUT_NORM]}.weight", state["ln_f.weight"]
    yield f"{names[kinds.OUTPUT_NORM]}.bias", state["ln_f.bias"]
    yield f"{names[kinds.OUTPUT]}.weight", state["wte.weight"]  # tied: the same values


def tensor_type(name: str, array: np.ndarray, quantize: GGUFQuantize) -> GGMLQuantizationType:
    """The GGML type a tensor is stored in for ``quantize`` (see the module's docstring)."""
    gguf = require_extra("gguf", "GGUF export")
    types = gguf.GGMLQuantizationType
    is_matrix = array.ndim == 2 and not name.startswith(gguf.TENSOR_NAMES[gguf.MODEL_TENSOR.POS_EMBD])
    if quantize == "f32" or not is_matrix:
        return types.F32
    if quantize == "bf16":
        return types.BF16
    if quantize == "q8_0" and array.shape[-1] % Q8_0_BLOCK == 0:
        return types.Q8_0
    return types.F16


def vocabulary(tokenizer: Tokenizer, n_rows: int) -> tuple[list[str], list[int]]:
    """The token strings and GGUF token types of ids 0 … n_rows - 1: the tokenizer's tokens (its
    special tokens as control tokens), then ``[PADi]`` for model rows no token uses."""
    gguf = require_extra("gguf", "GGUF export")
    if tokenizer.style != "bytelevel":
        raise ValueError(
            f"llama.cpp's gpt2 architecture reads GPT-2's byte-level BPE; this tokenizer is {tokenizer.style!r}"
        )
    if len(tokenizer) > n_rows:
        raise ValueError(
            f"the tokenizer has {len(tokenizer)} tokens but the model only {n_rows} token rows: "
            "they do not belong together (pass the model's own tokenizer)"
        )
    by_id = {token_id: token for token, token_id in tokenizer.encoder.items()}
    by_id.update({token_id: token for token, token_id in tokenizer.special_tokens.items()})
    special = set(tokenizer.special_tokens.values())
    tokens, types = [], []
    for token_id in range(n_rows):
        if token_id in by_id:
            tokens.append(by_id[token_id])
            types.append(gguf.TokenType.CONTROL if token_id in special else gguf.TokenType.NORMAL)
        else:
            tokens.append(f"[PAD{token_id}]")
            types.append(gguf.TokenType.UNUSED)
    return tokens, [int(t) for t in types]


def export_gguf(
    model: GPT,
    tokenizer: Tokenizer,
    path: str | Path,
    quantize: GGUFQuantize = "f32",
    name: str | None = None,
) -> Path:
    """Write ``model`` with ``tokenizer`` to ``path`` for llama.cpp; the file appears whole or not at
    all. ``quantize``: the matrices' type, f32, f16, bf16 or q8_0 (see the module's docstring).
    ``name``: the model's name in the file (default: the file's stem)."""
    gguf = require_extra("gguf", "GGUF export")
    if quantize not in get_args(GGUFQuantize):
        raise ValueError(f"quantize must be one of {', '.join(get_args(GGUFQuantize))}, got {quantize!r}")
    model.require_original_weights("export")
    config = model.config
    check_gguf_support(config)
    tokens, token_types = vocabulary(tokenizer, config.total_vocab_size)
    path = Path(path)
    file_types = {
        "f32": gguf.LlamaFileType.ALL_F32,
        "f16": gguf.LlamaFileType.MOSTLY_F16,
        "bf16": gguf.LlamaFileType.MOSTLY_BF16,
        "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0,
    }

    def write(tmp: str) -> None:
        writer = gguf.GGUFWriter(tmp, ARCHITECTURE)  # writes general.architecture
        writer.add_name(name or path.stem)
        writer.add_context_length(config.context_length)
        writer.add_embedding_length(config.d_model)
        writer.add_feed_forward_length(4 * config.d_model)
        writer.add_block_count(config.n_layer)
        writer.add_head_count(config.n_head)
        writer.add_layer_norm_eps(config.layer_norm_eps)
        writer.add_file_type(file_types[quantize])
        writer.add_quantization_version(gguf.GGML_QUANT_VERSION)

        writer.add_tokenizer_model("gpt2")  # llama.cpp's byte-level BPE
        writer.add_tokenizer_pre(PRE_TOKENIZER)
        writer.add_token_list(tokens)
        writer.add_token_types(token_types)
        writer.add_token_merges([f"{left} {right}" for left, right in tokenizer.merges])
        end_of_text = tokenizer.special_tokens[END_OF_TEXT]
        writer.add_bos_token_id(end_of_text)
        writer.add_eos_token_id(end_of_text)
        writer.add_add_bos_token(False)  # GPT-2 starts a text with its first token, as gptkit does

        for tensor_name, array in tensors(model):
            kind = tensor_type(tensor_name, array, quantize)
            data = gguf.quants.quantize(np.ascontiguousarray(array, dtype=np.float32), kind)
            writer.add_tensor(tensor_name, data, raw_dtype=kind)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()

    atomic_write(path, write)
    return path
