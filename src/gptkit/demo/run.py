"""`gptkit demo`: its config, and the stages in order within one wall-clock budget."""

from __future__ import annotations

import dataclasses
import functools
import math
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np

from gptkit import hub
from gptkit.config import check_choices
from gptkit.data.prepare import prepare
from gptkit.data.registry import DATASETS
from gptkit.data.shards import TokenShard
from gptkit.demo.compare import PairPlan, Sides, compare_task
from gptkit.demo.plan import MAX_SEEDS, MIN_BUDGET_SECONDS, Deadline, choose_size, expected_margin, plan_time
from gptkit.demo.report import print_summary
from gptkit.demo.sampling import sample
from gptkit.demo.tasks import (
    DEMO_TASKS,
    QUICK_SIZE,
    DemoTask,
    book_openings,
    demo_corpus,
    pair_seconds,
    task_text,
)
from gptkit.generation import load_for_generation
from gptkit.hardware import DEVICE_HELP, Precision, resolve_device, resolve_precision
from gptkit.io import write_json
from gptkit.tokenizer import train_bpe
from gptkit.train.config import parse_duration
from gptkit.train.finetune.tasks import paper_finetuning
from gptkit.train.pretrain import pretrain
from gptkit.train.recipes import RECIPES, PretrainRecipe
from gptkit.train.rundir import RunDir

MARKER = ".gptkit-demo"
DEMO_RECIPE = "minutes"
QUICK_RECIPE = PretrainRecipe(
    vocab_size=1000, n_layer=2, d_model=64, n_head=4, context_length=128, batch_size=16, lr=6e-3,
    schedule="wsd", optimizer="muon", dropout=0.0, warmup_steps=0, eval_every=5,
)  # fmt: skip
QUICK_BOOK_CHARS = 100_000  # --quick: the vocabulary and the shards from each book's first pages
# From published weights (GPT-1's 117M parameters on a CPU) a pair takes minutes: the first
# pre-trained run trains for this share of its task's time and scores for the next; the random side
# takes as long. A pair is then 0.4 of the task's time, so that a second pair still fits with
# another_pair_fits' slack (1.25 × 0.4 ≤ 0.6) and two seeds give the difference an error.
PUBLISHED_TRAIN_SHARE, PUBLISHED_SCORE_SHARE = 0.15, 0.05
# Where the time left holds not one pair at the measured pace (a loaded machine, a tiny budget),
# the pre-trained side trains and scores for these shares of it, and the random side takes as long.
CLOCKED_TRAIN_SHARE, CLOCKED_SCORE_SHARE = 0.3, 0.1
# The paper's batch of 32 leaves a dozen updates of GPT-1 in a CPU's minutes; 8 gives four times as many.
PUBLISHED_BATCH_SIZE = 8


