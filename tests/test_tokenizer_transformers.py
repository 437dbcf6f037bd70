"""transformers reads what gptkit writes: ``AutoTokenizer`` gives gptkit's ids on real text, and
``AutoModelForCausalLM`` + ``AutoTokenizer`` on a gptkit directory continue a prompt as gptkit does."""

from __future__ import annotations

import json

import pytest
import torch

from gptkit import GPT, GPTConfig, generate
from gptkit.data.prepare import prepare
from gptkit.tokenizer import Tokenizer, train_bpe
from gptkit.train.config import TrainConfig
from gptkit.train.pretrain import PretrainConfig, pretrain
from gptkit.train.run import ModelShape

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def gpt1(data_dir) -> Tokenizer:
    return Tokenizer.from_pretrained(data_dir / "gpt1_bpe")


@pytest.fixture(scope="module")
def gpt2(data_dir) -> Tokenizer:
    return Tokenizer.from_pretrained(data_dir / "gpt2_bpe")


@pytest.fixture(scope="module")
def gpt1_in_transformers(gpt1, tmp_path_factory):
    return in_transformers(gpt1, tmp_path_factory.mktemp("gpt1"))


def in_transformers(tokenizer: Tokenizer, directory):
    """``tokenizer`` saved by gptkit, then loaded as a new user would: ``AutoTokenizer.from_pretrained``."""
    tokenizer.save_pretrained(directory)
    return transformers.AutoTokenizer.from_pretrained(directory)


def hf_ids(hf_tokenizer, texts: list[str]) -> list[list[int]]:
    return hf_tokenizer(texts, add_special_tokens=False)["input_ids"]


def real_texts(data_dir) -> dict[str, list[str]]:
    """Whole books (newlines, quotes, contractions), tokenized and raw sentences, an encyclopaedia."""
    wiki = (data_dir / "wikitext2" / "valid.txt").read_text(encoding="utf-8").splitlines()
    with open(data_dir / "cola" / "in_domain_dev.tsv", encoding="utf-8") as f:
        cola = [line.rstrip("\n").split("\t")[3] for line in f]
    sst = (data_dir / "sst2" / "stsa.binary.dev").read_text(encoding="utf-8").splitlines()
    return {
        "alice": [(data_dir / "gutenberg" / "pg11.txt").read_text(encoding="utf-8")],
        "wikitext": [line for line in wiki if line.strip()],
        "cola": cola,
        "sst2": [line.split(" ", 1)[1] for line in sst],
    }


def assert_same_ids(tokenizer: Tokenizer, hf_tokenizer, texts: dict[str, list[str]]) -> None:
    for name, batch in texts.items():
        expected, got = tokenizer.encode_batch(batch), hf_ids(hf_tokenizer, batch)
        for i, (ours, theirs) in enumerate(zip(expected, got)):
            assert theirs == ours, (
                f"{name}, text {i}: transformers' ids differ from gptkit's: {batch[i][:200]!r}"
            )


# The published vocabularies ---------------------------------------------------------------------


def test_gpt2_vocabulary_gives_gptkits_ids_in_transformers(gpt2, data_dir, tmp_path):
    hf = in_transformers(gpt2, tmp_path)
    assert type(hf).__name__.startswith("GPT2Tokenizer") and len(hf) == len(gpt2) == 50257
    assert hf.eos_token == "<|endoftext|>" and hf.eos_token_id == 50256
    texts = real_texts(data_dir)
    assert_same_ids(gpt2, hf, texts)
    alice = texts["alice"][0]
    assert hf.decode(gpt2.encode(alice)) == alice


@pytest.mark.slow
def test_gpt1_vocabulary_gives_gptkits_ids_in_transformers(gpt1, gpt1_in_transformers, data_dir):
    """Not transformers' OpenAIGPTTokenizer (BERT's splitting: it ' s, don ' t): gptkit's pipeline."""
    hf = gpt1_in_transformers
    assert len(hf) == len(gpt1) == 40478 + 3
    assert {token: hf.convert_tokens_to_ids(token) for token in gpt1.special_tokens} == gpt1.special_tokens
    assert hf.all_special_tokens == ["_start_", "_delimiter_", "_classify_"]
    assert_same_ids(gpt1, hf, real_texts(data_dir))
    ids = gpt1.encode("I can't believe it's 2.7 km to Mr. Smith's!\nNext line")
    assert (
        hf.decode(ids) == gpt1.decode(ids) == "i ca n't believe it 's 2.7 km to mr. smith 's ! \n next line"
    )


@pytest.mark.parametrize(
    "repaired, clean",
    [
        ("Iraqâ€™s interim government", "Iraq’s interim government"),  # mojibake that ftfy repairs
        ("'Fast &amp; Furious' star", "'Fast & Furious' star"),  # an HTML entity that ftfy unescapes
        ("the service www.HollywoodDisc.com", "the service www.hollywooddisc.com"),  # spaCy's URLs
    ],
)
def test_what_transformers_gpt1_pipeline_leaves_out(gpt1, gpt1_in_transformers, repaired, clean):
    """The differences docs/ecosystem.md names (8 of 114,274 lines of the shared data): real, and
    only where ftfy or spaCy do more than the written pipeline."""
    hf = gpt1_in_transformers
    assert hf_ids(hf, [repaired])[0] != gpt1.encode(repaired)
    assert hf_ids(hf, [clean])[0] == gpt1.encode(clean)


