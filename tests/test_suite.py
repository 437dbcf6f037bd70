"""`gptkit suite` and Figure 2: the paper's numbers, the baselines by hand, scores recomputed by the
independent evaluation path, resuming, and the reports; on a tiny model and slices of real data."""

from __future__ import annotations

import dataclasses
import json
from collections import Counter
from pathlib import Path

import pytest
import torch

from gptkit import GPT, GPTConfig
from gptkit.data.registry import DATASETS, read_dataset
from gptkit.evaluate.finetuned import correct_per_example, evaluate_model
from gptkit.evaluate.zeroshot import zeroshot
from gptkit.generation import load_for_generation
from gptkit.paper import reports as reports_module
from gptkit.paper import suite as suite_module
from gptkit.paper.figures import TransferConfig, ZeroshotCurveConfig, transfer_curve, zeroshot_curve
from gptkit.paper.scores import TABLE5, TABLE5_AVERAGE, TABLE5_TASKS, TASKS
from gptkit.paper.suite import SuiteConfig, run_suite
from gptkit.tokenizer import Tokenizer, train_bpe
from gptkit.train.finetune.tasks import FinetuneConfig, LoRAConfig, paper_finetuning
from gptkit.train.run import ModelShape, build_model

TRAIN = dataclasses.replace(paper_finetuning(), batch_size=8, lr=1e-3, progress=False)
SEED = f"seed-{TRAIN.seed}"  # the directory of a suite's first (with --seeds 1, only) seed


def test_the_papers_tables_agree_with_themselves():
    """Table 5's full-model row repeats Tables 2 and 4 (MNLI as the mean of m/mm), and each row's
    printed average is the mean of its eight scores: a typo in either table would show here."""
    for task in TABLE5_TASKS:
        scores = [e.paper for e in TASKS[task].evaluations]
        assert TABLE5["full"][task] == pytest.approx(sum(scores) / len(scores), abs=0.051)
    for variant, scores in TABLE5.items():
        assert sum(scores.values()) / len(scores) == pytest.approx(TABLE5_AVERAGE[variant], abs=0.051)
    assert len(TASKS) == 12
    for task in TASKS.values():
        assert task.train in DATASETS and "train" in DATASETS[task.train].files
        for evaluation in task.evaluations:
            assert evaluation.split in DATASETS[evaluation.dataset].files


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory, data_dir) -> Path:
    """A tiny 'pre-trained' model with its own small byte-level tokenizer."""
    directory = tmp_path_factory.mktemp("init")
    corpus = directory / "corpus.txt"
    lines = [e.fields["text"] for e in read_dataset("sst2", "train", data_dir)[:400]]
    corpus.write_text("\n".join(lines), encoding="utf-8")
    tokenizer = train_bpe([corpus], vocab_size=300, out_dir=directory, style="bytelevel", show_progress=False)
    torch.manual_seed(0)
    vocab = tokenizer.vocab_size + tokenizer.n_special
    GPT(GPTConfig(vocab_size=vocab, context_length=64, n_layer=2, n_head=2, d_model=32)).save_pretrained(
        directory
    )
    return directory


def _finetune(pretrained: Path, data_dir: Path, **overrides) -> FinetuneConfig:
    """The template a test's suite or curve fine-tunes every task from: a small CPU slice."""
    values = dict(
        model=ModelShape(init=str(pretrained)),
        data_dir=str(data_dir),
        max_train_examples=24,
        max_eval_examples=16,
        epochs=1,
        device="cpu",
        training=TRAIN,
    )
    return FinetuneConfig(**{**values, **overrides})


def _config(
    pretrained: Path, data_dir: Path, out: Path, suite: dict | None = None, **overrides
) -> SuiteConfig:
    """A suite of ``suite``'s settings (tasks, variants, seeds) fine-tuning from the template."""
    return SuiteConfig(finetune=_finetune(pretrained, data_dir, **overrides), out=str(out), **(suite or {}))


