"""Prompt → completion examples for generation fine-tuning: their tokens, the positions the loss
counts, and batches of them.

An example is the prompt as the model's chat template lays it out (one user turn, ending where the
answer begins), then the completion's tokens, then the end-of-text token:

    User: <prompt>\\nAssistant:  ·  <completion>  ·  <|endoftext|>
    └──────── not counted ────────┘ └──── counted (L2) ─────┘

The completion loss (L2) counts the completion's tokens and the end token, so that the model learns
the answer and where it stops; the language-model loss (L1, with ``--lm-coef``) counts every token
after the first. Too long for ``max_length``, the prompt loses tokens from its start (the end, next
to the answer, is what the answer follows); a completion that does not fit by itself is a bad row.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from gptkit.config import IGNORE_INDEX
from gptkit.data.batching import padded_length
from gptkit.data.examples import Example, check_text
from gptkit.data.formats import DataError
from gptkit.tokenizer import Tokenizer
from gptkit.tokenizer.bytelevel import END_OF_TEXT
from gptkit.tokenizer.chat_template import completion_text, prompt_text


@dataclass
class CompletionExample:
    ids: list[int]  # the prompt's tokens, the completion's, the end token
    answer_start: int  # where the completion's tokens begin in ids
    prompt: str
    completion: str
    source: str = ""

    @property
    def prompt_ids(self) -> list[int]:
        return self.ids[: self.answer_start]

    @property
    def answer_ids(self) -> list[int]:
        """The completion's tokens, without the end token."""
        return self.ids[self.answer_start : -1]


def end_of_text_id(tokenizer: Tokenizer) -> int:
    """The token a completion ends with, where generation stops."""
    if END_OF_TEXT not in tokenizer.special_tokens:
        raise ValueError(
            f"generation fine-tuning ends every completion with {END_OF_TEXT}, which this tokenizer "
            "lacks (GPT-1's has none): use a byte-level tokenizer (GPT-2's, or `gptkit tokenizer "
            "train --style gpt2`)"
        )
    return tokenizer.special_tokens[END_OF_TEXT]


def encode_completion(
    example: Example, tokenizer: Tokenizer, template: str, max_length: int
) -> CompletionExample:
    """One example's tokens, cut to ``max_length`` as the module docstring says."""
    check_text(example, "generation")
    prompt, completion = str(example.fields["prompt"]), str(example.fields["completion"])
    end = end_of_text_id(tokenizer)
    prompt_ids = tokenizer.encode(prompt_text(template, prompt, END_OF_TEXT))
    answer_ids = [*tokenizer.encode(completion_text(completion)), end]
    if len(answer_ids) >= max_length:
        raise DataError(
            f"{example.source}: the completion is {len(answer_ids)} tokens with its end token, "
            f"more than the {max_length - 1} that fit after a prompt (max_length {max_length})"
        )
    prompt_ids = prompt_ids[max(0, len(prompt_ids) + len(answer_ids) - max_length) :]
    return CompletionExample([*prompt_ids, *answer_ids], len(prompt_ids), prompt, completion, example.source)


def encode_completions(
    examples: Sequence[Example],
    tokenizer: Tokenizer,
    template: str,
    max_length: int,
    skip_bad_rows: bool = False,
) -> tuple[list[CompletionExample], int]:
    """Every example encoded; returns them and how many bad rows were skipped."""
    encoded, skipped = [], 0
    for example in examples:
        try:
            encoded.append(encode_completion(example, tokenizer, template, max_length))
        except DataError:
            if not skip_bad_rows:
                raise
            skipped += 1
    return encoded, skipped


def collate_completions(
    batch: Sequence[CompletionExample], pad_to_multiple: int = 1, max_length: int | None = None
) -> dict[str, torch.Tensor]:
    """Right-padded ``input_ids`` (N, T) with their targets: ``completion_labels`` hold the
    completion's tokens and the end token, ``lm_labels`` every token, -100 elsewhere (padding is
    never counted; with causal attention no real token sees it)."""
    T = padded_length(max(len(e.ids) for e in batch), max_length, pad_to_multiple)
    input_ids = torch.zeros(len(batch), T, dtype=torch.long)
    completion_labels = torch.full((len(batch), T), IGNORE_INDEX, dtype=torch.long)
    lm_labels = torch.full((len(batch), T), IGNORE_INDEX, dtype=torch.long)
    for i, example in enumerate(batch):
        ids = torch.tensor(example.ids)
        input_ids[i, : len(ids)] = ids
        lm_labels[i, : len(ids)] = ids
        completion_labels[i, example.answer_start : len(ids)] = ids[example.answer_start :]
    return {"input_ids": input_ids, "completion_labels": completion_labels, "lm_labels": lm_labels}
