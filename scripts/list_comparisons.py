"""Every comparison in results/*.json, one line each: what gptkit ran, the peer and how the peer ran
(its configuration, as the benchmark named it), the figures and the ratio, the rounds behind them,
and where the record was taken (date, machine, commit, whether the machine was loaded).

A benchmark that runs gptkit batched against a peer that takes one example at a time measures the
gain from batching, not a faster library: such a row must say so ("the gain from batching" in its
`what` or its peer). `--check` lists the rows that do not, and exits 1 where there are any
(tests/test_comparisons.py runs it).

    python scripts/list_comparisons.py            # a Markdown table of every comparison
    python scripts/list_comparisons.py --json     # the same as JSON lines
    python scripts/list_comparisons.py --check    # batched against one-at-a-time, unlabelled?
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "results"
BATCHING_GAIN = "the gain from batching"
# A peer fed one example at a time ("one pair at a time", "one request at a time", ...).
ONE_AT_A_TIME = re.compile(r"\bone (?:\w+ )?at a time\b", re.IGNORECASE)
# gptkit's side batched: a batch size, concurrent clients, or many rows a step.
BATCHED = re.compile(r"\bbatch(?:es)? (?:of )?(\d+)|\b(\d+) (?:streaming )?clients\b", re.IGNORECASE)


def records(results: Path = RESULTS) -> list[dict]:
    """Every results JSON that holds comparisons, in name order."""
    out = []
    for path in sorted(results.glob("*.json")):
        record = json.loads(path.read_text(encoding="utf-8"))
        if isinstance(record, dict) and isinstance(record.get("comparisons"), list):
            out.append(record | {"file": path.name})
    return out


def rows(results: Path = RESULTS) -> list[dict]:
    """One row per comparison, with its record's provenance."""
    out = []
    for record in records(results):
        threads = (record.get("hardware") or {}).get("cpu", {}).get("threads")
        for comparison in record["comparisons"]:
            if not isinstance(comparison, dict):
                continue
            out.append(
                {
                    "file": record["file"],
                    "what": comparison.get("what"),
                    "peer": comparison.get("peer"),
                    "unit": comparison.get("unit"),
                    "ours": comparison.get("ours"),
                    "peer_value": comparison.get("peer_value"),
                    "ratio": comparison.get("ratio"),
                    "on_par": comparison.get("on_par"),
                    "rounds": comparison.get("rounds") or record.get("rounds") or record.get("repeats"),
                    "skipped": comparison.get("skipped"),
                    "date": record.get("date"),
                    "machine": record.get("machine"),
                    "threads": threads,
                    "commit": record.get("commit"),
                }
            )
    return out


def batching_unlabelled(row: dict) -> bool:
    """Whether the row sets batched gptkit against a one-at-a-time peer without saying that this is
    the gain from batching."""
    what, peer = str(row["what"] or ""), str(row["peer"] or "")
    if BATCHING_GAIN in what or BATCHING_GAIN in peer:
        return False
    batched = any(int(n or m) > 1 for n, m in BATCHED.findall(what))
    return batched and bool(ONE_AT_A_TIME.search(peer)) and not ONE_AT_A_TIME.search(what)


def table(listed: list[dict]) -> str:
    lines = [
        "| file | what gptkit ran | peer, as it ran | gptkit | peer | ratio | rounds | date, machine, commit |",
        "|---|---|---|---:|---:|---:|---:|---|",
    ]
    for row in listed:
        ratio = "skipped" if row["skipped"] else "—" if row["ratio"] is None else f"{row['ratio']}×"
        ratio += " (on par)" if row["on_par"] else ""
        where = f"{row['date']}, {row['machine']}, {(row['commit'] or 'no commit')[:10]}"
        lines.append(
            f"| {row['file']} | {row['what']} | {row['peer']} | {row['ours']} {row['unit']} | "
            f"{row['peer_value']} | {ratio} | {row['rounds'] or '—'} | {where} |"
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="JSON lines instead of a Markdown table")
    parser.add_argument("--check", action="store_true", help="exit 1 on an unlabelled batching gain")
    parser.add_argument("--results", type=Path, default=RESULTS, help="the folder of results JSON")
    args = parser.parse_args()
    listed = rows(args.results)
    if args.check:
        bad = [row for row in listed if batching_unlabelled(row)]
        for row in bad:
            print(f"{row['file']}: batched against one at a time, unlabelled: {row['what']} / {row['peer']}")
        return 1 if bad else 0
    if args.json:
        print("\n".join(json.dumps(row) for row in listed))
    else:
        print(table(listed))
    return 0


if __name__ == "__main__":
    sys.exit(main())
