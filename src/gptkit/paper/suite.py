"""`gptkit suite`: fine-tune one pre-trained model on the paper's tasks and tabulate the results
beside the paper's (Tables 2–4), and its ablations beside Table 5.

Every task of every variant runs with ``--seeds`` seeds (the training config's seed s, then s + 1,
...: each its own data order, dropout and head initialisation), each in its own directory,
``OUT/<variant>/<task>/seed-<s>``, through :func:`gptkit.train.finetune.finetune` with the paper's
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
from typing import Literal

import torch

from gptkit import hub
from gptkit.config import config_error, flat_fields
from gptkit.data.examples import Example
from gptkit.data.metrics import seed_paired_difference
from gptkit.data.registry import DATASETS, read_dataset
from gptkit.data.tasks import task_metrics
from gptkit.io import atomic_write, read_json, read_json_object, write_json
from gptkit.model.task import TaskModel
from gptkit.paper.scores import TABLE5, TABLE5_AVERAGE, TABLE5_TASKS, TASKS, PaperTask
from gptkit.train.config import TrainConfig
from gptkit.train.finetune import FinetuneConfig, finetune
from gptkit.train.rundir import RunDir

Variant = Literal["full", "no_aux_lm", "no_pretraining"]
VARIANTS: dict[str, str] = {
    "full": "pre-trained, with the auxiliary LM objective (λ = 0.5)",
    "no_aux_lm": "pre-trained, without the auxiliary LM objective (λ = 0)",
    "no_pretraining": "the same architecture from random weights (λ = 0.5)",
}
RESULT_NAME = "result.json"  # a finished task
# Each reported example's prediction, beside result.json: what pairs two variants example by example.
PREDICTIONS_NAME = "predictions.json"
SETTINGS_NAME = "suite.json"  # what the suite in a directory was asked to do
# Where each fine-tuning runs, under --out; recorded with the settings, so that a directory written
# with another layout is refused rather than silently run again beside its old runs.
RUN_LAYOUT = "<variant>/<task>/seed-<seed>"
# Fewer training examples than this and a score says only that the pipeline runs (the sample files
# of some datasets beside the project hold a handful of rows).
FEW_EXAMPLES = 100
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


def seed_dir(out: Path, seed: int) -> Path:
    """Where the fine-tuning of seed ``seed`` runs, under the directory of its task (and variant)."""
    return out / f"seed-{seed}"


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
    model = TaskModel.from_pretrained(out_dir, config.device)
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
        # Memory settings compute the same updates: a suite continues with other ones.
        **settings_of(
            train, "progress", "log_every", "keep_checkpoints", "activation_checkpointing", "fsdp_offload"
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
                    write_reports(out, results, config)

                result = run_seeds(
                    TASKS[name], variant, config.finetune, out / variant / name, config.seeds, report
                )
                if result["status"] != "done":
                    print(
                        f"    skipped: {result['status']} ({', '.join(result['missing'])}); {result['advice']}"
                    )
    return results


# Reports ------------------------------------------------------------------------------------------


def _rows(results: dict[str, dict]) -> list[tuple[PaperTask, dict]]:
    return [(TASKS[name], results[name]) for name in TASKS if name in results]


def format_markdown(results: dict[str, dict[str, dict]], config: SuiteConfig | None = None) -> str:
    """results.md: one table per variant beside the paper's scores, then Table 5 if ablations ran."""
    lines = ["# gptkit suite: GPT-1's fine-tuning results, reproduced", ""]
    if config is not None:
        template = config.finetune
        lines += [
            f"Model: `{template.model.init}`; training examples per task: "
            f"{template.max_train_examples or 'all'}; evaluation examples: "
            f"{template.max_eval_examples or 'all'}; epochs: {template.epochs}.",
            "",
        ]
    lines += [
        "Scores in percent (Matthews and Pearson correlations × 100). The paper's are its test-set "
        "figures (Tables 2–4); ours are on the split named, test where its labels are public, else "
        "dev. The baseline always predicts the training data's most frequent answer. With several "
        "seeds, gptkit's score is their mean, each seed's in brackets.",
        "",
    ]
    for variant, by_task in results.items():
        lines += [f"## {variant}: {VARIANTS.get(variant, '')}", ""]
        lines += [
            "| table | task | metric | split | examples | gptkit | paper | baseline | trained on |",
            "|---|---|---|---|---:|---:|---:|---:|---:|",
        ]
        notes = set()
        for task, result in _rows(by_task):
            if result["status"] != "done":
                lines.append(
                    f"| {task.table} | {' / '.join(e.title for e in task.evaluations)} | {task.metric} | — | — | "
                    "missing data | "
                    f"{' / '.join(str(e.paper) for e in task.evaluations)} | — | — |"
                )
                notes.add(f"missing data: `{result['advice']}`")
                continue
            few = _trained_on_few(result)
            if few:
                notes.add(
                    f"† fewer than {FEW_EXAMPLES} training examples (the sample files): the score "
                    "shows the task runs end to end, it measures nothing"
                )
            for e in result["evaluations"]:
                lines.append(
                    f"| {task.table} | {e['title']} | {task.metric} | {e['split']} | {e['examples']} | "
                    f"{_seed_scores(e)}{' †' if few else ''} | {e['paper']:.1f} | {e['baseline']:.1f} | "
                    f"{result['train_examples']} |"
                )
        lines += ["", *(f"- {note}" for note in sorted(notes)), ""]
    table5 = [v for v in TABLE5 if v in results]
    if len(table5) > 1:
        lines += [format_table5(results, table5), ""]
    return "\n".join(lines)


