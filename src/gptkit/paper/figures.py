"""Figure 2 of the GPT-1 paper, as commands that write the numbers (JSON, Markdown) and the plot.

Left, ``gptkit figure2 layers``: a task's score when only the first K pre-trained blocks are
transferred (K = 0 keeps just the embeddings), K = 0..n; with ``--seeds N`` each K's mean over N
fine-tunings and its standard error, training noise and examples both counted. Right, ``gptkit figure2 zeroshot``: the
zero-shot heuristics of §5 scored at every checkpoint of a pre-training run (and at its random
initialisation, update 0), to see the language model learn the tasks it was never trained on.
Both continue where they stopped when run again with the same ``--out``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import torch

from gptkit import hub
from gptkit.config import config_error
from gptkit.data.metrics import seed_paired_difference
from gptkit.evaluate.zeroshot import ZEROSHOT_DATASETS, ZEROSHOT_METRICS, run_checkpoints, zeroshot
from gptkit.generation import load_for_generation
from gptkit.hardware import DEVICE_HELP
from gptkit.io import read_json, write_json
from gptkit.model import GPT
from gptkit.paper.reports import PREDICTIONS_NAME, seed_dir
from gptkit.paper.scores import TASKS, PaperTask
from gptkit.paper.suite import check_settings, recorded_settings, run_seeds, settings_of, train_settings
from gptkit.train.finetune.tasks import FinetuneConfig
from gptkit.train.rundir import RunDir

Heuristic = Literal["sentiment", "multiple_choice", "acceptability", "question_answering"]


def _plot(
    path: Path,
    title: str,
    xlabel: str,
    ylabel: str,
    lines: dict,
    chance: dict | None = None,
    errors: dict | None = None,
) -> bool:
    """One line per series ({name: (xs, ys)}), dashed chance levels, error bars where ``errors``
    ({name: one per point}) gives them; False when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed (pip install -e '.[plot]'): no plot written")
        return False
    fig, ax = plt.subplots(figsize=(6, 4))
    for index, (name, (xs, ys)) in enumerate(lines.items()):
        color = f"C{index}"
        yerr = (errors or {}).get(name)
        ax.errorbar(xs, ys, yerr=yerr, marker="o", label=name, color=color, capsize=3 if yerr else 0)
        if chance and name in chance:
            ax.axhline(chance[name], linestyle="--", linewidth=0.8, color=color)
    ax.set(title=title, xlabel=xlabel, ylabel=ylabel)
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


# Left: transferred layers ---------------------------------------------------------------------------


# What `gptkit figure2 layers` shows of its fine-tuning template, as flags, and in which words.
TRANSFER_FLAGS = (
    "init", "data_dir", "tokenizer", "max_train_examples", "max_eval_examples", "epochs", "device",
    "group_by_length", "training",
)  # fmt: skip
TRANSFER_HELP = {
    "init": "The pre-trained model: a folder or Hub name (gpt2, openai-gpt, org/name@rev) (required).",
    "data_dir": "Where the public datasets live.",
    "max_train_examples": "Train on the first N examples.",
    "max_eval_examples": "Score the first N examples.",
}
# The template's settings that the curve's settings file records (beside the training loop's).
RECORDED = ("init", "data_dir", "tokenizer", "max_train_examples", "max_eval_examples", "epochs")


@dataclass
class TransferConfig:
    """Figure 2 (left): a task's score against the number of pre-trained blocks transferred."""

    finetune: FinetuneConfig = field(
        default_factory=FinetuneConfig,
        metadata={
            "help": "How each point is fine-tuned: the pre-trained model (--init, required), the data, "
            "and the paper's settings; each point sets its own --transfer-layers.",
            "flags": TRANSFER_FLAGS,
            "field_help": TRANSFER_HELP,
        },
    )
    task: str = field(default="mnli", metadata={"help": f"A suite task: {', '.join(TASKS)}."})
    layers: list[int] | None = field(
        default=None, metadata={"help": "Block counts to transfer (default: 0 to the model's layers)."}
    )
    out: str = field(
        default="runs/figure2-layers", metadata={"help": "Output directory (continued when rerun)."}
    )
    seeds: int = field(
        default=1,
        metadata={
            "help": "Fine-tunings per block count (--seed, --seed + 1, ...): each point is their mean "
            "± its standard error (training noise counted from 2 seeds on)."
        },
    )

    def __post_init__(self) -> None:
        if not self.finetune.model.init:
            raise config_error(self, "init", "is required: the pre-trained model whose blocks to transfer")
        if self.seeds <= 0:
            raise config_error(self, "seeds", f"must be positive, got {self.seeds}")
        if self.task not in TASKS:
            raise config_error(self, "task", f"unknown {self.task!r}; known: {', '.join(TASKS)}")


