"""One task's comparison: fine-tune from the pre-trained weights and from random weights of the same
shape, seed by seed, and compare them example by example on the report split.

The two sides of a seed are paired in everything but the transformer's weights: the same training
examples in the same order, the same head W_y (drawn from the seed), the same dropout draws, the
same learning rate and schedule, the same updates; so the per-seed difference cancels what the
sides share, and the spread across seeds is the training noise of the difference itself.
"""

from __future__ import annotations

import dataclasses
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from gptkit.data.metrics import seed_paired_difference
from gptkit.data.registry import read_dataset
from gptkit.demo.plan import RunSize, another_pair_fits
from gptkit.demo.report import SIDE_NAMES, difference_sentence
from gptkit.demo.tasks import DemoTask, constant_answer, majority_share
from gptkit.evaluate.finetuned import correct_per_example
from gptkit.hardware import resolve_precision
from gptkit.io import write_json
from gptkit.model.task import TaskModel
from gptkit.train.finetune.tasks import FinetuneConfig, finetune, paper_finetuning
from gptkit.train.run import ModelShape
from gptkit.train.rundir import RunDir

SIDES = ("pretrained", "from_scratch")
FIRST_SEED = 1337  # TrainConfig's default seed; seed i of a side is FIRST_SEED + i
SCORE_CHUNK = 32  # report examples scored between looks at the clock
QUICK_DEV_EXAMPLES = 64  # --quick: the dev examples a run evaluates itself on


@dataclass(frozen=True)
class Sides:
    """What both sides of a comparison start from, and how they train."""

    init: str  # the pre-trained side's weights (a run folder or a Hub name); the other side takes its shape
    precision: str
    device: str
    quick: bool = False


@dataclass(frozen=True)
class PairPlan:
    """How a task's seed pairs run: their size, how many at most, and by when."""

    size: RunSize | None  # None: every training example, once, the first run bounded by train_seconds
    seeds: int  # at most: a pair starts only where the time left holds it
    end: float  # Unix time by which the task's last pair ends
    train_seconds: float | None = None  # the first pre-trained run's time budget (size None)
    score_seconds: float | None = None  # the first run's scoring time (None: the whole report split)


def score_examples(
    run: Path, examples: list, device: str, seconds: float | None = None, limit: int | None = None
) -> list[int]:
    """:func:`correct_per_example` of the model in ``run`` on ``examples`` in order, a chunk at a time,
    until ``seconds`` have passed (checked between chunks) or ``limit`` examples are scored. The
    weights are bf16 where the hardware multiplies it natively (both sides alike), else fp32."""
    model = TaskModel.from_pretrained(run, device=device)
    model = model.to(resolve_precision("auto", model.device, "scoring").dtype)
    end = len(examples) if limit is None else min(limit, len(examples))
    started, correct = time.perf_counter(), []
    for start in range(0, end, SCORE_CHUNK):
        correct += correct_per_example(model, examples[start : min(start + SCORE_CHUNK, end)], device=device)
        if seconds is not None and time.perf_counter() - started >= seconds:
            break
    return correct


def compare_task(
    name: str,
    task: DemoTask,
    data: Path,
    out: Path,
    sides: Sides,
    plan: PairPlan,
    held_out: list | None = None,
) -> dict:
    """Seed pairs of ``task`` as ``plan`` sizes them, while the time holds another; each side's
    outcome on every scored report example is kept in its run folder, and the comparison over the
    seeds is printed and returned (:func:`compare_sides`). ``held_out``: the training split's last
    examples, scored instead of the report split (the run sizes' measurement,
    scripts/demo_plan_sizes.py; the demo itself passes none)."""
    if held_out is None:
        report = read_dataset(task.dataset, task.report_split, data)
    else:  # named as what they are, in the kept outcomes and the result's metric
        report, task = held_out, dataclasses.replace(task, report_split=f"train[-{len(held_out)}:]")
    runs: list[dict] = []
    pair_seconds: list[float] = []
    updates: int | None = None
    scored: int | None = None
    for seed in range(FIRST_SEED, FIRST_SEED + plan.seeds):
        left = plan.end - time.time()
        if not sides.quick and not another_pair_fits(left, pair_seconds, len(runs), plan.seeds):
            break
        started = time.perf_counter()
        correct: dict[str, list[int]] = {}
        for side in SIDES:
            run = out / name / f"seed-{seed}" / side
            finetune(finetune_config(task, data, run, sides, side, seed, plan, updates))
            updates = updates or RunDir(run).resolved_max_steps()
            seconds = plan.score_seconds if scored is None else None
            correct[side] = score_examples(run, report, sides.device, seconds, limit=scored)
            scored = scored or len(correct[side])
            # Each example's outcome, kept: the comparison can be recomputed from these files.
            write_json(run / "report_correct.json", {"split": task.report_split, "correct": correct[side]})
        pair_seconds.append(time.perf_counter() - started)
        runs.append({"seed": seed, "updates": updates, **correct})
        print(
            f"    seed {seed}: pre-trained {np.mean(correct['pretrained']):.3f}, from scratch "
            f"{np.mean(correct['from_scratch']):.3f} ({updates} updates of {task.batch_size} a side, "
            f"{pair_seconds[-1]:.0f}s the pair)",
            flush=True,
        )
    return compare_sides(task, report[:scored], runs)


