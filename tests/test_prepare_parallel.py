"""`prepare` with several worker processes writes the same shards as one; `combine` joins prepared parts."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from gptkit.data import tokenizing
from gptkit.data.corpus import corpus_files, read_pieces
from gptkit.data.prepare import prepare
from gptkit.data.shards import TokenShard, check_shard_tokenizer, combine
from gptkit.tokenizer import Tokenizer


def prepared(tokenizer: Path, files: list[Path], out: Path, **options) -> dict[str, bytes]:
    prepare(tokenizer, files, out, show_progress=False, **options)
    return {name: (out / name).read_bytes() for name in ("train.bin", "val.bin", "meta.json")}


def assert_same_shards(one: dict[str, bytes], two: dict[str, bytes]) -> None:
    for name in one:
        assert one[name] == two[name], f"{name} differs between 1 and 2 workers"


def test_two_workers_write_the_same_plain_text_shards_as_one(data_dir, small_tokenizer, tmp_path):
    books = [data_dir / "gutenberg" / name for name in ("pg11.txt", "pg16.txt")]
    one = prepared(small_tokenizer, books, tmp_path / "one", val_fraction=0.1, workers=1)
    two = prepared(small_tokenizer, books, tmp_path / "two", val_fraction=0.1, workers=2)
    assert_same_shards(one, two)
    assert json.loads(two["meta.json"])["counts"]["val"] > 0


def test_this_process_and_its_helpers_share_the_batches(data_dir, small_tokenizer, tmp_path, monkeypatch):
    """workers=N: this process tokenizes batches too (while the helpers hold TASKS_AHEAD each), and
    the interleaving of its batches with the helpers' still writes one worker's shards."""
    books = [data_dir / "gutenberg" / name for name in ("pg11.txt", "pg16.txt")]  # ~7 batches
    one = prepared(small_tokenizer, books, tmp_path / "one", workers=1)
    monkeypatch.setattr(tokenizing, "TASKS_AHEAD", 1)
    here = []  # texts tokenized in this process (the helpers run their own copy of the module)
    original = tokenizing._encode
    monkeypatch.setattr(
        tokenizing, "_encode", lambda encoder, text, ends: here.append(text) or original(encoder, text, ends)
    )
    n_pieces = sum(1 for _ in read_pieces(corpus_files(books), "text", 0.05))
    for workers in (2, 3):
        here.clear()
        assert_same_shards(one, prepared(small_tokenizer, books, tmp_path / f"w{workers}", workers=workers))
        # The helpers take the first batches; this process takes some of the rest, never all.
        assert 0 < len(here) < n_pieces


def test_two_workers_match_one_with_gpt1s_tokenizer(data_dir, tmp_path):
    pytest.importorskip("spacy")
    pytest.importorskip("ftfy")
    text = (data_dir / "gutenberg" / "pg11.txt").read_bytes()[:150_000]  # three blocks or so
    corpus = tmp_path / "alice.txt"
    corpus.write_bytes(text)
    one = prepared(data_dir / "gpt1_bpe", [corpus], tmp_path / "one", workers=1)
    two = prepared(data_dir / "gpt1_bpe", [corpus], tmp_path / "two", workers=2)
    assert_same_shards(one, two)
    assert json.loads(two["meta.json"])["dtype"] == "uint16"


def jsonl_corpus(data_dir: Path, path: Path) -> Path:
    """Every paragraph of a book as one JSONL document (about 3,000 documents, 250 kB)."""
    paragraphs = (data_dir / "gutenberg" / "pg16.txt").read_text(encoding="utf-8").split("\n\n")
    lines = [json.dumps({"text": p.strip(), "id": i}) if p.strip() else "" for i, p in enumerate(paragraphs)]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_two_workers_write_the_same_jsonl_shards_as_one(data_dir, small_tokenizer, tmp_path):
    docs = jsonl_corpus(data_dir, tmp_path / "docs.jsonl")
    options = dict(val_fraction=0.1)
    one = prepared(small_tokenizer, [docs], tmp_path / "one", workers=1, **options)
    two = prepared(small_tokenizer, [docs], tmp_path / "two", workers=2, **options)
    assert_same_shards(one, two)


def test_a_bad_jsonl_line_gives_the_same_error_with_workers(data_dir, small_tokenizer, tmp_path):
    docs = jsonl_corpus(data_dir, tmp_path / "docs.jsonl")
    lines = docs.read_text(encoding="utf-8").splitlines()
    bad_line = len(lines) - 10  # far past the first batches handed to the workers
    lines[bad_line - 1] = '{"body": "no text field"}'
    bad = tmp_path / "bad.jsonl"
    bad.write_text("\n".join(lines) + "\n", encoding="utf-8")
    messages = []
    for workers in (1, 2):
        out = tmp_path / f"out{workers}"
        with pytest.raises(ValueError, match=rf"bad.jsonl, line {bad_line}: no field 'text'") as error:
            prepare(small_tokenizer, [bad], out, show_progress=False, workers=workers)
        messages.append(str(error.value))
        assert not list(out.glob("*.bin*"))  # no shard, no temporary file left behind
    assert messages[0] == messages[1]
    with pytest.raises(ValueError, match="workers must be at least 1"):
        prepare(small_tokenizer, [bad], tmp_path / "out0", show_progress=False, workers=0)


def test_combining_two_halves_gives_the_concatenation_of_their_tokens(data_dir, small_tokenizer, tmp_path):
    halves = [data_dir / "gutenberg" / "pg11.txt"], [data_dir / "gutenberg" / "pg16.txt"]
    parts = [tmp_path / "part0", tmp_path / "part1"]
    for half, part in zip(halves, parts):
        prepare(small_tokenizer, half, part, val_fraction=0.1, show_progress=False, workers=1)
    meta = combine(parts, tmp_path / "all", show_progress=False)
    for split in ("train", "val"):
        expected = np.concatenate([np.asarray(TokenShard.open(part, split).tokens) for part in parts])
        combined = TokenShard.open(tmp_path / "all", split)
        assert np.array_equal(combined.tokens, expected)
        assert meta["counts"][split] == len(expected)
    # The same as preparing the whole corpus in one run, which has one document per file too.
    whole = prepared(small_tokenizer, [*halves[0], *halves[1]], tmp_path / "whole", val_fraction=0.1)
    for split in ("train", "val"):
        assert (tmp_path / "all" / f"{split}.bin").read_bytes() == whole[f"{split}.bin"]
    assert (tmp_path / "all" / "tokenizer").is_dir()
    # The combined shards record their tokenizer's digest, as prepared ones do: a foreign one is refused.
    part_meta = json.loads((parts[0] / "meta.json").read_text())
    assert meta["tokenizer_sha256"] == part_meta["tokenizer_sha256"]
    check_shard_tokenizer(tmp_path / "all", meta)
    Tokenizer.from_pretrained(data_dir / "gpt1_bpe").save_pretrained(tmp_path / "all" / "tokenizer")
    with pytest.raises(ValueError, match="not the tokenizer these shards were made with"):
        check_shard_tokenizer(tmp_path / "all", meta)


def test_combine_refuses_parts_with_different_tokenizers(data_dir, small_tokenizer, tmp_path):
    part = tmp_path / "part"
    prepare(small_tokenizer, [data_dir / "gutenberg" / "pg11.txt"], part, show_progress=False, workers=1)
    other = tmp_path / "other"
    shutil.copytree(part, other)
    merges = next(p for p in (other / "tokenizer").iterdir() if p.suffix in (".bpe", ".txt"))
    merges.write_text(merges.read_text(encoding="utf-8") + "x y\n", encoding="utf-8")
    with pytest.raises(ValueError, match="not the same tokenizer"):
        combine([part, other], tmp_path / "all", show_progress=False)
    with pytest.raises(ValueError, match="other than the parts"):
        combine([part, other], part, show_progress=False)
