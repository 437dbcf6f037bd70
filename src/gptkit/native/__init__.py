"""gptkit's native decoding kernels (``decode_step.cpp``), built on this machine on first use.

A decoding step reads every weight once for a few rows of activations; run as PyTorch operators, the
small work between the products (LayerNorms, attention over the cache, GELU, residual adds, ~20
calls a block) cost as much as the products. ``decode_step.cpp`` runs the whole step in one call
with products written for this CPU (AVX-512 or AVX2, picked by the compiler's ``-march=native``).

The library is compiled once per source, compiler and CPU into ``$GPTKIT_NATIVE_CACHE`` (default
``~/.cache/gptkit/native``), with the C++ compiler of ``$CXX`` (``g++`` by default) and OpenMP
where the compiler has it, for this CPU (``$GPTKIT_NATIVE_MARCH``, any ``-march`` value, for
another). Where it cannot be built (no compiler), one warning says so and decoding
keeps PyTorch's kernels. ``GPTKIT_NATIVE=0`` turns it off (the PyTorch layouts, for comparison).
``python -m gptkit.native`` builds it ahead of use (``make setup`` does).
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import warnings
from pathlib import Path

import torch  # loaded first: the library then shares PyTorch's OpenMP runtime (libgomp) and threads

SOURCE = Path(__file__).with_name("decode_step.cpp")
# The CPU the kernels are compiled for: this one by default; `GPTKIT_NATIVE_MARCH=haswell` (any
# -march value) builds for another, such as AVX2 alone on an AVX-512 machine.
MARCH = "GPTKIT_NATIVE_MARCH"


def flag_sets() -> tuple[tuple[str, ...], ...]:
    """Tried in turn until one compiles: tuned for the CPU with OpenMP's threads, tuned without them
    (compilers without OpenMP, such as Apple's clang), generic."""
    march = f"-march={os.environ.get(MARCH, 'native')}"
    return ((march, "-fopenmp"), (march,), ())


COMMON_FLAGS = ("-O3", "-std=c++17", "-shared", "-fPIC", "-fno-math-errno")
BUILD_TIMEOUT_S = 300


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


def cache_dir() -> Path:
    if os.environ.get("GPTKIT_NATIVE_CACHE"):
        return Path(os.environ["GPTKIT_NATIVE_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "gptkit" / "native"


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


def build(compiler: str | None = None) -> Path:
    """Compile decode_step.cpp for this machine (or find it compiled) and return the library's path.
    Raises RuntimeError with the compiler's message when no flag set compiles."""
    compiler = compiler or _compiler()
    if compiler is None:
        raise RuntimeError("no C++ compiler found (set CXX, or install g++)")
    source = SOURCE.read_bytes()
    key = hashlib.sha256(
        b"\0".join(
            [
                source,
                _compiler_version(compiler).encode(),
                _cpu_signature().encode(),
                platform.machine().encode(),
                os.environ.get(MARCH, "native").encode(),
            ]
        )
    ).hexdigest()[:16]
    target = cache_dir() / f"decode_step-{key}.so"
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    errors = []
    for flags in flag_sets():
        try:
            return compile_library(target, flags, compiler)
        except (RuntimeError, subprocess.SubprocessError) as error:  # a failure, or a timeout
            errors.append(f"{' '.join(flags) or 'generic'}: {error}")
    raise RuntimeError(f"{compiler} could not compile {SOURCE.name} ({'; '.join(errors)})")


def compile_library(target: Path, flags: tuple[str, ...] = (), compiler: str | None = None) -> Path:
    """Compile decode_step.cpp with ``flags`` (beside COMMON_FLAGS) into ``target``; RuntimeError
    with the compiler's last line if it fails."""
    compiler = compiler or _compiler() or "g++"
    # Written beside the target and renamed into place: a concurrent build or an interrupted one
    # never leaves a half-written library under the target's name.
    handle, temporary = tempfile.mkstemp(dir=target.parent, suffix=".so.partial")
    os.close(handle)
    try:
        command = [compiler, *COMMON_FLAGS, *flags, str(SOURCE), "-o", temporary]
        result = subprocess.run(command, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
        if result.returncode != 0:
            raise RuntimeError((result.stderr.strip().splitlines() or ["failed"])[-1])
        os.replace(temporary, target)
        return target
    finally:
        if os.path.exists(temporary):
            os.unlink(temporary)


def load(path: Path) -> ctypes.CDLL:
    """The compiled library at ``path``, its functions typed, its structs checked against the mirrors."""
    lib = ctypes.CDLL(str(path))
    for index, struct in enumerate(STRUCTS):
        compiled = lib.gptkit_struct_sizes(index)
        if compiled != ctypes.sizeof(struct):
            raise RuntimeError(
                f"{path.name}: {struct.__name__} is {compiled} bytes, the Python mirror {ctypes.sizeof(struct)}"
            )
    lib.gptkit_decode_step.argtypes = [ctypes.POINTER(Step)]
    lib.gptkit_decode_step.restype = None
    lib.gptkit_product.argtypes = [
        ctypes.POINTER(Matrix),
        ctypes.c_int32,
        ctypes.c_void_p,
        ctypes.c_int32,
        ctypes.c_void_p,
    ]
    lib.gptkit_product.restype = None
    lib.gptkit_step_products.argtypes = [ctypes.POINTER(Step)]
    lib.gptkit_step_products.restype = None
    return lib


def enabled() -> bool:
    """False where ``GPTKIT_NATIVE=0`` turns the native kernels off."""
    return os.environ.get("GPTKIT_NATIVE", "1") != "0"


@functools.cache
def _library() -> ctypes.CDLL | None:
    try:
        return load(build())
    except (RuntimeError, OSError, subprocess.SubprocessError) as error:
        warnings.warn(
            f"gptkit: the native decoding kernels are not available ({error}); decoding uses PyTorch's kernels",
            RuntimeWarning,
            stacklevel=3,
        )
        return None


def loaded() -> ctypes.CDLL:
    """The library that layouts built with the native kernels call, whatever ``GPTKIT_NATIVE`` says
    now (it decides which layout a model gets, not what a model already built runs)."""
    lib = _library()
    if lib is None:
        raise RuntimeError("the native decoding kernels are not available")
    return lib


def available(device: torch.device | str = "cpu") -> bool:
    """Whether decoding on ``device`` uses the native kernels: a CPU, and the library at hand."""
    # Built on first use; where it cannot be, one warning and False from then on.
    return torch.device(device).type == "cpu" and enabled() and _library() is not None


def pointer(tensor: torch.Tensor | None) -> int | None:
    """The address of a contiguous CPU tensor's first element (None for None)."""
    if tensor is None:
        return None
    if not tensor.is_contiguous() or tensor.device.type != "cpu":
        raise ValueError("the native kernels take contiguous CPU tensors")
    return tensor.data_ptr()
