"""Many processes through torchrun: DDP or FSDP2, applied from outside the model.

``torchrun --nproc_per_node=N gptkit pretrain ...`` sets WORLD_SIZE, RANK and LOCAL_RANK; this
module reads them, starts the process group (NCCL on GPUs, with gloo beside it only when FSDP2
offloads to the host; gloo on CPUs) and wraps the model.
A single process (no WORLD_SIZE, or 1) runs the same code with no wrapper; under ``--fsdp`` it
shards over a group of itself (FSDP2 with offload on one GPU, or a first check of an FSDP2 run).
"""

from __future__ import annotations

import contextlib
import os
import warnings
from dataclasses import dataclass, field
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn as nn

from gptkit.hardware import resolve_device, resolve_precision
from gptkit.train.config import TrainConfig
from gptkit.train.memory.activation_checkpointing import apply_activation_checkpointing, transformer_blocks


@dataclass
class DistributedContext:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")
    _mesh: object = field(default=None, repr=False, compare=False)

    @property
    def is_distributed(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def device_mesh(self):
        """The one-dimensional mesh of every process that FSDP2 shards over, made once. Made before
        any fake tensor exists when simulated (a mesh reads its ranks from a real tensor)."""
        if self._mesh is None:
            from torch.distributed.device_mesh import init_device_mesh

            self._mesh = init_device_mesh(self.device.type, (self.world_size,))
        return self._mesh

    def all_reduce_mean(self, value: torch.Tensor) -> torch.Tensor:
        if self.is_distributed:
            value = value.clone()
            dist.all_reduce(value, op=dist.ReduceOp.SUM)
            value /= self.world_size
        return value

    def barrier(self) -> None:
        if self.is_distributed:
            dist.barrier()

    def all_gather_object(self, obj):
        if not self.is_distributed:
            return [obj]
        gathered = [None] * self.world_size
        dist.all_gather_object(gathered, obj)
        return gathered


def init_distributed(
    device: str | None = "auto", fsdp: bool = False, offload: bool = False, timeout_s: float = 600.0
) -> DistributedContext:
    """Read torchrun's environment and start the process group when there is more than one process,
    or one process shards itself with FSDP2 (``fsdp``).

    ``device``: auto (CUDA, then MPS, then CPU), cpu, cuda or mps; see :func:`gptkit.hardware.resolve_device`.
    ``offload``: FSDP2 keeps its shards on the host (the group then serves host tensors too).
    ``timeout_s``: how long a collective waits for the other processes before the run fails.
    """
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    torch_device = resolve_device(device)
    if torch_device.type == "cuda" and world_size > 1 and torch_device.index is not None:
        raise ValueError(
            f"--device {device} under torchrun would put every process on one GPU: use --device cuda "
            "(each process takes the GPU of its LOCAL_RANK), and CUDA_VISIBLE_DEVICES to choose GPUs"
        )
    if torch_device.type == "cuda" and torch_device.index is None:
        torch.cuda.set_device(local_rank)  # one GPU per process, as torchrun numbers them
        torch_device = torch.device("cuda", local_rank)
    if (world_size > 1 or fsdp) and not dist.is_initialized():
        backend = process_group_backend(torch_device.type, offload)
        _init_process_group(backend, rank, world_size, timedelta(seconds=timeout_s))
    return DistributedContext(rank=rank, world_size=world_size, local_rank=local_rank, device=torch_device)


def process_group_backend(device_type: str, offload: bool = False) -> str:
    """The process group's backend for processes on ``device_type``.

    NCCL serves CUDA tensors only: a group started as plain ``"nccl"`` refuses every collective on
    a host tensor ("No backend type associated with device type cpu"). Under FSDP2 with CPU offload
    (``offload``) the gradient shards live on the host and clipping all-reduces their norm there,
    so that group names gloo for the CPU beside NCCL for the GPU (as torchtune starts it). Without
    offload nothing collective lives on the host (barriers and object collectives go through NCCL
    on each process's GPU), and gloo is left out: it would need its own TCP connections between
    every pair of nodes."""
    if device_type != "cuda":
        return "gloo"
    return "cuda:nccl,cpu:gloo" if offload else "nccl"


def _init_process_group(backend: str, rank: int, world_size: int, timeout: timedelta) -> None:
    """Start the process group, in a store of its own each time torchrun forms the group.

    torchrun's agent keeps one store for a job's whole life, and a group it starts again after a
    failure (``--max-restarts``, a node back) meets in it under the same keys as the group before:
    reading a key the new process has not written yet, a process finds the old one's address, where
    no one listens any more, and the group fails to form ("Connection refused"), restart after
    restart. So each group that forms counts itself in the store, and the next one takes keys of
    its own: all its processes read the count before any of them raises it.

    ``timeout`` is given explicitly: torch's default depends on the backend string (10 minutes for
    plain NCCL, 30 for a mixed one), and a run's processes should fail alike whatever it names."""
    if world_size == 1:  # FSDP2 over one process: a store of its own, whatever the environment says
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1, timeout=timeout)
        return
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        dist.init_process_group(backend, timeout=timeout)  # torch's env:// rendezvous: a new store every time
        return
    agent = dist.TCPStore(
        os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world_size, is_master=False
    )
    formed = agent.add("gptkit/groups_formed", 0)  # an atomic read
    store = dist.PrefixStore(f"gptkit/group-{formed}", agent)
    dist.init_process_group(backend, store=store, rank=rank, world_size=world_size, timeout=timeout)
    # Every process of this group has read the count (NCCL: on this process's GPU, set above).
    dist.barrier(device_ids=[torch.cuda.current_device()] if "nccl" in backend else None)
    if rank == 0:
        agent.add("gptkit/groups_formed", 1)


