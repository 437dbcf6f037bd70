"""Fuzz targets for every kind of file gptkit reads: valid files, mutated, handed to the function the
commands call.

A target builds valid files into a folder once (a tiny model, a 300-token tokenizer, shards, a
checkpoint, the head of each public benchmark's file, ...), names the one file it damages, and
loads the folder the way the command does. hypothesis draws the damage from what happens to files
(cut short, bits flipped, bytes overwritten, inserted or dropped, invalid UTF-8) and, for the
structured formats, from what a hand edit or another program does (a JSON value of the wrong type,
missing and extra keys, huge, negative and NaN numbers, deep nesting; a safetensors header whose
length prefix lies). Each input must either load or raise gptkit's own error (a ValueError or
OSError) whose one-line message names the damaged file; another exception, a message that does not
say which file, or a load past :data:`TIME_LIMIT_S` is a failure.

hypothesis (not atheris): it runs in the test process on every platform PyTorch does, its seeded,
derandomized runs repeat exactly in the suite, and its strategies describe structured damage (a
JSON path, a header length) directly; the readers are Python over C libraries (json, safetensors,
numpy, pyarrow) whose own fuzzing is their projects', so coverage-guided byte mutation adds little.

Used by tests/test_fuzz_readers.py (a seeded slice) and benchmarks/fuzz_campaign.py (the campaign).
"""

from __future__ import annotations

import contextlib
import gzip
import json
import shutil
import signal
import struct
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hypothesis import strategies as st

TIME_LIMIT_S = 10.0  # an input that takes longer to load is a failure (a hang)

# Bytes that mean something to one reader or another: separators, quotes, a BOM, lone UTF-8 lead
# bytes, NUL, and numbers at the edges.
INTERESTING = [
    b"\t", b"\n", b"\r\n", b"\r", b'"', b",", b"\\", b"\x00", b"\xff", b"\xc3", b"\xed\xa0\x80",
    b"\xef\xbb\xbf", b" ", b"{", b"}", b"[", b"]", b"NaN", b"-1", b"1e999", b"99999999999999999999",
    b"</w>", b"#version: 0.2", b"\xc4\xa0",
]  # fmt: skip
DEEP = "\x00deep\x00"  # a JSON value replaced, once serialised, by arrays nested this deep
DEPTHS = [50, 1_000, 100_000]


class Hang(Exception):
    """A load ran past TIME_LIMIT_S."""


class Unexpected(Exception):
    """An input neither loaded nor raised gptkit's own error naming the file."""


@dataclass(frozen=True)
class Target:
    """``build(folder)`` writes valid files and returns the one to damage; ``load(folder)`` reads the
    folder as the command does. ``kind`` chooses the structured damage: json, safetensors, torch,
    lines, gzip, zstd or bytes (the byte-level damage applies to all)."""

    name: str
    build: Callable[[Path], Path]
    load: Callable[[Path], Any]
    kind: str = "bytes"
    needs_data: bool = False  # reads the head of a public dataset's file (GPTKIT_DATA)
    # What the message must name, when not the damaged file's name: a checkpoint's manifest lists
    # the checkpoint's other files, so a wrong entry is reported as that file not matching it.
    names: tuple[str, ...] = ()


# Damage ---------------------------------------------------------------------------------------------


def odd_values(depth: int = 2) -> st.SearchStrategy:
    """JSON values a reader does not expect: wrong types, numbers at the edges, NaN, deep nesting."""
    numbers = st.one_of(
        st.sampled_from([0, -1, 1, 2**31, 2**63, 2**64 + 1, -(2**63), 10**30, True, False]),
        st.integers(-(2**70), 2**70),
        st.floats(allow_nan=True, allow_infinity=True),
    )
    leaves = st.one_of(
        st.none(), numbers, st.text(max_size=12), st.sampled_from(["", "\x00", "..", "/", "uint17", DEEP])
    )
    if depth == 0:
        return leaves
    inner = odd_values(depth - 1)
    return st.one_of(
        leaves, st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=6), inner, max_size=3)
    )


def _paths(value: Any, prefix: tuple = ()) -> Iterator[tuple]:
    """Every path into a JSON value (object keys and array indices), the value's own first."""
    yield prefix
    children = (
        value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    )
    for key, child in children:
        if len(prefix) < 6:
            yield from _paths(child, (*prefix, key))


