"""LoRA (Hu et al., 2021): fine-tune a frozen GPT through low-rank updates of its projections.

    h = W·x + b + (α/r)·B·A·x          A: (r, in), B: (out, r), B = 0 at the start

Only A and B of the chosen projections (attention's ``c_attn`` and ``c_proj``, the MLP's ``c_fc``
and ``c_proj``) are trained, with the rows of the special tokens that fine-tuning adds (their
embeddings are new, so nothing pre-trained could stand in for them) and the task head; the rest of
the GPT is frozen. A run then saves megabytes instead of the whole model, and many adapters can
share one copy of the base in memory.

Adapters are written in ``peft``'s file layout (``adapter_config.json`` + ``adapter_model.safetensors``,
keys ``base_model.model.transformer.h.N.attn.c_attn.lora_A.weight``), so that ``peft`` applies them
to the ``transformers`` form of the same base (``GPT2LMHeadModel``/``OpenAIGPTLMHeadModel``, whose
projections are ``Conv1D``: ``fan_in_fan_out``). The special tokens' rows and the head live in
gptkit's own files beside it (the base that ``peft`` loads has no rows for them).
"""

from __future__ import annotations

import contextlib
import math
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

from gptkit.io import read_json_object, read_safetensors, save_safetensors, write_json
from gptkit.model.network import GPT

ADAPTER_CONFIG_NAME = "adapter_config.json"
ADAPTER_WEIGHTS_NAME = "adapter_model.safetensors"
# The projections LoRA may adapt, by the last part of their names (peft's ``target_modules`` too):
# c_proj names both attention's output and the MLP's second projection, as in transformers.
LORA_TARGETS = ("c_attn", "c_proj", "c_fc")
_PEFT_PREFIX = "base_model.model.transformer."


@dataclass(frozen=True)
class LoRASettings:
    """What an adapter is: its rank r, its α (the update is scaled by α/r) and the adapted projections."""

    rank: int
    alpha: float
    targets: tuple[str, ...] = LORA_TARGETS

    def __post_init__(self) -> None:
        if self.rank <= 0:
            raise ValueError(f"LoRA rank must be positive, got {self.rank}")
        if not math.isfinite(self.alpha):
            raise ValueError(f"LoRA alpha must be a finite number, got {self.alpha}")
        unknown = [t for t in self.targets if t not in LORA_TARGETS]
        if unknown or not self.targets:
            given = ", ".join(map(repr, self.targets)) or "none"
            raise ValueError(f"LoRA targets must be some of {', '.join(LORA_TARGETS)}, got {given}")

    @property
    def scaling(self) -> float:
        return self.alpha / self.rank


class LoRALinear(nn.Linear):
    """``nn.Linear`` (its ``weight`` and ``bias`` keep their names, so base weights load unchanged)
    plus a low-rank update (α/r)·B·A; ``lora_A`` None: a plain linear layer.

    Serving many adapters (:class:`AdapterSet`), ``lora_A`` and ``lora_B`` may instead hold every
    adapter's, stacked, (n, r, in) and (n, out, r), and ``adapter_index`` (N,) which one each row
    of the batch adds: one pass of the base for a batch that mixes adapters (punica's BGMV).
    """

    lora_A: nn.Parameter | None
    lora_B: nn.Parameter | None
    adapter_index: torch.Tensor | None = None

    @classmethod
    def wrap(cls, linear: nn.Linear, rank: int, scaling: float) -> LoRALinear:
        """A LoRA layer over ``linear``'s own weight and bias (shared, not copied), with peft's
        initialisation: A Kaiming-uniform, B zero, so training starts from the base's function."""
        layer = cls(linear.in_features, linear.out_features, bias=linear.bias is not None, device="meta")
        layer.weight, layer.bias = linear.weight, linear.bias
        weight = linear.weight
        layer.lora_A = nn.Parameter(
            torch.empty(rank, linear.in_features, device=weight.device, dtype=weight.dtype)
        )
        nn.init.kaiming_uniform_(layer.lora_A, a=math.sqrt(5))
        layer.lora_B = nn.Parameter(
            torch.zeros(linear.out_features, rank, device=weight.device, dtype=weight.dtype)
        )
        layer.scaling = scaling
        return layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.linear(x, self.weight, self.bias)
        if self.lora_A is None:
            return out
        if self.adapter_index is None:
            return out + F.linear(F.linear(x, self.lora_A), self.lora_B) * self.scaling  # (α/r)·B·A·x
        A = self.lora_A[self.adapter_index].transpose(1, 2)  # each row's own A, (N, in, r)
        B = self.lora_B[self.adapter_index].transpose(1, 2)  # and B, (N, r, out)
        return out + torch.bmm(torch.bmm(x, A), B) * self.scaling  # x: (N, T, in)

    def merged(self) -> nn.Linear:
        """A plain linear layer computing the same function: W + (α/r)·B·A."""
        linear = nn.Linear(self.in_features, self.out_features, bias=self.bias is not None, device="meta")
        weight = self.weight.detach()
        if self.lora_A is not None:
            delta = (self.lora_B.float() @ self.lora_A.float()) * self.scaling
            weight = (weight.float() + delta).to(weight.dtype)
        linear.weight = nn.Parameter(weight, requires_grad=False)
        if self.bias is not None:
            linear.bias = nn.Parameter(self.bias.detach(), requires_grad=False)
        return linear


