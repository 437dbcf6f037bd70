"""What the hardware computes fast: the device to run on and the precision to run in.

bf16 is only fast where the hardware multiplies it natively: CUDA GPUs with bf16 support, and CPUs
with AVX512-BF16 or AMX. Elsewhere (an AVX2-only CPU, say) PyTorch falls back to a slow path: a
bf16 matrix product measured 30-65× slower than fp32 there, which turns a 10-minute run into hours.
So ``precision="auto"`` (training) picks bf16 only on such hardware, and ``dtype="auto"``
(inference) picks what decodes faster, which a short measurement decides on CPUs: one decoding step
multiplies vectors by matrices, bounded by memory rather than arithmetic, so half-size bf16 weights
can win even on a CPU without bf16 instructions.

CUDA GPUs without bf16 (the T4 and V100 of free notebook services) have fp16 tensor cores
instead: there ``auto`` trains in fp16 autocast with dynamic loss scaling (gptkit.train.precision),
and runs inference in float16. fp16 on a CPU is a storage format and a way to try a GPU's recipe:
a CPU without AMX-FP16 multiplies fp16 matrices on a slow path (on an AVX-512 CPU with bf16
instructions, 5x fp32's time for x·Wᵀ and 30-100x for a plain product of square matrices), so
``auto`` never picks it there.

MPS (Apple GPUs) runs in fp32: its bf16 support depends on the macOS version, and it is untested
here.
"""

from __future__ import annotations

import ctypes
import functools
import os
import platform
import time
import warnings
from dataclasses import dataclass
from typing import Literal, NamedTuple, get_args

import torch

# The help text of every --device flag.
DEVICE_HELP = "auto (CUDA, then MPS, then CPU), cpu, cuda[:N] or mps."

# oneDNN (PyTorch's CPU matmul library) ISA levels from which bf16 runs natively; ONEDNN_MAX_CPU_ISA
# below them makes bf16 matmuls fall back to the slow path even on a CPU that has the instructions.
_ONEDNN_BF16_ISAS = {
    "ALL",
    "DEFAULT",
    "AVX512_CORE_BF16",
    "AVX512_CORE_FP16",
    "AVX512_CORE_AMX",
    "AVX512_CORE_AMX_FP16",
    "AVX10_1_512",
    "AVX10_1_512_AMX",
    "AVX10_1_512_AMX_FP16",
    "AVX10_2_512",
    "AVX10_2_512_AMX_2",
}
# The levels from which oneDNN multiplies fp16 with AMX-FP16.
_ONEDNN_FP16_ISAS = {"ALL", "DEFAULT", "AVX512_CORE_AMX_FP16", "AVX10_1_512_AMX_FP16", "AVX10_2_512_AMX_2"}
# GPUs that multiply fp16 at least at fp32's rate: tensor cores from Volta (7.0) on, and before them
# the P100 (6.0) and the Jetsons (5.3, 6.2) at twice fp32's rate. The other Pascal parts (6.1: GTX 10
# series, P4, P40) run fp16 arithmetic at a 64th of fp32's rate, and Maxwell (5.0, 5.2) has none.
_FP16_TENSOR_CORES = (7, 0)
_FAST_FP16_BEFORE_VOLTA = {(5, 3), (6, 0), (6, 2)}


@dataclass(frozen=True)
class Support:
    """Whether the hardware does something natively, and why (for the message)."""

    native: bool
    reason: str


def resolve_device(device: str | None = "auto") -> torch.device:
    """``auto`` (or None): CUDA, then MPS, then the CPU. ``cuda:1`` and the like pass through."""
    name = "auto" if device is None else str(device)
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    try:
        resolved = torch.device(name)
    except RuntimeError as e:
        raise ValueError(f"device must be auto, cpu, cuda[:N] or mps, got {name!r}") from e
    if resolved.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {name!r} was asked for, but PyTorch sees no CUDA GPU; use --device cpu")
    if resolved.type == "mps" and not torch.backends.mps.is_available():
        raise ValueError(f"device {name!r} was asked for, but MPS is not available here; use --device cpu")
    return resolved


