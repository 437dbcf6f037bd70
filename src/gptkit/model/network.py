"""The GPT network of Radford et al. (2018, 2019), in one file.

    h_0 = U·W_e + W_p                           (token embedding plus position embedding)
    h_l = transformer_block(h_{l-1})  l = 1..n
    P(u) = softmax(h_n·W_e^T)                   (the output layer is the token embedding, tied)

GPT-1 puts LayerNorm after each residual add (``ln_position="post"``); GPT-2 puts it before each
sub-block and adds a final one (``ln_position="pre"``). Parameter names are those of the Hugging
Face checkpoints (``wte``, ``wpe``, ``h.N.attn.c_attn``, ...) so published weights map one to one;
``weights.py`` holds the small table for GPT-1's ``tokens_embed``/``positions_embed`` names.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from gptkit.config import IGNORE_INDEX, GPTConfig
from gptkit.model.fused_loss import fused_next_token_loss
from gptkit.model.positions import sinusoidal_positions
from gptkit.model.weights import read_pretrained, save_state_dict


@dataclass
class GPTOutput:
    logits: torch.Tensor | None  # (B, T, V): unnormalised log P(u_i | u_<i)
    hidden_states: torch.Tensor  # (B, T, d): h_n, what task heads read
    loss: torch.Tensor | None = None  # mean next-token cross-entropy, eq. (1) negated


class KVCache:
    """Keys and values of the positions already seen, per layer, so decoding reads each token once.

    Preallocated to ``capacity`` positions; ``length`` counts how many are filled.
    """

    def __init__(self, config: GPTConfig, batch_size: int, capacity: int, device=None, dtype=None):
        shape = (config.n_layer, batch_size, config.n_head, capacity, config.head_size)
        self.keys = torch.zeros(shape, device=device, dtype=dtype)
        self.values = torch.zeros(shape, device=device, dtype=dtype)
        # Each layer's (B, nh, capacity, hs) view, taken once: a decoding step appends 2 × n_layer times.
        self._layers = list(zip(self.keys.unbind(0), self.values.unbind(0)))
        self.capacity = capacity
        self.length = 0

    def append(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store this step's k, v (B, nh, T, hs) for ``layer``; return all keys and values so far."""
        keys, values = self._layers[layer]
        start, end = self.length, self.length + k.size(2)
        keys.narrow(2, start, end - start).copy_(k)
        values.narrow(2, start, end - start).copy_(v)
        return keys.narrow(2, 0, end), values.narrow(2, 0, end)

    def advance(self, n_positions: int) -> None:
        self.length += n_positions


