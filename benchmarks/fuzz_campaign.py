"""The fuzz campaign: every reader's target (src/gptkit/testing/fuzz_targets.py) with 10,000 damaged inputs each.

Per target it counts the inputs tried, those that loaded, those refused with gptkit's own error
naming the file, and the failures (any other exception, a message that does not name the file, a
load past 10 s), with the first few failing messages; and how much the process's peak resident
memory grew while the target ran. The counts are printed, one line a target, and kept as
results/fuzz.json; `--render` writes them into docs/operations.md's table.

    python benchmarks/fuzz_campaign.py                       # every target, 10,000 inputs each
    python benchmarks/fuzz_campaign.py --inputs 200 --targets shard_meta_json corpus_jsonl
    python benchmarks/fuzz_campaign.py --render              # the table from results/fuzz.json

With the readers, the server's schema campaign (gptkit.testing.serve_schema): a `gptkit serve` without and
one with an API key, each sent about 1,000 requests schemathesis generates from its OpenAPI document.

Exit status 1 when any input failed.
"""

from __future__ import annotations

import argparse
import collections
import datetime
import json
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

from common import REPO, machine

from gptkit.io import write_json
from gptkit.testing.fuzz import Target, Unexpected, damage, prepared, try_input
from gptkit.testing.fuzz_targets import TARGETS

RESULTS = REPO / "results" / "fuzz.json"
DOC = REPO / "docs" / "operations.md"
BEGIN = "<!-- begin: rendered from results/fuzz.json by benchmarks/fuzz_campaign.py --render -->"
END = "<!-- end: fuzz -->"
SHOWN_FAILURES = 5  # distinct failing messages kept per target


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


def run_target(target: Target, root: Path, inputs: int, seed: int) -> dict:
    """Try ``inputs`` damaged versions of the target's file; the counts."""
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import seed as hypothesis_seed

    folder, damaged = prepared(target, root)
    original = damaged.read_bytes()
    outcomes: collections.Counter = collections.Counter()
    failures: collections.Counter = collections.Counter()
    rss_before, start = peak_rss_mb(), time.perf_counter()

    @settings(
        max_examples=inputs,
        database=None,
        deadline=None,
        phases=[Phase.generate],  # no shrinking: every failure is counted, none stops the run
        suppress_health_check=list(HealthCheck),
    )
    @hypothesis_seed(seed)
    @given(data=damage(target, original))
    def one(data: bytes) -> None:
        try:
            outcomes[try_input(target, folder, damaged, data)] += 1
        except Unexpected as e:
            outcomes["failed"] += 1
            failures[str(e)[:300]] += 1

    one()
    return {
        "target": target.name,
        "file": damaged.name,
        "inputs": sum(outcomes.values()),
        "loaded": outcomes["loaded"],
        "refused": outcomes["refused"],
        "failures": outcomes["failed"],
        "seconds": round(time.perf_counter() - start, 1),
        "peak_rss_growth_mb": round(peak_rss_mb() - rss_before, 1),
        "failing_messages": [message for message, _ in failures.most_common(SHOWN_FAILURES)],
    }


def render(record: dict) -> str:
    """The table docs/operations.md shows, between its markers."""
    lines = [
        BEGIN,
        "",
        f"{record['date']}; {record['machine']}; {record['inputs_per_target']:,} inputs a target asked for, "
        f"seed {record['seed']}.",
        "",
        "| target | file | inputs | loaded | refused, naming the file | failures | peak RSS growth |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for row in record["targets"]:
        lines.append(
            f"| {row['target']} | `{row['file']}` | {row['inputs']:,} | {row['loaded']:,} | {row['refused']:,} | "
            f"{row['failures']:,} | {row['peak_rss_growth_mb']:.0f} MB |"
        )
    for campaign in record.get("server", []):
        lines.append(
            f"| server: {campaign['what']} | OpenAPI document | {campaign['requests']:,} requests | — | — | "
            f"{campaign['failures']:,} | — |"
        )
    if record.get("note"):
        lines += ["", f"{record['note']}."]
    return "\n".join([*lines, "", END])


def rendered(document: str, table: str) -> str:
    if BEGIN not in document or END not in document:
        raise SystemExit(f"{DOC}: the markers are missing; put {BEGIN!r} and {END!r} where the table goes")
    head, rest = document.split(BEGIN, 1)
    return head + table + rest.split(END, 1)[1]


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--inputs", type=int, default=10_000, help="damaged inputs per target (default 10,000)"
    )
    parser.add_argument("--targets", nargs="*", help="only these targets (default: all)")
    parser.add_argument("--seed", type=int, default=0, help="hypothesis's seed (default 0)")
    parser.add_argument(
        "--out", type=Path, default=RESULTS, help="where the counts go (default results/fuzz.json)"
    )
    parser.add_argument("--render", action="store_true", help="only render --out into docs/operations.md")
    parser.add_argument(
        "--server-requests",
        type=int,
        default=300,
        help="schemathesis examples per operation and generation mode for each of two servers, without "
        "and with an API key (default 300: about 1,000 requests a server; 0: no server campaign)",
    )
    args = parser.parse_args()
    unknown = set(args.targets or ()) - {t.name for t in TARGETS}
    if unknown:
        parser.error(f"unknown target(s): {', '.join(sorted(unknown))}")
    return args


