"""The training loop's settings: :class:`TrainConfig` (GPT-1's pre-training defaults, every value
checked) and the durations a time budget is written in."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from gptkit.config import check_choices, config_error
from gptkit.hardware import Precision, canonical_precision

# The learning rate's decay after warm-up, and the optimizers: TrainConfig's, and the recipes' that
# build one (gptkit.demo).
Schedule = Literal["cosine", "linear", "wsd", "constant"]
OptimizerName = Literal["adamw", "muon"]
ActivationCheckpointing = Literal["none", "full", "selective"]


@dataclass
class TrainConfig:
    """Optimisation settings. Defaults are GPT-1's pre-training (§4.1); every value is checked."""

    max_steps: int | None = field(
        default=100_000,
        metadata={"help": "Optimizer updates to run (with --time-budget: at most this many)."},
    )
    batch_size: int = field(default=64, metadata={"help": "Global batch, in sequences, per update."})
    micro_batch_size: int | None = field(
        default=None,
        metadata={
            "help": "Sequences per forward pass; the rest is gradient accumulation (default: the whole "
            "batch)."
        },
    )
    lr: float = field(default=2.5e-4, metadata={"help": "Maximum learning rate."})
    warmup_steps: int | None = field(
        default=None,
        metadata={
            "help": "Linear warm-up updates from 0 (default: the paper's 2000, or a tenth of max_steps "
            "when training is shorter than 20,000 updates)."
        },
    )
    schedule: Schedule = field(
        default="cosine",
        metadata={
            "help": "Decay after warm-up, to 0 at max_steps (wsd: hold the rate, then decay linearly over "
            "the last 20%)."
        },
    )
    optimizer: OptimizerName = field(
        default="adamw",
        metadata={
            "help": "adamw (the paper's), or muon: Muon (orthogonalised momentum) for the blocks' matrices, "
            "AdamW for the rest, on one schedule."
        },
    )
    adamw_lr_scale: float = field(
        default=1.0,
        metadata={
            "help": "With --optimizer muon: AdamW's rate (embeddings, biases, gains) as a fraction of --lr. "
            "Keeps the embeddings at a scale that fine-tuning can still move."
        },
    )
    weight_decay: float = field(default=0.01, metadata={"help": "AdamW decay on weights of rank >= 2."})
    beta1: float = field(default=0.9, metadata={"help": "Adam β1."})
    beta2: float = field(default=0.999, metadata={"help": "Adam β2."})
    eps: float = field(default=1e-8, metadata={"help": "Adam ε."})
    grad_clip: float = field(default=1.0, metadata={"help": "Global gradient-norm clip (0 disables)."})
    precision: Precision = field(
        default="auto",
        metadata={
            "help": "auto: bf16 autocast where the hardware computes bf16 natively (CUDA with bf16, a CPU "
            "with AVX512-BF16 or AMX), else fp16 autocast with dynamic loss scaling on a CUDA GPU with fast "
            "fp16 (T4, V100, P100), else fp32. fp16 on a CPU runs, slowly, to try a GPU's recipe "
            "(float32, bfloat16 and float16 are the same formats' other names)."
        },
    )
    time_budget: str | None = field(
        default=None,
        metadata={
            "help": "Wall-clock budget such as 90s, 5m or 1h30m: the first updates are timed and the "
            "schedule is planned for the updates that fit (warm-up keeps its share); ends with a "
            "checkpoint (default: none)."
        },
    )
    compile: bool = field(default=False, metadata={"help": "torch.compile the model."})
    eval_every: int | None = field(
        default=500, metadata={"help": "Evaluate every N updates (0 or none: only at the end)."}
    )
    checkpoint_every: int | None = field(
        default=1000, metadata={"help": "Checkpoint every N updates (none: only at the end)."}
    )
    log_every: int = field(default=10, metadata={"help": "Write metrics.jsonl every N updates."})
    keep_checkpoints: int = field(default=2, metadata={"help": "How many recent checkpoints to keep."})
    seed: int = field(default=1337, metadata={"help": "Seed for init, data order and dropout."})
    on_nonfinite: Literal["stop", "skip"] = field(
        default="stop",
        metadata={"help": "A NaN/inf loss: stop with an error, or skip the update with a warning."},
    )
    fsdp: bool = field(
        default=False,
        metadata={
            "help": "Shard with FSDP2 instead of DDP: each block's parameters, gradients and optimizer state "
            "split across torchrun's processes (one process alone shards over itself: with --fsdp-offload, a "
            "model whose states do not fit one GPU); with bf16 or fp16 precision, parameters are gathered in "
            "that format and gradients reduced in fp32."
        },
    )
    fsdp_offload: bool = field(
        default=False,
        metadata={
            "help": "With --fsdp: keep parameters, gradients and optimizer state in host memory, copied to "
            "the device block by block (slower; for a model whose states do not fit the device)."
        },
    )
    fsdp_defer_gradient_sync: bool = field(
        default=False,
        metadata={
            "help": "With --fsdp and gradient accumulation: reduce-scatter the gradients once per update "
            "instead of once per micro-batch, at the cost of a whole fp32 gradient of every parameter held on "
            "every device between micro-batches (4 bytes a parameter, on the device even with "
            "--fsdp-offload)."
        },
    )
    collective_timeout: str = field(
        default="10m",
        metadata={
            "help": "Under torchrun: how long a process waits in a collective (all-reduce, barrier) for the "
            "others before the run fails (90s, 10m, 1h); raise it when one rank does long work alone."
        },
    )
    activation_checkpointing: ActivationCheckpointing = field(
        default="none",
        metadata={
            "help": "Keep fewer activations for the backward pass and recompute the rest: none; full (keep "
            "each block's input only and run its forward again: GPT-2 small on a CPU, 48% less peak memory "
            "for 31% more time); selective (keep the matrix products' and fused attention's outputs, "
            "recompute LayerNorm, GELU, dropout and the residual adds: 33% less for 18% more)."
        },
    )
    progress: bool = field(default=True, metadata={"help": "Show a progress bar."})
    log_to: list[Literal["tensorboard", "wandb"]] = field(
        default_factory=list,
        metadata={
            "help": "Also log metrics.jsonl's records here: tensorboard (into RUN/tensorboard; needs "
            "gptkit[tensorboard]), wandb (a W&B run in RUN/wandb; WANDB_MODE=offline keeps it there; "
            "needs gptkit[wandb]). metrics.jsonl is always written."
        },
    )

    def __post_init__(self) -> None:
        def fail(name: str, problem: str) -> None:
            raise config_error(self, name, problem)

        self.precision = canonical_precision(self.precision)  # recorded as auto, fp32, bf16 or fp16

        for name in ("max_steps", "micro_batch_size", "checkpoint_every"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                fail(
                    name,
                    f"must be a positive number of {'sequences' if 'batch' in name else 'updates'}, got {value}",
                )
        for name in ("batch_size", "log_every", "keep_checkpoints"):
            if getattr(self, name) <= 0:
                fail(name, f"must be positive, got {getattr(self, name)}")
        for name in ("warmup_steps", "eval_every"):
            value = getattr(self, name)
            if value is not None and value < 0:
                fail(name, f"must be >= 0, got {value}")
        if self.micro_batch_size and self.batch_size % self.micro_batch_size:
            fail(
                "micro_batch_size",
                f"{self.micro_batch_size} does not divide the batch of {self.batch_size}: pick a divisor "
                f"such as {_largest_divisor(self.batch_size, self.micro_batch_size)}",
            )
        if (
            self.max_steps is not None
            and self.warmup_steps is not None
            and self.warmup_steps > self.max_steps
        ):
            fail(
                "warmup_steps",
                f"{self.warmup_steps} warm-up updates are more than the {self.max_steps} of training: "
                "lower --warmup-steps or raise --max-steps",
            )
        if not self.lr > 0:
            fail("lr", f"must be > 0, got {self.lr}")
        if not self.adamw_lr_scale > 0:
            fail("adamw_lr_scale", f"must be > 0, got {self.adamw_lr_scale}")
        self._check_sharding(fail)
        for name in ("weight_decay", "grad_clip"):
            if getattr(self, name) < 0:
                fail(name, f"must be >= 0, got {getattr(self, name)}")
        for name in ("beta1", "beta2"):
            if not 0.0 <= getattr(self, name) < 1.0:
                fail(name, f"must be in [0, 1), got {getattr(self, name)}")
        if not self.eps > 0:
            fail("eps", f"must be > 0, got {self.eps}")
        check_choices(self)  # schedule, precision, on_nonfinite: from their Literal annotations
        loggers = ("tensorboard", "wandb")
        unknown = [name for name in self.log_to if name not in loggers]
        if unknown:
            fail("log_to", f"must be among {', '.join(loggers)}, got {', '.join(map(repr, unknown))}")
        if self.time_budget is not None:
            parse_duration(self.time_budget)  # raises with the expected form
        parse_duration(self.collective_timeout, "collective timeout")

    def _check_sharding(self, fail: Callable[[str, str], None]) -> None:
        """What runs with FSDP2 only, and what does not run with it."""
        if self.optimizer == "muon" and self.fsdp:
            # FSDP hands each process a shard of every matrix; Muon orthogonalises whole matrices.
            fail("optimizer", "muon does not run with --fsdp (it needs whole matrices): use DDP, or adamw")
        needs_fsdp = {
            "fsdp_offload": "offloads FSDP2's shards",
            "fsdp_defer_gradient_sync": "defers FSDP2's reduction of the gradients",
        }
        for name, what in needs_fsdp.items():
            if getattr(self, name) and not self.fsdp:
                fail(name, f"{what}: add --fsdp, or drop --{name.replace('_', '-')}")

    def default_warmup(self, max_steps: int) -> int:
        """Warm-up updates when ``warmup_steps`` is not given: GPT-1's 2000, at most a tenth of training."""
        return min(2000, max_steps // 10)

    def warmup_for(self, max_steps: int) -> int:
        return self.warmup_steps if self.warmup_steps is not None else self.default_warmup(max_steps)

    def planned_warmup(self, planned: int) -> int:
        """The warm-up of a run a time budget cut to ``planned`` updates: it keeps its share."""
        if self.warmup_steps is None:
            return self.default_warmup(planned)
        return round(self.warmup_steps * planned / self.max_steps)

    @property
    def time_budget_seconds(self) -> float | None:
        return None if self.time_budget is None else parse_duration(self.time_budget)


def _largest_divisor(n: int, at_most: int) -> int:
    return max(d for d in range(1, min(n, at_most) + 1) if n % d == 0)


_DURATION = re.compile(r"(?:(\d+(?:\.\d+)?)h)?(?:(\d+(?:\.\d+)?)m)?(?:(\d+(?:\.\d+)?)s?)?")


def parse_duration(text: str | float | int, what: str = "time budget") -> float:
    """Seconds in ``90``, ``90s``, ``5m``, ``1h30m`` or ``2.5m``; ``what`` names it in errors."""
    match = _DURATION.fullmatch(str(text).strip().lower())
    if not str(text).strip() or match is None or not any(match.groups()):
        raise ValueError(f"{what}: expected a duration such as 90s, 5m or 1h30m, got {text!r}")
    hours, minutes, seconds = (float(g) if g else 0.0 for g in match.groups())
    total = hours * 3600 + minutes * 60 + seconds
    if total <= 0:
        raise ValueError(f"{what}: must be more than 0 seconds, got {text!r}")
    return total
