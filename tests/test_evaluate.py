"""Perplexity, zero-shot heuristics and the sampling trade-off, against brute-force computations."""

from __future__ import annotations

import copy
import math
import random
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from gptkit import GPT, GPTConfig
from gptkit.data.metrics import (
    f1,
    matthews_corrcoef,
    paired_bootstrap,
    paired_difference,
    pearson,
    seed_paired_difference,
    seed_standard_error,
    spearman,
    t_quantile,
)
from gptkit.evaluate import lm
from gptkit.evaluate.tradeoff import _distinct, _unigram_f1, passages_from_text, sweep
from gptkit.model.layouts import quantize_int8
from tests.conftest import SMALL_VOCAB


def tiny_model(context=16) -> GPT:
    torch.manual_seed(0)
    return GPT(
        GPTConfig(vocab_size=50, context_length=context, n_layer=2, n_head=2, d_model=16, dropout=0.0)
    ).eval()


def brute_force_nll(model: GPT, ids: list[int]) -> float:
    """Each token scored alone, with as much left context as fits."""
    context, total = model.config.context_length, 0.0
    with torch.no_grad():
        for t in range(1, len(ids)):
            window = ids[max(0, t - context + 1) : t + 1]
            total -= float(model(torch.tensor([window])).logits[0, -2].log_softmax(-1)[window[-1]])
    return total / (len(ids) - 1)


def test_perplexity_equals_brute_force():
    model = tiny_model()
    ids = torch.randint(0, 50, (40,)).tolist()
    result = lm.perplexity(model, ids, stride=1)
    assert result["tokens"] == 39
    assert result["nll"] == pytest.approx(brute_force_nll(model, ids), rel=1e-5)
    short = ids[:12]  # fits in one window: equals the model's own loss
    with torch.no_grad():
        loss = model(torch.tensor([short]), labels=torch.tensor([short])).loss.item()
    assert lm.perplexity(model, short)["nll"] == pytest.approx(loss, rel=1e-5)
    strided = lm.perplexity(model, ids, stride=8)
    assert strided["tokens"] == 39 and strided["nll"] > 0
    # Windows scored in batches give what one window at a time gives.
    one_by_one = lm.perplexity(model, ids, stride=8, batch_size=1)
    assert strided["nll"] == pytest.approx(one_by_one["nll"], rel=1e-5)
    assert lm.perplexity(model, ids, stride=3, batch_size=5)["nll"] == pytest.approx(
        lm.perplexity(model, ids, stride=3, batch_size=1)["nll"], rel=1e-5
    )


def full_logits_nll(model: GPT, ids: list[int], stride: int) -> tuple[float, int]:
    """Perplexity's windows one at a time through the model's logits at every position, keeping the
    targets no earlier window scored (the computation before perplexity ran the output layer only at
    the scored positions): (mean NLL, tokens scored)."""
    context, total, count = model.config.context_length, 0.0, 0
    scored_until, start = 1, 0
    with torch.no_grad():
        while scored_until < len(ids):
            end = min(start + context, len(ids))
            window = torch.tensor(ids[start:end])
            log_probs = model(window[None]).logits[0, :-1].float().log_softmax(-1)
            picked = log_probs.gather(1, window[1:, None]).squeeze(1)[scored_until - start - 1 :]
            total -= float(picked.double().sum())
            count += picked.numel()
            # stride == context: a window starting at its first target could not score it.
            scored_until, start = end, min(start + stride, end - 1)
    return total / count, count


class CountingOutputLayer(torch.nn.Module):
    """The tied output layer h·W_e^T as an lm_head, recording how many rows each call is given."""

    def __init__(self, weight: torch.nn.Parameter) -> None:
        super().__init__()
        self.weight = weight
        self.rows: list[int] = []

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        self.rows.append(hidden.shape[:-1].numel())
        return F.linear(hidden, self.weight)


