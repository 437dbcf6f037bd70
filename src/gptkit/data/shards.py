"""Corpus → token shards on disk → windows of ``context_length`` tokens, drawn without replacement.

``prepare`` streams a corpus (:mod:`gptkit.data.corpus`: text, JSON lines, parquet, arrow, maybe
compressed) through a tokenizer into ``train.bin`` and ``val.bin`` (flat numpy arrays, uint16 when
the vocabulary fits, else uint32) with ``meta.json`` beside them and a copy of the tokenizer in
``tokenizer/``. Memory does not grow with the corpus: files are read in blocks of lines or rows
and each block's ids are appended to the shard at once.

``WindowSampler`` reads a shard by memory map. An epoch is a seeded permutation of the shard's
non-overlapping windows; every optimizer step takes the next ``batch_size`` of them, and rank r of
W takes its contiguous share, so the global batch is the same for any number of processes (the
sampler is :class:`gptkit.data.sampler.EpochSampler`, which fine-tuning's examples use too).
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import shutil
import sys
import warnings
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from gptkit import hub
from gptkit.data.corpus import (
    BLOCK_BYTES,
    DECODE_ERRORS,
    CorpusFile,
    DecodeErrors,
    Piece,
    check_corpus_file,
    corpus_files,
    read_pieces,
)
from gptkit.data.sampler import EpochSampler
from gptkit.io import read_json_object, write_json, writer_lock
from gptkit.tokenizer import END_OF_TEXT, Tokenizer, tokenizer_digest

META_NAME = "meta.json"
TASK_BYTES = 1 << 16  # text per task for a worker process (many JSONL documents make one task)
TASKS_AHEAD = 2  # tasks per helper submitted ahead: one to run, one queued, so a helper never waits


def _dtype_for(vocab: int) -> np.dtype:
    return np.dtype(np.uint16) if vocab <= np.iinfo(np.uint16).max + 1 else np.dtype(np.uint32)


def default_workers() -> int:
    """The CPU cores this process may run on."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


# What tokenizes a piece: the tokenizer, the separator's ids (none when it has no end-of-text), the dtype.
_Encoder = tuple[Tokenizer, list[int], np.dtype]


def _counted(pieces: Iterable[Piece], text_bytes: dict[str, int]) -> Iterator[Piece]:
    """The pieces unchanged, adding each one's UTF-8 text bytes to its split's count."""
    for piece in pieces:
        text_bytes[piece[1]] += len(piece[0].encode("utf-8"))
        yield piece


def _encoder_for(tokenizer: Tokenizer) -> _Encoder:
    separator = [tokenizer.special_tokens[END_OF_TEXT]] if END_OF_TEXT in tokenizer.special_tokens else []
    return tokenizer, separator, _dtype_for(len(tokenizer))


def _encode(encoder: _Encoder, text: str, ends_document: bool) -> np.ndarray:
    tokenizer, separator, dtype = encoder
    ids = tokenizer.encode(text) if text else []
    if ends_document:
        ids = ids + separator
    return np.asarray(ids, dtype=dtype)


def _encoded_here(pieces: Iterable[Piece], encoder: _Encoder) -> Iterator[tuple[str, int, np.ndarray]]:
    """(split, bytes read, ids) of every piece, tokenized in this process."""
    for text, split, n_bytes, ends_document in pieces:
        yield split, n_bytes, _encode(encoder, text, ends_document)


# Set in each worker process by _start_worker: its tokenizer, or the error that loading it raised.
_worker_encoder: _Encoder | Exception | None = None


def _start_worker(tokenizer_dir: str) -> None:
    global _worker_encoder
    try:
        _worker_encoder = _encoder_for(Tokenizer.from_pretrained(tokenizer_dir))
    except Exception as e:  # raised by the first task, so it reaches the main process as it is
        _worker_encoder = e


def _encode_in_worker(texts: list[tuple[str, bool]]) -> list[np.ndarray]:
    if isinstance(_worker_encoder, Exception):
        raise _worker_encoder
    assert _worker_encoder is not None, "_start_worker runs first in every worker"
    return [_encode(_worker_encoder, text, ends_document) for text, ends_document in texts]


def _batches(pieces: Iterable[Piece]) -> Iterator[list[Piece]]:
    """Consecutive pieces, about TASK_BYTES of text a batch."""
    batch: list[Piece] = []
    size = 0
    for piece in pieces:
        batch.append(piece)
        size += len(piece[0])
        if size >= TASK_BYTES:
            yield batch
            batch, size = [], 0
    if batch:
        yield batch


