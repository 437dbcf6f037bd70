"""Whole-file writes: renamed into place, and flushed to the disk before and after the rename."""

from __future__ import annotations

import os

from gptkit.io import read_json, write_json


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
