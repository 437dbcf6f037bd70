"""`make demo`: the paper's whole recipe, small enough for a laptop CPU, and its one claim shown.

1. Train a GPT-1-style BPE vocabulary (ftfy + spaCy + ``</w>``) on public-domain books and the
   unlabelled text of the two tasks' training splits (no labels; nothing of the reported splits).
2. Prepare token shards and pre-train a small GPT (L1) for its share of the time left: the first
   updates are timed and the schedule is planned for as many as fit. Precision follows the
   hardware: bf16 autocast where it is native, fp32 elsewhere (bf16 on an AVX2-only CPU would take
   hours). The blocks are GPT-2's pre-LN layout: in a few hundred updates GPT-1's post-LN blocks
   barely leave the unigram plateau. The recipe is :data:`gptkit.train.recipes.RECIPES`' ``minutes``.
3. Fine-tune on SST-2 (classification) and Story Cloze (multiple choice), from the pre-trained
   weights and from random weights of the same shape, once per seed: the pre-trained side's first
   updates are timed and its schedule planned for the updates that fit; the random side then runs
   exactly as many, on the same examples in the same order. Each task's difference comes with the
   suite's seed-aware standard error and the threshold its number of seeds sets
   (:func:`gptkit.data.metrics.seed_paired_difference`); one seed a side prints the difference
   alone, since a single draw cannot tell it from training noise.
4. Sample a few lines from the pre-trained model at the setting the creativity sweep recommends.

The whole demo keeps to one wall-clock budget (``--time-budget``, counted from ``--budget-start``:
``make demo`` passes the time it started, so its set-up counts). The vocabulary and the shards take
what they take; pre-training and fine-tuning then share what is left, each stage sized from the
time left when it starts, so a slower CPU pays in updates and scored examples, never in time.

With ``--init NAME`` (``gptkit demo --init openai-gpt``) steps 1 and 2 are OpenAI's own: the published
weights and their vocabulary are the paper's pre-training, done. Step 3 fine-tunes them beside the
same shape from random weights with the paper's fine-tuning settings (lr 6.25e-5, λ = 0.5, warm-up
0.2%, linear decay, dropout 0.1) at batch 8, for what the budget holds; step 4 samples from them.
"""

from __future__ import annotations

import dataclasses
import shutil
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np

from gptkit import hub
from gptkit.config import check_choices
from gptkit.data.metrics import seed_paired_difference
from gptkit.data.prepare import prepare
from gptkit.data.registry import DATASETS, read_dataset
from gptkit.data.shards import TokenShard
from gptkit.evaluate.finetuned import correct_per_example
from gptkit.evaluate.tradeoff import passages_from_text, sweep
from gptkit.generation import SamplingParams, generate_text, load_for_generation
from gptkit.hardware import DEVICE_HELP, Precision, resolve_device, resolve_precision
from gptkit.io import write_json
from gptkit.model.task import TaskModel
from gptkit.tokenizer import train_bpe
from gptkit.train.config import parse_duration
from gptkit.train.finetune import FinetuneConfig, finetune, paper_finetuning
from gptkit.train.pretrain import pretrain
from gptkit.train.recipes import RECIPES, PretrainRecipe
from gptkit.train.run import ModelShape
from gptkit.train.rundir import RunDir

MARKER = ".gptkit-demo"
PROMPTS = ["It was a dark and stormy night, and", "The king said to his daughter", "Alice looked at the"]
SAMPLE_TOKENS = 30
DEMO_RECIPE = "minutes"
QUICK_RECIPE = PretrainRecipe(
    vocab_size=1000, n_layer=2, d_model=64, n_head=4, context_length=128, batch_size=16, lr=6e-3,
    schedule="wsd", optimizer="muon", dropout=0.0, warmup_steps=0, eval_every=5,
)  # fmt: skip


@dataclass(frozen=True)
class DemoTask:
    """A fine-tuning task of the demo: which data, how much of it, and where the score is read."""

    dataset: str
    report_split: str  # never the split a setting was chosen on
    epochs: int  # at most: the time budget may end a run sooner
    lr: float
    batch_size: int = 32
    # Fields of the training split whose text (no labels) joins the pre-training corpus: the task's
    # own unlabelled text, as ULMFiT's target-domain language modelling. Never the report split.
    pretrain_text: tuple[str, ...] = ()


