"""Checks of the training step: selective checkpointing's gradients with dropout, bf16 and fp16
training (fp16 through a forced overflow), and the host synchronisations of one update."""

from __future__ import annotations

import copy
import tempfile
import warnings
from collections.abc import Callable
from typing import Any

import torch

from gptkit import GPT, GPTConfig
from gptkit.hardware import bf16_native
from gptkit.testing.gpu_checks.common import ByteWindows, Settings, byte_ids, skipped
from gptkit.train.config import TrainConfig
from gptkit.train.distributed.processes import DistributedContext
from gptkit.train.loop import Trainer
from gptkit.train.memory.activation_checkpointing import apply_activation_checkpointing
from gptkit.train.metrics_log import read_metrics


def _gradients(model: torch.nn.Module, ids: torch.Tensor, dtype: torch.dtype, seed: int = 7) -> dict:
    torch.manual_seed(seed)  # the CUDA generator too: dropout's masks
    with torch.autocast(ids.device.type, dtype=dtype, enabled=dtype != torch.float32):
        loss = model(ids, labels=ids, compute_logits=False).loss
    loss.backward()
    return {name: p.grad.detach().float().clone() for name, p in model.named_parameters()}


def _largest_difference(a: dict, b: dict) -> float:
    return max((a[name] - b[name]).abs().max().item() for name in a)


def check_selective_checkpointing(settings: Settings) -> dict[str, Any]:
    """Gradients with dropout on, through CUDA's fused attention (flash in bf16, memory-efficient in
    fp32): selective checkpointing must give the unchecked run's, as full does. CUDA's attention
    backward sums in no fixed order, so both are compared with the unchecked run and selective may
    differ no more than full does (a mask drawn at another offset differs by the gradients' own
    size). On a CPU attention with dropout is unfused: the check then shows only that it runs."""
    device = settings.torch_device
    size = 64 if settings.stand_in else 256
    torch.manual_seed(0)
    config = GPTConfig(vocab_size=512, context_length=size, n_layer=4, n_head=4, d_model=size, dropout=0.1)
    plain = GPT(config).to(device).train()
    ids = torch.randint(0, 512, (8, size), device=device)
    measured = {}
    for dtype in (torch.float32, torch.bfloat16):
        if dtype == torch.bfloat16 and not bf16_native(device).native:
            measured["bfloat16"] = {"skipped": bf16_native(device).reason}
            continue
        expected = _gradients(plain, ids, dtype)
        plain.zero_grad(set_to_none=True)
        scale = max(g.abs().max().item() for g in expected.values())
        full = _gradients(apply_activation_checkpointing(copy.deepcopy(plain), "full"), ids, dtype)
        selective = _gradients(apply_activation_checkpointing(copy.deepcopy(plain), "selective"), ids, dtype)
        measured[str(dtype).removeprefix("torch.")] = {
            "largest_gradient": scale,
            "full_vs_unchecked": _largest_difference(full, expected),
            "selective_vs_unchecked": _largest_difference(selective, expected),
        }
    passed = all(
        m["selective_vs_unchecked"] <= 2 * m["full_vs_unchecked"] + 1e-3 * m["largest_gradient"]
        for m in measured.values()
        if "skipped" not in m
    )
    return {"passed": passed, "measured": measured}


def _small_run(settings: Settings, precision: str, steps: int, before_batch: Callable, out: str) -> Trainer:
    """A small GPT over the corpus's bytes and gptkit's Trainer for it: the loop `gptkit pretrain`
    runs, with its logging, loss scaling and checkpoints; batches from :class:`ByteWindows`."""
    length, width, layers, batch = (32, 32, 2, 8) if settings.stand_in else (256, 256, 4, 16)
    torch.manual_seed(0)
    config = GPTConfig(
        vocab_size=256, context_length=length, n_layer=layers, n_head=4, d_model=width, dropout=0.0
    )
    model = GPT(config).to(settings.torch_device)
    train = TrainConfig(
        max_steps=steps, batch_size=batch, lr=1e-3, warmup_steps=steps // 10, precision=precision,
        eval_every=0, log_every=1, progress=False, seed=0,
    )  # fmt: skip
    data = ByteWindows(byte_ids(), length, batch, before_batch=before_batch)
    ctx = DistributedContext(device=settings.torch_device)
    save = lambda directory, state: torch.save(state, directory / "model.pt")  # noqa: E731
    return Trainer(model, train, data, out, save_model=save, ctx=ctx)


