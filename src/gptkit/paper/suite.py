"""`gptkit suite`: fine-tune one pre-trained model on the paper's tasks and tabulate the results
beside the paper's (Tables 2–4), and its ablations beside Table 5.

Every task of every variant runs with ``--seeds`` seeds (the training config's seed s, then s + 1,
...: each its own data order, dropout and head initialisation), each in its own directory,
``OUT/<variant>/<task>/seed-<s>``, through :func:`gptkit.train.finetune.tasks.finetune` with the paper's
settings (λ = 0.5, lr 6.25e-5, batch 32, 3 epochs, warm-up 0.2%, linear decay). The epoch with the
best dev score is kept; it is then scored on the task's reported sets (test where the labels are
public, else dev) next to a majority-class baseline on the same examples. A finished run leaves
``result.json`` and is never run again; a killed one continues from its latest checkpoint.
``results.json`` and ``results.md`` are rewritten after every run, so they are current whenever the
suite stops: each task's score per seed and their mean; with ablations they end with each one
against ``full``, seed s paired with seed s and example by example over the predictions every run
keeps, with an error that counts the training noise once there are two seeds or more
(:func:`gptkit.data.metrics.seed_standard_error`).
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from gptkit import hub
from gptkit.config import config_error, flat_fields
from gptkit.data.examples import Example
from gptkit.data.registry import DATASETS, read_dataset
from gptkit.data.tasks import task_metrics
from gptkit.io import read_json, read_json_object, write_json
from gptkit.model.task import TaskModel
from gptkit.paper.reports import PREDICTIONS_NAME, seed_dir, write_reports
from gptkit.paper.scores import TASKS, VARIANTS, PaperTask, Variant
from gptkit.train.config import TrainConfig
from gptkit.train.finetune.tasks import FinetuneConfig, finetune
from gptkit.train.rundir import RunDir

RESULT_NAME = "result.json"  # a finished task
SETTINGS_NAME = "suite.json"  # what the suite in a directory was asked to do
# Where each fine-tuning runs, under --out; recorded with the settings, so that a directory written
# with another layout is refused rather than silently run again beside its old runs.
RUN_LAYOUT = "<variant>/<task>/seed-<seed>"
EVAL_BATCH = 64


# What `gptkit suite` shows of its fine-tuning template, as flags, and in which words: the rest of
# FinetuneConfig is each task's own (its dataset, run directory, variant) or keeps its default.
SUITE_FLAGS = (
    "init", "data_dir", "tokenizer", "max_train_examples", "max_eval_examples", "epochs", "lm_coef",
    "transfer_layers", "max_length", "lora", "device", "group_by_length", "training",
)  # fmt: skip
SUITE_HELP = {
    "init": "The pre-trained model: a pretrain run, a converted release, or a Hub name (gpt2, "
    "openai-gpt, org/name@rev) (required).",
    "data_dir": "Where the public datasets live.",
    "max_train_examples": "Train on the first N examples of each task (a CPU slice).",
    "max_eval_examples": "Score the first N examples of each evaluation set.",
    "epochs": "Passes over each task's training data.",
    "lm_coef": "λ of the variants with the auxiliary LM.",
}
# The template's settings that suite.json records (beside the training loop's): two suite runs in one
# directory must agree on them.
RECORDED = (
    "init", "data_dir", "tokenizer", "max_train_examples", "max_eval_examples", "epochs", "lm_coef",
    "transfer_layers", "max_length", "lora_rank", "lora_alpha", "lora_targets",
)  # fmt: skip


@dataclass
class SuiteConfig:
    """Fine-tune one pre-trained model on the paper's tasks; results beside the paper's."""

    finetune: FinetuneConfig = field(
        default_factory=FinetuneConfig,
        metadata={
            "help": "How every task is fine-tuned: the pre-trained model (--init, required), the data, "
            "and the paper's settings (λ = 0.5, lr 6.25e-5, batch 32, 3 epochs, warm-up 0.2%, linear "
            "decay). Each task sets its own dataset and run directory; the variants set λ and the init.",
            "flags": SUITE_FLAGS,
            "field_help": SUITE_HELP,
        },
    )
    tasks: list[str] = field(
        default_factory=lambda: list(TASKS),
        metadata={"help": f"Tasks to run (default: all twelve: {' '.join(TASKS)})."},
    )
    variants: list[Variant] = field(
        default_factory=lambda: ["full"],
        metadata={
            "help": "full; no_aux_lm (λ = 0) and no_pretraining (random init) are Table 5's ablations."
        },
    )
    out: str = field(default="runs/suite", metadata={"help": "Suite directory (continued when rerun)."})
    seeds: int = field(
        default=1,
        metadata={
            "help": "Fine-tune every task of every variant with this many seeds: --seed, --seed + 1, "
            "... (each its own data order, dropout and head initialisation). With 2 or more the "
            "comparisons count the training noise; a rerun with more seeds adds the new ones."
        },
    )

    def __post_init__(self) -> None:
        if not self.finetune.model.init:
            raise config_error(self, "init", "is required: the pre-trained model to fine-tune")
        unknown = [t for t in self.tasks if t not in TASKS]
        if unknown:
            raise config_error(self, "tasks", f"unknown {', '.join(unknown)}; known: {', '.join(TASKS)}")
        bad = [v for v in self.variants if v not in VARIANTS]
        if bad:
            raise config_error(self, "variants", f"unknown {', '.join(bad)}; known: {', '.join(VARIANTS)}")
        if self.seeds <= 0:
            raise config_error(self, "seeds", f"must be positive, got {self.seeds}")


def variant_config(
    template: FinetuneConfig, variant: str, dataset: str, out_dir: Path, resume: bool
) -> FinetuneConfig:
    """The fine-tuning of ``dataset`` for ``variant``, from the suite's ``template``."""
    no_pretraining = variant == "no_pretraining"
    return dataclasses.replace(
        template,
        model=dataclasses.replace(template.model, random_init=no_pretraining),
        tokenizer=template.tokenizer or template.model.init,
        dataset=dataset,
        out=str(out_dir),
        lm_coef=0.0 if variant == "no_aux_lm" else template.lm_coef,
        resume=resume,
        # no_pretraining trains every weight of a random model: LoRA adapts pre-trained ones.
        lora=dataclasses.replace(template.lora, rank=None, alpha=None) if no_pretraining else template.lora,
    )