def curve_settings(config: TransferConfig) -> dict:
    """What makes two runs of the curve comparable, as its settings file records them."""
    return {
        "layers": {"task": config.task, **recorded_settings(config.finetune, RECORDED)},
        "train": train_settings(config.finetune),
        "layout": {"runs": "layers-<k>/seed-<seed>"},
    }


def transfer_curve(config: TransferConfig) -> dict:
    """Fine-tune with K = each of ``layers`` transferred blocks, ``seeds`` times each (in
    ``out/layers-<K>/seed-<s>``); writes layers.{json,md,png} in ``out``."""
    out = Path(config.out)
    template = config.finetune
    hub.ensure_available(
        template.model.init, template.tokenizer
    )  # a name that cannot be had leaves no folder
    with RunDir(out).writer_lock("figure2 layers"):  # one writer of the curve (its tasks lock their own)
        return _transfer_curve(config, out)


def _layers_table(task: PaperTask, points: list[dict]) -> list[str]:
    """layers.md's lines: each block count's score per reported set, mean ± s.e. over its seeds,
    and the majority-class baseline."""
    titles = [e["title"] for e in points[0]["evaluations"]]
    rows = [
        f"| {p['layers']} | {len(p['seeds'])} | "
        + " | ".join(f"{e['score']:.1f} ± {e['stderr']:.1f}" for e in p["evaluations"])
        + " |"
        for p in points
    ]
    baseline = " | ".join(f"{e['baseline']:.1f}" for e in points[0]["evaluations"])
    table = [
        f"| blocks transferred | seeds | {' | '.join(titles)} ({task.metric}, mean ± s.e.) |",
        "|---:|---:|" + "---:|" * len(titles),
        *rows,
        f"| baseline | | {baseline} |",
    ]
    if any(len(p["seeds"]) == 1 for p in points):
        table.append("\nWith one seed the error counts the examples only, not the training noise.")
    return table


def _transfer_curve(config: TransferConfig, out: Path) -> dict:
    """:func:`transfer_curve`'s work, while ``out`` is held."""
    template = config.finetune
    n_layer = GPT.from_pretrained(template.model.init).config.n_layer
    layers = config.layers if config.layers is not None else list(range(n_layer + 1))
    bad = [k for k in layers if not 0 <= k <= n_layer]
    if bad:
        raise ValueError(f"--layers: {bad} outside 0..{n_layer} (the model has {n_layer} blocks)")
    # Which points, how many seeds and where they run are not settings: more block counts and seeds
    # may be added to a curve.
    check_settings(out, curve_settings(config))
    task = TASKS[config.task]
    points = []
    for k in layers:
        print(f"\n=== {task.name}: transferring {k} of {n_layer} blocks", flush=True)
        directory = out / f"layers-{k:02d}"
        point = dataclasses.replace(template, transfer_layers=k)
        result = run_seeds(task, "full", point, directory, config.seeds)
        if result["status"] != "done":
            raise FileNotFoundError(
                f"{task.name}: missing {', '.join(result['missing'])}; {result['advice']}"
            )
        kept = [read_json(seed_dir(directory, seed) / PREDICTIONS_NAME) for seed in result["seeds"]]
        for i, evaluation in enumerate(result["evaluations"]):
            # The score's own error, as a difference against nothing: over seeds and examples.
            score = seed_paired_difference(
                task.metric, [run[i]["predictions"] for run in kept], None, kept[0][i]["targets"]
            )
            evaluation["stderr"] = round(100 * score.stderr, 2)
        points.append(
            {
                "layers": k,
                "seeds": result["seeds"],
                "evaluations": result["evaluations"],
                "best_dev": [run["best_dev"] for run in result["runs"]],
            }
        )
    report = {"task": task.name, "metric": task.metric, "n_layer": n_layer, "points": points}
    write_json(out / "layers.json", report)
    table = _layers_table(task, points)
    (out / "layers.md").write_text("\n".join(table) + "\n", encoding="utf-8")
    titles = [e["title"] for e in points[0]["evaluations"]]
    lines = {
        title: ([p["layers"] for p in points], [p["evaluations"][i]["score"] for p in points])
        for i, title in enumerate(titles)
    }
    chance = {title: points[0]["evaluations"][i]["baseline"] for i, title in enumerate(titles)}
    errors = {title: [p["evaluations"][i]["stderr"] for p in points] for i, title in enumerate(titles)}
    _plot(
        out / "layers.png",
        f"Transferring pre-trained blocks: {task.name}",
        "blocks transferred",
        f"{task.metric} (%)",
        lines,
        chance,
        errors,
    )
    print("\n".join(table))
    return report


