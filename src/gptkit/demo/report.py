"""How the demo words its finding: one line a task (the difference, its seed-aware error and
threshold, and whether the paper's direction is established here), then a table per seed."""

from __future__ import annotations

SIDE_NAMES = {"pretrained": "pre-trained", "from_scratch": "from scratch"}


def verdict(result: dict) -> str:
    """Whether pre-training's advantage is established by ``result`` (a task's comparison)."""
    if result["seeds"] == 1:
        return "not established: one seed a side cannot tell a difference from training noise"
    if not result["clears_threshold"]:
        return "not established: within the noise of this many seeds"
    if result["difference"] > 0:
        return "established: pre-training helps here, as the paper found"
    return "established the other way: from scratch is better here"


def accuracies(result: dict) -> str:
    """Where both sides stand on their own, beside the score of always answering the commonest class
    (the difference alone hides that both may sit near chance)."""
    return (
        f"pre-trained {result['pretrained']:.3f}, from scratch {result['from_scratch']:.3f}, "
        f"majority class {result['majority_class']:.3f}"
    )


def headline(name: str, result: dict) -> str:
    """A task's finding in one line: the sides' scores (means over seeds), then their difference."""
    difference = f"{result['difference']:+.3f}"
    if result["seeds"] > 1:
        difference += (
            f" ± {result['stderr']:.3f} (threshold {result['threshold']:.1f} s.e. = "
            f"{result['threshold'] * result['stderr']:.3f})"
        )
    return (
        f"  {name}: {accuracies(result)}; pre-trained − from scratch {difference} over {result['seeds']} "
        f"seed{'s' if result['seeds'] > 1 else ''} and {result['examples']} examples: {verdict(result)}"
    )


def difference_sentence(result: dict) -> str:
    """A task's difference as a reader should take it: with several seeds, its error and whether it
    clears the threshold its seeds set; with one, that a single draw cannot tell it from noise."""
    difference, examples = result["difference"], result["examples"]
    if result["seeds"] == 1:
        return (
            f"{difference:+.3f} on {examples} examples, one fine-tuning a side: a single draw cannot tell "
            "this difference from training noise (another seed can move it as much); --seeds 2 or more "
            "measures that noise"
        )
    per_seed = ", ".join(f"{run['pretrained'] - run['from_scratch']:+.3f}" for run in result["per_seed"])
    verdict_words = "clears it" if result["clears_threshold"] else "does not: not told apart from the noise"
    return (
        f"{difference:+.3f} ± {result['stderr']:.3f} over {result['seeds']} seeds and {examples} examples "
        f"(per seed {per_seed}); with {result['seeds']} seeds a difference must clear "
        f"{result['threshold']:.1f} standard errors, and this one {verdict_words}"
    )


def seed_table(tasks: dict[str, dict]) -> list[str]:
    """Every seed pair of every task, a row each: the sides' scores and their difference; a side that
    answered one class everywhere is marked."""
    lines = [
        f"  {'task':<12} {'seed':>5} {'updates':>8} {'pre-trained':>12} {'from scratch':>13} {'difference':>11}"
    ]
    for name, result in tasks.items():
        for run in result["per_seed"]:
            answered = ", ".join(
                f"{SIDE_NAMES[side]} {answer!r}" for side, answer in run.get("one_answer", {}).items()
            )
            mark = f"  one answer everywhere: {answered}" if answered else ""
            lines.append(
                f"  {name:<12} {run['seed']:>5} {run['updates']:>8} {run['pretrained']:>12.3f} "
                f"{run['from_scratch']:>13.3f} {run['pretrained'] - run['from_scratch']:>+11.3f}{mark}"
            )
    return lines


def print_summary(tasks: dict[str, dict], seconds: float, budget: float | None, path: str) -> None:
    """The closing lines: the time, each task's finding, then the table per seed."""
    of_budget = "" if budget is None else f" of a {budget:.0f}s budget"
    print(f"\ndone in {seconds:.0f}s{of_budget}; summary: {path}")
    for name, result in tasks.items():
        print(headline(name, result))
    print()
    print("\n".join(seed_table(tasks)), flush=True)
