"""A corpus's files → the pieces of text ``prepare`` tokenizes, each labelled train or val.

Formats, by suffix (a ``.gz``, ``.zst`` or ``.zstd`` suffix after it: compressed):

- plain text (any other suffix): one document per file, read in blocks of whole lines; the last
  ``val_fraction`` of its bytes is held out;
- JSON lines (``.jsonl``, ``.ndjson``, ``.json``), parquet (``.parquet``, streamed a row group at a
  time), arrow (``.arrow``), and a folder written by ``datasets``' ``save_to_disk`` (its arrow
  files, in order, as one file): one document per row, its ``text_field``; every
  ⌈1/val_fraction⌉-th document of a file is held out.

Everything is streamed: memory does not grow with the corpus. A row that cannot be read is a
DataError naming the file, the line or row (counted from 0) and the field.

Bytes that are not UTF-8 in text and JSON lines are handled as ``errors`` says (``--errors``):
"replace" (the default) reads each as U+FFFD and warns once per file with their count; "strict"
stops at the first, naming file, line and column; "ignore" drops them without a word. In every
mode a file holding NUL bytes is refused (no text holds them), and in "replace" so is a file
whose start is more than 1% undecodable bytes: both are binary files given by mistake. Tables
(parquet, arrow) hold text already decoded: ``errors`` does not apply to them.
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from gptkit.data.formats import (
    DataError,
    batch_values,
    check_text_column,
    content_size,
    dataset_files,
    inner_suffix,
    is_dataset_folder,
    read_head,
    read_lines,
    table_batches,
)
from gptkit.io import json_loads, json_type_name

BLOCK_BYTES = 1 << 16  # plain text is tokenized a block of lines (about 64 kB) at a time
TEXT_SUFFIXES = (".txt", ".text", ".md")
ROW_SUFFIXES = {
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
    ".json": "jsonl",
    ".parquet": "parquet",
    ".arrow": "arrow",
}
# A folder's files that are read: JSON lines named .json are left out (datasets' and the hubs'
# metadata files are .json); name such a file itself to read it.
FOLDER_ROW_SUFFIXES = (".jsonl", ".ndjson", ".parquet", ".arrow")
SNIFF_BYTES = 1 << 16  # the start of a text file that is checked for being text
MAX_UNDECODABLE = 0.01  # a larger share of bytes that are not UTF-8: not a text file

DecodeErrors = Literal["strict", "replace", "ignore"]
DECODE_ERRORS: tuple[DecodeErrors, ...] = ("strict", "replace", "ignore")

# A piece of the corpus, in the order its ids are written: (text, split, bytes read, ends a document).
# A document's end appends the end-of-text separator; an empty text that ends one is the separator alone.
Piece = tuple[str, str, int, bool]


@dataclass(frozen=True)
class CorpusFile:
    """One file of a corpus and how it is read: "text", "jsonl", "parquet", "arrow", or "datasets"
    (a ``save_to_disk`` folder, read as one file)."""

    path: Path
    kind: str

    def parts(self) -> list[Path]:
        """The files on disk: the folder's arrow files for "datasets", else the file itself."""
        return dataset_files(self.path) if self.kind == "datasets" else [self.path]

    def size(self) -> int:
        """Bytes on disk (compressed, for a compressed file)."""
        return sum(part.stat().st_size for part in self.parts())


def corpus_file(path: Path, as_jsonl: bool = False) -> CorpusFile:
    """How ``path`` is read, by its suffix past a compression suffix; ``as_jsonl``: a file of no row
    format is JSON lines rather than text (the deprecated ``--jsonl-field``)."""
    if is_dataset_folder(path):
        return CorpusFile(path, "datasets")
    kind = ROW_SUFFIXES.get(inner_suffix(path), "jsonl" if as_jsonl else "text")
    if kind in ("parquet", "arrow") and path.suffix.lower() != f".{kind}":
        raise DataError(f"{path}: a compressed {kind} file: {kind} compresses its own columns; decompress it")
    return CorpusFile(path, kind)


def corpus_files(paths: Sequence[str | Path], as_jsonl: bool = False) -> list[CorpusFile]:
    """The files to read: each path itself, or what a folder holds (see :func:`folder_files`)."""
    files = []
    for path in map(Path, paths):
        if path.is_dir() and not is_dataset_folder(path):
            files.extend(corpus_file(f, as_jsonl) for f in folder_files(path, as_jsonl))
        else:
            files.append(corpus_file(path, as_jsonl))
    return files


