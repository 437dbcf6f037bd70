"""Fuzz targets for every kind of file gptkit reads, each a :class:`~gptkit.testing.fuzz.Target`.

A target builds valid files into a folder once (a tiny model, a 300-token tokenizer, shards, a
checkpoint, the head of each public benchmark's file, ...), names the one file it damages, and
loads the folder the way the command does; :mod:`gptkit.testing.fuzz` damages and loads it.
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gptkit.testing.fuzz import Target

SAMPLE_TEXT = (
    "It was the best of times, it was the worst of times, it was the age of wisdom, it was the age of "
    "foolishness, it was the epoch of belief, it was the epoch of incredulity, it was the season of "
    "Light, it was the season of Darkness, it was the spring of hope, it was the winter of despair.\n"
) * 8


def _tiny_model(folder: Path) -> None:
    import torch

    from gptkit import GPT, GPTConfig

    torch.manual_seed(0)
    GPT(GPTConfig.from_preset("tiny", n_layer=1, context_length=16, vocab_size=64)).save_pretrained(folder)


def _load_model(folder: Path) -> None:
    from gptkit import GPT

    GPT.from_pretrained(folder)


def _tokenizer(folder: Path, style: str = "bytelevel") -> None:
    from gptkit.tokenizer import train_bpe

    corpus = folder.parent / f".{folder.name}.corpus.txt"
    corpus.write_text(SAMPLE_TEXT, encoding="utf-8")
    train_bpe([corpus], vocab_size=300, out_dir=folder, style=style, show_progress=False)
    corpus.unlink()
    (folder / "tokenizer.json").unlink(missing_ok=True)  # transformers' file: gptkit never reads it


def _load_tokenizer(folder: Path) -> None:
    from gptkit.tokenizer import Tokenizer

    Tokenizer.from_pretrained(folder).encode("the worst of times")


def _published_names(folder: Path, style: str, encoder: str, merges: str) -> None:
    """The tokenizer under a release's own file names, with no tokenizer_config.json."""
    _tokenizer(folder, style)
    config = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
    (folder / config["files"]["encoder"]).rename(folder / f".{encoder}")
    (folder / config["files"]["merges"]).rename(folder / f".{merges}")
    for path in folder.iterdir():
        if not path.name.startswith("."):
            path.unlink()
    (folder / f".{encoder}").rename(folder / encoder)
    (folder / f".{merges}").rename(folder / merges)


def tokenizer_target(name: str, file: str, kind: str, style: str = "bytelevel", names=None) -> Target:
    def build(folder: Path) -> Path:
        if names:
            _published_names(folder, style, *names)
        else:
            _tokenizer(folder, style)
        return folder / file

    return Target(name, build, _load_tokenizer, kind)


def _shards(folder: Path) -> None:
    from gptkit.data.prepare import prepare

    _tokenizer(folder / "vocabulary")
    corpus = folder / "corpus.txt"
    corpus.write_text(SAMPLE_TEXT, encoding="utf-8")
    prepare(folder / "vocabulary", [corpus], folder / "shards", val_fraction=0.2, show_progress=False)


def _load_shards(folder: Path) -> None:
    from gptkit.data.shards import TokenShard, check_shard_tokenizer

    for split in ("train", "val"):
        shard = TokenShard.open(folder / "shards", split)
        check_shard_tokenizer(folder / "shards", shard.meta)
        if shard.n_windows(4):
            shard.window(0, 4)


def _checkpoint(folder: Path) -> None:
    """A run directory with one checkpoint written by gptkit's checkpointer."""
    import torch

    from gptkit.train.checkpoints.checkpointer import CheckpointConfig, Checkpointer
    from gptkit.train.distributed.processes import DistributedContext
    from gptkit.train.rundir import RunDir

    model = torch.nn.Linear(4, 4)
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.ones(1, 4)).sum().backward()
    optimizer.step()
    run = RunDir(folder / "run")
    checkpointer = Checkpointer(
        run,
        lambda directory, state: torch.save(state, directory / "model.pt"),
        CheckpointConfig(every=1),
        DistributedContext(),
    )
    checkpointer.save(1, model, [optimizer], {"data": {"epoch": 0, "position": 3}, "plan": {}})


def _latest_checkpoint(folder: Path) -> None:
    from gptkit.train.checkpoints.checkpointer import CheckpointConfig, Checkpointer
    from gptkit.train.distributed.processes import DistributedContext
    from gptkit.train.rundir import RunDir

    Checkpointer(RunDir(folder / "run"), None, CheckpointConfig(), DistributedContext()).latest()


def _train_state(folder: Path) -> None:
    from gptkit.io import read_train_state

    read_train_state(folder / "run" / "checkpoints" / "step-0000001" / "train_state.pt")


def _run_config(folder: Path) -> Path:
    from gptkit.io import write_json

    write_json(folder / "run_config.json", {"command": "pretrain", "resolved": {"max_steps": 24}})
    return folder / "run_config.json"


