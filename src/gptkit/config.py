"""Model configuration: one dataclass and the published presets."""

from __future__ import annotations

import dataclasses
import math
import numbers
import types
import typing
from dataclasses import dataclass, field
from typing import Any, Literal

# The label that the language-model loss skips (padding, and inputs that are not predicted).
IGNORE_INDEX = -100


def flag_name(config: object, name: str) -> str:
    """The command-line flag of field ``name``: ``--name``, after the class's ``flag_prefix`` when it
    has one (LoRAConfig.rank is ``--lora-rank``)."""
    return "--" + (getattr(config, "flag_prefix", "") + name).replace("_", "-")


def config_error(config: object, name: str, problem: str) -> ValueError:
    """The error of a config field that fails its check: it names the field, its flag, and what to
    change, e.g. ``TrainConfig.lr (--lr): must be > 0, got 0``."""
    return ValueError(f"{type(config).__name__}.{name} ({flag_name(config, name)}): {problem}")


def flat_fields(config: object) -> dict[str, Any]:
    """A config's values by flag name without the dashes: a nested config's fields at the top level,
    after its ``flag_prefix`` (FinetuneConfig's ``lora.rank`` is ``lora_rank``), as the command line
    and the records of a run directory spell them."""
    values: dict[str, Any] = {}
    prefix = getattr(config, "flag_prefix", "")
    for f in dataclasses.fields(config):  # type: ignore[arg-type]
        value = getattr(config, f.name)
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            values.update({prefix + k: v for k, v in flat_fields(value).items()})
        else:
            values[prefix + f.name] = value
    return values


def check_choices(config: object) -> None:
    """Every field annotated ``Literal[...]`` (or ``Literal[...] | None``) holds one of its values:
    the choices are read from the annotation, never written out twice."""
    hints = typing.get_type_hints(type(config))
    for f in dataclasses.fields(config):
        hint, optional = hints[f.name], False
        if typing.get_origin(hint) in (typing.Union, types.UnionType):
            args = [a for a in typing.get_args(hint) if a is not type(None)]
            hint, optional = args[0], len(args) < len(typing.get_args(hint))
        if typing.get_origin(hint) is not Literal:
            continue
        value, allowed = getattr(config, f.name), typing.get_args(hint)
        if value not in allowed and not (optional and value is None):
            raise config_error(config, f.name, f"must be one of {', '.join(allowed)}, got {value!r}")


LNPosition = Literal["post", "pre"]
PositionEncoding = Literal["learned", "sinusoidal"]
Activation = Literal["gelu_tanh", "gelu", "relu"]


