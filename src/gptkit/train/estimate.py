"""What fits: a training run's memory per device, computed by running its update on fake tensors.

`gptkit estimate pretrain|finetune` builds the model a run would build, wraps it as the run would
(activation checkpointing, DDP or FSDP2 with its policies) over a fake process group of
``--devices`` ranks, and runs two updates of the Trainer's own step (:meth:`Trainer.compute_gradients`
and :meth:`Trainer.apply_gradients`) under PyTorch's ``FakeTensorMode``: every tensor has a shape,
a dtype and a device but no storage, and every collective returns at once. PyTorch's memory
tracker (``FSDPMemTracker`` for FSDP2, ``MemTracker`` otherwise) records what this rank holds at
each moment; the peak of the second update is the run's steady state (the optimizer's moments exist
from the first step on). Nothing is allocated, so GPT-2 XL on 8 simulated GPUs takes seconds.

What differs from a real GPU is said here and in the output's ``target``. The fake tensors are CPU
tensors (a CPU build of PyTorch cannot run attention on fake CUDA tensors), and CPU attention with
dropout takes the unfused path that keeps the (T × T) scores, where a GPU's fused kernels keep only
the output and its log-sum-exp, dropout included: for ``--target gpu`` the simulated attention
layers run without dropout, which takes the CPU's fused kernel and its memory. DDP's C++ reducer
cannot run on fake tensors: a DDP run is simulated as one process's step plus DDP's gradient
buckets. The CUDA context and the caching allocator's fragmentation are not tensors: ``--memory``
counts 90% of the card as usable.
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
import tempfile
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch
import torch.distributed as dist
import torch.nn as nn

from gptkit.config import GPTConfig, check_choices, config_error
from gptkit.data.tasks import TaskSpec
from gptkit.io import read_json
from gptkit.model import GPT
from gptkit.model.lora import add_lora
from gptkit.model.network import CausalSelfAttention
from gptkit.model.task import TaskModel
from gptkit.model.weights import CONFIG_NAME, config_from_hf
from gptkit.train.config import TrainConfig
from gptkit.train.distributed import DistributedContext, wrap_model
from gptkit.train.finetune import FinetuneConfig
from gptkit.train.loop import Trainer
from gptkit.train.run import ModelShape

# The published models' shapes by their Hub names: known without downloading anything.
PUBLISHED = {
    "openai-gpt": "gpt1",
    "gpt2": "gpt2",
    "gpt2-medium": "gpt2-medium",
    "gpt2-large": "gpt2-large",
    "gpt2-xl": "gpt2-xl",
}
USABLE_FRACTION = 0.9  # of --memory: the CUDA context and the allocator's fragmentation take the rest
CATEGORIES = ("parameters", "gradients", "optimizer_state", "activations", "other")


@dataclass
class EstimateOptions:
    """How many devices to simulate, and how much memory each has."""

    devices: int = field(
        default=1,
        metadata={"help": "Devices (processes) to simulate: with more than 1, DDP, or FSDP2 with --fsdp."},
    )
    memory: str | None = field(
        default=None,
        metadata={
            "help": "Memory per device, such as 24GB or 80GiB (both 2^30 bytes, as GPU memory is sold): "
            "also find the largest per-device batch whose peak fits in 90% of it (default: none)."
        },
    )
    target: Literal["gpu", "cpu"] = field(
        default="gpu",
        metadata={
            "help": "gpu: attention as a GPU's fused kernels store it (dropout included), and --precision "
            "auto is bf16; cpu: exactly this CPU's training step (unfused attention when dropout is on, "
            "auto as this CPU resolves it)."
        },
    )
    json: bool = field(default=False, metadata={"help": "Print one JSON object instead of a table."})

    def __post_init__(self) -> None:
        if self.devices < 1:
            raise config_error(self, "devices", f"must be at least 1, got {self.devices}")
        if self.memory is not None:
            parse_size(self.memory)  # raises with the expected form
        check_choices(self)  # target

    @property
    def memory_bytes(self) -> int | None:
        return None if self.memory is None else parse_size(self.memory)


@dataclass
class PretrainEstimateConfig:
    """Memory per device of a pre-training run, simulated on fake tensors: no data, no GPU."""

    model: ModelShape = field(default_factory=ModelShape)
    training: TrainConfig = field(default_factory=TrainConfig)
    estimate: EstimateOptions = field(default_factory=EstimateOptions)


# What `gptkit estimate finetune` shows of the fine-tuning config: the model, its LoRA, the loss
# and the input length; the data, task files and run directory do not change the memory.
FINETUNE_FLAGS = ("model", "lm_coef", "clf_dropout", "max_length", "lora", "training")


@dataclass
class FinetuneEstimateConfig:
    """Memory per device of a fine-tuning run (one sequence of --max-length tokens per example, a
    two-class head), simulated on fake tensors: no data, no GPU."""

    finetune: FinetuneConfig = field(
        default_factory=FinetuneConfig,
        metadata={"help": "The fine-tuning run to estimate.", "flags": FINETUNE_FLAGS},
    )
    estimate: EstimateOptions = field(default_factory=EstimateOptions)


_SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*([kmgt]i?b?)?", re.IGNORECASE)


def parse_size(text: str) -> int:
    """Bytes in ``24GB``, ``80GiB``, ``512MB`` or a plain number of bytes; GB and GiB both 2^30."""
    match = _SIZE.fullmatch(str(text).strip())
    if match is None:
        raise ValueError(f"memory: expected a size such as 24GB, 80GiB or 512MB, got {text!r}")
    number, unit = float(match.group(1)), (match.group(2) or "").lower()
    power = {"": 0, "k": 1, "m": 2, "g": 3, "t": 4}[unit[:1]]
    return int(number * 1024**power)


# The model ------------------------------------------------------------------------------------


def model_config(shape: ModelShape) -> GPTConfig:
    """The GPTConfig a run of ``shape`` builds: a preset with overrides, or ``init``'s (a published
    name, known here, or a folder with a config.json), whose shape overrides may only shorten the
    context, as :func:`gptkit.train.run.build_model` allows."""
    if not shape.init:
        return GPTConfig.from_preset(shape.preset, **shape.overrides())
    name = shape.init.removeprefix("openai-community/")
    if name in PUBLISHED:
        loaded = GPTConfig.from_preset(PUBLISHED[name])
    else:
        path = _config_folder(shape.init)
        loaded = config_from_hf(read_json(path / CONFIG_NAME), str(path / CONFIG_NAME))
    for key, value in shape.overrides().items():
        if key in ("dropout", "context_length") or getattr(loaded, key) == value:
            continue
        raise config_error(
            shape,
            key,
            f"{value} differs from {shape.init}'s {getattr(loaded, key)}: loaded weights keep their shape",
        )
    if shape.dropout is not None:
        loaded = dataclasses.replace(loaded, dropout=shape.dropout)
    return loaded


def _config_folder(init: str) -> Path:
    path = Path(init)
    if not (path / CONFIG_NAME).is_file():
        raise ValueError(
            f"--init {init}: the estimate knows {', '.join(PUBLISHED)} by name, or reads a folder's "
            f"{CONFIG_NAME}; for another model give its shape (--preset, --n-layer, --d-model, ...)"
        )
    return path


def sequence_length(shape: ModelShape, config: GPTConfig, max_length: int | None = None) -> int:
    length = min(shape.context_length or config.context_length, config.context_length)
    return min(max_length or length, length)


# The simulated run ----------------------------------------------------------------------------


@dataclass
class Simulation:
    """One estimate's inputs: the model to build, the loop's settings, the batch's shape."""

    build: Callable[[], nn.Module]  # called under fake tensors
    make_batch: Callable[[int], dict]  # sequences -> the batch (fake tensors under fake tensors)
    train: TrainConfig
    devices: int
    target: str