# Vocabularies trained by gptkit -----------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("style, size", [("bytelevel", 600), ("gpt1", 800)])
def test_trained_vocabulary_gives_gptkits_ids_in_transformers(data_dir, tmp_path, style, size):
    tokenizer = train_bpe(
        [data_dir / "gutenberg" / "pg11.txt"], size, tmp_path, style=style, show_progress=False
    )
    hf = transformers.AutoTokenizer.from_pretrained(tmp_path)  # train_bpe wrote the files itself
    assert len(hf) == len(tokenizer) == size
    assert {
        token: hf.convert_tokens_to_ids(token) for token in tokenizer.special_tokens
    } == tokenizer.special_tokens
    texts = real_texts(data_dir)
    texts["unseen characters"] = ["Straße, naïve café, 中文 and 😀 were not in Alice."]
    assert_same_ids(tokenizer, hf, texts)
    if style == "gpt1":  # symbols outside the learned vocabulary are id 0 in both
        assert 0 in tokenizer.encode(texts["unseen characters"][0])


def test_an_older_directory_loads_and_saving_it_again_adds_transformers_files(gpt2, tmp_path):
    gpt2.save_pretrained(tmp_path)
    config_path = tmp_path / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config_path.write_text(json.dumps({key: config[key] for key in ("style", "files", "special_tokens")}))
    (tmp_path / "tokenizer.json").unlink()  # as gptkit wrote directories before

    text = "An older directory, loaded again."
    old = Tokenizer.from_pretrained(tmp_path)
    assert old.encode(text) == gpt2.encode(text)
    old.save_pretrained(tmp_path)
    hf = transformers.AutoTokenizer.from_pretrained(tmp_path)
    assert hf_ids(hf, [text])[0] == gpt2.encode(text)


# Model and tokenizer together -------------------------------------------------------------------

PROMPT = "It's a truth universally acknowledged, that a single man in possession of a good fortune"


def assert_transformers_continues_as_gptkit(directory, model: GPT, tokenizer: Tokenizer) -> None:
    """Greedy continuations from ``AutoModelForCausalLM`` + ``AutoTokenizer`` on ``directory``."""
    hf_tokenizer = transformers.AutoTokenizer.from_pretrained(directory)
    hf_model = transformers.AutoModelForCausalLM.from_pretrained(directory).eval()
    prompt = hf_tokenizer(PROMPT, return_tensors="pt")
    assert prompt["input_ids"][0].tolist() == tokenizer.encode(PROMPT)
    theirs = hf_model.generate(**prompt, max_new_tokens=24, do_sample=False, pad_token_id=0)
    ours = generate(model.eval(), prompt["input_ids"], 24, temperature=0)
    assert torch.equal(theirs, ours)
    new = ours[0, prompt["input_ids"].shape[1] :].tolist()
    assert len(set(new)) > 5  # a continuation that would show a wrong id, not one token repeated
    assert hf_tokenizer.decode(new) == tokenizer.decode(new)


def wide_model(tokenizer: Tokenizer, ln_position: str) -> GPT:
    """A tiny random GPT whose weights are wide enough that greedy decoding does not settle on one token."""
    torch.manual_seed(0)
    config = GPTConfig.from_preset(
        "tiny",
        vocab_size=tokenizer.vocab_size,
        n_special=tokenizer.n_special,
        ln_position=ln_position,
        dropout=0.0,
        init_std=0.2,
    )
    return GPT(config)


@pytest.mark.parametrize("vocabulary, ln_position", [("gpt2_bpe", "pre"), ("gpt1_bpe", "post")])
def test_transformers_continues_a_gptkit_model_directory_as_gptkit(
    data_dir, tmp_path, vocabulary, ln_position
):
    tokenizer = Tokenizer.from_pretrained(data_dir / vocabulary)
    model = wide_model(tokenizer, ln_position)
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    assert_transformers_continues_as_gptkit(tmp_path, model, tokenizer)


@pytest.mark.slow
def test_transformers_loads_a_pretraining_run_directory_whole(data_dir, tmp_path):
    tokenizer = Tokenizer.from_pretrained(data_dir / "gpt2_bpe")
    prepare(
        data_dir / "gpt2_bpe", [data_dir / "gutenberg" / "pg11.txt"], tmp_path / "data", show_progress=False
    )
    wide_model(tokenizer, "post").save_pretrained(tmp_path / "init")  # GPT-1's layout, GPT-2's vocabulary
    run = tmp_path / "run"
    steps = dict(max_steps=2, batch_size=2, warmup_steps=1, eval_every=2, checkpoint_every=2, log_every=1)
    config = PretrainConfig(
        data=str(tmp_path / "data"),
        model=ModelShape(init=str(tmp_path / "init"), dropout=0.0),
        out=str(run),
        training=TrainConfig(**steps, lr=1e-4, progress=False, precision="fp32"),
    )
    pretrain(config)
    assert_transformers_continues_as_gptkit(run, GPT.from_pretrained(run), Tokenizer.from_pretrained(run))
