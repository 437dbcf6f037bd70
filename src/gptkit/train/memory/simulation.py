"""A training run's update on fake tensors over a fake process group, and the memory it holds.

:func:`simulate` builds the model a run would build, wraps it as the run would (activation
checkpointing, DDP or FSDP2 with its policies) over a fake process group of ``devices`` ranks, and
runs two updates of the Trainer's own step (:meth:`Trainer.compute_gradients` and
:meth:`Trainer.apply_gradients`) under PyTorch's ``FakeTensorMode``: every tensor has a shape, a
dtype and a device but no storage, and every collective returns at once. PyTorch's memory tracker
(``FSDPMemTracker`` for FSDP2, ``MemTracker`` otherwise) records what this rank holds at each
moment; the peak of the second update is the run's steady state (the optimizer's moments exist
from the first step on). Each update runs all its micro-batches, so that the peak includes what a
device holds between them: under FSDP2 with a deferred gradient reduction
(``fsdp_defer_gradient_sync``), every parameter's unsharded fp32 gradient.

What differs from a real GPU, for ``target="gpu"``, is modelled here rather than run:
- The fake tensors are CPU tensors (autograd on fake CUDA tensors aborts a CPU build of PyTorch):
  CUDA autocast's precision per operator is applied to them (:mod:`gptkit.train.memory.cuda_autocast`).
- CPU attention with dropout takes the unfused path that keeps the (T × T) scores, where a GPU's
  fused kernels keep only the output and its log-sum-exp, dropout included: the simulated attention
  layers run without dropout, which takes the CPU's fused kernel and its memory.
- DDP's C++ reducer cannot run on fake tensors: a DDP run is one process's step plus DDP's
  gradient buckets.
- With ``--fsdp-offload`` the shards, their gradients and the optimizer state live on the host:
  they are counted as host bytes, apart from the device's peak.
- ``--compile`` is simulated without compiling (as torchtitan's estimator does): a compiled run
  fuses operations and usually holds less. fp16 is simulated as bf16 (2 bytes per element either
  way, under the same CUDA autocast lists); its loss scaler's few bytes are not counted.
The CUDA context and the caching allocator's fragmentation are not tensors: the estimate counts
90% of a card as usable.
"""

from __future__ import annotations

import contextlib
import dataclasses
import tempfile
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn

from gptkit.model import GPT
from gptkit.model.network import CausalSelfAttention
from gptkit.train.config import TrainConfig
from gptkit.train.distributed.processes import DistributedContext, wrap_model
from gptkit.train.loop import Trainer
from gptkit.train.memory.cuda_autocast import cuda_autocast_rules
from gptkit.train.memory.torch_internals import (
    TOTAL,
    category,
    fake_store,
    fake_tensor_mode,
    memory_tracker,
    skip_gradient_hooks,
    unsupported,
    watch_peaks,
)

CATEGORIES = ("parameters", "gradients", "optimizer_state", "activations", "other")
HOST_STATES = ("parameters", "gradients", "optimizer_state")  # where --fsdp-offload puts them


@dataclass
class Simulation:
    """One estimate's inputs: the model to build, the loop's settings, the batch's shape."""

    build: Callable[[], nn.Module]  # called under fake tensors
    make_batch: Callable[[int], dict]  # sequences -> the batch (fake tensors under fake tensors)
    train: TrainConfig
    devices: int
    target: str


@dataclass
class Estimate:
    devices: int
    batch_size: int  # per device
    peak_bytes: int  # the device's peak
    by_category: dict[str, int]  # the device's bytes at its peak; sums to peak_bytes
    states: dict[str, int]  # parameters, gradients and optimizer state held after the update
    host: dict[str, int]  # the host's peak by category: with --fsdp-offload, the states it holds
    host_bytes: int  # the host's peak: sum of host (0 without offload)
    target: str
    notes: list[str] = field(default_factory=list)  # what was simulated otherwise than it runs
    max_batch_size: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def fused_attention_memory(model: nn.Module) -> None:
    """Attention's dropout left to the fused kernel, as on a GPU, where flash and memory-efficient
    attention draw the mask inside the kernel and store none of it: the CPU's fused kernel has no
    dropout and would fall back to the unfused path, which stores (T × T) per head. The attention
    layers' rate is set to 0 on the simulated model (the residual dropouts stay)."""
    for module in model.modules():
        if isinstance(module, CausalSelfAttention):
            module.dropout = 0.0