def pretrain_simulation(config: PretrainEstimateConfig) -> Simulation:
    gpt_config = model_config(config.model)
    length = sequence_length(config.model, gpt_config)

    def make_batch(sequences: int) -> dict:
        ids = torch.randint(0, gpt_config.total_vocab_size, (sequences, length))
        return {"input_ids": ids, "labels": ids, "compute_logits": False}

    return Simulation(
        lambda: GPT(gpt_config), make_batch, config.training, config.estimate.devices, config.estimate.target
    )


def finetune_simulation(config: FinetuneEstimateConfig) -> Simulation:
    finetune = config.finetune
    gpt_config = model_config(finetune.model)
    length = sequence_length(finetune.model, gpt_config, finetune.max_length)
    first_special = gpt_config.total_vocab_size

    def build() -> nn.Module:
        gpt = GPT(gpt_config)
        gpt.add_special_tokens(3)  # _start_, _delimiter_, _classify_: rows after the vocabulary
        settings = finetune.lora.settings()
        if settings is not None:
            add_lora(gpt, settings, first_trainable_row=first_special)
        spec = TaskSpec(task="classification", labels=["0", "1"], max_length=length)
        return TaskModel(gpt, spec, finetune.clf_dropout, finetune.lm_coef).train()

    def make_batch(sequences: int) -> dict:
        ids = torch.randint(0, first_special, (sequences, 1, length))
        return {
            "input_ids": ids,
            "lm_labels": ids,
            "clf_positions": torch.full((sequences, 1), length - 1),
            "targets": torch.randint(0, 2, (sequences,)),
        }

    return Simulation(build, make_batch, finetune.training, config.estimate.devices, config.estimate.target)