def _resolved_max_steps(folder: Path) -> None:
    from gptkit.train.rundir import RunDir

    RunDir(folder).resolved_max_steps()


def _suite_settings(folder: Path) -> dict:
    import dataclasses

    from gptkit.paper.suite import SuiteConfig, _settings
    from gptkit.train.finetune.tasks import FinetuneConfig

    template = FinetuneConfig()
    template = dataclasses.replace(template, model=dataclasses.replace(template.model, init="model"))
    return _settings(SuiteConfig(finetune=template))


def _suite(folder: Path) -> Path:
    from gptkit.paper.suite import check_settings

    check_settings(folder, _suite_settings(folder))
    return folder / "suite.json"


def _check_suite(folder: Path) -> None:
    from gptkit.paper.suite import check_settings

    check_settings(folder, _suite_settings(folder))


def _config_file(suffix: str) -> Callable[[Path], Path]:
    def build(folder: Path) -> Path:
        values = {"model": {"n_layer": 2, "d_model": 64}, "training": {"lr": 3e-4, "max_steps": 100}}
        values.update(context_length=128, seed=1, schedule="cosine")
        path = folder / f"pretrain{suffix}"
        if suffix == ".json":
            path.write_text(json.dumps(values, indent=2), encoding="utf-8")
        else:
            import yaml

            path.write_text(yaml.safe_dump(values), encoding="utf-8")
        return path

    return build


def _read_config(suffix: str) -> Callable[[Path], None]:
    def load(folder: Path) -> None:
        from gptkit.cli import _build_configs, build_parser

        path = folder / f"pretrain{suffix}"
        args = build_parser().parse_args(["pretrain", "--config", str(path), "--data", str(folder)])
        _build_configs(args.command_spec, args)

    return load


def _adapter(folder: Path) -> None:
    import torch

    from gptkit.model.lora import LoRASettings, write_adapter

    torch.manual_seed(0)
    state = {}
    for layer in ("h.0.attn.c_attn", "h.0.attn.c_proj"):
        module = layer.replace("h.0.", "h.0.")
        state[f"base_model.model.transformer.{module}.lora_A.weight"] = torch.randn(4, 32)
        state[f"base_model.model.transformer.{module}.lora_B.weight"] = torch.zeros(
            96 if "c_attn" in layer else 32, 4
        )
    write_adapter(folder, LoRASettings(4, 8.0, ("c_attn", "c_proj")), "base", state)


def _read_adapter(folder: Path) -> None:
    from gptkit.model.lora import read_adapter

    read_adapter(folder)


# The public benchmarks: a few rows of each file as published, read by the registry's reader.
DATASET_FILES = {
    "sst2": ["sst2/stsa.binary.dev"],
    "cola": ["cola/in_domain_dev.tsv"],
    "rte": ["rte/dev.tsv"],
    "mrpc": ["mrpc/msr-para-val.tsv"],
    "stsb": ["sts_benchmark/sts-dev.csv"],
    "story_cloze": ["story_cloze_2016/cloze_test_test__spring2016 - cloze_test_ALL_test.csv"],
    "mctest": ["mctest/mc500.dev.statements.tsv", "mctest/mc500.dev.ans"],
    "snli": ["snli/snli_1.0/snli_1.0_dev.jsonl"],
    "qnli": ["qnli/dev.tsv"],
    "scitail": ["scitail/SciTailV1.1/tsv_format/scitail_1.0_dev.tsv"],
    "qqp": ["qqp/dev.tsv"],
    "race": ["race/RACE/dev/middle/13.txt", "race/RACE/dev/high"],
}


def _data_dir() -> Path:
    """GPTKIT_DATA, else the shared/data folder beside this source checkout (4 levels above this file)."""
    return Path(os.environ.get("GPTKIT_DATA", Path(__file__).resolve().parents[4] / "shared" / "data"))


def dataset_target(name: str, damaged_index: int = 0) -> Target:
    files = DATASET_FILES[name]

    def build(folder: Path) -> Path:
        for relative in files:
            source, target = _data_dir() / relative, folder / relative
            target.parent.mkdir(parents=True, exist_ok=True)
            if source.is_dir():  # a RACE level: one passage file of it
                target.mkdir(exist_ok=True)
                first = sorted(source.glob("*.txt"))[0]
                shutil.copyfile(first, target / first.name)
            elif name == "race":
                shutil.copyfile(source, target)
            else:
                with open(source, "rb") as f:
                    target.write_bytes(b"".join(line for _, line in zip(range(12), f)))
        return folder / files[damaged_index]

    split = "test" if name == "story_cloze" else "dev"
    kind = "json" if name == "race" else "lines"

    def load(folder: Path) -> None:
        from gptkit.data.registry import read_dataset

        read_dataset(name, split, folder)

    suffix = "" if damaged_index == 0 else "_" + Path(files[damaged_index]).suffix.lstrip(".")
    return Target(f"dataset_{name}{suffix}", build, load, kind, needs_data=True)