@contextlib.contextmanager
def simulated_ranks(devices: int, fsdp: bool = False):
    """A fake process group of ``devices`` ranks (this process is rank 0) and its context; one
    rank has a group too under FSDP2 (``fsdp``), which shards over a group of itself."""
    if dist.is_initialized():
        raise RuntimeError("gptkit estimate runs outside any process group (not under torchrun)")
    ctx = DistributedContext(rank=0, world_size=devices)
    grouped = devices > 1 or fsdp
    if grouped:
        dist.init_process_group("fake", store=fake_store(), rank=0, world_size=devices)
    try:
        if grouped:
            ctx.device_mesh()  # made from real tensors, before the fake ones
        yield ctx
    finally:
        if grouped:
            dist.destroy_process_group()


class NoBatches:
    """The Trainer's batch source, never read: its caller passes each batch itself (the estimate,
    a measurement of the same update)."""

    def next_batch(self):
        raise RuntimeError("no batch source: the caller feeds each batch itself")

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


def simulated_config(simulation: Simulation, per_device: int) -> tuple[TrainConfig, list[str]]:
    """The TrainConfig the simulated step runs, for a global batch of ``per_device`` × devices
    sequences, and what it simulates otherwise than the run would run."""
    original = simulation.train
    train = dataclasses.replace(
        original,
        batch_size=per_device * simulation.devices,
        micro_batch_size=min(original.micro_batch_size or per_device, per_device),
        max_steps=original.max_steps or 1,
        warmup_steps=None,
        time_budget=None,
        log_to=[],
        progress=False,
        compile=False,
    )
    if train.micro_batch_size and per_device % train.micro_batch_size:
        train = dataclasses.replace(train, micro_batch_size=per_device)
    notes = []
    if original.compile:
        notes.append("--compile simulated without compiling: a compiled step usually holds less")
    if simulation.target == "gpu" and train.precision == "auto":
        train = dataclasses.replace(train, precision="bf16")  # what auto means on a GPU with bf16
    if train.precision == "fp16":
        train = dataclasses.replace(train, precision="bf16")
        notes.append("fp16 simulated as bf16 (2 bytes per element either way; the loss scaler not counted)")
    return train, notes


def build_trainer(simulation: Simulation, ctx: DistributedContext, per_device: int, out_dir: str) -> Trainer:
    """The run's model (built and wrapped under the fake mode in force) and its Trainer, for a global
    batch of ``per_device`` × devices sequences."""
    train, _ = simulated_config(simulation, per_device)
    torch.manual_seed(train.seed)
    model = simulation.build()
    _skip_input_check(model)
    if simulation.target == "gpu":
        fused_attention_memory(model)
    # DDP's C++ reducer cannot run on fake tensors: the model is wrapped as for one process (the
    # step then differs only by DDP's buckets, which simulate() adds), the Trainer runs N ranks.
    wrap_ctx = DistributedContext() if uses_ddp(simulation) else ctx
    return Trainer(
        wrap_model(model, wrap_ctx, train), train, NoBatches(), out_dir, save_model=lambda *a: None, ctx=ctx
    )


def uses_ddp(simulation: Simulation) -> bool:
    return simulation.devices > 1 and not simulation.train.fsdp


def offloads(simulation: Simulation) -> bool:
    return simulation.train.fsdp and simulation.train.fsdp_offload


def ddp_bucket_bytes(model: nn.Module) -> int:
    """What DDP holds beyond one process's step: its gradient buckets, one flat copy of every
    trained gradient, allocated when the model is wrapped (gradient_as_bucket_view is off)."""
    return sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)


def _skip_input_check(model: nn.Module) -> None:
    """The GPT's check of token ids reads their values, which fake tensors do not have; the ids the
    estimate makes are in range by construction."""
    gpt = model if isinstance(model, GPT) else model.gpt
    gpt._check_inputs = lambda *args: None


def _local_bytes(tensor: torch.Tensor) -> int:
    local = tensor.to_local() if hasattr(tensor, "to_local") else tensor
    return local.numel() * local.element_size()