def _pool_context() -> multiprocessing.context.BaseContext:
    """forkserver where the OS has it, else spawn: forking a process that runs torch's threads may hang."""
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("spawn")
    context = multiprocessing.get_context("forkserver")
    # Workers fork from one server that imported this module (torch with it) and, if this process
    # loaded them for GPT-1's tokenizer, spaCy and ftfy: each worker then starts in a fraction of a
    # second. Missing modules are skipped; the list only counts when the server first starts.
    preload = [m for m in ("ftfy", "spacy.lang.en") if m.split(".")[0] in sys.modules]
    context.set_forkserver_preload([__name__, *preload])
    return context


@dataclass
class _Batch:
    """Consecutive pieces on their way to the shards: their labels (split, bytes read) and their ids,
    tokenized here (a list) or by a helper (a Future)."""

    labels: list[tuple[str, int]]
    result: Future | list[np.ndarray]

    def finished(self) -> bool:
        return not isinstance(self.result, Future) or self.result.done()

    def results(self) -> Iterator[tuple[str, int, np.ndarray]]:
        encoded = self.result.result() if isinstance(self.result, Future) else self.result
        for (split, n_bytes), ids in zip(self.labels, encoded, strict=True):
            yield split, n_bytes, ids


def _encoded_in_pool(
    pieces: Iterable[Piece], encoder: _Encoder, tokenizer_dir: str, workers: int
) -> Iterator[tuple[str, int, np.ndarray]]:
    """(split, bytes read, ids) of every piece in the corpus's order, tokenized by this process and
    ``workers - 1`` helper processes.

    A batch goes to a helper while the helpers have fewer than ``TASKS_AHEAD`` unfinished batches
    each; otherwise this process tokenizes it itself, so no core idles while a helper starts
    (loading the tokenizer takes a fraction of a second) or has work queued, and at the end of the
    corpus this process waits for at most ``TASKS_AHEAD`` batches per helper. Finished batches are
    written in order; at most ``2 · TASKS_AHEAD`` per process wait to be written, so memory is
    bounded whatever the corpus size (``Pool.imap`` would read the whole corpus into its task
    queue). A helper's exception is raised here, unchanged.
    """
    helpers = workers - 1
    pending: deque[_Batch] = deque()
    executor = ProcessPoolExecutor(
        helpers, mp_context=_pool_context(), initializer=_start_worker, initargs=(tokenizer_dir,)
    )
    try:
        for batch in _batches(pieces):
            while pending and pending[0].finished():
                yield from pending.popleft().results()
            texts = [(text, ends_document) for text, _, _, ends_document in batch]
            labels = [(split, n_bytes) for _, split, n_bytes, _ in batch]
            unfinished = sum(isinstance(entry.result, Future) and not entry.finished() for entry in pending)
            if unfinished < TASKS_AHEAD * helpers:
                pending.append(_Batch(labels, executor.submit(_encode_in_worker, texts)))
            else:
                pending.append(_Batch(labels, [_encode(encoder, text, ends) for text, ends in texts]))
            while len(pending) > 2 * TASKS_AHEAD * workers:  # wait for the oldest
                yield from pending.popleft().results()
        while pending:
            yield from pending.popleft().results()
    except BrokenProcessPool as e:  # a helper died: killed, out of memory, or it could not start
        raise RuntimeError(
            f"a tokenizing worker process stopped ({e}); its error, if any, is printed above. "
            "workers=1 (`gptkit prepare --workers 1`) tokenizes in this process alone"
        ) from e
    finally:
        executor.shutdown(wait=True, cancel_futures=True)


