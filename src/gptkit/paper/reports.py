"""`gptkit suite`'s reports: results.md (each variant's scores beside the paper's Tables 2–4, Table
5 when ablations ran, each ablation against ``full`` seed by seed and example by example) and
results.json, rewritten whole after every run; and where each run keeps its predictions, which the
comparisons pair."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from gptkit.data.metrics import seed_paired_difference
from gptkit.io import atomic_write, read_json, write_json
from gptkit.paper.scores import TABLE5, TABLE5_AVERAGE, TABLE5_TASKS, TASKS, VARIANTS, PaperTask
from gptkit.train.rundir import RunDir

if TYPE_CHECKING:
    from gptkit.train.finetune.tasks import FinetuneConfig

# Each reported example's prediction, beside result.json: what pairs two variants example by example.
PREDICTIONS_NAME = "predictions.json"
# Fewer training examples than this and a score says only that the pipeline runs (the sample files
# of some datasets beside the project hold a handful of rows).
FEW_EXAMPLES = 100


def seed_dir(out: Path, seed: int) -> Path:
    """Where the fine-tuning of seed ``seed`` runs, under the directory of its task (and variant)."""
    return out / f"seed-{seed}"


def _rows(results: dict[str, dict]) -> list[tuple[PaperTask, dict]]:
    return [(TASKS[name], results[name]) for name in TASKS if name in results]


def format_markdown(results: dict[str, dict[str, dict]], template: FinetuneConfig | None = None) -> str:
    """results.md: one table per variant beside the paper's scores, then Table 5 if ablations ran."""
    lines = ["# gptkit suite: GPT-1's fine-tuning results, reproduced", ""]
    if template is not None:  # the fine-tuning every task started from
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


def write_reports(
    out: Path, results: dict[str, dict[str, dict]], template: FinetuneConfig | None = None
) -> None:
    comparisons = paired_comparisons(out, results)
    text = format_markdown(results, template) + "\n"
    if comparisons:
        text += "\n" + format_comparisons(results, comparisons) + "\n"
    # results.json last: a rerun continues from it, so it never gets ahead of what results.md says
    # when the disk fills between the two (each is replaced whole, or not at all).
    atomic_write(out / "results.md", lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))
    write_json(RunDir(out).results, {"results": results, "comparisons": comparisons})
