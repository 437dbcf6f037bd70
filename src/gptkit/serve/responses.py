"""Response bodies: ``/v1/completions`` (whole, or as stream chunks) and ``/v1/embeddings`` as OpenAI
writes them, ``/v1/classify`` as vLLM does."""

from __future__ import annotations

import base64
import struct
from dataclasses import dataclass, field
from typing import Any

from gptkit.generation.incremental import token_pieces
from gptkit.serve.engine import Event, TokenLogprob
from gptkit.tokenizer import Tokenizer


@dataclass
class Choice:
    """One completion being assembled from the engine's events."""

    index: int
    prompt_ids: list[int]
    prompt_text: str
    echo: bool = False  # the text starts with the prompt
    text: str = ""
    scored: list[tuple[int, TokenLogprob]] = field(default_factory=list)  # (token id, its log P)
    prompt_scored: list[TokenLogprob] | None = None
    finish_reason: str | None = None
    completion_tokens: int = 0
    error: str | None = None

    def add(self, event: Event) -> None:
        self.text += event.text
        if event.prompt_logprobs is not None:
            self.prompt_scored = event.prompt_logprobs
        if event.token_id is not None and event.logprob is not None:
            self.scored.append((event.token_id, event.logprob))
        if event.finish_reason is not None:
            self.finish_reason = event.finish_reason
            self.completion_tokens = event.completion_tokens
        self.error = event.error or self.error

    @property
    def done(self) -> bool:
        return self.finish_reason is not None or self.error is not None


class LogprobsWriter:
    """OpenAI's legacy ``logprobs`` object: ``tokens``, ``token_logprobs``, ``top_logprobs`` (a dict of
    token text to log P per position) and ``text_offset`` (where each token starts in the text).

    As in OpenAI's, the ``tokens`` add up to the text returned and ``text_offset`` indexes it, also
    where the returned text is not the tokens' raw text joined (GPT-1's detokenized text)."""

    def __init__(self, tokenizer: Tokenizer):
        self.tokenizer = tokenizer

    def token(self, token_id: int) -> str:
        return self.tokenizer.decode([token_id])

    def write(
        self, entries: list[tuple[int, TokenLogprob]], offset: int, texts: list[str]
    ) -> tuple[dict[str, Any], int]:
        """The object for ``entries`` whose text is ``texts`` (one piece each), the first starting at
        ``offset``; and the offset after them. Offsets count in the prompt followed by the
        completion, echoed or not, as OpenAI's do."""
        offsets = []
        for text in texts:
            offsets.append(offset)
            offset += len(text)
        body = {
            "tokens": texts,
            "token_logprobs": [scored.logprob for _, scored in entries],
            "top_logprobs": [
                None if scored.top is None else {self.token(t): lp for t, lp in scored.top}
                for _, scored in entries
            ],
            "text_offset": offsets,
        }
        return body, offset

    def prompt_pieces(self, choice: Choice) -> list[str]:
        """The prompt's text, one piece per prompt token."""
        return token_pieces(self.tokenizer, choice.prompt_ids, choice.prompt_text)

    def choice(self, choice: Choice) -> dict[str, Any]:
        """The logprobs of a whole choice: its prompt's too when echoed."""
        completion = token_pieces(
            self.tokenizer, [token for token, _ in choice.scored], choice.text, context=choice.prompt_ids
        )
        if choice.echo:
            prompt = list(zip(choice.prompt_ids, choice.prompt_scored or []))
            return self.write(prompt + choice.scored, 0, self.prompt_pieces(choice) + completion)[0]
        return self.write(choice.scored, len(choice.prompt_text), completion)[0]


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def completion_body(
    completion_id: str,
    created: int,
    model: str,
    choices: list[Choice],
    prompt_tokens: int,
    writer: LogprobsWriter | None,
) -> dict[str, Any]:
    """The whole response of a request that did not stream."""
    bodies = []
    for choice in choices:
        bodies.append(
            {
                "index": choice.index,
                "text": (choice.prompt_text if choice.echo else "") + choice.text,
                "logprobs": None if writer is None else writer.choice(choice),
                "finish_reason": choice.finish_reason,
            }
        )
    return {
        "id": completion_id,
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": bodies,
        "usage": usage(prompt_tokens, sum(c.completion_tokens for c in choices)),
    }


def chunk_body(
    completion_id: str,
    created: int,
    model: str,
    index: int,
    text: str,
    logprobs: dict | None = None,
    finish_reason: str | None = None,
) -> dict[str, Any]:
    """One server-sent event of a streamed response."""
    return {
        "id": completion_id,
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": [{"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish_reason}],
    }


def embeddings_body(
    model: str, vectors: list[list[float]], prompt_tokens: int, as_base64: bool
) -> dict[str, Any]:
    """OpenAI's embeddings list; base64 holds each vector's little-endian float32s."""
    data = []
    for index, vector in enumerate(vectors):
        embedding: list[float] | str = vector
        if as_base64:
            embedding = base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode("ascii")
        data.append({"object": "embedding", "index": index, "embedding": embedding})
    return {
        "object": "list",
        "data": data,
        "model": model,
        "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens},
    }


def classification_body(
    classify_id: str, created: int, model: str, records: list[dict], prompt_tokens: int
) -> dict[str, Any]:
    """vLLM's classify response from :meth:`TaskModel.records`: ``label`` (a class name, or the index
    of the most likely choice), ``probs`` in the head's order. A regression model (STS-B) has no
    classes: its ``score`` is the prediction, ``label`` null and ``probs`` empty."""
    data = []
    for index, record in enumerate(records):
        if "probabilities" not in record:  # regression
            data.append(
                {"index": index, "label": None, "probs": [], "num_classes": 1, "score": record["label"]}
            )
            continue
        probs = list(record["probabilities"].values())
        data.append(
            {"index": index, "label": str(record["label"]), "probs": probs, "num_classes": len(probs)}
        )
    return {
        "id": classify_id,
        "object": "list",
        "created": created,
        "model": model,
        "data": data,
        "usage": {
            "prompt_tokens": prompt_tokens,
            "total_tokens": prompt_tokens,
            "completion_tokens": 0,
            "prompt_tokens_details": None,
        },
    }
