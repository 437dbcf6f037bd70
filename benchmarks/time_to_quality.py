"""Time to quality: held-out bits per byte after fixed wall-clock budgets of pre-training on the
demo's corpus, for an untuned recipe (``baseline``: GPT-2-small scaled down) and the demo's (``minutes``).

Each (recipe, budget) is its own run, planned for its budget as `make demo` plans its 5 minutes
(the schedule decays to 0 at the budget's end), in the precision the hardware picks. The recipes
alternate within each budget. Bits per byte: the total negative log-likelihood in bits of the
held-out 2% of every book, over that text's UTF-8 bytes, which compares vocabularies of any size.

The comparison: how much sooner the new recipe reaches the baseline's figure at the longest budget,
(longest budget) / (the new recipe's time to that figure), interpolated linearly between its
budgets; a bound (marked) where it is already there at the shortest budget. On an AVX2-only CPU,
or to reproduce one on a CPU with bf16: ``ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2``.
"""

from __future__ import annotations

import argparse
import dataclasses
import tempfile
import time
from pathlib import Path

from common import DATA, comparison, emit

from gptkit.data.prepare import prepare
from gptkit.demo import demo_corpus
from gptkit.evaluate.lm import held_out_bits_per_byte
from gptkit.hardware import resolve_device, resolve_precision
from gptkit.io import read_json
from gptkit.model import GPT
from gptkit.tokenizer import train_bpe
from gptkit.train.pretrain import pretrain
from gptkit.train.recipes import RECIPES, PretrainRecipe


def shards_for(vocab_size: int, work: Path, cache: dict[int, Path]) -> Path:
    """The demo corpus tokenized with a GPT-1-style vocabulary of ``vocab_size`` (made once)."""
    if vocab_size not in cache:
        corpus = demo_corpus(DATA)
        train_bpe(corpus, vocab_size, work / f"tokenizer-{vocab_size}", style="gpt1", show_progress=False)
        prepare(
            work / f"tokenizer-{vocab_size}", corpus, work / f"shards-{vocab_size}", 0.02, show_progress=False
        )
        cache[vocab_size] = work / f"shards-{vocab_size}"
    return cache[vocab_size]


def run(recipe: PretrainRecipe, shards: Path, budget_s: float, out: Path) -> dict:
    config = recipe.configs(shards, out, f"{budget_s}s", 1_000_000, "auto", "auto", progress=False)
    started = time.perf_counter()
    pretrain(config)
    seconds = time.perf_counter() - started
    resolved = read_json(out / "run_config.json")["resolved"]
    result = held_out_bits_per_byte(GPT.from_pretrained(out).eval(), shards)
    return {
        "budget_s": budget_s,
        "seconds": round(seconds, 1),
        "updates": resolved["max_steps"],
        "tokens": resolved["max_steps"] * recipe.batch_size * recipe.context_length,
        "bits_per_byte": round(result["bits_per_byte"], 4),
    }


def time_to_reach(target: float, runs: list[dict]) -> tuple[float | None, bool]:
    """Seconds a recipe needs to reach ``target`` bits per byte, from its runs at several budgets:
    linear between the budgets around the crossing; (shortest budget, True) when already there."""
    runs = sorted(runs, key=lambda r: r["budget_s"])
    if runs[0]["bits_per_byte"] <= target:
        return runs[0]["budget_s"], True
    for before, after in zip(runs, runs[1:]):
        if after["bits_per_byte"] <= target:
            share = (before["bits_per_byte"] - target) / (before["bits_per_byte"] - after["bits_per_byte"])
            return before["budget_s"] + share * (after["budget_s"] - before["budget_s"]), False
    return None, False


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--budgets", default="60,120,300", help="Pre-training budgets, seconds.")
    parser.add_argument(
        "--recipes", default="baseline,minutes", help="Baseline first, then the one measured."
    )
    args = parser.parse_args()
    budgets = [float(b) for b in args.budgets.split(",")]
    names = args.recipes.split(",")
    baseline, ours = names[0], names[-1]
    results: dict[str, list[dict]] = {name: [] for name in names}
    cache: dict[int, Path] = {}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for budget in budgets:
            for name in names:  # alternating: both recipes see the machine in the same state
                shards = shards_for(RECIPES[name].vocab_size, work, cache)
                record = run(RECIPES[name], shards, budget, work / f"{name}-{budget:g}")
                results[name].append(record)
                print(name, record, flush=True)

    longest = max(budgets)
    target = next(r["bits_per_byte"] for r in results[baseline] if r["budget_s"] == longest)
    reached, bound = time_to_reach(target, results[ours])
    comparisons = []
    for budget in budgets:
        mine = next(r for r in results[ours] if r["budget_s"] == budget)
        peer = next(r for r in results[baseline] if r["budget_s"] == budget)
        comparisons.append(comparison(
            f"held-out bits per byte after {budget:g} s of pre-training", "bits/byte",
            mine["bits_per_byte"], f"the {baseline} recipe", peer["bits_per_byte"], higher_is_better=False,
        ))  # fmt: skip
    what = f"time to the {baseline} recipe's {longest:g}-second bits per byte ({target})"
    if reached is None:
        entry = comparison(what, "s", 1.0, f"the {baseline} recipe", longest, higher_is_better=False)
        entry.update(ours=None, ratio=None, note=f"not reached within {longest:g} s")
        comparisons.append(entry)
    else:
        entry = comparison(what, "s", reached, f"the {baseline} recipe", longest, higher_is_better=False)
        if bound:
            entry["bound"] = f"reached within the shortest budget: the ratio is at least {entry['ratio']}"
        comparisons.append(entry)
    device = resolve_device("auto")
    emit(
        "time_to_quality",
        comparisons,
        precision=resolve_precision("auto", device, "training").name,
        recipes={name: dataclasses.asdict(RECIPES[name]) for name in names},
        runs=results,
    )


if __name__ == "__main__":
    main()