def prepare(
    tokenizer_dir: str | Path,
    files: Sequence[str | Path],
    out_dir: str | Path,
    val_fraction: float = 0.05,
    text_field: str = "text",
    show_progress: bool = True,
    workers: int | None = None,
    *,
    errors: DecodeErrors = "replace",
    jsonl_field: str | None = None,
) -> dict:
    """Tokenize ``files`` into ``out_dir`` (train.bin, val.bin, meta.json, tokenizer/).

    A file's suffix says how it is read (:mod:`gptkit.data.corpus`; ``.gz``/``.zst`` after it:
    compressed): a plain text file is one document, and the last ``val_fraction`` of it (by bytes,
    whole lines) goes to the validation split; JSON lines, parquet, arrow and ``datasets`` folders
    give one document per row (its ``text_field``), and every ⌈1/val_fraction⌉-th document of a
    file is held out. A folder gives its corpus files. Documents are separated by the end-of-text
    token when the tokenizer has one. ``jsonl_field`` is the deprecated name of ``text_field``
    that also reads every file of no row format as JSON lines, as it used to.

    ``workers`` processes tokenize: this one and ``workers - 1`` helpers (default: the CPU cores
    this process may use for GPT-1's slow spaCy-based tokenizer, 1 for the byte-level one, which is
    faster than handing text to another process: benchmarks/prepare_throughput.py). The shards are
    byte for byte the same for any number of workers.

    Bytes that are not UTF-8 (text and JSON lines) are handled as ``errors`` says: "replace" reads
    each as U+FFFD and warns with their count per file, "strict" stops at the first naming file,
    line and column, "ignore" drops them. A file with NUL bytes is refused whatever ``errors`` says,
    and with "replace" one whose first 64 KiB are more than 1% undecodable (binary files).

    Every file is checked before any is read (tables have the text column, text is text); a row
    that cannot be read stops the run with a DataError naming file, line or row, and field.
    Everything is written into a hidden folder beside ``out_dir`` and renamed into place only when
    complete: a failed run leaves an existing ``out_dir`` exactly as it was.
    """
    if not 0.0 <= val_fraction < 1.0:
        raise ValueError(f"val_fraction must be in [0, 1), got {val_fraction}")
    if workers is not None and workers < 1:
        raise ValueError(f"workers must be at least 1, got {workers}")
    if errors not in DECODE_ERRORS:
        raise ValueError(f"errors must be one of {', '.join(DECODE_ERRORS)}, got {errors!r}")
    if jsonl_field is not None:
        warnings.warn(
            "prepare(jsonl_field=...) is deprecated: use text_field=..., and name JSON-lines files .jsonl",
            DeprecationWarning,
            stacklevel=2,
        )
        text_field = jsonl_field
    corpus = corpus_files(files, as_jsonl=jsonl_field is not None)
    missing = [str(f.path) for f in corpus if not f.path.exists()]
    if missing:
        raise FileNotFoundError(f"corpus file(s) not found: {', '.join(missing)}")
    if not corpus:
        raise ValueError("no corpus files given")
    for file in corpus:
        check_corpus_file(file, text_field, errors)
    tokenizer_dir = hub.resolve(tokenizer_dir)  # a Hub name: its cached folder, which the workers read too
    tokenizer = Tokenizer.from_pretrained(tokenizer_dir)
    if workers is None:
        workers = default_workers() if tokenizer.style == "gpt1" else 1
    final_dir = Path(out_dir)
    final_dir.parent.mkdir(parents=True, exist_ok=True)
    out_dir = final_dir.parent / f".{final_dir.name}.preparing-{os.getpid()}"
    # One prepare at a time into a folder (the lock file sits beside it: the folder is replaced).
    with writer_lock(final_dir.parent / f".{final_dir.name}.lock", final_dir, "prepare"):
        # Folders of killed runs into the same place (nobody else writes them while the lock is held).
        for stale in final_dir.parent.glob(f".{final_dir.name}.preparing-*"):
            print(f"removed {stale}, left by an interrupted prepare", file=sys.stderr)
            shutil.rmtree(stale, ignore_errors=True)
        out_dir.mkdir()
        try:
            meta = _prepare_into(
                out_dir,
                tokenizer,
                tokenizer_dir,
                corpus,
                val_fraction,
                text_field,
                show_progress,
                workers,
                errors,
            )
        except BaseException:
            shutil.rmtree(out_dir, ignore_errors=True)
            raise
        _swap_into_place(out_dir, final_dir)
    return meta


@dataclass
class PrepareConfig:
    """Tokenize a corpus into token shards (train.bin, val.bin, meta.json) for pre-training."""

    files: list[str] = field(
        metadata={
            "help": "Corpus files or folders: plain text (one document per file), JSON lines (.jsonl), "
            "parquet, .arrow, a `datasets` save_to_disk folder (one document per row); text and JSON lines "
            "may be .gz or .zst.",
            "positional": True,
        }
    )
    tokenizer: str = field(metadata={"help": "Tokenizer folder or Hub name (gpt2, openai-gpt, org/name)."})
    out: str = field(metadata={"help": "Directory to write the shards to."})
    val_fraction: float = field(
        default=0.05,
        metadata={
            "help": "Share held out for validation: of every plain-text file's bytes; every "
            "⌈1/fraction⌉-th row of a row file."
        },
    )
    text_field: str = field(
        default="text",
        metadata={"help": "The field (JSON lines) or column (parquet, arrow) that holds a row's text."},
    )
    jsonl_field: str | None = field(
        default=None,
        metadata={
            "help": "Deprecated: --text-field, and every file of no row format read as JSON lines.",
            "replaced_by": "text_field",  # the flag says so when used
        },
    )
    workers: int | None = field(
        default=None,
        metadata={
            "help": "Processes that tokenize, this one included (default: the CPU cores for GPT-1-style "
            "tokenizers, 1 for byte-level)."
        },
    )
    errors: DecodeErrors = field(
        default="replace",
        metadata={
            "help": "Bytes that are not UTF-8 in text and JSON lines: replace reads each as U+FFFD and warns "
            "with their count; strict stops at the first, naming file, line and column; ignore drops them "
            "silently. Files with NUL bytes are refused in every mode, and with replace also files whose "
            "start is more than 1% such bytes (binary files)."
        },
    )