def cpu_capability() -> dict[str, object]:
    """What this CPU offers PyTorch: its vector ISA, bf16 instructions, and any limit set by environment."""
    return {
        "aten_capability": torch.backends.cpu.get_cpu_capability(),
        "avx512_bf16": bool(torch.cpu._is_avx512_bf16_supported()),
        "amx": bool(torch.cpu._is_amx_tile_supported()),
        "onednn_max_cpu_isa": os.environ.get("ONEDNN_MAX_CPU_ISA"),
        "threads": torch.get_num_threads(),
    }


def cpu_bf16_native() -> Support:
    """Whether this CPU multiplies bf16 natively (AVX512-BF16 or AMX, not capped by ONEDNN_MAX_CPU_ISA)."""
    info = cpu_capability()
    if not (info["avx512_bf16"] or info["amx"]):
        return Support(False, f"this CPU ({info['aten_capability']}) has no AVX512-BF16 or AMX instructions")
    isa = (info["onednn_max_cpu_isa"] or "ALL").upper()
    if isa not in _ONEDNN_BF16_ISAS:
        return Support(False, f"ONEDNN_MAX_CPU_ISA={isa} keeps oneDNN from the CPU's bf16 instructions")
    return Support(True, "this CPU has " + ("AMX" if info["amx"] else "AVX512-BF16"))


def bf16_native(device: torch.device) -> Support:
    """Whether ``device`` computes bf16 matrix products natively, and why."""
    if device.type == "cuda":
        if torch.cuda.is_bf16_supported(including_emulation=False):
            return Support(True, f"{torch.cuda.get_device_name(device)} supports bf16")
        return Support(False, f"{torch.cuda.get_device_name(device)} has no native bf16")
    if device.type == "cpu":
        return cpu_bf16_native()
    return Support(False, f"{device.type} runs fp32 in gptkit (bf16 there is untested)")


def fp16_native(device: torch.device) -> Support:
    """Whether ``device`` multiplies fp16 matrices natively (at least at fp32's rate: see
    ``_FAST_FP16_BEFORE_VOLTA``; AMX-FP16 on a CPU), and why."""
    if device.type == "cuda":
        name, capability = torch.cuda.get_device_name(device), tuple(torch.cuda.get_device_capability(device))
        version = ".".join(map(str, capability))
        if capability >= _FP16_TENSOR_CORES or capability in _FAST_FP16_BEFORE_VOLTA:
            return Support(True, f"{name}, of compute capability {version}, computes fp16 natively")
        return Support(False, f"{name}, of compute capability {version}, has no fast fp16")
    if device.type == "cpu":
        info = cpu_capability()
        if not torch.cpu._is_amx_fp16_supported():
            return Support(False, f"this CPU ({info['aten_capability']}) has no AMX-FP16 instructions")
        isa = (info["onednn_max_cpu_isa"] or "ALL").upper()
        if isa not in _ONEDNN_FP16_ISAS:
            return Support(False, f"ONEDNN_MAX_CPU_ISA={isa} keeps oneDNN from the CPU's fp16 instructions")
        return Support(True, "this CPU has AMX-FP16")
    return Support(False, f"{device.type} runs fp32 in gptkit (fp16 there is untested)")


@functools.cache
def matmul_dtype(device: torch.device) -> torch.dtype:
    """The dtype in which ``device`` multiplies matrices fastest: bf16 where it is native, else fp32."""
    return torch.bfloat16 if bf16_native(device).native else torch.float32


# One vocabulary of number formats for every command: training's ``precision`` (what the matrix
# products compute in: bf16 or fp16 autocast over fp32 weights) and inference's ``dtype`` (what the
# weights are stored in) both take these; float32, bfloat16 and float16 are the same formats' other
# names, so that either spelling of a flag keeps working.
Precision = Literal["auto", "fp32", "bf16", "fp16", "float32", "bfloat16", "float16"]
# What the precision is for: training (autocast), decoding one token at a time, or scoring whole sequences.
PrecisionUse = Literal["training", "decoding", "scoring"]

_FORMATS = {
    "fp32": torch.float32,
    "float32": torch.float32,
    "bf16": torch.bfloat16,
    "bfloat16": torch.bfloat16,
    "fp16": torch.float16,
    "float16": torch.float16,
}
_NAMES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}


class Choice(NamedTuple):
    """A resolved precision, and why it was taken (to print once)."""

    dtype: torch.dtype
    reason: str

    @property
    def name(self) -> str:
        """The format's short name, fp32, bf16 or fp16, as run records keep it."""
        return _NAMES[self.dtype]


