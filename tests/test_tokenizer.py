"""Tokenizers against independent references: the original GPT-1 algorithm and tiktoken's GPT-2."""

from __future__ import annotations

import hashlib
import json
import shutil

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gptkit.testing.reference_gpt1 import ReferenceGPT1Encoder
from gptkit.tokenizer import (
    ByteLevelTokenizer,
    GPT1Tokenizer,
    Tokenizer,
    text_standardize,
    tokenizer_digest,
    train_bpe,
)


@pytest.fixture(scope="module")
def gpt1(data_dir) -> GPT1Tokenizer:
    return Tokenizer.from_pretrained(data_dir / "gpt1_bpe")


@pytest.fixture(scope="module")
def gpt1_reference(data_dir) -> ReferenceGPT1Encoder:
    return ReferenceGPT1Encoder(
        data_dir / "gpt1_bpe" / "encoder_bpe_40000.json", data_dir / "gpt1_bpe" / "vocab_40000.bpe"
    )


@pytest.fixture(scope="module")
def gpt2(data_dir) -> ByteLevelTokenizer:
    return Tokenizer.from_pretrained(data_dir / "gpt2_bpe")


@pytest.fixture(scope="module")
def tiktoken_gpt2(data_dir):
    """tiktoken's own GPT-2 encoding, built by tiktoken's own loader from the shipped files."""
    tiktoken = pytest.importorskip("tiktoken")
    from tiktoken.load import data_gym_to_mergeable_bpe_ranks
    from tiktoken_ext.openai_public import r50k_pat_str

    ranks = data_gym_to_mergeable_bpe_ranks(
        vocab_bpe_file=str(data_dir / "gpt2_bpe" / "vocab.bpe"),
        encoder_json_file=str(data_dir / "gpt2_bpe" / "encoder.json"),
    )
    return tiktoken.Encoding(
        "gpt2-reference", pat_str=r50k_pat_str, mergeable_ranks=ranks, special_tokens={"<|endoftext|>": 50256}
    )


BOOK_CHARS = 300_000


def real_texts(data_dir) -> dict[str, list[str]]:
    """Real text of every kind gptkit reads: books, Shakespeare, SST-2 and RTE sentences (of a
    book, up to its first 300,000 characters, front matter included: 1.6 MB in all)."""
    texts = {}
    for book in sorted((data_dir / "gutenberg").glob("*.txt")):
        texts[book.name] = [book.read_text(encoding="utf-8")[:BOOK_CHARS]]
    shakespeare = data_dir / "tinyshakespeare" / "input.txt"
    texts["tinyshakespeare"] = [shakespeare.read_text(encoding="utf-8")[:BOOK_CHARS]]
    sst = (data_dir / "sst2" / "stsa.binary.dev").read_text(encoding="utf-8").splitlines()
    texts["sst2"] = [line.split(" ", 1)[1] for line in sst]
    with open(data_dir / "rte" / "dev.tsv", encoding="utf-8") as f:
        rows = [line.rstrip("\n").split("\t") for line in f][1:]
    texts["rte"] = [row[1] for row in rows] + [row[2] for row in rows]
    return texts


# GPT-1 ------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_gpt1_ids_identical_to_original_algorithm_on_real_text(gpt1, gpt1_reference, data_dir):
    for name, texts in real_texts(data_dir).items():
        expected = gpt1_reference.encode(texts)
        got = gpt1.encode_batch(texts)
        for i, (ours, reference) in enumerate(zip(got, expected)):
            assert ours == reference, f"{name}, text {i}: ids differ from the original algorithm's"
        assert len(got) == len(expected)


def test_gpt1_known_encoding(gpt1):
    ids = gpt1.encode("Hello, World!")
    assert [gpt1.decoder[i] for i in ids] == ["hello</w>", ",</w>", "world</w>", "!</w>"]
    assert gpt1.decode(ids) == "hello , world !"


