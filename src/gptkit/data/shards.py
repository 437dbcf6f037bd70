"""A prepared shard folder (``gptkit prepare``'s output): ``meta.json`` checked, each split
memory-mapped, and several folders combined into one.

A folder holds ``train.bin`` and ``val.bin`` (flat arrays of token ids, uint16 when the vocabulary
fits, else uint32), ``meta.json`` (the counts, the dtype, the tokenizer's fingerprint) and the
tokenizer in ``tokenizer/``. :mod:`gptkit.data.prepare` writes it; :mod:`gptkit.data.windows`
draws training windows from it.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from gptkit.io import read_json_object, write_json
from gptkit.progress import hidden_unless_terminal
from gptkit.tokenizer import tokenizer_digest

META_NAME = "meta.json"


def check_shard_tokenizer(data_dir: str | Path, meta: dict) -> None:
    """Refuse shards whose ``tokenizer/`` folder is not the one they were made with (shards written
    before the fingerprint existed are taken as they are)."""
    expected, name = meta.get("tokenizer_sha256"), meta.get("tokenizer", "tokenizer")
    if not (isinstance(name, str) and name.isprintable() and name not in ("", ".", "..")) or (
        "/" in name or "\\" in name
    ):
        raise ValueError(
            f"{Path(data_dir) / META_NAME}: field 'tokenizer' is {name!r}, expected the name of the "
            f"tokenizer's folder beside it; {_REPREPARE}"
        )
    folder = Path(data_dir) / name
    if expected and tokenizer_digest(folder) != expected:
        raise ValueError(
            f"{folder}: not the tokenizer these shards were made with (meta.json's tokenizer_sha256 "
            f"differs): training would read every token as another; re-run `gptkit prepare`"
        )


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
    except (TypeError, ValueError):  # ValueError: a string numpy reads as a format it refuses
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


def _check_same_tokenizer(shard_dirs: list[Path], metas: list[dict]) -> None:
    first_dir, first = shard_dirs[0], metas[0]
    first_digest = tokenizer_digest(first_dir / first["tokenizer"])
    for directory, meta in zip(shard_dirs[1:], metas[1:]):
        for name in ("tokenizer_style", "vocab_size", "n_special", "dtype"):
            if meta[name] != first[name]:
                raise ValueError(
                    f"{directory / META_NAME}: {name} is {meta[name]!r}, but {first_dir / META_NAME} has "
                    f"{first[name]!r}: only shards prepared with the same tokenizer can be combined"
                )
        if tokenizer_digest(directory / meta["tokenizer"]) != first_digest:
            raise ValueError(
                f"{directory / meta['tokenizer']}: not the same tokenizer as {first_dir / first['tokenizer']}: "
                "only shards prepared with the same tokenizer can be combined"
            )


def _agreed(metas: list[dict], name: str) -> object:
    """A meta.json field shared by every part, or None where they differ."""
    values = [meta.get(name) for meta in metas]
    return values[0] if all(value == values[0] for value in values) else None


def combine(shard_dirs: Sequence[str | Path], out_dir: str | Path, show_progress: bool = True) -> dict:
    """One training set from the shards of several ``prepare`` runs (one per part of a corpus).

    ``out_dir/train.bin`` is the parts' ``train.bin`` one after the other, in the order given, and
    likewise ``val.bin``; ``meta.json`` sums their counts. The parts must share their tokenizer (its
    files are compared) and dtype. Files are copied in blocks: memory does not grow with the shards.
    """
    shard_dirs = [Path(d) for d in shard_dirs]
    if not shard_dirs:
        raise ValueError("no prepared directories given to combine")
    out_dir = Path(out_dir)
    if out_dir.resolve() in {d.resolve() for d in shard_dirs}:
        raise ValueError(f"{out_dir}: the combined shards must go to a directory other than the parts")
    metas = [read_meta(d) for d in shard_dirs]
    _check_same_tokenizer(shard_dirs, metas)
    for directory in shard_dirs:  # sizes must match meta.json before anything is written
        for split in ("train", "val"):
            TokenShard.open(directory, split)
    out_dir.mkdir(parents=True, exist_ok=True)
    shutil.copytree(shard_dirs[0] / metas[0]["tokenizer"], out_dir / "tokenizer", dirs_exist_ok=True)
    splits = ("train", "val")
    tmp_paths = {split: out_dir / f".{split}.bin.tmp" for split in splits}
    total_bytes = sum(
        (d / f"{s}.bin").stat().st_size for d in shard_dirs for s in splits if (d / f"{s}.bin").exists()
    )
    try:
        with tqdm(
            total=total_bytes,
            unit="B",
            unit_scale=True,
            desc="combining",
            disable=hidden_unless_terminal(show_progress),
        ) as bar:
            for split in splits:
                with open(tmp_paths[split], "wb") as out:
                    for directory in shard_dirs:
                        path = directory / f"{split}.bin"
                        if path.exists():  # an empty split may have no file
                            with open(path, "rb") as part:
                                shutil.copyfileobj(part, out, 1 << 20)
                            bar.update(path.stat().st_size)
    except BaseException:
        for path in tmp_paths.values():
            path.unlink(missing_ok=True)
        raise
    for split in splits:
        os.replace(tmp_paths[split], out_dir / f"{split}.bin")
    first = metas[0]
    meta = {
        "tokenizer": "tokenizer",
        "tokenizer_sha256": tokenizer_digest(out_dir / "tokenizer"),
        **{name: first[name] for name in ("tokenizer_style", "vocab_size", "n_special", "dtype")},
        "counts": {split: sum(meta["counts"][split] for meta in metas) for split in splits},
        "files": [f for meta in metas for f in meta.get("files", [])],
        "val_fraction": _agreed(metas, "val_fraction"),
        "text_field": _agreed(metas, "text_field"),
        "parts": [str(d) for d in shard_dirs],
    }
    write_json(out_dir / META_NAME, meta)
    return meta
