"""`make demo`: the paper's whole recipe, small enough for a laptop CPU.

1. Train a GPT-1-style BPE vocabulary (ftfy + spaCy + ``</w>``) on public-domain books.
2. Prepare token shards and pre-train a small GPT (L1) for a fixed time (5 minutes by default):
   the first updates are timed and the schedule is planned for as many as fit, so the demo keeps
   its time on any CPU. Precision follows the hardware: bf16 autocast where it is native, fp32
   elsewhere (bf16 on an AVX2-only CPU would take hours). The blocks are GPT-2's pre-LN layout: in
   a few hundred updates GPT-1's post-LN blocks barely leave the unigram plateau (measured here:
   validation loss 6.37 against 5.86 after 120 updates), and a demo has minutes.
3. Fine-tune it on SST-2 (L3 = L2 + 0.5·L1), and fine-tune the same architecture from random
   weights, to show what pre-training buys; sized by examples, so its time is bounded too.
4. Sample a few lines from the pre-trained model, shown as text is written (GPT-1's tokens joined).
"""

from __future__ import annotations

import json
import shutil
import time
from collections import Counter
from pathlib import Path

from gptkit.data.readers import read_dataset
from gptkit.data.shards import prepare
from gptkit.io import read_json, write_json
from gptkit.textgen import generate_text, load_for_generation
from gptkit.tokenizer import train_bpe
from gptkit.train.finetune import FinetuneConfig, FinetuneTrainConfig, finetune
from gptkit.train.loop import TrainConfig, parse_duration
from gptkit.train.pretrain import PretrainConfig, pretrain

MARKER = ".gptkit-demo"
DEMO_PRESET = "gpt2"  # the shape comes from the flags below; the preset gives pre-LN blocks
# SST-2 training sentences each model is fine-tuned on (of 6,920), two epochs: bounded by examples,
# so that fine-tuning keeps its time in fp32 on a CPU without native bf16 too.
FT_EXAMPLES = 3000
PROMPTS = ["It was a dark and stormy night, and", "The king said to his daughter", "Alice looked at the"]


def _corpus(data: Path) -> list[Path]:
    files = sorted((data / "gutenberg").glob("*.txt")) + [data / "tinyshakespeare" / "input.txt"]
    missing = [str(f) for f in files if not f.is_file()]
    if missing or not files:
        raise FileNotFoundError(
            f"demo corpus not found under {data} (missing: {', '.join(missing) or 'gutenberg/'})"
        )
    return files


def _stage(title: str) -> float:
    print(f"\n=== {title}", flush=True)
    return time.perf_counter()