def missing_files(task: PaperTask, data_dir: str | Path) -> list[str]:
    """The task's files (train, dev and every reported split) that are not in ``data_dir``."""
    needed = {(task.train, "train"), (task.train, "dev")}
    needed |= {(e.dataset, e.split) for e in task.evaluations}
    paths = [Path(data_dir) / DATASETS[d].files[s] for d, s in sorted(needed)]
    return [str(p) for p in paths if not p.exists()]


def majority_baseline(model: TaskModel, train: list[Example], encoded_eval: list) -> dict[str, float]:
    """The task's metrics for always predicting the training slice's most frequent answer (the
    training mean for a score, whose correlation is then 0)."""
    spec = model.spec
    targets = [e.target for e in encoded_eval]
    n = len(targets)
    if spec.regression:
        mean = sum(float(e.label) for e in train) / len(train)
        return task_metrics(spec, torch.full((n,), mean), targets)
    if spec.task == "multiple_choice":
        width, answer = spec.n_choices or 2, Counter(int(e.label) for e in train).most_common(1)[0][0]
    else:
        labels = spec.labels or []
        width = len(labels)
        answer = labels.index(Counter(str(e.label).strip() for e in train).most_common(1)[0][0])
    logits = torch.zeros(n, width)
    logits[:, answer] = 1.0
    return task_metrics(spec, logits, targets)


def _percent(value: float) -> float:
    return round(100.0 * value, 1)


def run_seeds(
    task: PaperTask,
    variant: str,
    template: FinetuneConfig,
    out_dir: Path,
    seeds: int,
    after_each: Callable[[dict], None] = lambda summary: None,
) -> dict:
    """Fine-tune (from ``template``) and score one task with ``seeds`` seeds from the template's
    ``training.seed`` on, each in ``out_dir/seed-<s>``; returns :func:`summarise`'s result, and gives
    it to ``after_each`` after every seed (to keep the reports current)."""
    runs: list[dict] = []
    first = template.training.seed
    for seed in range(first, first + seeds):
        print(f"\n=== {variant}: {task.name}, seed {seed}", flush=True)
        seeded = dataclasses.replace(template, training=dataclasses.replace(template.training, seed=seed))
        runs.append(run_task(task, variant, seeded, seed_dir(out_dir, seed)))
        after_each(summarise(runs))
        if runs[-1]["status"] != "done":  # missing data: no seed can run
            break
    return summarise(runs)