def run_targets(names: list[str] | None, inputs: int, seed: int) -> list[dict]:
    """Each target (or those named) with ``inputs`` damaged inputs: a row of counts each, printed as
    it ends."""
    os.environ.setdefault("GPTKIT_FSYNC", "0")  # each input is written and restored: no need to flush
    import torch

    torch.set_num_threads(1)
    rows = []
    with tempfile.TemporaryDirectory(prefix="gptkit-fuzz-") as root:
        for target in TARGETS:
            if names and target.name not in names:
                continue
            row = run_target(target, Path(root), inputs, seed)
            rows.append(row)
            print(
                f"{row['target']}: {row['inputs']} inputs, {row['loaded']} loaded, {row['refused']} refused, "
                f"{row['failures']} failures ({row['seconds']} s, peak RSS +{row['peak_rss_growth_mb']} MB)",
                flush=True,
            )
            for message in row["failing_messages"]:
                print(f"    {message}", flush=True)
    return rows


def main() -> int:
    args = parse_args()
    if args.render:
        record = json.loads(args.out.read_text(encoding="utf-8"))
        DOC.write_text(rendered(DOC.read_text(encoding="utf-8"), render(record)), encoding="utf-8")
        print(f"rendered {args.out.name} into {DOC.relative_to(REPO)}")
        return 0
    rows = run_targets(args.targets, args.inputs, args.seed)
    servers = run_servers(args.server_requests, args.seed) if args.server_requests else []
    record = {
        "benchmark": "fuzz",
        "date": datetime.date.today().isoformat(),
        "machine": machine(),
        "inputs_per_target": args.inputs,
        "seed": args.seed,
        "comparisons": [],  # no peer: the figures are counts (docs/operations.md renders them)
        "targets": rows,
        "total": {key: sum(row[key] for row in rows) for key in ("inputs", "loaded", "refused", "failures")},
        "server": servers,
    }
    print(json.dumps({**record["total"], "server_requests": sum(s["requests"] for s in servers)}))
    write_json(args.out, record)
    return 1 if record["total"]["failures"] or any(s["failures"] for s in servers) else 0


def run_servers(per_operation: int, seed: int) -> list[dict]:
    """The schema campaign (gptkit.testing.serve_schema) against a server without and with an API key."""
    from gptkit.testing.serve_schema import KEY, build_models, fuzz_served

    servers = []
    with tempfile.TemporaryDirectory(prefix="gptkit-serve-fuzz-") as root:
        models = build_models(Path(root))
        for what, key in (("no API key", None), ("API key", KEY)):
            start = time.perf_counter()
            result = fuzz_served(models, per_operation, seed, key, Path(root) / "server.log")
            result.update(what=what, seconds=round(time.perf_counter() - start, 1))
            servers.append(result)
            print(
                f"server ({what}): {result['requests']} requests, statuses {result['statuses']}, "
                f"{result['failures']} failures ({result['seconds']} s)",
                flush=True,
            )
            for message in result["failing"][:SHOWN_FAILURES]:
                print(f"    {message}", flush=True)
    return servers


if __name__ == "__main__":
    sys.exit(main())
