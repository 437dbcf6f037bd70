"""The training step's number formats: autocast for bf16 and fp16, and fp16's dynamic loss scaling.

fp16 has 5 exponent bits: gradients below about 6e-8 round to zero, and the backward pass's small
ones would. So the loss is multiplied by a scale S before ``backward`` (the gradients come out S
times larger, above the underflow) and the gradients divided by S before they are clipped or
applied (Micikevicius et al., 2018, "Mixed Precision Training"). S is dynamic, as in
``torch.amp.GradScaler``, which does the work: an update whose gradients overflowed (inf or NaN) is
skipped and S halved; after 2000 updates in a row without overflow, S doubles. An overflow is thus
fp16's normal business, not a failure of the run: the loop counts the skipped updates and goes on.
bf16 has fp32's exponent range and needs no scaling; fp32 runs as it is.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Sequence
from typing import Any

import torch

# The autocast formats a training precision may resolve to (gptkit.hardware.resolve_precision).
AUTOCAST_DTYPES = (torch.bfloat16, torch.float16)


def autocast(dtype: torch.dtype, device: torch.device):
    """Autocast to ``dtype`` for a bf16 or fp16 training precision; fp32 runs as it is."""
    if dtype in AUTOCAST_DTYPES:
        return torch.autocast(device_type=device.type, dtype=dtype)
    if dtype != torch.float32:
        raise ValueError(f"training precision must be torch.float32, bfloat16 or float16, got {dtype}")
    return contextlib.nullcontext()


class LossScaler:
    """fp16's dynamic loss scale around the optimizers' step; for bf16 and fp32 a plain step.

    An update is: ``scale(loss).backward()`` for each micro-batch, ``unscale(optimizers)`` (before
    clipping, so that the norm and the clip are the true gradients'), then ``step(optimizers)``,
    which applies the update unless the gradients overflowed and moves the scale. Under FSDP2 each
    rank checks its own shards, and DTensor's all-reduce of the overflow flag makes every rank skip
    alike; under DDP the gradients are the same everywhere already.
    """

    def __init__(self, dtype: torch.dtype, device: torch.device):
        self.enabled = dtype == torch.float16
        self.scaler = torch.amp.GradScaler(device.type, enabled=self.enabled)
        self.skipped = 0  # updates skipped for overflow, over the whole run (checkpointed)
        self.pending = False  # an update scaled and not yet stepped or discarded

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        """``loss`` times the current scale (``loss`` itself when not scaling)."""
        self.pending = self.enabled
        return self.scaler.scale(loss)

    def unscale(self, optimizers: Sequence[torch.optim.Optimizer]) -> None:
        """Divide the gradients by the scale, noting any inf or NaN (once per update)."""
        for optimizer in optimizers:
            self.scaler.unscale_(optimizer)

    def step(self, optimizers: Sequence[torch.optim.Optimizer]) -> bool:
        """Apply the update unless the gradients overflowed; move the scale. Whether it was applied."""
        if not self.enabled:
            for optimizer in optimizers:
                optimizer.step()
            return True
        before = self.scaler.get_scale()
        for optimizer in optimizers:
            self.scaler.step(optimizer)  # skips this optimizer's step if any gradient overflowed
        self.scaler.update()
        self.pending = False
        # The scale falls only after an overflow (backoff 0.5); it stays or doubles otherwise.
        applied = self.scaler.get_scale() >= before
        self.skipped += not applied
        return applied

    def discard(self) -> None:
        """Forget an update that is not applied for another reason (a non-finite loss, which no
        scale explains): the scale stays, and the next update unscales afresh."""
        if self.pending:
            self.scaler.update(self.scaler.get_scale())
            self.pending = False

    def metrics(self) -> dict[str, float]:
        """What the metrics log and the progress bar show: the scale and the updates skipped so far
        (nothing when not scaling)."""
        if not self.enabled:
            return {}
        return {"loss_scale": self.scaler.get_scale(), "skipped_updates": self.skipped}

    def state_dict(self) -> dict[str, Any]:
        """The scale, its growth counter and the skipped updates: plain numbers (exact: the scale is
        an fp32 value, which a Python float holds exactly). Empty when not scaling."""
        if not self.enabled:
            return {}
        return {**self.scaler.state_dict(), "skipped": self.skipped}

    def load_state_dict(self, state: dict[str, Any], source: str) -> None:
        """Continue from :meth:`state_dict`'s ``state``; ``source`` names the checkpoint in errors.

        An empty ``state`` (a checkpoint of a bf16 or fp32 run) starts the scale afresh; a scale
        from an fp16 run resumed in another precision is dropped."""
        if not self.enabled or not state:
            return
        scale = state.get("scale")
        if not isinstance(scale, float) or not (math.isfinite(scale) and scale > 0):
            raise ValueError(f"{source}: the loss scale is {scale!r}, expected a positive number")
        for name, what in (
            ("_growth_tracker", "the loss scale's growth counter"),
            ("skipped", "skipped updates"),
        ):
            count = state.get(name)
            if not isinstance(count, int) or isinstance(count, bool) or count < 0:
                raise ValueError(f"{source}: {what} is {count!r}, expected a count")
        self.scaler.load_state_dict({k: v for k, v in state.items() if k != "skipped"})
        self.skipped = state["skipped"]