def summarise(runs: list[dict]) -> dict:
    """One task's seeds as a single result: the first run's fields, each evaluation's ``score`` the
    mean over the seeds and ``scores`` each seed's; ``runs`` keeps every seed's result whole."""
    first = runs[0]
    if first["status"] != "done":
        return first
    evaluations = []
    for i, evaluation in enumerate(first["evaluations"]):
        scores = [run["evaluations"][i]["score"] for run in runs]
        evaluations.append({**evaluation, "score": round(sum(scores) / len(scores), 2), "scores": scores})
    return {
        **{k: v for k, v in first.items() if k not in ("best_dev", "steps", "seed", "seconds")},
        "evaluations": evaluations,
        "seeds": [run["seed"] for run in runs],
        "seconds": round(sum(run["seconds"] for run in runs), 1),
        "runs": runs,
    }


def _score(
    task: PaperTask, model: TaskModel, config: FinetuneConfig, train_examples: list[Example]
) -> tuple[list[dict], list[dict]]:
    """The fine-tuned ``model`` on each of the task's reported sets, beside the majority-class
    baseline: (the evaluations, each example's prediction and target)."""
    evaluations, predictions = [], []
    for evaluation in task.evaluations:
        examples = read_dataset(evaluation.dataset, evaluation.split, config.data_dir)
        encoded = model.encode(examples[: config.max_eval_examples], require_labels=True)
        targets = [e.target for e in encoded]
        logits = model.logits(encoded, EVAL_BATCH)
        ours = task_metrics(model.spec, logits, targets)
        said = logits.tolist() if model.spec.regression else logits.argmax(-1).tolist()
        predictions.append({"title": evaluation.title, "predictions": said, "targets": targets})
        baseline = majority_baseline(model, train_examples, encoded)
        evaluations.append(
            {
                **dataclasses.asdict(evaluation),
                "examples": len(encoded),
                "score": _percent(ours[task.metric]),
                "baseline": _percent(baseline[task.metric]),
                "metrics": ours,
            }
        )
    return evaluations, predictions


def run_task(task: PaperTask, variant: str, template: FinetuneConfig, out_dir: Path) -> dict:
    """Fine-tune (from ``template``) and score one task in ``out_dir`` (or read its result if it
    finished before)."""
    config, train = template, template.training
    if (out_dir / RESULT_NAME).exists():
        return read_json(out_dir / RESULT_NAME)
    missing = missing_files(task, config.data_dir)
    if missing:
        return {
            "task": task.name,
            "variant": variant,
            "status": "missing data",
            "missing": missing,
            "advice": f"gptkit data fetch {task.train} --out {config.data_dir}",
        }
    resume = RunDir(out_dir).latest_pointer.exists()
    if not resume and out_dir.exists():
        shutil.rmtree(out_dir)  # killed before its first checkpoint: nothing to continue from
    started = time.perf_counter()
    train_examples = read_dataset(task.train, "train", config.data_dir)[: config.max_train_examples]
    if len(train_examples) < train.batch_size:
        # A sample file smaller than one batch: one batch of all of it, so the task still runs.
        train = dataclasses.replace(train, batch_size=len(train_examples), micro_batch_size=None)
    config = dataclasses.replace(config, training=train)
    finetuned = finetune(variant_config(config, variant, task.train, out_dir, resume))
    evaluations, predictions = _score(
        task, TaskModel.from_pretrained(out_dir, config.device), config, train_examples
    )
    result = {
        "task": task.name,
        "variant": variant,
        "status": "done",
        "seed": train.seed,
        "table": task.table,
        "metric": task.metric,
        "train_examples": finetuned["examples"]["train"],
        "batch_size": train.batch_size,
        "dev_examples": finetuned["examples"]["dev"],
        "best_dev": finetuned["best"],
        "steps": finetuned["steps"],
        "evaluations": evaluations,
        "seconds": round(time.perf_counter() - started, 1),
    }
    write_json(out_dir / PREDICTIONS_NAME, predictions)
    write_json(out_dir / RESULT_NAME, result)  # last: its presence means the task is finished
    return result