@dataclass
class DemoConfig:
    """The whole job on the sample data: tokenizer, pre-training, fine-tuning, generation."""

    data: str = field(metadata={"help": "The shared data directory."})
    out: str = field(default="runs/demo", metadata={"help": "Run directory (replaced if the demo made it)."})
    quick: bool = field(
        default=False,
        metadata={
            "help": "A much shorter run (seconds), to check the plumbing: 20 updates of a tiny model on "
            "each book's first 100,000 characters, 4 fine-tuning updates on 64 examples a task, no "
            "time budget."
        },
    )
    time_budget: str = field(
        default="15m",
        metadata={
            "help": "Wall-clock budget for the whole demo, counted from --budget-start: pre-training and "
            "fine-tuning share what the vocabulary and the shards leave, so a slower CPU gets fewer "
            "updates and seeds, not a longer demo."
        },
    )
    budget_start: float | None = field(
        default=None,
        metadata={
            "help": "Unix time the budget counts from (make demo passes the time it started, so that "
            "its set-up counts) (default: now).",
            "metavar": "SECONDS",
        },
    )
    seeds: int | None = field(
        default=None,
        metadata={
            "help": "Fine-tunings a side per task, at most (seeds 1337, 1338, ...): with 2 or more the "
            "difference's standard error counts the training noise, and the threshold it must clear "
            f"follows from the seeds (default: as many as the time holds, up to {MAX_SEEDS}, at the run "
            "size that makes the threshold easiest to clear; 1 with --quick)."
        },
    )
    precision: Precision = field(
        default="auto", metadata={"help": "Training precision (auto: by the hardware)."}
    )
    device: str = field(default="auto", metadata={"help": DEVICE_HELP})
    init: str | None = field(
        default=None,
        metadata={
            "help": "Fine-tune these published weights instead of pre-training: openai-gpt (GPT-1, the "
            "paper's), another Hub name or a model folder. Skips the vocabulary and pre-training."
        },
    )
    recipe: Literal["minutes", "baseline"] = field(
        default=DEMO_RECIPE,
        metadata={
            "help": "Pre-training recipe: minutes (chosen for a CPU's minutes), or baseline (GPT-2-small's "
            "settings scaled down, untuned: the reference that time_to_quality measures against)."
        },
    )

    def __post_init__(self) -> None:
        check_choices(self)  # recipe, precision: their Literal types
        parse_duration(self.time_budget)  # a bad budget fails now, not after the tokenizer's minutes
        if self.seeds is not None and self.seeds < 1:
            raise ValueError(f"DemoConfig.seeds (--seeds): must be 1 or more, got {self.seeds}")
        if self.budget_start is not None and self.budget_start > time.time() + 1:
            raise ValueError(
                f"DemoConfig.budget_start (--budget-start): {self.budget_start} is in the future"
            )


def _stage(title: str) -> float:
    print(f"\n=== {title}", flush=True)
    return time.perf_counter()


def _start(config: DemoConfig, out: Path, deadline: Deadline) -> None:
    """Check what can be checked before anything is written, then (re)make ``out``."""
    if not config.quick and deadline.left() < MIN_BUDGET_SECONDS:
        raise ValueError(
            f"time budget {config.time_budget} leaves {max(0.0, deadline.left()):.0f} s after "
            f"{deadline.elapsed():.0f} s of set-up; the demo needs {MIN_BUDGET_SECONDS:.0f} s or more: "
            "give a larger --time-budget"
        )
    hub.ensure_available(config.init)  # a name that cannot be had stops here, before --out is touched
    if config.recipe not in RECIPES:
        raise ValueError(f"unknown recipe {config.recipe!r}; choose one of: {', '.join(RECIPES)}")
    if out.exists():
        if not (out / MARKER).exists():
            raise FileExistsError(f"{out} exists and was not made by the demo; choose another --out")
        shutil.rmtree(out)
    out.mkdir(parents=True)
    (out / MARKER).write_text("made by gptkit demo; safe to delete\n")