# (text length, stride) with context 16: stride 1, strides that do and do not divide the text, stride ==
# context (windows that do not overlap), a text shorter than one window, one exactly a window long and
# one a token longer.
PERPLEXITY_LAYOUTS = [(40, 1), (40, 3), (40, 8), (40, 16), (10, 8), (16, 5), (17, 16), (17, 4)]


@pytest.mark.parametrize("length, stride", PERPLEXITY_LAYOUTS)
def test_perplexity_runs_the_output_layer_only_where_it_scores(length, stride, monkeypatch):
    model = tiny_model()
    ids = torch.randint(0, 50, (length,), generator=torch.Generator().manual_seed(length + stride)).tolist()
    reference, count = full_logits_nll(model, ids, stride)
    assert count == length - 1  # every target once
    counting = CountingOutputLayer(model.wte.weight)
    model.lm_head = counting
    # 7 rows of logits at a time: chunks that split windows and batches.
    monkeypatch.setattr(lm, "LOGIT_CHUNK_ELEMENTS", 7 * model.config.total_vocab_size)
    for batch_size in (1, 3, 8):
        counting.rows.clear()
        result = lm.perplexity(model, ids, stride=stride, batch_size=batch_size)
        assert result["tokens"] == count
        assert result["nll"] == pytest.approx(reference, rel=1e-5, abs=1e-6)
        # The output layer saw each scored position once and nothing else, never more than a chunk.
        assert sum(counting.rows) == count and max(counting.rows) <= 7


def test_perplexity_through_an_int8_output_layer_and_in_bf16():
    ids = torch.randint(0, 50, (40,), generator=torch.Generator().manual_seed(5)).tolist()
    # int8: the model's inference output layer (lm_head), not the tied weights, gives the logits.
    # A quantized model computes in bf16, and bf16 weights leave the hidden states and the output layer
    # in bf16 (the log-softmax is fp32 as before): only the matrix products' shapes differ from the
    # full-logits computation, so the tolerance is bf16's (8 significant bits).
    quantized = quantize_int8(copy.deepcopy(tiny_model()))
    for stride in (3, 16):
        reference, _ = full_logits_nll(quantized, ids, stride)
        assert lm.perplexity(quantized, ids, stride=stride)["nll"] == pytest.approx(reference, rel=1e-2)
    model = tiny_model().to(torch.bfloat16)
    for stride in (3, 8, 16):
        reference, _ = full_logits_nll(model, ids, stride)
        result = lm.perplexity(model, ids, stride=stride, batch_size=3)
        assert result["nll"] == pytest.approx(reference, rel=1e-2)


def test_continuation_logprob_and_multiple_choice_against_the_models_loss():
    model = tiny_model()
    context, answers = [3, 4, 5, 6], [[7, 8], [9], [10, 11, 12]]
    average = []
    for answer in answers:
        ids = torch.tensor([context + answer])
        labels = ids.clone()
        labels[0, : len(context)] = -100  # score only the answer's tokens
        with torch.no_grad():
            average.append(-model(ids, labels=labels).loss.item())
        total, n = lm.continuation_logprob(model, context, answer)
        assert total / n == pytest.approx(average[-1], rel=1e-5)
    best = max(range(3), key=average.__getitem__)
    vocab = {str(i): i for i in range(50)}

    def encode(text):
        return [vocab[t] for t in text.split()]

    result = lm.zeroshot_multiple_choice(model, encode, ["3 4 5 6"], [["7 8", "9", "10 11 12"]], [best])
    assert result["accuracy"] == 1.0


def test_metrics_by_hand():
    assert f1([1, 1, 0, 0], [1, 0, 1, 0]) == pytest.approx(0.5)
    assert matthews_corrcoef([1, 1, 0, 0], [1, 1, 0, 0]) == pytest.approx(1.0)
    assert matthews_corrcoef([1, 0, 1, 0], [1, 1, 0, 0]) == pytest.approx(0.0)
    assert pearson([1, 2, 3], [2, 4, 6]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [1, 8, 27, 64]) == pytest.approx(1.0)
    assert spearman([1, 2, 2, 3], [3, 2, 2, 1]) == pytest.approx(-1.0)


