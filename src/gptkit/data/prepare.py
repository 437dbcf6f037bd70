"""Corpus → token shards on disk: ``gptkit prepare``.

``prepare`` streams a corpus (:mod:`gptkit.data.corpus`: text, JSON lines, parquet, arrow, maybe
compressed) through a tokenizer (:mod:`gptkit.data.tokenizing`: this process, or a pool of
helpers) into ``train.bin`` and ``val.bin`` (flat numpy arrays, uint16 when the vocabulary fits,
else uint32) with ``meta.json`` beside them and a copy of the tokenizer in ``tokenizer/``: the
layout :mod:`gptkit.data.shards` reads. Memory does not grow with the corpus: files are read in
blocks of lines or rows and each block's ids are appended to the shard at once.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import warnings
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

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
from gptkit.data.shards import META_NAME
from gptkit.data.tokenizing import default_workers, encoded_here, encoded_in_pool, encoder_for
from gptkit.io import DISK_ERRNOS, free_space, write_json, writer_lock
from gptkit.progress import hidden_unless_terminal
from gptkit.tokenizer import Tokenizer, tokenizer_digest


def _counted(pieces: Iterable[Piece], text_bytes: dict[str, int]) -> Iterator[Piece]:
    """The pieces unchanged, adding each one's UTF-8 text bytes to its split's count."""
    for piece in pieces:
        text_bytes[piece[1]] += len(piece[0].encode("utf-8"))
        yield piece


@contextlib.contextmanager
def _staged(final_dir: Path) -> Iterator[Path]:
    """A hidden folder beside ``final_dir`` to write into: renamed into its place when the block ends,
    removed when it raises (a full disk's error naming both). The caller holds the writer lock, so
    the folders of killed runs into the same place are removed first."""
    for stale in final_dir.parent.glob(f".{final_dir.name}.preparing-*"):
        print(f"removed {stale}, left by an interrupted prepare", file=sys.stderr)
        shutil.rmtree(stale, ignore_errors=True)
    out_dir = final_dir.parent / f".{final_dir.name}.preparing-{os.getpid()}"
    out_dir.mkdir()
    try:
        yield out_dir
    except BaseException as e:
        shutil.rmtree(out_dir, ignore_errors=True)
        if isinstance(e, OSError) and e.errno in DISK_ERRNOS:
            raise _write_failure(e, out_dir, final_dir) from e
        raise
    _swap_into_place(out_dir, final_dir)


def _checked_corpus(
    files: Sequence[str | Path],
    val_fraction: float,
    workers: int | None,
    errors: DecodeErrors,
    text_field: str,
    jsonl_field: str | None,
) -> tuple[list[CorpusFile], str]:
    """:func:`prepare`'s arguments checked, and every corpus file before any is read: (the corpus
    files, the text field to read)."""
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
            stacklevel=3,  # prepare()'s caller
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
    return corpus, text_field


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
    corpus, text_field = _checked_corpus(files, val_fraction, workers, errors, text_field, jsonl_field)
    tokenizer_dir = hub.resolve(tokenizer_dir)  # a Hub name: its cached folder, which the workers read too
    tokenizer = Tokenizer.from_pretrained(tokenizer_dir)
    workers = workers or (default_workers() if tokenizer.style == "gpt1" else 1)  # checked: None or >= 1
    final_dir = Path(out_dir)
    final_dir.parent.mkdir(parents=True, exist_ok=True)
    # One prepare at a time into a folder (the lock file sits beside it: the folder is replaced).
    with (
        writer_lock(final_dir.parent / f".{final_dir.name}.lock", final_dir, "prepare"),
        _staged(final_dir) as staging,
    ):
        meta = _prepare_into(
            staging,
            tokenizer,
            tokenizer_dir,
            corpus,
            val_fraction,
            text_field,
            show_progress,
            workers,
            errors,
        )
    return meta


@contextlib.contextmanager
def _named(path: Path) -> Iterator[None]:
    """An OSError of a write to ``path`` that names no file names it."""
    try:
        yield
    except OSError as e:
        if e.filename is not None:
            raise
        raise OSError(e.errno, e.strerror or str(e), str(path)) from e


def _write_failure(error: OSError, staging: Path, final_dir: Path) -> OSError:
    """One line for shards that could not be written: the system's reason and the file (as it would
    have been named in ``final_dir``), the free space, and that the folder is as it was (the
    half-written ``staging`` is already removed)."""
    where = ""
    if error.filename:
        name = Path(error.filename)
        if name.is_relative_to(staging):
            name = final_dir / name.relative_to(staging)
            name = name.with_name(name.name.removeprefix(".").removesuffix(".tmp"))
        where = f" ({name})"
    kept = f"{final_dir} is as it was" if final_dir.exists() else f"nothing was written to {final_dir}"
    return OSError(
        error.errno,
        f"could not write the shards of {final_dir}: {error.strerror or error}{where}; "
        f"{free_space(final_dir)} there; {kept}",
    )


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


def _write_splits(encoded: Iterator, out_dir: Path, total_bytes: int, show_progress: bool) -> dict[str, int]:
    """The encoded pieces, (split, bytes of text, ids), appended to ``out_dir``'s train.bin and
    val.bin (each written under a temporary name, renamed when complete); the tokens of each split."""
    counts = {"train": 0, "val": 0}
    tmp_paths = {split: out_dir / f".{split}.bin.tmp" for split in counts}
    handles = {split: open(path, "wb") for split, path in tmp_paths.items()}
    try:
        with (
            contextlib.closing(encoded),  # on an error, the pool's workers stop at once
            tqdm(
                total=total_bytes,
                unit="B",
                unit_scale=True,
                desc="tokenizing",
                disable=hidden_unless_terminal(show_progress),
            ) as bar,
        ):
            for split, n_bytes, ids in encoded:
                with _named(tmp_paths[split]):  # write(2) names no file
                    handles[split].write(ids.tobytes())
                counts[split] += ids.size
                bar.update(n_bytes)
    except BaseException:
        for handle in handles.values():
            with contextlib.suppress(OSError):  # a full disk fails the flush too: the error is above
                handle.close()
        for path in tmp_paths.values():
            path.unlink(missing_ok=True)
        raise
    for split, handle in handles.items():
        with _named(tmp_paths[split]):
            handle.close()  # flushes the last bytes
        os.replace(tmp_paths[split], out_dir / f"{split}.bin")
    return counts


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
    encoder = encoder_for(tokenizer)
    dtype = encoder[2]
    tokenizer.save_pretrained(out_dir / "tokenizer")

    total_bytes = sum(f.size() for f in files)
    workers = min(workers, -(-total_bytes // BLOCK_BYTES))  # no more workers than blocks of text
    # UTF-8 bytes of the text each split holds (line ends made plain): the denominator of bits per byte.
    text_bytes = {"train": 0, "val": 0}
    corpus = _counted(read_pieces(files, text_field, val_fraction, errors), text_bytes)
    if workers > 1:
        encoded = encoded_in_pool(corpus, encoder, str(Path(tokenizer_dir).resolve()), workers)
    else:
        encoded = encoded_here(corpus, encoder)
    counts = _write_splits(encoded, out_dir, total_bytes, show_progress)
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
