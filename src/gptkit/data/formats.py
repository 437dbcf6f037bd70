"""The file formats data comes in besides plain files: gzip and zstd streams, parquet, and the arrow
files that the ``datasets`` library writes (``save_to_disk``).

Everything is read in pieces of bounded size: a compressed file 64 KiB at a time, a parquet file a
batch of a row group at a time, an arrow file a record batch at a time; memory does not grow with
the file. A file that cannot be read is a :class:`DataError` whose one-line message names the file,
where in it (line or row, rows counted from 0 as pyarrow and ``datasets`` index them) and the field.
pyarrow and zstandard are optional: ``pip install -e '.[corpora]'``.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

EXTRA = "corpora"  # the optional extra that installs pyarrow and zstandard
COMPRESSIONS = {".gz": "gzip", ".zst": "zstd", ".zstd": "zstd"}
READ_BYTES = 1 << 16  # compressed bytes read, and at most this many decompressed bytes (gzip), per step
PARQUET_BATCH_ROWS = 1024  # rows per batch taken from a parquet row group
# A `datasets` folder: save_to_disk writes these beside its arrow files (a DatasetDict, one folder per split).
DATASET_STATE, DATASET_INFO, DATASET_DICT = "state.json", "dataset_info.json", "dataset_dict.json"


class DataError(ValueError):
    """Data that cannot be used; the message names the file, the line or row, and the field."""


def one_line(error: BaseException) -> str:
    """An exception's message cut to its first line (pyarrow's can run over several)."""
    lines = str(error).strip().splitlines()
    return lines[0] if lines else type(error).__name__


def utf8_error(path: Path) -> DataError:
    """A DataError naming the first byte of ``path`` that is not UTF-8 by line and column. The file
    is read again, in binary, to find it: a text-mode read knows only its buffer's offset."""
    with open(path, "rb") as f:
        for number, line in enumerate(f, start=1):
            try:
                line.decode("utf-8")
            except UnicodeDecodeError as e:
                return DataError(
                    f"{path}, line {number}, column {e.start + 1}: byte 0x{line[e.start]:02x} is not UTF-8; "
                    "convert the file (e.g. iconv -f latin1 -t utf-8)"
                )
    return DataError(f"{path}: not UTF-8 text")


def _needs(package: str, what: str) -> ImportError:
    return ImportError(f"{what} needs the {package} package: pip install -e '.[{EXTRA}]'")


def _zstandard():
    try:
        import zstandard
    except ImportError as e:
        raise _needs("zstandard", "reading .zst files") from e
    return zstandard


def pyarrow_modules(what: str):
    """(pyarrow, pyarrow.parquet), or an ImportError naming the extra that installs them."""
    try:
        import pyarrow
        import pyarrow.parquet
    except ImportError as e:
        raise _needs("pyarrow", what) from e
    return pyarrow, pyarrow.parquet


# Compressed streams -------------------------------------------------------------------------------


def compression_of(path: Path) -> str | None:
    """A file's compression by its last suffix: gzip (``.gz``), zstd (``.zst``, ``.zstd``) or None."""
    return COMPRESSIONS.get(path.suffix.lower())


def inner_suffix(path: Path) -> str:
    """The suffix that says what a file holds, past a compression suffix: ``a.jsonl.gz`` → ``.jsonl``."""
    name = Path(path.stem) if compression_of(path) else path
    return name.suffix.lower()


class _Damaged(Exception):
    """A compressed stream that cannot be decompressed (its cause in the message)."""


def _decompressor(compression: str):
    if compression == "gzip":
        return zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)  # gzip's header and trailer (CRC, size)
    return _zstandard().ZstdDecompressor().decompressobj()


