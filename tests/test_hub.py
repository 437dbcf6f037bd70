"""Published models by name, offline, from a Hugging Face cache laid out as the Hub lays it out.

The cache holds tiny GPT-1 and GPT-2 models saved by transformers, with the real vocabularies under
the Hub's file names (``vocab.json``, ``merges.txt``, and the ``tokenizer.json`` transformers writes).
The references are transformers' own models and tokenizers read from the same cache, and gptkit's
GPT-1 tokenizer read from OpenAI's released files.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from gptkit import GPT, GPTConfig, Tokenizer, hub
from gptkit.cli import main
from gptkit.generation import load_for_generation
from gptkit.model.task import TaskModel
from gptkit.testing.hub_cache import publish

transformers = pytest.importorskip("transformers")

REPO = Path(__file__).resolve().parents[1]
GPT2 = "openai-community/gpt2"
GPT1 = "openai-community/openai-gpt"


def _gpt2_folder(folder: Path, data_dir: Path, seed: int = 0) -> Path:
    """A tiny GPT-2 (GPT-2's 50,257-token vocabulary) as its Hub repository holds the files."""
    torch.manual_seed(seed)
    config = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, n_positions=64, vocab_size=50257)
    transformers.GPT2LMHeadModel(config).save_pretrained(folder)
    vocab = json.loads((data_dir / "gpt2_bpe" / "encoder.json").read_text(encoding="utf-8"))
    merges = [
        tuple(line.split()) for line in (data_dir / "gpt2_bpe" / "vocab.bpe").read_text().splitlines()[1:]
    ]
    transformers.GPT2TokenizerFast(vocab=vocab, merges=merges).save_pretrained(folder)
    shutil.copyfile(data_dir / "gpt2_bpe" / "encoder.json", folder / "vocab.json")
    shutil.copyfile(data_dir / "gpt2_bpe" / "vocab.bpe", folder / "merges.txt")
    return folder


def _gpt1_folder(folder: Path, data_dir: Path) -> Path:
    """A tiny GPT-1 (its 40,478-token vocabulary) as openai-community/openai-gpt holds the files."""
    torch.manual_seed(1)
    config = transformers.OpenAIGPTConfig(n_layer=2, n_embd=32, n_head=2, n_positions=64, vocab_size=40478)
    transformers.OpenAIGPTLMHeadModel(config).save_pretrained(folder)
    vocab = json.loads((data_dir / "gpt1_bpe" / "encoder_bpe_40000.json").read_text(encoding="utf-8"))
    lines = (data_dir / "gpt1_bpe" / "vocab_40000.bpe").read_text(encoding="utf-8").splitlines()[1:]
    transformers.OpenAIGPTTokenizer(
        vocab=vocab, merges=[tuple(line.split()) for line in lines]
    ).save_pretrained(folder)
    shutil.copyfile(data_dir / "gpt1_bpe" / "encoder_bpe_40000.json", folder / "vocab.json")
    shutil.copyfile(data_dir / "gpt1_bpe" / "vocab_40000.bpe", folder / "merges.txt")
    return folder


@pytest.fixture(scope="module")
def repos(tmp_path_factory, data_dir) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("published")
    return {
        GPT2: _gpt2_folder(root / "gpt2", data_dir),
        GPT1: _gpt1_folder(root / "openai-gpt", data_dir),
    }


@pytest.fixture
def hub_home(offline_hub, repos) -> Path:
    """The offline cache holding both published models at their main revision."""
    for repo_id, folder in repos.items():
        publish(offline_hub, repo_id, folder)
    return offline_hub


# Names ---------------------------------------------------------------------------------------------


def test_names_people_type_are_their_repositories_and_paths_are_not_names():
    assert hub.parse_name("gpt2") == hub.HubName(GPT2)
    assert hub.parse_name("gpt2-xl") == hub.HubName("openai-community/gpt2-xl")
    assert hub.parse_name("openai-gpt") == hub.HubName(GPT1)
    assert hub.parse_name("org/name@v1.0") == hub.HubName("org/name", "v1.0")
    assert hub.parse_name("gpt2@refs/pr/1") == hub.HubName(GPT2, "refs/pr/1")
    for path in ("/abs/model", "./model", "../model", "runs/a/b", "~/model", "model/"):
        assert hub.parse_name(path) is None, path


