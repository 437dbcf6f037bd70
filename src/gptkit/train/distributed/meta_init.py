"""Meta-device initialisation under FSDP2: no process ever holds the whole model.

Built the ordinary way, each of N processes makes the whole fp32 model (GPT-2 XL: 6.2 GB) before
``fully_shard`` keeps its 1/N of it. Here the model is built on the ``meta`` device (shapes, no
memory), sharded, then each process's shards are materialised and filled, as torchtitan does.

The values are the ordinary build's, bit for bit. While the model is built, each of
``torch.nn.init``'s calls on a parameter (the layers' own ``reset_parameters`` and the model's
``_init_weights`` alike) is recorded with the random generator's state before it, and run on
scratch memory that is dropped at once (so the generator advances as in the ordinary build).
When the shards are materialised, each parameter's last call is run again from its recorded state
and this process keeps its rows, the shard FSDP2 gives it, before the next parameter is made. The
init's draws (normal_, uniform_, fills) are made a block of rows at a time, with the whole call's
values and generator state (see ``_ELEMENTWISE``), so that a large matrix (the token embedding) is
never whole here either; any other call runs on a full-size CPU tensor. A seeded run starts from the
weights a single process would (the CPU generator is the one the ordinary build draws from,
whatever the device).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn
from torch.overrides import TorchFunctionMode

from gptkit.model.positions import sinusoidal_positions
from gptkit.train.config import TrainConfig
from gptkit.train.distributed.processes import DistributedContext, wrap_model

# In-place ops on a parameter whose result does not depend on its former values (torch.nn.init's
# ones_ and zeros_ are fill_ and zero_): a parameter's last one gives all its values. Any other
# in-place op on a parameter while the model is built is refused: it would need the former tensor.
_VALUE_FREE = {"fill_", "zero_", "normal_", "uniform_"}
_NOT_DATA = {"requires_grad_", "retain_grad", "share_memory_"}


# Calls whose values, element by element, are drawn in order from the CPU generator (or do not
# draw), so that a parameter can be filled a block of rows at a time with the values and generator
# state of one whole call. ATen's CPU normal_ draws one uniform an element, then turns each aligned
# 16 into normals (a size not divisible by 16 draws its last 16 again): blocks that start on a
# multiple of 16 elements, the last at least 16 long, give the same values. uniform_ draws one an
# element.
_ELEMENTWISE = {
    torch.nn.init.normal_,
    torch.nn.init.uniform_,
    torch.nn.init.zeros_,
    torch.nn.init.ones_,
    torch.nn.init.constant_,
    torch.Tensor.normal_,
    torch.Tensor.uniform_,
    torch.Tensor.fill_,
    torch.Tensor.zero_,
}
BLOCK_BYTES = 8 * 1024 * 1024  # a block of rows filled at once: a whole wte (GPT-2 medium: 206 MB) never is


@dataclass
class _InitCall:
    """A call that set all of a parameter's values, and the generator's state just before it."""

    func: Callable
    args: tuple
    kwargs: dict[str, Any]
    rng_state: torch.Tensor

    def full_tensor(self, shape: torch.Size, dtype: torch.dtype, scratch: _Scratch) -> torch.Tensor:
        """The values the call gave the whole parameter in the ordinary build (in ``scratch``)."""
        torch.set_rng_state(self.rng_state)
        full = scratch.tensor(shape, dtype)
        self.func(full, *self.args, **self.kwargs)
        return full

    def blocks(self, shape: torch.Size, dtype: torch.dtype) -> list[tuple[int, int]] | None:
        """Row ranges [start, stop) that fill the parameter block by block with the whole call's
        values, each at most about BLOCK_BYTES; None where it must be made whole (another kind of
        call, one row, or small enough)."""
        if (
            self.func not in _ELEMENTWISE
            or len(shape) < 2
            or math.prod(shape) * dtype.itemsize <= BLOCK_BYTES
        ):
            return None
        row = math.prod(shape[1:])
        step = 16 // math.gcd(row, 16)  # rows a block starts on: a multiple of 16 elements
        per_block = max(step, BLOCK_BYTES // (row * dtype.itemsize) // step * step)
        starts = list(range(0, shape[0], per_block))
        if (shape[0] - starts[-1]) * row < 16:  # a last block shorter than 16 joins the one before
            starts.pop()
        return [(start, stop) for start, stop in zip(starts, starts[1:] + [shape[0]])]

    def fill(
        self,
        shape: torch.Size,
        dtype: torch.dtype,
        scratch: _Scratch,
        rows: tuple[int, int] = (0, 0),
        out: torch.Tensor | None = None,
    ) -> None:
        """Run the call as the ordinary build did (the generator advanced as by it) and copy rows
        [rows[0], rows[1]) of its values into ``out``: block by block where :meth:`blocks` allows."""
        blocks = self.blocks(shape, dtype)
        if blocks is None:
            full = self.full_tensor(shape, dtype, scratch)
            if out is not None:
                out.copy_(full[rows[0] : rows[1]])
            return
        torch.set_rng_state(self.rng_state)
        first, last = rows
        for start, stop in blocks:
            block = scratch.tensor((stop - start, *shape[1:]), dtype)
            self.func(block, *self.args, **self.kwargs)
            lo, hi = max(start, first), min(stop, last)
            if out is not None and lo < hi:
                out[lo - first : hi - first].copy_(block[lo - start : hi - start])

    def largest_block(self, shape: torch.Size, dtype: torch.dtype) -> int:
        """The bytes of scratch :meth:`fill` needs."""
        blocks = self.blocks(shape, dtype)
        rows = shape[0] if blocks is None else max(stop - start for start, stop in blocks)
        return rows * math.prod(shape[1:]) * dtype.itemsize


class _Scratch:
    """One CPU buffer for every whole parameter in turn. Allocating and freeing one tensor per
    parameter, between allocations that stay (the shards, the generator states), fragments
    glibc's heap: measured on GPT-2 medium, the freed memory stayed resident, as much as the model."""

    def __init__(self):
        self.buffer = torch.empty(0, dtype=torch.uint8, device="cpu")

    def tensor(self, shape: torch.Size, dtype: torch.dtype) -> torch.Tensor:
        nbytes = math.prod(shape) * dtype.itemsize
        if self.buffer.numel() < nbytes:
            self.buffer = torch.empty(0, dtype=torch.uint8, device="cpu")  # the old one freed first
            self.buffer = torch.empty(nbytes, dtype=torch.uint8, device="cpu")
        return self.buffer[:nbytes].view(dtype).view(shape)

    def fit(self, nbytes: int) -> None:
        """At most ``nbytes`` kept (the largest parameter still to come)."""
        if self.buffer.numel() > nbytes:
            self.buffer = torch.empty(0, dtype=torch.uint8, device="cpu")
            self.buffer = torch.empty(nbytes, dtype=torch.uint8, device="cpu")