def test_suite_scores_baselines_reports_and_resumes(pretrained, data_dir, tmp_path, monkeypatch):
    out = tmp_path / "suite"
    config = _config(pretrained, data_dir, out, {"tasks": ["rte", "story_cloze", "stsb"]})
    results = run_suite(config)["full"]

    # RTE: our score is what the separate evaluation path computes for the kept model; the
    # baseline is the training slice's majority label, scored by hand on the same dev rows.
    rte = results["rte"]
    assert rte["status"] == "done" and rte["train_examples"] == 24
    dev = read_dataset("rte", "dev", data_dir)[:16]
    again = evaluate_model(out / "full" / "rte" / SEED, dev, device="cpu")
    (evaluation,) = rte["evaluations"]
    assert evaluation["examples"] == 16 and evaluation["paper"] == 56.0
    assert evaluation["score"] == round(100 * again["accuracy"], 1)
    majority = Counter(e.label for e in read_dataset("rte", "train", data_dir)[:24]).most_common(1)[0][0]
    assert evaluation["baseline"] == round(100 * sum(e.label == majority for e in dev) / 16, 1)
    # Story Cloze is scored on its test set; the baseline picks the most frequent right ending.
    (cloze,) = results["story_cloze"]["evaluations"]
    assert cloze["split"] == "test"
    first = Counter(e.label for e in read_dataset("story_cloze", "train", data_dir)[:24]).most_common(1)[0][0]
    test = read_dataset("story_cloze", "test", data_dir)[:16]
    assert cloze["baseline"] == round(100 * sum(e.label == first for e in test) / 16, 1)
    # STS-B reports Pearson; a constant prediction correlates with nothing.
    (sts,) = results["stsb"]["evaluations"]
    assert sts["baseline"] == 0.0 and -100 <= sts["score"] <= 100 and sts["metrics"]["spearman"] is not None

    report = (out / "results.md").read_text()
    assert "| Table 2 | RTE | accuracy | dev | 16 |" in report and "| 56.0 |" in report
    assert "| Table 4 | STS-B | pearson | test | 16 |" in report
    assert json.loads((out / "results.json").read_text())["results"]["full"]["rte"] == rte

    # A finished task is never run again ...
    def fail(*args, **kwargs):
        raise AssertionError("a finished task was run again")

    monkeypatch.setattr(suite_module, "finetune", fail)
    assert run_suite(config)["full"]["rte"] == rte
    monkeypatch.undo()
    # ... and one killed after its checkpoint continues from it (here: nothing left to train).
    (out / "full" / "rte" / SEED / "result.json").unlink()
    calls = []
    real = suite_module.finetune
    monkeypatch.setattr(suite_module, "finetune", lambda c: calls.append(c.resume) or real(c))
    assert run_suite(config)["full"]["rte"]["evaluations"] == rte["evaluations"]
    assert calls == [True]
    # Other settings in the same directory would mix results: refused, naming the field.
    with pytest.raises(ValueError, match=r"suite.epochs: 1 → 2"):
        run_suite(_config(pretrained, data_dir, out, {"tasks": ["rte"]}, epochs=2))
    # Every torchrun rank would rewrite the same task directories.
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ValueError, match="without torchrun"):
        run_suite(config)


def test_ablations_and_missing_data(pretrained, data_dir, tmp_path, monkeypatch):
    monkeypatch.setattr(reports_module, "FEW_EXAMPLES", 10)  # 24 training rows count as a real task here
    data = tmp_path / "data"
    data.mkdir()
    (data / "rte").symlink_to(data_dir / "rte")  # MRPC is not there
    out = tmp_path / "suite"
    # Through LoRA adapters (--lora-rank), which the no_pretraining variant leaves aside: it trains
    # a random model's every weight.
    config = _config(
        pretrained,
        data,
        out,
        {"tasks": ["rte", "mrpc"], "variants": ["full", "no_aux_lm", "no_pretraining"]},
        lora=LoRAConfig(rank=2),
    )
    results = run_suite(config)
    assert results["full"]["mrpc"]["status"] == "missing data"
    assert "gptkit data fetch mrpc" in results["full"]["mrpc"]["advice"]
    runs = {
        v: json.loads((out / v / "rte" / SEED / "run_config.json").read_text())["finetune"] for v in results
    }
    assert [runs[v]["lm_coef"] for v in ("full", "no_aux_lm", "no_pretraining")] == [0.5, 0.0, 0.5]
    assert [runs[v]["random_init"] for v in ("full", "no_aux_lm", "no_pretraining")] == [False, False, True]
    assert [runs[v]["lora_rank"] for v in ("full", "no_aux_lm", "no_pretraining")] == [2, 2, None]
    assert (out / "full" / "rte" / SEED / "adapter_model.safetensors").exists()
    assert not (out / "full" / "rte" / SEED / "model.safetensors").exists()
    assert (out / "no_pretraining" / "rte" / SEED / "model.safetensors").exists()
    report = (out / "results.md").read_text()
    assert "## Table 5: ablations" in report and "| no_pretraining |" in report
    assert "gptkit data fetch mrpc" in report

    # Each ablation against full, example by example: recomputed from each kept model's answers
    # on the same dev rows through the separate evaluation path, the error by the paired formula.
    comparisons = json.loads((out / "results.json").read_text())["comparisons"]
    dev = read_dataset("rte", "dev", data_dir)[:16]
    full = correct_per_example(out / "full" / "rte" / SEED, dev, device="cpu")
    for variant in ("no_aux_lm", "no_pretraining"):
        other = correct_per_example(out / variant / "rte" / SEED, dev, device="cpu")
        differences = [x - y for x, y in zip(full, other)]
        mean = sum(differences) / 16
        stderr = (sum((d - mean) ** 2 for d in differences) / 15 / 16) ** 0.5
        (row,) = comparisons[variant]["rte"]
        assert row["examples"] == 16 and row["title"] == "RTE"
        assert row["difference"] == round(100 * mean, 2) and row["stderr"] == round(100 * stderr, 2)
        assert row["seeds"] == [TRAIN.seed] and not row["training_noise_counted"]
    assert "mrpc" not in comparisons["no_pretraining"]  # missing data: nothing to compare
    assert "## Each ablation against `full`, seed by seed and example by example" in report
    assert "| no_pretraining | RTE | accuracy | dev | 16 | 1 |" in report
    assert "‡ one seed: the error counts the examples only" in report