def test_a_local_folder_wins_over_a_name(hub_home, tmp_path, monkeypatch):
    local = GPT(GPTConfig.from_preset("tiny", vocab_size=99))
    monkeypatch.chdir(tmp_path)
    local.save_pretrained(tmp_path / "gpt2")
    assert GPT.from_pretrained("gpt2").config.vocab_size == 99  # the folder, not the cached repository
    assert GPT.from_pretrained(GPT2).config.vocab_size == 50257


# The reference's outputs, by name ----------------------------------------------------------------


@pytest.mark.parametrize("name", ["gpt2", GPT2])
def test_generate_by_name_prints_transformers_greedy_continuation(hub_home, name, capsys):
    prompt = "The meaning of life is"
    code = main(
        ["generate", "--model", name, "--prompt", prompt, "--temperature", "0", "--max-tokens", "12"]
        + ["--dtype", "float32", "--device", "cpu"]
    )
    assert code == 0
    printed = capsys.readouterr().out
    folder = hub.resolve(name)
    reference = transformers.GPT2LMHeadModel.from_pretrained(folder).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    ids = tokenizer(prompt, return_tensors="pt").input_ids
    out = reference.generate(ids, max_new_tokens=12, do_sample=False, pad_token_id=50256)
    assert printed == prompt + tokenizer.decode(out[0, ids.size(1) :]) + "\n"


def test_gpt1_by_name_decodes_as_transformers_openai_gpt_does(hub_home):
    model, tokenizer = load_for_generation("openai-gpt", dtype="float32", device="cpu")
    reference = transformers.OpenAIGPTLMHeadModel.from_pretrained(hub.resolve(GPT1)).eval()
    ids = torch.tensor([tokenizer.encode("the king said to his daughter")])
    with torch.no_grad():
        ours, theirs = model(ids).logits, reference(ids).logits
    torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=1e-4)


@pytest.mark.slow
def test_tokenizers_by_name_give_their_references_ids_on_a_megabyte(hub_home, data_dir):
    text = (data_dir / "wikitext2" / "valid.txt").read_text(encoding="utf-8")
    assert len(text.encode()) > 1_000_000
    gpt2 = Tokenizer.from_pretrained("gpt2")
    reference = transformers.AutoTokenizer.from_pretrained(GPT2)  # the same cache, offline
    assert type(reference).__name__ == "GPT2Tokenizer"
    assert gpt2.encode(text) == reference(text).input_ids

    gpt1 = Tokenizer.from_pretrained("openai-gpt")
    released = Tokenizer.from_pretrained(data_dir / "gpt1_bpe")  # OpenAI's files: the release's ids
    assert (gpt1.style, gpt1.encoder, gpt1.merges) == (released.style, released.encoder, released.merges)
    assert gpt1.special_tokens == released.special_tokens
    assert gpt1.encode(text) == released.encode(text)


def test_a_revision_picks_its_commit(hub_home, repos, data_dir, tmp_path):
    other = _gpt2_folder(tmp_path / "gpt2-v2", data_dir, seed=5)
    commit = publish(hub_home, GPT2, other, revision="v2")
    main_weights = GPT.from_pretrained("gpt2").wte.weight
    by_branch = GPT.from_pretrained("gpt2@v2").wte.weight
    by_commit = GPT.from_pretrained(f"{GPT2}@{commit}").wte.weight
    assert torch.equal(by_branch, by_commit)
    assert not torch.equal(main_weights, by_branch)
    with pytest.raises(hub.HubError, match="gpt2@nope"):
        GPT.from_pretrained("gpt2@nope")