class TrainableRowsEmbedding(nn.Module):
    """The token embedding W_e with its rows from ``first_row`` on trainable and the rest frozen:
    the special tokens' rows, new at fine-tuning, are trained fully under LoRA.

    ``weight`` is the whole table (the tied output layer reads it); the lookup itself reads the
    two parts without joining them. Serving many adapters, ``rows`` may hold every adapter's,
    (n, specials, d), and ``adapter_index`` (N,) whose each row of the batch reads.
    """

    adapter_index: torch.Tensor | None = None

    def __init__(self, embedding: nn.Embedding, first_row: int):
        super().__init__()
        table = embedding.weight.detach()
        self.frozen = nn.Parameter(table[:first_row], requires_grad=False)
        self.rows = nn.Parameter(table[first_row:].clone())

    @property
    def first_row(self) -> int:
        return self.frozen.size(0)

    @property
    def weight(self) -> torch.Tensor:
        return torch.cat([self.frozen, self.rows])

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        special = input_ids >= self.first_row
        base = F.embedding(input_ids.masked_fill(special, 0), self.frozen)
        row_ids = (input_ids - self.first_row).clamp(min=0)
        if self.adapter_index is None:
            rows = F.embedding(row_ids, self.rows)
        else:
            rows = self.rows[self.adapter_index.unsqueeze(1), row_ids]  # (N, T, d)
        return torch.where(special.unsqueeze(-1), rows, base)


def add_lora(gpt: GPT, settings: LoRASettings, first_trainable_row: int | None = None) -> list[str]:
    """Freeze ``gpt`` and put LoRA on its target projections, in place; the token rows from
    ``first_trainable_row`` on (the special tokens') stay trainable. Returns the adapted layers' names."""
    for param in gpt.parameters():
        param.requires_grad_(False)
    names = []
    for block_index, block in enumerate(gpt.h):
        for owner_name, owner in (("attn", block.attn), ("mlp", block.mlp)):
            for name in settings.targets:
                linear = getattr(owner, name, None)
                if isinstance(linear, nn.Linear) and not isinstance(linear, LoRALinear):
                    setattr(owner, name, LoRALinear.wrap(linear, settings.rank, settings.scaling))
                    names.append(f"h.{block_index}.{owner_name}.{name}")
    if first_trainable_row is not None and first_trainable_row < gpt.config.total_vocab_size:
        gpt.wte = TrainableRowsEmbedding(gpt.wte, first_trainable_row)
    return names


@torch.no_grad()
def merge_lora(gpt: GPT) -> GPT:
    """Fold every LoRA update into its weight and join the embedding's parts, in place: a plain GPT."""
    for block in gpt.h:
        for owner in (block.attn, block.mlp):
            for name, child in list(owner.named_children()):
                if isinstance(child, LoRALinear):
                    setattr(owner, name, child.merged())
    if isinstance(gpt.wte, TrainableRowsEmbedding):
        table = gpt.wte.weight.detach()
        gpt.wte = nn.Embedding(*table.shape, device="meta")
        gpt.wte.weight = nn.Parameter(table, requires_grad=False)
    return gpt


# Files -------------------------------------------------------------------------------------------


