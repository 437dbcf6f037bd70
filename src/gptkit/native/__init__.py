"""gptkit's native decoding kernels (``decode_step.cpp`` and the headers beside it), built on this
machine on first use, and used only where they win.

A decoding step reads every weight once for a few rows of activations; run as PyTorch operators, the
small work between the products (LayerNorms, attention over the cache, GELU, residual adds, ~20
calls a block) cost as much as the products. ``decode_step.cpp`` runs the whole step in one call
with products written for this CPU (AVX-512 or AVX2, picked by the compiler's ``-march=native``),
split between OpenMP threads.

The library is built and its cache trusted by :mod:`gptkit.native.library`; it says what it was
built with (:func:`report`, ``python -m gptkit.native``). gptkit decodes through it only when it has
vector code for this CPU (AVX2 or AVX-512) and OpenMP's threads; otherwise (no compiler, a compiler
without OpenMP such as Apple's clang, an ARM or pre-AVX2 CPU, whose plain loops were measured at 9.0
against 3.5 ms a step for the PyTorch layouts) decoding uses the PyTorch layouts, and one warning
says why. Any failure to build or load does the same.

**Threads.** Every call runs on ``torch.get_num_threads()`` threads, passed in (a thread PyTorch
never set up, such as a server's engine thread, would otherwise read OpenMP's default), one team at
a time in a process (:data:`TEAM`); the barrier between a step's phases spins for a bounded time,
then sleeps (team.h).

``GPTKIT_NATIVE=0`` turns the kernels off (the PyTorch layouts, for comparison). ``python -m
gptkit.native`` builds them ahead of use (``make setup`` does) and prints the report.
"""

from __future__ import annotations

import ctypes
import functools
import os
import sys
import threading
import warnings
from pathlib import Path

import torch  # loaded first: the library then shares PyTorch's OpenMP runtime (libgomp) and threads

from gptkit.native.library import (  # noqa: F401 (the package's names)
    ABI,
    MARCH,
    SOURCE,
    BuildError,
    BuildInfo,
    Unusable,
    build,
    cache_dir,
    check_cached,
    compile_library,
    flags,
    library_name,
    read_build_line,
    source_hash,
    trusted_cache_dir,
    untrusted,
)


class Matrix(ctypes.Structure):
    """interface.h's ``Matrix``: one weight matrix (out, in)."""

    _fields_ = [
        ("weight", ctypes.c_void_p),
        ("bias", ctypes.c_void_p),
        ("scale", ctypes.c_void_p),
        ("row_sum", ctypes.c_void_p),
        ("out", ctypes.c_int32),
        ("in_", ctypes.c_int32),
    ]


class Layer(ctypes.Structure):
    """interface.h's ``Layer``: a block's LayerNorms and four matrices."""

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
    """interface.h's ``Step``: one call's sizes, weights, tokens, paged cache and output layer."""

    _fields_ = [
        ("n_layer", ctypes.c_int32),
        ("d_model", ctypes.c_int32),
        ("n_head", ctypes.c_int32),
        ("pre_ln", ctypes.c_int32),
        ("activation", ctypes.c_int32),
        ("format", ctypes.c_int32),
        ("eps", ctypes.c_float),
        ("layers", ctypes.c_void_p),
        ("lnf_weight", ctypes.c_void_p),
        ("lnf_bias", ctypes.c_void_p),
        ("tokens", ctypes.c_int32),
        ("x", ctypes.c_void_p),
        ("sequence", ctypes.c_void_p),
        ("column", ctypes.c_void_p),
        ("keys", ctypes.c_void_p),
        ("values", ctypes.c_void_p),
        ("cache_format", ctypes.c_int32),
        ("pages", ctypes.c_int32),
        ("page_size", ctypes.c_int32),
        ("block_table", ctypes.c_void_p),
        ("table_width", ctypes.c_int32),
        ("mask", ctypes.c_void_p),
        ("mask_width", ctypes.c_int32),
        ("lm_head", ctypes.c_void_p),
        ("lm_format", ctypes.c_int32),
        ("n_logits", ctypes.c_int32),
        ("logit_tokens", ctypes.c_void_p),
        ("logits", ctypes.c_void_p),
        ("n_choosable", ctypes.c_int32),
        ("argmax", ctypes.c_void_p),
    ]


STRUCTS = (Matrix, Layer, Step)  # in the order of gptkit_struct_sizes' argument
# interface.h's Format of a matrix (and of a cache), by the dtype it is stored in.
FORMATS = {torch.float32: 0, torch.bfloat16: 1, torch.int8: 2}
# interface.h's PANEL (output rows a panel holds) and group_size (inputs a lane takes at a time).
PANEL = 16
GROUP = {torch.float32: 1, torch.bfloat16: 2, torch.int8: 4}
TILE_GROUPS = 16  # bf16 and int8 panels' groups are padded to a multiple of this (interface.h)

# One team of native threads at a time in this process: two threads calling the kernels at once (a
# server's engine and its embeddings batcher on one model) would run two teams on the same cores.
# Every call below holds it; a caller may hold it around PyTorch work of its own (it is re-entrant).
TEAM = threading.RLock()


