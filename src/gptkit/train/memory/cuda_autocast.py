"""CUDA autocast's precision per operator, applied to CPU tensors: the estimate's `--target gpu`.

The estimate runs its step on fake CPU tensors (a CPU build of PyTorch cannot run autograd on fake
CUDA tensors: its gradient accumulators abort the process), where CPU autocast's rules apply, and
they are not CUDA's: CPU autocast leaves LayerNorm, softmax and log-softmax in bf16, where CUDA
autocast runs them in fp32 and keeps fp32 copies for the backward pass. Inside
:func:`cuda_autocast_rules`, every operator that either autocast handles gets a CPU autocast kernel
that does what CUDA's does. Which arguments CUDA's kernel casts, and to what, is not a list copied
here: it is asked of CUDA's own autocast kernel, which a CPU build of PyTorch contains. For each
operator and input dtypes (once, then cached) the arguments are mirrored as fake CUDA tensors, CUDA
autocast is switched on, the operator is called, and the casts its kernel makes are recorded up to
the first computing operation, which is stopped before anything runs. The same casts are then
applied to the CPU tensors, under autograd, and the operator runs below autocast, as on a GPU.

Lower precision is probed as bf16 (CUDA's lists are the same for fp16 and bf16; an fp16 input is
presented as bf16 so that no fp16-only CUDA path, such as softmax's fused half-to-float, hides the
cast). One difference stays: an operator that CUDA runs in fp32 by adding ``dtype=float32`` to its
own call (``sum``, ``cumsum``, the norms) rather than by casting its input keeps the input's dtype
here. CUDA autocast caches the low-precision copy of a weight across uses within one autocast
region; here each use casts again, which only matters for a weight used twice in one forward pass.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_unflatten

from gptkit.train.memory.torch_internals import drop_library, has_kernel, ops_with_kernel, without_key

CUDA_KEY, CPU_KEY = "AutocastCUDA", "AutocastCPU"


class _Stop(Exception):
    """Raised where CUDA's autocast kernel hands the operator its arguments: they are recorded."""


class _CastRecorder(TorchDispatchMode):
    """Remembers which argument each cast CUDA's autocast kernel makes comes from."""

    def __init__(self, positions: dict[int, int]):
        super().__init__()
        self.positions = positions  # id(mirror or its cast) -> the argument's position

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func is torch.ops.aten._to_copy.default and id(args[0]) in self.positions:
            self.positions[id(out)] = self.positions[id(args[0])]
        return out


# A call as CUDA autocast makes it: the argument structure, and each leaf either ("argument",
# position in the original call, dtype to cast it to) or ("value", the value autocast passes).
CudaCall = tuple[Any, list[tuple]]
_calls: dict[tuple, CudaCall] = {}  # (operator, structure, dtypes and values) -> the call