def held_states(trainer: Trainer) -> dict[str, int]:
    """Bytes of this rank's parameters, gradients and optimizer state (its shards under FSDP2)."""
    params = list(trainer.model.parameters())
    optimizer_state = sum(
        _local_bytes(value)
        for optimizer in trainer.optimizers
        for state in optimizer.state.values()
        for value in state.values()
        if isinstance(value, torch.Tensor) and value.dim() > 0
    )
    return {
        "parameters": sum(_local_bytes(p) for p in params),
        "gradients": sum(_local_bytes(p) for p in params if p.requires_grad),
        "optimizer_state": optimizer_state,
    }


class _Peaks:
    """The device's peak by category (everything the tracker records but what lives on the host:
    nothing without offload), and the host's, from every snapshot the tracker takes."""

    def __init__(self, host_categories: tuple[str, ...]):
        self.host_categories = host_categories
        self.device = dict.fromkeys(CATEGORIES, 0)
        self.host = dict.fromkeys(host_categories, 0)

    def __call__(self, snapshot: dict) -> None:
        device, host = dict.fromkeys(CATEGORIES, 0), dict.fromkeys(self.host_categories, 0)
        for reftype, size in snapshot.items():
            if reftype != TOTAL:
                name = category(reftype)
                if name in host:
                    host[name] += size
                else:
                    device[name] += size
        if sum(device.values()) > sum(self.device.values()):
            self.device = device
        if sum(host.values()) > sum(self.host.values()):
            self.host = host


@contextlib.contextmanager
def every_micro_batch(tracker: Any, model: nn.Module, fsdp: bool):
    """Inside the entered ``tracker``: the update's micro-batches each run the model once, which
    FSDPMemTracker refuses after the first (it takes a second forward of the root for the next
    iteration). The statistics per module it keeps, which the estimate does not read, are cleared
    before each forward, so that every micro-batch runs and the peak spans them all, with what the
    device holds between them (FSDP2's unsharded gradients, when their reduction is deferred)."""
    if not fsdp:
        yield
        return
    if not hasattr(tracker, "reset_mod_stats"):
        raise unsupported("the memory tracker's reset_mod_stats", "gradient accumulation under FSDP2")
    # Before the tracker's own hook, which it put first on entering.
    handle = model.register_forward_pre_hook(lambda *args: tracker.reset_mod_stats(), prepend=True)
    try:
        yield
    finally:
        handle.remove()


def simulate(simulation: Simulation, per_device: int) -> Estimate:
    """Two updates of ``per_device`` sequences per device on fake tensors; the second's peak."""
    rules = cuda_autocast_rules() if simulation.target == "gpu" else contextlib.nullcontext()
    peak = _Peaks(HOST_STATES if offloads(simulation) else ())
    with (
        tempfile.TemporaryDirectory() as out_dir,
        simulated_ranks(simulation.devices, simulation.train.fsdp) as ctx,
        fake_tensor_mode(),
        rules,
        warnings.catch_warnings(),
    ):
        # Not run here, so not this CPU's business: bf16's cost on it, the trackers' module hooks.
        warnings.simplefilter("ignore")
        trainer = build_trainer(simulation, ctx, per_device, out_dir)
        batch = simulation.make_batch(per_device)
        trainer.compute_gradients(batch)
        trainer.apply_gradients()
        # The second update is the steady state (the optimizer's moments are held throughout): a
        # tracker made now starts from what the first left, and records the second's peak.
        fsdp = simulation.train.fsdp
        tracker = memory_tracker(trainer.model, trainer.optimizers, fsdp)
        skip_gradient_hooks(tracker, trainer.model)
        watch_peaks(tracker, peak)
        with tracker, every_micro_batch(tracker, trainer.model, fsdp):
            trainer.compute_gradients(batch)
            states = held_states(trainer)
            trainer.apply_gradients()
    buckets = ddp_bucket_bytes(trainer.model) if uses_ddp(simulation) else 0
    by_category = {**peak.device, "other": peak.device["other"] + buckets}
    host = {name: peak.host.get(name, 0) for name in HOST_STATES}
    return Estimate(
        devices=simulation.devices,
        batch_size=per_device,
        peak_bytes=sum(by_category.values()),
        by_category=by_category,
        states=states,
        host=host,
        host_bytes=sum(host.values()),
        target=simulation.target,
        notes=simulated_config(simulation, per_device)[1],
    )
