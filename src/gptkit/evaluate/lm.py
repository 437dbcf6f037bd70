"""Language-model evaluation: perplexity over long text, and GPT-1's zero-shot heuristics (§5).

Zero-shot: no fine-tuning, only the pre-trained language model's probabilities.
- sentiment: append " very" to the text and compare the probabilities of "positive" and "negative";
- multiple choice: the answer with the highest average log-probability given the context;
- acceptability: the average token log-probability of the sentence, thresholded (the threshold is
  fitted on a separate split, never on the one reported).
The heuristics score many (prefix, continuation) pairs per forward pass (continuation_logprobs);
continuation_logprob, one pair at a time, is the reference they are tested against.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch

from gptkit.data.batching import length_batches, pad_right
from gptkit.data.metrics import accuracy, matthews_corrcoef
from gptkit.data.shards import TokenShard
from gptkit.generation.text import InferenceConfig
from gptkit.model import GPT

# The most output-layer rows × vocabulary entries computed at once when scoring continuations or
# perplexity windows (2^26 fp32 values: 256 MB), so that a large batch never holds all its logits.
LOGIT_CHUNK_ELEMENTS = 2**26
# Sequences per forward pass when scoring continuations, here and in lm-eval's runs (gptkit harness).
DEFAULT_BATCH_SIZE = 32


def strided_windows(n_tokens: int, context: int, stride: int) -> list[tuple[int, int, int]]:
    """(start, end, index inside the window of its first target not scored before) of the windows
    that score each of ``n_tokens`` tokens once, windows starting every ``stride`` tokens."""
    windows = []
    scored_until = 1  # targets 1..scored_until-1 done (token 0 is never a target)
    start = 0
    while scored_until < n_tokens:
        end = min(start + context, n_tokens)
        windows.append((start, end, scored_until - start))
        scored_until = end
        if end == n_tokens:
            break
        # With stride == context the next window would start at its own first target, which nothing
        # before it in the window predicts: it starts a token earlier, so that every token is scored.
        start = min(start + stride, scored_until - 1)
    return windows


@torch.no_grad()
def perplexity(
    model: GPT, ids: Sequence[int], stride: int | None = None, batch_size: int = 8
) -> dict[str, float]:
    """Strided sliding-window perplexity of a long token sequence.

    Windows of the model's context start every ``stride`` tokens (default: half the context); each
    token is scored once, in the window where it has the most context before it (at least
    context − stride tokens, and at least one, except at the start). The output layer runs only at
    the positions scored, a chunk at a time: never the fp32 logits of every position of a batch of
    windows (for GPT-2 at context 1024, batch 8, 1.6 GB), most of which an earlier window scored.
    """
    context = model.config.context_length
    stride = stride or max(context // 2, 1)
    if not 0 < stride <= context:
        raise ValueError(f"stride must be in 1..{context}, got {stride}")
    if len(ids) < 2:
        raise ValueError("perplexity needs at least 2 tokens")
    if context < 2:  # a window must hold a token and one before it to score anything
        raise ValueError(f"perplexity needs a context of at least 2 tokens, got {context}")
    if isinstance(ids, np.ndarray):  # a shard's memory-mapped tokens, as they are
        tokens = torch.from_numpy(ids.astype(np.int64))
    else:
        tokens = torch.as_tensor(list(ids), dtype=torch.long)
    windows = strided_windows(len(tokens), context, stride)
    nll, count = 0.0, 0
    device = next(model.parameters()).device
    # Windows of one length run together, batch_size at a time (all but possibly the last are full).
    for length in sorted({end - start for start, end, _ in windows}):
        same = [w for w in windows if w[1] - w[0] == length]
        for i in range(0, len(same), batch_size):
            batch = same[i : i + batch_size]
            chunk = torch.stack([tokens[start:end] for start, end, _ in batch]).to(device)  # (B, T)
            hidden = model(chunk, compute_logits=False).hidden_states  # (B, T, d)
            # Position t predicts token t + 1: a window's targets from first_target on are predicted
            # at positions first_target − 1 .. T − 2; the earlier ones were scored by an earlier window.
            first = torch.tensor([first_target - 1 for _, _, first_target in batch], device=device)
            scored = torch.arange(length - 1, device=device) >= first[:, None]  # (B, T-1)
            picked, _ = _target_logprobs(model, hidden[:, :-1][scored], chunk[:, 1:][scored])
            # Summed in fp64: a long text adds up millions of fp32 log-probabilities.
            nll -= float(picked.double().sum())
            count += picked.numel()
    mean = nll / count
    return {"tokens": count, "nll": mean, "perplexity": math.exp(min(mean, 50.0))}


@dataclass
class PerplexityConfig(InferenceConfig):
    """Perplexity of a text file under a model (strided sliding window)."""

    file: str = field(metadata={"help": "Text file to score.", "positional": True})
    model: str = field(metadata={"help": "Model folder or Hub name (gpt2, openai-gpt, org/name@rev)."})
    tokenizer: str | None = field(
        default=None, metadata={"help": "Tokenizer folder or Hub name (default: the model's)."}
    )
    stride: int | None = field(default=None, metadata={"help": "Window step (default: half the context)."})


def perplexity_of_file(config: PerplexityConfig) -> dict:
    """:func:`perplexity` of ``config.file``, with its bits per byte."""
    model, tokenizer = config.load(config.model, config.tokenizer, decoding=False)
    text = Path(config.file).read_text(encoding="utf-8")
    result = perplexity(model, tokenizer.encode(text), stride=config.stride)
    # Over the text's bytes: comparable with models of other tokenizers (the first token is unscored).
    result["bits_per_byte"] = bits_per_byte(result["nll"], result["tokens"], len(text.encode("utf-8")))
    return {"file": config.file, **result}


def bits_per_byte(nll: float, tokens: int, text_bytes: int) -> float:
    """Total negative log-likelihood in bits over the UTF-8 bytes of the text scored: comparable
    across tokenizers and vocabulary sizes, unlike a per-token loss or perplexity.
    ``nll`` is the mean per token in nats, over ``tokens`` tokens (as :func:`perplexity` returns)."""
    if text_bytes <= 0:
        raise ValueError(f"bits per byte needs a text of at least one byte, got {text_bytes}")
    return nll * tokens / math.log(2) / text_bytes


def held_out_bits_per_byte(model: GPT, data_dir: str | Path, batch_size: int = 16) -> dict[str, float]:
    """Bits per byte of the validation split written by `gptkit prepare` in ``data_dir``: every token
    scored once (windows of the model's context, each with a token of overlap; the very first token
    has no context and is the only one not scored), over the split's UTF-8 text bytes."""
    shard = TokenShard.open(data_dir, "val")
    text_bytes = shard.meta.get("text_bytes", {}).get("val")
    if not isinstance(text_bytes, int):
        raise ValueError(
            f"{Path(data_dir) / 'meta.json'}: no text_bytes.val (shards prepared before gptkit counted "
            "their text's bytes): re-run `gptkit prepare`"
        )
    result = perplexity(model, shard.tokens, stride=model.config.context_length, batch_size=batch_size)
    return {
        **result,
        "bytes": text_bytes,
        "bits_per_byte": bits_per_byte(result["nll"], result["tokens"], text_bytes),
    }