# The rate was chosen on held-out training examples (the last 1,000 SST-2 training sentences, the
# last 300 training stories), for both initialisations alike: 1e-3 beat 3e-4 for both.
DEMO_TASKS = {
    "sst2": DemoTask("sst2", report_split="dev", epochs=2, lr=1e-3, pretrain_text=("text",)),
    # The paper's Story Cloze setting: trained on the 2016 validation stories, scored on the test set.
    # Its stories' first four sentences join the corpus, not their endings (which one is right is
    # the label).
    "story_cloze": DemoTask(
        "story_cloze", report_split="test", epochs=2, lr=1e-3, pretrain_text=("context",)
    ),
}
SIDES = ("pretrained", "from_scratch")
SIDE_NAMES = {"pretrained": "pre-trained", "from_scratch": "from scratch"}
FIRST_SEED = 1337  # TrainConfig's default seed; seed i of a side is FIRST_SEED + i
QUICK_TASK_EXAMPLES = {"train": 64, "dev": 64}  # --quick: a few updates, the report split in full
QUICK_BOOK_CHARS = 100_000  # --quick: the vocabulary and the shards from each book's first pages

# The time plan. Pre-training's share of what the vocabulary and the shards leave: on 2 cores the
# 5 minutes it had when the demo's settings were chosen. Sampling's time is set aside first (the
# sweep and three continuations: under a minute for the recipe's model, more for GPT-1's 117M
# parameters), and a margin for start-up, loading and the machine's noise.
PRETRAIN_SHARE = 0.45
SAMPLING_SECONDS = {"recipe": 45.0, "published": 120.0}
MARGIN_SHARE = 0.04
CONTINUATION_SECONDS = 10.0  # of sampling's time, for the three continuations after the sweep
# Of each (task, seed) pair's time, per side: training, then scoring the report split.
TRAIN_SHARE, SCORE_SHARE = 0.38, 0.12
SCORE_CHUNK = 32  # report examples scored between looks at the clock
MIN_TRAIN_SECONDS = 20.0  # a second seed only where each fine-tuning still trains this long
MIN_BUDGET_SECONDS = 180.0  # the demo's stages need at least this much after set-up
DEFAULT_SEEDS = 2
# The paper's batch of 32 leaves a dozen updates of GPT-1 in a CPU's minutes; 8 gives four times as many.
PUBLISHED_BATCH_SIZE = 8


class Deadline:
    """The demo's wall-clock budget: ``seconds`` from ``start`` (Unix time)."""

    def __init__(self, seconds: float, start: float) -> None:
        self.seconds, self.start = seconds, start
        self.end = start + seconds

    def left(self) -> float:
        return self.end - time.time()

    def elapsed(self) -> float:
        return time.time() - self.start


def demo_corpus(data: Path) -> list[Path]:
    files = sorted((data / "gutenberg").glob("*.txt")) + [data / "tinyshakespeare" / "input.txt"]
    missing = [str(f) for f in files if not f.is_file()]
    if missing or not files:
        raise FileNotFoundError(
            f"demo corpus not found under {data} (missing: {', '.join(missing) or 'gutenberg/'})"
        )
    return files


def book_openings(files: list[Path], out: Path, chars: int) -> list[Path]:
    """Each file's first ``chars`` characters, as corpus files in ``out`` (a smoke run's corpus)."""
    out.mkdir(parents=True, exist_ok=True)
    openings = []
    for path in files:
        openings.append(out / f"{path.parent.name}-{path.name}")
        openings[-1].write_text(path.read_text(encoding="utf-8")[:chars], encoding="utf-8")
    return openings


