"""The one training loop, shared by pre-training (L1) and fine-tuning (L3 = L2 + λ·L1).

The two stages differ in the batches they feed and in what the model's forward returns as
``.loss``; accumulation, clipping, autocast, the schedule and evaluation live here once, and the
loop hands its other jobs to parts: fp16's loss scaling (:mod:`~gptkit.train.precision`), the run
directory's layout (:mod:`~gptkit.train.rundir`),
checkpoints that resume exactly (:mod:`~gptkit.train.checkpoints.checkpointer`), the metrics log
(:mod:`~gptkit.train.metrics_log`) and the time-budget planner (:mod:`~gptkit.train.budget`).
A non-finite update is never applied, and never saved (under fp16, gradients that overflow are the
loss scaler's: the update is skipped and counted, and the scale lowered).

On a GPU the loop waits for the device once per update, no more: the values the update must
decide on (the loss, the gradient norm, an fp16 overflow, whether there was anything to learn, a
stop request, a time budget's deadline under torchrun) are read together, between the backward
pass and the optimizer's step. Token ids are checked on the host before they move; the rest (the
log, the progress bar) uses those values. (FSDP2's CPU offload waits on its own copies to the host.)
"""

from __future__ import annotations

import math
import signal
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import torch
import torch.nn as nn
from tqdm import tqdm

from gptkit.hardware import matmul_peak_flops, resolve_precision
from gptkit.io import write_json
from gptkit.model import GPT
from gptkit.progress import hidden_unless_terminal
from gptkit.train.budget import BudgetPlan, TimeBudget
from gptkit.train.checkpoints.checkpointer import CheckpointConfig, Checkpointer, SaveModel, set_rng_state
from gptkit.train.config import TrainConfig
from gptkit.train.distributed.processes import DistributedContext, gradient_sync, unwrap
from gptkit.train.memory.allocator import keep_freed_memory
from gptkit.train.metrics_log import MetricsLogger, MetricsWriter, make_writers
from gptkit.train.optim import build_optimizers, learning_rate
from gptkit.train.precision import LossScaler, autocast
from gptkit.train.rundir import RunDir
from gptkit.train.signals import STOP_SIGNALS, Interrupted, StopSignals

__all__ = ["BatchSource", "Interrupted", "NonFiniteLossError", "Trainer"]


class BatchSource(Protocol):
    """Where batches come from: this rank's share of the next global batch, and a resumable position."""

    def next_batch(self) -> dict[str, torch.Tensor]: ...

    def state_dict(self) -> dict: ...

    def load_state_dict(self, state: dict) -> None: ...


class NonFiniteLossError(RuntimeError):
    pass


def training_flops_per_token(model: nn.Module) -> float:
    """6·N: a forward and backward pass's FLOPs per token over the model's N matrix weights (Kaplan
    et al., 2020; a tied embedding counts once, as the output layer). Attention's scores are left
    out, as in the usual MFU, so it is a slight undercount at long contexts."""
    return 6.0 * sum(p.numel() for p in model.parameters() if p.dim() >= 2)