def run_demo(config: DemoConfig) -> dict:
    """Run every stage within ``config.time_budget``; write ``summary.json`` in ``config.out`` and
    return it. ``quick`` runs fixed, tiny stages instead (no budget); ``precision`` and ``device``
    are the training commands' (auto: by the hardware); ``recipe`` names one of ``RECIPES``."""
    data, out = Path(config.data), Path(config.out)
    deadline = Deadline(parse_duration(config.time_budget), config.budget_start or time.time())
    _start(config, out, deadline)
    if config.init:
        return _run_published(config, data, out, deadline)
    books = demo_corpus(data)
    if config.quick:
        books = book_openings(books, out / "book_openings", QUICK_BOOK_CHARS)
    corpus = books + task_text(data, out / "task_text")
    shape = QUICK_RECIPE if config.quick else RECIPES[config.recipe]

    t = _stage("1/4 training a GPT-1-style BPE vocabulary on the books and the tasks' unlabelled text")
    train_bpe(corpus, shape.vocab_size, out / "tokenizer", style="gpt1")
    print(f"    {shape.vocab_size} tokens in {time.perf_counter() - t:.0f}s")
    meta = prepare(out / "tokenizer", corpus, out / "shards", val_fraction=0.02)

    plan = plan_time(deadline, "recipe", config.seeds, config.quick)
    budget = None if config.quick else f"{plan.pretrain_seconds:.0f}s"
    t = _stage(
        "2/4 pre-training a small GPT (L1: next-token log-likelihood)"
        + (f", {budget} of the budget" if budget else "")
    )
    print(f"    corpus: {meta['counts']['train']:,} training tokens, {meta['counts']['val']:,} held out")
    pre = shape.configs(
        out / "shards",
        out / "pretrain",
        budget,
        20 if config.quick else 100_000,
        config.precision,
        config.device,
    )
    pre_metrics = pretrain(pre)
    steps_run = RunDir(out / "pretrain").resolved_max_steps()
    pace = (time.perf_counter() - t) / max(1, steps_run)  # seconds a pre-training update, loading included
    print(
        f"    validation loss {pre_metrics['val_loss']:.3f} (perplexity {pre_metrics['val_ppl']:.1f}) "
        f"after {steps_run} updates, {time.perf_counter() - t:.0f}s; curve: {out / 'pretrain' / 'loss.png'}"
    )

    sides = Sides(str(out / "pretrain"), config.precision, config.device, config.quick)
    planner = functools.partial(_power_plan, pace=pace, seeds=config.seeds)
    tasks = _finetune_stage("3/4", DEMO_TASKS, data, out, sides, plan.finetune_end, planner)

    _stage("4/4 sampling from the pre-trained model at the creativity sweep's recommended setting")
    model, tokenizer = load_for_generation(out / "pretrain", device=config.device)
    held_out = TokenShard.open(out / "shards", "val").tokens[:].astype(np.int64).tolist()
    setting, samples = sample(model, tokenizer, held_out, None if config.quick else deadline)
    summary = {
        "recipe": "quick" if config.quick else config.recipe,
        "pretrain": {"steps": steps_run, "seconds_per_update": round(pace, 4), **pre_metrics},
    }
    return _finish(out, summary, tasks, setting, samples, deadline)


def _power_plan(task: DemoTask, seconds: float, pace: float, seeds: int | None) -> PairPlan:
    """A task's pairs from pre-trained weights: the run size whose seeds, as many as ``seconds``
    hold at the ``pace`` pre-training measured, give the largest expected margin; then as many
    pairs as the time holds (``seeds``: at most that many). ``--quick`` (inf): fixed and tiny.
    It reads no data: what it knows of the sizes was measured on held-out training examples."""
    if math.isinf(seconds):
        return PairPlan(QUICK_SIZE, seeds or 1, math.inf)
    examples = task.held_out  # the margin at the example count the sizes' figures were measured on
    costs = {size: pair_seconds(task, size, pace) for size in task.sizes}
    size, expected = choose_size(task.sizes, seconds, costs, examples, seeds or MAX_SEEDS)
    print(
        f"    plan: {size.examples} training examples x {size.epochs} epochs "
        f"({size.updates(task.batch_size)} updates a side), about {costs[size]:.0f}s a seed pair: "
        f"{expected} pair{'s' if expected > 1 else ''} expected in {seconds:.0f}s "
        f"(expected margin {expected_margin(size, expected, examples):.1f})",
        flush=True,
    )
    if costs[size] > seconds:  # not one pair at this pace: one, trained and scored by the clock
        print(
            "    (not one pair at that pace: one, its training and scoring bounded by the clock)", flush=True
        )
        return PairPlan(
            size, 1, time.time() + seconds, CLOCKED_TRAIN_SHARE * seconds, CLOCKED_SCORE_SHARE * seconds
        )
    return PairPlan(size, seeds or MAX_SEEDS, time.time() + seconds)


def _published_plan(task: DemoTask, seconds: float, seeds: int | None) -> PairPlan:
    """A task's pairs from published weights: every training example once, the first pre-trained
    run trained and scored for shares of ``seconds`` aimed at two pairs (``--quick`` (inf): the
    quick size, the whole report split)."""
    if math.isinf(seconds):
        return PairPlan(QUICK_SIZE, seeds or 1, math.inf)
    return PairPlan(
        None,
        seeds or MAX_SEEDS,
        time.time() + seconds,
        train_seconds=PUBLISHED_TRAIN_SHARE * seconds,
        score_seconds=PUBLISHED_SCORE_SHARE * seconds,
    )