@dataclass
class GPTConfig:
    """The shape and options of a GPT. Defaults are GPT-1 (Radford et al., 2018)."""

    vocab_size: int = field(default=40478, metadata={"help": "Tokens in the tokenizer's vocabulary."})
    n_special: int = field(
        default=0,
        metadata={
            "help": "Extra token rows after the vocabulary (GPT-1's _start_, _delimiter_, _classify_)."
        },
    )
    context_length: int = field(default=512, metadata={"help": "Longest sequence the model reads (k)."})
    n_layer: int = field(default=12, metadata={"help": "Transformer blocks (n)."})
    n_head: int = field(default=12, metadata={"help": "Attention heads per block."})
    d_model: int = field(default=768, metadata={"help": "Width of the hidden states."})
    ln_position: LNPosition = field(
        default="post",
        metadata={
            "help": "post: LayerNorm after each residual add (GPT-1); pre: before each sub-block plus a final one (GPT-2)."
        },
    )
    position_encoding: PositionEncoding = field(
        default="learned",
        metadata={"help": "learned position embeddings, or the fixed sinusoids of Vaswani et al."},
    )
    activation: Activation = field(
        default="gelu_tanh",
        metadata={"help": "MLP non-linearity: gelu_tanh (the published models), gelu, relu."},
    )
    dropout: float = field(
        default=0.1, metadata={"help": "Dropout on embeddings, attention weights and residual branches."}
    )
    layer_norm_eps: float = field(default=1e-5, metadata={"help": "LayerNorm epsilon."})
    init_std: float = field(default=0.02, metadata={"help": "Standard deviation of the N(0, σ) weight init."})
    scale_residual_init: bool = field(
        default=False,
        metadata={"help": "Init residual projections with std init_std/sqrt(2·n_layer) (GPT-2)."},
    )

    def __post_init__(self) -> None:
        # Types first: a config.json edited by hand may hold 64.0, "64" or true where 64 belongs.
        for name in ("vocab_size", "context_length", "n_layer", "n_head", "d_model", "n_special"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, numbers.Integral):
                raise ValueError(f"{name} must be an integer, got {value!r}")
        for name in ("dropout", "layer_norm_eps", "init_std"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
                raise ValueError(f"{name} must be a finite number, got {value!r}")
        if not isinstance(self.scale_residual_init, bool):
            raise ValueError(f"scale_residual_init must be true or false, got {self.scale_residual_init!r}")
        if self.d_model % self.n_head != 0:
            raise ValueError(
                f"d_model ({self.d_model}) must be divisible by n_head ({self.n_head}): "
                f"{self.d_model} / {self.n_head} = {self.d_model / self.n_head:g} is not a whole head size"
            )
        for name in ("vocab_size", "context_length", "n_layer", "n_head", "d_model"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.n_special < 0:
            raise ValueError(f"n_special must be >= 0, got {self.n_special}")
        if self.ln_position not in ("post", "pre"):
            raise ValueError(f"ln_position must be 'post' or 'pre', got {self.ln_position!r}")
        if self.position_encoding not in ("learned", "sinusoidal"):
            raise ValueError(
                f"position_encoding must be 'learned' or 'sinusoidal', got {self.position_encoding!r}"
            )
        if self.activation not in ("gelu_tanh", "gelu", "relu"):
            raise ValueError(f"activation must be gelu_tanh, gelu or relu, got {self.activation!r}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout}")

    @property
    def head_size(self) -> int:
        return self.d_model // self.n_head

    @property
    def total_vocab_size(self) -> int:
        """Rows of the token embedding: the vocabulary plus the special tokens."""
        return self.vocab_size + self.n_special

    @classmethod
    def from_preset(cls, name: str, **overrides: Any) -> GPTConfig:
        """A published shape by name (see PRESETS), with any field overridden."""
        if name not in PRESETS:
            raise ValueError(f"unknown preset {name!r}; choose one of: {', '.join(PRESETS)}")
        return cls(**{**PRESETS[name], **overrides})

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> GPTConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"unknown GPTConfig field(s): {', '.join(unknown)}")
        return cls(**values)


_GPT2 = dict(
    vocab_size=50257, context_length=1024, ln_position="pre", scale_residual_init=True, activation="gelu_tanh"
)

PRESETS: dict[str, dict[str, Any]] = {
    # GPT-1: 12 layers, 768 wide, 12 heads, 512 context, 40,478 BPE tokens, post-LN.
    "gpt1": dict(
        vocab_size=40478, context_length=512, n_layer=12, n_head=12, d_model=768, ln_position="post"
    ),
    "gpt2": dict(_GPT2, n_layer=12, n_head=12, d_model=768),
    "gpt2-medium": dict(_GPT2, n_layer=24, n_head=16, d_model=1024),
    "gpt2-large": dict(_GPT2, n_layer=36, n_head=20, d_model=1280),
    "gpt2-xl": dict(_GPT2, n_layer=48, n_head=25, d_model=1600),
    # A few seconds to train on a laptop CPU: for tests and demos.
    "tiny": dict(vocab_size=512, context_length=64, n_layer=2, n_head=2, d_model=32, ln_position="post"),
}
