"""gptkit.demo: its time plan, how it words a comparison, and what `make demo` leaves behind; and the
pre-training recipes it shares with `gptkit pretrain --recipe`."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import shutil
import subprocess
import sys
import time
import typing
from pathlib import Path

import numpy as np
import pytest

from gptkit import demo
from gptkit.cli import _build_configs, build_parser
from gptkit.data.examples import Example
from gptkit.demo import plan
from gptkit.train.config import TrainConfig
from gptkit.train.recipes import RECIPES, PretrainRecipe

REPO = Path(__file__).resolve().parents[1]


def test_a_recipe_takes_train_configs_types_and_builds_one_pretrain_config(tmp_path):
    recipe, train = typing.get_type_hints(PretrainRecipe), typing.get_type_hints(TrainConfig)
    assert (recipe["schedule"], recipe["optimizer"]) == (train["schedule"], train["optimizer"])
    with pytest.raises(ValueError, match=r"^PretrainRecipe.schedule \(--schedule\): must be one of"):
        dataclasses.replace(RECIPES["minutes"], schedule="wsdd")

    config = RECIPES["minutes"].configs(tmp_path / "shards", tmp_path / "out", "2m", max_steps=1000)
    assert (config.data, config.out) == (str(tmp_path / "shards"), str(tmp_path / "out"))
    assert (config.model.n_layer, config.model.d_model, config.model.dropout) == (2, 256, 0.0)
    training = config.training
    assert (training.schedule, training.optimizer, training.lr, training.batch_size) == (
        "wsd",
        "muon",
        6e-3,
        16,
    )
    assert (training.time_budget, training.max_steps, training.checkpoint_every) == ("2m", 1000, 1000)


def _pretrain_config(*argv: str):
    args = build_parser().parse_args(["pretrain", "--data", "shards", *argv])
    return _build_configs(args.command_spec, args)[0]


def test_pretrain_recipe_sets_what_the_demo_trains_and_a_config_file_and_flags_override_it(tmp_path):
    # The command with the recipe builds what the demo builds from it (the budget's flags given alike).
    flags = ["--time-budget", "2m", "--max-steps", "1000", "--checkpoint-every", "1000", "--log-every", "5"]
    by_flag = _pretrain_config("--recipe", "minutes", "--out", str(tmp_path / "out"), *flags)
    by_demo = RECIPES["minutes"].configs(Path("shards"), tmp_path / "out", "2m", max_steps=1000)
    assert dataclasses.asdict(by_flag) == dataclasses.asdict(by_demo)
    # A flag beats the recipe; a config file beats it too, and the flags beat the file.
    assert _pretrain_config("--recipe", "minutes", "--lr", "1e-3").training.lr == 1e-3
    file = tmp_path / "run.yaml"
    file.write_text("model:\n  n_layer: 3\ntraining:\n  batch_size: 8\n  lr: 0.002\n")
    config = _pretrain_config("--recipe", "minutes", "--config", str(file), "--lr", "1e-3")
    assert (config.model.n_layer, config.training.batch_size, config.training.lr) == (3, 8, 1e-3)
    assert (config.model.d_model, config.training.optimizer) == (256, "muon")  # the recipe's
    # Without a recipe: GPT-1's settings, the command's defaults.
    plain = _pretrain_config()
    assert (plain.model.preset, plain.training.optimizer, plain.training.lr) == ("gpt1", "adamw", 2.5e-4)


def _examples(labels: list[str]) -> list[Example]:
    return [Example(fields={"text": f"example {i}"}, label=label) for i, label in enumerate(labels)]


def test_a_model_that_gives_one_answer_everywhere_is_named_as_such():
    report = _examples(["1", "0", "1", "1"])
    assert demo.constant_answer([1, 0, 1, 1], report) == "1"  # right exactly where the label is 1
    assert demo.constant_answer([0, 1, 0, 0], report) == "0"
    assert demo.constant_answer([1, 1, 1, 1], report) is None  # right on both classes: it discriminates
    assert demo.constant_answer([1, 0, 0, 1], report) is None


def test_one_seed_a_side_prints_the_difference_with_no_error_and_says_why(capsys):
    report = _examples(["1", "0", "1", "0", "1"])
    runs = [{"seed": 1337, "updates": 9, "pretrained": [1, 1, 1, 0, 1], "from_scratch": [1, 0, 1, 0, 1]}]
    result = demo.compare_sides(demo.DEMO_TASKS["sst2"], report, runs)
    assert result["difference"] == pytest.approx(4 / 5 - 3 / 5)  # pre-trained − from scratch
    assert result["stderr"] is None and result["threshold"] is None and result["clears_threshold"] is None
    printed = capsys.readouterr().out
    assert "single draw cannot tell" in printed and "standard error" not in printed
    # The random side is right exactly on the 1s: it says '1' to everything.
    assert result["per_seed"][0]["one_answer"] == {"from_scratch": "1"}
    assert "from scratch answers '1' on every example (the majority class" in printed


def test_several_seeds_give_the_error_over_seeds_and_examples_and_the_threshold_they_set(capsys):
    rng = np.random.default_rng(0)
    n, labels = 200, [str(i % 2) for i in range(200)]
    runs = []
    for i, p in enumerate((0.8, 0.7, 0.75)):
        a, b = (rng.random(n) < p).astype(int), (rng.random(n) < 0.6).astype(int)
        runs.append({"seed": 1337 + i, "updates": 5, "pretrained": a.tolist(), "from_scratch": b.tolist()})
    result = demo.compare_sides(demo.DEMO_TASKS["sst2"], _examples(labels), runs)
    # By hand: SE² = Var(d_i)/N + max(0, (N·P² − mean s_i²)/(N − 1)), with x the per-example
    # differences, and never below the examples' noise of the seeds' average, mean s_i²/N (which
    # these seeds, drawn with no training noise at all, are near: their spread is low by chance).
    x = np.array([np.array(r["pretrained"]) - np.array(r["from_scratch"]) for r in runs], dtype=float)
    d, s = x.mean(1), x.std(1, ddof=1) / math.sqrt(n)
    pooled = x.mean(0).std(ddof=1) / math.sqrt(n)
    se = d.var(ddof=1) / 3 + max(0.0, (3 * pooled**2 - (s**2).mean()) / 2)
    se = math.sqrt(max(se, (s**2).mean() / 3))
    assert result["difference"] == pytest.approx(d.mean())
    assert result["stderr"] == pytest.approx(se)
    # Three seeds: between 2 (the examples' error alone) and t(0.975, 2 df) = 4.303 (the seeds' alone).
    assert 2.0 <= result["threshold"] <= 4.303
    assert result["clears_threshold"] == (abs(d.mean()) > result["threshold"] * se)
    assert [r["seed"] for r in result["per_seed"]] == [1337, 1338, 1339] and result["seeds"] == 3
    printed = capsys.readouterr().out
    assert (
        f"over 3 seeds and {n} examples" in printed
        and f"{result['threshold']:.1f} standard errors" in printed
    )


def test_the_time_plan_shares_what_set_up_left_and_keeps_sampling_and_a_margin(capsys):
    deadline = plan.Deadline(900.0, time.time() - 125.0)  # 125 s of set-up already spent
    recipe = plan.plan_time(deadline, "recipe", None, quick=False)
    margin, sampling = plan.MARGIN_SECONDS, plan.SAMPLING_SECONDS["recipe"]
    shared = 900 - 125 - sampling - margin
    assert recipe.pretrain_seconds == pytest.approx(plan.PRETRAIN_SHARE * shared, abs=1.0)
    assert recipe.finetune_end == pytest.approx(deadline.end - sampling - margin)
    assert recipe.seeds is None  # as many as the time holds
    assert plan.plan_time(deadline, "recipe", 3, quick=False).seeds == 3  # --seeds: at most 3
    # The demo ends in the last minute of its budget: sampling runs until the margin, which is less.
    assert 0 < margin < 60
    # Set-up and data that left too little to train stop the demo with one line, before training.
    with pytest.raises(ValueError, match=r"leaves \d+s to train after 2\d\ds of set-up and data"):
        plan.plan_time(plan.Deadline(300.0, time.time() - 200.0), "recipe", None, quick=False)
    # From published weights nothing is pre-trained: fine-tuning has all of it.
    published = plan.plan_time(deadline, "published", None, quick=False)
    assert published.pretrain_seconds == 0.0
    assert published.finetune_end == pytest.approx(deadline.end - plan.SAMPLING_SECONDS["published"] - margin)


def _size(effect: float, seed_sd: float, shared_se: float = 0.0, examples: int = 256) -> plan.RunSize:
    return plan.RunSize(examples=examples, epochs=1, effect=effect, seed_sd=seed_sd, shared_se=shared_se)


def test_the_expected_margin_is_the_effect_over_the_threshold_its_seeds_set_times_the_error():
    # Training noise alone: SE = sd/√N and the threshold is t(0.975, N − 1) (t tables: 2.776 at 4
    # degrees of freedom, 12.706 at 1).
    assert plan.expected_margin(_size(0.1, 0.05), 5, 872) == pytest.approx(
        0.1 / (2.776 * 0.05 / 5**0.5), rel=1e-3
    )
    assert plan.expected_margin(_size(0.1, 0.05), 2, 872) == pytest.approx(
        0.1 / (12.706 * 0.05 / 2**0.5), rel=1e-3
    )
    # Example noise alone (no spread across seeds): SE is the shared part, the threshold about 2.
    assert plan.expected_margin(_size(0.1, 0.0, 0.02), 3, 872) == pytest.approx(
        0.1 / (1.963 * 0.02), rel=2e-2
    )
    # Both: SE² adds them, and the threshold weighs each term's t by its share of SE².
    between, shared = 0.04**2 / 4, 0.01**2
    threshold = (between * 3.182 + shared * 1.963) / (between + shared)
    expected = 0.05 / (threshold * (between + shared) ** 0.5)
    assert plan.expected_margin(_size(0.05, 0.04, 0.01), 4, 872) == pytest.approx(expected, rel=2e-3)
    assert plan.expected_margin(_size(0.1, 0.05), 1, 872) == 0.0  # one seed: no claim at all


def test_the_plan_takes_the_size_whose_seeds_make_the_threshold_easiest_to_clear():
    small, large = _size(0.06, 0.03, examples=256), _size(0.10, 0.03, examples=2048)
    costs = {small: 20.0, large: 100.0}
    # 200 s: 10 small pairs (margin 0.06 / (2.262 · 0.03/√10) = 2.8) beat 2 large ones (0.4).
    assert plan.choose_size((small, large), 200.0, costs, 872) == (small, 10)
    # 1,200 s: 12 of either (the cap); the larger effect wins.
    assert plan.choose_size((small, large), 1200.0, costs, 872) == (large, 12)
    # --seeds 2: two pairs of either fit, and the larger effect wins.
    assert plan.choose_size((small, large), 1200.0, costs, 872, max_seeds=2) == (large, 2)
    # Time for less than two pairs of any size: the cheapest, once.
    assert plan.choose_size((small, large), 30.0, costs, 872) == (small, 1)


def test_another_seed_pair_starts_only_where_the_slowest_so_far_still_fits():
    assert plan.another_pair_fits(0.0, [], 0, 5)  # the first pair always runs
    assert plan.another_pair_fits(25.0, [10.0, 20.0], 2, 5)  # 1.25 × 20 = 25 fits
    assert not plan.another_pair_fits(24.9, [10.0, 20.0], 2, 5)
    assert not plan.another_pair_fits(1000.0, [10.0, 20.0], 2, 2)  # --seeds 2: two pairs at most


class _Clock:
    """A clock that moves only when the fake fine-tuning says so: the test does not depend on the
    machine's pace."""

    def __init__(self) -> None:
        self.now = 1000.0

    def time(self) -> float:
        return self.now

    perf_counter = time