def _finetune_stage(
    number: str,
    tasks: dict[str, DemoTask],
    data: Path,
    out: Path,
    sides: Sides,
    finetune_end: float,
    planner: Callable[[DemoTask, float], PairPlan],
) -> dict:
    """Fine-tuning's stage: each task in turn, with its share of the time left until
    ``finetune_end`` (the tasks after it keep theirs; what one leaves passes on), its pairs sized by
    ``planner(task, seconds)`` (seconds inf with --quick)."""
    t = _stage(
        f"{number} fine-tuning: pre-trained vs. random weights of the same shape, seed by seed: the same "
        "settings, head, examples and order"
    )
    results = {}
    for i, (name, task) in enumerate(tasks.items()):
        print(f"  {name} ({DATASETS[task.dataset].task})", flush=True)
        seconds = math.inf if sides.quick else max(0.0, finetune_end - time.time()) / (len(tasks) - i)
        plan = planner(task, seconds)
        results[name] = compare_task(name, task, data, out, sides, plan)
        size = plan.size
        results[name] |= {
            "train_examples": size.examples if size else None,
            "epochs": size.epochs if size else 1,
        }
    print(f"    ({time.perf_counter() - t:.0f}s)")
    return results


def _finish(
    out: Path, summary: dict, tasks: dict, setting: dict, samples: dict[str, str], deadline: Deadline
) -> dict:
    """Write ``summary.json`` and print each task's finding, then the table per seed."""
    sst2 = tasks["sst2"]
    summary |= {
        "sst2_dev_accuracy": {k: sst2[k] for k in ("pretrained", "from_scratch", "majority_class")},
        "tasks": tasks,
        "sampling": setting,
        "samples": samples,
        "time_budget_s": deadline.seconds,
        "seconds": round(deadline.elapsed(), 1),  # from the budget's start: set-up included
    }
    write_json(out / "summary.json", summary)
    budget = None if summary["recipe"] == "quick" else deadline.seconds
    print_summary(tasks, summary["seconds"], budget, str(out / "summary.json"))
    return summary


def _run_published(config: DemoConfig, data: Path, out: Path, deadline: Deadline) -> dict:
    """:func:`run_demo` from published weights: fine-tune them beside random weights of their shape,
    then sample from them."""
    init = str(config.init)
    _stage(f"1/3 {init}: the published model, whose weights and vocabulary are its pre-training")
    folder = hub.resolve(init)  # fetched here when the cache does not hold it
    precision = resolve_precision(config.precision, resolve_device(config.device), "training")
    print(f"    {folder}\n    precision {precision.reason}", flush=True)
    # The paper's fine-tuning settings, at a batch that leaves a CPU's minutes enough updates.
    tasks = {
        name: dataclasses.replace(task, lr=paper_finetuning().lr, batch_size=PUBLISHED_BATCH_SIZE)
        for name, task in DEMO_TASKS.items()
    }
    sides = Sides(init, config.precision, config.device, config.quick)
    plan = plan_time(deadline, "published", config.seeds, config.quick)
    planner = functools.partial(_published_plan, seeds=config.seeds)
    results = _finetune_stage("2/3", tasks, data, out, sides, plan.finetune_end, planner)

    _stage("3/3 sampling from the published model at the creativity sweep's recommended setting")
    model, tokenizer = load_for_generation(init, device=config.device)
    book = demo_corpus(data)[0].read_text(encoding="utf-8")
    held_out = tokenizer.encode(book[: 20_000 if config.quick else 200_000])
    setting, samples = sample(model, tokenizer, held_out, None if config.quick else deadline)
    return _finish(out, {"recipe": "published", "init": init}, results, setting, samples, deadline)