# Failures ------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_an_unknown_name_offline_is_one_line_and_exit_2(offline_hub):
    result = subprocess.run(
        [sys.executable, "-m", "gptkit", "generate", "--model", "nobody/nothing", "--prompt", "hi"],
        cwd=REPO,
        env=os.environ.copy(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    assert "nobody/nothing" in lines[0] and "HF_HUB_OFFLINE=1" in lines[0]
    assert "gptkit download nobody/nothing" in lines[0]


def test_a_damaged_file_in_the_cache_names_the_model_and_the_fix(hub_home):
    weights = hub.resolve("gpt2") / "model.safetensors"
    blob = weights.resolve()
    blob.write_bytes(blob.read_bytes()[:1000])  # a download cut short
    with pytest.raises(
        ValueError, match=r"gpt2: the cached copy of openai-community/gpt2 is damaged"
    ) as error:
        GPT.from_pretrained("gpt2")
    assert "gptkit download gpt2 --force-download" in str(error.value)
    merges = (hub.resolve(GPT1) / "merges.txt").resolve()
    merges.write_bytes(b"")
    with pytest.raises(ValueError, match=r"cached copy of openai-community/openai-gpt is damaged"):
        Tokenizer.from_pretrained("openai-gpt")


def test_download_prints_the_cached_folder(hub_home, capsys):
    assert main(["download", "gpt2"]) == 0
    printed = Path(capsys.readouterr().out.strip())
    assert printed == hub.resolve(GPT2)
    assert printed.parent.parent.name == "models--openai-community--gpt2"
    assert main(["download", "./not-a-name"]) == 2


# Every door takes a name: one that cannot be had is reported by name, and leaves no run folder.
DOORS = {
    "generate": ["generate", "--model", "{name}", "--prompt", "hi"],
    "generate --tokenizer": ["generate", "--model", "{model}", "--tokenizer", "{name}", "--prompt", "hi"],
    "serve": ["serve", "--model", "{name}", "--port", "1"],
    "finetune --init": ["finetune", "--init", "{name}", "--dataset", "sst2", "--out", "{out}"],
    "finetune --tokenizer": ["finetune", "--tokenizer", "{name}", "--dataset", "sst2", "--out", "{out}"],
    "pretrain --init": ["pretrain", "--init", "{name}", "--data", "{out}-shards", "--out", "{out}"],
    "evaluate": ["evaluate", "--model", "{name}", "--data", "x.csv"],
    "predict": ["predict", "--model", "{name}", "--data", "x.csv", "--out", "{out}.jsonl"],
    "perplexity": ["perplexity", "--model", "{name}", "x.txt"],
    "zeroshot": ["zeroshot", "--model", "{name}", "--task", "sentiment"],
    "harness": ["harness", "--model", "{name}", "--tasks", "lambada_openai"],
    "export": ["export", "{name}", "{out}.onnx"],
    "convert": ["convert", "{name}", "{out}"],
    "suite": ["suite", "--init", "{name}", "--out", "{out}"],
    "figure2 layers": ["figure2", "layers", "--init", "{name}", "--out", "{out}"],
    "tokenize": ["tokenize", "--tokenizer", "{name}"],
    "demo --init": ["demo", "--init", "{name}", "--data", "{data}", "--out", "{out}"],
    "prepare": ["prepare", "{data}/tinyshakespeare/input.txt", "--tokenizer", "{name}", "--out", "{out}"],
}


@pytest.mark.slow
@pytest.mark.parametrize("door", list(DOORS))
def test_every_door_resolves_names_and_leaves_nothing_behind(door, hub_home, tmp_path, capsys, data_dir):
    out = tmp_path / "run"
    fields = {"name": "nobody/nothing", "model": "gpt2", "out": str(out), "data": str(data_dir)}
    argv = [arg.format(**fields) for arg in DOORS[door]]
    assert main(argv) == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert "nobody/nothing: no such local folder" in error and "HF_HUB_OFFLINE=1" in error, error
    assert not out.exists()


# Whole stages by name ------------------------------------------------------------------------------


@pytest.mark.slow
def test_finetune_and_evaluate_by_name(hub_home, tmp_path, data_dir):
    run = tmp_path / "ft"
    common = ["--dataset", "sst2", "--data-dir", str(data_dir), "--max-train-examples", "16"]
    common += ["--max-eval-examples", "16", "--epochs", "1", "--batch-size", "8", "--device", "cpu"]
    assert main(["finetune", "--init", GPT1, "--out", str(run), *common, "--no-progress"]) == 0
    local = TaskModel.from_pretrained(run, device="cpu")
    assert local.gpt.config.n_layer == 2 and local.tokenizer.style == "gpt1"

    # The fine-tuned model published in its turn, and read back by name.
    publish(hub_home, "someone/sst2-tiny", run)
    rows = [{"text": "a gripping, funny film"}, {"text": "dull and far too long"}]
    assert TaskModel.from_pretrained("someone/sst2-tiny", device="cpu").predict(rows) == local.predict(rows)

    # A LoRA adapter records its base by name, and finds it in the cache again.
    adapter = tmp_path / "lora"
    assert main(["finetune", "--init", "gpt2", "--out", str(adapter), "--lora-rank", "2", *common]) == 0
    assert json.loads((adapter / "task.json").read_text())["lora"]["base"] == "gpt2"
    assert TaskModel.from_pretrained(adapter, device="cpu").gpt.config.vocab_size == 50257


@pytest.mark.slow
def test_serve_by_name_answers_with_transformers_greedy_continuation(hub_home, tmp_path):
    pytest.importorskip("fastapi")
    from tests.test_serve import MODEL, Server

    server = Server("gpt2", tmp_path / "server.log")  # the environment carries the offline cache
    try:
        server.wait_ready()
        client = server.client()
        prompt = "Once upon a time"
        answer = client.completions.create(model=MODEL, prompt=prompt, max_tokens=8, temperature=0)
    finally:
        server.stop()
    folder = hub.resolve("gpt2")
    reference = transformers.GPT2LMHeadModel.from_pretrained(folder).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    ids = tokenizer(prompt, return_tensors="pt").input_ids
    out = reference.generate(ids, max_new_tokens=8, do_sample=False, pad_token_id=50256)
    assert answer.choices[0].text == tokenizer.decode(out[0, ids.size(1) :])


@pytest.mark.slow
def test_demo_from_published_weights_pairs_both_sides_update_for_update(hub_home, tmp_path, data_dir):
    from gptkit.demo import DemoConfig, run_demo
    from gptkit.train.rundir import RunDir

    out = tmp_path / "demo"
    summary = run_demo(
        DemoConfig(data=str(data_dir), out=str(out), init="openai-gpt", quick=True, device="cpu")
    )
    assert summary["recipe"] == "published" and set(summary["tasks"]) == {"sst2", "story_cloze"}
    for name, result in summary["tasks"].items():
        sides = {side: out / name / "seed-1337" / side for side in ("pretrained", "from_scratch")}
        # The same updates on both sides, from the published weights and from random ones.
        updates = result["per_seed"][0]["updates"]
        assert RunDir(sides["pretrained"]).resolved_max_steps() == updates > 0
        assert RunDir(sides["from_scratch"]).resolved_max_steps() == updates
        correct = {
            s: json.loads((d / "report_correct.json").read_text())["correct"] for s, d in sides.items()
        }
        assert len(correct["pretrained"]) == len(correct["from_scratch"]) == result["examples"]
        # One seed a side: the difference alone, with no error that would read as a finding.
        assert result["difference"] == pytest.approx(
            np.mean(correct["pretrained"]) - np.mean(correct["from_scratch"])
        )
        assert result["seeds"] == 1 and result["stderr"] is None
    # The random side starts from new weights of the published shape; the published side from them.
    published = GPT.from_pretrained("openai-gpt")
    tuned = TaskModel.from_pretrained(out / "sst2" / "seed-1337" / "pretrained", device="cpu").gpt
    assert tuned.config.n_layer == published.config.n_layer
    assert set(summary["samples"]) and all(isinstance(text, str) for text in summary["samples"].values())


# The download itself, from a Hub on 127.0.0.1 ------------------------------------------------------


def _gptkit(*args: str, env: dict, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "gptkit", *args],
        cwd=REPO,
        env=env,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _online_env(tmp_path: Path) -> dict:
    """The environment of a `gptkit` that may reach a Hub (the tests' own is offline), caching under
    ``tmp_path``."""
    env = {**os.environ, "HF_HOME": str(tmp_path / "hf_home"), "HF_HUB_DISABLE_TELEMETRY": "1"}
    env.pop("HF_HUB_OFFLINE", None)
    return env


def _with_weights_gptkit_skips(repository: Path, folder: Path) -> Path:
    """A copy of ``repository`` in ``folder`` that also holds TensorFlow weights, and pickled ones beside
    its safetensors: files a download must leave on the Hub."""
    shutil.copytree(repository, folder)
    (folder / "tf_model.h5").write_bytes(b"TensorFlow weights: never fetched")
    (folder / "pytorch_model.bin").write_bytes(b"pickled weights: never fetched beside safetensors")
    return folder


@pytest.mark.slow
def test_download_fetches_only_what_gptkit_reads_and_reports_what_the_hub_answered(repos, tmp_path):
    from tests.fake_hub import FakeHub

    folder = _with_weights_gptkit_skips(repos[GPT2], tmp_path / "repo")
    env = _online_env(tmp_path)
    with FakeHub() as fake:
        fake.add(GPT2, folder)
        fake.add("someone/gated", folder)
        fake.gated.add("someone/gated")
        env["HF_ENDPOINT"] = fake.endpoint
        result = _gptkit("download", "gpt2", env=env)
        assert result.returncode == 0, result.stderr
        snapshot = Path(result.stdout.strip().splitlines()[-1])
        assert (
            snapshot
            == tmp_path
            / "hf_home"
            / "hub"
            / "models--openai-community--gpt2"
            / "snapshots"
            / fake.commit(GPT2)
        )
        wanted = {"config.json", "generation_config.json", "model.safetensors", "merges.txt", "vocab.json"}
        wanted |= {"tokenizer.json", "tokenizer_config.json"}
        assert {p.name for p in snapshot.iterdir()} == wanted
        assert sorted(fake.fetched()) == sorted(wanted)
        assert (snapshot / "model.safetensors").read_bytes() == (folder / "model.safetensors").read_bytes()

        # A download cut short, then fetched anew.
        blob = (snapshot / "model.safetensors").resolve()
        blob.write_bytes(blob.read_bytes()[:100])
        damaged = _gptkit("convert", "gpt2", str(tmp_path / "converted"), env=env)
        assert damaged.returncode == 2 and "gptkit download gpt2 --force-download" in damaged.stderr
        assert _gptkit("download", "gpt2", "--force-download", env=env).returncode == 0
        assert (snapshot / "model.safetensors").read_bytes() == (folder / "model.safetensors").read_bytes()
        unknown = _gptkit("download", "nobody/nothing", env=env)
        gated = _gptkit("download", "someone/gated", env=env)
        revision = _gptkit("download", "gpt2", "--revision", "v9", env=env)
    for result, said in [
        (unknown, "the Hub answered that no repository nobody/nothing exists"),
        (gated, "the Hub answered that someone/gated is gated"),
        (revision, "the Hub has openai-community/gpt2 but no revision 'v9'"),
    ]:
        assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
        assert said in result.stderr.strip().splitlines()[-1], result.stderr
    # Offline now, the cache answers by name.
    env["HF_HUB_OFFLINE"] = "1"
    result = _gptkit("tokenize", "--tokenizer", "gpt2", env=env, stdin="hello world")
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["31373", "995"]


@pytest.mark.slow
def test_a_repository_without_safetensors_gives_its_pytorch_weights(repos, tmp_path):
    from tests.fake_hub import FakeHub

    folder = tmp_path / "bin-only"
    folder.mkdir()
    reference = transformers.GPT2LMHeadModel.from_pretrained(repos[GPT2]).eval()
    torch.save(reference.state_dict(), folder / "pytorch_model.bin")  # the older, pickled format
    for name in ("config.json", "vocab.json", "merges.txt"):
        shutil.copyfile(repos[GPT2] / name, folder / name)
    env = _online_env(tmp_path)
    with FakeHub() as fake:
        fake.add("someone/bin-only", folder)
        env["HF_ENDPOINT"] = fake.endpoint
        result = _gptkit("convert", "someone/bin-only", str(tmp_path / "converted"), env=env)
    assert result.returncode == 0, result.stderr
    assert "pytorch_model.bin" in fake.fetched()
    ids = torch.tensor([[464, 3290, 286, 1204, 318]])
    with torch.no_grad():
        ours = GPT.from_pretrained(tmp_path / "converted")(ids).logits
        torch.testing.assert_close(ours, reference(ids).logits, atol=1e-4, rtol=1e-4)
