"""The one training loop, shared by pre-training (L1) and fine-tuning (L3 = L2 + λ·L1).

The two stages differ in the batches they feed and in what the model's forward returns as
``.loss``; accumulation, clipping, autocast, the schedule, evaluation, logging, checkpointing and
exact resume live here once.

A run directory holds ``run_config.json``, ``metrics.jsonl``, ``loss.png`` and ``checkpoints/``:
``step-NNNNNNN/`` folders (model files + ``train_state.pt``), each written under a temporary name
and renamed when complete, and ``latest.json`` naming the newest complete one. A ``kill -9`` thus
loses at most the steps since the last checkpoint, and a non-finite step is never saved.
"""

from __future__ import annotations

import contextlib
import json
import math
import re
import shutil
import signal
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

import torch
import torch.nn as nn
from tqdm import tqdm

from gptkit.config import check_choices, config_error
from gptkit.hardware import bf16_native, resolve_precision
from gptkit.io import atomic_write, read_json, read_train_state, write_json
from gptkit.train.distributed import (
    DistributedContext,
    full_state_dicts,
    gradient_sync,
    load_full_state_dicts,
    unwrap,
)
from gptkit.train.memory import keep_freed_memory
from gptkit.train.optim import build_optimizers, learning_rate

CHECKPOINTS = "checkpoints"
PLAN_AFTER_UPDATES = 4  # updates timed (after the first) before a time budget is planned
LATEST = "latest.json"
TRAIN_STATE = "train_state.pt"


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
    schedule: Literal["cosine", "linear", "wsd", "constant"] = field(
        default="cosine",
        metadata={
            "help": "Decay after warm-up, to 0 at max_steps (wsd: hold the rate, then decay linearly over "
            "the last 20%)."
        },
    )
    optimizer: Literal["adamw", "muon"] = field(
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
    precision: Literal["auto", "fp32", "bf16"] = field(
        default="auto",
        metadata={
            "help": "auto: bf16 autocast where the hardware computes bf16 natively (CUDA with bf16, a CPU "
            "with AVX512-BF16 or AMX), else fp32."
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
    fsdp: bool = field(default=False, metadata={"help": "Shard with FSDP2 instead of DDP (torchrun only)."})
    progress: bool = field(default=True, metadata={"help": "Show a progress bar."})

    def __post_init__(self) -> None:
        def fail(name: str, problem: str) -> None:
            raise config_error(self, name, problem)

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
        if self.optimizer == "muon" and self.fsdp:
            # FSDP hands each process a shard of every matrix; Muon orthogonalises whole matrices.
            fail("optimizer", "muon does not run with --fsdp (it needs whole matrices): use DDP, or adamw")
        for name in ("weight_decay", "grad_clip"):
            if getattr(self, name) < 0:
                fail(name, f"must be >= 0, got {getattr(self, name)}")
        for name in ("beta1", "beta2"):
            if not 0.0 <= getattr(self, name) < 1.0:
                fail(name, f"must be in [0, 1), got {getattr(self, name)}")
        if not self.eps > 0:
            fail("eps", f"must be > 0, got {self.eps}")
        check_choices(self)  # schedule, precision, on_nonfinite: from their Literal annotations
        if self.time_budget is not None:
            parse_duration(self.time_budget)  # raises with the expected form

    def default_warmup(self, max_steps: int) -> int:
        """Warm-up updates when ``warmup_steps`` is not given: GPT-1's 2000, at most a tenth of training."""
        return min(2000, max_steps // 10)

    def warmup_for(self, max_steps: int) -> int:
        return self.warmup_steps if self.warmup_steps is not None else self.default_warmup(max_steps)

    @property
    def time_budget_seconds(self) -> float | None:
        return None if self.time_budget is None else parse_duration(self.time_budget)


def _largest_divisor(n: int, at_most: int) -> int:
    return max(d for d in range(1, min(n, at_most) + 1) if n % d == 0)


_DURATION = re.compile(r"(?:(\d+(?:\.\d+)?)h)?(?:(\d+(?:\.\d+)?)m)?(?:(\d+(?:\.\d+)?)s?)?")


def parse_duration(text: str | float | int) -> float:
    """Seconds in ``90``, ``90s``, ``5m``, ``1h30m`` or ``2.5m``."""
    match = _DURATION.fullmatch(str(text).strip().lower())
    if not str(text).strip() or match is None or not any(match.groups()):
        raise ValueError(f"time budget: expected a duration such as 90s, 5m or 1h30m, got {text!r}")
    hours, minutes, seconds = (float(g) if g else 0.0 for g in match.groups())
    total = hours * 3600 + minutes * 60 + seconds
    if total <= 0:
        raise ValueError(f"time budget: must be more than 0 seconds, got {text!r}")
    return total


class BatchSource(Protocol):
    """Where batches come from: this rank's share of the next global batch, and a resumable position."""

    def next_batch(self) -> dict[str, torch.Tensor]: ...

    def state_dict(self) -> dict: ...

    def load_state_dict(self, state: dict) -> None: ...


class NonFiniteLossError(RuntimeError):
    pass


def autocast(precision: str, device: torch.device):
    if precision == "bf16":
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    if precision != "fp32":
        raise ValueError(f"precision must be fp32 or bf16, got {precision!r}")
    return contextlib.nullcontext()


def split_micro_batches(batch: dict, micro_batch_size: int) -> list[dict]:
    """Slice every tensor of the batch along its first dimension; other values (flags) go to each."""
    size = next(v for v in batch.values() if isinstance(v, torch.Tensor)).size(0)
    return [
        {k: v[i : i + micro_batch_size] if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
        for i in range(0, size, micro_batch_size)
    ]


class Trainer:
    """Runs ``config.max_steps`` updates of ``model`` on ``data``, resumable from ``out_dir``.

    Args:
        model: an nn.Module whose ``forward(**micro_batch)`` returns an object with ``.loss``; already
            wrapped for DDP/FSDP when distributed (see ``wrap_model``).
        data: the training batches.
        out_dir: the run directory.
        save_model: writes the model's files into a directory, given the full state dict.
        evaluate: optional; returns metrics (e.g. ``{"val_loss": ...}``) for the current model.
        run_config: everything that defines the run, written to ``run_config.json``.
        after_evaluate: optional; called with the step, the metrics and the model after each
            evaluation (fine-tuning keeps its best model so).
    """

    def __init__(
        self,
        model: nn.Module,
        config: TrainConfig,
        data: BatchSource,
        out_dir: str | Path,
        save_model: Callable[[Path, dict[str, torch.Tensor]], None],
        ctx: DistributedContext | None = None,
        evaluate: Callable[[nn.Module], dict[str, float]] | None = None,
        run_config: dict[str, Any] | None = None,
        after_evaluate: Callable[[int, dict[str, float], nn.Module], None] | None = None,
    ):
        self.ctx = ctx or DistributedContext()
        self.model, self.config, self.data = model, config, data
        self.out_dir = Path(out_dir)
        self.save_model, self.evaluate, self.after_evaluate = save_model, evaluate, after_evaluate
        self.run_config = run_config or {}
        self.step = 0
        self.tokens_seen = 0
        self.optimizers = build_optimizers(
            unwrap(model),
            config.optimizer,
            config.lr,
            config.weight_decay,
            (config.beta1, config.beta2),
            config.eps,
            # Muon's iteration in bf16 only where bf16 products are native (as training's autocast).
            ns_dtype=torch.bfloat16 if bf16_native(self.ctx.device).native else torch.float32,
            adamw_lr_scale=config.adamw_lr_scale,
        )
        per_rank = config.batch_size // self.ctx.world_size
        self.micro_batch_size = min(config.micro_batch_size or per_rank, per_rank)
        if config.batch_size % self.ctx.world_size or per_rank % self.micro_batch_size:
            raise ValueError(
                f"batch_size {config.batch_size} must split evenly into {self.ctx.world_size} process(es) × "
                f"micro-batches of {self.micro_batch_size}"
            )
        self.forward = torch.compile(model) if config.compile else model
        if self.ctx.device.type == "cpu":
            keep_freed_memory()  # see gptkit.train.memory: a third of a CPU step otherwise
        self.last_metrics: dict[str, float] = {}
        self.precision = resolve_precision(config.precision, self.ctx.device)
        # The plan: updates to run and their warm-up. A time budget replaces it once the first
        # updates are timed; the config itself is never changed.
        if config.max_steps is None:
            raise ValueError("TrainConfig.max_steps must be set before training (fine-tuning derives it)")
        self.max_steps = config.max_steps
        self.warmup_steps = config.warmup_for(config.max_steps)
        self.plan: dict[str, Any] = {}
        self.clock: Callable[[], float] = time.perf_counter  # what time budgets are measured with

    # Checkpoints ---------------------------------------------------------------------------------

    @property
    def checkpoint_dir(self) -> Path:
        return self.out_dir / CHECKPOINTS

    def save_checkpoint(self) -> Path:
        """Write model + optimizer + schedule position + RNG + data position; all ranks must call it."""
        model_state, optim_state = full_state_dicts(self.model, self.optimizers, self.ctx)
        rng_states = self.ctx.all_gather_object(_rng_state())
        final = self.checkpoint_dir / f"step-{self.step:07d}"
        if self.ctx.is_main:
            tmp = self.checkpoint_dir / f".step-{self.step:07d}.tmp"
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
            self.save_model(tmp, model_state)
            train_state = {
                "step": self.step,
                "tokens_seen": self.tokens_seen,
                "optimizer": optim_state,
                "data": self.data.state_dict(),
                "rng": rng_states,
                "world_size": self.ctx.world_size,
                "plan": json.dumps(self.plan),  # JSON text: the file holds only tensors and plain values
            }
            torch.save(train_state, tmp / TRAIN_STATE)
            shutil.rmtree(final, ignore_errors=True)
            tmp.rename(final)
            write_json(self.checkpoint_dir / LATEST, {"step": self.step, "path": final.name})
            self._prune_checkpoints()
        self.ctx.barrier()
        return final

    def _prune_checkpoints(self) -> None:
        done = sorted(p for p in self.checkpoint_dir.glob("step-*") if p.is_dir())
        for old in done[: -self.config.keep_checkpoints]:
            shutil.rmtree(old, ignore_errors=True)

    def latest_checkpoint(self) -> Path | None:
        pointer = self.checkpoint_dir / LATEST
        if not pointer.exists():
            return None
        name = read_json(pointer).get("path")
        if not isinstance(name, str):
            raise ValueError(f"{pointer}: no 'path' naming the latest step-* checkpoint; fix or delete it")
        path = self.checkpoint_dir / name
        return path if (path / TRAIN_STATE).exists() else None

    def resume(self, checkpoint: Path, load_model_state: Callable[[Path], dict[str, torch.Tensor]]) -> None:
        """Continue exactly where ``checkpoint`` stopped: same weights, moments, step, data, RNG."""
        state = read_train_state(checkpoint / TRAIN_STATE)
        load_full_state_dicts(self.model, self.optimizers, load_model_state(checkpoint), state["optimizer"])
        self.step = int(state["step"])
        self.tokens_seen = int(state.get("tokens_seen", 0))
        # A run planned for a time budget keeps its plan: the schedule must not change under it.
        # Otherwise the config rules, so that --resume --max-steps N extends a finished run.
        plan = json.loads(state.get("plan", "{}"))
        if plan:
            self.plan, self.max_steps, self.warmup_steps = plan, plan["planned_steps"], plan["warmup_steps"]
        self.data.load_state_dict(state["data"])
        rng = state["rng"]
        if len(rng) == self.ctx.world_size:
            _set_rng_state(rng[self.ctx.rank])
        else:
            warnings.warn(
                f"checkpoint was written by {len(rng)} process(es), resuming with {self.ctx.world_size}: "
                "dropout randomness restarts from the seed",
                stacklevel=2,
            )
            torch.manual_seed(self.config.seed + self.ctx.rank + self.step)
        if self.ctx.is_main:
            _truncate_metrics(self.out_dir / "metrics.jsonl", self.step)

    # The loop ------------------------------------------------------------------------------------

    def fit(self) -> dict[str, float]:
        config, ctx = self.config, self.ctx
        if ctx.is_main:
            print(f"precision: {self.precision.reason}; device: {ctx.device}", flush=True)
            self.out_dir.mkdir(parents=True, exist_ok=True)
            self._write_run_config()
        budget = config.time_budget_seconds if not self.plan else None
        fit_started = self.clock()
        first_step, timing_from = self.step, None
        bar = tqdm(
            total=self.max_steps,
            initial=self.step,
            desc="training",
            disable=not (config.progress and ctx.is_main),
            dynamic_ncols=True,
        )
        interrupted = False
        previous_sigterm = _raise_keyboard_interrupt_on_sigterm()
        try:
            while self.step < self.max_steps:
                started = self.clock()
                loss, grad_norm, n_tokens = self._train_step()
                now = self.clock()
                tokens_per_s = n_tokens * ctx.world_size / max(now - started, 1e-9)
                bar.update(1)
                bar.set_postfix(loss=f"{loss:.4f}", tok_s=f"{tokens_per_s:,.0f}", refresh=False)
                if budget is not None:
                    if timing_from is None:  # the first update pays for warm-up: time from its end
                        timing_from = now
                    elif not self.plan and self.step - first_step > PLAN_AFTER_UPDATES:
                        self._plan_for_budget(budget, now - fit_started, now - timing_from, first_step)
                        bar.total = self.max_steps
                        bar.refresh()
                    if self._past_deadline(now - fit_started >= budget) and self.step < self.max_steps:
                        # Past the deadline (the plan was too hopeful): this update is the last.
                        bar.write(
                            f"time budget of {config.time_budget} spent: stopping at update {self.step}"
                        )
                        # The run is complete as it stands (a resume has nothing left to do): record so,
                        # also when the deadline came before the plan was made.
                        self.max_steps = self.step
                        self.plan.update(
                            time_budget_s=budget,
                            planned_steps=self.step,
                            warmup_steps=self.warmup_steps,
                            stopped_at_deadline=True,
                        )
                        if ctx.is_main:
                            self._write_run_config()  # what ran, not what was planned
                self._after_step(loss, grad_norm, tokens_per_s)
        except KeyboardInterrupt:
            interrupted = True
            bar.write(f"interrupted: saving a checkpoint at step {self.step}")
        finally:
            bar.close()
            signal.signal(signal.SIGTERM, previous_sigterm)
        if self.step > 0 and not (self.latest_checkpoint() and self._latest_step() == self.step):
            self.save_checkpoint()
        if interrupted:
            # Saved; now let the caller stop too (the CLI exits with status 130).
            raise KeyboardInterrupt(
                f"interrupted at step {self.step}; checkpoint saved, continue with --resume"
            )
        if self.evaluate is not None and not config.eval_every:
            self._evaluate()
        if ctx.is_main:
            plot_metrics(self.out_dir / "metrics.jsonl", self.out_dir / "loss.png")
        return self.last_metrics

    def _write_run_config(self) -> None:
        resolved = {"precision": self.precision.value, "precision_reason": self.precision.reason}
        resolved.update(device=str(self.ctx.device), max_steps=self.max_steps, warmup_steps=self.warmup_steps)
        if self.plan:
            resolved["time_budget_plan"] = self.plan
        write_json(self.out_dir / "run_config.json", {**self.run_config, "resolved": resolved})

    def _plan_for_budget(self, budget: float, elapsed: float, timed: float, first_step: int) -> None:
        """Fit the rest of the run into ``budget`` seconds, from the time of the updates so far.

        One evaluation is run now and timed too (when evaluation is periodic), so that the plan
        leaves room for those still to come. Warm-up keeps its share of the (shorter) run.
        """
        config = self.config
        seconds_per_eval = 0.0
        if self.evaluate is not None and config.eval_every:
            started = self.clock()
            metrics = self._evaluate()
            seconds_per_eval = self.clock() - started
            if self.ctx.is_main:
                _append_jsonl(self.out_dir / "metrics.jsonl", {"step": self.step, **metrics})
            elapsed += seconds_per_eval
        # Every process must plan the same number of updates: plan from the mean of their timings.
        timings = torch.tensor(
            [timed / (self.step - first_step - 1), seconds_per_eval, elapsed], dtype=torch.float32
        )
        seconds_per_update, seconds_per_eval, elapsed = self.ctx.all_reduce_mean(
            timings.to(self.ctx.device)
        ).tolist()
        # Keep 3% for checkpoints, the final evaluation and noise; evaluations come every eval_every.
        remaining = budget * 0.97 - elapsed - seconds_per_eval
        per_update = seconds_per_update + (seconds_per_eval / config.eval_every if config.eval_every else 0)
        fits = max(int(remaining / per_update), 0)
        planned = min(self.max_steps, self.step + fits)
        if config.warmup_steps is None:
            warmup = config.default_warmup(planned)
        else:
            warmup = round(config.warmup_steps * planned / self.max_steps)
        self.max_steps, self.warmup_steps = planned, min(warmup, planned)
        self.plan = {
            "time_budget_s": budget,
            "seconds_per_update": round(seconds_per_update, 4),
            "seconds_per_evaluation": round(seconds_per_eval, 4),
            "planned_steps": planned,
            "warmup_steps": self.warmup_steps,
        }
        if self.ctx.is_main:
            tqdm.write(
                f"time budget {config.time_budget}: {seconds_per_update:.2f}s per update measured over "
                f"{self.step - first_step - 1} updates → {planned} updates planned "
                f"(warm-up {self.warmup_steps})"
            )
            self._write_run_config()

    def _past_deadline(self, past: bool) -> bool:
        """Whether any process is past the time budget: all of them stop at the same update."""
        if not self.ctx.is_distributed:
            return past
        flag = torch.tensor([1.0 if past else 0.0], device=self.ctx.device)
        return bool(self.ctx.all_reduce_mean(flag).item() > 0)

    def _latest_step(self) -> int:
        return int(read_json(self.checkpoint_dir / LATEST)["step"])

    def _train_step(self) -> tuple[float, float, int]:
        config, ctx = self.config, self.ctx
        batch = self.data.next_batch()
        micro_batches = split_micro_batches(batch, self.micro_batch_size)
        lr = learning_rate(self.step, config.lr, self.warmup_steps, self.max_steps, config.schedule)
        for optimizer in self.optimizers:
            for group in optimizer.param_groups:
                group["lr"] = lr * group.get("lr_scale", 1.0)
        self.forward.train()
        total_loss = torch.zeros((), device=ctx.device)
        n_tokens = 0
        for i, micro in enumerate(micro_batches):
            micro = {
                k: v.to(ctx.device, non_blocking=True) if isinstance(v, torch.Tensor) else v
                for k, v in micro.items()
            }
            n_tokens += micro["input_ids"].numel()
            with gradient_sync(self.model, sync=i == len(micro_batches) - 1):
                with autocast(self.precision.value, ctx.device):
                    loss = self.forward(**micro).loss / len(micro_batches)
                loss.backward()
            total_loss += loss.detach().float()
        total_loss = ctx.all_reduce_mean(total_loss)
        if config.grad_clip > 0:
            grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), config.grad_clip)
        else:
            grad_norm = torch.zeros(())
        loss_value, norm_value = float(total_loss), float(grad_norm)
        if not (math.isfinite(loss_value) and math.isfinite(norm_value)):
            message = f"step {self.step + 1}: loss is {loss_value}, gradient norm is {norm_value}"
            self._zero_grad()
            if config.on_nonfinite == "stop":
                raise NonFiniteLossError(
                    f"{message}; stopping (the last checkpoint is intact). Lower --lr, or pass "
                    "--on-nonfinite skip to skip such updates"
                )
            warnings.warn(f"{message}; skipping this update", stacklevel=2)
        else:
            for optimizer in self.optimizers:
                optimizer.step()
            self._zero_grad()
        self.step += 1
        self.tokens_seen += n_tokens * ctx.world_size
        return loss_value, norm_value, n_tokens

    def _zero_grad(self) -> None:
        for optimizer in self.optimizers:
            optimizer.zero_grad(set_to_none=True)

    def _after_step(self, loss: float, grad_norm: float, tokens_per_s: float) -> None:
        config = self.config
        last = self.step == self.max_steps
        record = None
        if self.step % config.log_every == 0 or last or self.step == 1:
            record = {
                "step": self.step,
                "loss": loss,
                "lr": self.optimizers[0].param_groups[0]["lr"],
                "grad_norm": grad_norm,
                "tokens_per_s": tokens_per_s,
                "tokens_seen": self.tokens_seen,
            }
        if self.evaluate is not None and config.eval_every and (self.step % config.eval_every == 0 or last):
            record = {**(record or {"step": self.step}), **self._evaluate()}
        if record is not None and self.ctx.is_main:
            _append_jsonl(self.out_dir / "metrics.jsonl", record)
        if (config.checkpoint_every and self.step % config.checkpoint_every == 0) or last:
            self.save_checkpoint()
            if self.ctx.is_main:
                plot_metrics(self.out_dir / "metrics.jsonl", self.out_dir / "loss.png")

    def _evaluate(self) -> dict[str, float]:
        was_training = self.model.training
        self.model.eval()
        with torch.no_grad(), autocast(self.precision.value, self.ctx.device):
            metrics = self.evaluate(self.model)
        if self.after_evaluate is not None:
            self.after_evaluate(self.step, metrics, self.model)
        self.model.train(was_training)
        self.last_metrics = metrics
        return metrics


def _rng_state() -> dict[str, torch.Tensor]:
    state = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def _set_rng_state(state: dict[str, torch.Tensor]) -> None:
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def _raise_keyboard_interrupt_on_sigterm():
    """A scheduler's SIGTERM saves a checkpoint like Ctrl-C does."""

    def handler(signum, frame):
        raise KeyboardInterrupt

    try:
        return signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread
        return signal.getsignal(signal.SIGTERM)


def _append_jsonl(path: Path, record: dict) -> None:
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(record) + "\n")


def read_metrics(path: str | Path) -> list[dict]:
    path = Path(path)
    if not path.exists():
        return []
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def _truncate_metrics(path: Path, step: int) -> None:
    """On resume, forget records past the checkpoint: they will be written again."""
    records = [r for r in read_metrics(path) if r["step"] <= step]
    text = "".join(json.dumps(r) + "\n" for r in records)
    atomic_write(path, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))


def plot_metrics(metrics_path: Path, png_path: Path) -> None:
    """Training (and validation) loss against step, as a PNG. Skipped if matplotlib is missing."""
    records = read_metrics(metrics_path)
    if not records:
        return
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, ax = plt.subplots(figsize=(7, 4))
    train = [(r["step"], r["loss"]) for r in records if "loss" in r]
    if train:
        ax.plot(*zip(*train), label="train loss", linewidth=1)
    for key in ("val_loss", "dev_loss"):
        points = [(r["step"], r[key]) for r in records if key in r]
        if points:
            ax.plot(*zip(*points), "o-", label=key.replace("_", " "))
    ax.set_xlabel("update")
    ax.set_ylabel("cross-entropy (nats / token)")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    atomic_write(png_path, lambda tmp: fig.savefig(tmp, dpi=110, format="png"))
    plt.close(fig)
