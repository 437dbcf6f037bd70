"""llama.cpp's `llama-server`, built from the llama.cpp the project tests against, cached between runs.

The llama.cpp is the one vendored in the source distribution of llama-cpp-python at the version pinned in
constraints.txt (the `llama` extra's). `llama_server()` returns the path of its `llama-server`, built with
BUILD_FLAGS on first use (the sdist fetched with `pip download`, `vendor/llama.cpp` extracted, CMake
building the one target) and kept as

    ~/.cache/gptkit/llama-server/<version>-<hash of BUILD_FLAGS and the CPU's flags>/llama-server

(GGML_NATIVE=ON compiles for this CPU, so another CPU builds its own). The build runs in a temporary
folder beside the cache and its result is renamed into place, so a build cut short leaves nothing that
looks finished. Where it cannot be built (no cmake or compiler, the download refused, a failed or
overlong build) it raises LlamaServerUnavailable with the reason. Imported by serve_peers.py; run on its
own it does nothing (`make bench` runs every file here).
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

from common import REPO

BUILD_FLAGS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_OPENSSL=OFF",
    "-DGGML_NATIVE=ON",
    "-DLLAMA_USE_PREBUILT_UI=OFF",
    "-DLLAMA_BUILD_UI=OFF",
    "-DBUILD_SHARED_LIBS=OFF",
)
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "gptkit" / "llama-server"
DOWNLOAD_LIMIT_S = 600.0
# The build alone took 4 min 11 s on 2 cores; a machine busy with other work takes longer.
BUILD_LIMIT_S = float(os.environ.get("GPTKIT_LLAMA_BUILD_LIMIT_S", "2400"))


class LlamaServerUnavailable(Exception):
    """llama-server could not be had here; the message says why."""


def pinned_version() -> str:
    """llama-cpp-python's version in constraints.txt."""
    found = re.search(r"^llama-cpp-python==(\S+)", (REPO / "constraints.txt").read_text(), re.MULTILINE)
    if not found:
        raise LlamaServerUnavailable("constraints.txt pins no llama-cpp-python version")
    return found.group(1)


def cpu_flags() -> str:
    """The CPU's feature flags (what GGML_NATIVE compiles for), or the machine's name where unknown."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return " ".join(sorted(line.split(":", 1)[1].split()))
    except OSError:
        pass
    return f"{platform.machine()} {platform.processor()}"


def cache_folder(version: str) -> Path:
    key = hashlib.sha256("\n".join([*BUILD_FLAGS, cpu_flags()]).encode()).hexdigest()[:12]
    return CACHE / f"{version}-{key}"


def llama_server() -> tuple[Path, dict]:
    """(the binary, how it was had: cached or built, the version, the flags, the build's seconds)."""
    version = pinned_version()
    folder = cache_folder(version)
    binary = folder / "llama-server"
    about = {"version": version, "llama_cpp_python_sdist": f"llama-cpp-python=={version}"}
    about |= {"cmake_flags": list(BUILD_FLAGS), "binary": str(binary)}
    if binary.is_file() and os.access(binary, os.X_OK):
        return binary, about | {"how": "cached"} | build_record(folder)
    missing = [tool for tool in ("cmake", "c++", "cc") if shutil.which(tool) is None]
    if missing:
        raise LlamaServerUnavailable(f"cannot build llama-server: no {', '.join(missing)} on PATH")
    try:
        seconds = build_into(version, folder, about)
    except (OSError, tarfile.TarError) as e:
        raise LlamaServerUnavailable(f"building llama-server: {type(e).__name__}: {e}") from None
    return binary, about | {"how": "built", "build_seconds": seconds}


def build_into(version: str, folder: Path, about: dict) -> float:
    """Build llama-server in a temporary folder beside ``folder`` and rename it into place: the seconds."""
    CACHE.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=".build-", dir=CACHE))
    try:
        started = time.monotonic()
        built = build(version, work)
        seconds = round(time.monotonic() - started, 1)
        done = work / "done"
        done.mkdir()
        shutil.copy2(built, done / "llama-server")
        (done / "build.json").write_text(json.dumps({"seconds": seconds, **about}))
        if folder.exists() and not (folder / "llama-server").is_file():
            shutil.rmtree(folder)  # not one of ours: they appear whole or not at all
        try:
            os.rename(done, folder)  # atomic; a build that finished first keeps its place
        except OSError:
            if not (folder / "llama-server").is_file():
                raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return seconds


def build_record(folder: Path) -> dict:
    try:
        return {"build_seconds": json.loads((folder / "build.json").read_text())["seconds"]}
    except (OSError, ValueError, KeyError):
        return {}


def run(command: list[str], limit_s: float, what: str, cwd: Path | None = None) -> None:
    """``command``, its output kept; LlamaServerUnavailable with its end if it fails or runs too long."""
    try:
        done = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=limit_s)
    except subprocess.TimeoutExpired:
        raise LlamaServerUnavailable(f"{what} ran past its {limit_s:.0f} s limit") from None
    if done.returncode != 0:
        tail = (done.stdout + done.stderr).strip().splitlines()[-5:]
        raise LlamaServerUnavailable(f"{what} failed ({done.returncode}): {' | '.join(tail)}")


def build(version: str, work: Path) -> Path:
    """Fetch the sdist, extract vendor/llama.cpp, build llama-server in ``work``; the binary's path."""
    run(
        [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:"]
        + [f"llama-cpp-python=={version}", "-d", str(work / "sdist"), "-q"],
        DOWNLOAD_LIMIT_S,
        f"pip download llama-cpp-python=={version}",
    )
    sdists = sorted((work / "sdist").glob("llama_cpp_python-*.tar.gz"))
    if not sdists:
        raise LlamaServerUnavailable("pip download gave no llama_cpp_python-*.tar.gz")
    source = extract_llama_cpp(sdists[0], work / "src")
    deadline = time.monotonic() + BUILD_LIMIT_S
    run(["cmake", "-S", str(source), "-B", str(work / "build"), *BUILD_FLAGS], BUILD_LIMIT_S, "cmake")
    jobs = str(os.cpu_count() or 1)
    run(
        ["cmake", "--build", str(work / "build"), "--target", "llama-server", "-j", jobs],
        max(1.0, deadline - time.monotonic()),
        "cmake --build --target llama-server",
    )
    binary = work / "build" / "bin" / "llama-server"
    if not binary.is_file():
        raise LlamaServerUnavailable(f"the build left no {binary.relative_to(work)}")
    return binary


def extract_llama_cpp(sdist: Path, into: Path) -> Path:
    """The sdist's vendor/llama.cpp, extracted under ``into``: the folder."""
    with tarfile.open(sdist) as archive:
        members = [m for m in archive.getmembers() if "/vendor/llama.cpp/" in f"{m.name}/"]
        if not members:
            raise LlamaServerUnavailable(f"{sdist.name} holds no vendor/llama.cpp")
        kwargs = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
        archive.extractall(into, members=members, **kwargs)
    top = members[0].name.split("/", 1)[0]
    return into / top / "vendor" / "llama.cpp"
