"""Correctness checks that only a CUDA machine can make, and a few rows to read, in minutes.

The test suite runs on CPUs, where some of CUDA's rules cannot apply; this script checks the real
thing the first time a GPU is at hand, from a copy of the repository alone (it makes its own corpus
and trains its own tokenizer; nothing is downloaded):

  estimate                 `gptkit estimate`'s device peak against torch.cuda.max_memory_allocated,
                           GPT-2 small and medium, with and without activation checkpointing
  estimate_fsdp_offload    the same under FSDP2 with and without CPU offload (--nproc 2 or more)
  selective_checkpointing  selective checkpointing's gradients against none, with dropout
  precision_training       bf16 and fp16 training: the loss falls; a forced fp16 overflow is skipped
  fsdp_resume              FSDP2 with CPU offload and meta initialisation, its sharded (DCP)
                           checkpoint resumed on 2 CPU processes (gloo): the same losses
  decoding                 greedy decoding and the server's engine, tokens/s, beside transformers'
  sync_debug               host synchronisations per training update (CUDA's sync debug mode)

Each check runs in a process of its own under its own timeout, the whole within --time-limit
seconds. The last line printed is one JSON object: each check's "passed" (true, false, or null
with "skipped" saying why, or a "target" of none for the rows to read) and what it measured, the
device, torch's version and the seconds taken. A torch without a feature the checks need is refused
in one line naming it; a missing optional package skips the checks that need it, by name.
Exit status: 1 when a check failed, 2 when nothing could run (no CUDA device, a torch too old).

    PYTHONPATH=src python scripts/gpu_checks.py [--only NAME ...] [--nproc N] [--device cpu]

--device cpu is a stand-in: every check a CPU can run, on small shapes, over gloo (the JSON says
"stand_in": true); it shows that the script works, not that CUDA does.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import torch


def parse_args(argv: list[str] | None, checks: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--only", nargs="+", choices=checks, help="Run these checks alone.")
    parser.add_argument(
        "--device", choices=("cuda", "cpu"), default="cuda", help="cuda, or cpu: the stand-in."
    )
    parser.add_argument(
        "--nproc", type=int, default=1, help="Processes (GPUs) for the multi-process checks (default 1)."
    )
    parser.add_argument(
        "--batch-size", type=int, default=8,
        help="Global batch of the multi-process run, rounded up to split over its processes (default 8).",
    )  # fmt: skip
    parser.add_argument(
        "--time-limit", type=float, default=480, help="Seconds for the whole run (default 480)."
    )
    args = parser.parse_args(argv)
    if args.nproc < 1 or args.batch_size < 1:
        parser.error("--nproc and --batch-size must be at least 1")
    return args


def refusal(args: argparse.Namespace, requirements) -> str | None:
    """Why nothing can run here, in one line; None when the checks can."""
    refused = requirements.refusal()
    if refused is not None:
        return refused
    if args.device == "cuda" and not torch.cuda.is_available():
        return f"gpu_checks: no CUDA device (torch {torch.__version__}, built for CUDA {torch.version.cuda})"
    if args.device == "cuda" and args.nproc > torch.cuda.device_count():
        return f"gpu_checks: --nproc {args.nproc} but {torch.cuda.device_count()} CUDA device(s) here"
    return None


def device_name(device: str) -> str:
    if device == "cuda":
        return torch.cuda.get_device_name(0)
    from gptkit.hardware import machine_summary

    return machine_summary()


def main(argv: list[str] | None = None) -> int:
    started = time.monotonic()
    try:  # gptkit itself needs numpy and tqdm besides torch
        from gptkit.testing.gpu_checks import requirements
        from gptkit.testing.gpu_checks.common import Settings
        from gptkit.testing.gpu_checks.runner import CHECKS, run_checks
    except ImportError as e:
        print(f"gpu_checks: gptkit does not import here ({e}); run with PYTHONPATH=src", file=sys.stderr)
        return 2
    args = parse_args(argv, list(CHECKS))
    refused = refusal(args, requirements)
    if refused is not None:
        print(refused, file=sys.stderr)
        return 2
    missing = requirements.missing_packages()
    for name, error in missing.items():
        print(f"gpu_checks: {name} is missing ({requirements.PACKAGES[name]}): {error}", file=sys.stderr)
    # The checks' processes (and torchrun's) import gptkit from where this one did, whatever their
    # working directory: PYTHONPATH=src made absolute.
    source = str(Path(requirements.__file__).resolve().parents[3])
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [source, os.environ.get("PYTHONPATH")]))
    work = Path(tempfile.mkdtemp(prefix="gptkit-gpu-checks-"))
    settings = Settings(args.device, args.nproc, args.batch_size, work, missing)
    try:
        # The time limit counts from the start: the imports and looks above took some of it.
        results = run_checks(
            args.only or list(CHECKS), settings, args.time_limit - (time.monotonic() - started)
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    summary = {
        "gpu_checks": results,
        "device": device_name(args.device),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "python": sys.version.split()[0],
        "stand_in": settings.stand_in,
        "nproc": args.nproc,
        "missing_packages": sorted(missing),
        "seconds": round(time.monotonic() - started, 1),
    }
    print(json.dumps(summary), flush=True)
    return 1 if any(r.get("passed") is False for r in results.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
