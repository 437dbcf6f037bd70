"""Weights in and out: Hugging Face directories, gptkit directories, OpenAI's GPT-1 release.

Files ↔ config and parameters (a state dict under our names): this module never builds or imports
the network; :meth:`gptkit.GPT.from_pretrained` builds the model from what :func:`read_pretrained`
returns and checks that the parameters fit it.

A gptkit model directory *is* a Hugging Face directory: ``config.json`` plus ``model.safetensors``,
with the parameter names of ``OpenAIGPTLMHeadModel`` (post-LN models) or ``GPT2LMHeadModel``
(pre-LN models). ``config.json`` carries one extra key, ``"gptkit"``, with the full GPTConfig, so
options that Hugging Face cannot express (sinusoidal positions, ``n_special``) survive a round trip.
"""

from __future__ import annotations

import re
import warnings
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch

from gptkit import hub
from gptkit.config import GPTConfig
from gptkit.io import (
    RESAVE_ADVICE,
    json_type_name,
    read_json,
    read_pytorch_weights,
    read_safetensors,
    save_safetensors,
    write_json,
)
from gptkit.model.positions import sinusoidal_positions

CONFIG_NAME = "config.json"
SAFETENSORS_NAME = "model.safetensors"
PYTORCH_NAME = "pytorch_model.bin"
OPENAI_SHAPES_NAME = "params_shapes.json"

# Hugging Face's GPT-1 calls the embeddings by other names; everything else is shared with GPT-2.
_OPENAI_GPT_NAMES = {"tokens_embed.weight": "wte.weight", "positions_embed.weight": "wpe.weight"}
# Both HF models store projections as Conv1D, whose weight is the transpose of nn.Linear's.
_CONV1D_WEIGHT = re.compile(r"^h\.\d+\.(attn\.c_attn|attn\.c_proj|mlp\.c_fc|mlp\.c_proj)\.weight$")
# Buffers and tied copies that some published checkpoints carry, and the task head of HF's
# double-heads models: none is part of the language model.
_SKIPPED = re.compile(r"(^lm_head\.weight$|\.attn\.bias$|\.attn\.masked_bias$|^multiple_choice_head\.)")

# Our activation names against each HF model's.
_OPENAI_AFN = {"gelu_tanh": "gelu", "relu": "relu"}  # HF openai-gpt's "gelu" is the tanh form
_GPT2_ACTIVATION = {"gelu_tanh": "gelu_new", "gelu": "gelu", "relu": "relu"}


# Configs ---------------------------------------------------------------------------------------


def hf_model_type(config: GPTConfig) -> str:
    """Which Hugging Face model computes the same function as ``config``, or "gptkit" if none does."""
    if config.ln_position == "post" and config.activation in _OPENAI_AFN and not config.scale_residual_init:
        return "openai-gpt"
    if config.ln_position == "pre":
        return "gpt2"
    return "gptkit"


def config_to_hf(config: GPTConfig) -> dict[str, Any]:
    model_type = hf_model_type(config)
    shared = {
        "model_type": model_type,
        "vocab_size": config.total_vocab_size,  # HF counts special tokens in the vocabulary
        "n_positions": config.context_length,
        "n_embd": config.d_model,
        "n_layer": config.n_layer,
        "n_head": config.n_head,
        "resid_pdrop": config.dropout,
        "embd_pdrop": config.dropout,
        "attn_pdrop": config.dropout,
        "layer_norm_epsilon": config.layer_norm_eps,
        "initializer_range": config.init_std,
        "tie_word_embeddings": True,
    }
    if model_type == "openai-gpt":
        shared.update(architectures=["OpenAIGPTLMHeadModel"], afn=_OPENAI_AFN[config.activation])
    elif model_type == "gpt2":
        shared.update(
            architectures=["GPT2LMHeadModel"],
            activation_function=_GPT2_ACTIVATION[config.activation],
            n_inner=None,
            scale_attn_weights=True,
        )
    shared["gptkit"] = config.to_dict()
    return shared