def corpus_target(name: str, filename: str, kind: str) -> Target:
    rows = [json.dumps({"text": line, "id": i}) for i, line in enumerate(SAMPLE_TEXT.splitlines())]

    def build(folder: Path) -> Path:
        path = folder / filename
        jsonl = ("\n".join(rows) + "\n").encode()
        if filename.endswith(".parquet"):
            import pyarrow as pa
            import pyarrow.parquet as pq

            pq.write_table(pa.table({"text": SAMPLE_TEXT.splitlines(), "id": list(range(8))}), path)
        elif filename.endswith(".gz"):
            path.write_bytes(gzip.compress(jsonl if ".jsonl" in filename else SAMPLE_TEXT.encode(), mtime=0))
        elif filename.endswith(".zst"):
            import zstandard

            path.write_bytes(
                zstandard.ZstdCompressor().compress(jsonl if ".jsonl" in filename else SAMPLE_TEXT.encode())
            )
        else:
            path.write_bytes(jsonl if filename.endswith(".jsonl") else SAMPLE_TEXT.encode())
        return path

    def load(folder: Path) -> None:
        from gptkit.data.corpus import check_corpus_file, corpus_files, read_pieces

        files = corpus_files([folder / filename])
        for file in files:
            check_corpus_file(file, "text")
        for _ in read_pieces(files, "text", 0.1):
            pass

    return Target(name, build, load, kind)


def _model_file(file: str) -> Callable[[Path], Path]:
    def build(folder: Path) -> Path:
        _tiny_model(folder)
        return folder / file

    return build


def _returning(build: Callable[[Path], Any], file: str) -> Callable[[Path], Path]:
    def wrapped(folder: Path) -> Path:
        build(folder)
        return folder / file

    return wrapped


_STEP = "run/checkpoints/step-0000001"
TARGETS: list[Target] = [
    Target("model_config_json", _model_file("config.json"), _load_model, "json"),
    Target("model_safetensors", _model_file("model.safetensors"), _load_model, "safetensors"),
    tokenizer_target("tokenizer_config_json", "tokenizer_config.json", "json"),
    tokenizer_target("gpt2_encoder_json", "encoder.json", "json", names=("encoder.json", "vocab.bpe")),
    tokenizer_target("gpt2_vocab_bpe", "vocab.bpe", "lines", names=("encoder.json", "vocab.bpe")),
    tokenizer_target("hub_vocab_json", "vocab.json", "json", names=("vocab.json", "merges.txt")),
    tokenizer_target("hub_merges_txt", "merges.txt", "lines", names=("vocab.json", "merges.txt")),
    tokenizer_target(
        "gpt1_encoder_json", "encoder_bpe_40000.json", "json", "gpt1", ("encoder_bpe_40000.json", "vocab_40000.bpe")
    ),
    tokenizer_target(
        "gpt1_vocab_bpe", "vocab_40000.bpe", "lines", "gpt1", ("encoder_bpe_40000.json", "vocab_40000.bpe")
    ),
    Target("shard_meta_json", _returning(_shards, "shards/meta.json"), _load_shards, "json"),
    Target("shard_bin", _returning(_shards, "shards/train.bin"), _load_shards),
    Target("train_state_pt", _returning(_checkpoint, f"{_STEP}/train_state.pt"), _train_state, "torch"),
    Target("checkpoint_manifest_json", _returning(_checkpoint, f"{_STEP}/manifest.json"), _latest_checkpoint, "json", names=("step-0000001",)),
    Target("checkpoint_latest_json", _returning(_checkpoint, "run/checkpoints/latest.json"), _latest_checkpoint, "json"),
    Target("run_config_json", _run_config, _resolved_max_steps, "json"),
    Target("suite_json", _suite, _check_suite, "json"),
    Target("config_yaml", _config_file(".yaml"), _read_config(".yaml"), "lines"),
    Target("config_json", _config_file(".json"), _read_config(".json"), "json"),
    Target("lora_adapter_config_json", _returning(_adapter, "adapter_config.json"), _read_adapter, "json"),
    Target("lora_adapter_safetensors", _returning(_adapter, "adapter_model.safetensors"), _read_adapter, "safetensors"),
    *(dataset_target(name) for name in DATASET_FILES),
    dataset_target("mctest", 1),
    corpus_target("corpus_text", "corpus.txt", "lines"),
    corpus_target("corpus_jsonl", "corpus.jsonl", "lines"),
    corpus_target("corpus_parquet", "corpus.parquet", "bytes"),
    corpus_target("corpus_txt_gz", "corpus.txt.gz", "gzip"),
    corpus_target("corpus_jsonl_zst", "corpus.jsonl.zst", "zstd"),
]  # fmt: skip