def canonical_precision(spec: str | None) -> str:
    """``spec`` in one spelling: auto, fp32, bf16 or fp16 (None is auto). Anything else is a ValueError."""
    name = "auto" if spec is None else spec
    if name == "auto":
        return name
    if name not in _FORMATS:
        raise ValueError(f"precision must be one of {', '.join(get_args(Precision))}, got {name!r}")
    return _NAMES[_FORMATS[name]]


def resolve_precision(spec: str | None, device: torch.device, use: PrecisionUse) -> Choice:
    """The dtype that ``spec`` (a :data:`Precision`; None is auto) means on ``device`` for ``use``.

    Training: ``auto`` is bf16 autocast where the hardware has it natively, else fp16 autocast (with
    dynamic loss scaling) on a CUDA GPU with fast fp16, else fp32; an explicit bf16 or fp16 on
    hardware without it still runs, with a warning that says what it costs. Inference: ``auto`` is
    bf16 on a CUDA GPU with bf16, float16 on one without it but with fast fp16, and fp32 on MPS; on
    a CPU, for decoding (one token at a time) whichever of fp32 and bf16 a short measurement finds
    faster, and for scoring whole sequences (perplexity, evaluation) bf16 only where the CPU
    multiplies it natively. An explicit float16 is taken anywhere, as a storage format (on a CPU
    without fp16 instructions its products take PyTorch's slow path; the reason says so).
    """
    if use not in get_args(PrecisionUse):
        raise ValueError(f"use must be one of {', '.join(get_args(PrecisionUse))}, got {use!r}")
    name = canonical_precision(spec)
    if use == "training":
        return _training_precision(name, device)
    return _inference_precision(name, device, decoding=use == "decoding")


# What a training format costs on hardware without it, for the warning.
_SLOW_TRAINING = {
    "bf16": "matrix products take a slow path, measured 30-65x slower than fp32 on such CPUs",
    "fp16": "matrix products take a slow path, measured 5-100x slower than fp32 on an AVX-512 CPU (a "
    "GTX 10-series GPU multiplies fp16 at a 64th of fp32's rate)",
}


def _training_precision(name: str, device: torch.device) -> Choice:
    native = bf16_native(device)
    if name == "auto":
        if native.native:
            return Choice(torch.bfloat16, f"auto: bf16 autocast, since {native.reason}")
        half = fp16_native(device)
        if device.type == "cuda" and half.native:
            reason = f"auto: fp16 autocast with dynamic loss scaling, since {native.reason} and {half.reason}"
            return Choice(torch.float16, reason)
        return Choice(torch.float32, f"auto: fp32, since {native.reason}")
    support = fp16_native(device) if name == "fp16" else native
    if name in _SLOW_TRAINING and not support.native:
        warnings.warn(
            f"--precision {name} on hardware without native {name} ({support.reason}): "
            f"{_SLOW_TRAINING[name]}; --precision auto picks {_training_precision('auto', device).name} here",
            stacklevel=3,
        )
    return Choice(_FORMATS[name], f"{name}, as asked ({support.reason})")


def _inference_precision(name: str, device: torch.device, decoding: bool) -> Choice:
    if name == "fp16" and not fp16_native(device).native:
        # Decoding's matrix-vector products are bound by memory, where half-size weights help anyway.
        cost = "" if decoding else ": products over whole sequences take a slow path"
        return Choice(torch.float16, f"float16, as asked ({fp16_native(device).reason}{cost})")
    if name != "auto":
        return Choice(_FORMATS[name], f"{_long_name(_FORMATS[name])}, as asked")
    if device.type == "cpu" and decoding:
        faster, speedup = _cpu_decoding_prefers_bf16()
        measured = f"bf16 weights measured {speedup:.2f}x fp32's speed for decoding on this CPU"
        return Choice(torch.bfloat16 if faster else torch.float32, f"auto: {measured}")
    native = bf16_native(device)
    if native.native:
        return Choice(torch.bfloat16, f"auto: bfloat16, since {native.reason}")
    half = fp16_native(device)
    if device.type == "cuda" and half.native:
        return Choice(torch.float16, f"auto: float16, since {native.reason} and {half.reason}")
    return Choice(torch.float32, f"auto: float32, since {native.reason}")