def settings_of(config: object, *ignored: str) -> dict:
    """A config's fields as a directory records them, without those that cannot change its results."""
    return {k: v for k, v in dataclasses.asdict(config).items() if k not in ignored}


def train_settings(template: FinetuneConfig) -> dict:
    """The optimisation settings that change results (a progress bar does not): the training loop's,
    and how examples are batched."""
    train: TrainConfig = template.training
    return {
        # Memory settings compute the same updates (to rounding), and a collective's timeout none:
        # a suite continues with other ones.
        **settings_of(
            train,
            "progress",
            "log_every",
            "keep_checkpoints",
            "activation_checkpointing",
            "fsdp_offload",
            "fsdp_defer_gradient_sync",
            "collective_timeout",
        ),
        "group_by_length": template.group_by_length,
    }


def recorded_settings(template: FinetuneConfig, names: tuple[str, ...] = RECORDED) -> dict:
    """The template's settings ``names``, by flag name, as a directory's settings file records them."""
    values = flat_fields(template)
    return {name: values[name] for name in names}


def _settings(config: SuiteConfig) -> dict:
    """What makes two runs of the suite comparable (not which tasks, variants or how many seeds are
    asked for: each seed has its own directory, so a rerun with more adds them)."""
    return {
        "suite": recorded_settings(config.finetune),
        "train": train_settings(config.finetune),
        "layout": {"runs": RUN_LAYOUT},
    }


def check_settings(out: Path, settings: dict) -> None:
    """A suite directory holds one set of settings: a rerun with others would mix results."""
    path = out / SETTINGS_NAME
    if not path.exists():
        write_json(path, settings)
        return
    before = read_json_object(path)
    damaged = [section for section in settings if not isinstance(before.get(section, {}), dict)]
    if damaged:
        raise ValueError(
            f"{path}: field {damaged[0]!r} is not an object; the file is damaged: fix or delete it"
        )
    changed = [
        f"{section}.{name}: {before.get(section, {}).get(name)!r} → {value!r}"
        for section, values in settings.items()
        for name, value in values.items()
        if before.get(section, {}).get(name) != value
    ]
    if changed:
        raise ValueError(
            f"{out} holds a suite run with other settings ({SETTINGS_NAME}: {'; '.join(changed)}): "
            "rerun with the same settings to continue it, or choose another --out"
        )


def run_suite(config: SuiteConfig) -> dict[str, dict[str, dict]]:
    """Every requested variant × task; returns {variant: {task: result}} and writes the reports."""
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        # Every rank would clear, write and report the same task directories: one process runs the
        # suite; a task's own fine-tuning (gptkit finetune) is what takes torchrun.
        raise ValueError("gptkit suite runs in one process: start it without torchrun")
    out = Path(config.out)
    hub.ensure_available(
        config.finetune.model.init, config.finetune.tokenizer
    )  # a name that cannot be had leaves no folder
    # One suite at a time in a directory: two would clear and rewrite each other's tasks and reports.
    # Each task's fine-tuning holds its own directory's lock too (a different file: no deadlock).
    with RunDir(out).writer_lock("suite"):
        check_settings(out, _settings(config))
        results: dict[str, dict[str, dict]] = {}
        previous = RunDir(out).results
        if previous.exists():  # tasks run by earlier invocations stay in the report
            results = read_json(previous).get("results", {})
        for variant in config.variants:
            for name in config.tasks:

                def report(summary: dict, variant: str = variant, name: str = name) -> None:
                    results.setdefault(variant, {})[name] = summary
                    write_reports(out, results, config.finetune)

                result = run_seeds(
                    TASKS[name], variant, config.finetune, out / variant / name, config.seeds, report
                )
                if result["status"] != "done":
                    print(
                        f"    skipped: {result['status']} ({', '.join(result['missing'])}); {result['advice']}"
                    )
    return results
