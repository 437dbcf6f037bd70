"""A GPT fine-tuned to answer: the loss on the completion, and the paper's auxiliary LM loss.

    L2 = −Σ log P(c_j | prompt, c_<j)   over the completion's tokens and its end token
    L1 = −Σ log P(u_i | u_<i)           over the whole sequence (GPT-1 eq. 1)
    L3 = L2 + λ·L1                      (GPT-1 eq. 5, with --lm-coef λ)

each a mean over the tokens it counts. There is no head: the output layer W_e^T is the one that
writes the answer. What :func:`gptkit.train.finetune.tasks.finetune` writes for ``--task generation`` is
a plain language-model folder (or a LoRA adapter of one) with its chat template, which
``gptkit generate``, ``GPT.from_pretrained`` and ``gptkit serve`` read like any other.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn as nn

from gptkit import hub
from gptkit.config import IGNORE_INDEX
from gptkit.data.batching import length_batches
from gptkit.io import read_json_object
from gptkit.model.fused_loss import fused_next_token_loss
from gptkit.model.lora import add_lora, is_adapter_dir, merge_lora, read_adapter
from gptkit.model.network import GPT

# Beside a generation run's weights: the task and, for a LoRA adapter, its base model.
GENERATION_NAME = "generation.json"


@dataclass
class CompletionOutput:
    loss: torch.Tensor  # L3 = L2 + λ·L1 (L2 alone with λ = 0)
    completion_loss: torch.Tensor  # L2
    lm_loss: torch.Tensor | None  # L1, where λ > 0
    target_tokens: torch.Tensor  # the completion tokens counted: 0 means nothing to learn from


class CompletionModel(nn.Module):
    """``gpt`` trained on L2 + λ·L1 (``lm_coef`` = λ; 0 trains on the completions alone)."""

    def __init__(self, gpt: GPT, lm_coef: float = 0.5):
        super().__init__()
        self.gpt, self.lm_coef = gpt, lm_coef

    def forward(
        self,
        input_ids: torch.Tensor,  # (N, T), right-padded
        completion_labels: torch.Tensor,  # (N, T): the completion's ids, -100 elsewhere
        lm_labels: torch.Tensor | None = None,  # (N, T): every real token's id, -100 on padding
    ) -> CompletionOutput:
        hidden = self.gpt(input_ids, compute_logits=False).hidden_states
        weight = self.gpt.wte.weight
        # The fused loss divides by max(count, 1): a micro-batch without a completion token gives 0,
        # with no gradient, never 0/0.
        completion_loss = fused_next_token_loss(hidden, weight, completion_labels)
        loss, lm_loss = completion_loss, None
        if self.lm_coef > 0 and lm_labels is not None:
            lm_loss = fused_next_token_loss(hidden, weight, lm_labels)
            loss = completion_loss + self.lm_coef * lm_loss
        target_tokens = (completion_labels[:, 1:] != IGNORE_INDEX).sum()
        return CompletionOutput(loss, completion_loss, lm_loss, target_tokens)

    @torch.no_grad()
    def completion_loss_of(self, batches: Sequence[dict[str, torch.Tensor]]) -> float:
        """L2 over every completion token of ``batches`` (a token-weighted mean, in eval mode)."""
        was_training = self.training
        self.eval()
        total, count = 0.0, 0
        device = self.gpt.wte.weight.device
        for batch in batches:
            out = self(batch["input_ids"].to(device), batch["completion_labels"].to(device))
            tokens = int(out.target_tokens)
            total += float(out.completion_loss) * tokens
            count += tokens
        self.train(was_training)
        return total / max(count, 1)


def completion_batches(examples: Sequence, batch_size: int, collate) -> list[dict[str, torch.Tensor]]:
    """``examples`` (with ``.ids``) collated in batches of similar length, for evaluation."""
    lengths = [len(e.ids) for e in examples]
    return [collate([examples[i] for i in indices]) for indices in length_batches(lengths, batch_size)]


def is_generation_adapter(directory: str | Path) -> bool:
    """Whether ``directory`` is a LoRA adapter written by a generation fine-tuning."""
    return is_adapter_dir(directory) and (Path(directory) / GENERATION_NAME).is_file()


def merged_generation_adapter(directory: str | Path) -> GPT:
    """A generation run's LoRA adapter applied to its base model and merged: a plain GPT (fp32, on
    the CPU) that decodes like any other."""
    directory = Path(directory)
    info = read_json_object(directory / GENERATION_NAME)
    lora = info.get("lora") or {}
    base = lora.get("base")
    if not base:
        raise ValueError(
            f"{directory / GENERATION_NAME}: a LoRA adapter without its base model ('lora.base')"
        )
    base_dir = hub.resolve(base)  # a folder (recorded absolute) or a Hub name
    gpt = GPT.from_pretrained(base_dir)
    settings, _, lora_state = read_adapter(directory)
    add_lora(gpt, settings)
    missing = [k for k in lora_state if k not in gpt.state_dict()]
    if missing:
        raise ValueError(f"{directory}: the adapter's {missing[0]} has no layer in {base}")
    gpt.load_state_dict(lora_state, strict=False)
    return merge_lora(gpt).eval()