@torch.no_grad()
def continuation_logprob(model: GPT, prefix: Sequence[int], continuation: Sequence[int]) -> tuple[float, int]:
    """(Σ log P(continuation | prefix), number of continuation tokens), left-truncating the prefix to fit."""
    room = model.config.context_length - len(continuation)
    if room < 1:
        continuation = list(continuation)[: model.config.context_length - 1]
        room = 1
    prefix = list(prefix)[-room:]
    if not prefix:
        raise ValueError("a continuation needs at least one token of prefix")
    device = next(model.parameters()).device
    ids = torch.tensor([prefix + list(continuation)], device=device)
    log_probs = model(ids).logits[0, len(prefix) - 1 : -1].float().log_softmax(-1)
    picked = log_probs.gather(1, ids[0, len(prefix) :, None]).squeeze(1)
    return float(picked.sum()), len(continuation)


def _fit_to_context(
    context_length: int, prefix: Sequence[int], continuation: Sequence[int]
) -> tuple[list[int], list[int]]:
    """The pair as continuation_logprob scores it: a continuation past context − 1 tokens loses its end,
    and the prefix is cut from the left so that prefix + continuation fits the context."""
    continuation = list(continuation)[: context_length - 1]
    prefix = list(prefix)[-(context_length - len(continuation)) :]
    if not prefix:
        raise ValueError("a continuation needs at least one token of prefix")
    return prefix, continuation