def test_gpt1_special_tokens(gpt1):
    assert gpt1.special_tokens == {"_start_": 40478, "_delimiter_": 40479, "_classify_": 40480}
    assert len(gpt1) == 40481 and gpt1.vocab_size == 40478 and gpt1.n_special == 3
    assert gpt1.decode([40478]) == "_start_"


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.sampled_from([chr(c) for c in range(0x20, 0x7F) if chr(c) != "&"] + ["\t", "\n"])))
def test_ftfy_shortcut_only_skips_text_ftfy_leaves_alone(text):
    ftfy = pytest.importorskip("ftfy")
    assert ftfy.fix_text(text) == text  # the lines gptkit does not send through ftfy


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.sampled_from(
            [
                "plain line",
                "&amp; entity",
                "<b>tag</b> &lt;",
                "curly \u201cquotes\u201d",
                "mojibake \u00e2\u0080\u0099",
                "\r",
                "\n",
                "caf\u00e9",
                "\x1b[31mred",
            ]
        ),
        max_size=12,
    )
)
def test_fix_text_equals_ftfy(parts):
    ftfy = pytest.importorskip("ftfy")
    from gptkit.tokenizer.gpt1 import fix_text

    text = "".join(parts)
    assert fix_text(text) == ftfy.fix_text(text)


def test_text_standardize_by_hand():
    assert text_standardize("a—b…c´d") == "a - b...c'd"
    assert text_standardize("wait!!! what??") == "wait !!! what ??"
    assert text_standardize("  one\t\ttwo \n\n  three ") == "one two \n three"


@pytest.mark.parametrize("text", ["", "   ", "\x00\x00abc\x00", "a\ud800b", "x" * 200_000])
def test_gpt1_bad_input_never_crashes(gpt1, text):
    ids = gpt1.encode(text)
    assert all(0 <= i < len(gpt1) for i in ids)
    if not text.strip():
        assert ids == []


def test_gpt1_long_line_is_fast_and_complete(gpt1):
    line = "word " * 200_000 + "y" * 1_000_000  # 2 MB on one line
    ids = gpt1.encode(line)
    assert ids[:2] == gpt1.encode("word word")
    assert len(ids) > 200_000


# GPT-2 ------------------------------------------------------------------------------------------


def test_gpt2_known_ids(gpt2):
    assert gpt2.encode("hello world") == [31373, 995]
    assert gpt2.special_tokens["<|endoftext|>"] == 50256 and len(gpt2) == 50257


def test_gpt2_identical_to_tiktoken_on_real_text(gpt2, tiktoken_gpt2, data_dir):
    for name, texts in real_texts(data_dir).items():
        assert gpt2.encode_batch(texts) == tiktoken_gpt2.encode_ordinary_batch(texts), name


@settings(max_examples=300, deadline=None)
@given(st.text())
def test_gpt2_round_trips_every_unicode_string(gpt2, text):
    assert gpt2.decode(gpt2.encode(text)) == text


def test_gpt2_special_token_only_when_allowed(gpt2):
    assert 50256 not in gpt2.encode("a<|endoftext|>b")
    assert gpt2.encode("a<|endoftext|>b", allow_special=True) == [64, 50256, 65]


@pytest.mark.slow
def test_gpt2_bad_input(gpt2):
    assert gpt2.encode("") == []
    assert gpt2.decode(gpt2.encode("\x00nul\x00")) == "\x00nul\x00"
    assert gpt2.decode(gpt2.encode("a\ud800b")) == "a\ufffdb"  # lone surrogate: replaced, not a crash
    long_line = "z" * 10_000_000
    assert gpt2.decode(gpt2.encode(long_line)) == long_line
    with pytest.raises(ValueError, match="token id 50257 at position 1 is out of range"):
        gpt2.decode([1, 50257])
    with pytest.raises(ValueError, match="token id -3"):
        gpt2.decode([-3])


def test_unknown_directory_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="no known vocabulary"):
        Tokenizer.from_pretrained(tmp_path)
    with pytest.raises(FileNotFoundError, match="no such folder"):
        Tokenizer.from_pretrained(tmp_path / "absent")