class CausalSelfAttention(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.n_head = config.n_head
        self.dropout = config.dropout
        self.c_attn = nn.Linear(config.d_model, 3 * config.d_model)  # q, k, v in one matmul
        self.c_proj = nn.Linear(config.d_model, config.d_model)
        self.resid_dropout = nn.Dropout(config.dropout)

    def forward(
        self,
        x: torch.Tensor,
        mask: torch.Tensor | None,
        cache: KVCache | None = None,
        layer: int = 0,
    ) -> torch.Tensor:
        return self.resid_dropout(self.c_proj(self.attend(x, mask, cache, layer)))

    def attend(
        self, x: torch.Tensor, mask: torch.Tensor | None, cache: KVCache | None = None, layer: int = 0
    ) -> torch.Tensor:
        """The heads' outputs before the output projection, (B, T, C)."""
        B, T, C = x.shape
        # (B, T, 3C) → q, k, v, each (B, nh, T, hs): one view and one permute for the three.
        qkv = self.c_attn(x).view(B, T, 3, self.n_head, C // self.n_head)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)
        past = 0
        if cache is not None:
            past = cache.length
            k, v = cache.append(layer, k, v)  # (B, nh, S, hs), S = past + T
            q = q.to(k.dtype)  # a cache may hold another dtype than the weights (GPT.cache_dtype)
        # softmax(q·k^T / sqrt(d_head))·v, masked so position i sees only positions <= i. Without a
        # mask: causal from an empty cache; one new token after a cache sees every position.
        y = F.scaled_dot_product_attention(
            q,
            k,
            v,
            attn_mask=mask,
            dropout_p=self.dropout if self.training else 0.0,
            is_causal=mask is None and past == 0,
        )
        return y.transpose(1, 2).contiguous().view(B, T, C).to(x.dtype)


ACTIVATIONS = {
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "gelu": F.gelu,
    "relu": F.relu,
}


class MLP(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.c_fc = nn.Linear(config.d_model, 4 * config.d_model)
        self.c_proj = nn.Linear(4 * config.d_model, config.d_model)
        self.act = ACTIVATIONS[config.activation]
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.c_proj(self.act(self.c_fc(x))))


class Block(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.pre_ln = config.ln_position == "pre"
        self.ln_1 = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
        self.mlp = MLP(config)

    def forward(self, x, mask=None, cache: KVCache | None = None, layer: int = 0) -> torch.Tensor:
        if self.pre_ln:  # GPT-2: x + f(LN(x))
            x = x + self.attn(self.ln_1(x), mask, cache, layer)
            return x + self.mlp(self.ln_2(x))
        # GPT-1: LN(x + f(x))
        x = self.ln_1(x + self.attn(x, mask, cache, layer))
        return self.ln_2(x + self.mlp(x))


class GPT(nn.Module):
    """A decoder-only Transformer language model, GPT-1 or GPT-2 by configuration."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.config = config
        self.wte = nn.Embedding(config.total_vocab_size, config.d_model)  # W_e (tied with the output)
        if config.position_encoding == "learned":
            self.wpe = nn.Embedding(config.context_length, config.d_model)  # W_p
        else:
            self.register_buffer(
                "sinusoids", sinusoidal_positions(config.context_length, config.d_model), persistent=False
            )
        self.drop = nn.Dropout(config.dropout)
        self.h = nn.ModuleList(Block(config) for _ in range(config.n_layer))
        self.ln_f = (
            nn.LayerNorm(config.d_model, eps=config.layer_norm_eps) if config.ln_position == "pre" else None
        )
        # Inference-only replacement of the tied output layer (gptkit.model.layouts); None: h_n·W_e^T.
        self.lm_head: nn.Module | None = None
        # "int8" or "decoding-layout" once gptkit.model.layouts has stored the weights for inference.
        self.inference_layout: str | None = None
        # gptkit.model.native_step.NativeStep: every block of a decoding step in one native call, in a
        # native inference layout; None: the blocks one by one.
        self.native_step = None
        self.apply(self._init_weights)
        for block in self.h:
            self._scale_residual_init(block)

    def _init_weights(self, module: nn.Module) -> None:
        # N(0, 0.02) for every weight matrix and embedding; zero biases; LayerNorm gain 1, bias 0.
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, 0.0, self.config.init_std)
            if getattr(module, "bias", None) is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.LayerNorm):
            nn.init.ones_(module.weight)
            nn.init.zeros_(module.bias)

    def _scale_residual_init(self, block: Block) -> None:
        if self.config.scale_residual_init:
            # GPT-2 §2.3: residual-path weights scaled by 1/sqrt(N), N = 2 residual adds per block.
            std = self.config.init_std / math.sqrt(2 * self.config.n_layer)
            nn.init.normal_(block.attn.c_proj.weight, 0.0, std)
            nn.init.normal_(block.mlp.c_proj.weight, 0.0, std)

    @torch.no_grad()
    def reinitialize_blocks(self, keep: int) -> None:
        """Keep the embeddings and the first ``keep`` blocks; fresh initial weights for the rest (the
        paper's layer-transfer analysis, §5 and Figure 2 left)."""
        if not 0 <= keep <= self.config.n_layer:
            raise ValueError(f"transfer_layers must be in 0..{self.config.n_layer}, got {keep}")
        for block in self.h[keep:]:
            block.apply(self._init_weights)
            self._scale_residual_init(block)
        if self.ln_f is not None and keep < self.config.n_layer:
            self.ln_f.apply(self._init_weights)

    @property
    def cache_dtype(self) -> torch.dtype:
        """The dtype a KVCache for this model holds: the weights' own, except on a CPU, where it is
        fp32: there PyTorch's attention of one new token over the cache runs about 5× faster in
        fp32 than in bf16 (GPT-2 small's shape, 96 positions: 10 against 50 µs a layer)."""
        if self.native_step is not None:  # what the native step reads: bf16 with bf16 weights
            return self.native_step.cache_dtype
        weight = self.wte.weight
        return torch.float32 if weight.device.type == "cpu" else weight.dtype

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def forward(
        self,
        input_ids: torch.Tensor,
        labels: torch.Tensor | None = None,
        *,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        cache: KVCache | None = None,
        compute_logits: bool = True,
    ) -> GPTOutput:
        """Run the network.

        Args:
            input_ids: (B, T) token ids.
            labels: (B, T) targets aligned with ``input_ids`` (usually the same tensor); position i is
                scored on ``labels[:, i + 1]`` and ``-100`` is ignored. Gives ``loss``.
            attention_mask: (B, past + T), 1 for real tokens and 0 for padding, when rows are padded.
            position_ids: (B, T) positions; by default past + 0..T-1, skipping padding.
            cache: a KVCache to read past keys/values from and append this step's to.
            compute_logits: False skips returning the output layer's logits (task heads need only
                ``hidden_states``); with ``labels`` the output layer and the loss are then fused,
                never holding fp32 logits for the whole batch: faster and much smaller.

        Token ids out of range raise a ValueError naming them, except in training mode on a GPU
        (reading them would wait for the device every forward): the training loop checks its
        batches on the host before they move.
        """
        past = cache.length if cache is not None else 0
        self._check_inputs(input_ids, past)
        T = input_ids.size(1)

        if position_ids is None:
            if attention_mask is not None:
                # Left-padded rows start counting at their first real token.
                position_ids = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)[:, past : past + T]
            else:
                position_ids = torch.arange(past, past + T, device=input_ids.device).unsqueeze(0)
        x = self.drop(self.embed(input_ids, position_ids))  # h_0 = U·W_e + W_p, (B, T, d)

        if self.native_step is not None and self.native_step.applies(x, cache, attention_mask):
            x = self.native_step(x, cache, attention_mask)  # the blocks and ln_f in one call
        else:
            mask = self._attention_mask(attention_mask, past, T, input_ids.device)
            for layer, block in enumerate(self.h):
                x = block(x, mask, cache, layer)
            if self.ln_f is not None:
                x = self.ln_f(x)
        if cache is not None:
            cache.advance(T)

        logits = None
        if compute_logits:  # h_n·W_e^T
            logits = self.output_layer(x)
        loss = None
        if labels is not None and logits is not None:
            loss = next_token_loss(logits, labels)
        elif labels is not None:
            # Without logits to return, the output layer and the loss are fused (no fp32 logits).
            loss = fused_next_token_loss(x, self.wte.weight, labels)
        return GPTOutput(logits=logits, hidden_states=x, loss=loss)

    def embed(self, input_ids: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
        """h_0 = U·W_e + W_p of tokens at positions (any shapes that broadcast), before dropout: what
        forward feeds the blocks, and what a server's engine feeds the native step."""
        if self.config.position_encoding == "learned":
            positions = self.wpe(position_ids)
        else:
            positions = self.sinusoids[position_ids]
        return self.wte(input_ids) + positions

    def output_layer(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits h·W_e^T (tied), or through the inference replacement ``lm_head`` when there is one;
        for callers that score only some positions of ``hidden_states``."""
        return self.lm_head(hidden) if self.lm_head is not None else F.linear(hidden, self.wte.weight)

    def _check_inputs(self, input_ids: torch.Tensor, past: int) -> None:
        if input_ids.dim() != 2:
            raise ValueError(f"input_ids must be 2-D (batch, sequence), got shape {tuple(input_ids.shape)}")
        T = input_ids.size(1)
        if past + T > self.config.context_length:
            raise ValueError(
                f"sequence of {past + T} tokens is longer than the model's context of "
                f"{self.config.context_length} tokens"
            )
        # Reading ids on a GPU waits for the device, and under torch.compile breaks the graph: in
        # training, every forward would. The training loop checks its batches on the host before
        # they move, so a training forward reads only ids that are on the host already.
        training_on_device = self.training and input_ids.device.type != "cpu"
        if not (training_on_device or torch.compiler.is_compiling()):
            self.check_token_ids(input_ids)

    def check_token_ids(self, input_ids: torch.Tensor) -> None:
        """Raise a ValueError naming the first id outside the embeddings (reads the ids' values)."""
        vocab_size = self.config.total_vocab_size
        if input_ids.numel():
            low, high = torch.aminmax(input_ids)
            low, high = int(low), int(high)
            if low < 0 or high >= vocab_size:
                raise ValueError(
                    f"token id {low if low < 0 else high} is out of range: the model has {vocab_size} "
                    f"token embeddings (ids 0..{vocab_size - 1})"
                )

    @staticmethod
    def _attention_mask(attention_mask, past: int, T: int, device) -> torch.Tensor | None:
        """Boolean (B, 1, T, past+T) mask, or None where none is needed: no padding, and either no past
        (plain causal attention) or one new token (it sees every position: a decoding step)."""
        if attention_mask is None and (past == 0 or T == 1):
            return None
        S = past + T
        query_pos = torch.arange(past, S, device=device).unsqueeze(1)
        key_pos = torch.arange(S, device=device).unsqueeze(0)
        mask = (key_pos <= query_pos).unsqueeze(0).unsqueeze(0)  # (1, 1, T, S)
        if attention_mask is not None:
            keep = attention_mask[:, None, None, :S].bool()
            # A padding query still attends to itself, so its row is never all -inf (no NaN).
            mask = mask & (keep | (key_pos == query_pos))
        return mask

    def set_dropout(self, rate: float) -> None:
        """Use dropout ``rate`` everywhere (embeddings, attention weights, residual branches) from now on,
        e.g. for fine-tuning loaded weights with another rate; ``config.dropout`` records it."""
        self.config = dataclasses.replace(self.config, dropout=rate)  # checks 0 <= rate < 1
        for module in self.modules():
            if isinstance(module, nn.Dropout):
                module.p = rate
            elif isinstance(module, CausalSelfAttention):
                module.dropout = rate

    # Special tokens ------------------------------------------------------------------------------

    @torch.no_grad()
    def add_special_tokens(self, n_new: int) -> None:
        """Append ``n_new`` token rows (N(0, init_std)) after the existing ones; the rest are unchanged."""
        if n_new <= 0:
            return
        old = self.wte.weight
        new_rows = torch.empty(n_new, old.size(1), device=old.device, dtype=old.dtype)
        nn.init.normal_(new_rows, 0.0, self.config.init_std)
        embedding = nn.Embedding(old.size(0) + n_new, old.size(1), device=old.device, dtype=old.dtype)
        embedding.weight.copy_(torch.cat([old, new_rows]))
        self.wte = embedding
        # A new config, not an edit: the old one may be shared (a caller's, another model's).
        self.config = dataclasses.replace(self.config, n_special=self.config.n_special + n_new)

    # Weights in and out --------------------------------------------------------------------------

    @classmethod
    def from_pretrained(
        cls,
        source: str | Path,
        *,
        dtype: torch.dtype | None = None,
        device: str | torch.device | None = None,
        n_head: int = 12,
        convert_embeddings: Callable[[GPT], None] | None = None,
        convert_block: Callable[[Block], nn.Module] | None = None,
    ) -> GPT:
        """Load a Hugging Face-format directory, a gptkit directory, or OpenAI's original GPT-1 release.

        A name such as ``"gpt2"`` that is not a local directory is downloaded from the Hugging Face Hub
        (needs ``huggingface_hub`` and a network). ``n_head`` is for OpenAI's release, which does not
        record it. The model is returned in eval mode.

        An inference layout can be applied while loading (:func:`gptkit.model.layouts.load_int8`), so
        that the load never holds the whole model in the file's precision: ``convert_embeddings(model)``
        runs once the tensors outside the blocks are in (the blocks are still shapes only), and
        ``convert_block(block)`` replaces each block as soon as its weights are in, before the next
        is read.
        """
        weights = read_pretrained(source, n_head=n_head)
        with torch.device("meta"), _SkipInit():  # shapes only: every tensor is the file's, copied next
            model = cls(weights.config)
        model._load_checked(
            weights.state,
            weights.origin,
            dtype=dtype,
            device=device,
            convert_embeddings=convert_embeddings,
            convert_block=convert_block,
        )
        return model.eval()

    def _load_checked(
        self,
        state: dict[str, torch.Tensor],
        source: str = "checkpoint",
        *,
        dtype: torch.dtype | None = None,
        device: str | torch.device | None = None,
        convert_embeddings: Callable[[GPT], None] | None = None,
        convert_block: Callable[[Block], nn.Module] | None = None,
    ) -> None:
        """Make ``state`` (our parameter names) this model's parameters, floating-point ones in
        ``dtype`` (default: the model's own), on ``device`` (default: the CPU); the model may be on
        the meta device. A missing, unexpected or misshapen tensor is a ValueError naming ``source``,
        the file it came from. ``state`` is emptied as its tensors are copied: each one is dropped
        before the next is read, so a file's pages (:func:`gptkit.io.read_safetensors`) are resident
        one tensor at a time, and the load's peak is about the model's size, not twice it. The
        tensors outside the blocks are loaded first, then ``convert_embeddings(self)`` is called, then
        the blocks one at a time, each replaced by ``convert_block(block)`` (see from_pretrained).
        """
        expected = self.state_dict()
        missing = sorted(set(expected) - set(state))
        unexpected = sorted(set(state) - set(expected))
        if missing or unexpected:
            raise ValueError(
                f"{source}: parameters do not match the config"
                + (f"; missing: {', '.join(missing[:8])}" if missing else "")
                + (f"; unexpected: {', '.join(unexpected[:8])}" if unexpected else "")
            )
        for name in state:  # no variable left holding a tensor: each is dropped once copied
            if state[name].shape != expected[name].shape:
                raise ValueError(
                    f"{source}: {name} has shape {tuple(state[name].shape)}, the config expects {tuple(expected[name].shape)}"
                )
        device = torch.device(device or "cpu")

        def copied(names: list[str], prefix: str = "") -> dict[str, torch.Tensor]:
            loaded = {}
            for name in names:
                like, tensor = expected.pop(name), state.pop(name)
                target = dtype if dtype is not None and like.is_floating_point() else like.dtype
                memory = torch.empty(like.shape, dtype=target, device=device)
                loaded[name.removeprefix(prefix)] = memory.copy_(tensor)
                del tensor
            return loaded

        # What is outside the blocks first (the embeddings, the final LayerNorm), then block by block.
        outside_blocks = [name for name in expected if not name.startswith("h.")]
        self.load_state_dict(copied(outside_blocks), strict=False, assign=True)
        if self.config.position_encoding == "sinusoidal":  # the one buffer: computed, never saved
            table = sinusoidal_positions(self.config.context_length, self.config.d_model)
            self.sinusoids = table.to(device=device, dtype=dtype or table.dtype)
        if convert_embeddings is not None:
            convert_embeddings(self)
        for i, block in enumerate(self.h):
            prefix = f"h.{i}."
            block.load_state_dict(copied([n for n in expected if n.startswith(prefix)], prefix), assign=True)
            if convert_block is not None:
                self.h[i] = convert_block(block)

    def require_original_weights(self, action: str) -> None:
        """Refuse ``action`` (save, export) where the weights are in an inference-only layout
        (int8, packed, native): only the original weights can be written out."""
        if self.inference_layout:
            raise ValueError(
                f"this model's weights are in an inference-only format ({self.inference_layout}): "
                f"{action} the original"
            )

    def save_pretrained(self, directory: str | Path) -> None:
        """Write ``config.json`` and ``model.safetensors`` in the Hugging Face format."""
        self.require_original_weights("save")
        save_state_dict(self.config, self.state_dict(), directory)


class _SkipInit(TorchFunctionMode):
    """torch.nn.init's functions leave their tensor as it is: for modules built on the meta device,
    whose meta kernels for random initialisation would import much of PyTorch's Python
    decomposition library (about 75 MB resident for the life of the process)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if getattr(func, "__module__", None) == "torch.nn.init":
            return args[0] if args else kwargs["tensor"]  # the tensor, left as it is
        return func(*args, **kwargs)


def next_token_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean of -log P(u_{i+1} | u_<=i) over positions whose target is not -100 (eq. 1, negated)."""
    shifted_logits = logits[:, :-1, :]  # position i predicts token i+1; the last predicts nothing
    targets = labels[:, 1:]
    return F.cross_entropy(
        shifted_logits.reshape(-1, shifted_logits.size(-1)).float(),
        targets.reshape(-1),
        ignore_index=IGNORE_INDEX,
    )