def task_text(data: Path, out: Path) -> list[Path]:
    """The demo tasks' unlabelled training text, one example a line, as corpus files in ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    files = []
    for name, task in DEMO_TASKS.items():
        if not task.pretrain_text:
            continue
        lines = [
            " ".join(example.fields[field] for field in task.pretrain_text)
            for example in read_dataset(task.dataset, "train", data)
        ]
        files.append(out / f"{name}.txt")
        files[-1].write_text("\n".join(lines) + "\n", encoding="utf-8")
    return files


def _stage(title: str) -> float:
    print(f"\n=== {title}", flush=True)
    return time.perf_counter()


def majority_share(examples: list) -> float:
    """The score of always answering the most common label (or answer position) of ``examples``."""
    counts = Counter(str(e.label) for e in examples)
    return counts.most_common(1)[0][1] / len(examples)


def constant_answer(correct: list[int], examples: list) -> str | None:
    """The label (or answer position) that, always given, scores exactly ``correct`` on ``examples``:
    a model that collapsed to one answer. None when no single answer does."""
    labels = [str(e.label) for e in examples]
    for answer in sorted(set(labels)):
        if all(c == (label == answer) for c, label in zip(correct, labels)):
            return answer
    return None


def auto_seeds(finetune_seconds: float) -> int:
    """Seeds a side when none are asked for: two where each fine-tuning still trains for
    ``MIN_TRAIN_SECONDS`` (two draws show the training noise; the threshold they set is wide),
    else one."""
    per_run = finetune_seconds / (len(DEMO_TASKS) * DEFAULT_SEEDS) * TRAIN_SHARE
    return DEFAULT_SEEDS if per_run >= MIN_TRAIN_SECONDS else 1


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


@dataclass(frozen=True)
class Sides:
    """What both sides of a comparison start from, and how they train."""

    init: str  # the pre-trained side's weights (a run folder or a Hub name); the other side takes its shape
    precision: str
    device: str
    quick: bool = False


def compare_task(
    name: str, task: DemoTask, data: Path, out: Path, sides: Sides, seeds: int, finetune_end: float
) -> dict:
    """Fine-tune ``task`` from the pre-trained weights and from random weights of the same shape, once
    per seed, and compare them example by example on the report split.

    Each seed's pair has its share of the time left until ``finetune_end`` (Unix time): the
    pre-trained side trains for ``TRAIN_SHARE`` of it (the updates that fit, planned from the first
    ones), the random side exactly as many updates on the same examples in the same order. The first
    pre-trained side scores the report split for ``SCORE_SHARE`` of its pair's time; every other run
    scores the same examples, so that all are paired."""
    report = read_dataset(task.dataset, task.report_split, data)
    runs: list[dict] = []
    scored: int | None = None
    for i, seed in enumerate(range(FIRST_SEED, FIRST_SEED + seeds)):
        pair_seconds = max(0.0, finetune_end - time.time()) / (seeds - i)
        updates: int | None = None
        correct: dict[str, list[int]] = {}
        for side in SIDES:
            run = out / name / f"seed-{seed}" / side
            budget = (
                None if sides.quick or updates is not None else f"{max(1.0, pair_seconds * TRAIN_SHARE):.0f}s"
            )
            finetune(_finetune_config(task, data, run, sides, side, seed, budget, updates))
            updates = updates or RunDir(run).resolved_max_steps()
            if scored is None:
                seconds = None if sides.quick else pair_seconds * SCORE_SHARE
                correct[side] = score_examples(run, report, sides.device, seconds)
                scored = len(correct[side])
            else:
                correct[side] = score_examples(run, report, sides.device, limit=scored)
            # Each example's outcome, kept: the comparison can be recomputed from these files.
            write_json(run / "report_correct.json", {"split": task.report_split, "correct": correct[side]})
        runs.append({"seed": seed, "updates": updates, **correct})
        print(
            f"    seed {seed}: pre-trained {np.mean(correct['pretrained']):.3f}, from scratch "
            f"{np.mean(correct['from_scratch']):.3f} ({updates} updates of {task.batch_size} a side)",
            flush=True,
        )
    return compare_sides(task, report[:scored], runs)


def _finetune_config(
    task: DemoTask,
    data: Path,
    run: Path,
    sides: Sides,
    side: str,
    seed: int,
    budget: str | None,
    updates: int | None,
) -> FinetuneConfig:
    return FinetuneConfig(
        # dropout 0.1, the paper's, for both: pre-training may have run without dropout
        model=ModelShape(init=sides.init, random_init=side == "from_scratch", dropout=0.1),
        dataset=task.dataset,
        data_dir=str(data),
        out=str(run),
        epochs=task.epochs,
        max_train_examples=QUICK_TASK_EXAMPLES["train"] if sides.quick else None,  # None: all
        # The dev score a run keeps for itself is not the one reported (score_examples is): a chunk.
        max_eval_examples=QUICK_TASK_EXAMPLES["dev"] if sides.quick else SCORE_CHUNK,
        device=sides.device,
        training=dataclasses.replace(
            paper_finetuning(),
            lr=task.lr,
            batch_size=task.batch_size,
            precision=sides.precision,
            eval_every=10**9,  # evaluated once, at the end: the reported model is the last one
            progress=True,
            time_budget=budget,
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


def difference_sentence(result: dict) -> str:
    """A task's difference as a reader should take it: with several seeds, its error and whether it
    clears the threshold its seeds set; with one, that a single draw cannot tell it from noise."""
    difference, examples = result["difference"], result["examples"]
    if result["seeds"] == 1:
        return (
            f"{difference:+.3f} on {examples} examples, one fine-tuning a side: a single draw cannot tell "
            "this difference from training noise (another seed can move it as much); --seeds 2 or more "
            "measures that noise"
        )
    per_seed = ", ".join(f"{run['pretrained'] - run['from_scratch']:+.3f}" for run in result["per_seed"])
    verdict = "clears it" if result["clears_threshold"] else "does not: not told apart from the noise"
    return (
        f"{difference:+.3f} ± {result['stderr']:.3f} over {result['seeds']} seeds and {examples} examples "
        f"(per seed {per_seed}); with {result['seeds']} seeds a difference must clear "
        f"{result['threshold']:.1f} standard errors, and this one {verdict}"
    )


def recommended_sampling(model, ids: list[int], seconds: float | None = None) -> dict:
    """The sampling setting the creativity sweep recommends on held-out text ``ids`` (its samples'
    NLL closest to the true text's; :mod:`gptkit.evaluate.tradeoff`), on as many of its 12 passages
    as ``seconds`` hold; with the passages it used."""
    passages = passages_from_text(ids, prompt_tokens=32, new_tokens=24, count=12)
    report = sweep(
        model,
        passages,
        temperatures=(0.6, 0.8, 1.0),
        top_ps=(None, 0.9),
        samples_per_prompt=2,
        seconds=seconds,
    )
    return report["recommended"] | {"passages": report["passages"]}


def sample(model, tokenizer, held_out: list[int], deadline: Deadline | None) -> tuple[dict, dict[str, str]]:
    """The last stage: the recommended setting on ``held_out`` ids, swept for the time the budget
    leaves (None: all of the sweep), and a continuation of each prompt."""
    seconds = None
    if deadline is not None:  # the margin, and a few seconds for the continuations, stay in hand
        seconds = max(0.0, deadline.left() - MARGIN_SHARE * deadline.seconds - CONTINUATION_SECONDS)
    setting = recommended_sampling(model, held_out, seconds)
    print(
        f"    recommended: temperature {setting['temperature']}, top-p {setting['top_p'] or 'off'} "
        f"(swept on {setting['passages']} held-out passages)"
    )
    params = SamplingParams(
        max_tokens=SAMPLE_TOKENS, temperature=setting["temperature"], top_p=setting["top_p"], seed=0
    )
    samples = generate_text(model, tokenizer, PROMPTS, params=params)
    for prompt, text in zip(PROMPTS, samples):
        print(f"    {prompt} → {' '.join(text.split())}")  # newlines folded for display
    return setting, dict(zip(PROMPTS, samples))


@dataclass
class DemoConfig:
    """The whole job on the sample data: tokenizer, pre-training, fine-tuning, generation."""

    data: str = field(metadata={"help": "The shared data directory."})
    out: str = field(default="runs/demo", metadata={"help": "Run directory (replaced if the demo made it)."})
    quick: bool = field(
        default=False,
        metadata={
            "help": "A much shorter run (seconds), to check the plumbing: 20 updates of a tiny model on "
            "each book's first 100,000 characters, 64 training examples a task, no time budget."
        },
    )
    time_budget: str = field(
        default="15m",
        metadata={
            "help": "Wall-clock budget for the whole demo, counted from --budget-start: pre-training and "
            "fine-tuning share what the vocabulary and the shards leave, so a slower CPU gets fewer "
            "updates, not a longer demo."
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
            "help": "Fine-tunings a side per task (seeds 1337, 1338, ...): with 2 or more the difference's "
            "standard error counts the training noise, and the threshold it must clear follows from "
            f"the seeds (default: {DEFAULT_SEEDS} where each fine-tuning still trains "
            f"{MIN_TRAIN_SECONDS:.0f} s, else 1; 1 with --quick)."
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


def run_demo(config: DemoConfig) -> dict:
    """Run every stage within ``config.time_budget``; write ``summary.json`` in ``config.out`` and
    return it. ``quick`` runs fixed, tiny stages instead (no budget); ``precision`` and ``device``
    are the training commands' (auto: by the hardware); ``recipe`` names one of ``RECIPES``."""
    data, out = Path(config.data), Path(config.out)
    deadline = Deadline(parse_duration(config.time_budget), config.budget_start or time.time())
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

    plan = _plan(config, deadline, "recipe")
    t = _stage(
        "2/4 pre-training a small GPT (L1: next-token log-likelihood)"
        + ("" if config.quick else f", {plan['pretrain_seconds']:.0f}s of the budget")
    )
    print(f"    corpus: {meta['counts']['train']:,} training tokens, {meta['counts']['val']:,} held out")
    pre = shape.configs(
        out / "shards",
        out / "pretrain",
        None if config.quick else f"{plan['pretrain_seconds']:.0f}s",
        20 if config.quick else 100_000,
        config.precision,
        config.device,
    )
    pre_metrics = pretrain(pre)
    steps_run = RunDir(out / "pretrain").resolved_max_steps()
    print(
        f"    validation loss {pre_metrics['val_loss']:.3f} (perplexity {pre_metrics['val_ppl']:.1f}) "
        f"after {steps_run} updates, {time.perf_counter() - t:.0f}s; curve: {out / 'pretrain' / 'loss.png'}"
    )

    sides = Sides(str(out / "pretrain"), config.precision, config.device, config.quick)
    tasks = _finetune_stage("3/4", DEMO_TASKS, data, out, sides, plan)

    _stage("4/4 sampling from the pre-trained model at the creativity sweep's recommended setting")
    model, tokenizer = load_for_generation(out / "pretrain", device=config.device)
    held_out = TokenShard.open(out / "shards", "val").tokens[:].astype(np.int64).tolist()
    setting, samples = sample(model, tokenizer, held_out, None if config.quick else deadline)
    summary = {
        "recipe": "quick" if config.quick else config.recipe,
        "pretrain": {"steps": steps_run, **pre_metrics},
    }
    return _finish(out, summary, tasks, setting, samples, deadline)


def _plan(config: DemoConfig, deadline: Deadline, kind: str) -> dict:
    """How the time left is spent: pre-training's seconds (none from published weights), the end
    of fine-tuning (Unix time) and the seeds a side, printed."""
    if config.quick:
        return {"pretrain_seconds": 0.0, "finetune_end": time.time(), "seeds": config.seeds or 1}
    sampling = SAMPLING_SECONDS[kind]
    shared = deadline.left() - sampling - MARGIN_SHARE * deadline.seconds
    if shared < MIN_BUDGET_SECONDS / 2:  # the vocabulary and the shards took what training needed
        raise ValueError(
            f"time budget {deadline.seconds:.0f}s leaves {max(0.0, shared):.0f}s to train after "
            f"{deadline.elapsed():.0f}s of set-up and data; give a larger --time-budget"
        )
    pretrain_seconds = PRETRAIN_SHARE * shared if kind == "recipe" else 0.0
    finetune_seconds = max(0.0, shared - pretrain_seconds)
    seeds = config.seeds or auto_seeds(finetune_seconds)
    print(
        f"\n    time plan: {deadline.seconds:.0f}s in all, {deadline.elapsed():.0f}s spent; "
        + (f"pre-training {pretrain_seconds:.0f}s, " if kind == "recipe" else "")
        + f"fine-tuning {finetune_seconds:.0f}s ({seeds} seed{'s' if seeds > 1 else ''} a side), "
        f"sampling {sampling:.0f}s",
        flush=True,
    )
    return {
        "pretrain_seconds": pretrain_seconds,
        # Fine-tuning ends before the sampling's and the margin's time, whenever pre-training ended.
        "finetune_end": deadline.end - sampling - MARGIN_SHARE * deadline.seconds,
        "seeds": seeds,
    }


def _finetune_stage(
    number: str, tasks: dict[str, DemoTask], data: Path, out: Path, sides: Sides, plan: dict
) -> dict:
    """Fine-tuning's stage: each task compared in turn, sharing the time until the plan's
    ``finetune_end`` with the tasks after it."""
    seeds, finetune_end = plan["seeds"], plan["finetune_end"]
    t = _stage(
        f"{number} fine-tuning: pre-trained vs. random weights of the same shape, the same settings, "
        f"examples and order, {seeds} seed{'s' if seeds > 1 else ''} a side"
    )
    results = {}
    for i, (name, task) in enumerate(tasks.items()):
        print(f"  {name} ({DATASETS[task.dataset].task})", flush=True)
        # This task's share of the time left: the tasks after it keep theirs.
        task_end = time.time() + max(0.0, finetune_end - time.time()) / (len(tasks) - i)
        results[name] = compare_task(name, task, data, out, sides, seeds, task_end)
    print(f"    ({time.perf_counter() - t:.0f}s)")
    return results


def _finish(
    out: Path, summary: dict, tasks: dict, setting: dict, samples: dict[str, str], deadline: Deadline
) -> dict:
    """Write ``summary.json`` and print each task's figures, a JSON line each."""
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
    budget = "" if summary["recipe"] == "quick" else f" of a {deadline.seconds:.0f}s budget"
    print(f"\ndone in {summary['seconds']:.0f}s{budget}; summary: {out / 'summary.json'}")
    for name, result in tasks.items():
        print(f"  {name}: pre-trained − from scratch {difference_sentence(result)}")
    return summary


def _run_published(config: DemoConfig, data: Path, out: Path, deadline: Deadline) -> dict:
    """:func:`run_demo` from published weights: fine-tune them beside random weights of their shape,
    then sample from them."""
    init = str(config.init)
    _stage(f"1/3 {init}: the published model, whose weights and vocabulary are its pre-training")
    folder = hub.resolve(init)  # fetched here when the cache does not hold it
    precision = resolve_precision(config.precision, resolve_device(config.device), "training")
    print(f"    {folder}\n    precision {precision.reason}", flush=True)
    # The paper's fine-tuning settings, at a batch that leaves a CPU's minutes enough updates; one
    # epoch at most (the budget ends the run well within it).
    tasks = {
        name: dataclasses.replace(task, lr=paper_finetuning().lr, batch_size=PUBLISHED_BATCH_SIZE, epochs=1)
        for name, task in DEMO_TASKS.items()
    }
    sides = Sides(init, config.precision, config.device, config.quick)
    results = _finetune_stage("2/3", tasks, data, out, sides, _plan(config, deadline, "published"))

    _stage("3/3 sampling from the published model at the creativity sweep's recommended setting")
    model, tokenizer = load_for_generation(init, device=config.device)
    book = demo_corpus(data)[0].read_text(encoding="utf-8")
    held_out = tokenizer.encode(book[: 20_000 if config.quick else 60_000])
    setting, samples = sample(model, tokenizer, held_out, None if config.quick else deadline)
    return _finish(out, {"recipe": "published", "init": init}, results, setting, samples, deadline)