def test_save_and_reload(gpt2, gpt1, tmp_path):
    gpt2.save_pretrained(tmp_path / "g2")
    again = Tokenizer.from_pretrained(tmp_path / "g2")
    assert again.encode("Saved, and loaded again.") == gpt2.encode("Saved, and loaded again.")
    gpt1.save_pretrained(tmp_path / "g1")
    again = Tokenizer.from_pretrained(tmp_path / "g1")
    assert isinstance(again, GPT1Tokenizer)
    assert again.encode("Saved, and loaded again.") == gpt1.encode("Saved, and loaded again.")
    assert again.special_tokens == gpt1.special_tokens


# Training ---------------------------------------------------------------------------------------


def test_train_bytelevel_bpe(data_dir, tmp_path):
    corpus = data_dir / "gutenberg" / "pg11.txt"
    tok = train_bpe([corpus], vocab_size=600, out_dir=tmp_path, style="bytelevel", show_progress=False)
    assert isinstance(tok, ByteLevelTokenizer) and len(tok) == 600
    text = corpus.read_text(encoding="utf-8")[:5000]
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    assert len(ids) < len(text.encode()) * 0.6  # merges learned from the corpus compress it
    # The files are in GPT-2's format: tiktoken's own loader accepts them.
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    assert config["style"] == "bytelevel"
    assert Tokenizer.from_pretrained(tmp_path).encode(text) == ids


def test_train_gpt1_style_bpe(data_dir, tmp_path):
    corpus = data_dir / "gutenberg" / "pg11.txt"
    tok = train_bpe([corpus], vocab_size=800, out_dir=tmp_path, style="gpt1", show_progress=False)
    assert isinstance(tok, GPT1Tokenizer) and len(tok) == 800
    assert list(tok.special_tokens) == ["_start_", "_delimiter_", "_classify_"]
    ids = tok.encode("Alice was beginning\nto get very tired")
    assert 0 not in ids  # unknown symbols map to 0: every symbol here is in the learned vocabulary
    assert tok.encoder["\n</w>"] in ids  # newlines are tokens, as in the original vocabulary
    assert tok.decode(ids) == "alice was beginning \n to get very tired"
    merges = (tmp_path / "vocab.bpe").read_text(encoding="utf-8").splitlines()
    assert merges[0].startswith("#version") and any(m.endswith("</w>") for m in merges[1:])


def test_train_rejects_missing_files(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.txt"):
        train_bpe([tmp_path / "nope.txt"], vocab_size=300, out_dir=tmp_path)


def test_tokenizer_digest_covers_the_tokenizers_files_and_only_those(gpt2, data_dir, tmp_path):
    """The digest shards record in meta.json: over a saved tokenizer's files it is sha256 of each
    file's name, NUL, bytes, NUL in name order (the value meta.json files already hold); files that
    are not the tokenizer's (a model's, beside it) leave it unchanged."""
    folder = tmp_path / "tokenizer"
    gpt2.save_pretrained(folder)
    reference = hashlib.sha256()
    for path in sorted(folder.iterdir()):
        reference.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    assert tokenizer_digest(folder) == reference.hexdigest()
    (folder / "config.json").write_text("{}")
    (folder / "model.safetensors").write_bytes(b"weights")
    assert tokenizer_digest(folder) == reference.hexdigest()
    with open(folder / "vocab.bpe", "a", encoding="utf-8") as merges:
        merges.write("x y\n")
    assert tokenizer_digest(folder) != reference.hexdigest()
    # A published vocabulary (no tokenizer_config.json): its encoder and merges.
    published = tmp_path / "published"
    published.mkdir()
    for name in ("encoder.json", "vocab.bpe"):
        shutil.copy(data_dir / "gpt2_bpe" / name, published / name)
    expected = hashlib.sha256()
    for name in ("encoder.json", "vocab.bpe"):
        expected.update(name.encode() + b"\0" + (published / name).read_bytes() + b"\0")
    (published / "README").write_text("not the tokenizer")
    assert tokenizer_digest(published) == expected.hexdigest()