def test_paired_difference_by_hand():
    # Differences 1, 0, 0, 1: mean 0.5, sample sd sqrt(1/3), standard error sqrt(1/3) / 2.
    difference, stderr = paired_difference([1, 1, 0, 1], [0, 1, 0, 0])
    assert difference == pytest.approx(0.5) and stderr == pytest.approx((1 / 3) ** 0.5 / 2)
    # The same per-example gain on every example: no noise left once paired.
    assert paired_difference([0.9, 0.5, 0.7], [0.8, 0.4, 0.6]) == pytest.approx((0.1, 0.0))
    with pytest.raises(ValueError, match="same examples: 3 against 2"):
        paired_difference([1, 0, 1], [1, 0])


def test_paired_bootstrap_agrees_with_the_formula_and_the_metrics():
    """For accuracy the bootstrap's error converges to the paired formula's; for every metric its
    difference is the scalar metrics' difference; two identical systems differ by exactly nothing."""
    rng = random.Random(1)
    targets = [rng.randint(0, 1) for _ in range(1500)]
    a = [t if rng.random() < 0.75 else 1 - t for t in targets]
    b = [t if rng.random() < 0.70 else 1 - t for t in targets]
    difference, stderr = paired_bootstrap("accuracy", a, b, targets, resamples=2000)
    exact = paired_difference(
        [float(p == t) for p, t in zip(a, targets)], [float(p == t) for p, t in zip(b, targets)]
    )
    assert difference == pytest.approx(exact[0]) and stderr == pytest.approx(exact[1], rel=0.1)
    for name, metric in (("f1", f1), ("mcc", matthews_corrcoef)):
        difference, stderr = paired_bootstrap(name, a, b, targets)
        assert difference == pytest.approx(metric(a, targets) - metric(b, targets)) and 0 < stderr < 0.1
    scores = [rng.random() * 5 for _ in range(300)]
    close = [s + rng.gauss(0, 1) for s in scores]
    far = [s + rng.gauss(0, 3) for s in scores]
    difference, stderr = paired_bootstrap("pearson", close, far, scores)
    assert difference == pytest.approx(pearson(close, scores) - pearson(far, scores)) and stderr > 0
    assert paired_bootstrap("pearson", close, close, scores) == (0.0, 0.0)
    with pytest.raises(ValueError, match="no paired bootstrap for metric 'mse'"):
        paired_bootstrap("mse", close, far, scores)


def test_t_quantile_against_its_closed_forms_and_the_table():
    # One and two degrees of freedom have closed forms; the rest are the printed table's.
    p = 0.975
    assert t_quantile(p, 1) == pytest.approx(math.tan(math.pi * (p - 0.5)), rel=1e-5)
    assert t_quantile(p, 2) == pytest.approx((2 * p - 1) / math.sqrt(2 * p * (1 - p)), rel=1e-6)
    table = {3: 3.182, 4: 2.776, 10: 2.228, 30: 2.042, 120: 1.980, math.inf: 1.960}
    assert t_quantile(p, list(table)) == pytest.approx(list(table.values()), abs=5e-4)
    assert t_quantile(0.95, 5) == pytest.approx(2.015, abs=5e-4)
    with pytest.raises(ValueError, match="at least 1 degree of freedom"):
        t_quantile(p, 0.5)


def _simulated_suites(sigma_seed, sigma_example, sigma_rest, rng, seeds=3, examples=400, suites=2000):
    """Suites whose per-example differences are x_ij = Δ + a_j + t_i + e_ij, every part known: the
    examples (a_j) drawn once per suite and shared by its seeds, the training noise (t_i) once per
    seed. Returns Δ, the true standard deviation of the seed-averaged difference, the estimates
    (mean, SE, threshold) and the two one-sided errors: over examples alone and over seeds alone."""
    true_difference = 0.03
    x = (
        true_difference
        + rng.normal(0, sigma_example, (suites, 1, examples))
        + rng.normal(0, sigma_seed, (suites, seeds, 1))
        + rng.normal(0, sigma_rest, (suites, seeds, examples))
    )
    differences = x.mean(-1)
    example_stderrs = x.std(-1, ddof=1) / math.sqrt(examples)
    pooled = x.mean(-2).std(-1, ddof=1) / math.sqrt(examples)
    estimates = seed_standard_error(differences, example_stderrs, pooled, examples)
    true_sd = math.sqrt(
        sigma_seed**2 / seeds + sigma_example**2 / examples + sigma_rest**2 / (examples * seeds)
    )
    seeds_only = differences.std(-1, ddof=1) / math.sqrt(seeds)
    return true_difference, true_sd, estimates, pooled, seeds_only


