"""The `gptkit` commands end to end, as a user runs them: the tools on tiny models saved in this
process (the quick demo is tests/test_demo.py's)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

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
def models(data_dir, tmp_path_factory) -> dict[str, Path]:
    """What the tools read, saved in seconds rather than trained by a demo: a tiny language model
    (GPT-2's tokenizer, random weights) in a run directory with one complete checkpoint, at step
    20, and a tiny SST-2 classifier beside it."""
    from gptkit import GPT, GPTConfig
    from gptkit.data.tasks import TaskSpec, special_token_ids
    from gptkit.model.task import TaskModel
    from gptkit.tokenizer import Tokenizer
    from gptkit.train.rundir import TRAIN_STATE, RunDir

    root = tmp_path_factory.mktemp("models")
    tokenizer = Tokenizer.from_pretrained(data_dir / "gpt2_bpe")
    torch.manual_seed(0)
    config = GPTConfig.from_preset("tiny", vocab_size=len(tokenizer), dropout=0.0)
    run = RunDir(root / "pretrain")
    GPT(config).save_pretrained(run.root)
    tokenizer.save_pretrained(run.root)
    checkpoint = run.checkpoint(20)
    GPT(config).save_pretrained(checkpoint)
    torch.save({}, checkpoint / TRAIN_STATE)  # its presence is what makes a checkpoint complete
    specials = special_token_ids(tokenizer)
    spec = TaskSpec("classification", labels=["0", "1"], max_length=64, specials=specials)
    task_gpt = GPT(GPTConfig.from_preset("tiny", vocab_size=len(tokenizer), n_special=3, dropout=0.0))
    TaskModel(task_gpt, spec, clf_dropout=0.0, tokenizer=tokenizer).save_pretrained(root / "sst2")
    return {"lm": run.root, "sst2": root / "sst2"}


@pytest.mark.slow
def test_generate_prints_the_models_continuation_and_reads_prompts_from_stdin(models):
    from gptkit.generation import generate, load_for_generation

    # The command's text is the model's seeded sample, decoded from the ids generate() returns.
    args = ("--model", models["lm"], "--max-tokens", "8", "--seed", "1", "--dtype", "float32")
    result = gptkit("generate", *args, "--prompt", "Alice was")
    assert result.returncode == 0, result.stderr
    model, tokenizer = load_for_generation(models["lm"], dtype="float32")
    ids = tokenizer.encode("Alice was")
    sample = generate(model, torch.tensor([ids]), 8, temperature=1.0, seed=1)[0, len(ids) :].tolist()
    assert tokenizer.decode(sample).strip(), "the sample has visible text"
    for decode, flags in ((tokenizer.decode_text, ()), (tokenizer.decode, ("--raw",))):
        full, prompt = decode(ids + sample), decode(ids)
        assert full.startswith(prompt)
        out = result if not flags else gptkit("generate", *args, "--prompt", "Alice was", *flags)
        assert out.stdout == "Alice was" + full[len(prompt) :] + "\n"
    assert "dtype: float32, as asked" in result.stderr
    result = gptkit(
        "generate",
        "--model",
        models["lm"],
        "--interactive",
        "--max-new-tokens",
        "3",
        "--greedy",
        stdin="one\ntwo\n",
    )
    lines = result.stdout.splitlines()
    assert result.returncode == 0 and lines[0].startswith("one") and lines[1].startswith("two")
    assert "--greedy is deprecated: use --temperature 0" in result.stderr
    assert "--max-new-tokens is deprecated: use --max-tokens" in result.stderr  # the old spelling still works


def test_generation_session_draws_every_sample_from_one_seeded_generator(models):
    from gptkit.generation import SamplingParams, generate, load_for_generation
    from gptkit.generation.text import GenerateConfig, generation_session

    params = SamplingParams(max_tokens=6, temperature=1.0, seed=5)
    config = GenerateConfig(model=str(models["lm"]), prompt="Alice was", sampling=params, dtype="float32")
    config.num_samples, config.raw = 3, True
    printed = "".join(generation_session(config)).split("\n")[:-1]
    # By hand: three draws, one after the other, from a single generator seeded with 5.
    model, tokenizer = load_for_generation(models["lm"], dtype="float32")
    ids = tokenizer.encode("Alice was")
    generator = torch.Generator().manual_seed(5)
    samples = [
        generate(model, torch.tensor([ids]), params=params, generator=generator)[0, len(ids) :].tolist()
        for _ in range(3)
    ]
    prompt = tokenizer.decode(ids)  # raw token text; the continuation is what follows the prompt's
    assert printed == ["Alice was" + tokenizer.decode(ids + sample)[len(prompt) :] for sample in samples]
    assert len(set(printed)) == 3, "the session's samples differ from one another"
    assert "".join(generation_session(config)).split("\n")[:-1] == printed  # the same seed, the same session


@pytest.fixture(scope="module")
def book(data_dir, tmp_path_factory) -> Path:
    """A book's first 30,000 characters: many windows, seconds."""
    text = tmp_path_factory.mktemp("book") / "peter_pan.txt"
    text.write_text(
        (data_dir / "gutenberg" / "pg16.txt").read_text(encoding="utf-8")[:30_000], encoding="utf-8"
    )
    return text


@pytest.fixture(scope="module")
def fp32_lm(models) -> tuple:
    """The tiny language model and its tokenizer as the commands load it, in fp32: the hand computations'."""
    from gptkit.generation import load_for_generation

    return load_for_generation(models["lm"], dtype="float32", decoding=False)


def _logprob(model, prefix: list[int], word: list[int]) -> float:
    """log P(word | prefix) under the model, by hand: one forward pass, the word's tokens' log-softmax."""
    ids = torch.tensor([prefix + word])
    with torch.no_grad():
        logp = model(ids).logits.float().log_softmax(-1)[0]
    return sum(float(logp[len(prefix) - 1 + i, t]) for i, t in enumerate(word))


@pytest.mark.slow
def test_perplexity_command_agrees_with_the_library_and_int8_with_fp32(models, book, fp32_lm):
    result = gptkit("perplexity", "--model", models["lm"], book, "--dtype", "float32")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    # The same number from the library, on the same ids, with windows scored by hand.
    from gptkit.evaluate.lm import perplexity

    model, tokenizer = fp32_lm
    ids = tokenizer.encode(book.read_text(encoding="utf-8"))
    assert report["tokens"] == len(ids) - 1
    assert report["perplexity"] == pytest.approx(perplexity(model, ids)["perplexity"], rel=1e-3)
    window = torch.tensor([ids[:64]])
    with torch.no_grad():  # the first window (the whole context) scores its tokens as the model's loss
        first_window_loss = float(model(window, labels=window).loss)
    assert perplexity(model, ids[:64])["nll"] == pytest.approx(first_window_loss, rel=1e-5)
    # Weight-only int8: the same text scores within 1% of fp32's perplexity.
    quantized = gptkit("perplexity", "--model", models["lm"], book, "--quantize", "int8")
    assert quantized.returncode == 0, quantized.stderr
    assert json.loads(quantized.stdout)["perplexity"] == pytest.approx(report["perplexity"], rel=0.01)


@pytest.mark.slow
def test_zeroshot_command_scores_sentiment_as_the_heuristic_by_hand(models, data_dir, fp32_lm):
    result = gptkit(
        "zeroshot",
        "--model",
        models["lm"],
        "--task",
        "sentiment",
        "--data-dir",
        data_dir,
        "--limit",
        "20",
        "--dtype",
        "float32",  # the hand computation below is fp32; a CPU with fast bf16 would pick bf16
    )
    assert result.returncode == 0, result.stderr
    # The heuristic by hand (§5): after "<sentence> very", is "positive" likelier than "negative"?
    from gptkit.data.registry import read_dataset

    model, tokenizer = fp32_lm
    examples = read_dataset("sst2", "dev", data_dir)[:20]
    right = near_ties = 0
    for e in examples:
        prefix = tokenizer.encode(e.fields["text"] + " very")
        margin = _logprob(model, prefix, tokenizer.encode("positive")) - _logprob(
            model, prefix, tokenizer.encode("negative")
        )
        right += (margin > 0) == (e.label == "1")
        # The tiny model barely tells the words apart: a margin within float rounding of batched
        # scoring may fall either way, so it may move the count by one.
        near_ties += abs(margin) < 1e-4
    report = json.loads(result.stdout)
    assert report["examples"] == 20
    assert abs(report["accuracy"] * 20 - right) <= near_ties + 1e-6


@pytest.mark.slow
def test_zeroshot_command_over_the_checkpoints_scores_each_complete_one(models, data_dir):
    result = gptkit(
        "zeroshot",
        "--model",
        models["lm"],
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


@pytest.mark.slow
def test_analyze_tradeoff_command_recommends_the_temperature_nearest_the_reference(
    models, book, fp32_lm, tmp_path
):
    result = gptkit(
        "analyze",
        "tradeoff",
        "--model",
        models["lm"],
        "--prompts",
        book,
        "--out",
        tmp_path,
        "--temperatures",
        "0.5,1.0",
        "--passages",
        "3",
        "--prompt-tokens",
        "8",
        "--max-tokens",
        "8",
        "--dtype",
        "float32",  # its reference NLL is checked against the fp32 hand computation
    )
    assert result.returncode == 0, result.stderr
    tradeoff = json.loads((tmp_path / "tradeoff.json").read_text())
    assert [s["temperature"] for s in tradeoff["settings"]] == [0.5, 1.0]
    # The fidelity reference by hand: the true continuations' mean NLL per token under the model.
    from gptkit.evaluate.tradeoff import passages_from_text

    model, tokenizer = fp32_lm
    passages = passages_from_text(tokenizer.encode(book.read_text(encoding="utf-8")), 8, 8, 3)
    nll = -sum(_logprob(model, prompt, truth) for prompt, truth in passages) / (3 * 8)
    assert tradeoff["reference_nll"] == pytest.approx(nll, rel=1e-3)
    recommended = min(tradeoff["settings"], key=lambda s: abs(s["sample_nll"] - nll))
    assert f"recommended: temperature {recommended['temperature']}" in result.stdout
    for setting in tradeoff["settings"]:  # shares, and a distinct-2 never below distinct-1's floor
        assert 0 < setting["distinct_1"] <= 1 and 0 < setting["distinct_2"] <= 1
    assert (tmp_path / "tradeoff.png").exists()


@pytest.mark.slow
def test_evaluate_and_predict_commands(models, data_dir, tmp_path):
    model = models["sst2"]
    result = gptkit("evaluate", "--model", model, "--dataset", "sst2", "--data-dir", data_dir)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    # The same score by another path: the task model's predict() (label names from its logits)
    # against the labels in the file; and one sentence at a time (no padding) as in batches.
    from gptkit.data.registry import read_dataset
    from gptkit.model.task import TaskModel

    task_model = TaskModel.from_pretrained(model, device="cpu").eval()
    examples = read_dataset("sst2", "dev", data_dir)
    predicted = [p["label"] for p in task_model.predict(examples, batch_size=64)]
    right = sum(label == e.label for label, e in zip(predicted, examples))
    assert report["examples"] == 872 and report["accuracy"] == pytest.approx(right / 872)
    one_by_one = [p["label"] for p in task_model.predict(examples[:40], batch_size=1)]
    assert one_by_one == predicted[:40]
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


@pytest.mark.slow
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
    assert result.returncode == 2 and "no such folder" in result.stderr


@pytest.mark.slow
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


def _every_command(parser, prefix=()):
    """(words, parser) for every command and sub-command."""
    import argparse

    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _every_command(sub, (*prefix, name))
    if prefix:
        yield prefix, parser


def test_every_help_page_works_and_documents_every_flag(capsys):
    from gptkit.cli import build_parser, main

    commands = list(_every_command(build_parser()))
    assert {" ".join(words) for words, _ in commands} >= {
        "convert", "tokenizer", "tokenizer train", "tokenize", "prepare", "pretrain", "finetune",
        "evaluate", "predict", "generate", "perplexity", "zeroshot", "analyze", "analyze tradeoff",
        "data", "data fetch", "demo",
    }  # fmt: skip
    for words, parser in commands:
        with pytest.raises(SystemExit) as exit_:
            main([*words, "--help"])
        assert exit_.value.code == 0, words
        page = capsys.readouterr().out
        assert page.startswith(f"usage: gptkit {' '.join(words)}"), words
        for action in parser._actions:
            if action.option_strings and action.dest != "help":
                assert action.help and action.help.strip(), f"{' '.join(words)} {action.option_strings}"
    # Fine-tuning's page shows fine-tuning's defaults (the paper's §4.1), not pre-training's.
    with pytest.raises(SystemExit):
        main(["finetune", "--help"])
    page = " ".join(capsys.readouterr().out.split())
    assert "Maximum learning rate. (default: 6.25e-05)" in page
    assert "per update. (default: 32)" in page and "(default: linear)" in page
    assert "(default: epochs × updates per epoch)" in page and "(default: 0.2% of training)" in page
    with pytest.raises(SystemExit):
        main(["pretrain", "--help"])
    page = " ".join(capsys.readouterr().out.split())
    assert "Maximum learning rate. (default: 0.00025)" in page and "(default: cosine)" in page
    assert "--precision {auto,fp32,bf16,fp16,float32,bfloat16,float16}" in page and "--time-budget" in page


@pytest.mark.slow
def test_bad_config_values_are_one_line_errors(tmp_path):
    result = gptkit("pretrain", "--data", tmp_path, "--checkpoint-every", "0")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == (
        "gptkit pretrain: error: TrainConfig.checkpoint_every (--checkpoint-every): must be a positive "
        "number of updates, got 0"
    )
    result = gptkit("finetune", "--dataset", "sst2", "--epochs", "0")
    assert result.returncode == 2 and "FinetuneConfig.epochs (--epochs): must be positive" in result.stderr


@pytest.mark.slow
def test_prepare_command_writes_the_shards_prepare_writes(data_dir, tmp_path):
    from gptkit.data.prepare import prepare

    book = data_dir / "gutenberg" / "pg11.txt"
    result = gptkit(
        "prepare", "--tokenizer", data_dir / "gpt2_bpe", "--out", tmp_path / "cli", book, "--workers", "2"
    )
    assert result.returncode == 0, result.stderr
    prepare(data_dir / "gpt2_bpe", [book], tmp_path / "lib", show_progress=False, workers=1)
    for name in ("train.bin", "val.bin"):
        assert (tmp_path / "cli" / name).read_bytes() == (tmp_path / "lib" / name).read_bytes()
    assert (
        f"{json.loads((tmp_path / 'lib' / 'meta.json').read_text())['counts']['train']:,} training"
        in result.stdout
    )


def test_a_warning_is_one_line_naming_the_command_without_pythons_source_line(data_dir, tmp_path):
    empty, text = tmp_path / "empty.txt", tmp_path / "text.txt"
    empty.write_text("")
    text.write_text("A few words of text.\n" * 50)
    result = gptkit(
        "prepare",
        "--tokenizer",
        data_dir / "gpt2_bpe",
        "--out",
        tmp_path / "out",
        empty,
        text,
        "--workers",
        "1",
    )
    assert result.returncode == 0, result.stderr
    assert f"gptkit prepare: warning: {empty}: empty file, nothing to tokenize\n" in result.stderr
    assert "warnings.warn" not in result.stderr and "UserWarning" not in result.stderr, result.stderr


def test_flags_come_from_the_library_configs_nested_and_deprecated(capsys):
    from gptkit.cli import _build_configs, build_parser
    from gptkit.serve.config import ServeConfig, ServeLimits

    parser = build_parser()
    args = parser.parse_args(
        ["serve", "--model", "lm=a", "--max-batch", "3", "--batch-wait-ms", "7", "--port", "9"]
    )
    (config,) = _build_configs(args.command_spec, args)
    # The limits' flags fill the ServeLimits inside ServeConfig; the rest keep ServeLimits' own defaults.
    assert config == ServeConfig(model=["lm=a"], port=9, limits=ServeLimits(max_batch=3, batch_wait_ms=7.0))
    assert config.limits.max_queue == ServeLimits().max_queue == 64


def test_generate_flags_fill_the_sampling_params_inside_its_config(capsys):
    """GenerateConfig holds a SamplingParams whose defaults (its own, the only ones: 16 tokens at
    temperature 1) are the flags' defaults; repeated --stop makes a tuple; the old spellings still
    set the same fields."""
    from gptkit.cli import _build_configs, build_parser
    from gptkit.generation import SamplingParams

    parser = build_parser()

    def sampling(*flags: str) -> SamplingParams:
        args = parser.parse_args(["generate", "--model", "m", *flags])
        (config,) = _build_configs(args.command_spec, args)
        return config.sampling

    assert sampling() == SamplingParams(max_tokens=16, temperature=1.0)
    assert sampling("--stop", "a", "--stop", "b", "--top-k", "3", "--seed", "4") == SamplingParams(
        max_tokens=16, stop=("a", "b"), top_k=3, seed=4
    )
    assert capsys.readouterr().err == ""
    assert sampling("--max-new-tokens", "7", "--greedy") == SamplingParams(max_tokens=7, temperature=0.0)
    assert capsys.readouterr().err == (
        "--max-new-tokens is deprecated: use --max-tokens\n--greedy is deprecated: use --temperature 0\n"
    )
    with pytest.raises(SystemExit):
        parser.parse_args(["generate", "--help"])
    page = " ".join(capsys.readouterr().out.split())
    assert "Tokens to generate per sample. (default: 16)" in page and "--logprobs" not in page
    assert "--max-new-tokens" not in page and "Deprecated spelling of --temperature 0." in page


def test_a_bad_sampling_value_is_a_one_line_error_before_the_model_loads(tmp_path, capsys):
    from gptkit.cli import main

    # No model at all: the value is refused first.
    assert main(["generate", "--model", str(tmp_path / "none"), "--top-p", "1.5"]) == 2
    assert capsys.readouterr().err == "gptkit generate: error: top_p must be in (0, 1], got 1.5\n"


def _configs(*argv: str) -> list:
    from gptkit.cli import _build_configs, build_parser

    args = build_parser().parse_args(list(argv))
    return _build_configs(args.command_spec, args)


def test_each_training_command_keeps_its_own_defaults_in_its_nested_configs():
    """One TrainConfig class, two sets of defaults: `gptkit pretrain`'s are GPT-1's pre-training
    (TrainConfig's own), `gptkit finetune`'s (and the suite's, and the transfer curve's) the paper's
    fine-tuning settings (§4.1), written here from the paper, not from the code."""
    from gptkit.train.config import TrainConfig
    from gptkit.train.finetune.tasks import FinetuneConfig, LoRAConfig, resolved_training
    from gptkit.train.pretrain import PretrainConfig
    from gptkit.train.run import ModelShape

    (pretrain,) = _configs("pretrain", "--data", "shards")
    train = pretrain.training
    assert pretrain == PretrainConfig(data="shards") and train == TrainConfig()
    assert (train.lr, train.batch_size, train.max_steps, train.schedule) == (2.5e-4, 64, 100_000, "cosine")
    assert train.warmup_for(100_000) == 2000

    (finetune,) = _configs("finetune", "--dataset", "sst2")
    assert finetune == FinetuneConfig(dataset="sst2")  # the flags' defaults are the library's
    paper = finetune.training
    assert (paper.lr, paper.batch_size, paper.schedule, finetune.epochs, finetune.lm_coef) == (
        6.25e-5, 32, "linear", 3, 0.5,
    )  # fmt: skip
    assert (paper.max_steps, paper.warmup_steps, paper.eval_every, paper.checkpoint_every) == (None,) * 4
    assert (paper.weight_decay, paper.grad_clip, finetune.clf_dropout, paper.seed) == (0.01, 1.0, 0.1, 1337)
    assert finetune.model == ModelShape() and finetune.lora == LoRAConfig() and finetune.group_by_length
    # Unset step counts follow the epochs: 3 epochs of 1,000 updates, warm-up over 0.2% of them.
    resolved = resolved_training(paper, epochs=3, steps_per_epoch=1000)
    assert (resolved.max_steps, resolved.warmup_steps, resolved.eval_every) == (3000, 6, 1000)
    assert resolved_training(paper, epochs=1, steps_per_epoch=10).warmup_steps == 1  # at least one

    (suite,) = _configs("suite", "--init", "gpt2")
    assert suite.finetune == FinetuneConfig(model=ModelShape(init="gpt2"))
    (curve,) = _configs("figure2", "layers", "--init", "gpt2", "--lr", "1e-4")
    assert curve.finetune.training.lr == 1e-4 and curve.finetune.training.batch_size == 32


def test_nested_flags_keep_their_flat_names_and_fill_the_nested_configs():
    from gptkit.train.finetune.tasks import LoRAConfig

    (config,) = _configs(
        "finetune", "--dataset", "sst2", "--init", "gpt2", "--n-layer", "2", "--lora-rank", "4",
        "--lora-targets", "c_attn", "--lr", "1e-4", "--schedule", "constant", "--train", "train.csv",
    )  # fmt: skip
    assert (config.model.init, config.model.n_layer, config.train) == ("gpt2", 2, "train.csv")
    assert config.lora == LoRAConfig(rank=4, targets=["c_attn"])
    assert (config.training.lr, config.training.schedule, config.training.batch_size) == (
        1e-4,
        "constant",
        32,
    )
    # A nested config's own checks name the flag a user typed.
    with pytest.raises(ValueError, match=r"^LoRAConfig.alpha \(--lora-alpha\): applies to LoRA runs only"):
        _configs("finetune", "--lora-alpha", "8")
    # The suite and the transfer curve show the flags they had before their fine-tuning settings
    # were nested (listed from that version), no more: the rest of the template is each task's own.
    training = {
        "--activation-checkpointing", "--adamw-lr-scale", "--batch-size", "--beta1", "--beta2", "--checkpoint-every", "--compile",
        "--collective-timeout", "--eps", "--eval-every", "--fsdp", "--fsdp-offload", "--fsdp-defer-gradient-sync", "--grad-clip", "--group-by-length", "--keep-checkpoints",
        "--log-every", "--log-to", "--lr", "--max-steps", "--micro-batch-size", "--on-nonfinite",
        "--optimizer", "--precision", "--progress", "--schedule", "--seed", "--time-budget",
        "--warmup-steps", "--weight-decay", "--data-dir", "--device", "--epochs", "--init",
        "--max-eval-examples", "--max-train-examples", "--out", "--seeds", "--tokenizer",
    }  # fmt: skip
    suite = {"--lm-coef", "--lora-alpha", "--lora-rank", "--lora-targets", "--max-length", "--tasks"}
    suite |= {"--transfer-layers", "--variants"}
    assert _flags("suite") == training | suite
    assert _flags("figure2", "layers") == training | {"--layers", "--task"}


def _flags(*words: str) -> set[str]:
    """A command's flags, without --help, --config and the --no- forms of switches."""
    from gptkit.cli import build_parser

    parser = build_parser()
    for word in words:
        parser = next(a for a in parser._actions if a.dest.endswith("command")).choices[word]
    names = {o for a in parser._actions for o in a.option_strings}
    return {o for o in names if not o.startswith("--no-")} - {"-h", "--help", "--config"}


def test_a_nested_config_round_trips_through_json_and_the_config_file(tmp_path):
    """A FinetuneConfig written as JSON (nested: asdict; or flat by flag name: run_config.json's
    section) and read back by --config is the same config."""
    import dataclasses

    from gptkit.config import flat_fields
    from gptkit.train.finetune.tasks import FinetuneConfig, LoRAConfig, paper_finetuning
    from gptkit.train.run import ModelShape

    config = FinetuneConfig(
        model=ModelShape(init="gpt2", dropout=0.2, context_length=128),
        dataset="rte",
        epochs=2,
        group_by_length=False,
        lora=LoRAConfig(rank=8, alpha=4.0, targets=["c_attn", "c_fc"]),
        merge=True,
        training=dataclasses.replace(paper_finetuning(), lr=3e-5, seed=7, log_to=["tensorboard"]),
    )
    nested, flat = tmp_path / "nested.json", tmp_path / "flat.json"
    nested.write_text(json.dumps(dataclasses.asdict(config)))
    flat.write_text(json.dumps(flat_fields(config)))
    assert _configs("finetune", "--config", str(nested)) == [config]
    assert _configs("finetune", "--config", str(flat)) == [config]
    # Flags still override the file.
    (again,) = _configs("finetune", "--config", str(nested), "--lora-rank", "2", "--lr", "1e-3")
    assert again == dataclasses.replace(
        config,
        lora=dataclasses.replace(config.lora, rank=2),
        training=dataclasses.replace(config.training, lr=1e-3),
    )
    nested.write_text('{"lora": {"rnak": 2}}')
    with pytest.raises(ValueError, match=r"nested\.json: unknown field\(s\): 'lora_rnak'$"):
        _configs("finetune", "--config", str(nested))


def test_a_required_field_may_come_from_the_config_file(tmp_path):
    """PretrainConfig.data has no default: --data, or data in the --config file (here in a section,
    as docs/pretraining.md shows); neither is an error naming both."""
    file = tmp_path / "run.yaml"
    file.write_text("pretrain:\n  data: shards\ntrain:\n  lr: 0.001\n")
    (config,) = _configs("pretrain", "--config", str(file))
    assert (config.data, config.training.lr) == ("shards", 0.001)
    with pytest.raises(
        ValueError,
        match=r"^PretrainConfig.data \(--data\): is required: give --data, or data in --config FILE$",
    ):
        _configs("pretrain", "--lr", "0.001")


@pytest.mark.parametrize(
    "text, message",
    [
        (b"training:\n  lr: \xff\n", r"run\.yaml: not UTF-8 text \(byte 16\)$"),
        (b"model:\n  n_layer: 2\n n_head: 4\n", r"run\.yaml: not valid YAML \(line 3, column 2: .*\)$"),
        (b"model:\n  n_layer: [2]\n", r"run\.yaml: n_layer: expected an integer, got \[2\]$"),
        (b"model:\n  n_layer: 2.0\n", r"run\.yaml: n_layer: expected an integer, got 2\.0$"),
        (b"training:\n  max_steps: true\n", r"run\.yaml: max_steps: expected an integer, got True$"),
        (b"training:\n  lr: fast\n", r"run\.yaml: lr: expected a number, got 'fast'$"),
        (b"training:\n  batch_size: null\n", r"run\.yaml: batch_size: must have a value, not null$"),
        (b"training:\n  schedule: cosin\n", r"run\.yaml: schedule: must be one of cosine, .*, got 'cosin'$"),
        (b"training:\n  log_to: tensorboard\n", r"run\.yaml: log_to: expected a list, got 'tensorboard'$"),
        (b'"a\\nb": 1\n', r"run\.yaml: unknown field\(s\): 'a\\nb'$"),
        (b"1: 2\n", r"run\.yaml: field names are strings, not 1$"),
        # A value of the right type that the config's own checks refuse: the file is named too.
        (b"training:\n  lr: -1\n", r"^\S*run\.yaml: TrainConfig\.lr \(--lr\): must be > 0"),
    ],
)
def test_a_damaged_config_file_is_one_line_naming_the_file_and_the_field(tmp_path, text, message):
    """What the reader fuzzing of `--config` files found: each damage gets one line that names the
    file (and the field), never another exception."""
    file = tmp_path / "run.yaml"
    file.write_bytes(text)
    with pytest.raises(ValueError) as raised:
        _configs("pretrain", "--data", "shards", "--config", str(file))
    assert re.search(message, str(raised.value)) and "\n" not in str(raised.value), str(raised.value)
    # An integer where a number belongs is a number, 1e-3 (a string to YAML) is read as the flag
    # would read it, null clears a default, and a flag's bad value is the flag's, not the file's.
    file.write_text("training:\n  lr: 1\n")
    assert _configs("pretrain", "--data", "shards", "--config", str(file))[0].training.lr == 1.0
    file.write_text("training:\n  lr: 1e-3\n  time_budget: 90\n  eval_every: null\n")
    (config,) = _configs("pretrain", "--data", "shards", "--config", str(file))
    assert (config.training.lr, config.training.time_budget, config.training.eval_every) == (1e-3, "90", None)
    with pytest.raises(ValueError, match=r"^TrainConfig\.lr \(--lr\): must be > 0"):
        _configs("pretrain", "--data", "shards", "--config", str(file), "--lr", "-1")
