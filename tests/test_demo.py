"""gptkit.demo: its time plan, how it words a comparison, and what `make demo` leaves behind; and the
pre-training recipes it shares with `gptkit pretrain --recipe`."""

from __future__ import annotations

import dataclasses
import json
import math
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
    # By hand: SE² = Var(d_i)/N + max(0, (N·P² − mean s_i²)/(N − 1)), with x the per-example differences.
    x = np.array([np.array(r["pretrained"]) - np.array(r["from_scratch"]) for r in runs], dtype=float)
    d, s = x.mean(1), x.std(1, ddof=1) / math.sqrt(n)
    pooled = x.mean(0).std(ddof=1) / math.sqrt(n)
    se = math.sqrt(d.var(ddof=1) / 3 + max(0.0, (3 * pooled**2 - (s**2).mean()) / 2))
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
    config = demo.DemoConfig(data="data", time_budget="15m")
    deadline = demo.Deadline(900.0, time.time() - 125.0)  # 125 s of set-up already spent
    plan = demo._plan(config, deadline, "recipe")
    margin, sampling = demo.MARGIN_SHARE * 900, demo.SAMPLING_SECONDS["recipe"]
    shared = 900 - 125 - sampling - margin
    assert plan["pretrain_seconds"] == pytest.approx(demo.PRETRAIN_SHARE * shared, abs=1.0)
    assert plan["finetune_end"] == pytest.approx(deadline.end - sampling - margin)
    assert plan["seeds"] == 2
    # A budget too short for two seeds to train 20 s each runs one; --seeds is taken as given.
    assert demo._plan(config, demo.Deadline(300.0, time.time()), "recipe")["seeds"] == 1
    asked = dataclasses.replace(config, seeds=3)
    assert demo._plan(asked, demo.Deadline(300.0, time.time()), "recipe")["seeds"] == 3
    # Set-up and data that left too little to train stop the demo with one line, before training.
    with pytest.raises(ValueError, match=r"leaves \d+s to train after 2\d\ds of set-up and data"):
        demo._plan(config, demo.Deadline(300.0, time.time() - 200.0), "recipe")
    # From published weights nothing is pre-trained: fine-tuning has all of it.
    published = demo._plan(config, deadline, "published")
    assert published["pretrain_seconds"] == 0.0
    assert published["finetune_end"] == pytest.approx(
        deadline.end - demo.SAMPLING_SECONDS["published"] - margin
    )


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
    from gptkit.train.finetune import FinetuneConfig, finetune, paper_finetuning
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
