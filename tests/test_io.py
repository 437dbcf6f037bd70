"""Whole-file writes: renamed into place, and flushed to the disk before and after the rename."""

from __future__ import annotations

import os

import pytest
import torch

from gptkit.io import read_json, read_safetensors, save_safetensors, write_json


def test_atomic_write_flushes_the_file_before_its_rename_and_the_rename_after(tmp_path, monkeypatch):
    events: list[str] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        events.append("fsync " + ("directory" if os.path.isdir(f"/proc/self/fd/{fd}") else "file"))
        real_fsync(fd)

    def replace(src, dst) -> None:
        events.append("rename")
        real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    monkeypatch.setenv("GPTKIT_FSYNC", "1")
    write_json(tmp_path / "latest.json", {"step": 3})
    assert events == ["fsync file", "rename", "fsync directory"]
    assert read_json(tmp_path / "latest.json") == {"step": 3}
    assert [p.name for p in tmp_path.iterdir()] == ["latest.json"]  # no temporary file left
    events.clear()
    monkeypatch.setenv("GPTKIT_FSYNC", "0")  # throwaway runs: renamed, not flushed
    write_json(tmp_path / "latest.json", {"step": 4})
    assert events == ["rename"] and read_json(tmp_path / "latest.json") == {"step": 4}


def _mappings_of(path) -> int:
    """How many of this process's memory mappings are of ``path`` (Linux's /proc/self/maps)."""
    return sum(line.rstrip().endswith(str(path)) for line in open("/proc/self/maps"))


@pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="needs Linux's /proc/self/maps")
def test_each_tensor_read_from_safetensors_leaves_memory_when_it_is_dropped(tmp_path):
    """Each tensor is mapped on its own, so a loader that copies tensors one at a time and drops
    each holds the file's pages one tensor at a time, never the whole file beside the model."""
    path = (tmp_path / "weights.safetensors").resolve()
    saved = {f"t{i}": torch.randn(64, 32) for i in range(4)}
    save_safetensors(saved, path)
    tensors = read_safetensors(path)
    assert _mappings_of(path) == 4
    copies = {}
    for name in list(tensors):
        copies[name] = tensors.pop(name).clone()
        assert _mappings_of(path) == len(tensors)
    for name, tensor in saved.items():
        assert torch.equal(copies[name], tensor)