def _at(value: Any, path: tuple) -> Any:
    for key in path:
        value = value[key]
    return value


def _copy_tree(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _copy_tree(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_copy_tree(v) for v in value]
    return value


@st.composite
def mutated_tree(draw, tree: Any, deep_ok: bool = True) -> Any:
    """``tree`` (decoded JSON, or a torch state of dicts, lists and tensors) with one part replaced,
    removed or added to."""
    tree = _copy_tree(tree)
    paths = list(_paths(tree))
    # Few-key files first, then any path: a big vocabulary would otherwise draw only its leaves.
    path = draw(st.sampled_from(paths[:64]) | st.sampled_from(paths))
    action = draw(st.sampled_from(["replace", "replace", "delete", "add"]))
    values = odd_values() if deep_ok else odd_values().filter(lambda v: v != DEEP)
    if not path:
        return draw(values)
    parent, key = _at(tree, path[:-1]), path[-1]
    if action == "replace":
        parent[key] = draw(values)
    elif action == "delete":
        del parent[key]
    else:
        target = parent[key]
        if isinstance(target, dict):
            target[draw(st.text(max_size=8))] = draw(values)
        elif isinstance(target, list):
            target.insert(draw(st.integers(0, len(target))), draw(values))
        else:
            parent[key] = [target, draw(values)]
    return tree


def dump_json(value: Any, depth: int) -> bytes:
    text = json.dumps(value, ensure_ascii=False, allow_nan=True)
    return text.replace(json.dumps(DEEP), "[" * depth + "]" * depth).encode("utf-8", "surrogatepass")


@st.composite
def byte_damage(draw, data: bytes) -> bytes:
    """What happens to a file's bytes: cut short, bits flipped, bytes overwritten, inserted or removed."""
    n = len(data)
    action = draw(st.sampled_from(["truncate", "flip", "overwrite", "insert", "delete", "empty"]))
    if action == "empty" or n == 0:
        return b""
    at = draw(st.integers(0, n - 1) | st.integers(max(0, n - 16), n - 1) | st.integers(0, min(n - 1, 15)))
    if action == "truncate":
        return data[:at]
    if action == "flip":
        out = bytearray(data)
        for _ in range(draw(st.integers(1, 8))):
            position = draw(st.integers(0, n - 1)) if len(out) else 0
            out[position] ^= 1 << draw(st.integers(0, 7))
        return bytes(out)
    new = draw(st.sampled_from(INTERESTING) | st.binary(min_size=1, max_size=16))
    if action == "overwrite":
        return data[:at] + new + data[at + len(new) :]
    if action == "insert":
        return data[:at] + new + data[at:]
    return data[:at] + data[at + draw(st.integers(1, 64)) :]


@st.composite
def line_damage(draw, data: bytes) -> bytes:
    """A line dropped, repeated, cut or swapped for odd text; a field separator added or removed."""
    lines = data.split(b"\n")
    i = draw(st.integers(0, len(lines) - 1))
    action = draw(st.sampled_from(["drop", "repeat", "cut", "replace", "tab", "untab"]))
    if action == "drop":
        del lines[i]
    elif action == "repeat":
        lines.insert(i, lines[i])
    elif action == "cut":
        lines[i] = lines[i][: draw(st.integers(0, max(len(lines[i]) - 1, 0)))]
    elif action == "replace":
        lines[i] = draw(st.sampled_from(INTERESTING) | st.text(max_size=20).map(str.encode))
    elif action == "tab":
        lines[i] += b"\t" * draw(st.integers(1, 3))
    else:
        lines[i] = lines[i].replace(b"\t", b" ", 1).replace(b",", b" ", 1)
    return b"\n".join(lines)


@st.composite
def safetensors_damage(draw, data: bytes) -> bytes:
    """The 8-byte header length made to lie, or the JSON header itself edited (its length kept true)."""
    (length,) = struct.unpack("<Q", data[:8])
    header, body = json.loads(data[8 : 8 + length]), data[8 + length :]
    if draw(st.booleans()):
        lie = draw(st.sampled_from([0, 1, 2, length - 1, length + 1, len(data), 2**32, 2**63, 2**64 - 1]))
        return struct.pack("<Q", lie) + data[8:]
    edited = dump_json(draw(mutated_tree(header)), draw(st.sampled_from(DEPTHS)))
    return struct.pack("<Q", len(edited)) + edited + body


def damage(target: Target, original: bytes) -> st.SearchStrategy[bytes]:
    """The strategy of damaged versions of ``original`` for ``target``'s kind of file."""
    kinds = [byte_damage(original)]
    if target.kind == "json":
        tree = json.loads(original)
        kinds += [
            st.builds(dump_json, mutated_tree(tree), st.sampled_from(DEPTHS)),
            st.builds(dump_json, mutated_tree(tree), st.sampled_from(DEPTHS)),
        ]
    elif target.kind == "safetensors":
        kinds += [safetensors_damage(original)] * 2
    elif target.kind == "torch":
        kinds += [st.just(original).flatmap(lambda data: torch_damage(data))] * 2
    elif target.kind == "lines":
        kinds += [line_damage(original)] * 2
    elif target.kind == "gzip":
        plain = gzip.decompress(original)
        kinds += [(byte_damage(plain) | line_damage(plain)).map(lambda d: gzip.compress(d, mtime=0))]
    elif target.kind == "zstd":
        import zstandard

        plain = zstandard.ZstdDecompressor().decompress(original)
        compress = zstandard.ZstdCompressor().compress
        kinds += [(byte_damage(plain) | line_damage(plain)).map(compress)]
    return st.one_of(kinds)


def torch_damage(data: bytes) -> st.SearchStrategy[bytes]:
    """A torch.save file rewritten with one part of its state replaced, removed or added to."""
    import io

    import torch

    state = torch.load(io.BytesIO(data), weights_only=True)

    def save(tree: Any) -> bytes:
        buffer = io.BytesIO()
        torch.save(tree, buffer)
        return buffer.getvalue()

    return mutated_tree(state, deep_ok=False).map(save)


# Running one input ---------------------------------------------------------------------------------


@contextlib.contextmanager
def deadline(seconds: float) -> Iterator[None]:
    """Raise :class:`Hang` in the block after ``seconds``, and again every second after: an alarm
    that lands in a garbage-collector callback is printed and dropped by Python, not raised."""

    def expire(signum, frame):
        raise Hang(f"still loading after {seconds:.0f} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds, 1.0)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def try_input(target: Target, folder: Path, damaged: Path, data: bytes) -> str:
    """Write ``data`` as the damaged file, load the folder; "loaded" or "refused", else Unexpected."""
    original = damaged.read_bytes()
    damaged.write_bytes(data)
    try:
        with warnings.catch_warnings(), deadline(TIME_LIMIT_S):
            warnings.simplefilter("ignore")
            target.load(folder)
    except (ValueError, OSError) as e:
        if type(e) is UnicodeDecodeError:  # Python's own, naming no file
            raise Unexpected(f"{type(e).__name__}: {e}") from e
        message = str(e)
        if not any(name in message for name in (damaged.name, *target.names)) or "\n" in message.strip():
            raise Unexpected(
                f"{type(e).__name__} not naming {damaged.name} in one line: {message[:300]}"
            ) from e
        return "refused"
    except Hang as e:
        raise Unexpected(str(e)) from e
    except Exception as e:
        raise Unexpected(f"{type(e).__name__}: {str(e)[:300]}") from e
    finally:
        damaged.write_bytes(original)
    return "loaded"


def prepared(target: Target, root: Path) -> tuple[Path, Path]:
    """A folder of ``target``'s valid files under ``root`` and the file to damage; the valid files
    must load (else the damage would not be what fails)."""
    folder = root / target.name
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    damaged = target.build(folder)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        target.load(folder)
    return folder, damaged


# The files ------------------------------------------------------------------------------------------

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

    from gptkit.train.checkpointer import CheckpointConfig, Checkpointer
    from gptkit.train.distributed import DistributedContext
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
    from gptkit.train.checkpointer import CheckpointConfig, Checkpointer
    from gptkit.train.distributed import DistributedContext
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
    from gptkit.train.finetune import FinetuneConfig

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
    import os

    return Path(os.environ.get("GPTKIT_DATA", Path(__file__).resolve().parents[2] / "shared" / "data"))


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
