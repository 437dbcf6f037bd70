"""Tokenizer throughput: gptkit's GPT-2 encoder (which wraps tiktoken's Rust core, built from the shipped
files) against tiktoken itself, and gptkit's GPT-1 encoder against a straightforward
one-text-at-a-time pipeline (ftfy, standardise, spaCy, BPE with a cache), with identical ids. Fresh
encoders each repetition (cold caches), alternating, medians of REPEATS with each side's least and
most ("on par" where those overlap). Nothing here depends
on the CPU's bf16; a measurement running past common.TIME_LIMIT_S is reported as skipped."""

from __future__ import annotations

import time

from common import DATA, TIME_LIMIT_S, MeasurementTimeout, emit, skipped, spread_comparison, time_limit

from gptkit.tokenizer import Tokenizer

REPEATS = 5


def load_texts() -> tuple[list[str], int]:
    texts = [p.read_text(encoding="utf-8") for p in sorted((DATA / "gutenberg").glob("*.txt"))]
    texts += [
        line.split(" ", 1)[1] for line in (DATA / "sst2" / "stsa.binary.train").read_text().splitlines()
    ]
    return texts, sum(len(t.encode("utf-8")) for t in texts)


def timed(fn) -> tuple[float, object]:
    start = time.perf_counter()
    result = fn()
    return time.perf_counter() - start, result


def gpt2(texts: list[str], n_bytes: int) -> list[dict]:
    import tiktoken
    from tiktoken.load import data_gym_to_mergeable_bpe_ranks
    from tiktoken_ext.openai_public import r50k_pat_str

    ranks = data_gym_to_mergeable_bpe_ranks(
        str(DATA / "gpt2_bpe" / "vocab.bpe"), str(DATA / "gpt2_bpe" / "encoder.json")
    )
    reference = tiktoken.Encoding(
        "gpt2", pat_str=r50k_pat_str, mergeable_ranks=ranks, special_tokens={"<|endoftext|>": 50256}
    )
    ours = Tokenizer.from_pretrained(DATA / "gpt2_bpe")
    assert ours.encode_batch(texts) == reference.encode_ordinary_batch(texts)
    results = []
    for label, ours_fn, peer_fn in (
        (
            "one text at a time",
            lambda: [ours.encode(t) for t in texts],
            lambda: [reference.encode_ordinary(t) for t in texts],
        ),
        ("batch", lambda: ours.encode_batch(texts), lambda: reference.encode_ordinary_batch(texts)),
    ):
        what = f"GPT-2 byte-level encode, {label}, gptkit wrapping tiktoken's core"
        peer = "tiktoken (same files)"
        ours_s, peer_s = [], []
        try:
            with time_limit(TIME_LIMIT_S):
                for _ in range(REPEATS):
                    ours_s.append(timed(ours_fn)[0])
                    peer_s.append(timed(peer_fn)[0])
        except MeasurementTimeout as e:
            results.append(skipped(what, "MB/s", peer, f"the measurement {e}"))
            continue
        results.append(rates(what, ours_s, peer, peer_s, n_bytes))
    return results


def gpt1(texts: list[str], n_bytes: int) -> list[dict]:
    from gptkit.testing.reference_gpt1 import ReferenceGPT1Encoder

    vocab = DATA / "gpt1_bpe"
    what = "GPT-1 encode (ftfy + spaCy + BPE), identical ids"
    peer = "straightforward pipeline (src/gptkit/testing/reference_gpt1.py)"
    ours_s, peer_s = [], []
    try:
        with time_limit(TIME_LIMIT_S):
            for _ in range(REPEATS):
                ours = Tokenizer.from_pretrained(vocab)
                reference = ReferenceGPT1Encoder(vocab / "encoder_bpe_40000.json", vocab / "vocab_40000.bpe")
                seconds, ours_ids = timed(lambda: ours.encode_batch(texts))  # noqa: B023 (called at once)
                ours_s.append(seconds)
                seconds, reference_ids = timed(lambda: reference.encode(texts))  # noqa: B023
                peer_s.append(seconds)
                assert ours_ids == reference_ids, "GPT-1 ids differ from the reference pipeline"
    except MeasurementTimeout as e:
        return [skipped(what, "MB/s", peer, f"the measurement {e}")]
    return [rates(what, ours_s, peer, peer_s, n_bytes)]


def rates(what: str, ours_s: list[float], peer: str, peer_s: list[float], n_bytes: int) -> dict:
    """The MB/s comparison of the rounds' seconds, medians with each side's spread."""
    return spread_comparison(
        what, "MB/s", [n_bytes / 1e6 / s for s in ours_s], peer, [n_bytes / 1e6 / s for s in peer_s]
    )


if __name__ == "__main__":
    texts, n_bytes = load_texts()
    emit(
        "tokenizer_throughput",
        gpt2(texts, n_bytes) + gpt1(texts, n_bytes),
        text={"documents": len(texts), "megabytes": round(n_bytes / 1e6, 2)},
    )
