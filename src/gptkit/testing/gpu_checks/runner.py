"""Runs each GPU check in a process of its own, under its own timeout, and gathers one JSON object.

A process per check keeps one check's GPU state (its allocations, its peak statistics, a process
group it started) from the next, and a check that hangs is killed with everything it started (its
process group: torchrun and its workers, a pool of estimates) when its time is up. The whole run
keeps within a time limit: a check gets the smaller of its own timeout and what is left, and one that
would start with too little left is skipped, saying so. The child process is this module:
``python -m gptkit.testing.gpu_checks.runner NAME RESULT SETTINGS``.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gptkit.testing.gpu_checks.common import Settings, skipped, stop
from gptkit.testing.gpu_checks.requirements import skipped_for

PACKAGE = "gptkit.testing.gpu_checks"
MIN_SECONDS = 20  # a check is not started with less time than this left


@dataclass(frozen=True)
class Check:
    """A check: its function (``module:function`` of this package, taking the Settings), the
    packages it needs beyond torch, the private torch pieces it reads (a group of
    :data:`~.requirements.CHECK_FEATURES`), whether it means anything only on CUDA, and its timeout
    in seconds on a GPU and on the stand-in."""

    function: str
    needs: tuple[str, ...] = ()
    features: str | None = None
    cuda_only: str | None = None  # why, when it is
    min_nproc: int = 1
    timeout_s: float = 120
    stand_in_timeout_s: float = 120


# In the order they run (the order of what a first GPU run should learn first).
CHECKS = {
    "estimate": Check("memory:check_estimate", features="estimate", timeout_s=200, stand_in_timeout_s=200),
    "estimate_fsdp_offload": Check(
        "memory:check_estimate_fsdp_offload", features="estimate", min_nproc=2, timeout_s=240
    ),
    "selective_checkpointing": Check("training:check_selective_checkpointing", timeout_s=60),
    "precision_training": Check("training:check_precision_training", timeout_s=120, stand_in_timeout_s=200),
    "fsdp_resume": Check(
        "fsdp:check_fsdp_resume",
        needs=("tokenizers", "tiktoken", "safetensors"),
        timeout_s=200,
        stand_in_timeout_s=240,
    ),
    "decoding": Check("decoding:check_decoding", timeout_s=120),
    "sync_debug": Check(
        "training:check_sync_debug", features="sync_debug", cuda_only="CUDA's sync debug mode", timeout_s=60
    ),
}


def _tail(path: Path, lines: int = 12) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def run_in_child(name: str, settings: Settings, timeout: float) -> dict[str, Any]:
    """``name`` in a new process (and process group) of its own: its result, or why it has none."""
    result, log = settings.work / f"{name}.result.json", settings.work / f"{name}.log"
    state = json.dumps({**dataclasses.asdict(settings), "work": str(settings.work)})
    with open(log, "wb") as out:
        child = subprocess.Popen(
            [sys.executable, "-m", f"{PACKAGE}.runner", name, str(result), state],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: killed whole on a timeout
        )
        try:
            child.wait(timeout)
        except subprocess.TimeoutExpired:
            stop(child, group=True)
            return {"passed": False, "error": f"timed out after {timeout:.0f} s", "log_tail": _tail(log)}
    if not result.exists():
        return {
            "passed": False,
            "error": f"the check's process exited {child.returncode}",
            "log_tail": _tail(log),
        }
    return json.loads(result.read_text())


def run_checks(names: list[str], settings: Settings, time_limit: float) -> dict[str, dict[str, Any]]:
    """Each of ``names`` in turn (skipped by name where it cannot run here) within ``time_limit``."""
    started, results = time.monotonic(), {}
    for name in names:
        check = CHECKS[name]
        reason = skipped_for(check.features or "", check.needs, settings.missing)
        if check.cuda_only and settings.stand_in:
            reason = f"{check.cuda_only} needs a CUDA device"
        if settings.nproc < check.min_nproc:
            reason = f"needs --nproc {check.min_nproc} or more (this run has {settings.nproc})"
        left = time_limit - (time.monotonic() - started)
        if reason is None and left < MIN_SECONDS:
            reason = f"out of time: {left:.0f} s of the run's {time_limit:.0f} s left"
        if reason is not None:
            results[name] = skipped(reason)
            print(f"== {name}: skipped ({reason})", file=sys.stderr, flush=True)
            continue
        timeout = min(check.stand_in_timeout_s if settings.stand_in else check.timeout_s, left)
        print(f"== {name} (at most {timeout:.0f} s)", file=sys.stderr, flush=True)
        begun = time.monotonic()
        results[name] = run_in_child(name, settings, timeout)
        results[name].setdefault("seconds", round(time.monotonic() - begun, 1))
        verdict = {True: "passed", False: "FAILED", None: "no verdict"}[results[name].get("passed")]
        print(f"   {verdict} in {results[name]['seconds']} s", file=sys.stderr, flush=True)
    return results


def child(name: str, result: Path, state: str) -> None:
    """The check ``name`` in this process; its result (or its error) written to ``result``."""
    values = json.loads(state)
    settings = Settings(**{**values, "work": Path(values["work"])})
    module, function = CHECKS[name].function.split(":")
    started = time.monotonic()
    try:
        outcome = getattr(importlib.import_module(f"{PACKAGE}.{module}"), function)(settings)
    except Exception as e:  # the check failed; the parent reports it and goes on
        traceback.print_exc()
        outcome = {"passed": False, "error": f"{type(e).__name__}: {e}"[:2000]}
    outcome["seconds"] = round(time.monotonic() - started, 1)
    result.write_text(json.dumps(outcome))


if __name__ == "__main__":
    child(sys.argv[1], Path(sys.argv[2]), sys.argv[3])