def test_seed_pairs_stop_before_the_task_time_ends_when_the_machine_slows_down(monkeypatch, tmp_path):
    from gptkit.demo import compare

    clock = _Clock()
    side_seconds = iter([10, 10, 10, 10, 20, 20, 20, 20, 20, 20])  # the machine slows after two pairs
    report = _examples(["1", "0"] * 4)

    def fake_finetune(config):
        clock.now += next(side_seconds)
        Path(config.out).mkdir(parents=True)
        (Path(config.out) / "run_config.json").write_text(json.dumps({"resolved": {"max_steps": 6}}))

    monkeypatch.setattr(compare, "time", clock)
    monkeypatch.setattr(compare, "finetune", fake_finetune)
    monkeypatch.setattr(compare, "read_dataset", lambda *args: report)
    monkeypatch.setattr(compare, "score_examples", lambda run, examples, *a, **k: [1, 0] * 4)
    sides = compare.Sides("init", "auto", "cpu")
    pair_plan = compare.PairPlan(_size(0.1, 0.05), seeds=12, end=clock.now + 110.0)
    result = compare.compare_task("sst2", demo.DEMO_TASKS["sst2"], Path("data"), tmp_path, sides, pair_plan)
    # Pairs at 0 (20 s), 20 (20 s), 40 (40 s); at 80, 30 s are left < 1.25 × 40: no fourth pair.
    assert result["seeds"] == 3 and clock.now - 1000.0 == 80.0 <= 110.0
    assert [run["updates"] for run in result["per_seed"]] == [6, 6, 6]


