"""`prepare` on the corpus formats besides plain text and JSON lines: parquet, arrow, a `datasets`
folder, gzip and zstd; each gives the shards of the same documents as plain JSON lines or text, and
a damaged or foreign file stops the run in one line naming file, line or row, and field."""

from __future__ import annotations

import gzip
import json
import re
import sys
import warnings
from pathlib import Path

import pytest

from gptkit.cli import main
from gptkit.data.prepare import prepare

# Forty documents of varied length (an empty one among them: it counts, but adds no tokens).
DOCS = [
    f"Document {i}: the quick brown fox, number {i}, jumps — naïve café ✓.\n" * (1 + i % 4) for i in range(40)
]
DOCS[17] = ""


def shard_bytes(out: Path) -> dict[str, bytes]:
    return {name: (out / name).read_bytes() for name in ("train.bin", "val.bin")}


def prepared(tokenizer: Path, files: list[Path], out: Path, **options) -> dict[str, bytes]:
    prepare(tokenizer, files, out, **{"val_fraction": 0.1, "show_progress": False, **options})
    return shard_bytes(out)


def jsonl_bytes(docs: list[str], field: str = "text") -> bytes:
    return "".join(json.dumps({"id": i, field: d}) + "\n" for i, d in enumerate(docs)).encode()


def write_parquet(path: Path, columns: dict[str, list], row_group_size: int = 7) -> Path:
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    pq.write_table(pa.table(columns), path, row_group_size=row_group_size)
    return path


def write_arrow_stream(path: Path, columns: dict[str, list], batch_rows: int = 6) -> Path:
    """An arrow file as `datasets` writes one: the streaming format, in record batches."""
    pa = pytest.importorskip("pyarrow")
    table = pa.table(columns)
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as writer:
        for batch in table.to_batches(max_chunksize=batch_rows):
            writer.write_batch(batch)
    return path