def test_seeds_each_run_apart_and_the_difference_counts_their_spread(
    pretrained, data_dir, tmp_path, monkeypatch
):
    """--seeds 2: a second seed added to a finished one-seed suite runs alone, in its own directory,
    with its own seed; each seed's score is read back from its own predictions, the score is their
    mean, and the difference's error is the seed-aware formula, recomputed here from the per-seed
    predictions."""
    monkeypatch.setattr(reports_module, "FEW_EXAMPLES", 10)
    out = tmp_path / "suite"
    config = _config(pretrained, data_dir, out, {"tasks": ["rte"], "variants": ["full", "no_pretraining"]})
    run_suite(config)
    calls = []
    real = suite_module.finetune
    monkeypatch.setattr(suite_module, "finetune", lambda c: calls.append(c.training.seed) or real(c))
    results = run_suite(dataclasses.replace(config, seeds=2))
    seeds = [TRAIN.seed, TRAIN.seed + 1]
    assert calls == [seeds[1], seeds[1]]  # the first seed of each variant had finished

    correct, targets = {}, None
    for variant in ("full", "no_pretraining"):
        result = results[variant]["rte"]
        assert result["seeds"] == seeds
        correct[variant] = []
        for seed in seeds:
            directory = out / variant / "rte" / f"seed-{seed}"
            assert json.loads((directory / "run_config.json").read_text())["train"]["seed"] == seed
            (kept,) = json.loads((directory / "predictions.json").read_text())
            targets = targets or kept["targets"]  # the first run's
            assert len(kept["targets"]) == 16 and kept["targets"] == targets  # every run's examples
            correct[variant].append([float(p == t) for p, t in zip(kept["predictions"], kept["targets"])])
        (evaluation,) = result["evaluations"]
        per_seed = [100 * sum(c) / 16 for c in correct[variant]]
        assert evaluation["scores"] == [round(score, 1) for score in per_seed]
        assert evaluation["score"] == pytest.approx(sum(per_seed) / 2, abs=0.051)
    # The seeds are different runs: their models differ (their scores may tie on 16 examples).
    weights = [
        (out / "no_pretraining" / "rte" / f"seed-{seed}" / "model.safetensors").read_bytes() for seed in seeds
    ]
    assert weights[0] != weights[1]

    # Per-example differences x_ij (seed i, example j); SE² = Var_i(d_i)/N + max(0, (N·P² −
    # mean_i s_i²)/(N − 1)), with d_i, s_i each seed's mean and error and P the error of the
    # seed-averaged differences.
    x = [[a - b for a, b in zip(correct["full"][i], correct["no_pretraining"][i])] for i in range(2)]
    d = [sum(row) / 16 for row in x]
    s2 = [sum((v - m) ** 2 for v in row) / 15 / 16 for row, m in zip(x, d)]
    averaged = [(x[0][j] + x[1][j]) / 2 for j in range(16)]
    p2 = sum((v - sum(averaged) / 16) ** 2 for v in averaged) / 15 / 16
    between = (d[0] - d[1]) ** 2 / 2 / 2  # sample variance of two values, over N = 2
    stderr = (between + max(0.0, 2 * p2 - sum(s2) / 2)) ** 0.5
    (row,) = json.loads((out / "results.json").read_text())["comparisons"]["no_pretraining"]["rte"]
    assert row["seeds"] == seeds and row["training_noise_counted"]
    assert row["per_seed"] == [round(100 * v, 2) for v in d]
    assert row["difference"] == round(100 * sum(d) / 2, 2) and row["stderr"] == round(100 * stderr, 2)
    assert row["claimed"] == (abs(sum(d) / 2) > row["threshold"] * stderr) and row["threshold"] >= 2
    report = (out / "results.md").read_text()
    assert "| no_pretraining | RTE | accuracy | dev | 16 | 2 |" in report and "‡ one seed" not in report