def _target_logprobs(
    model: GPT, hidden: torch.Tensor, targets: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """log P(targets[i] | hidden[i]) in fp32, for (N, d) final hidden states and (N,) target ids, and
    whether each target is the most likely token there (what greedy decoding would pick).

    The output layer and the log-softmax run on a chunk of rows at a time, so that at most
    LOGIT_CHUNK_ELEMENTS logits (and their log-softmax) exist at once, however many rows are scored.
    """
    chunk_rows = max(1, LOGIT_CHUNK_ELEMENTS // model.config.total_vocab_size)
    picked = torch.empty(len(targets), device=hidden.device)
    is_top = torch.empty(len(targets), dtype=torch.bool, device=hidden.device)
    for c in range(0, len(targets), chunk_rows):
        part = slice(c, c + chunk_rows)
        log_probs = model.output_layer(hidden[part]).float().log_softmax(-1)
        picked[part] = log_probs.gather(1, targets[part, None]).squeeze(1)
        is_top[part] = picked[part] >= log_probs.max(-1).values  # ties count as greedy
    return picked, is_top


class ContinuationScore(NamedTuple):
    """A continuation's Σ log P(continuation | prefix), its number of tokens, and whether each of its
    tokens was the most likely one (greedy decoding would have produced it)."""

    logprob: float
    n_tokens: int
    greedy: bool


@torch.no_grad()
def continuation_scores(
    model: GPT, pairs: Sequence[tuple[Sequence[int], Sequence[int]]], batch_size: int = DEFAULT_BATCH_SIZE
) -> list[ContinuationScore]:
    """continuation_logprob of every (prefix, continuation) pair, in order, many pairs per forward
    pass, and whether greedy decoding would have produced the continuation.

    Each pair is truncated as continuation_logprob truncates it; the pairs run longest first,
    ``batch_size`` at a time, right-padded (:mod:`gptkit.data.batching`: no mask or position ids
    needed). The output layer runs only where a continuation token is predicted.
    """
    context = model.config.context_length
    fitted = [_fit_to_context(context, prefix, continuation) for prefix, continuation in pairs]
    device = next(model.parameters()).device
    lengths = [len(prefix) + len(continuation) for prefix, continuation in fitted]
    results: list[ContinuationScore] = [ContinuationScore(0.0, 0, True)] * len(fitted)
    for rows in length_batches(lengths, batch_size, longest_first=True):
        sequences = [fitted[i][0] + fitted[i][1] for i in rows]
        ids = pad_right(sequences, max_length=context).to(device)  # token 0 pads: it is never read
        width = ids.size(1)
        # Position t predicts token t + 1: a row's continuation is predicted at
        # len(prefix) − 1 ≤ t < len(prefix) + len(continuation) − 1.
        first = torch.tensor([len(fitted[i][0]) - 1 for i in rows], device=device)
        stop = torch.tensor([len(s) - 1 for s in sequences], device=device)
        positions = torch.arange(width, device=device)
        scored = (positions >= first[:, None]) & (positions < stop[:, None])  # (B, width)
        row_of, at = scored.nonzero(as_tuple=True)
        targets = ids[row_of, at + 1]
        hidden = model(ids, compute_logits=False).hidden_states
        picked, is_top = _target_logprobs(model, hidden[row_of, at], targets)
        totals = torch.zeros(len(rows), device=device).index_add_(0, row_of, picked).tolist()
        misses = torch.zeros(len(rows), device=device).index_add_(0, row_of, (~is_top).float()).tolist()
        for row, i in enumerate(rows):
            results[i] = ContinuationScore(totals[row], len(fitted[i][1]), misses[row] == 0)
    return results


def continuation_logprobs(
    model: GPT, pairs: Sequence[tuple[Sequence[int], Sequence[int]]], batch_size: int = DEFAULT_BATCH_SIZE
) -> list[tuple[float, int]]:
    """(Σ log P(continuation | prefix), tokens) of every pair: :func:`continuation_scores` without
    the greedy flag."""
    return [(score.logprob, score.n_tokens) for score in continuation_scores(model, pairs, batch_size)]


def zeroshot_sentiment(
    model: GPT,
    encode,
    texts: Sequence[str],
    labels: Sequence[str],
    positive: str = "1",
    batch_size: int = 32,
) -> dict[str, float]:
    """Append " very"; predict positive when log P("positive") > log P("negative")."""
    pos_ids, neg_ids = encode("positive"), encode("negative")
    pairs = []
    for text in texts:
        prefix = encode(text + " very")
        pairs += [(prefix, pos_ids), (prefix, neg_ids)]
    scores = [total for total, _ in continuation_logprobs(model, pairs, batch_size)]
    predictions = [int(scores[2 * i] > scores[2 * i + 1]) for i in range(len(texts))]
    targets = [int(str(label) == positive) for label in labels]
    return {"accuracy": accuracy(predictions, targets), "examples": len(targets)}


def zeroshot_multiple_choice(
    model: GPT,
    encode,
    contexts: Sequence[str],
    choices: Sequence[Sequence[str]],
    labels: Sequence[int],
    batch_size: int = 32,
) -> dict[str, float]:
    """Pick the answer with the highest average token log-probability given the context."""
    pairs, sizes = [], []
    for context, answers in zip(contexts, choices):
        prefix = encode(context)
        pairs += [(prefix, encode(answer)) for answer in answers]
        sizes.append(len(answers))
    scores = iter(total / max(n, 1) for total, n in continuation_logprobs(model, pairs, batch_size))
    predictions = []
    for size in sizes:
        example = [next(scores) for _ in range(size)]
        predictions.append(max(range(size), key=example.__getitem__))
    return {"accuracy": accuracy(predictions, list(labels)), "examples": len(predictions)}


def average_logprobs(
    model: GPT, encode, texts: Sequence[str], start_ids: Sequence[int], batch_size: int = 32
) -> list[float]:
    """Each text's average token log-probability after ``start_ids``."""
    pairs = [(list(start_ids), encode(text)) for text in texts]
    return [total / max(n, 1) for total, n in continuation_logprobs(model, pairs, batch_size)]


def zeroshot_acceptability(
    model: GPT,
    encode,
    start_ids: Sequence[int],
    fit_texts,
    fit_labels,
    texts,
    labels,
    positive: str = "1",
    batch_size: int = 32,
) -> dict[str, float]:
    """Average token log-probability, thresholded; the threshold maximises MCC on the fit split."""
    fit_scores = average_logprobs(model, encode, fit_texts, start_ids, batch_size)
    fit_targets = [int(str(label) == positive) for label in fit_labels]
    candidates = sorted(set(fit_scores))
    threshold = max(
        candidates, key=lambda t: matthews_corrcoef([int(s >= t) for s in fit_scores], fit_targets)
    )
    scores = average_logprobs(model, encode, texts, start_ids, batch_size)
    predictions = [int(s >= threshold) for s in scores]
    targets = [int(str(label) == positive) for label in labels]
    return {
        "mcc": matthews_corrcoef(predictions, targets),
        "accuracy": accuracy(predictions, targets),
        "threshold": threshold,
        "examples": len(targets),
    }