@pytest.mark.parametrize(
    "regime, sigmas",
    [
        ("training noise large", (0.06, 0.3, 0.3)),
        ("training noise alone", (0.04, 0.0, 0.4)),
        ("example noise large", (0.005, 0.35, 0.2)),
    ],
)
def test_the_seed_aware_error_measures_and_covers_the_true_difference(regime, sigmas):
    """2,000 simulated suites of 3 seeds: the error matches the true spread of the estimate across
    suites, and ± threshold × SE covers the true difference about 95% of the time, whichever noise
    dominates. The example-only error (what one seed's paired error gives) undercovers when the
    training noise is large; the spread across seeds alone undercovers when the examples' is."""
    rng = np.random.default_rng(0)
    truth, true_sd, (mean, stderr, threshold), example_only, seeds_only = _simulated_suites(*sigmas, rng)
    assert mean.std() == pytest.approx(true_sd, rel=0.05)  # the simulation is what it claims
    # SE² is unbiased: its root mean square is the true sd. SE itself is lower on average, most
    # with 2 degrees of freedom (Jensen), which the threshold's t quantile pays for.
    assert np.sqrt((stderr**2).mean()) == pytest.approx(true_sd, rel=0.05)
    assert stderr.mean() == pytest.approx(true_sd, rel=0.12)
    missed = np.abs(mean - truth)
    coverage = (missed <= threshold * stderr).mean()
    assert 0.92 <= coverage <= 0.98, coverage
    if regime.startswith("training"):
        assert (missed <= 2 * example_only).mean() < 0.85
        assert (missed <= 2 * stderr).mean() < 0.92  # 2 alone is too few with 2 degrees of freedom
    else:
        assert (missed <= 2 * seeds_only).mean() < 0.6
        # Weighted mostly to the examples' many degrees of freedom: far below 3 seeds' 4.30.
        assert threshold.mean() < 2.5


def test_seed_paired_difference_by_hand():
    """One seed: the example-level paired error (formula for accuracy, bootstrap otherwise). Two
    seeds of accuracy: the two-way random-effects ANOVA's (MS_seeds + MS_examples − MS_residual) /
    (nN), with its mean squares summed by hand."""
    rng = random.Random(3)
    n = 300
    targets = [rng.randint(0, 1) for _ in range(n)]
    # Each system finds some examples hard whatever the seed (the examples' shared effect), and each
    # seed gets a few others wrong of its own.
    hard = {name: [rng.random() < p for _ in targets] for name, p in (("a", 0.25), ("b", 0.35))}
    runs = {
        name: [
            [
                1 - t if hard[name][j] != (rng.random() < 0.05 + 0.04 * seed) else t
                for j, t in enumerate(targets)
            ]
            for seed in range(2)
        ]
        for name in ("a", "b")
    }
    one = seed_paired_difference("accuracy", runs["a"][:1], runs["b"][:1], targets)
    correct = {k: [[float(p == t) for p, t in zip(run, targets)] for run in v] for k, v in runs.items()}
    assert (one.difference, one.stderr) == pytest.approx(paired_difference(correct["a"][0], correct["b"][0]))
    assert not one.training_noise_counted and one.threshold == 2.0
    mcc = seed_paired_difference("mcc", runs["a"][:1], runs["b"][:1], targets)
    assert (mcc.difference, mcc.stderr) == pytest.approx(
        paired_bootstrap("mcc", runs["a"][0], runs["b"][0], targets)
    )

    two = seed_paired_difference("accuracy", runs["a"], runs["b"], targets)
    x = [[ca - cb for ca, cb in zip(correct["a"][i], correct["b"][i])] for i in range(2)]
    grand = sum(map(sum, x)) / (2 * n)
    seed_means = [sum(row) / n for row in x]
    example_means = [(x[0][j] + x[1][j]) / 2 for j in range(n)]
    ms_seeds = n * sum((m - grand) ** 2 for m in seed_means) / 1
    ms_examples = 2 * sum((m - grand) ** 2 for m in example_means) / (n - 1)
    ms_residual = sum(
        (x[i][j] - seed_means[i] - example_means[j] + grand) ** 2 for i in range(2) for j in range(n)
    ) / (n - 1)
    assert ms_examples > ms_residual  # the error's max(0, ·) is not what decides it here
    assert two.training_noise_counted and two.per_seed == pytest.approx(seed_means)
    assert two.difference == pytest.approx(grand)
    assert two.stderr == pytest.approx(math.sqrt((ms_seeds + ms_examples - ms_residual) / (2 * n)))
    assert two.claimed == (abs(two.difference) > two.threshold * two.stderr)
    with pytest.raises(ValueError, match="one run of each system per seed: 2 against 1"):
        seed_paired_difference("accuracy", runs["a"], runs["b"][:1], targets)


