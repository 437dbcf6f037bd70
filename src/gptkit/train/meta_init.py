"""Meta-device initialisation under FSDP2: no process ever holds the whole model.

Built the ordinary way, each of N processes makes the whole fp32 model (GPT-2 XL: 6.2 GB) before
``fully_shard`` keeps its 1/N of it. Here the model is built on the ``meta`` device (shapes, no
memory), sharded, then each process's shards are materialised and filled, as torchtitan does.

The values are the ordinary build's, bit for bit: while the model is built, each of
``torch.nn.init``'s calls (the layers' own ``reset_parameters`` and the model's ``_init_weights``
alike, in the same order) runs on a full-size CPU tensor drawn from the same generator, and this
process keeps only its rows of the result, the shard FSDP2 will give it. So one tensor is whole at a
time, never the model; and a seeded run starts from the weights a single process would (the CPU
generator is the one the ordinary build draws from, whatever the device).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn as nn
from torch.overrides import TorchFunctionMode

from gptkit.model.positions import sinusoidal_positions
from gptkit.train.config import TrainConfig
from gptkit.train.distributed import DistributedContext, wrap_model

# In-place ops on a parameter whose result does not depend on its former values (torch.nn.init's
# ones_ and zeros_ are fill_ and zero_); any other in-place op on a parameter while the model is
# built is refused, since its result would need the whole former tensor.
_VALUE_FREE = {"fill_", "zero_", "normal_", "uniform_"}
_NOT_DATA = {"requires_grad_", "retain_grad", "share_memory_"}


class _ShardedInit(TorchFunctionMode):
    """``torch.nn.init``'s functions and value-free in-place ops, called on a meta parameter,
    fill a full-size CPU tensor in its place and keep ``shard(result)``; the meta parameter is left
    as it is (it has no memory)."""

    def __init__(self, shard: Callable[[torch.Tensor], torch.Tensor]):
        super().__init__()
        self.shard = shard
        self.values: dict[int, torch.Tensor] = {}  # id(meta parameter) -> its shard's values, the latest

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
                full = torch.empty(tensor.shape, dtype=tensor.dtype, device="cpu")
                func(full, *args[1:], **kwargs)  # the same draws as on a CPU-built model
                self.values[id(tensor)] = self.shard(full)
                return tensor
            return func(tensor, *args[1:], **kwargs) if not args else func(*args, **kwargs)
        return func(*args, **kwargs)


def dim0_shard(full: torch.Tensor, rank: int, world_size: int) -> torch.Tensor:
    """This rank's rows of ``full`` as FSDP2 shards a parameter: ``torch.chunk`` on dim 0 (the
    last ranks get none when there are fewer rows than ranks)."""
    chunks = full.chunk(world_size, dim=0)
    return chunks[rank].clone() if rank < len(chunks) else full[:0].clone()


def meta_init_applies(train: TrainConfig, ctx: DistributedContext, loads_weights: bool) -> bool:
    """Whether the model is built on the meta device: FSDP2 over several processes, new weights."""
    return train.fsdp and ctx.is_distributed and not loads_weights


def build_sharded(
    build: Callable[[], nn.Module], ctx: DistributedContext, train: TrainConfig
) -> tuple[nn.Module, nn.Module]:
    """``build()``'s model, sharded by FSDP2 (:func:`wrap_model`) without ever being whole here:
    (the model, the wrapped model). The generator is drawn from exactly as ``build()`` on the CPU."""
    init = _ShardedInit(lambda full: dim0_shard(full, ctx.rank, ctx.world_size))
    with torch.device("meta"), init:
        model = build()
    shards = {
        (id(module), name): init.values[id(param)]
        for module in model.modules()
        for name, param in module._parameters.items()
        if param is not None
    }
    wrapped = wrap_model(model, ctx, train)
    # The shards live where FSDP2 keeps them: on the host with CPU offload, else on the device.
    model.to_empty(device="cpu" if train.fsdp_offload else ctx.device)
    with torch.no_grad():
        for module in model.modules():
            for name, param in module._parameters.items():
                if param is None:
                    continue
                local = param.to_local() if hasattr(param, "to_local") else param
                value = shards[(id(module), name)]
                if local.shape != value.shape:
                    raise RuntimeError(
                        f"meta initialisation: {name} of {type(module).__name__} has a shard of shape "
                        f"{tuple(local.shape)}, not the {tuple(value.shape)} of FSDP2's dim-0 chunks"
                    )
                local.copy_(value)
        _restore_buffers(model)
    return model, wrapped


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