def shutdown_distributed() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def wrap_model(model: nn.Module, ctx: DistributedContext, train: TrainConfig) -> nn.Module:
    """The model as ``train`` asks to run it: its blocks checkpointed (``activation_checkpointing``),
    then DDP, or FSDP2 (``fsdp``: ``fully_shard`` on every block, then the root, with a mixed-precision
    policy and optionally CPU offload, over one process too); alone without FSDP2, unwrapped."""
    if train.fsdp and not dist.is_initialized():
        raise ValueError(
            "--fsdp needs a process group: run through gptkit's commands (or init_distributed(fsdp=True)), "
            "or launch with torchrun --nproc_per_node=N"
        )
    apply_activation_checkpointing(model, train.activation_checkpointing)
    if train.fsdp:
        return shard_model(model, ctx, train)
    if not ctx.is_distributed:
        return model
    from torch.nn.parallel import DistributedDataParallel

    device_ids = [ctx.local_rank] if ctx.device.type == "cuda" else None
    return DistributedDataParallel(model, device_ids=device_ids)


def fsdp_policies(ctx: DistributedContext, train: TrainConfig) -> dict:
    """FSDP2's keyword arguments for ``train``: the mixed-precision policy and the offload policy.

    With a bf16 training precision the parameters are gathered in bf16 (half the all-gather traffic
    and memory of fp32) and the gradients reduced in fp32 (a sum over many ranks loses too much in
    bf16), as torchtitan does; the sharded parameters and the optimizer stay fp32. With fp32 nothing
    is cast.
    """
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy

    with warnings.catch_warnings():  # the Trainer resolves the same precision and says what it costs
        warnings.simplefilter("ignore")
        dtype = resolve_precision(train.precision, ctx.device, "training").dtype
    mixed = MixedPrecisionPolicy(
        param_dtype=dtype if dtype != torch.float32 else None, reduce_dtype=torch.float32
    )
    # Pinned host memory makes the copies to a GPU asynchronous; a CPU build has no pinning.
    offload = (
        CPUOffloadPolicy(pin_memory=ctx.device.type == "cuda") if train.fsdp_offload else OffloadPolicy()
    )
    return {"mp_policy": mixed, "offload_policy": offload}


