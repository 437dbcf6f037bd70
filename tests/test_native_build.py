"""gptkit.native's build and cache: used only where it has vector code and threads, one warning
otherwise; the flags in the cache key, no fallback under the full build's name; transient failures
not kept; a cache folder others can write to not loaded from; a damaged or mismatched library built
again; fsync before the rename."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest
import torch

from gptkit import GPT, GPTConfig, generate, native
from gptkit.model.layouts import NativeLinear, decoding_layout, quantize_int8

pytestmark = pytest.mark.skipif(native.library._compiler() is None, reason="no C++ compiler here")

FULL_FLAGS = ("-march=native", "-fopenmp")


@pytest.fixture
def fresh(tmp_path, monkeypatch):
    """An empty cache folder of this test's, and the library looked for again (before and after)."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("GPTKIT_NATIVE_CACHE", str(cache))
    monkeypatch.delenv(native.MARCH, raising=False)
    monkeypatch.delenv("GPTKIT_NATIVE", raising=False)
    native._library.cache_clear()
    yield cache
    native._library.cache_clear()


@pytest.fixture(scope="module")
def prebuilt(tmp_path_factory) -> Path:
    """The library built once for this module's tests, in a folder of its own."""
    folder = tmp_path_factory.mktemp("prebuilt")
    previous = os.environ.get("GPTKIT_NATIVE_CACHE")
    os.environ["GPTKIT_NATIVE_CACHE"] = str(folder)
    try:
        return native.build()
    finally:
        if previous is None:
            del os.environ["GPTKIT_NATIVE_CACHE"]
        else:
            os.environ["GPTKIT_NATIVE_CACHE"] = previous


def seeded(cache: Path, prebuilt: Path) -> Path:
    """``cache`` holding the prebuilt library and its record, as a build would leave them."""
    cache.mkdir(mode=0o700, exist_ok=True)
    for source in (prebuilt, prebuilt.with_suffix(".json")):
        shutil.copy2(source, cache / source.name)
    return cache / prebuilt.name


def gptkit_warnings(caught) -> list[str]:
    return [str(w.message) for w in caught if str(w.message).startswith("gptkit:")]


def decodes_with_pytorch_layouts_after_one_warning() -> list[str]:
    """available() is False, asked twice, with one warning of one line; the decoding layout is
    PyTorch's, and generates. Returns the warnings."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert not native.available()
        assert not native.available()  # asked again: the same answer, no second warning
        config = GPTConfig(vocab_size=97, context_length=32, n_layer=2, n_head=2, d_model=32)
        model = decoding_layout(GPT(config).eval())
        assert model.native_step is None and not isinstance(model.lm_head, NativeLinear)
        assert quantize_int8(GPT(config).eval()).native_step is None
        assert generate(model, torch.tensor([[1, 2, 3]]), 4, temperature=0).shape == (1, 7)
    messages = gptkit_warnings(caught)
    assert len(messages) == 1 and "\n" not in messages[0], messages
    assert messages[0].endswith("decoding uses PyTorch's layouts")
    return messages


def fake_compiler(directory: Path, body: str) -> str:
    """A "compiler" script: ``body`` (sh), then g++ with the same arguments."""
    path = directory / "fake-cxx"
    real = shutil.which("g++") or shutil.which("c++")
    path.write_text(f'#!/bin/sh\n{textwrap.dedent(body)}\nexec {real} "$@"\n')
    path.chmod(0o755)
    return str(path)


REFUSES_OPENMP = """\
for argument in "$@"; do
    if [ "$argument" = "-fopenmp" ]; then echo "clang: error: unsupported option '-fopenmp'" >&2; exit 1; fi
done"""


# Used only where it wins -----------------------------------------------------------------------


def test_a_compiler_without_openmp_gives_pytorchs_layouts_and_caches_nothing(fresh, tmp_path, monkeypatch):
    """Apple's clang, say: the one build (-fopenmp) fails, nothing slower is built in its place, and
    the cache holds no library under the full build's name (nor any other)."""
    compiler = fake_compiler(tmp_path, REFUSES_OPENMP)
    monkeypatch.setenv("CXX", compiler)
    (message,) = decodes_with_pytorch_layouts_after_one_warning()
    assert "unsupported option '-fopenmp'" in message
    assert not (fresh / native.library_name(compiler, FULL_FLAGS)).exists()
    assert not list(fresh.glob("*.so*"))


def test_a_generic_build_is_built_but_not_used(fresh, monkeypatch):
    """GPTKIT_NATIVE_MARCH=generic: no -march, the compiler's default target (x86-64: no AVX2), as on
    a CPU the kernels have no vector code for. Its library says so, gptkit decodes with PyTorch's
    layouts and says why, and the library is cached under its own flags' name, not the full build's."""
    monkeypatch.setenv(native.MARCH, "generic")
    if native.flags() != ("-fopenmp",):
        pytest.fail(f"generic flags are {native.flags()}")
    (message,) = decodes_with_pytorch_layouts_after_one_warning()
    assert "without vector code for this CPU (isa=generic" in message
    compiler = native.library._compiler()
    assert (fresh / native.library_name(compiler, ("-fopenmp",))).exists()
    assert not (fresh / native.library_name(compiler, FULL_FLAGS)).exists()
    assert native.report()["unusable"].startswith("built without vector code")