def test_a_budget_that_set_up_used_up_stops_before_anything_is_written(tmp_path):
    out = tmp_path / "demo"
    config = demo.DemoConfig(data="data", out=str(out), time_budget="5m", budget_start=time.time() - 200)
    with pytest.raises(ValueError, match=r"leaves \d+ s after 20\d s of set-up; the demo needs 180 s"):
        demo.run_demo(config)
    assert not out.exists()
    with pytest.raises(ValueError, match=r"--seeds\): must be 1 or more"):
        demo.DemoConfig(data="data", seeds=0)


def _dry_run(*targets: str, runs: Path) -> str:
    # -n: print the commands without running them; -W: as if the venv were set up (no install lines)
    done = subprocess.run(
        ["make", "-n", "-W", "pyproject.toml", *targets, f"RUNS={runs}"],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_make_demo_and_make_paper_write_only_under_runs_and_keeping_is_its_own_step(tmp_path):
    for target in ("demo", "paper"):
        commands = _dry_run(target, runs=tmp_path)
        assert "render_results" not in commands and "results/" not in commands and "docs/" not in commands
    assert "scripts/render_results.py --keep demo" in _dry_run("keep-demo", runs=tmp_path)
    assert "scripts/render_results.py --keep paper" in _dry_run("keep-paper", runs=tmp_path)


@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")
def test_keeping_a_demo_run_changes_only_its_record_and_the_rendered_tables(tmp_path):
    """The keep step, run as `make keep-demo` runs it, in a copy of the project's results and docs."""
    copy = tmp_path / "project"
    for part in ("scripts", "benchmarks", "results", "docs"):
        shutil.copytree(REPO / part, copy / part)
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]
    for command in (["init", "-q"], ["add", "."], ["commit", "-qm", "as checked out"]):
        subprocess.run([*git, *command], cwd=copy, check=True, capture_output=True)
    report = _examples(["1", "0"] * 4)
    runs = [
        {"seed": 1337 + i, "updates": 7, "pretrained": [1, 1, 1, 0, 1, 1, 1, 0], "from_scratch": [1, 0] * 4}
        for i in range(2)
    ]
    task = demo.compare_sides(demo.DEMO_TASKS["sst2"], report, runs)
    summary = {
        "recipe": "minutes",
        "pretrain": {"steps": 321, "val_loss": 3.2},
        "tasks": {"sst2": task, "story_cloze": task},
        "samples": {"A": "b"},
        "sampling": {},
        "time_budget_s": 900.0,
        "seconds": 840.0,
    }
    run = tmp_path / "runs" / "demo"
    run.mkdir(parents=True)
    (run / "summary.json").write_text(json.dumps(summary))
    kept = subprocess.run(
        [sys.executable, "scripts/render_results.py", "--keep", "demo", str(run / "summary.json")],
        cwd=copy,
        capture_output=True,
        text=True,
    )
    assert kept.returncode == 0, kept.stderr
    status = subprocess.run(["git", "status", "--porcelain"], cwd=copy, capture_output=True, text=True).stdout
    assert sorted(status.splitlines()) == [" M docs/results.md", " M results/demo.json"]
    rendered = (copy / "docs" / "results.md").read_text(encoding="utf-8")
    assert "321 pre-training updates" in rendered and "14.0 minutes" in rendered


