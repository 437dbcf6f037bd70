"""Corpus → token shards on disk → windows of ``context_length`` tokens, drawn without replacement.

``prepare`` streams text files through a tokenizer into ``train.bin`` and ``val.bin`` (flat numpy
arrays, uint16 when the vocabulary fits, else uint32) with ``meta.json`` beside them and a copy of
the tokenizer in ``tokenizer/``. Memory does not grow with the corpus: files are read in blocks
of lines and each block's ids are appended to the shard at once.

``WindowSampler`` reads a shard by memory map. An epoch is a seeded permutation of the shard's
non-overlapping windows; every optimizer step takes the next ``batch_size`` of them, and rank r of
W takes its contiguous share, so the global batch is the same for any number of processes (the
sampler is :class:`gptkit.data.sampler.EpochSampler`, which fine-tuning's examples use too).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from gptkit.data.sampler import EpochSampler
from gptkit.io import read_json_object, write_json
from gptkit.tokenizer import END_OF_TEXT, Tokenizer

META_NAME = "meta.json"
BLOCK_BYTES = 1 << 16  # text is tokenized a block of lines (about 64 kB) at a time


def _decode(lines: list[bytes]) -> str:
    """UTF-8 text with Windows line ends made plain newlines (invalid bytes become U+FFFD)."""
    return b"".join(lines).decode("utf-8", errors="replace").replace("\r\n", "\n")


def _text_blocks(path: Path, jsonl_field: str | None, val_fraction: float) -> Iterator[tuple[str, str, int]]:
    """Yield (text, split, bytes read) in blocks of whole lines, or one document per JSONL line.

    Plain text: the lines after the first (1 - val_fraction) of the file's bytes are "val".
    JSONL: every ⌈1/val_fraction⌉-th document is "val".
    """
    with open(path, "rb") as f:
        if jsonl_field is None:
            boundary = (1.0 - val_fraction) * path.stat().st_size if val_fraction else float("inf")
            block: list[bytes] = []
            block_bytes, position, split = 0, 0, "train"
            for line in f:
                line_split = "val" if position >= boundary else "train"
                if block and (line_split != split or block_bytes >= BLOCK_BYTES):
                    yield _decode(block), split, block_bytes
                    block, block_bytes = [], 0
                split = line_split
                block.append(line)
                block_bytes += len(line)
                position += len(line)
            if block:
                yield _decode(block), split, block_bytes
            return
        every = max(round(1 / val_fraction), 1) if val_fraction else 0
        document = 0
        for line_number, line in enumerate(f, start=1):
            if not line.strip():
                yield "", "train", len(line)
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}, line {line_number}: not valid JSON ({e.msg})") from e
            if not isinstance(record, dict) or jsonl_field not in record:
                raise ValueError(f"{path}, line {line_number}: no field {jsonl_field!r}")
            if not isinstance(record[jsonl_field], str):
                raise ValueError(f"{path}, line {line_number}: field {jsonl_field!r} is not a string")
            document += 1
            yield record[jsonl_field], "val" if every and document % every == 0 else "train", len(line)


def _dtype_for(vocab: int) -> np.dtype:
    return np.dtype(np.uint16) if vocab <= np.iinfo(np.uint16).max + 1 else np.dtype(np.uint32)


def prepare(
    tokenizer_dir: str | Path,
    files: Sequence[str | Path],
    out_dir: str | Path,
    val_fraction: float = 0.05,
    jsonl_field: str | None = None,
    show_progress: bool = True,
) -> dict:
    """Tokenize ``files`` into ``out_dir`` (train.bin, val.bin, meta.json, tokenizer/).

    Plain text files are one document each; the last ``val_fraction`` of every document (by bytes,
    whole lines) goes to the validation split. With ``jsonl_field``, every line of a file is a
    document (that field's text) and every ⌈1/val_fraction⌉-th document is held out. Documents are
    separated by the end-of-text token when the tokenizer has one.
    """
    if not 0.0 <= val_fraction < 1.0:
        raise ValueError(f"val_fraction must be in [0, 1), got {val_fraction}")
    files = [Path(f) for f in files]
    missing = [str(f) for f in files if not f.is_file()]
    if missing:
        raise FileNotFoundError(f"corpus file(s) not found: {', '.join(missing)}")
    if not files:
        raise ValueError("no corpus files given")
    tokenizer = Tokenizer.from_pretrained(tokenizer_dir)
    dtype = _dtype_for(len(tokenizer))
    separator = [tokenizer.special_tokens[END_OF_TEXT]] if END_OF_TEXT in tokenizer.special_tokens else []
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(out_dir / "tokenizer")

    counts = {"train": 0, "val": 0}
    tmp_paths = {split: out_dir / f".{split}.bin.tmp" for split in counts}
    handles = {split: open(path, "wb") for split, path in tmp_paths.items()}
    total_bytes = sum(f.stat().st_size for f in files)
    try:
        with tqdm(
            total=total_bytes, unit="B", unit_scale=True, desc="tokenizing", disable=not show_progress
        ) as bar:
            for path in files:
                for text, split, n_bytes in _text_blocks(path, jsonl_field, val_fraction):
                    ids = tokenizer.encode(text) if text else []
                    if jsonl_field is not None and text:
                        ids = ids + separator  # one document per line
                    array = np.asarray(ids, dtype=dtype)
                    handles[split].write(array.tobytes())
                    counts[split] += array.size
                    bar.update(n_bytes)
                if jsonl_field is None and separator:  # one document per file
                    handles["train"].write(np.asarray(separator, dtype=dtype).tobytes())
                    counts["train"] += len(separator)
    except BaseException:
        for handle in handles.values():
            handle.close()
        for path in tmp_paths.values():
            path.unlink(missing_ok=True)
        raise
    for split, handle in handles.items():
        handle.close()
        os.replace(tmp_paths[split], out_dir / f"{split}.bin")
    meta = {
        "tokenizer": "tokenizer",
        "tokenizer_style": tokenizer.style,
        "vocab_size": tokenizer.vocab_size,
        "n_special": tokenizer.n_special,
        "dtype": dtype.name,
        "counts": counts,
        "files": [str(f) for f in files],
        "val_fraction": val_fraction,
        "jsonl_field": jsonl_field,
    }
    write_json(out_dir / META_NAME, meta)
    return meta


_REPREPARE = "re-run `gptkit prepare`"
# The fields of meta.json that reading and training from shards rely on, and their JSON types.
_META_FIELDS = {
    "counts": dict,
    "dtype": str,
    "vocab_size": int,
    "n_special": int,
    "tokenizer_style": str,
    "tokenizer": str,
}


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _fits(value: object, kind: type) -> bool:
    return _is_count(value) if kind is int else isinstance(value, kind)


def read_meta(data_dir: str | Path) -> dict:
    """``meta.json`` of a prepared directory, checked field by field; damage is a ValueError naming it."""
    meta_path = Path(data_dir) / META_NAME
    if not meta_path.exists():
        raise FileNotFoundError(f"{data_dir}: no {META_NAME}; run `gptkit prepare` first")
    try:
        meta = read_json_object(meta_path)
    except ValueError as e:
        raise ValueError(f"{e}; {_REPREPARE}") from e
    for name, kind in _META_FIELDS.items():
        if name not in meta:
            raise ValueError(f"{meta_path}: missing field {name!r}; {_REPREPARE}")
        if not _fits(meta[name], kind):
            expected = {dict: "an object", str: "a string", int: "a non-negative integer"}[kind]
            raise ValueError(
                f"{meta_path}: field {name!r} is {meta[name]!r}, expected {expected}; {_REPREPARE}"
            )
    counts = meta["counts"]
    for split in ("train", "val"):
        if not _is_count(counts.get(split)):
            raise ValueError(
                f"{meta_path}: counts.{split} is {counts.get(split)!r}, expected a token count; {_REPREPARE}"
            )
    try:
        kind = np.dtype(meta["dtype"]).kind
    except TypeError:
        kind = None
    if kind != "u":
        raise ValueError(
            f"{meta_path}: dtype {meta['dtype']!r} is not an unsigned integer type numpy knows "
            f"(expected 'uint16' or 'uint32'); {_REPREPARE}"
        )
    return meta


@dataclass
class TokenShard:
    """A prepared split, memory-mapped."""

    tokens: np.ndarray
    meta: dict

    @classmethod
    def open(cls, data_dir: str | Path, split: str) -> TokenShard:
        """Map ``{split}.bin``; its size must be exactly the count in ``meta.json``."""
        data_dir = Path(data_dir)
        meta = read_meta(data_dir)
        if split not in meta["counts"]:
            raise ValueError(f"{data_dir / META_NAME}: no count for the split {split!r}")
        count, dtype = meta["counts"][split], np.dtype(meta["dtype"])
        path = data_dir / f"{split}.bin"
        if not path.exists():
            if count == 0:
                return cls(tokens=np.zeros(0, dtype=dtype), meta=meta)
            raise FileNotFoundError(
                f"{path}: no such file ({META_NAME} counts {count:,} tokens); {_REPREPARE}"
            )
        size, expected = path.stat().st_size, count * dtype.itemsize
        if size != expected:
            # Shorter: cut off while written or copied. Longer: from another run of prepare than meta.json.
            problem = "truncated" if size < expected else f"longer than {META_NAME} says"
            raise ValueError(
                f"{path}: holds {size:,} bytes, but {META_NAME} counts {count:,} {dtype.name} tokens, "
                f"{expected:,} bytes: the shard is {problem}; {_REPREPARE}"
            )
        if count == 0:  # np.memmap cannot map an empty file
            return cls(tokens=np.zeros(0, dtype=dtype), meta=meta)
        return cls(tokens=np.memmap(path, dtype=dtype, mode="r", shape=(count,)), meta=meta)

    def n_windows(self, context_length: int) -> int:
        return len(self.tokens) // context_length

    def window(self, index: int, context_length: int) -> torch.Tensor:
        start = index * context_length
        return torch.from_numpy(self.tokens[start : start + context_length].astype(np.int64))


class WindowSampler:
    """Non-overlapping windows of ``context_length`` tokens, each used once per epoch, in seeded order
    (the order and the split between processes are :class:`gptkit.data.sampler.EpochSampler`'s)."""

    def __init__(
        self,
        shard: TokenShard,
        context_length: int,
        batch_size: int,
        seed: int,
        rank: int = 0,
        world_size: int = 1,
    ):
        self.shard, self.context_length = shard, context_length
        windows = f"windows of {context_length} tokens in the training split"
        try:
            self.sampler = EpochSampler(
                shard.n_windows(context_length), batch_size, seed, rank, world_size, items=windows
            )
        except ValueError as e:
            raise ValueError(f"{e}: use a larger corpus, a shorter context or a smaller batch") from e

    def next_batch(self) -> torch.Tensor:
        """This rank's share of the next global batch: (batch_size / world_size, context_length) ids."""
        indices = self.sampler.next_indices()
        return torch.stack([self.shard.window(i, self.context_length) for i in indices])

    def state_dict(self) -> dict:
        return self.sampler.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.sampler.load_state_dict(state)


def eval_windows(shard: TokenShard, context_length: int, max_windows: int | None = None) -> torch.Tensor:
    """The validation windows, in order (evaluation must see the same tokens every time)."""
    n = shard.n_windows(context_length)
    if max_windows is not None:
        n = min(n, max_windows)
    if n == 0:
        return torch.zeros(0, context_length, dtype=torch.long)
    return torch.stack([shard.window(i, context_length) for i in range(n)])
