"""Render docs/results.md's benchmark tables from results/*.json, the JSON `make bench` keeps.

A figure in those tables is what a benchmark printed: the tables sit between two markers in
docs/results.md and are rewritten whole, never edited by hand. `--check` only compares, and exits 1
when the file is not what results/ renders (tests/test_docs.py runs it). `make demo` and `make
paper` keep their figures the same way (`--keep`): the run's own summary, less its paths and
samples, becomes results/demo.json or results/paper.json.

    python scripts/render_results.py            # rewrite the tables
    python scripts/render_results.py --check    # are they up to date?
    python scripts/render_results.py --keep demo runs/demo/summary.json
    python scripts/render_results.py --keep paper runs/paper/suite/results.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "results"
DOC = REPO / "docs" / "results.md"
BEGIN = "<!-- begin: rendered from results/*.json by scripts/render_results.py; edit those, not this -->"
END = "<!-- end: rendered -->"

# One table per area, in the order a user meets them; a benchmark not named here comes last.
AREAS = {
    "tokenizer_throughput": "Tokenizers",
    "prepare_throughput": "Data preparation",
    "train_throughput": "Training",
    "time_to_quality": "Time to quality",
    "generate_throughput": "Decoding",
    "generate_throughput_avx2": "Decoding, PyTorch held to AVX2",
    "generate_throughput_avx2_cpu": "Decoding on a CPU without AVX-512",
    "serve_throughput": "Serving",
    "serve_classify": "Task serving",
    "serve_adapters_memory": "Many adapters, one base",
    "evaluate_throughput": "Evaluation",
    "harness_throughput": "lm-evaluation-harness",
    "lora_finetune": "LoRA fine-tuning",
    "demo": "The demo (`make demo`)",
    "paper": "The paper on a CPU slice (`make paper`)",
}


def number(value: float | None) -> str:
    if value is None:
        return "—"
    if abs(value) >= 100:
        return f"{value:,.0f}"
    return f"{value:.3g}" if abs(value) < 10 else f"{value:.1f}"


def hardware(record: dict) -> str:
    cpu = record.get("hardware", {}).get("cpu", {})
    isa = "AVX512-BF16" if cpu.get("avx512_bf16") else str(cpu.get("aten_capability", "?"))
    if cpu.get("amx"):
        isa += ", AMX"
    if cpu.get("onednn_max_cpu_isa"):
        isa += f", oneDNN capped at {cpu['onednn_max_cpu_isa']}"
    return isa


def heading(record: dict) -> list[str]:
    return [
        f"### {title(record)}",
        "",
        f"{record.get('date', 'undated')}; {record['machine']}; {hardware(record)}"
        + (
            f"; load average {record['load_average'][1]:.1f} over the last 5 minutes."
            if record.get("load_average")
            else "."
        ),
        "",
    ]


def title(record: dict) -> str:
    name = record["benchmark"]
    if name == "demo" and record.get("init"):
        return f"The demo from published weights (`make demo INIT={record['init']}`)"
    if name in ("demo", "paper"):
        return AREAS[name]
    # generate_throughput.py keeps generate_throughput_avx2 with --avx2, generate_throughput_avx2_cpu
    # on a CPU without AVX-512.
    script = name.partition("_avx2")[0]
    return f"{AREAS.get(name, name)} (`benchmarks/{script}.py{' --avx2' if name.endswith('_avx2') else ''}`)"


def table(record: dict) -> list[str]:
    if record["benchmark"] == "demo":
        return demo_table(record)
    if record["benchmark"] == "paper":
        return paper_table(record)
    lines = [*heading(record), "| what | gptkit | peer | ratio |", "|---|---:|---|---:|"]
    for row in record["comparisons"]:
        unit = row["unit"]
        if row.get("skipped"):
            lines.append(f"| {row['what']} | — | {row['peer']} | skipped: {row['skipped']} |")
            continue
        peer = f"{number(row['peer_value'])} {unit} ({row['peer']})"
        if row.get("ratio") is None:  # measured, but with no figure to compare (a note says why)
            lines.append(f"| {row['what']} | — | {peer} | {row.get('note', 'no ratio')} |")
            continue
        ours = f"{number(row['ours'])} {unit}"
        ratio = f"**{row['ratio']:.2f}×**"
        if row.get("bound"):  # reached at the shortest budget: the time is at most, the ratio at least
            ours, ratio = f"≤ {ours}", f"≥ {ratio}"
        lines.append(f"| {row['what']} | {ours} | {peer} | {ratio} |")
    return [*lines, ""]


def demo_table(record: dict) -> list[str]:
    if record.get("init"):
        start = f"From {record['init']}"
    else:
        start = f"The {record['recipe']} recipe, {record['pretrain_updates']:,} pre-training updates"
    lines = [
        *heading(record),
        f"{start}, {record['seconds'] / 60:.1f} minutes in all. Pre-trained − from scratch: the same",
        "examples, settings and order on both sides; ± the standard error of the paired difference",
        "(examples only: one fine-tuning a side).",
        "",
    ]
    # Fine-tuning's updates are counted by the published-weights demo only (its budget sizes them).
    updates = any("updates" in task for task in record["tasks"].values())
    lines += [
        "| task | metric | examples | pre-trained | from scratch | majority class | difference |"
        + (" updates |" if updates else ""),
        "|---|---|---:|---:|---:|---:|---:|" + ("---:|" if updates else ""),
    ]
    for name, task in record["tasks"].items():
        lines.append(
            f"| {name} | {task['metric']} | {task['examples']:,} | {task['pretrained']:.3f} | "
            f"{task['from_scratch']:.3f} | {task['majority_class']:.3f} | "
            f"{task['difference']:+.3f} ± {task['stderr']:.3f} |"
            + (f" {task.get('updates', '—')} |" if updates else "")
        )
    return [*lines, ""]


def paper_table(record: dict) -> list[str]:
    lines = [
        *heading(record),
        "`full` (pre-trained, λ = 0.5) − each variant, in points, ± the standard error of the difference",
        "over seeds and examples; a difference counts where it clears the threshold (in standard errors)",
        "that its number of seeds sets. With one seed the error counts the examples only, not the",
        "training noise (‡): a difference there is one to recheck with more seeds.",
        "",
        "| variant | task | examples | seeds | full − variant | in s.e. | threshold | per seed | clears |",
        "|---|---|---:|---:|---:|---:|---:|---|---|",
    ]
    for variant, tasks in record["comparisons"].items():
        for rows in tasks.values():
            for row in rows:
                per_seed = ", ".join(f"{x:+.2f}" for x in row["per_seed"])
                ratio = f"{row['difference'] / row['stderr']:+.1f}" if row["stderr"] else "—"
                mark = "" if row["training_noise_counted"] else " ‡"
                lines.append(
                    f"| {variant} | {row['title']} | {row['examples']:,} | {len(row['seeds'])} | "
                    f"{row['difference']:+.2f} ± {row['stderr']:.2f}{mark} | {ratio} | {row['threshold']:.2f} | "
                    f"{per_seed} | {'yes' if row['claimed'] else 'no'} |"
                )
    return [*lines, ""]


def keep(kind: str, source: Path, results: Path = RESULTS) -> Path:
    """``make demo``'s summary.json or ``make paper``'s suite results.json as results/<kind>.json:
    its figures, the machine and the run's date, without paths or samples."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    from common import machine

    from gptkit.hardware import describe
    from gptkit.io import write_json

    run = json.loads(source.read_text(encoding="utf-8"))
    record = {
        "benchmark": kind,
        # The run's date, which is when its file was written, not when it is kept.
        "date": datetime.date.fromtimestamp(source.stat().st_mtime).isoformat(),
        "machine": machine(),
        "hardware": describe(),
    }
    if kind == "demo":
        fields = ("metric", "examples", "pretrained", "from_scratch", "majority_class", "difference")
        record |= {
            "recipe": run["recipe"],
            "init": run.get("init"),
            "seconds": run["seconds"],
            "pretrain_updates": run.get("pretrain", {}).get("steps"),
            "tasks": {
                name: {k: task[k] for k in (*fields, "stderr", "updates") if k in task}
                for name, task in run["tasks"].items()
            },
        }
    else:
        record["comparisons"] = run["comparisons"]
    results.mkdir(parents=True, exist_ok=True)
    # The demo from published weights is its own table beside the pre-training demo's.
    target = results / (
        f"{kind}.json" if not record.get("init") else f"{kind}-{Path(record['init']).name}.json"
    )
    write_json(target, record)
    return target