def write_dataset_folder(folder: Path, columns: dict[str, list], n_files: int = 2) -> Path:
    """What `datasets.Dataset.save_to_disk` writes: data-0000k-of-0000n.arrow, state.json, dataset_info.json."""
    folder.mkdir(parents=True)
    n = len(next(iter(columns.values())))
    bounds = [n * k // n_files for k in range(n_files + 1)]
    names = [f"data-{k:05d}-of-{n_files:05d}.arrow" for k in range(n_files)]
    for k, name in enumerate(names):
        part = {key: values[bounds[k] : bounds[k + 1]] for key, values in columns.items()}
        write_arrow_stream(folder / name, part)
    state = {"_data_files": [{"filename": name} for name in names], "_fingerprint": "0", "_split": None}
    (folder / "state.json").write_text(json.dumps(state))
    (folder / "dataset_info.json").write_text(json.dumps({"features": {}}))
    return folder


def zstd_frames(data: bytes) -> bytes:
    """Two concatenated zstd frames, as `cat a.zst b.zst` gives."""
    zstandard = pytest.importorskip("zstandard")
    half = len(data) // 2
    return zstandard.ZstdCompressor().compress(data[:half]) + zstandard.ZstdCompressor().compress(data[half:])


def gzip_members(data: bytes) -> bytes:
    half = len(data) // 2
    return gzip.compress(data[:half]) + gzip.compress(data[half:])


def test_every_row_format_gives_the_shards_of_the_same_json_lines(small_tokenizer, tmp_path):
    tokenizer = small_tokenizer
    plain = tmp_path / "docs.jsonl"
    plain.write_bytes(jsonl_bytes(DOCS))
    expected = prepared(tokenizer, [plain], tmp_path / "out-jsonl")
    columns = {"id": list(range(len(DOCS))), "text": DOCS}
    (tmp_path / "docs.jsonl.gz").write_bytes(gzip_members(jsonl_bytes(DOCS)))
    (tmp_path / "docs.jsonl.zst").write_bytes(zstd_frames(jsonl_bytes(DOCS)))
    inputs = {
        "gzip (two members)": tmp_path / "docs.jsonl.gz",
        "zstd (two frames)": tmp_path / "docs.jsonl.zst",
        "parquet (row groups of 7)": write_parquet(tmp_path / "docs.parquet", columns),
        "arrow stream": write_arrow_stream(tmp_path / "docs.arrow", columns),
        "datasets folder (2 arrow files, one dataset)": write_dataset_folder(tmp_path / "saved", columns),
    }
    for what, path in inputs.items():
        assert prepared(tokenizer, [path], tmp_path / f"out-{path.name}") == expected, what
    meta = json.loads((tmp_path / "out-saved" / "meta.json").read_text())
    assert meta["files"] == [str(tmp_path / "saved")] and meta["text_field"] == "text"
    assert meta["counts"]["val"] > 0


def test_compressed_text_gives_the_shards_of_the_plain_text(data_dir, small_tokenizer, tmp_path):
    text = (data_dir / "gutenberg" / "pg11.txt").read_bytes()[:40_000]
    plain = tmp_path / "alice.txt"
    plain.write_bytes(text)
    (tmp_path / "alice.txt.gz").write_bytes(gzip.compress(text))
    (tmp_path / "alice.txt.zst").write_bytes(zstd_frames(text))
    expected = prepared(small_tokenizer, [plain], tmp_path / "out")
    for name in ("alice.txt.gz", "alice.txt.zst"):  # the held-out lines too: by decompressed bytes
        assert prepared(small_tokenizer, [tmp_path / name], tmp_path / f"out-{name}") == expected


def test_a_folder_of_parquet_shards_is_read_in_name_order(small_tokenizer, tmp_path):
    tokenizer = small_tokenizer
    folder = tmp_path / "hub-clone"
    (folder / "data").mkdir(parents=True)
    (folder / ".cache").mkdir()
    (folder / "README.md").write_text("# A dataset card: not part of the corpus\n")
    (folder / ".cache" / "stale.parquet").write_bytes(b"not parquet: hidden, never read")
    shards = [
        write_parquet(
            folder / "data" / f"train-{k:05d}-of-00002.parquet", {"text": DOCS[20 * k : 20 * k + 20]}
        )
        for k in (1, 0)
    ]
    with pytest.warns(
        UserWarning, match=r"hub-clone: reading its 2 row file\(s\); its 1 text file\(s\) \(README.md\)"
    ):
        from_folder = prepared(tokenizer, [folder], tmp_path / "out-folder")
    assert from_folder == prepared(tokenizer, [shards[1], shards[0]], tmp_path / "out-files")


def prepare_in_shell(capsys, *args: str) -> tuple[int, str]:
    """`gptkit prepare ARGS`: (exit code, stderr less the progress bar)."""
    code = main(["prepare", *args])
    lines = capsys.readouterr().err.replace("\r", "\n").splitlines()
    return code, "".join(line + "\n" for line in lines if line and not line.startswith("tokenizing:"))


def damaged_inputs(tmp_path: Path) -> dict[str, tuple[Path, str]]:
    """Files that must stop a run, and the error (a regex) that names file, line or row, and field."""
    gz = gzip.compress(jsonl_bytes(DOCS))
    flipped = bytearray(gz)
    flipped[len(gz) // 2] ^= 0xFF
    lines = jsonl_bytes(DOCS).splitlines(keepends=True)
    cases = {
        "parquet without the text column": (
            write_parquet(tmp_path / "body.parquet", {"id": [1, 2], "body": ["a", "b"]}),
            r"body.parquet: no column 'text' \(its columns: id, body\); --text-field names",
        ),
        "parquet column of numbers": (
            write_parquet(tmp_path / "numbers.parquet", {"text": [1, 2]}),
            r"numbers.parquet: column 'text' holds int64, not text",
        ),
        "null text in row 12": (
            write_parquet(tmp_path / "nulls.parquet", {"text": [*DOCS[:12], None, *DOCS[13:]]}),
            r"nulls.parquet, row 12: field 'text' is null, not text",
        ),
        "not parquet at all": (tmp_path / "fake.parquet", r"fake.parquet: cannot be read as parquet \("),
        "JSON line that is no object": (
            tmp_path / "array.jsonl",
            r"array.jsonl, line 3: expected a JSON object with field 'text', found an array",
        ),
        "JSON line whose text is a number": (
            tmp_path / "number.jsonl",
            r"number.jsonl, line 2: field 'text' is not a string \(it is a number\)",
        ),
        "truncated gzip": (
            tmp_path / "cut.jsonl.gz",
            r"cut.jsonl.gz, line \d+: the gzip data ends before its end marker",
        ),
        "corrupt gzip": (
            tmp_path / "flipped.jsonl.gz",
            r"flipped.jsonl.gz, line \d+: gzip data is damaged \(",
        ),
        "not gzip": (
            tmp_path / "plain.txt.gz",
            r"plain.txt.gz, line 1: gzip data is damaged \(.*incorrect header",
        ),
        "DatasetDict": (
            tmp_path / "dict",
            r"dict: a `datasets` DatasetDict \(splits: test, train\): give one split",
        ),
    }
    (tmp_path / "fake.parquet").write_bytes(b"PAR1 but not really\n" * 10)
    (tmp_path / "array.jsonl").write_bytes(b"".join(lines[:2]) + b'["not", "an", "object"]\n')
    (tmp_path / "number.jsonl").write_bytes(lines[0] + b'{"text": 3}\n')
    (tmp_path / "cut.jsonl.gz").write_bytes(gz[: len(gz) * 2 // 3])
    (tmp_path / "flipped.jsonl.gz").write_bytes(bytes(flipped))
    (tmp_path / "plain.txt.gz").write_text("plain text, not compressed\n")
    for split in ("train", "test"):
        write_dataset_folder(tmp_path / "dict" / split, {"text": DOCS[:4]}, n_files=1)
    (tmp_path / "dict" / "dataset_dict.json").write_text(json.dumps({"splits": ["train", "test"]}))
    (tmp_path / "cut.jsonl.zst").write_bytes(zstd_frames(jsonl_bytes(DOCS))[:-20])
    cases["truncated zstd"] = (
        tmp_path / "cut.jsonl.zst",
        r"cut.jsonl.zst, line \d+: the zstd data ends before",
    )
    return cases


def test_damaged_and_foreign_files_stop_in_one_line_and_leave_the_old_shards(
    small_tokenizer, tmp_path, capsys
):
    tokenizer = small_tokenizer
    good = tmp_path / "good.jsonl"
    good.write_bytes(jsonl_bytes(DOCS))
    out = tmp_path / "shards"
    before = prepared(tokenizer, [good], out)
    inputs = tmp_path / "inputs"
    inputs.mkdir()
    for what, (path, message) in damaged_inputs(inputs).items():
        code, err = prepare_in_shell(capsys, str(path), "--tokenizer", str(tokenizer), "--out", str(out))
        assert code == 2, what
        assert len(err.strip().splitlines()) == 1, (what, err)
        assert err.startswith("gptkit prepare: error: ") and err.count(str(path)) >= 1, (what, err)
        assert re.search(message, err), (what, err)
        assert shard_bytes(out) == before, what  # the old shards, untouched
        assert sorted(p.name for p in tmp_path.iterdir()) == [
            ".shards.lock",
            "good.jsonl",
            "inputs",
            "shards",
        ]


def test_text_field_names_the_column_and_jsonl_field_still_works(small_tokenizer, tmp_path, capsys):
    tokenizer = str(small_tokenizer)
    reference = tmp_path / "docs.jsonl"
    reference.write_bytes(jsonl_bytes(DOCS))
    expected = prepared(Path(tokenizer), [reference], tmp_path / "expected")
    body = write_parquet(tmp_path / "body.parquet", {"body": DOCS})
    shell = ["--tokenizer", tokenizer, "--val-fraction", "0.1"]
    assert main(["prepare", str(body), *shell, "--out", str(tmp_path / "body"), "--text-field", "body"]) == 0
    assert shard_bytes(tmp_path / "body") == expected
    old_style = tmp_path / "docs.txt"  # JSON lines under any name: the old flag read every file so
    old_style.write_bytes(jsonl_bytes(DOCS, field="content"))
    # The shell says it once on stderr; the library's DeprecationWarning (hidden by Python's default
    # filters outside __main__) is what a script calling prepare_shards sees.
    with pytest.warns(DeprecationWarning, match="use text_field"):
        status = main(
            ["prepare", str(old_style), *shell, "--out", str(tmp_path / "old"), "--jsonl-field", "content"]
        )
    assert status == 0
    assert "--jsonl-field is deprecated: use --text-field" in capsys.readouterr().err
    assert shard_bytes(tmp_path / "old") == expected
    with pytest.warns(DeprecationWarning, match="use text_field"):
        prepare(
            tokenizer,
            [old_style],
            tmp_path / "old2",
            val_fraction=0.1,
            jsonl_field="content",
            show_progress=False,
        )


def test_a_missing_optional_package_names_the_extra(small_tokenizer, tmp_path, monkeypatch, capsys):
    parquet = write_parquet(tmp_path / "docs.parquet", {"text": DOCS})
    (tmp_path / "docs.jsonl.zst").write_bytes(zstd_frames(jsonl_bytes(DOCS)))
    for module in ("pyarrow", "pyarrow.parquet", "zstandard"):
        monkeypatch.setitem(sys.modules, module, None)  # import raises ImportError
    tokenizer = str(small_tokenizer)
    for path, package in ((parquet, "pyarrow"), (tmp_path / "docs.jsonl.zst", "zstandard")):
        code, err = prepare_in_shell(
            capsys, str(path), "--tokenizer", tokenizer, "--out", str(tmp_path / "out")
        )
        assert code == 2
        assert err.strip() == (
            f"gptkit prepare: error: reading {'parquet' if package == 'pyarrow' else '.zst'} files needs the "
            f"{package} package: pip install -e '.[corpora]'"
        )


@pytest.mark.slow
def test_errors_strict_replace_and_ignore_on_bytes_that_are_not_utf8(small_tokenizer, tmp_path, capsys):
    """--errors: strict stops naming file, line and column; replace gives the shards of the text
    with U+FFFD written in, warning with the count; ignore gives those of the text without the bytes.
    The references are clean UTF-8 files prepared the ordinary way."""
    tokenizer = small_tokenizer
    lines = [f"Line {i}: the quick brown fox jumps over the lazy dog.\n".encode() for i in range(40)]
    lines[6] = b"Line 6: caf\xe9 au lait, and \xff\xfe twice.\n"  # 3 bytes that are not UTF-8, line 7
    rows = [json.dumps({"text": line.decode()}).encode() + b"\n" for line in lines[:6]]
    rows.append(b'{"text": "caf\xe9 au lait"}\n')  # line 7 again, column 14
    cases = {"text.txt": b"".join(lines), "rows.jsonl": b"".join(rows)}

    def cleaned(data: bytes, errors: str) -> bytes:
        if data.startswith(b"{"):  # JSON lines: the decoded text, escaped again as JSON
            return b"".join(
                json.dumps(json.loads(row.decode("utf-8", errors))).encode() + b"\n"
                for row in data.splitlines()
            )
        return data.decode("utf-8", errors).encode()

    for name, data in cases.items():
        bad = tmp_path / name
        bad.write_bytes(data)
        column = 12 if name == "text.txt" else 14
        code, err = prepare_in_shell(
            capsys,
            str(bad),
            "--tokenizer",
            str(tokenizer),
            "--out",
            str(tmp_path / "strict"),
            "--errors",
            "strict",
        )
        assert code == 2 and not (tmp_path / "strict").exists()
        assert f"{bad}, line 7, column {column}: byte 0xe9 is not UTF-8 (--errors strict)" in err, err
        for errors in ("replace", "ignore"):
            reference = tmp_path / f"clean-{errors}-{name}"
            reference.write_bytes(cleaned(data, errors))
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                got = prepared(
                    tokenizer, [bad], tmp_path / f"{errors}-{name}", val_fraction=0.0, errors=errors
                )
            said = [str(w.message) for w in caught if name in str(w.message)]
            if errors == "replace":
                count = 3 if name == "text.txt" else 1
                assert said == [
                    f"{bad}: {count} byte(s) that are not UTF-8 were read as U+FFFD (the first on line 7); "
                    "--errors strict stops on them, --errors ignore drops them"
                ]
            else:
                assert said == []  # silently
            assert got == prepared(
                tokenizer, [reference], tmp_path / f"ref-{errors}-{name}", val_fraction=0.0
            )


def test_binary_files_are_refused_unless_ignore_and_nul_bytes_always(small_tokenizer, tmp_path):
    tokenizer = small_tokenizer
    latin1 = tmp_path / "latin1.txt"  # every accent a byte that is not UTF-8: 5% of the file
    latin1.write_bytes("café déjà vu, à bientôt. ".encode("latin-1") * 40)
    with pytest.raises(ValueError, match=r"latin1.txt: not UTF-8 text .*or pass --errors ignore"):
        prepare(tokenizer, [latin1], tmp_path / "out", show_progress=False)
    with pytest.raises(ValueError, match=r"latin1.txt, line 1, column 4: byte 0xe9 is not UTF-8"):
        prepare(tokenizer, [latin1], tmp_path / "out", show_progress=False, errors="strict")
    prepare(tokenizer, [latin1], tmp_path / "out", show_progress=False, errors="ignore")  # as asked
    nul = tmp_path / "nul.txt"
    nul.write_bytes(b"text with a NUL\x00 in it\n")
    for errors in ("strict", "replace", "ignore"):
        with pytest.raises(ValueError, match=r"nul.txt: not a text file \(it holds NUL bytes\)"):
            prepare(tokenizer, [nul], tmp_path / "out2", show_progress=False, errors=errors)
    with pytest.raises(ValueError, match=r"errors must be one of strict, replace, ignore, got 'skip'"):
        prepare(tokenizer, [latin1], tmp_path / "out2", show_progress=False, errors="skip")