def _long_name(dtype: torch.dtype) -> str:
    """float32 or bfloat16: inference's messages name the weights' dtype as torch does."""
    return str(dtype).removeprefix("torch.")


@functools.cache
def onednn_packing_available() -> bool:
    """Whether weights can be prepacked for oneDNN's linear op here (gptkit.model.linears.PackedLinear):
    an x86-64 CPU, where the gain was measured, and a PyTorch with the ops (private, hence checked)."""
    return (
        platform.machine().lower() in ("x86_64", "amd64")
        and torch.backends.mkldnn.is_available()
        and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
        and hasattr(torch.ops.mkldnn, "_linear_pointwise")
    )


def onednn_pack(weight: torch.Tensor) -> torch.Tensor:
    """``weight`` (out, in) reordered into oneDNN's blocked layout: an opaque tensor for
    :func:`onednn_linear`, which takes any number of rows. No batch-size hint: with the hint of one
    row, oneDNN picked an fp32 kernel that streamed GPT-2 small's 49 matrices about 12% slower for
    one row (14.3-15.4 against 12.6-13.9 ms, alternating; bf16 the same either way)."""
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach().contiguous(), None)


def onednn_linear(
    x: torch.Tensor,
    packed: torch.Tensor,
    bias: torch.Tensor | None,
    activation: tuple[str, str] = ("none", ""),
) -> torch.Tensor:
    """x · Wᵀ + b with a weight from :func:`onednn_pack`; ``activation``: oneDNN's post-op applied to
    the result, (name, algorithm), e.g. ("gelu", "tanh")."""
    name, algorithm = activation
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, name, [], algorithm)


def onednn_linear_add(
    x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None, other: torch.Tensor
) -> torch.Tensor:
    """other + x · Wᵀ + b in one oneDNN call (the sum as a post-op)."""
    return torch.ops.mkldnn._linear_pointwise.binary(x, other, packed, bias, "add")


def fbgemm_pack(q: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None):
    """The int8 matrix ``q`` (out, in), whose row i stands for scale[i]·q[i], prepacked for FBGEMM's
    dynamically quantized product (``torch.ops.quantized.linear_dynamic``), with the fp32 ``bias``;
    None where FBGEMM is missing (off x86-64, or a PyTorch without its quantized ops)."""
    if "fbgemm" not in torch.backends.quantized.supported_engines or not hasattr(
        torch.ops.quantized, "linear_dynamic"
    ):
        return None
    engine = torch.backends.quantized.engine
    try:
        torch.backends.quantized.engine = "fbgemm"  # the packing (and so the kernel) FBGEMM's
        with warnings.catch_warnings():
            # PyTorch marks its quantized tensor types deprecated; the packed matrix is one of them.
            warnings.simplefilter("ignore", UserWarning)
            zero_points = torch.zeros(q.size(0), dtype=torch.long)
            qweight = torch._make_per_channel_quantized_tensor(q, scale.double(), zero_points, 0)
            return torch.ops.quantized.linear_prepack(qweight, bias)
    finally:
        torch.backends.quantized.engine = engine


@functools.cache
def _malloc_trim():
    """glibc's malloc_trim, or None where the C library is not glibc (macOS, musl, Windows)."""
    try:
        return ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None


def release_freed_memory() -> None:
    """Give the pages that freed allocations leave inside the C heap back to the OS (glibc's
    malloc_trim; elsewhere nothing). Loading a model to convert it block by block frees a block's
    temporaries between the next block's allocations, and glibc keeps most of those pages: loading
    GPT-2 small into int8, what the process then held varied from 280 to 430 MB between runs, and
    was 237 MB with a trim after each block."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


def has_decoding_layout(dtype: torch.dtype, device: torch.device) -> bool:
    """Whether gptkit.model.layouts.decoding_layout applies: fp32 or bf16 weights on a CPU."""
    return device.type == "cpu" and dtype in (torch.float32, torch.bfloat16)


def packs_for_onednn(dtype: torch.dtype, device: torch.device) -> bool:
    """Whether the decoding layout prepacks ``dtype`` matrices for oneDNN on ``device``: fp32, or bf16
    where the CPU multiplies it natively, on a CPU with PyTorch's oneDNN ops."""
    if device.type != "cpu" or not onednn_packing_available():
        return False
    return dtype == torch.float32 or (dtype == torch.bfloat16 and cpu_bf16_native().native)


