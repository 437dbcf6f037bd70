"""Shared by the benchmarks: where the data is, what machine this is, and the JSON they print."""

from __future__ import annotations

import json
import os
import platform
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DATA = Path(os.environ.get("GPTKIT_DATA", REPO.parent / "shared" / "data"))
sys.path.insert(0, str(REPO))  # the tests' reference implementations serve as peers


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    import torch

    return f"{cpu}, {os.cpu_count()} cores, torch {torch.__version__}, {torch.get_num_threads()} threads"


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


def emit(name: str, comparisons: list[dict], **extra) -> None:
    print(json.dumps({"benchmark": name, "machine": machine(), "comparisons": comparisons, **extra}))
