"""Building the native kernels' library and trusting its cache (what :mod:`gptkit.native` loads).

**What is built.** One flag set: ``-march=native -fopenmp`` (``$GPTKIT_NATIVE_MARCH``, any
``-march`` value, for another CPU; ``generic`` for none, the compiler's default target), with the
C++ compiler of ``$CXX`` (``g++`` by default). The library carries a build line: its interface
version, its sources' hash, the flags, the vector code compiled in, OpenMP's version. There is no
fallback build: nothing slower is ever used, or cached, in the full build's place.

**The cache.** ``$GPTKIT_NATIVE_CACHE`` (default ``~/.cache/gptkit/native``), one file per source
(decode_step.cpp and the headers beside it), flags, compiler and CPU (all in the file's name),
beside a record of its size and sha256. The folder must belong to the user and not be writable by
the group or others; else the library is built in a private temporary folder for the process, and
one warning says so. A cached library is loaded only after its size and hash match the record and
the build line inside it matches the source, interface and flags asked for; otherwise it is built
again (an empty or truncated file, a library from another version). Builds are written atomically,
one process at a time (a lock file). A build that fails for a transient reason (a timeout, the
compiler killed or out of memory) leaves nothing behind and is tried again by the next process.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import functools
import hashlib
import json
import os
import platform
import re
import shutil
import signal
import stat
import subprocess
import tempfile
import warnings
from pathlib import Path

from gptkit.io import atomic_write, write_json

try:
    import fcntl
except ImportError:  # Windows: no build lock
    fcntl = None

# The one translation unit compiled; it includes the headers beside it (interface.h, vectors.h, ...).
SOURCE = Path(__file__).with_name("decode_step.cpp")
# interface.h's GPTKIT_ABI: the interface (the structs and functions) this module calls.
ABI = 4
# The CPU the kernels are compiled for: this one by default; `GPTKIT_NATIVE_MARCH=haswell` (any
# -march value) builds for another, such as AVX2 alone on an AVX-512 machine; `generic` passes no
# -march (the compiler's default target: on x86-64, no AVX2, so a build gptkit does not decode with).
MARCH = "GPTKIT_NATIVE_MARCH"
COMMON_FLAGS = ("-O3", "-std=c++17", "-shared", "-fPIC", "-fno-math-errno")
BUILD_TIMEOUT_S = 300
# The vector code gptkit decodes with (the build line's isa=, int8=): anything else is plain loops.
VECTOR_ISAS = {"avx2", "avx512"}
VECTOR_INT8_ISAS = {"avx2", "avx-vnni", "avx512bw", "avx512-vnni"}
# What a compiler says when the machine, not the source, made it fail: tried again next time.
TRANSIENT_MESSAGES = re.compile(
    r"out of memory|virtual memory exhausted|cannot allocate memory|no space left on device|"
    r"killed signal terminated|resource temporarily unavailable",
    re.IGNORECASE,
)
BUILD_MARKER = b"gptkit-native-build "


def flags() -> tuple[str, ...]:
    """The one flag set the library is built with (beside COMMON_FLAGS): tuned for the CPU, with
    OpenMP's threads."""
    march = os.environ.get(MARCH, "native")
    return ("-fopenmp",) if march == "generic" else (f"-march={march}", "-fopenmp")


class BuildError(RuntimeError):
    """The library could not be built; ``transient`` when the machine (time, memory, disk) rather than
    the compiler refused, so that the next process tries again."""

    def __init__(self, message: str, transient: bool = False):
        super().__init__(message)
        self.transient = transient


class Unusable(RuntimeError):
    """The library was built (or found) but gptkit does not decode with it here, and why."""


@dataclasses.dataclass(frozen=True)
class BuildInfo:
    """What a library was built with: decode_step.cpp's build line, parsed."""

    abi: int
    source: str  # source_hash(): the first 16 hex digits of the sources' sha256
    isa: str  # fp32 vector code: avx512, avx2 or generic
    int8: str  # int8 vector code: avx512-vnni, avx512bw, avx-vnni, avx2 or generic
    openmp: int  # OpenMP's version (_OPENMP), 0 without
    flags: str
    bf16: str = "widened"  # bf16 products: avx512-bf16 (the CPU's bf16 units), widened or generic

    @classmethod
    def parse(cls, line: str) -> BuildInfo:
        if not line.startswith(BUILD_MARKER.decode()):
            raise ValueError(f"not a gptkit build line: {line[:80]!r}")
        fields = dict(re.findall(r"(\w+)=(.*?)(?= \w+=|$)", line[len(BUILD_MARKER) :]))
        try:
            return cls(
                int(fields["abi"]),
                fields["source"],
                fields["isa"],
                fields["int8"],
                int(fields["openmp"]),
                fields["flags"],
                fields.get("bf16", "widened"),
            )
        except (KeyError, ValueError) as error:
            raise ValueError(f"a damaged gptkit build line: {line[:200]!r}") from error

    def why_unusable(self) -> str | None:
        """Why gptkit decodes with the PyTorch layouts rather than this library; None: it does not."""
        if self.isa not in VECTOR_ISAS or self.int8 not in VECTOR_INT8_ISAS:
            return (
                f"built without vector code for this CPU (isa={self.isa}, int8={self.int8}, flags "
                f"{self.flags}); its plain loops are slower than PyTorch's kernels"
            )
        if not self.openmp:
            return f"built without OpenMP (flags {self.flags}): one thread, slower than PyTorch's kernels"
        return None