def adapter_from_state(gpt_state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """peft-named LoRA matrices from a LoRA GPT's state dict (keys ``h.0.attn.c_attn.lora_A``)."""
    state = {}
    for key, tensor in gpt_state.items():
        module, _, kind = key.rpartition(".")
        if kind in ("lora_A", "lora_B"):
            state[f"{_PEFT_PREFIX}{module}.{kind}.weight"] = tensor.contiguous()
    return state


def adapter_to_state(peft_state: dict[str, torch.Tensor], source: str) -> dict[str, torch.Tensor]:
    """A LoRA GPT's state-dict entries (``h.0.attn.c_attn.lora_A``) from peft-named tensors."""
    state = {}
    for key, tensor in peft_state.items():
        if not (key.startswith(_PEFT_PREFIX) and key.endswith(".weight")):
            raise ValueError(f"{source}: unexpected tensor {key!r} (expected {_PEFT_PREFIX}...lora_A.weight)")
        state[key.removeprefix(_PEFT_PREFIX).removesuffix(".weight")] = tensor
    return state


def peft_adapter_config(settings: LoRASettings, base: str | None) -> dict:
    """``adapter_config.json`` as peft's ``LoraConfig`` writes it (the fields gptkit's adapters use)."""
    return {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base,
        "r": settings.rank,
        "lora_alpha": settings.alpha,
        "target_modules": list(settings.targets),
        "lora_dropout": 0.0,
        "bias": "none",
        "fan_in_fan_out": True,  # transformers' GPT-1/GPT-2 projections are Conv1D (weight transposed)
        "inference_mode": True,
        "init_lora_weights": True,
        "use_rslora": False,
        "modules_to_save": None,
    }


def write_adapter(directory: Path, settings: LoRASettings, base: str | None, peft_state: dict) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    save_safetensors(peft_state, directory / ADAPTER_WEIGHTS_NAME, metadata={"format": "pt"})
    write_json(directory / ADAPTER_CONFIG_NAME, peft_adapter_config(settings, base))


def read_adapter(directory: str | Path) -> tuple[LoRASettings, str | None, dict[str, torch.Tensor]]:
    """An adapter directory's settings, its base model's name or path, and its LoRA state-dict entries."""
    directory = Path(directory)
    path = directory / ADAPTER_CONFIG_NAME
    config = read_json_object(path)
    if config.get("peft_type") != "LORA":
        raise ValueError(f"{path}: peft_type {config.get('peft_type')!r} is not LORA")
    try:
        targets = config["target_modules"]
        settings = LoRASettings(
            int(config["r"]),
            float(config["lora_alpha"]),
            tuple([targets] if isinstance(targets, str) else targets),
        )
    except (KeyError, TypeError, ValueError, OverflowError) as e:  # OverflowError: "r": Infinity
        raise ValueError(f"{path}: bad LoRA settings ({e})") from e
    state = adapter_to_state(
        read_safetensors(directory / ADAPTER_WEIGHTS_NAME), str(directory / ADAPTER_WEIGHTS_NAME)
    )
    return settings, config.get("base_model_name_or_path"), state


def is_adapter_dir(directory: str | Path) -> bool:
    return (Path(directory) / ADAPTER_CONFIG_NAME).exists()


# Many adapters over one base ---------------------------------------------------------------------


class AdapterSet:
    """Many adapters of one base, over a single copy of its weights. The base GPT carries LoRA
    layers whose matrices are every adapter's, stacked (each B already scaled by its α/r, ranks
    padded with zeros to the largest: zero rows of A add nothing), and so are the special tokens'
    rows. Two ways to compute with them:

    - :meth:`using` one adapter: its slices go in place, the layers compute as one LoRA model
      (S-LoRA's "group by adapter": a mixed batch runs as one pass per adapter);
    - :meth:`per_row`: each row of the batch adds its own adapter's terms, gathered by a per-row
      index (punica's BGMV): a mixed batch runs as one pass of the base.

    A lock serialises the passes: two threads never compute with two settings at once.
    """

    def __init__(self, gpt: GPT, first_trainable_row: int):
        self.gpt = gpt
        add_lora(gpt, LoRASettings(1, 1.0), first_trainable_row)
        self.layers = {name: m for name, m in gpt.named_modules() if isinstance(m, LoRALinear)}
        for layer in self.layers.values():
            layer.lora_A = layer.lora_B = None  # the base's function until an adapter is used
            layer.scaling = 1.0  # each adapter's α/r is in its B
        self.row_shape = gpt.wte.rows.shape  # (specials, d)
        self.names: dict[str, int] = {}  # adapter → its index in the stacks
        self.A: dict[str, torch.Tensor] = {}  # layer → (n, r, in)
        self.B: dict[str, torch.Tensor] = {}  # layer → (n, out, r), scaled by α/r
        self.rows: torch.Tensor | None = None  # (n, specials, d)
        # Adapters added since the stacks were built: stacked once, at the first pass after them.
        self._added: list[tuple[dict[str, tuple[torch.Tensor, torch.Tensor]], torch.Tensor]] = []
        self._lock = threading.Lock()

    @property
    def first_row(self) -> int:
        return self.gpt.wte.first_row

    def add(
        self, name: str, settings: LoRASettings, lora_state: dict[str, torch.Tensor], rows: torch.Tensor
    ) -> None:
        """Keep an adapter: its LoRA state-dict entries (``h.0.attn.c_attn.lora_A``) and its rows."""
        if rows.shape != self.row_shape:
            raise ValueError(
                f"adapter {name!r}: {rows.size(0)} special-token rows, the others have {self.row_shape[0]}"
            )
        like = self.gpt.wte.frozen
        matrices = {}
        for layer_name, layer in self.layers.items():
            A = lora_state.get(f"{layer_name}.lora_A")
            B = lora_state.get(f"{layer_name}.lora_B")
            if A is None:  # a layer this adapter leaves alone
                A, B = torch.zeros(1, layer.in_features), torch.zeros(layer.out_features, 1)
            matrices[layer_name] = (A.to(like), (B.float() * settings.scaling).to(like))
        self._added.append((matrices, rows.to(like)))
        self.names[name] = len(self.names)

    def _stack_added(self) -> None:
        if not self._added:
            return
        for layer_name in self.layers:
            A = [matrices[layer_name][0] for matrices, _ in self._added]
            B = [matrices[layer_name][1] for matrices, _ in self._added]
            self.A[layer_name] = _stack_padded(self.A.get(layer_name), A, rank_dim=0)
            self.B[layer_name] = _stack_padded(self.B.get(layer_name), B, rank_dim=1)
        rows = [rows for _, rows in self._added]
        self.rows = torch.stack(rows if self.rows is None else [*self.rows, *rows])
        self._added = []

    @contextlib.contextmanager
    def using(self, name: str) -> Iterator[GPT]:
        """The base GPT computing as base + adapter ``name`` while inside."""
        k = self.names[name]
        with self._put(lambda stack: stack[k], index=None):
            yield self.gpt

    @contextlib.contextmanager
    def per_row(self, names: list[str]) -> Iterator[GPT]:
        """The base GPT computing each row of its batch (``len(names)`` rows) as base + that row's adapter."""
        index = torch.tensor([self.names[name] for name in names], device=self.gpt.wte.frozen.device)
        with self._put(lambda stack: stack, index):
            yield self.gpt

    @contextlib.contextmanager
    def _put(self, pick, index: torch.Tensor | None) -> Iterator[None]:
        with self._lock:
            self._stack_added()
            for layer_name, layer in self.layers.items():
                layer.lora_A = nn.Parameter(pick(self.A[layer_name]), requires_grad=False)
                layer.lora_B = nn.Parameter(pick(self.B[layer_name]), requires_grad=False)
                layer.adapter_index = index
            self.gpt.wte.rows = nn.Parameter(pick(self.rows), requires_grad=False)
            self.gpt.wte.adapter_index = index
            yield


def _stack_padded(stack: torch.Tensor | None, matrices: list[torch.Tensor], rank_dim: int) -> torch.Tensor:
    """``stack`` (n, ...) and ``matrices`` after it, all zero-padded along the rank to the largest."""
    matrices = [*(stack if stack is not None else []), *matrices]
    rank = max(matrix.size(rank_dim) for matrix in matrices)
    after = [0, 0] * (1 - rank_dim)  # F.pad counts dimensions from the last
    return torch.stack([F.pad(m, [*after, 0, rank - m.size(rank_dim)]) for m in matrices])