def test_random_init_keeps_the_shape_not_the_weights(pretrained):
    loaded = build_model(ModelShape(init=str(pretrained)), vocab_size=0)
    # Loading draws no random numbers: a seed other than the one the fixture's weights were drawn
    # with, or, run right after the fixture, the new weights would be the saved ones again.
    torch.manual_seed(1)
    fresh = build_model(ModelShape(init=str(pretrained), random_init=True), vocab_size=0)
    assert fresh.config == loaded.config
    assert not torch.equal(fresh.h[0].mlp.c_fc.weight, loaded.h[0].mlp.c_fc.weight)
    with pytest.raises(ValueError, match="random_init"):
        ModelShape(random_init=True)


def test_figure2_transfer_layers(pretrained, data_dir, tmp_path):
    config = TransferConfig(
        finetune=_finetune(pretrained, data_dir, max_train_examples=16),
        task="rte",
        layers=[0, 2],
        out=str(tmp_path / "layers"),
    )
    report = transfer_curve(config)
    assert [p["layers"] for p in report["points"]] == [0, 2] and report["n_layer"] == 2
    kept = [
        json.loads((tmp_path / "layers" / f"layers-{k:02d}" / SEED / "run_config.json").read_text())[
            "finetune"
        ]
        for k in (0, 2)
    ]
    assert [k["transfer_layers"] for k in kept] == [0, 2]
    # One seed: each point's error is its accuracy's over examples, sd of right/wrong / √n.
    (predictions,) = json.loads((tmp_path / "layers" / "layers-02" / SEED / "predictions.json").read_text())
    right = [float(p == t) for p, t in zip(predictions["predictions"], predictions["targets"])]
    accuracy = sum(right) / 16
    (point,) = report["points"][1]["evaluations"]
    assert point["score"] == round(100 * accuracy, 1)
    assert point["stderr"] == round(100 * (sum((r - accuracy) ** 2 for r in right) / 15 / 16) ** 0.5, 2)
    assert (tmp_path / "layers" / "layers.png").stat().st_size > 0
    table = (tmp_path / "layers" / "layers.md").read_text()
    assert f"| 2 | 1 | {point['score']:.1f} ± {point['stderr']:.1f} |" in table
    assert "one seed the error counts the examples only" in table
    with pytest.raises(ValueError, match=r"layers.epochs: 1 → 2"):  # the same --out, other settings
        transfer_curve(dataclasses.replace(config, finetune=dataclasses.replace(config.finetune, epochs=2)))
    with pytest.raises(ValueError, match=r"outside 0..2"):
        transfer_curve(
            TransferConfig(
                finetune=FinetuneConfig(model=ModelShape(init=str(pretrained)), training=TRAIN),
                task="rte",
                layers=[3],
                out=str(tmp_path / "x"),
            )
        )


def test_figure2_zeroshot_over_checkpoints(pretrained, data_dir, tmp_path, monkeypatch):
    run = tmp_path / "run"
    Tokenizer.from_pretrained(pretrained).save_pretrained(run)
    for step, seed in ((10, 1), (20, 2)):
        torch.manual_seed(seed)
        model = GPT.from_pretrained(pretrained)
        with torch.no_grad():
            for p in model.parameters():
                p.add_(0.01 * torch.randn_like(p))
        model.save_pretrained(run / "checkpoints" / f"step-{step:07d}")
        # What makes a training checkpoint complete (the weights alone are a copy cut short).
        torch.save({"step": step}, run / "checkpoints" / f"step-{step:07d}" / "train_state.pt")
    config = ZeroshotCurveConfig(
        run=str(run),
        heuristics=["sentiment", "question_answering"],
        data_dir=str(data_dir),
        out=str(tmp_path / "zs"),
        limit=8,
        device="cpu",
    )
    report = zeroshot_curve(config)
    assert [p["step"] for p in report["points"]] == [0, 10, 20]
    model, tokenizer = load_for_generation(
        run / "checkpoints" / "step-0000020", run, device="cpu", decoding=False
    )
    expected = zeroshot(model, tokenizer, "question_answering", data_dir, limit=8)
    assert report["points"][2]["scores"]["question_answering"]["score"] == expected["accuracy"]
    assert report["points"][2]["scores"]["question_answering"]["examples"] == 8
    assert (tmp_path / "zs" / "zeroshot.png").stat().st_size > 0
    # Rerun: every checkpoint is already scored.
    monkeypatch.setattr("gptkit.paper.figures.zeroshot", lambda *a, **k: pytest.fail("scored again"))
    assert zeroshot_curve(config)["points"] == report["points"]
    # Scores of another sample are not mixed into the same curve.
    with pytest.raises(ValueError, match=r"zeroshot.limit: 8 → 4"):
        zeroshot_curve(dataclasses.replace(config, limit=4))