def _weights_sum(model: torch.nn.Module) -> float:
    return sum(p.detach().double().sum().item() for p in model.parameters())


class ForcedOverflow:
    """Between updates: before update ``at``, the loss scale is set to 2^64, so that the scaled
    gradients overflow fp16 (the loss itself stays finite); before the next, the scale goes back.
    Records whether that update left the weights as they were and was counted as skipped."""

    def __init__(self, at: int):
        self.at, self.trainer = at, None  # the trainer is set once built, before it trains
        self.weights = 0.0  # their sum before the forced update
        self.observed: dict[str, Any] = {}

    def __call__(self, step: int) -> None:
        scaler = self.trainer.loss_scaler
        if step == self.at:
            self.observed["scale_before"] = scaler.scale_value
            self.observed["skipped_before"], self.weights = scaler.skipped, _weights_sum(self.trainer.model)
            scaler.scale_value = 2.0**64
        elif step == self.at + 1:
            self.observed["weights_unchanged"] = _weights_sum(self.trainer.model) == self.weights
            self.observed["counted_as_skipped"] = scaler.skipped == self.observed["skipped_before"] + 1
            scaler.scale_value = self.observed["scale_before"]


def _losses(out: str) -> list[dict]:
    return [r for r in read_metrics(f"{out}/metrics.jsonl") if "loss" in r]


def _trained(settings: Settings, precision: str) -> dict[str, Any]:
    """One small run in ``precision``: the loss falls (the mean of the last tenth of the updates
    at least 0.5 below the first tenth's); under fp16, an update forced to overflow halfway is
    skipped, with the weights untouched, and the run goes on."""
    steps = 50 if settings.stand_in else 150
    overflow = ForcedOverflow(steps // 2) if precision == "fp16" else None
    with tempfile.TemporaryDirectory() as out, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a CPU without native bf16 or fp16 is told so; known here
        trainer = _small_run(settings, precision, steps, overflow or (lambda step: None), out)
        if overflow is not None:
            overflow.trainer = trainer
        trainer.fit()
        records = _losses(out)
    tenth = max(steps // 10, 1)
    first = sum(r["loss"] for r in records[:tenth]) / tenth
    last = sum(r["loss"] for r in records[-tenth:]) / tenth
    result = {"updates": len(records), "first_tenth_loss": round(first, 4), "last_tenth_loss": round(last, 4)}
    passed = len(records) == steps and last < first - 0.5
    if overflow is not None:
        result.update(overflow.observed, skipped_updates=records[-1].get("skipped_updates"))
        result["loss_scale"] = records[-1].get("loss_scale")
        passed = passed and overflow.observed.get("weights_unchanged") is True
        passed = passed and overflow.observed.get("counted_as_skipped") is True
    return {"passed": passed, **result}


def check_precision_training(settings: Settings) -> dict[str, Any]:
    """bf16 and fp16 autocast training of a small model on the corpus's bytes (see :func:`_trained`).
    On a CPU a format its hardware lacks takes a slow path but still runs; one that autocast refuses
    there is skipped, by name."""
    runs = {}
    for precision in ("bf16", "fp16"):
        try:
            runs[precision] = _trained(settings, precision)
        except RuntimeError as e:
            if not settings.stand_in:
                raise
            runs[precision] = skipped(f"{precision} autocast on this CPU: {type(e).__name__}: {e}")
    verdicts = [r["passed"] for r in runs.values() if r["passed"] is not None]
    return {"passed": all(verdicts) if verdicts else None, "runs": runs}


def check_sync_debug(settings: Settings) -> dict[str, Any]:
    """How often one training update waits for the GPU: CUDA's sync debug mode warns at each
    synchronising call, counted between consecutive updates (the first, which allocates, and the
    last, which saves a checkpoint, left out). A measurement, not a target."""
    if settings.device != "cuda":
        return skipped("CUDA's sync debug mode needs a CUDA device")
    steps, seen = 8, []

    def count(step: int) -> None:
        seen.append(sum("synchroniz" in str(w.message) for w in caught))

    with tempfile.TemporaryDirectory() as out, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer = _small_run(settings, "auto", steps, count, out)
        torch.cuda.set_sync_debug_mode("warn")
        try:
            trainer.fit()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    counts = [b - a for a, b in zip(seen[1:], seen[2:])]  # updates 1 .. steps - 2
    return {"passed": None, "target": "none: a measurement", "syncs_per_update": counts}