def test_the_flags_are_part_of_the_cache_key():
    compiler = native.library._compiler()
    names = {
        native.library_name(compiler, flags)
        for flags in (FULL_FLAGS, ("-fopenmp",), ("-march=haswell", "-fopenmp"))
    }
    assert len(names) == 3


def test_the_build_reports_what_it_was_built_with(fresh, prebuilt):
    path = seeded(fresh, prebuilt)
    assert native.build() == path
    info = native.read_build_line(path)
    assert (info.abi, info.source, info.flags) == (native.ABI, native.source_hash(), " ".join(native.flags()))
    assert info.openmp > 0
    if "avx512f" in Path("/proc/cpuinfo").read_text():
        assert info.isa == "avx512"
    kernels = native.load(path)
    assert kernels.info == info  # the line the loaded library returns is the one in its bytes
    report = native.report()
    assert report["used"] and report["unusable"] is None and report["library"] == str(path)
    assert report["threads"] == torch.get_num_threads()


def test_the_library_is_built_once_per_source_and_machine(fresh):
    first = native.build()
    assert first.parent == fresh and first.exists()
    built = first.stat().st_mtime_ns
    assert native.build() == first and first.stat().st_mtime_ns == built  # found, not compiled again
    assert not list(fresh.glob("*.tmp"))  # nothing half-written left beside it


def test_without_a_compiler_decoding_keeps_pytorchs_layouts_with_one_warning(fresh, monkeypatch):
    monkeypatch.setenv("CXX", "")
    monkeypatch.setattr(native.library, "_compiler", lambda: None)
    (message,) = decodes_with_pytorch_layouts_after_one_warning()
    assert "no C++ compiler found" in message


def test_any_load_error_gives_pytorchs_layouts_and_one_warning(fresh, monkeypatch):
    """A library missing a symbol (AttributeError), one the loader refuses (OSError): one warning,
    never an exception out of available()."""
    for error in (AttributeError("undefined symbol: gptkit_build_info"), OSError("invalid ELF header")):

        def refuse(path, error=error):
            raise error

        monkeypatch.setattr(native, "load", refuse)
        native._library.cache_clear()
        (message,) = decodes_with_pytorch_layouts_after_one_warning()
        assert str(error) in message


# Transient failures ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "body",
    ["kill -9 $$", 'echo "cc1plus: out of memory allocating 65536 bytes" >&2; exit 1'],
    ids=["killed", "out-of-memory"],
)
def test_a_transient_build_failure_leaves_nothing_and_is_tried_again(body, fresh, tmp_path, monkeypatch):
    monkeypatch.setenv("CXX", fake_compiler(tmp_path, body))
    with pytest.raises(native.BuildError) as failure:
        native.build()
    assert failure.value.transient
    assert not list(fresh.glob("*.so*")) and not list(fresh.glob("*.json"))
    monkeypatch.delenv("CXX")  # the next process: the real compiler, the library built
    assert native.build().exists()


def test_a_compiler_error_is_not_transient(fresh, tmp_path, monkeypatch):
    monkeypatch.setenv("CXX", fake_compiler(tmp_path, REFUSES_OPENMP))
    with pytest.raises(native.BuildError, match="could not compile") as failure:
        native.build()
    assert not failure.value.transient


# Loading trust ---------------------------------------------------------------------------------

PLANTED = r"""
#include <cstdio>
#include <cstdlib>
__attribute__((constructor)) static void planted() {
    if (const char* marker = std::getenv("GPTKIT_PLANTED_MARKER")) {
        if (FILE* f = std::fopen(marker, "w")) { std::fputs("ran", f); std::fclose(f); }
    }
}
"""


def write_record(library: Path, data: bytes) -> None:
    """The record of a build beside ``library``, true to ``data``."""
    record = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    library.with_suffix(".json").write_text(json.dumps(record))


def plant(folder: Path, tmp_path: Path) -> Path:
    """A library with a constructor under the name gptkit would load from ``folder``, with a record
    of its true size and hash beside it: only the folder's check stands between it and dlopen."""
    source = tmp_path / "planted.cpp"
    source.write_text(PLANTED)
    name = native.library_name(native.library._compiler(), native.flags())
    target = folder / name
    subprocess.run(
        [native.library._compiler(), "-shared", "-fPIC", str(source), "-o", str(target)], check=True
    )
    write_record(target, target.read_bytes())
    return target