def test_the_suite_holds_its_directory_while_each_task_holds_its_own(tmp_path, monkeypatch):
    """One suite at a time in a directory; the fine-tuning of each task locks the task's own
    directory inside it, which does not wait on the suite's lock (another file)."""
    import os

    from gptkit.io import DirectoryBusy
    from gptkit.train.rundir import RunDir

    out = tmp_path / "suite"
    ran = []

    def run_task(task, variant, template, out_dir):
        with pytest.raises(
            DirectoryBusy, match=rf"is being written by `gptkit suite` \(pid {os.getpid()} on "
        ):
            with RunDir(out).writer_lock("suite"):  # a second suite
                pass
        with RunDir(out_dir).writer_lock("finetune"):  # the task's own run: taken at once
            ran.append(out_dir)
        return {
            "task": task.name,
            "variant": variant,
            "status": "missing data",
            "missing": ["-"],
            "advice": "-",
        }

    monkeypatch.setattr(suite_module, "run_task", run_task)
    (tmp_path / "model").mkdir()  # the suite checks that its model is there before it starts
    template = FinetuneConfig(model=ModelShape(init=str(tmp_path / "model")), training=TRAIN)
    run_suite(SuiteConfig(finetune=template, out=str(out), tasks=["rte", "mrpc"]))
    assert ran == [out / "full" / "rte" / SEED, out / "full" / "mrpc" / SEED]
    assert (out / ".lock").read_text() == ""  # released: the next suite starts without a word


def test_settings_files_keep_the_layout_earlier_versions_wrote():
    """suite.json and the transfer curve's settings, for the defaults, as gptkit wrote them before
    the suite and the curve nested their fine-tuning settings (copied from a file that version
    wrote): a directory an earlier version started continues."""
    from gptkit.paper.figures import curve_settings
    from gptkit.paper.suite import _settings

    train = {
        "max_steps": None, "batch_size": 32, "micro_batch_size": None, "lr": 6.25e-05,
        "warmup_steps": None, "schedule": "linear", "optimizer": "adamw", "adamw_lr_scale": 1.0,
        "weight_decay": 0.01, "beta1": 0.9, "beta2": 0.999, "eps": 1e-08, "grad_clip": 1.0,
        "precision": "auto", "time_budget": None, "compile": False, "eval_every": None,
        "checkpoint_every": None, "seed": 1337, "on_nonfinite": "stop", "fsdp": False, "log_to": [],
        "group_by_length": True,
    }  # fmt: skip
    suite = {
        "init": "m", "data_dir": "data", "tokenizer": None, "max_train_examples": None,
        "max_eval_examples": None, "epochs": 3, "lm_coef": 0.5, "transfer_layers": None,
        "max_length": None, "lora_rank": None, "lora_alpha": None,
        "lora_targets": ["c_attn", "c_proj", "c_fc"],
    }  # fmt: skip
    template = FinetuneConfig(model=ModelShape(init="m"))
    assert json.loads(json.dumps(_settings(SuiteConfig(finetune=template)))) == {
        "suite": suite,
        "train": train,
        "layout": {"runs": "<variant>/<task>/seed-<seed>"},
    }
    layers = {
        "init": "m", "task": "mnli", "data_dir": "data", "tokenizer": None, "max_train_examples": None,
        "max_eval_examples": None, "epochs": 3,
    }  # fmt: skip
    assert json.loads(json.dumps(curve_settings(TransferConfig(finetune=template)))) == {
        "layers": layers,
        "train": train,
        "layout": {"runs": "layers-<k>/seed-<seed>"},
    }