def _visible_files(folder: Path) -> Iterator[Path]:
    """A folder's files, recursively in name order, skipping hidden names (.git, .cache) and the
    insides of ``datasets`` folders (which are yielded as themselves)."""
    for root, dirs, names in os.walk(folder):
        root_path = Path(root)
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in sorted(n for n in names if not n.startswith(".")):
            yield root_path / name
        for d in [d for d in dirs if is_dataset_folder(root_path / d)]:
            dirs.remove(d)
            yield root_path / d


def folder_files(folder: Path, as_jsonl: bool = False) -> list[Path]:
    """A folder's corpus: its row files (``.jsonl``, ``.ndjson``, ``.parquet``, ``.arrow``, each maybe
    compressed, and ``datasets`` folders) when it holds any, else its text files (``.txt``,
    ``.text``, ``.md``, maybe compressed), recursively in name order; hidden names are skipped."""
    found = list(_visible_files(folder))
    rows = [p for p in found if is_dataset_folder(p) or inner_suffix(p) in FOLDER_ROW_SUFFIXES]
    texts = [p for p in found if p.is_file() and inner_suffix(p) in TEXT_SUFFIXES]
    if rows and texts:
        warnings.warn(
            f"{folder}: reading its {len(rows)} row file(s); its {len(texts)} text file(s) "
            f"({', '.join(p.name for p in texts[:3])}{', ...' if len(texts) > 3 else ''}) are left out",
            stacklevel=3,
        )
    if rows or as_jsonl:
        if not rows:
            raise FileNotFoundError(
                f"{folder} is a directory with no {'/'.join(FOLDER_ROW_SUFFIXES)} files in it"
            )
        return sorted(rows)
    if not texts:
        suffixes = "/".join((*TEXT_SUFFIXES, *FOLDER_ROW_SUFFIXES))
        raise FileNotFoundError(f"{folder} is a directory with no {suffixes} files in it")
    return sorted(texts)


def check_corpus_file(file: CorpusFile, text_field: str, errors: DecodeErrors = "replace") -> None:
    """Refuse a file that cannot be read before any work: a table without a text column
    ``text_field``; a text or JSON-lines file that is not text (NUL bytes; with "replace", more than
    1% of bytes that are not UTF-8; with "strict", any such byte, named by line and column; in its
    first 64 KiB, decompressed) or whose compression is damaged at its start. Warn about an empty
    file."""
    if file.kind in ("parquet", "arrow", "datasets"):
        for part in file.parts():
            check_text_column(part, text_field)
        return
    sample = read_head(file.path, SNIFF_BYTES)
    if not sample:
        warnings.warn(f"{file.path}: empty file, nothing to tokenize", stacklevel=3)
        return
    if b"\0" in sample:
        raise DataError(f"{file.path}: not a text file (it holds NUL bytes): give UTF-8 text or JSON lines")
    if len(sample) == SNIFF_BYTES:  # a character cut at the sample's end is not an error
        sample = sample[: sample.rfind(b"\n") + 1 or len(sample) - 3]  # (UTF-8: 4 bytes at most)
    if errors == "strict":
        TextDecoder(file.path, "strict").decode(sample, first_line=1)
        return
    if errors == "ignore":
        return
    bad = undecodable_bytes(sample)
    if bad > MAX_UNDECODABLE * len(sample):
        raise DataError(
            f"{file.path}: not UTF-8 text ({bad} of its first {len(sample):,} bytes are not UTF-8); "
            "convert it first (e.g. iconv -f latin1 -t utf-8), or pass --errors ignore to drop them"
        )


def undecodable_bytes(data: bytes) -> int:
    """How many of ``data``'s bytes are not part of a UTF-8 character."""
    return len(data) - len(data.decode("utf-8", errors="ignore").encode("utf-8"))


class TextDecoder:
    """UTF-8 decoding of one file's lines under ``errors`` (see the module's docstring); counts the
    bytes replaced or dropped, and the line of the first, for the warning after the file."""

    def __init__(self, path: Path, errors: DecodeErrors):
        self.path, self.errors = path, errors
        self.undecodable = 0
        self.first_line: int | None = None

    def decode(self, data: bytes, first_line: int) -> str:
        """``data``: whole lines of the file, the first of them line ``first_line`` (from 1)."""
        try:
            return data.decode("utf-8")  # the common case, at full speed
        except UnicodeDecodeError as e:
            line = first_line + data.count(b"\n", 0, e.start)
            if self.errors == "strict":
                column = e.start - data.rfind(b"\n", 0, e.start)  # in bytes, from 1
                raise DataError(
                    f"{self.path}, line {line}, column {column}: byte 0x{data[e.start]:02x} is not UTF-8 "
                    "(--errors strict); convert the file (e.g. iconv -f latin1 -t utf-8), or pass "
                    "--errors replace or ignore"
                ) from e
            if self.first_line is None:
                self.first_line = line
            self.undecodable += undecodable_bytes(data)
            return data.decode("utf-8", errors=self.errors)

    def warn_if_replaced(self) -> None:
        """With "replace": one warning for the file, with the count and the first line."""
        if self.errors == "replace" and self.undecodable:
            warnings.warn(
                f"{self.path}: {self.undecodable} byte(s) that are not UTF-8 were read as U+FFFD (the "
                f"first on line {self.first_line}); --errors strict stops on them, --errors ignore drops them",
                stacklevel=2,
            )