def fused_attention_memory(model: nn.Module) -> None:
    """Attention's dropout left to the fused kernel, as on a GPU, where flash and memory-efficient
    attention draw the mask inside the kernel and store none of it: the CPU's fused kernel has no
    dropout and would fall back to the unfused path, which stores (T × T) per head. The attention
    layers' rate is set to 0 on the simulated model (the residual dropouts stay)."""
    for module in model.modules():
        if isinstance(module, CausalSelfAttention):
            module.dropout = 0.0


@contextlib.contextmanager
def simulated_ranks(devices: int):
    """A fake process group of ``devices`` ranks (this process is rank 0) and its context."""
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        raise RuntimeError("gptkit estimate runs outside any process group (not under torchrun)")
    ctx = DistributedContext(rank=0, world_size=devices)
    if devices > 1:
        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=devices)
    try:
        if devices > 1:
            ctx.device_mesh()  # made from real tensors, before the fake ones
        yield ctx
    finally:
        if devices > 1:
            dist.destroy_process_group()


class _NoData:
    """The Trainer's batch source, never read: the estimate passes each batch itself."""

    def next_batch(self):
        raise RuntimeError("the estimate feeds its batches itself")

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


def build_trainer(simulation: Simulation, ctx: DistributedContext, per_device: int, out_dir: str) -> Trainer:
    """The run's model (built and wrapped under the fake mode in force) and its Trainer, for a global
    batch of ``per_device`` × devices sequences."""
    train = dataclasses.replace(
        simulation.train,
        batch_size=per_device * simulation.devices,
        micro_batch_size=min(simulation.train.micro_batch_size or per_device, per_device),
        max_steps=simulation.train.max_steps or 1,
        warmup_steps=None,
        time_budget=None,
        log_to=[],
        progress=False,
    )
    if train.micro_batch_size and per_device % train.micro_batch_size:
        train = dataclasses.replace(train, micro_batch_size=per_device)
    if simulation.target == "gpu" and train.precision == "auto":
        train = dataclasses.replace(train, precision="bf16")  # what auto means on a GPU with bf16
    torch.manual_seed(train.seed)
    model = simulation.build()
    _skip_input_check(model)
    if simulation.target == "gpu":
        fused_attention_memory(model)
    # DDP's C++ reducer cannot run on fake tensors: the model is wrapped as for one process (the
    # step then differs only by DDP's buckets, which simulate() adds), the Trainer runs N ranks.
    wrap_ctx = DistributedContext() if uses_ddp(simulation) else ctx
    return Trainer(
        wrap_model(model, wrap_ctx, train), train, _NoData(), out_dir, save_model=lambda *a: None, ctx=ctx
    )


def uses_ddp(simulation: Simulation) -> bool:
    return simulation.devices > 1 and not simulation.train.fsdp


def ddp_bucket_bytes(model: nn.Module) -> int:
    """What DDP holds beyond one process's step: its gradient buckets, one flat copy of every
    trained gradient, allocated when the model is wrapped (gradient_as_bucket_view is off)."""
    return sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)


def _skip_input_check(model: nn.Module) -> None:
    """The GPT's check of token ids reads their values, which fake tensors do not have; the ids the
    estimate makes are in range by construction."""
    gpt = model if isinstance(model, GPT) else model.gpt
    gpt._check_inputs = lambda *args: None


class _NoHook:
    def remove(self) -> None:
        pass


@dataclass
class Estimate:
    devices: int
    batch_size: int  # per device
    peak_bytes: int
    by_category: dict[str, int]  # at the peak; sums to peak_bytes
    states: dict[str, int]  # parameters, gradients and optimizer state held after the update
    target: str
    max_batch_size: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _category(reftype: str) -> str:
    name = str(reftype).rsplit(".", 1)[-1].upper()
    if name in ("PARAM", "SHARDED_PARAM"):
        return "parameters"
    if name in ("GRAD", "SHARDED_GRAD"):
        return "gradients"
    if name == "OPT":
        return "optimizer_state"
    if name == "ACT":
        return "activations"
    return "other"  # unsharded (gathered) parameters and gradients, buffers, inputs, temporaries


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


