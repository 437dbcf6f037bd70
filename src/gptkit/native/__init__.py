"""gptkit's native decoding kernels (``decode_step.cpp``), built on this machine on first use, and
used only where they win.

A decoding step reads every weight once for a few rows of activations; run as PyTorch operators, the
small work between the products (LayerNorms, attention over the cache, GELU, residual adds, ~20
calls a block) cost as much as the products. ``decode_step.cpp`` runs the whole step in one call
with products written for this CPU (AVX-512 or AVX2, picked by the compiler's ``-march=native``),
split between OpenMP threads.

**What is built.** One flag set: ``-march=native -fopenmp`` (``$GPTKIT_NATIVE_MARCH``, any
``-march`` value, for another CPU; ``generic`` for none, the compiler's default target), with the
C++ compiler of ``$CXX`` (``g++`` by default). The library says what it was built with
(:func:`report`, ``python -m gptkit.native``): its interface version, the source's hash, the flags,
the vector code compiled in, OpenMP's version. gptkit decodes through it only when it has vector
code for this CPU (AVX2 or AVX-512) and OpenMP's threads; otherwise (no compiler, a compiler without
OpenMP such as Apple's clang, an ARM or pre-AVX2 CPU, whose plain loops were measured at 9.0 against
3.5 ms a step for the PyTorch layouts) decoding uses the PyTorch layouts, and one warning says why.
There is no fallback build: nothing slower is ever used, or cached, in the full build's place.

**The cache.** ``$GPTKIT_NATIVE_CACHE`` (default ``~/.cache/gptkit/native``), one file per source,
flags, compiler and CPU (all in the file's name), beside a record of its size and sha256. The
folder must belong to the user and not be writable by the group or others; else the library is
built in a private temporary folder for the process, and one warning says so. A cached library is
loaded only after its size and hash match the record and the build line inside it matches the
source, interface and flags asked for; otherwise it is built again (an empty or truncated file, a
library from another version). Builds write a temporary file, ``fsync`` it and rename it into
place, one process at a time (a lock file). A build that fails for a transient reason (a timeout,
the compiler killed or out of memory) leaves nothing behind and is tried again by the next process.
Any failure to build or load gives the PyTorch layouts and one warning.

**Threads.** Every call runs on ``torch.get_num_threads()`` threads, passed in (a thread PyTorch
never set up, such as a server's engine thread, would otherwise read OpenMP's default), one team at
a time in a process (:data:`TEAM`); the barrier between a step's phases spins for a bounded time,
then sleeps (decode_step.cpp).

``GPTKIT_NATIVE=0`` turns the kernels off (the PyTorch layouts, for comparison). ``python -m
gptkit.native`` builds them ahead of use (``make setup`` does) and prints the report.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
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
import threading
import warnings
from pathlib import Path

import torch  # loaded first: the library then shares PyTorch's OpenMP runtime (libgomp) and threads

from gptkit.io import atomic_write, write_json

try:
    import fcntl
except ImportError:  # Windows: no build lock
    fcntl = None

SOURCE = Path(__file__).with_name("decode_step.cpp")
# decode_step.cpp's GPTKIT_ABI: the interface (the structs and functions) this module calls.
ABI = 2
# The CPU the kernels are compiled for: this one by default; `GPTKIT_NATIVE_MARCH=haswell` (any
# -march value) builds for another, such as AVX2 alone on an AVX-512 machine; `generic` passes no
# -march (the compiler's default target: on x86-64, no AVX2, so a build gptkit does not decode with).
MARCH = "GPTKIT_NATIVE_MARCH"
COMMON_FLAGS = ("-O3", "-std=c++17", "-shared", "-fPIC", "-fno-math-errno")
BUILD_TIMEOUT_S = 300
# The vector code gptkit decodes with (decode_step.cpp's isa=, int8=): anything else is plain loops.
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


class Matrix(ctypes.Structure):
    """decode_step.cpp's ``Matrix``: one weight matrix (out, in)."""

    _fields_ = [
        ("weight", ctypes.c_void_p),
        ("bias", ctypes.c_void_p),
        ("scale", ctypes.c_void_p),
        ("row_sum", ctypes.c_void_p),
        ("out", ctypes.c_int32),
        ("in_", ctypes.c_int32),
    ]