def _decoding_product(weight: torch.Tensor):
    """x ↦ x·Wᵀ as a CPU decoding step multiplies a row by these weights (gptkit.model.layouts.decoding_layout:
    prepacked for oneDNN where it applies, fp32 transposed where oneDNN is missing, else as stored)."""
    if packs_for_onednn(weight.dtype, weight.device):
        packed = onednn_pack(weight)
        return lambda x: onednn_linear(x, packed, None)
    if weight.dtype == torch.float32 and weight.device.type == "cpu":
        transposed = weight.t().contiguous()
        return lambda x: x @ transposed
    return lambda x: torch.nn.functional.linear(x, weight)


@functools.cache
def _cpu_decoding_prefers_bf16() -> tuple[bool, float]:
    """Time one matrix-vector product as decoding runs it, fp32 against bf16 weights, on a matrix
    larger than the caches (64 MB in fp32).

    Returns (bf16 is at least 10% faster, fp32 time / bf16 time). About 0.25 s on an idle 2-core
    machine (more under load): the first few calls are slow while oneDNN prepares its kernels, so
    each dtype is warmed up first.
    """
    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(4096, 4096, generator=generator)
    vector = torch.randn(1, 4096, generator=generator)
    inputs = {
        dtype: (vector.to(dtype), _decoding_product(weight.to(dtype)))
        for dtype in (torch.float32, torch.bfloat16)
    }
    for x, product in inputs.values():
        for _ in range(10):
            product(x)
    # Rounds alternate the two dtypes, so that a burst of load from elsewhere hits both alike.
    timings = {dtype: float("inf") for dtype in inputs}
    for _ in range(4):
        for dtype, (x, product) in inputs.items():
            for _ in range(5):
                started = time.perf_counter()
                product(x)
                timings[dtype] = min(timings[dtype], time.perf_counter() - started)
    speedup = timings[torch.float32] / timings[torch.bfloat16]
    return speedup >= 1.1, speedup


@functools.cache
def matmul_peak_flops(device: torch.device, dtype: torch.dtype) -> float:
    """FLOP/s of a square matrix product on ``device`` in ``dtype``, measured here: the peak that a
    training run's model FLOPs utilisation (MFU) is against. Best of 3 after a warm-up; 1024² on a
    CPU (about 0.1 s in all), 4096² on a GPU. fp16 where it is not native is timed as x·Wᵀ (the
    layout of a linear layer's forward): PyTorch's slow path took 5 s for a plain 1024² product on
    a CPU, 0.27 s for x·Wᵀ."""
    n = 1024 if device.type == "cpu" else 4096
    # A generator of its own: drawing from torch's global one would shift a run's dropout masks, and
    # a resumed run (which measures again) would no longer end on the uninterrupted run's weights.
    generator = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(n, n, device=device, generator=generator).to(dtype)
    b = torch.randn(n, n, device=device, generator=generator).to(dtype)
    if dtype == torch.float16 and not fp16_native(device).native:
        b = b.t()
    synchronize = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    a @ b
    best = float("inf")
    for _ in range(3):
        synchronize()
        started = time.perf_counter()
        a @ b
        synchronize()
        best = min(best, time.perf_counter() - started)
    return 2 * n**3 / max(best, 1e-9)


def describe(device: torch.device | None = None) -> dict[str, object]:
    """The hardware facts a benchmark or a run records: CPU capability, and the GPU when there is one."""
    info: dict[str, object] = {"cpu": cpu_capability(), "cpu_bf16_native": cpu_bf16_native().native}
    if torch.cuda.is_available():
        info["gpu"] = {
            "name": torch.cuda.get_device_name(0),
            "count": torch.cuda.device_count(),
            "bf16": torch.cuda.is_bf16_supported(including_emulation=False),
        }
    return info


def machine_summary() -> str:
    """This machine in the one line a benchmark's record keeps: the CPU's model name, its cores, torch's
    version and its threads ("AMD EPYC, 2 cores, torch 2.13.0+cpu, 2 threads")."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            names = [line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("model name")]
        cpu = names[0] if names else cpu
    except OSError:  # not Linux
        pass
    return f"{cpu}, {os.cpu_count()} cores, torch {torch.__version__}, {torch.get_num_threads()} threads"
