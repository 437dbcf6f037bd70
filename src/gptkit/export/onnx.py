"""A GPT as ONNX: the whole-sequence model, or the decoding variant with past keys/values.

Whole sequence (``past=False``)::

    input_ids (batch, sequence) int64  →  logits (batch, sequence, vocabulary) float32

Decoding (``past=True``), the names that Hugging Face Optimum and ONNX Runtime's tools use::

    input_ids (batch, sequence), past_key_values.N.key / .value (batch, n_head, past_sequence, head_size)
      →  logits, present.N.key / .value (batch, n_head, past_sequence + sequence, head_size)

The first step feeds the prompt with empty pasts (``past_sequence`` = 0), each later step one token
per row with the presents of the step before. Positions are ``past_sequence`` … ``past_sequence +
sequence - 1``: rows are not padded, and ``past_sequence + sequence`` may not pass the model's context.

The exporter is ``torch.onnx.export(dynamo=True)`` (torch.export, translated by onnxscript): the
default since PyTorch 2.9 and the one that is maintained; the TorchScript exporter (``dynamo=False``)
is deprecated. It traces the same Python code the model runs (the blocks are called as they are,
with :class:`ExplicitKVCache` in place of :class:`~gptkit.model.KVCache`), and its symbolic shapes
keep batch, sequence and past length dynamic, the past length 0 included.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import tempfile
import warnings
from collections.abc import Iterator
from pathlib import Path

import torch
import torch.nn as nn

from gptkit.export import require_extra
from gptkit.model import GPT


def past_names(n_layer: int) -> list[str]:
    """The decoding variant's past inputs, in order: layer 0's key, its value, layer 1's key, ..."""
    return [f"past_key_values.{layer}.{kind}" for layer in range(n_layer) for kind in ("key", "value")]


def present_names(n_layer: int) -> list[str]:
    """The decoding variant's present outputs, in the order of :func:`past_names`."""
    return [f"present.{layer}.{kind}" for layer in range(n_layer) for kind in ("key", "value")]


class ExplicitKVCache:
    """:class:`~gptkit.model.KVCache`'s interface (``length``, ``append``) over past keys and values
    given as tensors: each layer's keys are the past's followed by this step's, returned as the
    layer's present. Nothing is written in place, so the step traces as a pure function."""

    def __init__(self, past: list[torch.Tensor]):
        self.past = past  # [key_0, value_0, key_1, value_1, ...], each (B, nh, P, hs)
        self.length = past[0].size(2)  # P: symbolic while exporting
        self.present: list[torch.Tensor] = []

    def append(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        k = torch.cat([self.past[2 * layer], k], dim=2)  # (B, nh, P + T, hs)
        v = torch.cat([self.past[2 * layer + 1], v], dim=2)
        self.present += [k, v]
        return k, v


class OnnxGPT(nn.Module):
    """What is exported: ``model``'s forward pass without its Python-side input checks (they read
    token values, which a graph cannot), with past keys/values as inputs and outputs when ``past``."""

    def __init__(self, model: GPT, past: bool):
        super().__init__()
        self.model, self.past = model, past

    def forward(self, input_ids: torch.Tensor, past: list[torch.Tensor] | None = None):
        model = self.model
        cache = ExplicitKVCache(past) if self.past else None
        P = cache.length if cache is not None else 0
        T = input_ids.size(1)
        position_ids = torch.arange(P, P + T, device=input_ids.device)
        if model.config.position_encoding == "learned":
            positions = model.wpe(position_ids)
        else:
            positions = model.sinusoids[position_ids]
        x = model.wte(input_ids) + positions  # h_0 = U·W_e + W_p, (B, T, d)
        # With a past, an explicit (T, P + T) mask: query i (position P + i) sees keys 0 … P + i.
        # The model's own shortcuts (no mask for one token, is_causal without a past) branch on P,
        # which is symbolic here.
        mask = None
        if cache is not None:
            mask = torch.arange(P + T, device=input_ids.device)[None, :] <= position_ids[:, None]
        for layer, block in enumerate(model.h):
            x = block(x, mask, cache, layer)
        if model.ln_f is not None:
            x = model.ln_f(x)
        logits = model.output_layer(x)  # (B, T, V)
        return logits if cache is None else (logits, *cache.present)


def export_onnx(model: GPT, path: str | Path, *, past: bool = False) -> Path:
    """Write ``model`` (float32) to ``path`` as ONNX, the whole-sequence model or with ``past`` the
    decoding variant (see the module's docstring). The file appears whole or not at all; a model
    past ONNX's 2 GB limit for one file gets its weights in ``path`` + ``.data`` beside it."""
    require_extra("onnx", "ONNX export")
    require_extra("onnxscript", "ONNX export")
    model.require_original_weights("export")
    dtype = next(model.parameters()).dtype
    if dtype != torch.float32:
        raise ValueError(f"ONNX export takes a float32 model, got {dtype}: load it with dtype=torch.float32")
    config, device = model.config, next(model.parameters()).device
    wrapper = OnnxGPT(model, past)
    # Example inputs of 2 rows, 3 new and 4 past positions: torch.export fixes a dimension whose
    # example is 0 or 1, so none is.
    input_ids = torch.zeros(2, 3, dtype=torch.long, device=device)
    batch, sequence = torch.export.Dim("batch"), torch.export.Dim("sequence")
    dynamic_shapes: dict = {"input_ids": {0: batch, 1: sequence}}
    args: tuple = (input_ids,)
    input_names, output_names = ["input_ids"], ["logits"]
    if past:
        past_sequence = torch.export.Dim("past_sequence")
        shape = (2, config.n_head, 4, config.head_size)
        args += ([torch.zeros(shape, device=device) for _ in range(2 * config.n_layer)],)
        dynamic_shapes["past"] = [{0: batch, 2: past_sequence} for _ in range(2 * config.n_layer)]
        input_names += past_names(config.n_layer)
        output_names += present_names(config.n_layer)

    was_training = model.training
    wrapper.eval()  # and the model in it
    try:
        with torch.no_grad(), _quiet_exporter():
            program = torch.onnx.export(
                wrapper,
                args,
                dynamo=True,
                dynamic_shapes=dynamic_shapes,
                input_names=input_names,
                output_names=output_names,
                verbose=False,
            )
    finally:
        model.train(was_training)
    program.model.metadata_props["gptkit.config"] = json.dumps(config.to_dict())
    program.model.metadata_props["gptkit.variant"] = "past" if past else "sequence"
    return _save(program, Path(path))


@contextlib.contextmanager
def _quiet_exporter() -> Iterator[None]:
    """The exporter logs a warning for each torchvision operator it cannot register (torchvision is
    not a dependency), torch.export a FutureWarning of its own, and the exporter a warning for each
    input that shares a dimension's name with another (as batch does): none concerns the user."""
    registration = logging.getLogger("torch.onnx._internal.exporter._registration")
    level = registration.level
    registration.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            warnings.filterwarnings("ignore", message=r".*The axis name: .* will not be used")
            yield
    finally:
        registration.setLevel(level)


def _save(program: torch.onnx.ONNXProgram, path: Path) -> Path:
    """Save into a fresh directory beside ``path``, then move the file(s) into place: the weights
    file first (when there is one), the model last, so a reader never finds half an export."""
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}."))
    try:
        program.save(staging / path.name)  # external data past 2 GB, named after the file
        for written in sorted(staging.iterdir(), key=lambda p: p.name == path.name):
            os.replace(written, path.parent / written.name)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return path