def _seed_scores(evaluation: dict) -> str:
    """The mean score, and each seed's in brackets when there are several."""
    scores = evaluation.get("scores", [])
    each = f" ({', '.join(f'{s:.1f}' for s in scores)})" if len(scores) > 1 else ""
    return f"{evaluation['score']:.1f}{each}"


def _trained_on_few(result: dict | None) -> bool:
    return bool(result) and result.get("status") == "done" and result["train_examples"] < FEW_EXAMPLES


def table5_score(result: dict | None) -> float | None:
    """A task's Table 5 figure: its score, MNLI's the mean of matched and mismatched."""
    if not result or result.get("status") != "done":
        return None
    scores = [e["score"] for e in result["evaluations"]]
    return round(sum(scores) / len(scores), 1)


def format_table5(results: dict[str, dict[str, dict]], variants: list[str]) -> str:
    header = "| variant | " + " | ".join(TABLE5_TASKS) + " | average |"
    lines = [
        "## Table 5: ablations (gptkit / paper)",
        "",
        header,
        "|---|" + "---:|" * (len(TABLE5_TASKS) + 1),
    ]
    for variant in variants:
        ours = [table5_score(results[variant].get(t)) for t in TABLE5_TASKS]
        few = [_trained_on_few(results[variant].get(t)) for t in TABLE5_TASKS]
        cells = [
            f"{'—' if o is None else f'{o:.1f}'}{' †' if f else ''} / {TABLE5[variant][t]:.1f}"
            for o, f, t in zip(ours, few, TABLE5_TASKS)
        ]
        present = [o for o in ours if o is not None]
        average = f"{sum(present) / len(present):.1f}" if len(present) == len(ours) else "—"
        lines.append(
            f"| {variant} | " + " | ".join(cells) + f" | {average} / {TABLE5_AVERAGE[variant]:.1f} |"
        )
    lines.append("")
    lines.append(
        "Our average is given only when all eight tasks ran; it includes any † task (trained on "
        f"fewer than {FEW_EXAMPLES} examples), as the paper's average includes every task."
    )
    return "\n".join(lines)


def _predictions(out: Path, variant: str, task: str, seed: int) -> Path:
    return seed_dir(out / variant / task, seed) / PREDICTIONS_NAME


