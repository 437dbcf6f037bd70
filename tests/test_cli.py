"""The `gptkit` commands end to end, as a user runs them: the quick demo, then tools on its outputs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def gptkit(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "gptkit", *map(str, args)],
        capture_output=True,
        text=True,
        input=stdin,
        cwd=REPO,
        timeout=600,
    )


@pytest.fixture(scope="module")
def demo(data_dir, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("demo") / "run"
    result = gptkit("demo", "--data", data_dir, "--out", out, "--quick")
    assert result.returncode == 0, result.stderr[-3000:]
    return out


def test_quick_demo_runs_every_stage(demo):
    summary = json.loads((demo / "summary.json").read_text())
    assert set(summary["sst2_dev_accuracy"]) == {"pretrained", "from_scratch", "majority_class"}
    assert summary["sst2_dev_accuracy"]["majority_class"] == pytest.approx(444 / 872)
    assert len(summary["samples"]) == 3 and all(summary["samples"].values())
    for name in (
        "tokenizer/encoder.json",
        "pretrain/model.safetensors",
        "pretrain/loss.png",
        "sst2-pretrained/task.json",
        "sst2-from_scratch/results.json",
    ):
        assert (demo / name).exists(), name


def test_generate_streams_and_reads_prompts_from_stdin(demo):
    result = gptkit(
        "generate", "--model", demo / "pretrain", "--prompt", "Alice", "--max-new-tokens", "5", "--seed", "1"
    )
    assert result.returncode == 0 and result.stdout.startswith("Alice")
    result = gptkit(
        "generate",
        "--model",
        demo / "pretrain",
        "--interactive",
        "--max-new-tokens",
        "3",
        "--greedy",
        stdin="one\ntwo\n",
    )
    lines = result.stdout.splitlines()
    assert result.returncode == 0 and lines[0].startswith("one") and lines[1].startswith("two")


def test_perplexity_zeroshot_and_tradeoff_commands(demo, data_dir, tmp_path):
    text = data_dir / "gutenberg" / "pg16.txt"
    result = gptkit("perplexity", "--model", demo / "pretrain", text)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["tokens"] > 1000 and report["perplexity"] > 1
    result = gptkit(
        "zeroshot",
        "--model",
        demo / "pretrain",
        "--task",
        "sentiment",
        "--data-dir",
        data_dir,
        "--limit",
        "20",
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["examples"] == 20
    result = gptkit(
        "zeroshot",
        "--model",
        demo / "pretrain",
        "--checkpoints",
        "--task",
        "multiple_choice",
        "--data-dir",
        data_dir,
        "--limit",
        "10",
    )
    assert result.returncode == 0, result.stderr
    assert [json.loads(line)["step"] for line in result.stdout.splitlines()] == [20]
    result = gptkit(
        "analyze",
        "tradeoff",
        "--model",
        demo / "pretrain",
        "--prompts",
        text,
        "--out",
        tmp_path,
        "--temperatures",
        "0.5,1.0",
        "--passages",
        "3",
        "--prompt-tokens",
        "8",
        "--new-tokens",
        "8",
    )
    assert result.returncode == 0, result.stderr
    assert "recommended: temperature" in result.stdout
    assert (tmp_path / "tradeoff.png").stat().st_size > 1000
    assert len(json.loads((tmp_path / "tradeoff.json").read_text())["settings"]) == 2


def test_evaluate_and_predict_commands(demo, data_dir, tmp_path):
    model = demo / "sst2-pretrained"
    result = gptkit("evaluate", "--model", model, "--dataset", "sst2", "--data-dir", data_dir)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["examples"] == 872
    data = tmp_path / "reviews.jsonl"
    data.write_text('{"review": "a gem"}\n{"review": "dull and long"}\n')
    out = tmp_path / "predictions.jsonl"
    result = gptkit("predict", "--model", model, "--data", data, "--columns", "text=review", "--out", out)
    assert result.returncode == 0, result.stderr
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 2 and all(r["label"] in ("0", "1") for r in rows)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"review": "fine"}\n{"other": 1}\n')
    result = gptkit("predict", "--model", model, "--data", bad, "--columns", "text=review", "--out", out)
    assert result.returncode == 2 and "bad.jsonl, line 2: missing column 'review'" in result.stderr


def test_convert_and_tokenize_commands(data_dir, tmp_path):
    transformers = pytest.importorskip("transformers")
    hf = transformers.GPT2LMHeadModel(
        transformers.GPT2Config(vocab_size=99, n_positions=16, n_embd=16, n_layer=1, n_head=2)
    )
    hf.save_pretrained(tmp_path / "hf")
    result = gptkit("convert", tmp_path / "hf", tmp_path / "out")
    assert result.returncode == 0 and "gpt2 format" in result.stdout
    result = gptkit("tokenize", "--tokenizer", data_dir / "gpt2_bpe", stdin="hello world")
    assert result.stdout.split() == ["31373", "995"]
    result = gptkit("tokenize", "--tokenizer", data_dir / "gpt2_bpe", "--decode", stdin="31373 995")
    assert result.stdout.strip() == "hello world"
    result = gptkit("convert", tmp_path / "nowhere", tmp_path / "x")
    assert result.returncode == 2 and "no such directory" in result.stderr


def test_data_fetch_from_a_mirror_verifies_checksums(data_dir, tmp_path):
    result = gptkit("data", "fetch", "sst2", "gpt2_bpe", "--out", tmp_path / "data", "--mirror", data_dir)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "data" / "sst2" / "stsa.binary.dev").read_bytes() == (
        data_dir / "sst2" / "stsa.binary.dev"
    ).read_bytes()
    assert (tmp_path / "data" / "gpt2_bpe" / "vocab.bpe").exists()
    corrupt = tmp_path / "mirror" / "gpt2_bpe"
    corrupt.mkdir(parents=True)
    (corrupt / "encoder.json").write_text("{}")
    result = gptkit("data", "fetch", "gpt2_bpe", "--out", tmp_path / "other", "--mirror", tmp_path / "mirror")
    assert result.returncode == 2 and "checksum mismatch" in result.stderr
    assert not (tmp_path / "other" / "gpt2_bpe" / "encoder.json").exists()
    result = gptkit("data", "fetch", "imagenet", "--out", tmp_path / "x")
    assert result.returncode == 2 and "unknown dataset" in result.stderr
