"""Fine-tuning to answer: does `gptkit finetune --task generation` teach a small pre-trained GPT the
completion's format, where the same model untuned does not answer in it?

The pipeline, from the public data alone: a byte-level BPE of 8,000 tokens on the demo's books, the
demo's pre-training recipe (`--recipe minutes`) for PRETRAIN_SECONDS, then generation fine-tuning on
SST-2 as "sentence → its label's word" (negative, positive) for TRAIN_EXAMPLES sentences, the dev
split's first SELECT_EXAMPLES scoring each epoch (the best epoch kept by exact match). Held out: the
next HELD_OUT dev sentences, which neither training nor the choice of epoch read. Each is asked of
the tuned model and of the pre-trained model untuned, the same prompt laid out by the same chat
template, greedy (up to 8 tokens past the longest answer): the share of answers that are one of the two words (the
format), and of answers that are the right word, each with its standard error over the sentences.

    python benchmarks/generation_finetune.py
"""

from __future__ import annotations

import dataclasses
import math
import tempfile
import time
import warnings
from pathlib import Path

from common import DATA, emit

from gptkit.data.completions import encode_completions
from gptkit.data.prepare import prepare
from gptkit.data.registry import read_dataset
from gptkit.demo.tasks import demo_corpus
from gptkit.generation import load_for_generation
from gptkit.tokenizer.chat_template import CHAT_TEMPLATE
from gptkit.tokenizer.train import train_bpe
from gptkit.train.finetune.generation import LABEL_WORDS, as_generation, greedy_answers
from gptkit.train.finetune.tasks import FinetuneConfig, finetune, paper_finetuning
from gptkit.train.pretrain import pretrain
from gptkit.train.recipes import RECIPES
from gptkit.train.run import ModelShape

PRETRAIN_SECONDS = 240
TRAIN_EXAMPLES = 2000
SELECT_EXAMPLES = 200
HELD_OUT = 400
EPOCHS = 3
LR = 1e-3  # the demo's fine-tuning rate for models of this recipe
SAMPLES = 6


def share(hits: list[bool]) -> tuple[float, float]:
    """The share of hits and its standard error (binomial, over the examples)."""
    p = sum(hits) / len(hits)
    return p, math.sqrt(p * (1 - p) / len(hits))


def pretrain_and_tune(out: Path, tokenizer) -> tuple[FinetuneConfig, dict]:
    """Pre-training with the demo's recipe on the books, then generation fine-tuning on SST-2."""
    books = demo_corpus(DATA)
    prepare(out / "tokenizer", books, out / "shards", val_fraction=0.02, show_progress=False)
    recipe = RECIPES["minutes"]
    pretrain(recipe.configs(out / "shards", out / "pre", f"{PRETRAIN_SECONDS}s", 100_000, progress=False))
    config = FinetuneConfig(
        task="generation",
        dataset="sst2",
        data_dir=str(DATA),
        model=ModelShape(init=str(out / "pre")),
        out=str(out / "tuned"),
        max_train_examples=TRAIN_EXAMPLES,
        max_eval_examples=SELECT_EXAMPLES,
        epochs=EPOCHS,
        training=dataclasses.replace(paper_finetuning(), lr=LR, progress=False),
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return config, finetune(config)


def main() -> None:
    started = time.perf_counter()
    words = set(LABEL_WORDS["sst2"].values())
    with tempfile.TemporaryDirectory(prefix="generation_finetune-") as tmp:
        out = Path(tmp)
        tokenizer = train_bpe(demo_corpus(DATA), 8000, out / "tokenizer", show_progress=False)
        config, results = pretrain_and_tune(out, tokenizer)
        dev = as_generation(read_dataset("sst2", "dev", DATA), "sst2", "classification")
        held_out, _ = encode_completions(
            dev[SELECT_EXAMPLES : SELECT_EXAMPLES + HELD_OUT], tokenizer, CHAT_TEMPLATE, 128
        )
        answers = {}
        for side, folder in (("tuned", out / "tuned"), ("untuned", out / "pre")):
            gpt, _ = load_for_generation(folder, dtype="float32", device="cpu")
            answers[side] = [a.strip() for a in greedy_answers(gpt, tokenizer, held_out)]
    figures = {
        side: {
            "in_format": share([a in words for a in given]),
            "right": share([a == e.completion for a, e in zip(given, held_out)]),
        }
        for side, given in answers.items()
    }
    samples = [
        {
            "prompt": e.prompt,
            "reference": e.completion,
            "tuned": answers["tuned"][i],
            "untuned": answers["untuned"][i],
        }
        for i, e in enumerate(held_out[:SAMPLES])
    ]
    setup = {
        "pretrain_seconds": PRETRAIN_SECONDS,
        "train_examples": TRAIN_EXAMPLES,
        "select_examples": SELECT_EXAMPLES,
        "epochs": EPOCHS,
        "lr": LR,
        "lm_coef": config.lm_coef,
        "batch_size": config.training.batch_size,
        "template": CHAT_TEMPLATE,
    }
    emit(
        "generation_finetune",
        [],
        figures=figures,
        held_out=len(held_out),
        majority_class=max(share([e.completion == w for e in held_out])[0] for w in words),
        selection={
            "dev_exact_match": results["best"].get("dev_exact_match"),
            "best_step": results["best_step"],
        },
        samples=samples,
        setup=setup,
        seconds=round(time.perf_counter() - started, 1),
    )


if __name__ == "__main__":
    main()