class _RecordInit(TorchFunctionMode):
    """Records, for each meta parameter, the last ``torch.nn.init`` function or value-free in-place
    op called on it, running it on a full-size CPU tensor that is dropped at once."""

    def __init__(self):
        super().__init__()
        self.calls: dict[int, _InitCall] = {}  # id(meta parameter) -> its last call
        self.scratch = _Scratch()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        name = getattr(func, "__name__", "")
        is_init = getattr(func, "__module__", None) == "torch.nn.init"
        in_place = name.endswith("_") and not name.startswith("_") and name not in _NOT_DATA
        if is_init or (in_place and args):
            tensor = args[0] if args else kwargs.pop("tensor")
            if isinstance(tensor, nn.Parameter) and tensor.is_meta:
                if not is_init and name not in _VALUE_FREE:
                    raise RuntimeError(f"meta initialisation cannot apply {name} to a parameter being built")
                call = _InitCall(func, tuple(args[1:]), kwargs, torch.get_rng_state())
                call.fill(tensor.shape, tensor.dtype, self.scratch)  # the generator advances
                self.calls[id(tensor)] = call
                return tensor
            return func(tensor, *args[1:], **kwargs) if not args else func(*args, **kwargs)
        return func(*args, **kwargs)


def dim0_rows(n_rows: int, rank: int, world_size: int) -> tuple[int, int]:
    """This rank's rows [start, stop) of a parameter as FSDP2 shards it: ``torch.chunk`` on dim 0
    (the last ranks get none when there are fewer rows than ranks)."""
    per_rank = -(-n_rows // world_size)
    start = min(rank * per_rank, n_rows)
    return start, min(start + per_rank, n_rows)


def meta_init_applies(train: TrainConfig) -> bool:
    """Whether the model is built on the meta device: under FSDP2."""
    return train.fsdp


def build_sharded(
    build: Callable[[], nn.Module],
    ctx: DistributedContext,
    train: TrainConfig,
    loaded: dict[str, torch.Tensor] | None = None,
    source: str = "loaded weights",
) -> tuple[nn.Module, nn.Module]:
    """``build()``'s model, sharded by FSDP2 (:func:`wrap_model`) without ever being whole here:
    (the model, the wrapped model). Its values are ``loaded``'s (parameter name -> whole tensor,
    read one at a time: a file's mapped tensors), else ``build()``'s own init, the generator
    drawn from exactly as ``build()`` on the CPU."""
    recorder = _RecordInit()
    with torch.device("meta"), recorder:
        model = build()
    after_build = torch.get_rng_state()
    if loaded is not None:
        _check_loaded(model, loaded, source)
        names = {id(param): name for name, param in model.named_parameters()}
    where = {  # a parameter's module and name outlive the parameter, which fully_shard replaces
        (id(module), name): _LoadedTensor(loaded, names[id(param)])
        if loaded is not None
        else recorder.calls[id(param)]
        for module in model.modules()
        for name, param in module._parameters.items()
        if param is not None
    }
    wrapped = wrap_model(model, ctx, train)
    params = {id(param) for param in model.parameters()}
    # The shards live where FSDP2 keeps them: on the host with CPU offload, else on the device.
    # Buffers are not offloaded: FSDP2 keeps them on the device, where the forward pass reads them.
    device = torch.device("cpu") if train.fsdp_offload else ctx.device

    def materialised(tensor: torch.Tensor) -> torch.Tensor:
        """``tensor``'s memory, as ``to_empty`` makes it: a parameter's shard where FSDP2 keeps it,
        a buffer on the processes' device (computed below)."""
        return torch.empty_like(tensor, device=device if id(tensor) in params else ctx.device)

    with torch.no_grad():
        # to_empty's own path (nn.Module._apply, after which FSDP2 takes up the new shards). The
        # shards are filled only after it: FSDP2 copies a rank's short last shard into a padded one
        # (rank 1's rows of GPT-2 medium's token embedding: 98 MiB), and an unfilled tensor's pages
        # are not yet resident, so that copy adds nothing to the peak.
        model._apply(materialised)
        _fill_shards(model, where, recorder.scratch, ctx)
        _restore_buffers(model)
    torch.set_rng_state(after_build)
    return model, wrapped


def _fill_shards(model: nn.Module, where: dict, scratch: _Scratch, ctx: DistributedContext) -> None:
    """Each parameter's shard (this rank's rows) filled from ``where`` (its module and name -> the
    init call or loaded tensor), a block or a parameter at a time through ``scratch``, which keeps
    no more than what the parameters still to come need."""
    todo: dict[int, tuple[nn.Parameter, object]] = {}  # a tied weight is filled once
    for module in model.modules():
        for name, param in module._parameters.items():
            if param is not None:
                todo.setdefault(id(param), (param, where[(id(module), name)]))
    to_come = Counter(call.largest_block(p.shape, p.dtype) for p, call in todo.values())
    for param, call in todo.values():
        local = param.to_local() if hasattr(param, "to_local") else param
        start, stop = dim0_rows(param.shape[0], ctx.rank, ctx.world_size)
        if local.shape != (stop - start, *param.shape[1:]):
            raise RuntimeError(
                f"meta initialisation: a shard of shape {tuple(local.shape)}, not the "
                f"{(stop - start, *param.shape[1:])} of FSDP2's dim-0 chunks of {tuple(param.shape)}"
            )
        call.fill(param.shape, param.dtype, scratch, (start, stop), local)
        to_come[call.largest_block(param.shape, param.dtype)] -= 1
        scratch.fit(max((size for size, n in to_come.items() if n > 0), default=0))


@dataclass
class _LoadedTensor:
    """A parameter's whole value, read from loaded weights when its shard is made."""

    state: dict[str, torch.Tensor]
    name: str

    def fill(self, shape, dtype, scratch, rows: tuple[int, int], out: torch.Tensor) -> None:
        whole = self.state.pop(self.name)  # dropped once copied: its pages leave memory
        out.copy_(whole[rows[0] : rows[1]])

    def largest_block(self, shape: torch.Size, dtype: torch.dtype) -> int:
        return 0  # read from the file, not made in scratch


def _check_loaded(model: nn.Module, loaded: dict[str, torch.Tensor], source: str) -> None:
    """The loaded tensors are the model's parameters, name for name and shape for shape."""
    expected = dict(model.named_parameters())
    missing, unexpected = sorted(set(expected) - set(loaded)), sorted(set(loaded) - set(expected))
    wrong = [n for n in set(expected) & set(loaded) if loaded[n].shape != expected[n].shape]
    if missing or unexpected or wrong:
        raise ValueError(
            f"{source}: the parameters do not match the config: "
            f"missing {missing[:8]}, unexpected {unexpected[:8]}, of another shape {sorted(wrong)[:8]}"
        )


def _restore_buffers(model: nn.Module) -> None:
    """Buffers are computed, not initialised: the sinusoidal positions, made again on their device."""
    names = {name.rsplit(".", 1)[-1] for name, _ in model.named_buffers()}
    if names - {"sinusoids"}:
        raise RuntimeError(
            f"meta initialisation cannot restore the buffer(s) {sorted(names - {'sinusoids'})}"
        )
    for module in model.modules():
        if getattr(module, "sinusoids", None) is not None:
            config = module.config
            module.sinusoids.copy_(sinusoidal_positions(config.context_length, config.d_model))