def split_micro_batches(batch: dict, micro_batch_size: int) -> list[dict]:
    """Slice every tensor of the batch along its first dimension; other values (flags) go to each."""
    size = next(v for v in batch.values() if isinstance(v, torch.Tensor)).size(0)
    return [
        {k: v[i : i + micro_batch_size] if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
        for i in range(0, size, micro_batch_size)
    ]


def micro_batch_size(config: TrainConfig, world_size: int) -> int:
    """The examples (or windows) a process computes at once: ``micro_batch_size``, at most its share
    of the global batch, which must split evenly into the processes and their micro-batches."""
    per_rank = config.batch_size // world_size
    micro = min(config.micro_batch_size or per_rank, per_rank)
    if config.batch_size % world_size or per_rank % micro:
        raise ValueError(
            f"batch_size {config.batch_size} must split evenly into {world_size} process(es) × "
            f"micro-batches of {micro}"
        )
    return micro


def token_id_check(model: nn.Module) -> Callable[[torch.Tensor], None] | None:
    """The check of token ids of the GPT inside ``model`` (a task head's, an adapter's), if any."""
    gpt = next((m for m in unwrap(model).modules() if isinstance(m, GPT)), None)
    return None if gpt is None else gpt.check_token_ids


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
        metrics_writers: extra destinations for the metrics log's records (metrics.jsonl always).
    """

    budget: TimeBudget | None = None  # the time budget being planned for, while fit() runs
    deadline_agreed = False  # under torchrun: whether any process was past it (_read_update)

    def __init__(
        self,
        model: nn.Module,
        config: TrainConfig,
        data: BatchSource,
        out_dir: str | Path,
        save_model: SaveModel,
        ctx: DistributedContext | None = None,
        evaluate: Callable[[nn.Module], dict[str, float]] | None = None,
        run_config: dict[str, Any] | None = None,
        after_evaluate: Callable[[int, dict[str, float], nn.Module], None] | None = None,
        metrics_writers: tuple[MetricsWriter, ...] = (),
    ):
        self.ctx = ctx or DistributedContext()
        self.model, self.config, self.data = model, config, data
        self.run_dir = RunDir(out_dir)
        self.out_dir = self.run_dir.root
        self.evaluate, self.after_evaluate = evaluate, after_evaluate
        self.run_config = run_config or {}
        self.checkpointer = Checkpointer(
            self.run_dir,
            save_model,
            CheckpointConfig(config.checkpoint_every, config.keep_checkpoints),
            self.ctx,
        )
        if self.ctx.is_main:
            metrics_writers = (*metrics_writers, *make_writers(config.log_to, self.run_dir, self.run_config))
        self.metrics = MetricsLogger(self.run_dir, metrics_writers, enabled=self.ctx.is_main)
        self.step = 0
        self.tokens_seen = 0
        self.precision = resolve_precision(config.precision, self.ctx.device, "training")
        self.loss_scaler = LossScaler(self.precision.dtype, self.ctx.device)  # fp16's; else a plain step
        self.nothing_to_learn = False  # the last batch had no target token (_update)
        self.stop = StopSignals()  # listening while fit() runs
        self.check_token_ids = token_id_check(model)
        self.optimizers = build_optimizers(
            unwrap(model),
            config.optimizer,
            config.lr,
            config.weight_decay,
            (config.beta1, config.beta2),
            config.eps,
            # Muon's iteration in the training precision: fp32 when asked for, even on bf16 hardware.
            ns_dtype=self.precision.dtype,
            adamw_lr_scale=config.adamw_lr_scale,
        )
        self.micro_batch_size = micro_batch_size(config, self.ctx.world_size)
        self.forward = torch.compile(model) if config.compile else model
        if self.ctx.device.type == "cpu":
            keep_freed_memory()  # see gptkit.train.memory.allocator: a third of a CPU step otherwise
        self.last_metrics: dict[str, float] = {}
        self.flops_per_token = training_flops_per_token(unwrap(model))
        self.peak_flops: float | None = None  # measured when training starts (MFU's denominator)
        if config.max_steps is None:
            raise ValueError("TrainConfig.max_steps must be set before training (fine-tuning derives it)")
        # A time budget's plan, once the first updates are timed: the schedule follows it, and
        # checkpoints save it. The config itself is never changed.
        self.plan: BudgetPlan | None = None
        self.clock: Callable[[], float] = time.perf_counter  # what time budgets are measured with
        self.evaluation_seconds = 0.0  # spent evaluating, in all (a time budget's pace excludes it)

    @property
    def max_steps(self) -> int:
        """The run's last update: the time budget's plan, else the config's."""
        return self.config.max_steps if self.plan is None else self.plan.planned_steps

    @property
    def warmup_steps(self) -> int:
        """The learning rate's warm-up: the time budget's plan, else the config's."""
        if self.plan is None:
            return self.config.warmup_for(self.config.max_steps)
        return self.plan.warmup_steps

    # Checkpoints (the Checkpointer does the work) --------------------------------------------------

    @property
    def save_model(self) -> SaveModel:
        return self.checkpointer.save_model

    @save_model.setter
    def save_model(self, save_model: SaveModel) -> None:
        self.checkpointer.save_model = save_model

    def save_checkpoint(self) -> Path:
        """Write model + optimizer + schedule position + RNG + data position; all ranks must call it."""
        plan = {} if self.plan is None else self.plan.to_dict()
        state = {"tokens_seen": self.tokens_seen, "data": self.data.state_dict(), "plan": plan}
        state["loss_scaler"] = self.loss_scaler.state_dict()
        return self.checkpointer.save(self.step, self.model, self.optimizers, state)

    def latest_checkpoint(self) -> Path | None:
        return self.checkpointer.latest()

    def resume(self, checkpoint: Path, load_model_state: Callable[[Path], dict[str, torch.Tensor]]) -> None:
        """Continue exactly where ``checkpoint`` stopped: same weights, moments, step, data, RNG."""
        state = self.checkpointer.load(checkpoint, self.model, self.optimizers, load_model_state)
        self.step = int(state["step"])
        self.tokens_seen = int(state.get("tokens_seen", 0))
        # A run planned for a time budget keeps its plan: the schedule must not change under it.
        # Otherwise the config rules, so that --resume --max-steps N extends a finished run.
        if state["plan"]:
            self.plan = BudgetPlan.from_dict(state["plan"])
        self.data.load_state_dict(state["data"])
        self.loss_scaler.load_state_dict(state.get("loss_scaler", {}), str(checkpoint))
        if state["rng"] is not None:
            set_rng_state(state["rng"])
        else:
            warnings.warn(
                f"checkpoint was written by {state['rng_processes']} process(es), resuming with "
                f"{self.ctx.world_size}: dropout randomness restarts from the seed",
                stacklevel=2,
            )
            torch.manual_seed(self.config.seed + self.ctx.rank + self.step)
        self.metrics.truncate(self.step)

    # The loop ------------------------------------------------------------------------------------

    def fit(self) -> dict[str, float]:
        config, ctx = self.config, self.ctx
        if ctx.is_main:
            print(f"precision: {self.precision.reason}; device: {ctx.device}", flush=True)
            self.out_dir.mkdir(parents=True, exist_ok=True)
            self.peak_flops = matmul_peak_flops(ctx.device, self.precision.dtype)
            for path in self.run_dir.sweep_debris():
                print(f"removed {path.name}, left by an interrupted write", flush=True)
            if self.step == 0:  # records of a run that stopped before its first checkpoint go
                self.metrics.truncate(0)
            self._write_run_config()
        budget = None
        if config.time_budget_seconds is not None and self.plan is None:  # a resumed plan stands
            budget = TimeBudget(
                config.time_budget_seconds,
                config.time_budget,
                config.max_steps,
                config.planned_warmup,
                config.eval_every or 0,
                ctx,
                self.clock,
            )
            budget.start(self.step)
        self.budget = budget
        bar = tqdm(
            total=self.max_steps,
            initial=self.step,
            desc="training",
            disable=hidden_unless_terminal(config.progress and ctx.is_main),
            dynamic_ncols=True,
        )
        interrupted = False
        stop = self.stop = StopSignals()  # a fit after an interrupted one starts unasked
        try:
            with stop:
                self._loop(budget, bar)
        except KeyboardInterrupt:  # raised inside an update (not by a signal): the update is undone
            interrupted = True
        finally:
            bar.close()
        signum = stop.requested(ctx.is_distributed)
        if interrupted or signum is not None:
            bar.write(f"interrupted: saving a checkpoint at step {self.step}")
        if self.step > 0 and not self.checkpointer.holds(self.step):
            self.save_checkpoint()
        if interrupted or signum is not None:
            # Saved; now let the caller stop too (the CLI exits 128 + the signal's number).
            self.metrics.close()
            raise Interrupted(self.step, signum or signal.SIGINT)
        if self.evaluate is not None and not config.eval_every:
            self._evaluate()
        self.metrics.plot()
        self.metrics.close()
        return self.last_metrics

    def _loop(self, budget: TimeBudget | None, bar: tqdm) -> None:
        ctx = self.ctx
        while self.step < self.max_steps and self.stop.requested(ctx.is_distributed) is None:
            started = self.clock()
            loss, grad_norm, n_tokens = self._train_step()
            now = self.clock()
            tokens_per_s = n_tokens * ctx.world_size / max(now - started, 1e-9)
            bar.update(1)
            postfix = {"loss": f"{loss:.4f}", "tok_s": f"{tokens_per_s:,.0f}", **self.loss_scaler.metrics()}
            bar.set_postfix(postfix, refresh=False)
            if budget is not None:
                self._follow_budget(budget, now, bar)
            self._after_step(loss, grad_norm, tokens_per_s)

    def _follow_budget(self, budget: TimeBudget, now: float, bar: tqdm) -> None:
        """Plan (or re-plan) the run for its time budget; stop it at the deadline."""
        time_evaluation = (
            self._timed_evaluation if self.evaluate is not None and self.config.eval_every else None
        )
        plan = budget.after_update(self.step, now, self.plan, time_evaluation, self.evaluation_seconds)
        if plan is not None:
            self.plan = plan
            bar.total = self.max_steps
            bar.refresh()
            if self.ctx.is_main:
                tqdm.write(budget.message(plan))
                self._write_run_config()
        if self.step < self.max_steps and budget.past_deadline(now, self.deadline_agreed):
            # Past the deadline (the plan was too hopeful): this update is the last. The run is
            # complete as it stands (a resume has nothing left to do), also when the deadline came
            # before the plan was made.
            bar.write(f"time budget of {self.config.time_budget} spent: stopping at update {self.step}")
            self.plan = budget.stop_here(self.plan, self.step, self.warmup_steps)
            if self.ctx.is_main:
                self._write_run_config()  # what ran, not what was planned

    def _timed_evaluation(self) -> float:
        """One periodic evaluation, logged and timed (a time budget plans room for those to come)."""
        before = self.evaluation_seconds
        metrics = self._evaluate()
        self.metrics.log({"step": self.step, **metrics})
        return self.evaluation_seconds - before

    def _write_run_config(self) -> None:
        resolved = {"precision": self.precision.name, "precision_reason": self.precision.reason}
        resolved.update(device=str(self.ctx.device), max_steps=self.max_steps, warmup_steps=self.warmup_steps)
        if self.plan is not None:
            resolved["time_budget_plan"] = self.plan.to_dict()
        write_json(self.run_dir.run_config, {**self.run_config, "resolved": resolved})

    def _train_step(self) -> tuple[float, float, int]:
        position = self.data.state_dict()
        try:
            return self._update()
        except KeyboardInterrupt:
            # Stopped before the update was applied: the batch was drawn but not trained on, so the
            # data position goes back, and a resume trains on it as the uninterrupted run did.
            self._zero_grad()
            self.loss_scaler.discard()
            self.data.load_state_dict(position)
            raise

    def _update(self) -> tuple[float, float, int]:
        config, ctx = self.config, self.ctx
        batch = self.data.next_batch()
        lr = learning_rate(self.step, config.lr, self.warmup_steps, self.max_steps, config.schedule)
        for optimizer in self.optimizers:
            for group in optimizer.param_groups:
                group["lr"] = lr * group.get("lr_scale", 1.0)
        total_loss, grad_norm, n_tokens = self.compute_gradients(batch)
        loss_value, norm_value, overflow = self._read_update(total_loss, grad_norm)
        # An fp16 gradient that overflowed is the loss scaler's to skip (apply_gradients); a loss
        # that is not finite is not a matter of scale.
        finite_norm = math.isfinite(norm_value) or self.loss_scaler.enabled
        if self.nothing_to_learn:  # a step would still move the weights (weight decay, momentum)
            warnings.warn(f"step {self.step + 1}: no target token in the batch; update skipped", stacklevel=2)
            self._zero_grad()
            self.loss_scaler.discard()
        elif not (math.isfinite(loss_value) and finite_norm):
            message = f"step {self.step + 1}: loss is {loss_value}, gradient norm is {norm_value}"
            self._zero_grad()
            self.loss_scaler.discard()
            if config.on_nonfinite == "stop":
                raise NonFiniteLossError(
                    f"{message}; stopping (the last checkpoint is intact). Lower --lr, or pass "
                    "--on-nonfinite skip to skip such updates"
                )
            warnings.warn(f"{message}; skipping this update", stacklevel=2)
        else:
            self.apply_gradients(overflow)
        self.step += 1
        self.tokens_seen += n_tokens * ctx.world_size
        return loss_value, norm_value, n_tokens

    def compute_gradients(self, batch: dict) -> tuple[torch.Tensor, torch.Tensor, int]:
        """Forward and backward over ``batch``'s micro-batches, the gradients reduced across processes
        and clipped (under fp16, unscaled first): (the mean loss, the gradient norm, this process's
        tokens). Reads no value on the device (only token ids still on the host, bound for a
        device), so that it also runs on fake tensors (``gptkit estimate``)."""
        config, ctx = self.config, self.ctx
        ids = batch["input_ids"]
        if self.check_token_ids is not None and ctx.device.type != "cpu" and ids.device.type == "cpu":
            self.check_token_ids(ids)  # on the host: the forward on the device leaves them unread
        micro_batches = split_micro_batches(batch, self.micro_batch_size)
        self.forward.train()
        total_loss = torch.zeros((), device=ctx.device)
        n_tokens = 0
        targets = []  # each micro-batch's target tokens, from a model that counts them (CompletionModel)
        for i, micro in enumerate(micro_batches):
            micro = {
                k: v.to(ctx.device, non_blocking=True) if isinstance(v, torch.Tensor) else v
                for k, v in micro.items()
            }
            n_tokens += micro["input_ids"].numel()
            with gradient_sync(self.model, sync=i == len(micro_batches) - 1):
                with autocast(self.precision.dtype, ctx.device):
                    out = self.forward(**micro)
                    loss = out.loss / len(micro_batches)
                targets += [out.target_tokens.float()] if hasattr(out, "target_tokens") else []
                self.loss_scaler.scale(loss).backward()
            total_loss += loss.detach().float()
        # One all-reduce for what every process decides alike: the loss, the target tokens (of a
        # model that counts them), the stop requests (a signal may reach one process first) and
        # whether this process is past a time budget: all stop after the same update.
        requests = torch.zeros(len(STOP_SIGNALS) + 1, device=ctx.device)
        if self.stop.signum is not None:
            requests[STOP_SIGNALS.index(self.stop.signum)] = 1.0  # a fill: nothing copied to the device
        if self.budget is not None and self.budget.elapsed(self.clock()) >= self.budget.seconds:
            requests[-1] = 1.0
        target_total = sum(targets) if targets else torch.zeros((), device=ctx.device)
        self.counts_targets = bool(targets)
        self.shared = ctx.all_reduce_mean(torch.cat([total_loss[None], target_total[None], requests]))
        self.loss_scaler.unscale(self.optimizers)
        if config.grad_clip > 0:
            grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), config.grad_clip)
        else:
            grad_norm = torch.zeros((), device=ctx.device)
        return self.shared[0], grad_norm, n_tokens

    def _read_update(self, loss: torch.Tensor, grad_norm: torch.Tensor) -> tuple[float, float, bool]:
        """The update's one wait for the device: (the loss, the gradient norm, whether an fp16
        gradient overflowed), read together with whether the batch had a target token and whether
        any process was asked to stop."""
        if hasattr(grad_norm, "full_tensor"):  # FSDP2's norm is a DTensor
            grad_norm = grad_norm.full_tensor()
        found_inf = self.loss_scaler.found_inf
        values = [loss, grad_norm.to(self.ctx.device), *self.shared[1:]]
        values.append(torch.zeros((), device=self.ctx.device) if found_inf is None else found_inf)
        loss_value, norm_value, targets, *requests, past, overflow = torch.stack(
            [v.float() for v in values]
        ).tolist()
        self.nothing_to_learn, self.deadline_agreed = self.counts_targets and targets == 0.0, past > 0.0
        if self.stop.agreed is None and any(requests):
            self.stop.agreed = next(s for s, asked in zip(STOP_SIGNALS, requests, strict=True) if asked)
        return loss_value, norm_value, bool(overflow)

    def apply_gradients(self, overflow: bool | None = None) -> bool:
        """The optimizers' step with the gradients :meth:`compute_gradients` left, then no gradients.
        Whether it was applied: under fp16, not when the gradients overflowed (``overflow`` as the
        update read it; None: the loss scaler reads it)."""
        applied = self.loss_scaler.step(self.optimizers, overflow)
        self._zero_grad()
        return applied

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
                # An update fp16's scaler skipped has an infinite norm: null, as strict JSON has it.
                "grad_norm": grad_norm if math.isfinite(grad_norm) else None,
                "tokens_per_s": tokens_per_s,
                "tokens_seen": self.tokens_seen,
            }
            record.update(self.loss_scaler.metrics())
            if self.peak_flops:  # model FLOPs utilisation, per device: achieved over the measured peak
                record["mfu"] = tokens_per_s * self.flops_per_token / (self.ctx.world_size * self.peak_flops)
        if self.evaluate is not None and config.eval_every and (self.step % config.eval_every == 0 or last):
            record = {**(record or {"step": self.step}), **self._evaluate()}
        if record is not None:
            self.metrics.log(record)
        if self.checkpointer.due(self.step) or last:
            self.save_checkpoint()
            self.metrics.plot()

    def _evaluate(self) -> dict[str, float]:
        started = self.clock()
        was_training = self.model.training
        self.model.eval()
        with torch.no_grad(), autocast(self.precision.dtype, self.ctx.device):
            metrics = self.evaluate(self.model)
        if self.after_evaluate is not None:
            self.after_evaluate(self.step, metrics, self.model)
        self.model.train(was_training)
        self.last_metrics = metrics
        self.evaluation_seconds += self.clock() - started
        return metrics
