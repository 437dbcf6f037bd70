"""A full disk or a read-only folder while `prepare` writes shards, `predict` writes a fine-tuned
model's predictions and `suite` writes its reports: one line naming the file (exit status 2), and
nothing half-written left where a later run would trust it.

The disk is simulated in this process, as tests/test_faults.py does for checkpoints: writes under
one folder fail the way the system fails them. A full disk lets the file be created and its first
bytes through, then every write fails with ENOSPC (and names no file, as write(2) does not); a
read-only folder refuses to create anything in it with EROFS.
"""

from __future__ import annotations

import builtins
import errno
import io
import json
import os
from pathlib import Path

import pytest
import torch

from gptkit.cli import main
from gptkit.data.prepare import prepare
from gptkit.tokenizer import train_bpe

WRITING = ("w", "a", "x", "+")


class FullDisk:
    """Files opened for writing under ``root`` fill the disk: once a file whose name contains
    ``first`` is written, half of that write goes through and it and every later write fail."""

    def __init__(self, root: Path, first: str):
        self.root, self.first, self.full = str(root), first, False
        self.failed: list[str] = []

    def _file(self, file, path: str):
        disk = self

        class Filling:
            def __getattr__(self, name):
                return getattr(file, name)

            def __enter__(self):
                return self

            def __exit__(self, *exc):
                file.close()

            def __iter__(self):
                return iter(file)

            def write(self, data):
                if not disk.full and disk.first in Path(path).name:
                    file.write(data[: len(data) // 2])
                    disk.full = True
                if disk.full:
                    disk.failed.append(path)
                    raise OSError(errno.ENOSPC, "No space left on device")
                return file.write(data)

        return Filling()

    def install(self, monkeypatch) -> None:
        real_open = builtins.open

        def filling_open(file, mode="r", *args, **kwargs):
            handle = real_open(file, mode, *args, **kwargs)
            path = os.fsdecode(file) if not isinstance(file, int) else ""
            if any(flag in mode for flag in WRITING) and path.startswith(self.root):
                return self._file(handle, path)
            return handle

        monkeypatch.setattr(builtins, "open", filling_open)
        monkeypatch.setattr(io, "open", filling_open)  # pathlib's write_text and write_bytes


class ReadOnly:
    """Nothing can be created, opened for writing or renamed under ``root``: EROFS, naming the path."""

    def __init__(self, root: Path):
        self.root = str(root)

    def install(self, monkeypatch) -> None:
        real_open, real_os_open, real_mkdir, real_replace = builtins.open, os.open, os.mkdir, os.replace

        def refuse(path) -> None:
            if os.fsdecode(path).startswith(self.root):
                raise OSError(errno.EROFS, "Read-only file system", os.fsdecode(path))

        def ro_open(file, mode="r", *args, **kwargs):
            if not isinstance(file, int) and any(flag in mode for flag in WRITING):
                refuse(file)
            return real_open(file, mode, *args, **kwargs)

        def ro_os_open(path, flags, *args, **kwargs):
            if flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT):
                refuse(path)
            return real_os_open(path, flags, *args, **kwargs)

        def ro_mkdir(path, *args, **kwargs):
            refuse(path)
            return real_mkdir(path, *args, **kwargs)

        def ro_replace(source, target, *args, **kwargs):
            refuse(target)
            return real_replace(source, target, *args, **kwargs)

        monkeypatch.setattr(builtins, "open", ro_open)
        monkeypatch.setattr(io, "open", ro_open)
        monkeypatch.setattr(os, "open", ro_os_open)
        monkeypatch.setattr(os, "mkdir", ro_mkdir)
        monkeypatch.setattr(os, "replace", ro_replace)


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` (hidden ones included) by relative path, with its bytes."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def one_error_line(capsys, command: str) -> str:
    lines = capsys.readouterr().err.strip().splitlines()
    errors = [line for line in lines if "error" in line]
    assert len(errors) == 1 and errors[0] == lines[-1], lines
    assert errors[0].startswith(f"gptkit {command}: error: "), errors[0]
    return errors[0]


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> dict[str, Path]:
    """A 300-token tokenizer and a small corpus, in a folder the faults never touch."""
    root = tmp_path_factory.mktemp("inputs")
    corpus = root / "corpus.txt"
    corpus.write_text("the quick brown fox jumps over the lazy dog, and the dog sleeps on.\n" * 400)
    train_bpe([corpus], vocab_size=300, out_dir=root / "tokenizer", show_progress=False)
    return {"corpus": corpus, "tokenizer": root / "tokenizer"}


# prepare -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("first", ["encoder.json", ".train.bin.tmp", "meta.json"])
def test_prepare_on_a_full_disk_keeps_the_old_shards_and_says_where(
    inputs, tmp_path, monkeypatch, capsys, first
):
    """Wherever the disk fills (the tokenizer's files, a shard, meta.json, the last written), the
    error is one line naming the shards' folder, the file and the free space, and the shards
    already there are left byte for byte, with no hidden folder beside them."""
    disk = tmp_path / "disk"
    out = disk / "shards"
    prepare(inputs["tokenizer"], [inputs["corpus"]], out, val_fraction=0.1, show_progress=False)
    before = snapshot(disk)
    args = ["prepare", str(inputs["corpus"]), "--tokenizer", str(inputs["tokenizer"]), "--out", str(out)]
    with monkeypatch.context() as patches:
        full = FullDisk(disk, first)
        full.install(patches)
        assert main([*args, "--val-fraction", "0.2"]) == 2
    assert full.failed, "the simulated disk never filled"
    error = one_error_line(capsys, "prepare")
    assert f"[Errno 28] could not write the shards of {out}: No space left on device (" in error
    assert first.removesuffix(".tmp").lstrip(".") in error and "MB are free there" in error
    assert error.endswith(f"{out} is as it was")
    assert snapshot(disk) == before  # the old shards, and nothing beside them but the lock file
    assert main(args) == 0  # with room again, the same command succeeds


def test_prepare_on_a_full_disk_with_no_shards_before_leaves_nothing(inputs, tmp_path, monkeypatch, capsys):
    out = tmp_path / "shards"
    with monkeypatch.context() as patches:
        FullDisk(tmp_path, ".val.bin.tmp").install(patches)
        args = ["prepare", str(inputs["corpus"]), "--tokenizer", str(inputs["tokenizer"]), "--out", str(out)]
        assert main(args) == 2
    assert one_error_line(capsys, "prepare").endswith(f"nothing was written to {out}")
    assert [p.name for p in tmp_path.iterdir()] == [".shards.lock"]


def test_prepare_into_a_read_only_folder_is_one_line(inputs, tmp_path, monkeypatch, capsys):
    disk = tmp_path / "read-only"
    disk.mkdir()
    with monkeypatch.context() as patches:
        ReadOnly(disk).install(patches)
        args = ["prepare", str(inputs["corpus"]), "--tokenizer", str(inputs["tokenizer"])]
        assert main([*args, "--out", str(disk / "shards")]) == 2
    error = one_error_line(capsys, "prepare")
    assert "[Errno 30] Read-only file system" in error and str(disk) in error
    assert list(disk.iterdir()) == []


# predict ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def classifier(inputs, tmp_path_factory) -> Path:
    """A tiny fine-tuned classifier (random weights: what it predicts does not matter here)."""
    from gptkit import GPT, GPTConfig
    from gptkit.data.tasks import TaskSpec, special_token_ids
    from gptkit.model.task import TaskModel
    from gptkit.tokenizer import Tokenizer

    tokenizer = Tokenizer.from_pretrained(inputs["tokenizer"])
    torch.manual_seed(0)
    gpt = GPT(GPTConfig.from_preset("tiny", vocab_size=len(tokenizer), n_special=3, dropout=0.0))
    spec = TaskSpec(
        "classification", labels=["neg", "pos"], max_length=32, specials=special_token_ids(tokenizer)
    )
    directory = tmp_path_factory.mktemp("classifier")
    TaskModel(gpt, spec, clf_dropout=0.0, tokenizer=tokenizer).save_pretrained(directory)
    return directory


@pytest.mark.parametrize("fault", ["full", "read-only"])
def test_predictions_on_a_full_disk_or_read_only_folder(classifier, tmp_path, monkeypatch, capsys, fault):
    """The earlier predictions stay whole (or there are none), no temporary file is left, and the
    one line names the predictions file."""
    data = tmp_path / "reviews.jsonl"
    data.write_text("".join(json.dumps({"text": f"the fox {i}"}) + "\n" for i in range(20)))
    disk = tmp_path / "disk"
    disk.mkdir()
    out = disk / "predictions.jsonl"
    args = ["predict", "--model", str(classifier), "--data", str(data), "--out", str(out), "--device", "cpu"]
    assert main(args) == 0
    capsys.readouterr()
    before = snapshot(disk)
    with monkeypatch.context() as patches:
        (FullDisk(disk, "predictions") if fault == "full" else ReadOnly(disk)).install(patches)
        assert main(args) == 2
    error = one_error_line(capsys, "predict")
    code = "[Errno 28] No space left on device" if fault == "full" else "[Errno 30] Read-only file system"
    assert error == f"gptkit predict: error: {code}: '{out}'"
    assert snapshot(disk) == before


# the suite's reports ------------------------------------------------------------------------------


@pytest.mark.parametrize("first", ["results.md", "results.json"])
def test_suite_reports_on_a_full_disk(tmp_path, monkeypatch, capsys, first):
    """A suite whose task has no data writes only its reports: the disk fills while it writes them.
    results.json, which a rerun continues from, is never newer than results.md."""
    from gptkit import GPT, GPTConfig

    GPT(GPTConfig.from_preset("tiny", n_layer=1)).save_pretrained(tmp_path / "model")
    out = tmp_path / "suite"
    args = ["suite", "--init", str(tmp_path / "model"), "--out", str(out), "--tasks", "sst2"]
    args += ["--data-dir", str(tmp_path / "no-data")]
    assert main(args) == 0
    capsys.readouterr()
    before = snapshot(out)
    assert {"results.md", "results.json"} <= set(before)
    with monkeypatch.context() as patches:
        FullDisk(out, first).install(patches)
        assert main([*args, "--variants", "full", "no_aux_lm"]) == 2
    error = one_error_line(capsys, "suite")
    assert error.startswith(f"gptkit suite: error: [Errno 28] No space left on device: '{out}")
    after = snapshot(out)
    assert after["results.json"] == before["results.json"]  # not ahead of what results.md says
    assert not [name for name in after if name.endswith(".tmp")]
