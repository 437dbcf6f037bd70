"""Render docs/results.md's benchmark tables from results/*.json, the JSON `make bench` keeps.

A figure in those tables is what a benchmark printed: the tables sit between two markers in
docs/results.md and are rewritten whole, never edited by hand. `--check` only compares, and exits 1
when the file is not what results/ renders (tests/test_docs.py runs it).

    python scripts/render_results.py            # rewrite the tables
    python scripts/render_results.py --check    # are they up to date?
"""

from __future__ import annotations

import argparse
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
    "serve_throughput": "Serving",
    "serve_classify": "Task serving",
    "serve_adapters_memory": "Many adapters, one base",
    "evaluate_throughput": "Evaluation",
    "harness_throughput": "lm-evaluation-harness",
    "lora_finetune": "LoRA fine-tuning",
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


def table(record: dict) -> list[str]:
    name = record["benchmark"]
    lines = [
        f"### {AREAS.get(name, name)} (`benchmarks/{name}.py`)",
        "",
        f"{record.get('date', 'undated')}; {record['machine']}; {hardware(record)}"
        + (
            f"; load average {record['load_average'][1]:.1f} over the last 5 minutes."
            if record.get("load_average")
            else "."
        ),
        "",
        "| what | gptkit | peer | ratio |",
        "|---|---:|---|---:|",
    ]
    for row in record["comparisons"]:
        unit = row["unit"]
        if row.get("skipped"):
            lines.append(f"| {row['what']} | — | {row['peer']} | skipped: {row['skipped']} |")
            continue
        ours = f"{number(row['ours'])} {unit}"
        peer = f"{number(row['peer_value'])} {unit} ({row['peer']})"
        lines.append(f"| {row['what']} | {ours} | {peer} | **{row['ratio']:.2f}×** |")
    return [*lines, ""]


def render(results: Path = RESULTS) -> str:
    records = [json.loads(path.read_text(encoding="utf-8")) for path in sorted(results.glob("*.json"))]
    order = list(AREAS)
    records.sort(
        key=lambda r: (order.index(r["benchmark"]) if r["benchmark"] in order else len(order), r["benchmark"])
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
    args = parser.parse_args()
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