# The Hugging Face fields that config_to_hf derives from a GPTConfig, against what they come from.
_HF_FIELD_SOURCES = {
    "model_type": "ln_position, activation, scale_residual_init",
    "vocab_size": "vocab_size + n_special",
    "n_positions": "context_length",
    "n_embd": "d_model",
    "n_layer": "n_layer",
    "n_head": "n_head",
    "layer_norm_epsilon": "layer_norm_eps",
    "initializer_range": "init_std",
    "resid_pdrop": "dropout",
    "embd_pdrop": "dropout",
    "attn_pdrop": "dropout",
    "afn": "activation",
    "activation_function": "activation",
}


def _warn_on_disagreement(hf: dict[str, Any], config: GPTConfig, source: str) -> None:
    """Warn when a hand edit made the Hugging Face fields say something else than the "gptkit" block."""
    expected = config_to_hf(config)
    disagreements = [
        f"{name}={hf[name]!r} but the gptkit block gives {expected[name]!r} ({sources})"
        for name, sources in _HF_FIELD_SOURCES.items()
        if name in hf and name in expected and hf[name] != expected[name]
    ]
    if disagreements:
        warnings.warn(
            f"{source}: the Hugging Face fields disagree with the 'gptkit' block: {'; '.join(disagreements)}. "
            "gptkit uses the 'gptkit' block (the weights were saved with it); edit both to agree, or "
            "delete the 'gptkit' block to use the Hugging Face fields",
            stacklevel=3,
        )


def _gptkit_block(hf: dict[str, Any], source: str) -> GPTConfig:
    """The config in a ``config.json``'s "gptkit" block, with a warning for each Hugging Face field
    beside it that disagrees."""
    block = hf["gptkit"]
    if not isinstance(block, dict):
        raise ValueError(f"{source}: the 'gptkit' block must be an object, found {json_type_name(block)}")
    try:
        config = GPTConfig.from_dict(block)
    except (TypeError, ValueError) as e:  # TypeError: a field of the wrong type, e.g. "12"
        raise ValueError(f"{source}: the 'gptkit' block is invalid: {e}") from e
    _warn_on_disagreement(hf, config, source)
    return config


def config_from_hf(hf: dict[str, Any], source: str = CONFIG_NAME) -> GPTConfig:
    """A GPTConfig from a ``config.json``: ours (the "gptkit" key) or one written by transformers.

    When both are present the "gptkit" block is used, with a warning for each Hugging Face field
    that disagrees with it.
    """
    if not isinstance(hf, dict):
        raise ValueError(f"{source}: expected a JSON object {{...}}, found {json_type_name(hf)}")
    if "gptkit" in hf:
        return _gptkit_block(hf, source)
    model_type = hf.get("model_type")
    if model_type not in ("openai-gpt", "gpt2"):
        raise ValueError(
            f"{source}: model_type {model_type!r} is not supported (expected 'openai-gpt' or 'gpt2')"
        )
    try:
        common = dict(
            vocab_size=hf["vocab_size"],
            context_length=hf["n_positions"],
            d_model=hf["n_embd"],
            n_layer=hf["n_layer"],
            n_head=hf["n_head"],
            dropout=hf.get("resid_pdrop", 0.1),
            layer_norm_eps=hf.get("layer_norm_epsilon", 1e-5),
            init_std=hf.get("initializer_range", 0.02),
        )
    except KeyError as e:
        raise ValueError(f"{source}: missing field {e.args[0]!r} for model_type {model_type!r}") from e
    if model_type == "openai-gpt":
        inverse = {v: k for k, v in _OPENAI_AFN.items()}
        afn = hf.get("afn", "gelu")
        if afn not in inverse:
            raise ValueError(
                f"{source}: activation afn={afn!r} is not supported (expected one of {list(inverse)})"
            )
        return _checked_config(source, **common, ln_position="post", activation=inverse[afn])
    # gpt2
    inverse = {v: k for k, v in _GPT2_ACTIVATION.items()}
    act = hf.get("activation_function", "gelu_new")
    if act not in inverse:
        raise ValueError(
            f"{source}: activation_function={act!r} is not supported (expected one of {list(inverse)})"
        )
    if hf.get("n_inner") not in (None, 4 * hf["n_embd"]):
        raise ValueError(
            f"{source}: n_inner={hf['n_inner']} is not supported (gptkit's MLP is 4·n_embd wide)"
        )
    for flag in ("scale_attn_by_inverse_layer_idx", "reorder_and_upcast_attn", "add_cross_attention"):
        if hf.get(flag):
            raise ValueError(f"{source}: {flag}=true is not supported")
    return _checked_config(
        source, **common, ln_position="pre", activation=inverse[act], scale_residual_init=True
    )