class Layer(ctypes.Structure):
    """decode_step.cpp's ``Layer``: a block's LayerNorms and four matrices."""

    _fields_ = [
        ("ln1_weight", ctypes.c_void_p),
        ("ln1_bias", ctypes.c_void_p),
        ("ln2_weight", ctypes.c_void_p),
        ("ln2_bias", ctypes.c_void_p),
        ("qkv", Matrix),
        ("attn_out", Matrix),
        ("fc", Matrix),
        ("mlp_out", Matrix),
    ]


class Step(ctypes.Structure):
    """decode_step.cpp's ``Step``: one decoding step's sizes, weights, cache and activations."""

    _fields_ = [
        ("n_layer", ctypes.c_int32),
        ("rows", ctypes.c_int32),
        ("d_model", ctypes.c_int32),
        ("n_head", ctypes.c_int32),
        ("capacity", ctypes.c_int32),
        ("past", ctypes.c_int32),
        ("cache_rows", ctypes.c_int32),
        ("pre_ln", ctypes.c_int32),
        ("activation", ctypes.c_int32),
        ("format", ctypes.c_int32),
        ("eps", ctypes.c_float),
        ("layers", ctypes.c_void_p),
        ("lnf_weight", ctypes.c_void_p),
        ("lnf_bias", ctypes.c_void_p),
        ("keys", ctypes.c_void_p),
        ("values", ctypes.c_void_p),
        ("mask", ctypes.c_void_p),
        ("x", ctypes.c_void_p),
    ]


STRUCTS = (Matrix, Layer, Step)  # in the order of gptkit_struct_sizes' argument
# decode_step.cpp's Format of a matrix, by the dtype it is stored in.
FORMATS = {torch.float32: 0, torch.bfloat16: 1, torch.int8: 2}

# One team of native threads at a time in this process: two threads calling the kernels at once (a
# server's engine and its embeddings batcher on one model) would run two teams on the same cores.
# Every call below holds it; a caller may hold it around PyTorch work of its own (it is re-entrant).
TEAM = threading.RLock()


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
    source: str  # the first 16 hex digits of decode_step.cpp's sha256
    isa: str  # fp32/bf16 vector code: avx512, avx2 or generic
    int8: str  # int8 vector code: avx512-vnni, avx512bw, avx-vnni, avx2 or generic
    openmp: int  # OpenMP's version (_OPENMP), 0 without
    flags: str

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


def source_hash() -> str:
    return hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:16]