def sources() -> list[Path]:
    """Every file compiled into the library: SOURCE and the headers it includes, which lie beside it
    (every C++ file there, so that a header added later is covered without being listed)."""
    folder = SOURCE.parent
    return sorted(path for pattern in ("*.cpp", "*.h") for path in folder.glob(pattern))


def source_bytes() -> bytes:
    """The sources' names and contents as one string of bytes: a change to any of them (a header
    among them) is a change of the source, and builds the library again."""
    return b"\0".join(part for path in sources() for part in (path.name.encode(), path.read_bytes()))


def source_hash() -> str:
    return hashlib.sha256(source_bytes()).hexdigest()[:16]


# The cache folder ------------------------------------------------------------------------------


def cache_dir() -> Path:
    """Where the library is cached (whether it may be used there is :func:`trusted_cache_dir`'s)."""
    if os.environ.get("GPTKIT_NATIVE_CACHE"):
        return Path(os.environ["GPTKIT_NATIVE_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "gptkit" / "native"


def untrusted(path: Path, *, directory: bool) -> str | None:
    """Why ``path`` (a folder, or a file in one) could hold what someone else put there; None: it is
    this user's alone (on a system without user ids, nothing is checked)."""
    try:
        info = os.lstat(path)
    except OSError as error:
        return f"{path} cannot be read ({error.strerror})"
    kind = stat.S_ISDIR if directory else stat.S_ISREG
    if not kind(info.st_mode):
        return f"{path} is not a {'folder' if directory else 'regular file'} (a link, or something else)"
    if not hasattr(os, "getuid"):
        return None
    if info.st_uid != os.getuid():
        return f"{path} belongs to user id {info.st_uid}, not to this user ({os.getuid()})"
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"{path} is writable by its group or by others (mode {stat.S_IMODE(info.st_mode):o})"
    if directory:  # nobody else may rename it away and put theirs in its place
        for parent in Path(os.path.abspath(path)).parents:
            try:
                above = os.stat(parent)
            except OSError as error:
                return f"{parent} cannot be read ({error.strerror})"
            if above.st_uid not in (0, os.getuid()):
                return f"{parent}, above it, belongs to user id {above.st_uid}"
            shared = above.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
            if shared and not above.st_mode & stat.S_ISVTX:
                return f"{parent}, above it, is writable by others without the sticky bit"
    return None


@functools.cache
def _private_dir() -> Path:
    directory = Path(tempfile.mkdtemp(prefix="gptkit-native-"))  # mode 700, this user's
    atexit.register(shutil.rmtree, directory, ignore_errors=True)
    return directory


def trusted_cache_dir() -> tuple[Path, str | None]:
    """The folder to build and load the library in, and a warning when it is not :func:`cache_dir`:
    that folder, created private where missing, if it is this user's alone; else a private temporary
    folder for this process (the library then built again by each process)."""
    wanted = cache_dir()
    try:
        wanted.parent.mkdir(parents=True, exist_ok=True)
        wanted.mkdir(mode=0o700, exist_ok=True)
    except OSError as error:
        reason = f"{wanted} cannot be created ({error.strerror})"
    else:
        reason = untrusted(wanted, directory=True)
    if reason is None:
        return wanted, None
    return _private_dir(), (
        f"gptkit: the native kernels' cache folder is not safe to load from ({reason}); "
        "building them in a private folder for this process"
    )


# Building --------------------------------------------------------------------------------------


def _compiler() -> str | None:
    for name in (os.environ.get("CXX"), "g++", "c++", "clang++"):
        if name and shutil.which(name):
            return name
    return None


def _cpu_signature() -> str:
    """What -march=native depends on: the CPU's model and feature flags."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
        wanted = [line for line in lines if line.startswith(("model name", "flags", "Features"))]
        return "\n".join(sorted(set(wanted)))
    except OSError:
        return platform.processor() or platform.machine()


def _compiler_version(compiler: str) -> str:
    result = subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=30)
    return result.stdout.splitlines()[0] if result.stdout else compiler


def library_name(compiler: str, build_flags: tuple[str, ...]) -> str:
    """The cached library's file name: a key of the sources, the interface, the flags, the compiler and
    the CPU (a build with other flags never takes another's name)."""
    key = hashlib.sha256(
        b"\0".join(
            [
                source_bytes(),
                str(ABI).encode(),
                " ".join(build_flags).encode(),
                _compiler_version(compiler).encode(),
                _cpu_signature().encode(),
                platform.machine().encode(),
            ]
        )
    ).hexdigest()[:16]
    return f"decode_step-{key}.so"


def _record_path(library: Path) -> Path:
    return library.with_suffix(".json")


def read_build_line(path: Path) -> BuildInfo:
    """The build line inside a library file, read from its bytes (nothing of it runs)."""
    data = path.read_bytes()
    start = data.find(BUILD_MARKER)
    end = data.find(b"\0", start)
    if start < 0 or end < 0:
        raise ValueError(f"{path.name} holds no gptkit build line")
    return BuildInfo.parse(data[start:end].decode("ascii", "replace"))


def check_cached(path: Path, build_flags: tuple[str, ...]) -> str | None:
    """Why the cached library at ``path`` must be built again; None: it is whole, this user's, and
    the build asked for (its size and sha256 those recorded beside it at its build, its build line
    these sources', interface's and flags')."""
    reason = untrusted(path, directory=False)
    if reason:
        return reason
    try:
        record = json.loads(_record_path(path).read_text())
        size, digest = path.stat().st_size, hashlib.sha256(path.read_bytes()).hexdigest()
    except (OSError, ValueError) as error:
        return f"no readable record of its build ({error})"
    if not isinstance(record, dict) or record.get("size") != size or record.get("sha256") != digest:
        return f"its {size} bytes are not the library recorded at its build (empty, truncated or changed)"
    try:
        info = read_build_line(path)
    except ValueError as error:
        return str(error)
    if (info.abi, info.source, info.flags) != (ABI, source_hash(), " ".join(build_flags)):
        return (
            f"built from another source, interface or flags ({info.abi}, {info.source}, {info.flags!r}; "
            f"wanted {ABI}, {source_hash()}, {' '.join(build_flags)!r})"
        )
    return None


@contextlib.contextmanager
def _build_lock(directory: Path):
    """One process builds in ``directory`` at a time (the others wait, then find its library)."""
    if fcntl is None:
        yield
        return
    fd = os.open(directory / "build.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def build(compiler: str | None = None) -> Path:
    """The library for this machine, compiled now or found whole in the cache; its path. Raises
    BuildError with the compiler's message (``transient`` where the machine refused)."""
    compiler = compiler or _compiler()
    if compiler is None:
        raise BuildError("no C++ compiler found (set CXX, or install g++)")
    build_flags = flags()
    directory, warning = trusted_cache_dir()
    if warning:
        warnings.warn(warning, RuntimeWarning, stacklevel=2)
    target = directory / library_name(compiler, build_flags)
    if target.exists() and check_cached(target, build_flags) is None:
        return target
    with _build_lock(directory):
        if target.exists() and check_cached(target, build_flags) is None:
            return target  # built by another process meanwhile
        for stale in (target, _record_path(target)):
            stale.unlink(missing_ok=True)
        return compile_library(target, build_flags, compiler)


def compile_library(target: Path, build_flags: tuple[str, ...] = (), compiler: str | None = None) -> Path:
    """Compile SOURCE with ``build_flags`` (beside COMMON_FLAGS, with the sources' hash and the flags
    in its build line) into ``target``, and record its size and sha256 beside it; BuildError with the
    compiler's last line if it fails. Its headers are found beside it (a quoted #include looks in the
    including file's folder first, wherever the compiler runs). Written atomically (gptkit.io): a
    crash or a concurrent build never leaves a partial library under the target's name."""
    compiler = compiler or _compiler() or "g++"
    defines = (f'-DGPTKIT_SOURCE_HASH="{source_hash()}"', f'-DGPTKIT_FLAGS="{" ".join(build_flags)}"')

    def compile_into(temporary: str) -> None:
        command = [compiler, *COMMON_FLAGS, *build_flags, *defines, str(SOURCE), "-o", temporary]
        try:
            result = subprocess.run(command, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise BuildError(f"{compiler} ran past {BUILD_TIMEOUT_S} s", transient=True) from None
        except OSError as error:
            raise BuildError(f"{compiler} could not be run ({error})") from None
        if result.returncode != 0:
            last = (result.stderr.strip().splitlines() or ["failed"])[-1]
            killed = result.returncode < 0 or result.returncode == 128 + signal.SIGKILL
            transient = killed or bool(TRANSIENT_MESSAGES.search(result.stderr))
            raise BuildError(
                f"{compiler} {' '.join(build_flags)} could not compile {SOURCE.name}: {last}", transient
            )
        if os.path.getsize(temporary) == 0:
            raise BuildError(f"{compiler} wrote an empty library", transient=True)

    atomic_write(target, compile_into)
    data = target.read_bytes()
    record = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest(), "flags": list(build_flags)}
    write_json(_record_path(target), record)
    return target