def simulate(simulation: Simulation, per_device: int) -> Estimate:
    """Two updates of ``per_device`` sequences per device on fake tensors; the second's peak."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
    from torch.distributed._tools.mem_tracker import MemTracker

    with (
        tempfile.TemporaryDirectory() as out_dir,
        simulated_ranks(simulation.devices) as ctx,
        FakeTensorMode(),
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
        if simulation.train.fsdp and simulation.devices > 1:
            tracker = FSDPMemTracker(trainer.model, trainer.optimizers[0])
        else:
            tracker = MemTracker()
            tracker.track_external(trainer.model, *trainer.optimizers)
        # The tracker hooks every parameter's gradient, which fails on a frozen one (LoRA's base
        # model): those are marked as hooked already.
        for param in trainer.model.parameters():
            if not param.requires_grad:
                tracker._param_to_grad_hook_handles[param] = (_NoHook(), _NoHook())
        with tracker:
            trainer.compute_gradients(batch)
            states = held_states(trainer)
            trainer.apply_gradients()
        (snapshot,) = tracker.get_tracker_snapshot("peak").values()
    by_category = dict.fromkeys(CATEGORIES, 0)
    for reftype, size in snapshot.items():
        if reftype != "Total":
            by_category[_category(reftype)] += size
    buckets = ddp_bucket_bytes(trainer.model) if uses_ddp(simulation) else 0
    by_category["other"] += buckets
    return Estimate(
        devices=simulation.devices,
        batch_size=per_device,
        peak_bytes=snapshot["Total"] + buckets,
        by_category=by_category,
        states=states,
        target=simulation.target,
    )


def largest_batch(
    simulation: Simulation,
    memory: int,
    first: Estimate,
    run: Callable[[Simulation, int], Estimate] = simulate,
) -> int:
    """The largest per-device batch whose simulated peak (``run``) fits ``memory``, found by
    bisection on the simulated step, each next batch guessed from the peaks seen so far.

    The peak is the larger of the optimizer step's (about constant) and the backward pass's, which
    grows linearly with the batch (the activations are per sequence): once two peaks differ, the
    line through them says where the memory runs out, and the guess is that batch; before, the batch
    doubles. The answer is exact: it fits, and one more does not (0: not even one sequence fits).
    When ``first`` (the run's own batch) does not fit, the search runs between 1 and it."""
    usable = memory * USABLE_FRACTION
    peaks = {first.batch_size: first.peak_bytes}
    low, high = first.batch_size, None
    if first.peak_bytes > usable:  # the run's own batch does not fit: search below it
        if first.batch_size == 1:
            return 0
        peaks[1] = run(simulation, 1).peak_bytes
        if peaks[1] > usable:
            return 0
        low, high = 1, first.batch_size
    while high is None or high - low > 1:
        candidate = _next_batch(peaks, low, high, usable)
        peaks[candidate] = run(simulation, candidate).peak_bytes
        if peaks[candidate] <= usable:
            low = candidate
        else:
            high = candidate
    return low


def _next_batch(peaks: dict[int, int], low: int, high: int | None, usable: float) -> int:
    """Where the line through the two nearest peaks (around ``low``) reaches ``usable``, at most 8
    times ``low`` while nothing too large is known; doubling while the peak does not grow; always
    strictly between ``low`` and ``high``."""
    below = sorted(b for b in peaks if b < low)
    other = high if high is not None else (below[-1] if below else None)
    guess = 2 * low
    if other is not None and peaks[other] != peaks[low]:
        slope = (peaks[other] - peaks[low]) / (other - low)
        if slope > 0:
            guess = int(low + (usable - peaks[low]) // slope)
            if high is None:  # a slope from a peak the optimizer step set is too shallow
                guess = min(guess, 8 * low)
    if high is not None:
        return min(max(guess, low + 1), high - 1)
    return max(guess, low + 1)


def estimate(simulation: Simulation, memory: int | None = None) -> Estimate:
    """The run's per-device memory at its configured batch; with ``memory``, also the largest
    per-device batch that fits."""
    if simulation.train.fsdp and simulation.devices == 1:
        raise ValueError("--fsdp shards a run across devices: give --devices N with N > 1")
    per_device = simulation.train.batch_size // simulation.devices
    if simulation.train.batch_size % simulation.devices:
        raise ValueError(
            f"batch_size {simulation.train.batch_size} does not split evenly into {simulation.devices} devices"
        )
    result = simulate(simulation, per_device)
    if memory is not None:
        result.max_batch_size = largest_batch(simulation, memory, result)
    return result


def estimate_pretrain(config: PretrainEstimateConfig) -> Estimate:
    return estimate(pretrain_simulation(config), config.estimate.memory_bytes)


def estimate_finetune(config: FinetuneEstimateConfig) -> Estimate:
    return estimate(finetune_simulation(config), config.estimate.memory_bytes)


def format_estimate(result: Estimate) -> str:
    """A table of the peak by category, in GiB."""
    gib = 2**30
    lines = [
        f"per device, {result.devices} device(s), batch {result.batch_size} per device "
        f"(simulated on fake tensors, attention as on a {result.target}):"
    ]
    for name in CATEGORIES:
        lines.append(f"  {name:<16} {result.by_category[name] / gib:8.2f} GiB")
    lines.append(f"  {'peak':<16} {result.peak_bytes / gib:8.2f} GiB")
    if result.max_batch_size is not None:
        lines.append(f"largest batch per device that fits: {result.max_batch_size}")
    return "\n".join(lines)