def test_bits_per_byte_of_a_uniform_model_is_log2_vocab_per_token(small_tokenizer, tmp_path):
    """Zero output weights predict every token with probability 1/V: each scored token costs
    log2(V) bits, and the bytes are those of the held-out text as read (line ends made plain)."""
    from gptkit.data.prepare import prepare

    text = "The cat sat on the mat.\r\nAnd then it slept.\r\n" * 40
    corpus = tmp_path / "corpus.txt"
    corpus.write_bytes(text.encode("utf-8"))
    meta = prepare(small_tokenizer, [corpus], tmp_path / "shards", val_fraction=0.25, show_progress=False)
    plain = text.replace("\r\n", "\n").encode("utf-8")
    assert meta["text_bytes"]["train"] + meta["text_bytes"]["val"] == len(plain)
    model = GPT(
        GPTConfig(vocab_size=SMALL_VOCAB, context_length=16, n_layer=1, n_head=2, d_model=8, dropout=0.0)
    )
    with torch.no_grad():
        model.wte.weight.zero_()
    result = lm.held_out_bits_per_byte(model.eval(), tmp_path / "shards")
    scored = meta["counts"]["val"] - 1  # every token but the first, whatever the window size
    assert result["tokens"] == scored
    expected = scored * math.log2(SMALL_VOCAB) / meta["text_bytes"]["val"]
    assert result["bits_per_byte"] == pytest.approx(expected, rel=1e-5)


def test_tradeoff_measures_by_hand():
    assert _distinct([[1, 2, 1, 2]], 1) == pytest.approx(2 / 4)
    assert _distinct([[1, 2, 1, 2]], 2) == pytest.approx(2 / 3)
    assert _unigram_f1([1, 2, 3, 3], [3, 4]) == pytest.approx(2 * 0.25 * 0.5 / 0.75)
    passages = passages_from_text(list(range(100)), 10, 5, 4)
    assert len(passages) == 4 and passages[0] == (list(range(10)), list(range(10, 15)))


def test_temperature_sweep_trades_diversity_for_fidelity():
    model = tiny_model(context=64)
    with torch.no_grad():
        model.wte.weight.mul_(40)  # a peaked next-token distribution, as a trained model has
    ids = torch.randint(0, 50, (400,)).tolist()
    report = sweep(
        model, passages_from_text(ids, 8, 16, 6), temperatures=[0.0, 0.5, 1.0, 2.0], samples_per_prompt=2
    )
    rows = report["settings"]
    nll = [r["sample_nll"] for r in rows]
    diversity = [r["distinct_2"] for r in rows]
    assert nll == sorted(nll) and nll[0] < nll[-1]  # hotter samples stray further from the model's beliefs
    assert diversity[-1] > diversity[0]
    closest = min(rows, key=lambda r: abs(r["sample_nll"] - report["reference_nll"]))
    assert report["recommended"]["temperature"] == closest["temperature"]


