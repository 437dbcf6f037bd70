"""Language-model evaluation: perplexity over long text, and GPT-1's zero-shot heuristics (§5).

Zero-shot: no fine-tuning, only the pre-trained language model's probabilities.
- sentiment: append " very" to the text and compare the probabilities of "positive" and "negative";
- multiple choice: the answer with the highest average log-probability given the context;
- acceptability: the average token log-probability of the sentence, thresholded (the threshold is
  fitted on a separate split, never on the one reported).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from gptkit.data.metrics import accuracy, matthews_corrcoef
from gptkit.model import GPT


@torch.no_grad()
def perplexity(
    model: GPT, ids: Sequence[int], stride: int | None = None, batch_size: int = 8
) -> dict[str, float]:
    """Strided sliding-window perplexity of a long token sequence.

    Windows of the model's context start every ``stride`` tokens (default: half the context); each
    token is scored once, in the window where it has the most context before it (at least
    context − stride tokens, except at the start).
    """
    context = model.config.context_length
    stride = stride or max(context // 2, 1)
    if not 0 < stride <= context:
        raise ValueError(f"stride must be in 1..{context}, got {stride}")
    if len(ids) < 2:
        raise ValueError("perplexity needs at least 2 tokens")
    tokens = torch.as_tensor(list(ids), dtype=torch.long)
    windows = []  # (start, first scored target index inside the window)
    scored_until = 1  # targets 1..scored_until-1 done (token 0 is never a target)
    start = 0
    while scored_until < len(tokens):
        end = min(start + context, len(tokens))
        windows.append((start, end, scored_until - start))
        scored_until = end
        if end == len(tokens):
            break
        start += stride
    nll, count = 0.0, 0
    device = next(model.parameters()).device
    # Windows of one length run together, batch_size at a time (all but possibly the last are full).
    for length in sorted({end - start for start, end, _ in windows}):
        same = [w for w in windows if w[1] - w[0] == length]
        for i in range(0, len(same), batch_size):
            batch = same[i : i + batch_size]
            chunk = torch.stack([tokens[start:end] for start, end, _ in batch]).to(device)  # (B, T)
            log_probs = model(chunk).logits[:, :-1].float().log_softmax(-1)
            picked = log_probs.gather(2, chunk[:, 1:, None]).squeeze(2)  # (B, T-1)
            for row, (_, _, first_target) in enumerate(batch):
                scored = picked[row, first_target - 1 :]
                nll -= float(scored.sum())
                count += scored.numel()
    mean = nll / count
    return {"tokens": count, "nll": mean, "perplexity": math.exp(min(mean, 50.0))}


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


def zeroshot_sentiment(
    model: GPT, encode, texts: Sequence[str], labels: Sequence[str], positive: str = "1"
) -> dict[str, float]:
    """Append " very"; predict positive when log P("positive") > log P("negative")."""
    pos_ids, neg_ids = encode("positive"), encode("negative")
    predictions = []
    for text in texts:
        prefix = encode(text + " very")
        pos = continuation_logprob(model, prefix, pos_ids)[0]
        neg = continuation_logprob(model, prefix, neg_ids)[0]
        predictions.append(int(pos > neg))
    targets = [int(str(label) == positive) for label in labels]
    return {"accuracy": accuracy(predictions, targets), "examples": len(targets)}


def zeroshot_multiple_choice(
    model: GPT, encode, contexts: Sequence[str], choices: Sequence[Sequence[str]], labels: Sequence[int]
) -> dict[str, float]:
    """Pick the answer with the highest average token log-probability given the context."""
    predictions = []
    for context, answers in zip(contexts, choices):
        prefix = encode(context)
        scores = []
        for answer in answers:
            total, n = continuation_logprob(model, prefix, encode(answer))
            scores.append(total / max(n, 1))
        predictions.append(max(range(len(scores)), key=scores.__getitem__))
    return {"accuracy": accuracy(predictions, list(labels)), "examples": len(predictions)}


def average_logprobs(model: GPT, encode, texts: Sequence[str], start_ids: Sequence[int]) -> list[float]:
    scores = []
    for text in texts:
        total, n = continuation_logprob(model, list(start_ids), encode(text))
        scores.append(total / max(n, 1))
    return scores


def zeroshot_acceptability(
    model: GPT, encode, start_ids: Sequence[int], fit_texts, fit_labels, texts, labels, positive: str = "1"
) -> dict[str, float]:
    """Average token log-probability, thresholded; the threshold maximises MCC on the fit split."""
    fit_scores = average_logprobs(model, encode, fit_texts, start_ids)
    fit_targets = [int(str(label) == positive) for label in fit_labels]
    candidates = sorted(set(fit_scores))
    threshold = max(
        candidates, key=lambda t: matthews_corrcoef([int(s >= t) for s in fit_scores], fit_targets)
    )
    scores = average_logprobs(model, encode, texts, start_ids)
    predictions = [int(s >= threshold) for s in scores]
    targets = [int(str(label) == positive) for label in labels]
    return {
        "mcc": matthews_corrcoef(predictions, targets),
        "accuracy": accuracy(predictions, targets),
        "threshold": threshold,
        "examples": len(targets),
    }
