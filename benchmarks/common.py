"""Shared by the benchmarks: where the data is, what machine this is, and the JSON they print."""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import signal
import statistics
import sys
import time
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DATA = Path(os.environ.get("GPTKIT_DATA", REPO.parent / "shared" / "data"))
# The most one measurement may take before it is reported as skipped: ample on a 2-core CPU, where
# the slowest takes a few minutes at most; it keeps a slow path from running for hours.
TIME_LIMIT_S = float(os.environ.get("GPTKIT_BENCH_TIME_LIMIT_S", "600"))
# Where the benchmarks that take a device run (benchmarks/gpu.sh sets cuda); cpu by default.
DEVICE = os.environ.get("GPTKIT_BENCH_DEVICE", "cpu")
SETTLE_S = 150.0  # at most this long waiting for the last benchmark's load to fade


def settled_load() -> list[float] | None:
    """The load average once the previous benchmark's has faded: the 1-minute figure decays over a
    minute or two, so right after `make bench`'s previous benchmark it still counts that one's
    threads. Waits (at most SETTLE_S) for it to fall below half the cores; other work keeps it up,
    and the record then shows it. A benchmark's worker processes inherit GPTKIT_BENCH_SETTLED and
    do not wait."""
    if not hasattr(os, "getloadavg"):
        return None
    # A benchmark's own worker process (it has waited), or a script only rendering kept records.
    if os.environ.get("GPTKIT_BENCH_SETTLED") or "--render" in sys.argv[1:]:
        return [round(x, 2) for x in os.getloadavg()]
    os.environ["GPTKIT_BENCH_SETTLED"] = "1"  # inherited by the workers it starts
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    waited = 0.0
    while os.getloadavg()[0] > cores / 2 and waited < SETTLE_S:
        time.sleep(5.0)
        waited += 5.0
    return [round(x, 2) for x in os.getloadavg()]


# How busy the machine was before the benchmark began (it imports this module first): at the end,
# the load average also counts the benchmark's own threads.
LOAD_AT_START = settled_load()


def synchronize() -> None:
    """Wait for the device's queued work, so a clock read after it measures the work (CUDA runs
    asynchronously; on a CPU there is nothing to wait for)."""
    if DEVICE.startswith("cuda"):
        import torch

        torch.cuda.synchronize()


def machine() -> str:
    from gptkit.hardware import machine_summary

    return machine_summary()


def commit() -> str | None:
    """The commit measured ("+changes" where the checkout differs from it)."""
    from gptkit.testing.provenance import source_commit

    return source_commit(REPO)


def median(values: list[float]) -> float:
    return statistics.median(values)


def comparison(
    what: str, unit: str, ours: float, peer: str, peer_value: float, higher_is_better: bool = True
) -> dict:
    ratio = ours / peer_value if higher_is_better else peer_value / ours
    return {
        "what": what,
        "unit": unit,
        "ours": round(ours, 4),
        "peer": peer,
        "peer_value": round(peer_value, 4),
        "ratio": round(ratio, 3),
    }


def skipped(what: str, unit: str, peer: str, reason: str) -> dict:
    """A comparison not run, and why: the keys of ``comparison``, with no figures."""
    return {
        "what": what,
        "unit": unit,
        "ours": None,
        "peer": peer,
        "peer_value": None,
        "ratio": None,
        "skipped": reason,
    }


def with_spread(row: dict, ours: list[float], peer: list[float]) -> dict:
    """``row`` (its figures the medians of ``ours`` and ``peer``) with each side's spread over the
    rounds (least, most) and ``on_par``: whether the two spreads overlap, where a ratio says nothing
    a rerun would keep (the README then says "on par")."""
    row["rounds"] = len(ours)
    row["ours_spread"] = [round(min(ours), 4), round(max(ours), 4)]
    row["peer_spread"] = [round(min(peer), 4), round(max(peer), 4)]
    row["on_par"] = not (min(ours) > max(peer) or min(peer) > max(ours))
    return row


def spread_comparison(
    what: str, unit: str, ours: list[float], peer: str, theirs: list[float], **kwargs
) -> dict:
    """``comparison`` of the medians of the rounds, with their spreads; no ratio where a median is not
    above zero (a difference of two timings that the machine's noise outweighed)."""
    ours_median, peer_median = median(ours), median(theirs)
    if min(ours_median, peer_median) > 0:
        return with_spread(comparison(what, unit, ours_median, peer, peer_median, **kwargs), ours, theirs)
    row = skipped(what, unit, peer, "")
    del row["skipped"]
    row |= {"ours": round(ours_median, 4), "peer_value": round(peer_median, 4)}
    row["note"] = "no ratio: a median at or below zero, the machine's noise larger than the figure"
    return with_spread(row, ours, theirs)


class MeasurementTimeout(Exception):
    """A measurement ran past its time limit."""


@contextlib.contextmanager
def time_limit(seconds: float) -> Iterator[None]:
    """Raise MeasurementTimeout in the block after ``seconds`` (where the OS has SIGALRM; else no limit).

    The signal is only seen between Python bytecodes, so a single long native call overruns it; the
    benchmarks' loops return to Python every step.
    """
    if not hasattr(signal, "SIGALRM"):
        yield
        return

    def expire(signum, frame):
        raise MeasurementTimeout(f"ran past its {seconds:.0f} s limit")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def emit(name: str, comparisons: list[dict], **extra) -> None:
    """Print the benchmark's JSON; with ``GPTKIT_RESULTS`` set (``make bench``), also keep it as
    ``$GPTKIT_RESULTS/<name>.json``, which scripts/render_results.py turns into docs/results.md's tables."""
    from gptkit.hardware import describe
    from gptkit.io import write_json

    record = {
        "benchmark": name,
        "date": datetime.date.today().isoformat(),
        "commit": commit(),
        "machine": machine(),
        "hardware": describe(),
        # How busy the machine was (1, 5, 15 minutes): a busy one slows both sides, not always alike.
        "load_average": [round(x, 2) for x in os.getloadavg()] if hasattr(os, "getloadavg") else None,
        "load_average_at_start": LOAD_AT_START,
        "comparisons": comparisons,
        **extra,
    }
    print(json.dumps(record), flush=True)
    if os.environ.get("GPTKIT_RESULTS"):
        write_json(Path(os.environ["GPTKIT_RESULTS"]) / f"{name}.json", record)