def test_the_sampling_sweep_stops_on_time_with_every_setting_on_the_same_passages():
    import torch

    from gptkit.config import GPTConfig
    from gptkit.evaluate.tradeoff import passages_from_text, sweep
    from gptkit.model import GPT

    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=50, n_layer=1, n_head=2, d_model=16, context_length=64))
    passages = passages_from_text(
        torch.randint(0, 50, (600,)).tolist(), prompt_tokens=8, new_tokens=6, count=4
    )
    settings = {"temperatures": (0.6, 1.0), "top_ps": (None, 0.9), "samples_per_prompt": 2}
    out_of_time = sweep(model, passages, **settings, seconds=0.0)
    assert out_of_time["passages"] == 1
    # What the first passage alone gives: each setting measured on it, its draws as if run alone.
    assert out_of_time == sweep(model, passages[:1], **settings)
    assert sweep(model, passages, **settings, seconds=3600.0) == sweep(model, passages, **settings)


def test_both_sides_of_a_seed_start_from_one_head_and_see_the_same_examples(data_dir, tmp_path):
    """A pre-trained and a random transformer fine-tuned with one seed start from the same W_y (drawn
    after the transformer, whatever building it drew) and take the same batches: what differs
    between the sides is the transformer's weights alone."""
    import torch

    from gptkit import GPT, GPTConfig
    from gptkit.model.task import TaskModel
    from gptkit.tokenizer import Tokenizer
    from gptkit.train.finetune.tasks import FinetuneConfig, finetune, paper_finetuning
    from gptkit.train.run import ModelShape

    tokenizer = Tokenizer.from_pretrained(data_dir / "gpt2_bpe")
    torch.manual_seed(0)
    config = GPTConfig.from_preset("tiny", vocab_size=len(tokenizer), dropout=0.0)
    GPT(config).save_pretrained(tmp_path / "pre")
    tokenizer.save_pretrained(tmp_path / "pre")
    heads = {}
    for side, random_init in (("pretrained", False), ("from_scratch", True)):
        run = tmp_path / side
        training = dataclasses.replace(paper_finetuning(), lr=1e-12, max_steps=2, batch_size=4, seed=7)
        finetune(
            FinetuneConfig(
                model=ModelShape(init=str(tmp_path / "pre"), random_init=random_init),
                dataset="sst2", data_dir=str(data_dir), out=str(run), max_train_examples=16,
                max_eval_examples=4, device="cpu", training=training,
            )
        )  # fmt: skip
        heads[side] = TaskModel.from_pretrained(run, device="cpu").head.weight.detach().float()
    assert not torch.equal(heads["pretrained"], torch.zeros_like(heads["pretrained"]))
    # A learning rate of 1e-12 leaves each head where it started.
    torch.testing.assert_close(heads["pretrained"], heads["from_scratch"], atol=1e-6, rtol=0)


