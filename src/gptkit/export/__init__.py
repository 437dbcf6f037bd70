"""Models out: a gptkit model as a file that other runtimes load.

- :mod:`~gptkit.export.onnx`: ONNX (``torch.onnx.export``), for ONNX Runtime and the tools that read
  ONNX: the whole-sequence model, or the decoding variant with past keys/values in and out.
- :mod:`~gptkit.export.gguf`: GGUF for llama.cpp (its ``gpt2`` architecture), the byte-level
  tokenizer inside the file, matrices in f32, f16, bf16 or q8_0. GPT-2 family only.

``gptkit export MODEL OUT`` is :func:`export_model` with an :class:`ExportConfig`. The packages these
need are the ``export`` extra (``pip install -e '.[export]'``); they are imported only here.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Literal

from gptkit.config import check_choices, config_error

ExportFormat = Literal["onnx", "gguf"]
ExportQuantize = Literal["f32", "f16", "bf16", "q8_0"]
_SUFFIXES = {".onnx": "onnx", ".gguf": "gguf"}


def require_extra(module: str, purpose: str) -> ModuleType:
    """Import ``module``, or fail with one line that names the extra to install."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise ImportError(
            f"{purpose} needs the {module.split('.')[0]} package: pip install -e '.[export]'"
        ) from e


@dataclass
class ExportConfig:
    """Write a model for another runtime: ONNX (ONNX Runtime) or GGUF (llama.cpp)."""

    model: str = field(
        metadata={
            "help": "Model: a gptkit run or checkpoint, a Hugging Face GPT-1/GPT-2 folder, or a Hub name (gpt2, openai-gpt, org/name@rev).",
            "positional": True,
        }
    )
    out: str = field(metadata={"help": "File to write (.onnx or .gguf).", "positional": True})
    format: ExportFormat | None = field(
        default=None, metadata={"help": "onnx or gguf (default: from OUT's extension)."}
    )
    quantize: ExportQuantize = field(
        default="f32",
        metadata={
            "help": "gguf: the matrices' type in llama.cpp's own layouts: f32, f16, bf16, or q8_0 (int8 "
            "with one fp16 scale per 32 weights); LayerNorms, biases and positions stay f32. onnx: f32.",
            "deprecated": ("dtype",),
        },
    )
    past: bool = field(
        default=False,
        metadata={
            "help": "onnx: the decoding variant (past keys/values in, present keys/values out) instead "
            "of the whole-sequence model."
        },
    )
    tokenizer: str | None = field(
        default=None, metadata={"help": "gguf: tokenizer folder or Hub name to embed (default: the model's)."}
    )

    def __post_init__(self) -> None:
        check_choices(self)
        fmt = self.resolved_format()
        if fmt == "onnx" and self.quantize != "f32":
            raise config_error(
                self, "quantize", f"{self.quantize} is for gguf; an ONNX export has float32 weights (f32)"
            )
        if fmt == "gguf" and self.past:
            raise config_error(self, "past", "is for onnx: a GGUF file has no separate decoding variant")

    def resolved_format(self) -> ExportFormat:
        """``format``, or the one OUT's extension names."""
        if self.format is not None:
            return self.format
        suffix = Path(self.out).suffix.lower()
        if suffix not in _SUFFIXES:
            raise config_error(
                self,
                "format",
                f"not given, and {self.out!r} ends neither in .onnx nor .gguf: pass onnx or gguf",
            )
        return _SUFFIXES[suffix]  # type: ignore[return-value]


def export_model(config: ExportConfig) -> Path:
    """Load ``config.model`` (float32, on the CPU) and write it as ``config.out``; returns the path."""
    from gptkit.model import GPT

    model = GPT.from_pretrained(config.model)
    if config.resolved_format() == "onnx":
        from gptkit.export.onnx import export_onnx

        return export_onnx(model, config.out, past=config.past)

    from gptkit.export.gguf import check_gguf_support, export_gguf
    from gptkit.tokenizer import Tokenizer

    check_gguf_support(model.config)  # before reading a tokenizer a GPT-1 model might not have
    tokenizer = Tokenizer.from_pretrained(config.tokenizer or config.model)
    return export_gguf(model, tokenizer, config.out, quantize=config.quantize)


__all__ = ["ExportConfig", "export_model", "require_extra"]