def paired_comparisons(out: Path, results: dict[str, dict[str, dict]]) -> dict[str, dict[str, list[dict]]]:
    """Every ablation against ``full`` on the same examples, {variant: {task: [one per evaluation]}}:
    the difference of the task's metric (full − ablation, in points), seed s of ``full`` paired with
    seed s of the ablation over the seeds both ran, its mean over those seeds, and its standard error
    and claim threshold (:func:`gptkit.data.metrics.seed_standard_error`): the spread of the per-seed
    differences with the example-level error, which is paired example by example (accuracy: sd of the
    per-example differences / √n; F1, Matthews and Pearson: a paired bootstrap). With one seed the
    error counts the examples only. Tasks trained on a sample file's few rows measure nothing and
    are left out."""
    comparisons: dict[str, dict[str, list[dict]]] = {}
    for variant, by_task in results.items():
        if variant == "full":
            continue
        for name, result in by_task.items():
            full = results.get("full", {}).get(name)
            if not full or {full["status"], result["status"]} != {"done"} or _trained_on_few(full):
                continue
            seeds = sorted(set(full["seeds"]) & set(result["seeds"]))
            paths = [_predictions(out, v, name, s) for s in seeds for v in ("full", variant)]
            if not seeds or not all(p.exists() for p in paths):
                continue
            # {variant: one list of evaluations per seed}
            kept = {v: [read_json(_predictions(out, v, name, s)) for s in seeds] for v in ("full", variant)}
            rows = []
            for i, evaluation in enumerate(kept["full"][0]):
                targets = evaluation["targets"]
                if any(run[i]["targets"] != targets for runs in kept.values() for run in runs):
                    continue  # other examples (another --max-eval-examples)
                compared = seed_paired_difference(
                    TASKS[name].metric,
                    [run[i]["predictions"] for run in kept["full"]],
                    [run[i]["predictions"] for run in kept[variant]],
                    targets,
                )
                rows.append(
                    {
                        "title": evaluation["title"],
                        "examples": len(targets),
                        "seeds": seeds,
                        "difference": round(100 * compared.difference, 2),
                        "stderr": round(100 * compared.stderr, 2),
                        "threshold": round(compared.threshold, 2),
                        "claimed": compared.claimed,
                        "training_noise_counted": compared.training_noise_counted,
                        "per_seed": [round(100 * d, 2) for d in compared.per_seed],
                        "per_seed_stderr": [round(100 * s, 2) for s in compared.per_seed_stderr],
                    }
                )
            if rows:
                comparisons.setdefault(variant, {})[name] = rows
    return comparisons


def format_comparisons(
    results: dict[str, dict[str, dict]], comparisons: dict[str, dict[str, list[dict]]]
) -> str:
    lines = [
        "## Each ablation against `full`, seed by seed and example by example",
        "",
        "full − ablation in points of the task's metric, seed s of each paired with seed s, on the "
        "same examples: the mean over the seeds both ran, ± a standard error that counts the spread "
        "of the per-seed differences (training noise) and the error over examples shared by every "
        "seed (SE² = Var(d_i)/N + max(0, (N·P² − mean s_i²)/(N − 1)), docs/paper.md; the examples' "
        "part is paired: accuracy, sd of the per-example differences / √n; F1, Matthews and "
        "Pearson, a paired bootstrap, 1,000 resamples). Positive: `full` is better. A claim (✓) is a "
        "difference past its threshold in standard errors: 2, or more where the error rests on few "
        "seeds (a t quantile, so that ± threshold × s.e. covers the true difference 95% of the time).",
        "",
        "| ablation | task | metric | split | examples | seeds | full | ablation | per seed | "
        "difference ± s.e. | in s.e. | threshold | claim |",
        "|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    one_seed = False
    for variant, by_task in comparisons.items():
        for name, rows in by_task.items():
            scores = {v: {e["title"]: e for e in results[v][name]["evaluations"]} for v in ("full", variant)}
            for row in rows:
                full, other = scores["full"][row["title"]], scores[variant][row["title"]]
                ratio = f"{row['difference'] / row['stderr']:+.1f}" if row["stderr"] else "—"
                mark = "" if row["training_noise_counted"] else " ‡"
                one_seed |= not row["training_noise_counted"]
                lines.append(
                    f"| {variant} | {row['title']} | {TASKS[name].metric} | {full['split']} | "
                    f"{row['examples']} | {len(row['seeds'])} | {full['score']:.1f} | {other['score']:.1f} | "
                    f"{', '.join(f'{d:+.1f}' for d in row['per_seed'])} | "
                    f"{row['difference']:+.1f} ± {row['stderr']:.1f}{mark} | {ratio} | "
                    f"{row['threshold']:.1f} | {'✓' if row['claimed'] else ''} |"
                )
    if one_seed:
        lines += [
            "",
            "‡ one seed: the error counts the examples only, not the training noise (another seed "
            "of each can move the difference by more); run the suite with `--seeds 3` or more.",
        ]
    return "\n".join(lines)


def write_reports(out: Path, results: dict[str, dict[str, dict]], config: SuiteConfig | None = None) -> None:
    comparisons = paired_comparisons(out, results)
    text = format_markdown(results, config) + "\n"
    if comparisons:
        text += "\n" + format_comparisons(results, comparisons) + "\n"
    # results.json last: a rerun continues from it, so it never gets ahead of what results.md says
    # when the disk fills between the two (each is replaced whole, or not at all).
    atomic_write(out / "results.md", lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))
    write_json(RunDir(out).results, {"results": results, "comparisons": comparisons})