def _chunks(raw: BinaryIO, compression: str) -> Iterator[tuple[bytes, int]]:
    """(decompressed bytes, bytes of the file read for them): concatenated gzip members and zstd
    frames are read one after the other; a stream cut short raises _Damaged (zstandard's own
    streaming reader takes a truncated file for a complete one)."""
    errors: tuple[type[BaseException], ...] = (zlib.error,)
    if compression == "zstd":
        errors += (_zstandard().ZstdError,)
    decompressor, fed = _decompressor(compression), False
    try:
        for data in iter(lambda: raw.read(READ_BYTES), b""):
            read = len(data)
            while data:
                fed = True
                if compression == "gzip":  # at most READ_BYTES out per call, whatever the ratio
                    out = decompressor.decompress(data, READ_BYTES)
                else:
                    out = decompressor.decompress(data)
                if decompressor.eof:  # a member or frame ends; another may follow
                    data, decompressor, fed = decompressor.unused_data, _decompressor(compression), False
                else:
                    data = decompressor.unconsumed_tail if compression == "gzip" else b""
                yield out, read
                read = 0
        if fed:  # the file ends inside a member or frame: what zlib held back at the limit, if it is whole
            out = decompressor.flush()
            if not decompressor.eof:
                raise _Damaged(f"the {compression} data ends before its end marker: the file is truncated")
            yield out, 0
    except errors as e:
        raise _Damaged(f"{compression} data is damaged ({one_line(e)})") from e


def read_lines(path: Path) -> Iterator[tuple[bytes, int]]:
    """(line with its newline, bytes of the file on disk read for it) of a file, decompressed when it
    is ``.gz`` or ``.zst``: the second numbers sum to the file's size, for a progress bar. A damaged
    stream is a DataError naming the file and the first line it could not give."""
    compression = compression_of(path)
    with open(path, "rb") as raw:
        if compression is None:
            for line in raw:
                yield line, len(line)
            return
        lines, owed, pending = 0, 0, []
        try:
            for chunk, read in _chunks(raw, compression):
                owed += read
                parts = chunk.split(b"\n")
                for part in parts[:-1]:
                    pending.append(part)
                    lines += 1
                    yield b"".join(pending) + b"\n", owed
                    owed, pending = 0, []
                if parts[-1]:
                    pending.append(parts[-1])
        except _Damaged as e:
            raise DataError(f"{path}, line {lines + 1}: {e}") from e
        if pending or owed:
            yield b"".join(pending), owed


def read_head(path: Path, n_bytes: int) -> bytes:
    """The first ``n_bytes`` of a file's content (decompressed, in whole lines); damage among them
    is a DataError naming the file and line, as :func:`read_lines` reports it."""
    if compression_of(path) is None:
        with open(path, "rb") as raw:
            return raw.read(n_bytes)
    head = bytearray()
    for line, _ in read_lines(path):
        head += line
        if len(head) >= n_bytes:
            break
    return bytes(head[:n_bytes])


def content_size(path: Path) -> int:
    """The bytes a file holds once decompressed (read through once if it is compressed)."""
    if compression_of(path) is None:
        return path.stat().st_size
    return sum(len(line) for line, _ in read_lines(path))


# Tables: parquet, and arrow as `datasets` writes it ------------------------------------------------


def dataset_files(directory: Path) -> list[Path]:
    """The arrow files of a folder written by ``datasets``' ``save_to_disk``, in the dataset's order
    (its ``state.json``). A DatasetDict's folder (one sub-folder per split) is a DataError naming
    the splits to choose from."""
    if (directory / DATASET_DICT).is_file():
        splits = sorted(p.name for p in directory.iterdir() if (p / DATASET_STATE).is_file())
        raise DataError(
            f"{directory}: a `datasets` DatasetDict (splits: {', '.join(splits) or 'none'}): "
            f"give one split's folder, e.g. {directory / (splits[0] if splits else 'train')}"
        )
    state_path = directory / DATASET_STATE
    try:
        state = json.loads(state_path.read_text(encoding="utf-8"))
        names = [entry["filename"] for entry in state["_data_files"]]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise DataError(
            f"{state_path}: not a `datasets` state file with _data_files ({one_line(e)}): "
            "the folder was not written by save_to_disk, or is damaged"
        ) from e
    files = [directory / name for name in names]
    missing = [str(f) for f in files if not f.is_file()]
    if missing:
        raise DataError(f"{state_path}: lists data file(s) that are missing: {', '.join(missing)}")
    return files


def is_dataset_folder(path: Path) -> bool:
    """A folder written by ``datasets``' ``save_to_disk`` (a Dataset or a DatasetDict)."""
    return path.is_dir() and ((path / DATASET_STATE).is_file() or (path / DATASET_DICT).is_file())


def _unreadable(pa) -> tuple[type[BaseException], ...]:
    """What pyarrow raises for a damaged file: its own errors, and OSErrors of no system call
    (thrift, snappy, a page shorter than its header says), which name no file."""
    return (pa.ArrowException, OSError)