def run_demo(
    data: Path,
    out: Path,
    quick: bool = False,
    time_budget: str = "5m",
    precision: str = "auto",
    device: str = "auto",
) -> dict:
    """Run every stage; write ``summary.json`` in ``out`` and return it.

    ``time_budget`` bounds pre-training (``quick`` runs a fixed 20 updates instead); ``precision``
    and ``device`` are the training commands' (auto: by the hardware).
    """
    parse_duration(time_budget)  # a bad budget fails now, not after the tokenizer's minutes
    if out.exists():
        if not (out / MARKER).exists():
            raise FileExistsError(f"{out} exists and was not made by the demo; choose another --out")
        shutil.rmtree(out)
    out.mkdir(parents=True)
    (out / MARKER).write_text("made by gptkit demo; safe to delete\n")
    started = time.perf_counter()
    corpus = _corpus(data)
    size = dict(vocab=1000, steps=20, n_layer=2, d_model=64, context_length=64, batch=16, ft_examples=256, epochs=1) if quick \
        else dict(vocab=8000, steps=2000, n_layer=4, d_model=256, context_length=128, batch=32, ft_examples=FT_EXAMPLES, epochs=2)  # fmt: skip
    budget = None if quick else time_budget

    t = _stage("1/4 training a GPT-1-style BPE vocabulary on the books")
    train_bpe(corpus, size["vocab"], out / "tokenizer", style="gpt1")
    print(f"    {size['vocab']} tokens in {time.perf_counter() - t:.0f}s")

    t = _stage(
        "2/4 pre-training a small GPT (L1: next-token log-likelihood)"
        + (f", {budget} budget" if budget else "")
    )
    meta = prepare(out / "tokenizer", corpus, out / "shards", val_fraction=0.02)
    print(f"    corpus: {meta['counts']['train']:,} training tokens, {meta['counts']['val']:,} held out")
    pre = PretrainConfig(
        data=str(out / "shards"),
        out=str(out / "pretrain"),
        preset=DEMO_PRESET,
        context_length=size["context_length"],
        n_layer=size["n_layer"],
        n_head=4,
        d_model=size["d_model"],
        eval_windows=64,
        device=device,
    )
    train = TrainConfig(
        max_steps=size["steps"],
        batch_size=size["batch"],
        lr=1e-3,
        warmup_steps=size["steps"] // 10,  # with a time budget: a tenth of the updates that fit
        eval_every=max(size["steps"] // 5, 1) if quick else 50,
        checkpoint_every=size["steps"],
        precision=precision,
        time_budget=budget,
        log_every=5,
    )
    pre_metrics = pretrain(pre, train)
    steps_run = read_json(out / "pretrain" / "run_config.json")["resolved"]["max_steps"]
    print(
        f"    validation loss {pre_metrics['val_loss']:.3f} (perplexity {pre_metrics['val_ppl']:.1f}) "
        f"after {steps_run} updates, {time.perf_counter() - t:.0f}s; curve: {out / 'pretrain' / 'loss.png'}"
    )

    t = _stage("3/4 fine-tuning on SST-2 sentiment: pre-trained vs. random init")
    results = {}
    for name, init in (("pretrained", str(out / "pretrain")), ("from_scratch", None)):
        config = FinetuneConfig(
            dataset="sst2",
            data_dir=str(data),
            init=init,
            tokenizer=str(out / "tokenizer"),
            preset=DEMO_PRESET,
            n_layer=size["n_layer"],
            n_head=4,
            d_model=size["d_model"],
            context_length=size["context_length"],
            out=str(out / f"sst2-{name}"),
            epochs=size["epochs"],
            max_train_examples=size["ft_examples"],
            device=device,
        )
        ft = finetune(config, FinetuneTrainConfig(lr=2e-4, precision=precision, progress=True))
        results[name] = ft["best"]["dev_accuracy"]
        print(f"    {name:>12}: dev accuracy {results[name]:.3f}")
    dev_labels = [e.label for e in read_dataset("sst2", "dev", data)]
    majority = Counter(dev_labels).most_common(1)[0][1] / len(dev_labels)
    print(f"    {'majority':>12}: dev accuracy {majority:.3f}   ({time.perf_counter() - t:.0f}s)")

    t = _stage("4/4 sampling from the pre-trained model (top-k 40, temperature 0.8)")
    model, tokenizer = load_for_generation(out / "pretrain", device=device)
    samples = generate_text(
        model, tokenizer, PROMPTS, max_new_tokens=30, do_sample=True, temperature=0.8, top_k=40, seed=0
    )
    for prompt, sample in zip(PROMPTS, samples):
        print(f"    {prompt} → {' '.join(sample.split())}")  # newlines folded for display

    summary = {
        "pretrain": {"steps": steps_run, **pre_metrics},
        "sst2_dev_accuracy": {**results, "majority_class": majority},
        "samples": dict(zip(PROMPTS, samples)),
        "seconds": round(time.perf_counter() - started, 1),
    }
    write_json(out / "summary.json", summary)
    print(f"\ndone in {summary['seconds']:.0f}s; summary: {out / 'summary.json'}")
    print(json.dumps(summary["sst2_dev_accuracy"]))
    return summary