def render(results: Path = RESULTS) -> str:
    records = [json.loads(path.read_text(encoding="utf-8")) for path in sorted(results.glob("*.json"))]
    order = list(AREAS)
    records.sort(
        key=lambda r: (
            order.index(r["benchmark"]) if r["benchmark"] in order else len(order),
            r["benchmark"],
            r.get("init") or "",
        )
    )
    lines = [
        BEGIN,
        "",
        "Ratio: gptkit against the peer named, measured in the same run, higher is better for gptkit",
        "(times and memory inverted). Every figure of each run, with its settings, is in",
        "`results/<benchmark>.json`.",
        "",
    ]
    for record in records:
        lines += table(record)
    return "\n".join([*lines, END])


def updated(document: str, tables: str) -> str:
    if BEGIN not in document or END not in document:
        raise SystemExit(f"{DOC}: the markers are missing; put {BEGIN!r} and {END!r} where the tables go")
    head, rest = document.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return head + tables + tail


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare only; exit 1 when out of date")
    parser.add_argument(
        "--keep",
        nargs=2,
        metavar=("KIND", "FILE"),
        help="keep a run's figures first: demo runs/demo/summary.json, or paper runs/paper/suite/results.json",
    )
    args = parser.parse_args()
    if args.keep:
        kind, source = args.keep
        if kind not in ("demo", "paper"):
            parser.error(f"--keep: KIND is demo or paper, not {kind!r}")
        if not Path(source).is_file():
            parser.error(f"--keep: {source} does not exist; run `make {kind}` first")
        print(f"kept {source} as {keep(kind, Path(source)).relative_to(REPO)}")
    document = DOC.read_text(encoding="utf-8")
    new = updated(document, render())
    if args.check:
        if new != document:
            print(f"{DOC.relative_to(REPO)} is not what results/*.json render: run scripts/render_results.py")
            return 1
        return 0
    DOC.write_text(new, encoding="utf-8")
    print(f"rendered {len(list(RESULTS.glob('*.json')))} benchmarks into {DOC.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