def _table_error(path: Path, kind: str, error: BaseException, where: str = "") -> DataError:
    if isinstance(error, OSError) and error.errno is not None:
        raise error  # the system's: missing or unreadable, and its message names the file
    return DataError(
        f"{path}{where}: cannot be read as {kind} ({one_line(error)}): the file is damaged or not {kind}"
    )


def _kind(path: Path) -> str:
    return "parquet" if path.suffix.lower() == ".parquet" else "arrow"


def _open_arrow(path: Path):
    """(schema, record batches, the file being read) of an arrow file: the streaming format (what
    ``datasets`` writes) or the random-access file format. Regular reads, not a memory map: mapped
    pages would count in this process's resident memory as the file is read."""
    pa, _ = pyarrow_modules("reading arrow files")
    source = pa.OSFile(str(path))
    try:
        stream = pa.ipc.open_stream(source)
        return stream.schema, iter(stream), source
    except pa.ArrowInvalid:
        source = pa.OSFile(str(path))
        reader = pa.ipc.open_file(source)
        return reader.schema, (reader.get_batch(i) for i in range(reader.num_record_batches)), source


def table_schema(path: Path):
    """The pyarrow schema of a parquet or arrow file; a file that is neither is a DataError."""
    kind = _kind(path)
    pa, pq = pyarrow_modules(f"reading {kind} files")
    try:
        return pq.ParquetFile(path).schema_arrow if kind == "parquet" else _open_arrow(path)[0]
    except _unreadable(pa) as e:
        raise _table_error(path, kind, e) from e


def check_text_column(path: Path, column: str) -> None:
    """Refuse a parquet or arrow file without ``column``, or whose ``column`` is not text."""
    pa, _ = pyarrow_modules(f"reading {_kind(path)} files")
    schema = table_schema(path)
    if column not in schema.names:
        raise DataError(
            f"{path}: no column {column!r} (its columns: {', '.join(schema.names) or 'none'}); "
            "--text-field names the column that holds the text"
        )
    kind = schema.field(column).type
    if not (pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_string_view(kind)):
        raise DataError(f"{path}: column {column!r} holds {kind}, not text (a string column)")


def table_batches(path: Path, columns: list[str] | None = None) -> Iterator[tuple[int, Any, int]]:
    """(index of the batch's first row, pyarrow RecordBatch, bytes of the file read for it) of a
    parquet or arrow file, a row group's batch or a record batch at a time; only ``columns`` when
    given. The bytes are for a progress bar: a parquet file's size shared out by rows, an arrow
    file's position."""
    kind = _kind(path)
    pa, pq = pyarrow_modules(f"reading {kind} files")
    first, counted = 0, 0
    try:
        if kind == "parquet":
            # pre_buffer off: with it, the reader keeps every row group it has read cached until it
            # is closed, and memory grows with the file (57 MB for a 57 MB file: benchmarks/prepare_throughput.py).
            parquet = pq.ParquetFile(path, pre_buffer=False)
            size, total = path.stat().st_size, parquet.metadata.num_rows
            batches = parquet.iter_batches(batch_size=PARQUET_BATCH_ROWS, columns=columns, use_threads=False)
        else:
            _, batches, source = _open_arrow(path)
        for batch in batches:
            if columns is not None and kind == "arrow":
                batch = batch.select(columns)
            last = first + batch.num_rows
            position = size * last // total if kind == "parquet" else source.tell()
            yield first, batch, max(position - counted, 0)
            first, counted = last, max(position, counted)
    except _unreadable(pa) as e:
        raise _table_error(path, kind, e, f", row {first} or after") from e


def table_rows(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """(row index, {column: value}) of every row of a parquet or arrow file, a batch at a time."""
    for first, batch, _ in table_batches(path):
        for offset, row in enumerate(batch_values(path, first, batch)):
            yield first + offset, row


def batch_values(path: Path, first: int, batch) -> list:
    """A pyarrow batch (or column) as Python values; a damaged file's string that is not UTF-8 is a
    DataError naming the file and the batch's rows."""
    try:
        return batch.to_pylist()
    except UnicodeDecodeError as e:
        rows = f"rows {first} to {first + len(batch) - 1}"
        raise DataError(
            f"{path}, {rows}: a string that is not UTF-8 ({e.reason}): the file is damaged"
        ) from e