def finetune_config(
    task: DemoTask,
    data: Path,
    run: Path,
    sides: Sides,
    side: str,
    seed: int,
    plan: PairPlan,
    updates: int | None,
) -> FinetuneConfig:
    """One side's fine-tuning: ``plan``'s size, or the first pre-trained run's time budget; every
    later run takes the ``updates`` that run planned."""
    size = plan.size
    return FinetuneConfig(
        # dropout 0.1, the paper's, for both: pre-training may have run without dropout
        model=ModelShape(init=sides.init, random_init=side == "from_scratch", dropout=0.1),
        dataset=task.dataset,
        data_dir=str(data),
        out=str(run),
        epochs=size.epochs if size else 1,
        max_train_examples=size.examples if size else None,  # None: all
        # The dev score a run keeps for itself is not the one reported (score_examples is): a chunk.
        max_eval_examples=QUICK_DEV_EXAMPLES if sides.quick else SCORE_CHUNK,
        device=sides.device,
        training=dataclasses.replace(
            paper_finetuning(),
            lr=task.lr,
            batch_size=task.batch_size,
            precision=sides.precision,
            eval_every=10**9,  # evaluated once, at the end: the reported model is the last one
            progress=True,
            time_budget=None if updates or not plan.train_seconds else f"{max(1.0, plan.train_seconds):.0f}s",
            max_steps=updates,
            seed=seed,
        ),
    )


def compare_sides(task: DemoTask, report: list, runs: list[dict]) -> dict:
    """Both sides' scores on ``report`` and their difference over the seeds, printed and returned.
    With several seeds the standard error counts the training noise and the examples, and the
    difference is told apart from the noise only past the threshold that the seeds set; with one,
    no error is given, as one draw a side cannot tell a difference from training noise."""
    compared = seed_paired_difference(
        "accuracy",
        [run["pretrained"] for run in runs],
        [run["from_scratch"] for run in runs],
        [1] * len(report),
    )
    majority = majority_share(report)
    majority_label = Counter(str(e.label) for e in report).most_common(1)[0][0]
    per_seed = []
    for run in runs:
        collapsed = {side: constant_answer(run[side], report) for side in SIDES}
        for side, answer in collapsed.items():
            if answer is not None:
                print(
                    f"    seed {run['seed']}: {SIDE_NAMES[side]} answers {answer!r} on every example "
                    f"({'the majority class' if answer == majority_label else 'a minority class'}: "
                    "it learned nothing of the task)",
                    flush=True,
                )
        per_seed.append(
            {
                "seed": run["seed"],
                "updates": run["updates"],
                **{side: float(np.mean(run[side])) for side in SIDES},
                "one_answer": {side: answer for side, answer in collapsed.items() if answer is not None},
            }
        )
    several = len(runs) > 1
    result = {
        "metric": f"{task.report_split} accuracy",
        "examples": len(report),
        "seeds": len(runs),
        **{side: float(np.mean([run[side] for run in per_seed])) for side in SIDES},
        "majority_class": majority,
        "difference": compared.difference,
        # One seed a side: no error, since which run was drawn is most of the noise.
        "stderr": compared.stderr if several else None,
        "threshold": compared.threshold if several else None,
        "clears_threshold": compared.claimed if several else None,
        "batch_size": task.batch_size,
        "per_seed": per_seed,
    }
    print(f"    majority class: {majority:.3f}", flush=True)
    print(f"    pre-trained − from scratch: {difference_sentence(result)}", flush=True)
    return result
