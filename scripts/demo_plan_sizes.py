"""Measure the demo's run sizes on held-out training examples: the figures of DEMO_TASKS' RunSizes.

For one task and each size (training examples × epochs), seed pairs exactly as `gptkit demo` runs
them (gptkit.demo.compare: the same fine-tuning settings, the two sides of a seed paired in all but
the transformer's weights, the same scoring), trained on the training split's first examples and
scored on its last ``DemoTask.held_out`` (which no size trains on), never on the split the demo
reports. One JSON line a size on stdout: the per-seed differences (pre-trained − from scratch),
each side's mean, the seed-aware standard error and threshold
(gptkit.data.metrics.seed_paired_difference, as the demo computes them) and the three figures the
power plan reads: effect (the mean difference), seed_sd (the per-seed differences' standard
deviation) and shared_se (the examples' share of the error, which more seeds do not shrink:
√E of gptkit.data.metrics.seed_standard_error). The runs' progress goes to stderr.

  python scripts/demo_plan_sizes.py runs/demo/pretrain --data ../shared/data \\
      --task sst2 --sizes 256x8,512x6 --seeds 4
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from gptkit.data.metrics import seed_standard_error
from gptkit.data.registry import read_dataset
from gptkit.demo.compare import FIRST_SEED, SIDES, PairPlan, Sides, compare_task
from gptkit.demo.plan import RunSize
from gptkit.demo.tasks import DEMO_TASKS


def parse_size(text: str) -> RunSize:
    """``EXAMPLESxEPOCHS`` (``256x8``) as a RunSize with no figures yet."""
    try:
        examples, epochs = (int(part) for part in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"a size is EXAMPLESxEPOCHS (256x8), got {text!r}") from None
    if examples < 1 or epochs < 1:
        raise argparse.ArgumentTypeError(f"a size's examples and epochs are 1 or more, got {text!r}")
    return RunSize(examples=examples, epochs=epochs, effect=0.0, seed_sd=0.0, shared_se=0.0)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("pretrain", type=Path, help="The pre-trained side's run folder (a demo's pretrain/).")
    parser.add_argument("--data", type=Path, required=True, help="The shared data directory.")
    parser.add_argument("--task", choices=sorted(DEMO_TASKS), required=True, help="The demo task.")
    parser.add_argument(
        "--sizes",
        required=True,
        type=lambda text: [parse_size(size) for size in text.split(",")],
        help="Comma-separated EXAMPLESxEPOCHS sizes (256x8,512x6).",
    )
    parser.add_argument("--seeds", type=int, default=4, help="Seed pairs a size, 2 or more (default: 4).")
    parser.add_argument("--device", default="auto", help="Training device, as the demo's (default: auto).")
    parser.add_argument(
        "--out", type=Path, default=None, help="Folder for the runs (default: a new temporary folder)."
    )
    args = parser.parse_args(argv)
    if args.seeds < 2:
        parser.error(f"--seeds: 2 or more (one pair gives no spread across seeds), got {args.seeds}")
    return args


def size_figures(result: dict, runs: Path, seconds: float) -> dict:
    """One size's line: ``result`` (compare_task's) and the figures, from the per-example outcomes
    its runs kept in ``runs``."""
    outcomes = {
        side: np.array(
            [
                json.loads((runs / f"seed-{seed['seed']}" / side / "report_correct.json").read_text())[
                    "correct"
                ]
                for seed in result["per_seed"]
            ],
            dtype=np.float64,
        )
        for side in SIDES
    }
    per_example = outcomes["pretrained"] - outcomes["from_scratch"]  # (seeds, examples)
    seeds, examples = per_example.shape
    differences = per_example.mean(1)
    example_se = per_example.std(1, ddof=1) / math.sqrt(examples)  # s_i
    pooled_se = per_example.mean(0).std(ddof=1) / math.sqrt(examples)  # P
    _, stderr, threshold = seed_standard_error(differences, example_se, pooled_se, examples)
    # The same error as the demo's (seed_paired_difference): the outcomes read back are the ones scored.
    assert math.isclose(float(stderr), result["stderr"], rel_tol=1e-9, abs_tol=1e-12), (stderr, result)
    shared = max(0.0, (seeds * pooled_se**2 - float(np.mean(example_se**2))) / (seeds - 1))
    effect, seed_sd, shared_se = float(differences.mean()), float(differences.std(ddof=1)), math.sqrt(shared)
    return {
        "held_out": examples,
        "seeds": seeds,
        "updates": result["per_seed"][0]["updates"],
        "per_seed_difference": [round(float(d), 5) for d in differences],
        "pretrained": round(result["pretrained"], 5),
        "from_scratch": round(result["from_scratch"], 5),
        "stderr": round(float(stderr), 6),
        "threshold": round(float(threshold), 3),
        "clears_threshold": result["clears_threshold"],
        "effect": round(effect, 6),
        "seed_sd": round(seed_sd, 6),
        "shared_se": round(shared_se, 6),
        "pooled_se": round(float(pooled_se), 6),  # P, and the mean s_i, from which shared_se follows
        # The root mean square of the seeds' s_i: what seed_standard_error's floor divides by √N.
        "example_se": round(float(np.sqrt(np.mean(example_se**2))), 6),
        "seconds_per_pair": round(seconds / seeds, 1),
        "run_size": f"RunSize(examples={result['train_examples']}, epochs={result['epochs']}, "
        f"effect={effect:.3f}, seed_sd={seed_sd:.3f}, shared_se={shared_se:.4f}, "
        f"example_se={float(np.sqrt(np.mean(example_se**2))):.4f})",
    }


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    task = DEMO_TASKS[args.task]
    train = read_dataset(task.dataset, "train", args.data)
    held_out = train[-task.held_out :]
    for size in args.sizes:
        if size.examples + task.held_out > len(train):
            sys.exit(
                f"--sizes: {size.examples} training examples and the {task.held_out} held out exceed "
                f"{args.task}'s {len(train)} training examples; at most {len(train) - task.held_out}"
            )
    out = args.out or Path(tempfile.mkdtemp(prefix="demo_plan_sizes-"))
    print(
        f"runs under {out}; scored on {args.task}'s last {task.held_out} training examples", file=sys.stderr
    )
    sides = Sides(str(args.pretrain), "auto", args.device)  # precision as the demo chooses it
    for size in args.sizes:
        name = f"{size.examples}x{size.epochs}"
        plan = PairPlan(size, args.seeds, end=math.inf)  # every seed, whatever the time
        print(
            f"{args.task} {name}: {args.seeds} seed pairs from seed {FIRST_SEED}", file=sys.stderr, flush=True
        )
        started = time.perf_counter()
        with contextlib.redirect_stdout(sys.stderr):  # the runs' and the pairs' progress lines
            result = compare_task(args.task, task, args.data, out / name, sides, plan, held_out=held_out)
        result |= {"train_examples": size.examples, "epochs": size.epochs}
        figures = size_figures(result, out / name / args.task, time.perf_counter() - started)
        print(json.dumps({"task": args.task, "size": name, **figures}), flush=True)


if __name__ == "__main__":
    main()