def enabled() -> bool:
    """False where ``GPTKIT_NATIVE=0`` turns the native kernels off."""
    return os.environ.get("GPTKIT_NATIVE", "1") != "0"


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
    """The cached library's file name: a key of the source, the interface, the flags, the compiler and
    the CPU (a build with other flags never takes another's name)."""
    key = hashlib.sha256(
        b"\0".join(
            [
                SOURCE.read_bytes(),
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
    this source's, interface's and flags')."""
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
    """Compile decode_step.cpp with ``build_flags`` (beside COMMON_FLAGS, with the source's hash and
    the flags in its build line) into ``target``, and record its size and sha256 beside it; BuildError
    with the compiler's last line if it fails. Written atomically (gptkit.io): a crash or a concurrent
    build never leaves a partial library under the target's name."""
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


# Loading and calling ---------------------------------------------------------------------------


class Kernels:
    """A loaded library: its build line, and its functions, each called on ``torch.get_num_threads()``
    threads while holding :data:`TEAM`."""

    def __init__(self, path: Path):
        self.path = path
        self.lib = lib = ctypes.CDLL(str(path))
        lib.gptkit_build_info.restype = ctypes.c_char_p
        self.info = BuildInfo.parse(lib.gptkit_build_info().decode())
        if self.info.abi != ABI:
            raise RuntimeError(f"{path.name} has interface {self.info.abi}, this gptkit {ABI}")
        for index, struct in enumerate(STRUCTS):
            compiled = lib.gptkit_struct_sizes(index)
            if compiled != ctypes.sizeof(struct):
                raise RuntimeError(
                    f"{path.name}: {struct.__name__} is {compiled} bytes, the Python mirror {ctypes.sizeof(struct)}"
                )
        lib.gptkit_decode_step.argtypes = [ctypes.POINTER(Step), ctypes.c_int32]
        lib.gptkit_decode_step.restype = None
        lib.gptkit_product.argtypes = [
            ctypes.POINTER(Matrix),
            ctypes.c_int32,
            ctypes.c_void_p,
            ctypes.c_int32,
            ctypes.c_void_p,
            ctypes.c_int32,
        ]
        lib.gptkit_product.restype = None
        lib.gptkit_step_products.argtypes = [ctypes.POINTER(Step), ctypes.c_int32]
        lib.gptkit_step_products.restype = None
        lib.gptkit_last_team_size.restype = ctypes.c_int32

    def decode_step(self, step: Step) -> None:
        with TEAM:
            self.lib.gptkit_decode_step(ctypes.byref(step), torch.get_num_threads())

    def product(self, matrix: Matrix, format: int, x: int, rows: int, y: int) -> None:
        """y = x·Wᵀ + b, x (rows, in) and y (rows, out) fp32 at the addresses ``x`` and ``y``."""
        with TEAM:
            self.lib.gptkit_product(ctypes.byref(matrix), format, x, rows, y, torch.get_num_threads())

    def step_products(self, step: Step) -> None:
        with TEAM:
            self.lib.gptkit_step_products(ctypes.byref(step), torch.get_num_threads())

    def last_team_size(self) -> int:
        """The threads of the last team the library ran."""
        return self.lib.gptkit_last_team_size()


def load(path: Path) -> Kernels:
    """The compiled library at ``path``, its functions typed, its structs checked against the mirrors."""
    return Kernels(path)


def openmp_runtimes() -> list[str]:
    """The OpenMP runtimes loaded in this process (Linux's /proc): one, PyTorch's, where the library
    shares PyTorch's threads; two where it brought its own (both pools then hold threads)."""
    try:
        maps = Path("/proc/self/maps").read_text().splitlines()
    except OSError:
        return []
    names = ("libgomp", "libiomp", "libomp.")
    return sorted({line.split()[-1] for line in maps if any(n in line.rsplit("/", 1)[-1] for n in names)})


def _load_usable() -> Kernels:
    """The library, built or found; Unusable (or a build or load error) where gptkit must not decode
    with it."""
    path = build()
    try:
        kernels = load(path)
    except (OSError, AttributeError, ValueError, RuntimeError) as error:
        raise RuntimeError(f"{path} could not be loaded ({error})") from error
    reason = kernels.info.why_unusable()
    if reason:
        raise Unusable(reason)
    return kernels


@functools.cache
def _library() -> Kernels | None:
    try:
        return _load_usable()
    except Exception as error:  # noqa: BLE001 (any failure: PyTorch's layouts, and this one line)
        if isinstance(error, Unusable):
            why = f"the native decoding kernels were {error}"
        elif isinstance(error, BuildError) and error.transient:
            why = f"the native decoding kernels could not be built ({error}; tried again next time)"
        else:
            why = f"the native decoding kernels are not available ({error})"
        warnings.warn(f"gptkit: {why}; decoding uses PyTorch's layouts", RuntimeWarning, stacklevel=3)
        return None


def loaded() -> Kernels:
    """The library that layouts built with the native kernels call, whatever ``GPTKIT_NATIVE`` says
    now (it decides which layout a model gets, not what a model already built runs)."""
    lib = _library()
    if lib is None:
        raise RuntimeError("the native decoding kernels are not available")
    return lib


def available(device: torch.device | str = "cpu") -> bool:
    """Whether decoding on ``device`` uses the native kernels: a CPU, and a library with vector code
    and threads for it at hand."""
    # Built on first use; where it cannot be, or must not be used, one warning and False from then on.
    return torch.device(device).type == "cpu" and enabled() and _library() is not None


def report() -> dict:
    """What the native kernels are here: whether gptkit decodes with them and why not, and what the
    library was built with (for ``python -m gptkit.native`` and the benchmarks' records)."""
    out: dict = {"enabled": enabled(), "abi": ABI, "source": source_hash(), "flags": " ".join(flags())}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            path = build()
        out["library"] = str(path)
        info = read_build_line(path)
        out |= {"isa": info.isa, "int8": info.int8, "openmp": info.openmp, "built_with": info.flags}
        out["unusable"] = info.why_unusable()
    except Exception as error:  # noqa: BLE001 (reported, not raised)
        out["unusable"] = f"not built: {error}"
    out["used"] = available()
    out["openmp_runtimes"] = openmp_runtimes()
    out["threads"] = torch.get_num_threads()
    return out


def pointer(tensor: torch.Tensor | None) -> int | None:
    """The address of a contiguous CPU tensor's first element (None for None)."""
    if tensor is None:
        return None
    if not tensor.is_contiguous() or tensor.device.type != "cpu":
        raise ValueError("the native kernels take contiguous CPU tensors")
    return tensor.data_ptr()
