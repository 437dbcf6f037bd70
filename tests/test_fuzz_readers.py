"""Every reader fuzzed, a seeded slice: each kind of file gptkit reads, damaged the ways
src/gptkit/testing/fuzz_targets.py draws, either loads or raises gptkit's own error naming the file in one line
(never another exception, never a hang). benchmarks/fuzz_campaign.py runs the same targets with
10,000 inputs each."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, given, seed, settings

from gptkit.testing.fuzz import Target, damage, prepared, try_input
from gptkit.testing.fuzz_targets import TARGETS

# A few inputs a target, the same ones every run: the suite's seconds are shared.
SLICE = settings(
    max_examples=12,
    derandomize=True,
    database=None,
    deadline=None,
    phases=[Phase.generate],
    suppress_health_check=list(HealthCheck),
)


@pytest.mark.parametrize("target", TARGETS, ids=lambda t: t.name)
def test_damaged_input_loads_or_names_the_file(target: Target, tmp_path_factory, request):
    if target.needs_data:
        request.getfixturevalue("data_dir")  # skips without the public data
    folder, damaged = prepared(target, tmp_path_factory.mktemp("fuzz"))
    original = damaged.read_bytes()

    @SLICE
    @seed(0)
    @given(data=damage(target, original))
    def loads_or_refuses(data: bytes) -> None:
        try_input(target, folder, damaged, data)

    loads_or_refuses()


# The damage the campaign found, each pinned down: the message names the file and what is wrong.


def _edit_json(edit):
    def damaged(data: bytes) -> bytes:
        value = json.loads(data)
        edit(value)
        return json.dumps(value).encode()

    return damaged


def _set(path: tuple, value):
    def edit(tree):
        for key in path[:-1]:
            tree = tree[key]
        tree[path[-1]] = value

    return _edit_json(edit)


FOUND = [
    # (target, damage, words the message holds besides the file's name)
    ("shard_meta_json", lambda data: b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
    ("shard_meta_json", _set(("tokenizer",), "tok\nenizer"), "field 'tokenizer' is 'tok\\nenizer', expected"),
    ("shard_meta_json", _set(("dtype",), "0\u00d2"), "is not an unsigned integer type numpy knows"),
    ("dataset_cola", lambda data: data.replace(b"\n", b"\n\xe9", 1), "line 2, column 1: byte 0xe9 is not UTF-8"),
    ("dataset_story_cloze", lambda data: data[:60] + b"\xff" + data[60:], "line 1, column 61: byte 0xff"),
    ("dataset_mctest_ans", lambda data: b"A\tB\n" + data, "line 1: 2 answers, expected 4"),
    ("corpus_parquet", lambda data: data[:4] + b"\0" * 40 + data[44:], "cannot be read as parquet"),
    ("tokenizer_config_json", _set(("special_tokens",), 7), "special_tokens is not an object or a list"),
    ("tokenizer_config_json", _set(("style",), ["bytelevel"]), "style ['bytelevel'] is not one of"),
    ("tokenizer_config_json", _set(("files", "encoder"), "gone.json"), "files.encoder names"),
    ("gpt1_encoder_json", _set(("the</w>",), [1]), "has id [1], expected an integer"),
    ("gpt2_vocab_bpe", lambda data: data + b"q z\n", "1 byte sequences made by the merges in"),
    ("checkpoint_manifest_json", _set(("files", "model.pt"), None), "unreadable manifest.json"),
    ("run_config_json", _set(("resolved",), [24]), "field resolved.max_steps is None"),
    ("suite_json", _set(("train",), "lr"), "field 'train' is not an object"),
    ("model_config_json", _set(("gptkit", "n_layer"), 2**31), "n_layer is 2147483648, but"),
    ("model_config_json", _set(("gptkit", "vocab_size"), 64.0), "vocab_size must be an integer, got 64.0"),
    ("model_config_json", _set(("gptkit", "dropout"), json.loads("[" * 500 + "]" * 500)),
     "nested more than 100 deep"),
    ("lora_adapter_config_json", _set(("target_modules",), ["c_attn\nx"]), "got 'c_attn\\nx'"),
    ("lora_adapter_config_json", _set(("lora_alpha",), "NaN"), "alpha must be a finite number"),
    ("lora_adapter_config_json", _set(("r",), float("inf")), "bad LoRA settings (cannot convert float infinity"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("name", "damaged", "words"), FOUND, ids=[f"{n}-{i}" for i, (n, _, _) in enumerate(FOUND)]
)
def test_damage_the_campaign_found_is_named(name, damaged, words, tmp_path, request):
    target = next(t for t in TARGETS if t.name == name)
    if target.needs_data:
        request.getfixturevalue("data_dir")
    folder, path = prepared(target, tmp_path)
    path.write_bytes(damaged(path.read_bytes()))
    with pytest.raises((ValueError, OSError)) as error:
        target.load(folder)
    message = str(error.value)
    assert path.name in message and words in message and "\n" not in message, message


def test_operations_md_shows_the_campaigns_counts():
    """docs/operations.md's table is benchmarks/fuzz_campaign.py's rendering of results/fuzz.json."""
    repo = Path(__file__).resolve().parents[1]
    sys.path.insert(0, str(repo / "benchmarks"))
    try:
        import fuzz_campaign
    finally:
        sys.path.remove(str(repo / "benchmarks"))
    record = json.loads((repo / "results" / "fuzz.json").read_text(encoding="utf-8"))
    assert all(row["inputs"] >= 10_000 for row in record["targets"]), "a campaign of fewer inputs"
    assert fuzz_campaign.render(record) in (repo / "docs" / "operations.md").read_text(encoding="utf-8")