# What the demo's set-up leaves out: every extra but the demo's, by the modules they install.
EXTRA_MODULES = {
    "transformers": "transformers", "peft": "peft", "lm-eval": "lm_eval", "pyarrow": "pyarrow",
    "zstandard": "zstandard", "onnx": "onnx", "onnxscript": "onnxscript", "onnxruntime": "onnxruntime",
    "gguf": "gguf", "llama-cpp-python": "llama_cpp", "fastapi": "fastapi", "uvicorn": "uvicorn",
    "openai": "openai", "tensorboard": "tensorboard", "wandb": "wandb", "uvloop": "uvloop",
    "httptools": "httptools", "accelerate": "accelerate", "rich": "rich",
}  # fmt: skip
BLOCK_IMPORTS = """
import importlib.machinery, runpy, sys
class Absent(importlib.machinery.PathFinder):  # finds nothing of the left-out extras, as if not installed
    @classmethod
    def find_spec(cls, name, path=None, target=None):
        if name.split(".")[0] in {blocked!r}:
            return None
        return super().find_spec(name, path, target)
sys.meta_path = [Absent if f is importlib.machinery.PathFinder else f for f in sys.meta_path]
sys.argv[0] = "gptkit"
runpy.run_module("gptkit", run_name="__main__", alter_sys=True)
"""