def cuda_call(op: torch._ops.OpOverload, args: tuple, kwargs: dict) -> CudaCall:
    """How CUDA's autocast kernel calls ``op`` with these arguments (bf16 as the lower
    precision): it runs on fake CUDA mirrors of them, and an autograd kernel for CUDA, registered
    for the moment, records what reaches it and stops. Needs a fake tensor mode in force."""
    flat, spec = tree_flatten((args, kwargs))
    key = (op, spec, tuple(arg.dtype if isinstance(arg, torch.Tensor) else arg for arg in flat))
    if key in _calls:
        return _calls[key]
    mirrors, positions = [], {}
    for position, arg in enumerate(flat):
        if isinstance(arg, torch.Tensor):
            dtype = torch.bfloat16 if arg.dtype == torch.float16 else arg.dtype
            arg = torch.empty_strided(arg.shape, arg.stride(), dtype=dtype, device="cuda")
            positions[id(arg)] = position
        mirrors.append(arg)
    reached: list[CudaCall] = []

    def record(*inner_args, **inner_kwargs):
        inner, inner_spec = tree_flatten((inner_args, inner_kwargs))
        leaves = [
            ("argument", positions[id(leaf)], leaf.dtype)
            if isinstance(leaf, torch.Tensor)
            else ("value", leaf)
            for leaf in inner
        ]
        reached.append((inner_spec, leaves))
        raise _Stop

    library = torch.library.Library("aten", "IMPL")
    enabled, dtype = torch.is_autocast_enabled("cuda"), torch.get_autocast_dtype("cuda")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # replacing the autograd kernel, for this call only
            library.impl(op, record, "AutogradCUDA")
        torch.set_autocast_enabled("cuda", True)
        torch.set_autocast_dtype("cuda", torch.bfloat16)
        mirror_args, mirror_kwargs = tree_unflatten(mirrors, spec)
        with without_key(CPU_KEY), torch.no_grad(), _CastRecorder(positions):
            op(*mirror_args, **mirror_kwargs)
    except _Stop:
        pass
    finally:
        torch.set_autocast_enabled("cuda", enabled)
        torch.set_autocast_dtype("cuda", dtype)
        drop_library(library)
    if not reached:
        raise RuntimeError(f"CUDA autocast's kernel for {op} did not call it: its rule is unknown")
    _calls[key] = reached[0]
    return reached[0]


def _as_cuda_calls(call: CudaCall, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """The CPU arguments ``args``, ``kwargs`` cast and completed as ``call`` says."""
    spec, leaves = call
    flat = tree_flatten((args, kwargs))[0]
    lower = torch.get_autocast_dtype("cpu")
    values = []
    for leaf in leaves:
        if leaf[0] == "value":
            values.append(leaf[1])
            continue
        tensor, dtype = flat[leaf[1]], leaf[2]
        dtype = lower if dtype == torch.bfloat16 else dtype  # bf16 stood for the lower precision
        values.append(tensor if tensor.dtype == dtype else tensor.to(dtype))
    return tree_unflatten(values, spec)


def _aten_overloads(names: set[str]) -> dict[str, torch._ops.OpOverload]:
    """The aten operators among ``names`` (``aten::softmax.int``), by name."""
    found = {}
    for name in sorted(names):
        base, _, overload = name.removeprefix("aten::").partition(".")
        packet = getattr(torch.ops.aten, base, None) if name.startswith("aten::") else None
        if packet is not None and hasattr(packet, overload or "default"):
            found[name] = getattr(packet, overload or "default")
    return found


def _kernel(op: torch._ops.OpOverload, cuda_listed: bool):
    """The CPU autocast kernel for ``op`` that does what CUDA autocast does with it."""
    composite = has_kernel(op.name(), "CompositeImplicitAutograd")

    def kernel(*args, **kwargs):
        if cuda_listed:
            args, kwargs = _as_cuda_calls(cuda_call(op, args, kwargs), args, kwargs)
        if cuda_listed or not composite:
            with without_key(CPU_KEY):
                return op(*args, **kwargs)
        # Not CUDA's: on a GPU it falls through autocast to its decomposition, whose operators
        # (cross-entropy's log-softmax and NLL loss) meet autocast in turn.
        return op.decompose(*args, **kwargs)

    return kernel


@contextlib.contextmanager
def cuda_autocast_rules() -> Iterator[None]:
    """CPU autocast behaves as CUDA autocast does, operator by operator, until the context ends
    (the CPU's own kernels are then restored). For fake tensors: the rules are probed on fake CUDA
    tensors made in the fake tensor mode in force."""
    cuda_ops = set(ops_with_kernel(CUDA_KEY))
    library = torch.library.Library("aten", "IMPL")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "overriding a previously registered kernel": meant
            for name, op in _aten_overloads(cuda_ops | set(ops_with_kernel(CPU_KEY))).items():
                library.impl(op, _kernel(op, name in cuda_ops), CPU_KEY)
        yield
    finally:
        drop_library(library)