# The attribute of an FSDP2 model that says whether it defers its gradients' reduction to the last
# micro-batch (TrainConfig.fsdp_defer_gradient_sync).
DEFER_GRADIENT_SYNC = "_gptkit_defer_gradient_sync"


def shard_model(model: nn.Module, ctx: DistributedContext, train: TrainConfig) -> nn.Module:
    """FSDP2 as torchtitan applies it: each block its own unit (gathered just before it runs and
    freed after), then the root (the embeddings, the final LayerNorm, a task head)."""
    from torch.distributed.fsdp import fully_shard

    options = {"mesh": ctx.device_mesh(), **fsdp_policies(ctx, train)}
    for block in transformer_blocks(model):
        fully_shard(block, **options)
    fully_shard(model, **options)
    # Recorded on the model, where gradient_sync finds it: the training loop passes the model only.
    setattr(model, DEFER_GRADIENT_SYNC, train.fsdp_defer_gradient_sync)
    return model


def gradient_sync(wrapped: nn.Module, sync: bool):
    """Context for one micro-batch's forward and backward; ``sync`` on the update's last one.

    DDP all-reduces on the last micro-batch only (``no_sync`` before): its buckets hold a whole
    gradient whichever way, so accumulating unreduced costs no memory. FSDP2 reduce-scatters after
    every micro-batch (as torchtitan does), so that each rank holds only its shard of the gradient:
    skipping the reduction makes FSDP2 keep every parameter's unsharded gradient, in its fp32
    reduce dtype and on the device even with CPU offload, until the last micro-batch (4 bytes a
    parameter on every rank). A model sharded with ``fsdp_defer_gradient_sync`` takes that memory
    for one reduce-scatter per update instead of one per micro-batch."""
    if hasattr(wrapped, "no_sync"):  # DDP
        return contextlib.nullcontext() if sync else wrapped.no_sync()
    if hasattr(wrapped, "set_requires_gradient_sync"):  # FSDP2
        wrapped.set_requires_gradient_sync(sync or not getattr(wrapped, DEFER_GRADIENT_SYNC, False))
    return contextlib.nullcontext()


def unwrap(wrapped: nn.Module) -> nn.Module:
    return wrapped.module if hasattr(wrapped, "no_sync") and hasattr(wrapped, "module") else wrapped


def _full_options(module: nn.Module):
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    if not hasattr(module, "set_requires_gradient_sync"):
        return StateDictOptions(full_state_dict=True)
    return StateDictOptions(full_state_dict=True, cpu_offload=True)  # FSDP2: gathered from the shards


def full_model_state_dict(wrapped: nn.Module, ctx: DistributedContext) -> dict[str, torch.Tensor]:
    """The whole (unsharded) model state, keyed by parameter name; every rank must call it."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    module = unwrap(wrapped)
    return get_model_state_dict(module, options=_full_options(module))


def full_state_dicts(wrapped: nn.Module, optimizers: list[torch.optim.Optimizer], ctx: DistributedContext):
    """Whole (unsharded) model and optimizer state on every rank's CPU, keyed by parameter name."""
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    module = unwrap(wrapped)
    model_state = full_model_state_dict(wrapped, ctx)  # first: as torch's own examples order them
    optim_state = get_optimizer_state_dict(module, optimizers, options=_full_options(module))
    return model_state, optim_state


def load_full_state_dicts(wrapped: nn.Module, optimizers, model_state, optim_state) -> None:
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    module = unwrap(wrapped)
    options = StateDictOptions(full_state_dict=True)
    set_model_state_dict(module, model_state, options=options)
    set_optimizer_state_dict(module, optimizers, optim_state, options=options)