def _modules_outside_the_demos_extras() -> set[str]:
    import re

    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        tomllib = pytest.importorskip("tomli")
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    demo_extras = re.search(r"^DEMO_EXTRAS := (.+)$", (REPO / "Makefile").read_text(), re.M)[1].split(",")
    names = {
        re.split(r"[<>=\[ ]", requirement)[0]
        for extra, requirements in extras.items()
        if extra not in (*demo_extras, "dev")
        for requirement in requirements
        if not requirement.startswith("gptkit[")  # an extra made of others
    }
    assert names <= set(EXTRA_MODULES), f"map these to their modules: {names - set(EXTRA_MODULES)}"
    return {EXTRA_MODULES[name] for name in names}


@pytest.fixture(scope="module")
def quick_demo(data_dir, tmp_path_factory) -> Path:
    """`gptkit demo --quick --seeds 2`, with no module of the extras that the demo's set-up leaves
    out importable: what `make demo`'s set-up installs is what the demo runs on."""
    out = tmp_path_factory.mktemp("demo") / "run"
    script = BLOCK_IMPORTS.format(blocked=sorted(_modules_outside_the_demos_extras()))
    args = ["demo", "--data", str(data_dir), "--out", str(out), "--quick", "--seeds", "2"]
    done = subprocess.run(
        [sys.executable, "-c", script, *args], capture_output=True, text=True, cwd=REPO, timeout=1800
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return out


@pytest.mark.slow
def test_quick_demo_runs_every_stage_on_the_demos_extras_alone(quick_demo, data_dir):
    summary = json.loads((quick_demo / "summary.json").read_text())
    assert set(summary["sst2_dev_accuracy"]) == {"pretrained", "from_scratch", "majority_class"}
    assert summary["sst2_dev_accuracy"]["majority_class"] == pytest.approx(444 / 872)
    assert len(summary["samples"]) == 3 and all(summary["samples"].values())
    # Each task's comparison over its two seeds, recomputed from the per-example outcomes each run
    # kept; both sides of every seed trained for the quick size's fixed updates.
    sizes = {"sst2": ("dev", 872), "story_cloze": ("test", 1871)}
    assert set(summary["tasks"]) == set(sizes)
    quick_updates = 2 * (64 // 32)  # --quick: 64 examples, 2 epochs, batch 32
    for name, result in summary["tasks"].items():
        split, size = sizes[name]
        outcomes = {"pretrained": [], "from_scratch": []}
        for seed in (1337, 1338):
            for side in outcomes:
                run = quick_demo / name / f"seed-{seed}" / side
                kept = json.loads((run / "report_correct.json").read_text())
                assert kept["split"] == split and len(kept["correct"]) == size
                outcomes[side].append(np.array(kept["correct"], dtype=float))
                steps = json.loads((run / "run_config.json").read_text())["resolved"]["max_steps"]
                assert steps == result["per_seed"][seed - 1337]["updates"] == quick_updates
        for side, runs in outcomes.items():
            assert result[side] == pytest.approx(np.mean(runs))
        per_seed = [a.mean() - b.mean() for a, b in zip(outcomes["pretrained"], outcomes["from_scratch"])]
        assert result["difference"] == pytest.approx(np.mean(per_seed)) and result["seeds"] == 2
        # The error is 0 only where the sides agreed on every example of every seed (a tiny run's
        # two sides may both answer one class everywhere); the threshold is never below 2.
        agreed = all(np.array_equal(a, b) for a, b in zip(outcomes["pretrained"], outcomes["from_scratch"]))
        assert (result["stderr"] == 0) == agreed and result["stderr"] >= 0 and result["threshold"] >= 2.0
        assert result["metric"] == f"{split} accuracy" and 0.4 < result["majority_class"] < 0.6
        assert (result["train_examples"], result["epochs"]) == (64, 2)
    assert summary["tasks"]["sst2"]["pretrained"] == summary["sst2_dev_accuracy"]["pretrained"]
    # The tasks' unlabelled text joined pre-training: every training sentence and story opening,
    # and nothing of what is reported or of the labels (no dev sentence, no story ending).
    from gptkit.data.registry import read_dataset

    sst2 = (quick_demo / "task_text" / "sst2.txt").read_text(encoding="utf-8").splitlines()
    assert sst2 == [e.fields["text"] for e in read_dataset("sst2", "train", data_dir)]
    assert not set(sst2) & {e.fields["text"] for e in read_dataset("sst2", "dev", data_dir)}
    stories = (quick_demo / "task_text" / "story_cloze.txt").read_text(encoding="utf-8").splitlines()
    assert stories == [e.fields["context"] for e in read_dataset("story_cloze", "train", data_dir)]
    test_openings = {e.fields["context"] for e in read_dataset("story_cloze", "test", data_dir)}
    assert not set(stories) & test_openings
    for name in (
        "tokenizer/encoder.json",
        "pretrain/model.safetensors",
        "pretrain/loss.png",
        "sst2/seed-1337/pretrained/task.json",
        "sst2/seed-1338/from_scratch/results.json",
    ):
        assert (quick_demo / name).exists(), name


def test_from_published_weights_a_pair_leaves_room_for_a_second():
    """The first pair's shares of a task's time (train and score, both sides alike) leave a second
    pair room with the slack that another_pair_fits asks: two seeds, so the difference has an error."""
    from gptkit.demo import run

    pairs = run._published_plan(demo.DEMO_TASKS["sst2"], 100.0, None)
    assert pairs.size is None and (pairs.train_seconds, pairs.score_seconds) == pytest.approx((15.0, 5.0))
    first_pair = 2 * (pairs.train_seconds + pairs.score_seconds)
    assert plan.another_pair_fits(100.0 - first_pair, [first_pair], 1, pairs.seeds)


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_the_demos_set_up_installs_its_extras_alone_and_nothing_where_the_dev_set_up_is_there(tmp_path):
    for name in ("Makefile", "pyproject.toml", "constraints.txt"):
        shutil.copy(REPO / name, tmp_path / name)
    venv = tmp_path / "venv"

    def make(*args: str) -> str:
        # Without the variables of a make that runs this suite (`make test`), whose sub-make would
        # print its directories.
        env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS")}
        done = subprocess.run(
            ["make", f"VENV={venv}", *args], cwd=tmp_path, capture_output=True, text=True, timeout=60, env=env
        )
        assert done.returncode == 0, done.stderr
        return done.stdout

    # A fresh checkout: the demo installs the package with its extras, not dev's.
    planned = make("-n", f"{venv}/.installed-demo")
    assert '-e ".[gpt1,plot]"' in planned and ".[dev]" not in planned
    # The dev set-up marks both: after it, the demo's set-up installs nothing (no python to run here).
    assert '-e ".[dev]"' in make("-n", f"{venv}/.installed")
    venv.mkdir()
    (venv / ".installed").touch()
    make(f"{venv}/.installed-demo")
    assert (venv / ".installed-demo").exists()
    assert make("-q", f"{venv}/.installed-demo") == ""  # up to date now


def test_where_not_one_pair_fits_at_the_measured_pace_the_one_pair_is_bounded_by_the_clock(capsys):
    from gptkit.demo import run

    task = demo.DEMO_TASKS["sst2"]
    # A quick machine: pairs of the size choose_size picks, as many as fit, no clock on a run.
    planned = run._power_plan(task, 200.0, pace=0.01, seeds=None)
    costs = {size: demo.tasks.pair_seconds(task, size, 0.01) for size in task.sizes}
    assert planned.size == plan.choose_size(task.sizes, 200.0, costs, task.held_out)[0]
    assert planned.train_seconds is None and planned.score_seconds is None and planned.seeds == plan.MAX_SEEDS
    # A machine so loaded that one pair of the cheapest size would take longer than the time left:
    # one pair, whose training and scoring the clock bounds (both sides alike).
    loaded = run._power_plan(task, 30.0, pace=100.0, seeds=None)
    assert (
        loaded.size == min(task.sizes, key=lambda size: size.updates(task.batch_size)) and loaded.seeds == 1
    )
    assert (loaded.train_seconds, loaded.score_seconds) == pytest.approx((9.0, 3.0))
    assert "bounded by the clock" in capsys.readouterr().out


def test_the_summary_says_in_one_line_a_task_whether_the_papers_direction_is_established():
    from gptkit.demo.report import headline, seed_table

    runs = [
        {
            "seed": 1337,
            "updates": 64,
            "pretrained": 0.61,
            "from_scratch": 0.509,
            "one_answer": {"from_scratch": "1"},
        }
    ]
    task = {
        "seeds": 3,
        "examples": 872,
        "difference": 0.092,
        "stderr": 0.017,
        "threshold": 4.27,
        "per_seed": runs,
        "pretrained": 0.6,
        "from_scratch": 0.508,
        "majority_class": 0.509,
    }
    line = headline("sst2", task | {"clears_threshold": True})
    assert line.startswith("  sst2: pre-trained 0.600, from scratch 0.508, majority class 0.509;")
    # The threshold in standard errors and in accuracy: 4.27 × 0.017 = 0.073.
    assert "+0.092 ± 0.017 (threshold 4.3 s.e. = 0.073) over 3 seeds and 872 examples" in line
    assert line.endswith("established: pre-training helps here, as the paper found")
    assert "not established: within the noise" in headline("sst2", task | {"clears_threshold": False})
    other_way = task | {"difference": -0.092, "clears_threshold": True}
    assert "established the other way" in headline("sst2", other_way)
    one = headline("sst2", task | {"seeds": 1, "stderr": None, "threshold": None, "clears_threshold": None})
    assert "±" not in one and "one seed a side cannot tell" in one
    # Below: a row a seed, with its difference and the side that gave one answer everywhere.
    row = seed_table({"sst2": task})[1].split()
    assert row[:6] == ["sst2", "1337", "64", "0.610", "0.509", "+0.101"] and "scratch '1'" in " ".join(row)
