"""The demo's power plan reads nothing of the split it reports: its run sizes are measured on
held-out training examples, which no size trains on."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gptkit.data import registry
from gptkit.data.examples import Example
from gptkit.demo import DEMO_TASKS, compare, run, tasks
from gptkit.demo.plan import RunSize

# The sample data's training splits: 6,920 SST-2 sentences; 1,497 of the 2016 Story Cloze
# validation stories (GPT-1's split, the other 374 its dev set).
TRAIN_EXAMPLES = {"sst2": 6920, "story_cloze": 1497}
# The seconds a task has and the pace pre-training measured (seconds an update): from a loaded
# machine whose one pair does not fit, through the cheapest sizes' seeds, to a dozen of the largest.
SECONDS = (10.0, 30.0, 200.0, 900.0, 3600.0, float("inf"))
PACES = (0.01, 0.1, 0.5, 2.0, 100.0)


@pytest.fixture
def report_splits_unreadable(monkeypatch):
    """``read_dataset`` raises on any task's report split, wherever the demo imports it; other
    splits are read as ever."""
    reported = {(task.dataset, task.report_split) for task in DEMO_TASKS.values()}
    real = registry.read_dataset

    def guarded(name, split, data_dir):
        assert (name, split) not in reported, f"read the reported split {split!r} of {name!r}"
        return real(name, split, data_dir)

    for module in (run, compare, tasks, registry):
        monkeypatch.setattr(module, "read_dataset", guarded, raising=False)
    return guarded


def test_the_plan_never_reads_the_split_it_reports(report_splits_unreadable):
    with pytest.raises(AssertionError, match="reported split"):  # the guard holds
        registry.read_dataset("story_cloze", "test", "data")
    for name, task in DEMO_TASKS.items():
        for seconds in SECONDS:
            for pace in PACES:
                for seeds in (None, 2):
                    plan = run._power_plan(task, seconds, pace=pace, seeds=seeds)
                    assert plan.size in (*task.sizes, tasks.QUICK_SIZE), (name, seconds, pace)
                    assert 1 <= plan.seeds <= (seeds or run.MAX_SEEDS)
                published = run._published_plan(task, seconds, None)
                assert published.size in (None, tasks.QUICK_SIZE)


def _train_examples(request, dataset: str) -> int:
    """The training split's length: read where the data is, else the sample data's known count."""
    try:
        data = request.getfixturevalue("data_dir")
    except pytest.skip.Exception:
        return TRAIN_EXAMPLES[dataset]
    return len(registry.read_dataset(dataset, "train", data))


def test_every_size_trains_on_none_of_the_held_out_examples(request):
    for name, task in DEMO_TASKS.items():
        train = _train_examples(request, task.dataset)
        assert train == TRAIN_EXAMPLES[task.dataset]
        assert 0 < task.held_out < train
        for size in task.sizes:
            # A run trains on the first size.examples; the figures are scored on the last held_out.
            assert size.examples + task.held_out <= train, (name, size)
            assert size.examples % task.batch_size == 0, (name, size)  # no ragged batch left out
    assert (DEMO_TASKS["sst2"].held_out, DEMO_TASKS["story_cloze"].held_out) == (1000, 300)


def test_a_comparison_given_held_out_examples_scores_them_and_reads_no_report_split(
    monkeypatch, tmp_path, report_splits_unreadable
):
    held_out = [Example(fields={"text": f"sentence {i}"}, label=str(i % 2)) for i in range(6)]
    scored = []

    def fake_finetune(config):
        Path(config.out).mkdir(parents=True)
        (Path(config.out) / "run_config.json").write_text(json.dumps({"resolved": {"max_steps": 4}}))

    def fake_score(run_dir, examples, *args, **kwargs):
        scored.append(examples)
        return [1, 1, 0, 1, 0, 1] if "pretrained" in str(run_dir) else [1, 0, 0, 1, 0, 0]

    monkeypatch.setattr(compare, "finetune", fake_finetune)
    monkeypatch.setattr(compare, "score_examples", fake_score)
    size = RunSize(examples=64, epochs=2, effect=0.0, seed_sd=0.0, shared_se=0.0)
    pairs = compare.PairPlan(size, seeds=2, end=float("inf"))
    sides = compare.Sides("init", "auto", "cpu")
    task = DEMO_TASKS["sst2"]
    result = compare.compare_task("sst2", task, Path("data"), tmp_path, sides, pairs, held_out=held_out)
    assert scored == [held_out] * 4 and result["seeds"] == 2 and result["examples"] == 6
    assert result["difference"] == pytest.approx(2 / 6) and result["metric"] == "train[-6:] accuracy"
    kept = json.loads((tmp_path / "sst2" / "seed-1338" / "from_scratch" / "report_correct.json").read_text())
    assert kept == {"split": "train[-6:]", "correct": [1, 0, 0, 1, 0, 0]}