def _text_blocks(path: Path, val_fraction: float, decoder: TextDecoder) -> Iterator[tuple[str, str, int]]:
    """(text, split, bytes read) in blocks of whole lines: the lines after the first
    (1 - val_fraction) of the file's bytes (decompressed) are "val". Windows line ends become
    plain newlines."""
    boundary = (1.0 - val_fraction) * content_size(path) if val_fraction else float("inf")
    block: list[bytes] = []
    block_bytes, block_read, position, split = 0, 0, 0, "train"
    first_line = 1  # of the block

    def text() -> str:
        return decoder.decode(b"".join(block), first_line).replace("\r\n", "\n")

    for line_number, (line, read) in enumerate(read_lines(path), start=1):
        line_split = "val" if position >= boundary else "train"
        if block and (line_split != split or block_bytes >= BLOCK_BYTES):
            yield text(), split, block_read
            block, block_bytes, block_read, first_line = [], 0, 0, line_number
        split = line_split
        block.append(line)
        block_bytes += len(line)
        block_read += read
        position += len(line)
    if block:
        yield text(), split, block_read


def _json_documents(path: Path, text_field: str, decoder: TextDecoder) -> Iterator[tuple[str | None, int]]:
    """(text, bytes read) of every line of a JSON-lines file; None for a blank line."""
    for line_number, (line, read) in enumerate(read_lines(path), start=1):
        if not line.strip():
            yield None, read
            continue
        where = f"{path}, line {line_number}"
        decoded = decoder.decode(line, line_number)
        if line_number == 1:
            decoded = decoded.removeprefix("\ufeff")  # a byte-order mark, as json.loads(bytes) allows
        try:
            record = json_loads(decoded)
        except json.JSONDecodeError as e:
            raise DataError(f"{where}: not valid JSON ({e.msg}, column {e.colno})") from e
        if not isinstance(record, dict):
            raise DataError(
                f"{where}: expected a JSON object with field {text_field!r}, found {json_type_name(record)}"
            )
        if text_field not in record:
            raise DataError(f"{where}: no field {text_field!r} (its fields: {', '.join(record) or 'none'})")
        text = record[text_field]
        if not isinstance(text, str):
            raise DataError(f"{where}: field {text_field!r} is not a string (it is {json_type_name(text)})")
        yield text, read


def _table_documents(file: CorpusFile, text_field: str) -> Iterator[tuple[str | None, int]]:
    """(text, bytes read) of every row of a parquet or arrow file, or of a ``datasets`` folder's
    arrow files one after the other; a batch's bytes go with its last row."""
    for part in file.parts():
        for first, batch, read in table_batches(part, [text_field]):
            texts = batch_values(part, first, batch.column(0))
            for offset, text in enumerate(texts):
                if text is None:
                    raise DataError(f"{part}, row {first + offset}: field {text_field!r} is null, not text")
                yield text, read if offset == len(texts) - 1 else 0


def read_pieces(
    files: Sequence[CorpusFile], text_field: str, val_fraction: float, errors: DecodeErrors = "replace"
) -> Iterator[Piece]:
    """The pieces of the whole corpus, in order: a plain-text file's blocks then its document end;
    a row file's documents, each ending itself (an empty one adds nothing, not even a separator).
    Bytes that are not UTF-8 are handled as ``errors`` says (see the module's docstring)."""
    every = max(round(1 / val_fraction), 1) if val_fraction else 0
    for file in files:
        decoder = TextDecoder(file.path, errors)
        if file.kind == "text":
            for text, split, read in _text_blocks(file.path, val_fraction, decoder):
                yield text, split, read, False
            yield "", "train", 0, True
            decoder.warn_if_replaced()
            continue
        if file.kind == "jsonl":
            documents = _json_documents(file.path, text_field, decoder)
        else:
            documents = _table_documents(file, text_field)
        document = 0
        for text, read in documents:
            if text is None:  # a blank line: no document
                yield "", "train", read, False
                continue
            document += 1
            yield text, "val" if every and document % every == 0 else "train", read, bool(text)
        decoder.warn_if_replaced()