# Batched zero-shot scoring -------------------------------------------------------------------------


def random_pairs(count: int, context: int, seed: int = 1) -> list[tuple[list[int], list[int]]]:
    """Pairs of varied lengths: short ones, ones that fill the context exactly, prefixes that must lose
    tokens from the left, continuations longer than the context, and an empty continuation."""
    generator = torch.Generator().manual_seed(seed)

    def ids(n: int) -> list[int]:
        return torch.randint(0, 50, (n,), generator=generator).tolist()

    pairs = [(ids(1), ids(1)), (ids(3), []), (ids(context - 5), ids(5)), (ids(context), ids(context + 3))]
    pairs += [(ids(2 * context), ids(3)), (ids(1), ids(context - 1)), (ids(5), ids(context))]
    for _ in range(count - len(pairs)):
        lengths = torch.randint(1, 2 * context, (2,), generator=generator).tolist()
        pairs.append((ids(lengths[0]), ids(lengths[1] // 3)))
    return pairs


@pytest.mark.parametrize("batch_size", [1, 3, 32])
def test_batched_continuation_logprobs_equal_one_pair_at_a_time(batch_size):
    model = tiny_model()
    pairs = random_pairs(30, model.config.context_length)
    batched = lm.continuation_logprobs(model, pairs, batch_size=batch_size)
    assert len(batched) == len(pairs)
    for (prefix, continuation), (total, n) in zip(pairs, batched):
        ref_total, ref_n = lm.continuation_logprob(model, prefix, continuation)
        assert n == ref_n
        assert total == pytest.approx(ref_total, abs=1e-5, rel=1e-5)
    # The truncation cases were exercised: a continuation cut to context − 1, a prefix cut from the left.
    assert batched[3][1] == model.config.context_length - 1
    assert batched[1] == (0.0, 0)


def test_batched_scoring_rejects_an_empty_prefix_and_a_bad_batch_size():
    model = tiny_model()
    with pytest.raises(ValueError, match="prefix"):
        lm.continuation_logprobs(model, [([1], [2]), ([], [3])])
    with pytest.raises(ValueError, match="batch_size"):
        lm.continuation_logprobs(model, [([1], [2])], batch_size=0)
    assert lm.continuation_logprobs(model, []) == []


def one_at_a_time_predictions(model, encode, contexts, choices):
    """The multiple-choice heuristic with continuation_logprob, one pair per forward pass."""
    predictions = []
    for context, answers in zip(contexts, choices):
        scores = []
        for answer in answers:
            total, n = lm.continuation_logprob(model, encode(context), encode(answer))
            scores.append(total / max(n, 1))
        predictions.append(max(range(len(scores)), key=scores.__getitem__))
    return predictions


def word_encoder():
    vocab = {str(i): i for i in range(50)} | {"very": 40, "positive": 41, "negative": 42}
    return lambda text: [vocab[t] for t in text.split()]


def random_texts(count: int, seed: int, longest: int = 30) -> list[str]:
    generator = torch.Generator().manual_seed(seed)
    texts = []
    for _ in range(count):
        n = int(torch.randint(1, longest, (1,), generator=generator))
        texts.append(" ".join(str(t) for t in torch.randint(0, 40, (n,), generator=generator).tolist()))
    return texts


def test_batched_heuristics_predict_what_one_pair_at_a_time_predicts():
    model = tiny_model()
    with torch.no_grad():
        model.wte.weight.mul_(20)  # peaked distributions: scores far apart, predictions that vary
    encode = word_encoder()
    contexts = random_texts(12, seed=2)
    choices = [random_texts(int(k), seed=10 + i, longest=8) for i, k in enumerate(torch.randint(2, 5, (12,)))]
    predictions = one_at_a_time_predictions(model, encode, contexts, choices)
    assert len(set(predictions)) > 1  # the check below could not pass by always picking one answer
    for batch_size in (1, 5, 32):
        result = lm.zeroshot_multiple_choice(model, encode, contexts, choices, predictions, batch_size)
        assert result == {"accuracy": 1.0, "examples": 12}

    texts = random_texts(20, seed=3)
    reference = []
    for text in texts:
        prefix = encode(text + " very")
        pos = lm.continuation_logprob(model, prefix, encode("positive"))[0]
        neg = lm.continuation_logprob(model, prefix, encode("negative"))[0]
        reference.append(str(int(pos > neg)))
    assert lm.zeroshot_sentiment(model, encode, texts, reference, "1", batch_size=4)["accuracy"] == 1.0

    start = [0]
    averages = lm.average_logprobs(model, encode, texts, start, batch_size=7)
    for text, average in zip(texts, averages):
        total, n = lm.continuation_logprob(model, start, encode(text))
        assert average == pytest.approx(total / n, abs=1e-5, rel=1e-5)
    labels = [str(int(a > sorted(averages)[10])) for a in averages]
    one = lm.zeroshot_acceptability(model, encode, start, texts, labels, texts, labels, "1", 1)
    many = lm.zeroshot_acceptability(model, encode, start, texts, labels, texts, labels, "1", 32)
    assert one["mcc"] == many["mcc"] == pytest.approx(1.0)
    assert one["accuracy"] == many["accuracy"] == 1.0
    assert one["threshold"] == pytest.approx(many["threshold"], abs=1e-5)


def test_zeroshot_over_a_run_scores_only_the_checkpoints_training_could_resume_from(
    data_dir, small_tokenizer, tmp_path
):
    """A step-* folder without its train_state.pt (a copy cut short) is not a checkpoint: it is
    not scored, and a run with none complete says so."""
    from gptkit.evaluate.zeroshot import ZeroshotConfig, run_zeroshot
    from gptkit.model.weights import save_state_dict

    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=SMALL_VOCAB, context_length=64, n_layer=1, n_head=1, d_model=8))
    checkpoints = tmp_path / "run" / "checkpoints"
    for step in (2, 4, 6):
        save_state_dict(model.config, model.state_dict(), checkpoints / f"step-{step:07d}")
    for step in (2, 6):
        torch.save({"step": step}, checkpoints / f"step-{step:07d}" / "train_state.pt")
    config = ZeroshotConfig(
        model=str(tmp_path / "run"),
        task="sentiment",
        tokenizer=str(small_tokenizer),
        data_dir=str(data_dir),
        limit=2,
        checkpoints=True,
        dtype="float32",
        device="cpu",
    )
    records = list(run_zeroshot(config))
    assert [(r["step"], Path(r["model"]).name) for r in records] == [(2, "step-0000002"), (6, "step-0000006")]
    for step in (2, 6):
        (checkpoints / f"step-{step:07d}" / "train_state.pt").unlink()
    with pytest.raises(FileNotFoundError, match=r"run/checkpoints: no complete step-\* checkpoints"):
        list(run_zeroshot(config))


def test_seeds_that_agree_by_chance_keep_the_examples_error():
    """Two seeds whose differences are equal (12 of 872 examples each, as a tiny run can give) and
    whose per-example differences are unrelated: no spread across seeds and no shared example
    effect, yet the average of two seeds still carries the examples' noise, at least
    mean(s_i²)/N, by hand: the difference is not claimed on an error of 0."""
    s = np.array([0.021, 0.023])  # each seed's paired error over its 872 examples
    pooled = np.sqrt((s**2).sum()) / 2  # the two seeds' example noise independent: no shared effect
    mean, stderr, threshold = seed_standard_error([0.014, 0.014], s, pooled, 872)
    assert mean == pytest.approx(0.014)
    assert stderr == pytest.approx(math.sqrt((s**2).mean() / 2))
    assert threshold == pytest.approx(2.0) and mean < threshold * stderr