def _checked_config(source: str, **fields: Any) -> GPTConfig:
    """GPTConfig(**fields), with an invalid value reported against the file it came from."""
    try:
        return GPTConfig(**fields)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{source}: {e}") from e


# State dicts -----------------------------------------------------------------------------------


def state_dict_to_hf(config: GPTConfig, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A GPT's parameters (our names) under Hugging Face names and layouts."""
    model_type = hf_model_type(config)
    renames = {v: k for k, v in _OPENAI_GPT_NAMES.items()} if model_type == "openai-gpt" else {}
    out = {}
    for name, tensor in state.items():
        if _CONV1D_WEIGHT.match(name):
            tensor = tensor.t()
        out["transformer." + renames.get(name, name)] = tensor
    if config.position_encoding == "sinusoidal":
        # Stored as a position table so that transformers, which only knows learned tables, computes
        # the same function.
        key = "transformer.positions_embed.weight" if model_type == "openai-gpt" else "transformer.wpe.weight"
        out[key] = sinusoidal_positions(config.context_length, config.d_model)
    return out


def state_dict_from_hf(config: GPTConfig, hf_state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Hugging Face-named tensors under our names and layouts (buffers and tied copies dropped)."""
    ours = {}
    for name, tensor in hf_state.items():
        name = name.removeprefix("transformer.")
        if _SKIPPED.search(name):
            continue
        name = _OPENAI_GPT_NAMES.get(name, name)
        if _CONV1D_WEIGHT.match(name) and tensor.ndim == 2:  # another shape: refused by the loader
            tensor = tensor.t()
        ours[name] = tensor
    if "wte.weight" not in ours and "lm_head.weight" in hf_state:
        # Tied weights are saved once, under either name: some models keep only the output layer's.
        ours["wte.weight"] = hf_state["lm_head.weight"]
    if config.position_encoding == "sinusoidal":
        ours.pop("wpe.weight", None)  # the table is recomputed, never learned
    return ours


_BLOCK_INDEX = re.compile(r"h\.(\d+)\.")

# Directories -----------------------------------------------------------------------------------


def save_state_dict(config: GPTConfig, state: dict[str, torch.Tensor], directory: str | Path) -> None:
    """Write ``config.json`` and ``model.safetensors`` (Hugging Face format) for a GPT's state dict."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    save_safetensors(state_dict_to_hf(config, state), directory / SAFETENSORS_NAME, metadata={"format": "pt"})
    write_json(directory / CONFIG_NAME, config_to_hf(config))


def read_state_dict(directory: str | Path) -> dict[str, torch.Tensor]:
    """The parameters saved in a gptkit/HF directory, under our names."""
    directory = Path(directory)
    config = config_from_hf(read_json(directory / CONFIG_NAME), str(directory / CONFIG_NAME))
    return state_dict_from_hf(config, read_safetensors(directory / SAFETENSORS_NAME))


class Weights(NamedTuple):
    """What a model directory holds: its config and its parameters under our names."""

    config: GPTConfig
    state: dict[str, torch.Tensor]
    origin: str  # the file the parameters were read from, for error messages


def read_pretrained(source: str | Path, *, n_head: int = 12) -> Weights:
    """The config and parameters of a folder (HF, gptkit or OpenAI's release) or a Hub name (``gpt2``,
    ``openai-community/openai-gpt``, ``org/name@revision``: see :mod:`gptkit.hub`).

    ``n_head`` is for OpenAI's release, which does not record it. :meth:`gptkit.GPT.from_pretrained`
    builds the model from these and checks that the parameters fit it.
    """
    with hub.reading(source) as directory:
        if (directory / OPENAI_SHAPES_NAME).exists() and not (directory / CONFIG_NAME).exists():
            return read_openai_release(directory, n_head=n_head)
        return _read_hf_directory(directory)


def _read_hf_directory(directory: Path) -> Weights:
    config_path = directory / CONFIG_NAME
    if not config_path.exists():
        raise FileNotFoundError(
            f"{directory}: no {CONFIG_NAME} (expected a Hugging Face/gptkit model directory, or OpenAI's "
            f"GPT-1 release with {OPENAI_SHAPES_NAME} and params_*.npy)"
        )
    config = config_from_hf(read_json(config_path), str(config_path))
    if (directory / SAFETENSORS_NAME).exists():
        weights_path = directory / SAFETENSORS_NAME
        state = read_safetensors(weights_path)
    elif (directory / PYTORCH_NAME).exists():
        weights_path = directory / PYTORCH_NAME
        state = read_pytorch_weights(weights_path)
    else:
        raise FileNotFoundError(f"{directory}: no {SAFETENSORS_NAME} or {PYTORCH_NAME}")
    state = state_dict_from_hf(config, state)
    _check_shape(config, state, config_path, weights_path)
    return Weights(config, state, str(weights_path))


def _check_shape(
    config: GPTConfig, state: dict[str, torch.Tensor], config_path: Path, weights_path: Path
) -> None:
    """The config's blocks, vocabulary, width and positions against the weights' tensors, before a
    model of the config's shape is built: an edited or damaged config (n_layer 2³¹) is named here
    instead of being built."""
    blocks = {int(match.group(1)) for name in state if (match := _BLOCK_INDEX.match(name))}
    found = {"n_layer": len(blocks)}
    if "wte.weight" in state and state["wte.weight"].ndim == 2:
        rows, found["d_model"] = state["wte.weight"].shape
        found["vocab_size"] = rows - config.n_special
    if "wpe.weight" in state and state["wpe.weight"].ndim == 2:
        found["context_length"] = state["wpe.weight"].shape[0]
    for name, value in found.items():
        if getattr(config, name) != value:
            raise ValueError(
                f"{config_path}: {name} is {getattr(config, name)}, but {weights_path} holds {value}: "
                "one of the two files is damaged, or they do not belong together"
            )


# OpenAI's original GPT-1 release (openai/finetune-transformer-lm, model/) --------------------------

# Per block, the order of the arrays in params_shapes.json, against our names.
_OPENAI_BLOCK_ORDER = [
    "attn.c_attn.weight", "attn.c_attn.bias",
    "attn.c_proj.weight", "attn.c_proj.bias",
    "ln_1.weight", "ln_1.bias",
    "mlp.c_fc.weight", "mlp.c_fc.bias",
    "mlp.c_proj.weight", "mlp.c_proj.bias",
    "ln_2.weight", "ln_2.bias",
]  # fmt: skip


def _read_openai_shapes(path: Path) -> list[tuple[int, ...]]:
    """``params_shapes.json``: a list of array shapes, each a list of positive integers."""
    shapes = read_json(path)
    if not isinstance(shapes, list):
        raise ValueError(f"{path}: expected a JSON array of shapes, found {json_type_name(shapes)}")
    for index, shape in enumerate(shapes):
        if not (
            isinstance(shape, list)
            and shape
            and all(isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in shape)
        ):
            raise ValueError(f"{path}: entry {index} is {shape!r}, expected a shape such as [512, 768]")
    return [tuple(shape) for shape in shapes]


def _openai_param_files(directory: Path) -> list[Path]:
    """``params_0.npy`` … ``params_{n-1}.npy`` in order; a gap in the numbering means a lost file."""
    numbered = {}
    for path in directory.glob("params_*.npy"):
        match = re.fullmatch(r"params_(\d+)\.npy", path.name)
        if match:
            numbered[int(match.group(1))] = path
    if not numbered:
        raise FileNotFoundError(f"{directory}: {OPENAI_SHAPES_NAME} but no params_*.npy files")
    missing = sorted(set(range(max(numbered) + 1)) - set(numbered))
    if missing:
        names = ", ".join(f"params_{i}.npy" for i in missing)
        raise FileNotFoundError(
            f"{directory}: {names} missing (the release has params_0.npy to params_9.npy)"
        )
    return [numbered[i] for i in sorted(numbered)]


def _read_npy(path: Path) -> np.ndarray:
    """One ``.npy`` array (no pickles); a damaged file is a ValueError that names it."""
    try:
        array = np.load(path, allow_pickle=False)
    except (ValueError, EOFError) as e:  # numpy's reports of a short or foreign file
        raise ValueError(
            f"{path}: cannot be read ({e}): the file is truncated or not a .npy array; {RESAVE_ADVICE}"
        ) from e
    if array.dtype.kind != "f":
        raise ValueError(f"{path}: holds {array.dtype} numbers, expected floating-point weights")
    return array


def read_openai_release(
    directory: str | Path, n_head: int = 12, context_length: int | None = None
) -> Weights:
    """Read ``params_shapes.json`` + ``params_0.npy`` … ``params_9.npy``.

    The parameters are stored flat and concatenated, in the order of ``params_shapes.json``:
    positions, tokens, then 12 arrays per block; projection weights are [1, in, out]. The release does
    not record the number of heads: GPT-1 has 12.
    """
    directory = Path(directory)
    shapes_path = directory / OPENAI_SHAPES_NAME
    shapes = _read_openai_shapes(shapes_path)
    if len(shapes) < 2 or (len(shapes) - 2) % len(_OPENAI_BLOCK_ORDER):
        raise ValueError(
            f"{shapes_path}: {len(shapes)} arrays; expected 2 embeddings plus "
            f"{len(_OPENAI_BLOCK_ORDER)} per block"
        )
    flat = np.concatenate([_read_npy(f).reshape(-1) for f in _openai_param_files(directory)])
    sizes = [int(np.prod(s)) for s in shapes]
    if flat.size != sum(sizes):
        raise ValueError(
            f"{directory}: params_*.npy hold {flat.size} numbers, {OPENAI_SHAPES_NAME} describes {sum(sizes)}: "
            f"a params_*.npy file is missing or damaged; {RESAVE_ADVICE}"
        )
    arrays = [a.reshape(s) for a, s in zip(np.split(flat, np.cumsum(sizes)[:-1]), shapes)]

    if len(shapes[0]) != 2 or len(shapes[1]) != 2 or shapes[0][1] != shapes[1][1]:
        raise ValueError(
            f"{shapes_path}: the first two arrays are {list(shapes[0])} and {list(shapes[1])}; expected "
            "the position and token embeddings, [n_positions, d_model] and [vocab_size, d_model]"
        )
    (n_positions, d_model), (vocab_size, _) = shapes[0], shapes[1]
    n_layer = (len(shapes) - 2) // len(_OPENAI_BLOCK_ORDER)
    config = _checked_config(
        str(shapes_path),
        vocab_size=vocab_size,
        context_length=context_length or n_positions,
        n_layer=n_layer,
        n_head=n_head,
        d_model=d_model,
        ln_position="post",
    )
    state = {"wpe.weight": arrays[0][: config.context_length], "wte.weight": arrays[1]}
    for i in range(n_layer):
        block = arrays[2 + i * len(_OPENAI_BLOCK_ORDER) : 2 + (i + 1) * len(_OPENAI_BLOCK_ORDER)]
        for name, array in zip(_OPENAI_BLOCK_ORDER, block):
            if array.ndim == 3:  # conv weight [1, in, out] → Linear [out, in]
                array = array[0].T
            state[f"h.{i}.{name}"] = array
    tensors = {name: torch.from_numpy(np.ascontiguousarray(array)) for name, array in state.items()}
    return Weights(config, tensors, str(shapes_path))