def test_a_library_planted_in_a_world_writable_cache_folder_is_not_loaded(fresh, tmp_path, monkeypatch):
    fresh.mkdir()
    planted = plant(fresh, tmp_path)
    fresh.chmod(0o777)
    marker = tmp_path / "constructor-ran"
    monkeypatch.setenv("GPTKIT_PLANTED_MARKER", str(marker))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert native.available()  # built again, in a private folder
    (message,) = gptkit_warnings(caught)
    assert "writable by its group or by others (mode 777)" in message and "private folder" in message
    assert not marker.exists()  # the planted library's constructor never ran
    path = native.loaded().path
    assert path.parent != fresh and path.name == planted.name
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700


@pytest.mark.skipif(not hasattr(os, "getuid") or os.getuid() != 0, reason="giving a folder away needs root")
def test_a_cache_folder_of_another_user_is_not_loaded_from(fresh, tmp_path, monkeypatch):
    fresh.mkdir(mode=0o755)
    plant(fresh, tmp_path)
    os.chown(fresh, 65534, -1)
    marker = tmp_path / "constructor-ran"
    monkeypatch.setenv("GPTKIT_PLANTED_MARKER", str(marker))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert native.available()
    assert "belongs to user id 65534" in gptkit_warnings(caught)[0]
    assert not marker.exists() and native.loaded().path.parent != fresh


def test_a_cache_folder_in_a_folder_others_can_write_is_not_loaded_from(fresh, tmp_path, monkeypatch):
    """Private itself, but where anyone may rename it away and put theirs in its place."""
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    cache = shared / "cache"
    cache.mkdir(mode=0o700)
    monkeypatch.setenv("GPTKIT_NATIVE_CACHE", str(cache))
    directory, warning = native.trusted_cache_dir()
    assert directory != cache and "writable by others without the sticky bit" in warning
    shared.chmod(0o777 | stat.S_ISVTX)  # as /tmp: others may write, not rename what is ours
    assert native.trusted_cache_dir() == (cache, None)


def test_a_new_cache_folder_is_private(fresh):
    assert native.trusted_cache_dir() == (fresh, None)
    assert stat.S_IMODE(fresh.stat().st_mode) == 0o700


@pytest.mark.parametrize("damage", ["truncated", "empty", "another-source", "no-record", "a-link"])
def test_a_damaged_or_mismatched_cached_library_is_built_again(damage, fresh, tmp_path, prebuilt):
    """The cached library is checked before anything of it is loaded (a truncated one killed the
    process with SIGBUS when loaded): its size and hash against the record of its build, its build
    line against this source and these flags, and it must be a plain file."""
    path = seeded(fresh, prebuilt)
    assert native.check_cached(path, native.flags()) is None
    good = path.read_bytes()
    if damage == "truncated":
        path.write_bytes(good[: len(good) // 2])
    elif damage == "empty":
        path.write_bytes(b"")
    elif damage == "another-source":  # another version of gptkit's library, with a true record
        data = good.replace(native.source_hash().encode(), b"0" * 16)
        path.write_bytes(data)
        write_record(path, data)
    elif damage == "no-record":
        path.with_suffix(".json").unlink()
    else:
        elsewhere = tmp_path / "elsewhere.so"
        path.rename(elsewhere)
        path.symlink_to(elsewhere)
    assert native.check_cached(path, native.flags()) is not None
    assert native.build() == path
    assert native.check_cached(path, native.flags()) is None
    assert not path.is_symlink() and native.read_build_line(path).source == native.source_hash()


def test_a_truncated_library_is_rebuilt_not_loaded_in_a_fresh_process(fresh, prebuilt):
    """What killed a process with SIGBUS: gptkit's first use finding a truncated library."""
    path = seeded(fresh, prebuilt)
    path.write_bytes(prebuilt.read_bytes()[: prebuilt.stat().st_size // 3])
    result = subprocess.run(
        [sys.executable, "-c", "from gptkit import native; print(native.available())"],
        capture_output=True,
        text=True,
        env={**os.environ, "GPTKIT_NATIVE_CACHE": str(fresh)},
        timeout=600,
    )
    assert result.returncode == 0 and result.stdout.strip() == "True", result.stderr
    assert native.check_cached(path, native.flags()) is None


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="names an fd through Linux's /proc")
def test_the_library_is_flushed_to_disk_before_it_is_renamed_into_place(fresh, monkeypatch):
    events = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd):
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        return real_fsync(fd)

    def replace(source, target):
        events.append(("replace", str(source)))
        return real_replace(source, target)

    monkeypatch.setenv("GPTKIT_FSYNC", "1")  # the suite turns durability off for speed
    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    path = native.build()
    renamed = [e[1] for e in events if e[0] == "replace"]
    assert len(renamed) == 2  # the library, then the record of it
    for temporary in renamed:
        assert events.index(("fsync", temporary)) < events.index(("replace", temporary))
    assert events[-1] == ("fsync", str(path.parent))  # and the folder, after both renames