def enabled() -> bool:
    """False where ``GPTKIT_NATIVE=0`` turns the native kernels off."""
    return os.environ.get("GPTKIT_NATIVE", "1") != "0"


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
        lib.gptkit_step.argtypes = [ctypes.POINTER(Step), ctypes.c_int32]
        lib.gptkit_step.restype = None
        lib.gptkit_product.argtypes = [
            ctypes.POINTER(Matrix),
            ctypes.c_int32,
            ctypes.c_void_p,
            ctypes.c_int32,
            ctypes.c_void_p,
            ctypes.c_int32,
        ]
        lib.gptkit_product.restype = None
        lib.gptkit_last_team_size.restype = ctypes.c_int32

    def step(self, step: Step) -> None:
        """Every block (and the output layer, where asked) for the step's tokens."""
        with TEAM:
            self.lib.gptkit_step(ctypes.byref(step), torch.get_num_threads())

    def product(self, matrix: Matrix, format: int, x: int, rows: int, y: int) -> None:
        """y = x·Wᵀ + b, x (rows, in) and y (rows, out) fp32 at the addresses ``x`` and ``y``."""
        with TEAM:
            self.lib.gptkit_product(ctypes.byref(matrix), format, x, rows, y, torch.get_num_threads())

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
        out |= {
            "isa": info.isa,
            "bf16": info.bf16,
            "int8": info.int8,
            "openmp": info.openmp,
            "built_with": info.flags,
        }
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


def pack(weight: torch.Tensor) -> torch.Tensor:
    """``weight`` (out, in), fp32, bf16 or int8, in the panels the native products read
    (interface.h's Matrix): (panels, groups, 16, g), 16 output rows a panel, their inputs in groups
    of g (fp32 1, bf16 2, int8 4), padded with zeros to whole panels and groups (bf16 and int8 to
    a multiple of 16 groups: a tile of the CPU's matrix units)."""
    out, inputs = weight.shape
    g = GROUP[weight.dtype]
    panels, groups = -(-out // PANEL), -(-inputs // g)
    if g > 1:  # bf16 and int8: whole tiles of the matrix units (16 groups)
        groups = -(-groups // TILE_GROUPS) * TILE_GROUPS
    padded = torch.zeros(panels * PANEL, groups * g, dtype=weight.dtype)
    padded[:out, :inputs] = weight.detach()
    packed = torch.empty(panels, groups, PANEL, g, dtype=weight.dtype)
    _ask_for_huge_pages(packed)  # before its pages are first written, when the kernel lays them out
    return packed.copy_(padded.view(panels, PANEL, groups, g).permute(0, 2, 1, 3))


MADV_HUGEPAGE = 14  # Linux's madvise advice: back this range with 2 MB pages where it can
HUGE_PAGE = 2 << 20


def _ask_for_huge_pages(tensor: torch.Tensor) -> None:
    """Ask Linux to back a large tensor with 2 MB pages (where transparent huge pages are on for
    those who ask, as is common): a step streams every weight, and with 4 KB pages it also walks a
    page table every 4 KB (GPT-2 small, fp32, one token: 2.5% faster with them, alternating).
    Elsewhere, or if refused, nothing happens."""
    if sys.platform != "linux" or tensor.numel() * tensor.element_size() < 2 * HUGE_PAGE:
        return
    start = (tensor.data_ptr() + 4095) & ~4095
    length = (tensor.data_ptr() + tensor.numel() * tensor.element_size() - start) & ~4095
    try:
        ctypes.CDLL(None).madvise(ctypes.c_void_p(start), ctypes.c_size_t(length), MADV_HUGEPAGE)
    except (OSError, AttributeError):
        pass


def unpack(packed: torch.Tensor, out: int, inputs: int) -> torch.Tensor:
    """The matrix (out, in) that :func:`pack` packed."""
    panels, groups, _, g = packed.shape
    return packed.permute(0, 2, 1, 3).reshape(panels * PANEL, groups * g)[:out, :inputs]


def matrix(
    packed: torch.Tensor,
    out: int,
    inputs: int,
    bias: torch.Tensor | None = None,
    scale: torch.Tensor | None = None,
    row_sum: torch.Tensor | None = None,
) -> Matrix:
    """A matrix (out, in) packed by :func:`pack` as the native kernels take it, with fp32 biases and,
    for int8, each row's scale and integer sum (padded to the panels). The tensors must outlive the
    matrix (the model holds them)."""
    return Matrix(pointer(packed), pointer(bias), pointer(scale), pointer(row_sum), out, inputs)


def product(matrix: Matrix, dtype: torch.dtype, x: torch.Tensor) -> torch.Tensor:
    """x·Wᵀ + b through the native kernels, W stored in ``dtype``, for any leading shape of ``x``;
    fp32 out."""
    if x.size(-1) != matrix.in_:
        raise ValueError(f"input of {x.size(-1)} features for a matrix of {matrix.in_} inputs")
    rows = x.reshape(-1, x.size(-1)).float().contiguous()
    y = torch.empty(rows.size(0), matrix.out, dtype=torch.float32)
    loaded().product(matrix, FORMATS[dtype], rows.data_ptr(), rows.size(0), y.data_ptr())
    return y.view(*x.shape[:-1], matrix.out)
