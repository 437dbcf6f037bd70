"""What fits: a training run's memory per device, from its update simulated on fake tensors.

`gptkit estimate pretrain|finetune` takes the flags of the run it estimates, builds the model that
run would build (a published name is known by its shape: nothing is downloaded), and hands it to
:func:`gptkit.train.memory.simulation.simulate`, which runs two of the Trainer's updates on fake tensors
over a fake process group and reads PyTorch's memory trackers (what is modelled rather than run,
for a GPU, is said there). With ``--memory`` it also finds the largest per-device batch that fits,
by bisection on the simulated step.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import torch
import torch.nn as nn

from gptkit import hub
from gptkit.config import GPTConfig, check_choices, config_error
from gptkit.data.registry import DATASETS
from gptkit.data.tasks import TaskSpec
from gptkit.io import read_json
from gptkit.model import GPT
from gptkit.model.task import TaskModel
from gptkit.model.weights import CONFIG_NAME, config_from_hf
from gptkit.tokenizer.gpt1 import GPT1_SPECIAL_TOKENS
from gptkit.train.config import TrainConfig
from gptkit.train.finetune.tasks import FinetuneConfig, ready_for_task, with_dataset_task
from gptkit.train.memory.simulation import CATEGORIES, HOST_STATES, Estimate, Simulation, simulate
from gptkit.train.run import ModelShape, check_loaded_shape, sequence_length

# The published models the estimate knows by their Hub short names, without downloading: each is
# its preset of the same name (GPT-1's is "gpt1").
PUBLISHED = {name: "gpt1" if name == "openai-gpt" else name for name in hub.SHORT_NAMES}
USABLE_FRACTION = 0.9  # of --memory: the CUDA context and the allocator's fragmentation take the rest


@dataclass
class EstimateOptions:
    """How many devices to simulate, and how much memory each has."""

    devices: int = field(
        default=1,
        metadata={
            "help": "Devices (processes) to simulate: with more than 1, DDP, or FSDP2 with --fsdp (also over 1)."
        },
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
            "help": "gpu: CUDA autocast's precision per operation, attention as a GPU's fused kernels "
            "store it (dropout included), --precision auto is bf16; cpu: exactly this CPU's training step "
            "(CPU autocast, unfused attention when dropout is on, auto as this CPU resolves it)."
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
FINETUNE_FLAGS = (
    "model",
    "task",
    "dataset",
    "regression",
    "lm_coef",
    "clf_dropout",
    "max_length",
    "lora",
    "training",
)


@dataclass
class FinetuneEstimateConfig:
    """Memory per device of a fine-tuning run, simulated on fake tensors: no data, no GPU. Each example
    is laid out as the task lays it out, every sequence --max-length tokens: one (classification,
    entailment), two (similarity: both orders) or one per answer (multiple choice)."""

    finetune: FinetuneConfig = field(
        default_factory=FinetuneConfig,
        metadata={"help": "The fine-tuning run to estimate.", "flags": FINETUNE_FLAGS},
    )
    estimate: EstimateOptions = field(default_factory=EstimateOptions)
    choices: int | None = field(
        default=None,
        metadata={
            "help": "A multiple-choice task's answers per question, one sequence each (default: the "
            "dataset's, such as 2 for story_cloze and 4 for race)."
        },
    )

    def __post_init__(self) -> None:
        if self.choices is not None and self.choices < 2:
            raise config_error(self, "choices", f"a question needs at least 2 answers, got {self.choices}")


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
    context (:func:`gptkit.train.run.check_loaded_shape`, the runs' own rule)."""
    if not shape.init:
        return GPTConfig.from_preset(shape.preset, **shape.overrides())
    name = shape.init.removeprefix("openai-community/")
    if name in PUBLISHED:
        loaded = GPTConfig.from_preset(PUBLISHED[name])
    else:
        path = _config_folder(shape.init)
        loaded = config_from_hf(read_json(path / CONFIG_NAME), str(path / CONFIG_NAME))
    check_loaded_shape(loaded, shape)
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


# The simulated run ----------------------------------------------------------------------------


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

    # _start_, _delimiter_, _classify_: rows after the vocabulary, as for a GPT-2 tokenizer.
    specials = {name: first_special + i for i, name in enumerate(GPT1_SPECIAL_TOKENS)}
    spec = estimated_task(finetune, config.choices, length)
    per_example = {"similarity": 2, "multiple_choice": spec.n_choices}.get(spec.task, 1)

    def build() -> nn.Module:
        gpt = ready_for_task(GPT(gpt_config), specials, finetune.lora.settings())
        return TaskModel(gpt, spec, finetune.clf_dropout, finetune.lm_coef).train()

    def make_batch(examples: int) -> dict:
        ids = torch.randint(0, first_special, (examples, per_example, length))
        if spec.regression:
            targets = torch.rand(examples)
        else:
            targets = torch.randint(0, spec.n_choices or spec.n_outputs, (examples,))
        return {
            "input_ids": ids,
            "lm_labels": ids,
            "clf_positions": torch.full((examples, per_example), length - 1),
            "targets": targets,
        }

    return Simulation(build, make_batch, finetune.training, config.estimate.devices, config.estimate.target)


def estimated_task(finetune: FinetuneConfig, choices: int | None, length: int) -> TaskSpec:
    """The task as the run would know it, from its flags or its public dataset: the layout, the
    head's outputs (a public dataset's labels, else two) and, for multiple choice, the answers."""
    finetune, _ = with_dataset_task(finetune)
    task = finetune.task or "classification"
    known = DATASETS.get(finetune.dataset or "")
    if task == "multiple_choice":
        choices = choices or (known.choices if known else None)
        if choices is None:
            raise ValueError("--choices: give the answers per question of this multiple-choice task")
        return TaskSpec(task, n_choices=choices, max_length=length)
    if choices is not None:
        raise ValueError(f"--choices: applies to multiple-choice tasks, not to {task}")
    labels = list(known.labels) if known and known.labels else ["0", "1"]
    regression = finetune.regression
    return TaskSpec(task, labels=None if regression else labels, regression=regression, max_length=length)


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
    """A table of the device's peak by category, in GiB, the host's apart (with offload), and what
    was simulated otherwise than it runs."""
    gib = 2**30
    lines = [
        f"per device, {result.devices} device(s), batch {result.batch_size} per device "
        f"(simulated on fake tensors, precision and attention as on a {result.target}):"
    ]
    for name in CATEGORIES:
        lines.append(f"  {name:<16} {result.by_category[name] / gib:8.2f} GiB")
    lines.append(f"  {'peak':<16} {result.peak_bytes / gib:8.2f} GiB")
    if result.host_bytes:
        lines.append("on the host (offloaded, per process):")
        lines.extend(f"  {name:<16} {result.host[name] / gib:8.2f} GiB" for name in HOST_STATES)
        lines.append(f"  {'peak':<16} {result.host_bytes / gib:8.2f} GiB")
    if result.max_batch_size is not None:
        lines.append(f"largest batch per device that fits: {result.max_batch_size}")
    lines.extend(f"note: {note}" for note in result.notes)
    return "\n".join(lines)