def prepare_shards(config: PrepareConfig) -> dict:
    """:func:`prepare` with ``gptkit prepare``'s settings; returns the shards' meta.json."""
    # jsonl_field keeps its old meaning (every file is JSON lines); prepare warns that it is deprecated.
    field_option = {"text_field": config.text_field}
    if config.jsonl_field is not None:
        field_option = {"jsonl_field": config.jsonl_field}
    return prepare(
        config.tokenizer,
        config.files,
        config.out,
        val_fraction=config.val_fraction,
        workers=config.workers,
        errors=config.errors,
        **field_option,
    )


def _swap_into_place(ready: Path, final: Path) -> None:
    """Replace ``final`` by the complete folder ``ready``: two renames; the old one is removed after."""
    old = final.parent / f".{final.name}.replaced-{os.getpid()}"
    if final.exists():
        final.rename(old)
    ready.rename(final)
    shutil.rmtree(old, ignore_errors=True)


def check_shard_tokenizer(data_dir: str | Path, meta: dict) -> None:
    """Refuse shards whose ``tokenizer/`` folder is not the one they were made with (shards written
    before the fingerprint existed are taken as they are)."""
    expected = meta.get("tokenizer_sha256")
    folder = Path(data_dir) / meta.get("tokenizer", "tokenizer")
    if expected and tokenizer_digest(folder) != expected:
        raise ValueError(
            f"{folder}: not the tokenizer these shards were made with (meta.json's tokenizer_sha256 "
            f"differs): training would read every token as another; re-run `gptkit prepare`"
        )


def _prepare_into(
    out_dir: Path,
    tokenizer: Tokenizer,
    tokenizer_dir: str | Path,
    files: list[CorpusFile],
    val_fraction: float,
    text_field: str,
    show_progress: bool,
    workers: int,
    errors: DecodeErrors,
) -> dict:
    """:func:`prepare`'s work, into the (temporary) ``out_dir``."""
    encoder = _encoder_for(tokenizer)
    dtype = encoder[2]
    tokenizer.save_pretrained(out_dir / "tokenizer")

    total_bytes = sum(f.size() for f in files)
    workers = min(workers, -(-total_bytes // BLOCK_BYTES))  # no more workers than blocks of text
    # UTF-8 bytes of the text each split holds (line ends made plain): the denominator of bits per byte.
    text_bytes = {"train": 0, "val": 0}
    corpus = _counted(read_pieces(files, text_field, val_fraction, errors), text_bytes)
    if workers > 1:
        encoded = _encoded_in_pool(corpus, encoder, str(Path(tokenizer_dir).resolve()), workers)
    else:
        encoded = _encoded_here(corpus, encoder)
    counts = {"train": 0, "val": 0}
    tmp_paths = {split: out_dir / f".{split}.bin.tmp" for split in counts}
    handles = {split: open(path, "wb") for split, path in tmp_paths.items()}
    try:
        with (
            contextlib.closing(encoded),  # on an error, the pool's workers stop at once
            tqdm(
                total=total_bytes, unit="B", unit_scale=True, desc="tokenizing", disable=not show_progress
            ) as bar,
        ):
            for split, n_bytes, ids in encoded:
                handles[split].write(ids.tobytes())
                counts[split] += ids.size
                bar.update(n_bytes)
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
        "tokenizer_sha256": tokenizer_digest(out_dir / "tokenizer"),
        "tokenizer_style": tokenizer.style,
        "vocab_size": tokenizer.vocab_size,
        "n_special": tokenizer.n_special,
        "dtype": dtype.name,
        "counts": counts,
        "text_bytes": text_bytes,
        "files": [str(f.path) for f in files],
        "val_fraction": val_fraction,
        # The column or field rows were read from; None when every file was plain text.
        "text_field": text_field if any(f.kind != "text" for f in files) else None,
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
            total=total_bytes, unit="B", unit_scale=True, desc="combining", disable=not show_progress
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