# Right: zero-shot during pre-training ---------------------------------------------------------------


@dataclass
class ZeroshotCurveConfig:
    """Figure 2 (right): the zero-shot heuristics at every checkpoint of a pre-training run."""

    run: str = field(metadata={"help": "A pre-training run directory (with checkpoints/)."})
    heuristics: list[Heuristic] = field(
        default_factory=lambda: list(ZEROSHOT_DATASETS), metadata={"help": "Which heuristics to score."}
    )
    data_dir: str = field(default="data", metadata={"help": "Where the public datasets live."})
    out: str = field(
        default="runs/figure2-zeroshot", metadata={"help": "Output directory (continued when rerun)."}
    )
    tokenizer: str | None = field(
        default=None, metadata={"help": "Tokenizer folder or Hub name (default: --run)."}
    )
    limit: int | None = field(default=500, metadata={"help": "Score the first N examples of each dataset."})
    split: str = field(default="dev", metadata={"help": "Split to score."})
    seed: int = field(default=0, metadata={"help": "Seed of the untrained model scored at update 0."})
    device: str = field(default="auto", metadata={"help": DEVICE_HELP})


def zeroshot_curve(config: ZeroshotCurveConfig) -> dict:
    """Score every checkpoint (and update 0); writes zeroshot.{json,md,png} in ``out``."""
    out = Path(config.out)
    with RunDir(out).writer_lock("figure2 zeroshot"):  # one writer of the curve
        return _zeroshot_curve(config, out)


def _zeroshot_curve(config: ZeroshotCurveConfig, out: Path) -> dict:
    """:func:`zeroshot_curve`'s work, while ``out`` is held."""
    # Scores kept from an earlier call are reused: only with the same run, data and sample.
    check_settings(out, {"zeroshot": settings_of(config, "heuristics", "out", "device")})  # more may be added
    report_path = out / "zeroshot.json"
    done = {p["step"]: p for p in read_json(report_path)["points"]} if report_path.exists() else {}
    checkpoints = run_checkpoints(config.run)
    tokenizer_dir = config.tokenizer or config.run
    for step, directory in [(0, checkpoints[0][1]), *checkpoints]:
        if step in done and all(h in done[step]["scores"] for h in config.heuristics):
            continue
        model, tokenizer = load_for_generation(
            directory, tokenizer_dir, dtype="float32", device=config.device, decoding=False
        )
        if step == 0:  # the same architecture, untrained: where every curve starts
            torch.manual_seed(config.seed)
            model = (
                GPT(dataclasses.replace(model.config, dropout=0.0)).to(next(model.parameters()).device).eval()
            )
        scores = {}
        for heuristic in config.heuristics:
            result = zeroshot(
                model, tokenizer, heuristic, config.data_dir, split=config.split, limit=config.limit
            )
            scores[heuristic] = {
                "score": result[ZEROSHOT_METRICS[heuristic][0]],
                "examples": result["examples"],
            }
        done[step] = {"step": step, "scores": scores}
        print(f"update {step}: " + ", ".join(f"{h} {s['score']:.3f}" for h, s in scores.items()), flush=True)
        write_json(report_path, {"run": config.run, "points": [done[s] for s in sorted(done)]})
    points = [done[s] for s in sorted(done)]
    heuristics = [h for h in config.heuristics if all(h in p["scores"] for p in points)]
    header = " | ".join(f"{h} ({ZEROSHOT_METRICS[h][0]}, {ZEROSHOT_DATASETS[h]})" for h in heuristics)
    table = [
        f"| updates | {header} |",
        "|---:|" + "---:|" * len(heuristics),
        *(
            f"| {p['step']} | " + " | ".join(f"{p['scores'][h]['score']:.3f}" for h in heuristics) + " |"
            for p in points
        ),
        "| chance | " + " | ".join(f"{ZEROSHOT_METRICS[h][1]:.3f}" for h in heuristics) + " |",
    ]
    (out / "zeroshot.md").write_text("\n".join(table) + "\n", encoding="utf-8")
    lines = {h: ([p["step"] for p in points], [p["scores"][h]["score"] for p in points]) for h in heuristics}
    _plot(
        out / "zeroshot.png",
        "Zero-shot heuristics during pre-training",
        "pre-training updates",
        "score (accuracy; MCC for acceptability)",
        lines,
        {h: ZEROSHOT_METRICS[h][1] for h in heuristics},
    )
    print("\n".join(table))
    return {"run": config.run, "points": points}
