"""The training step's number formats: autocast for bf16 and fp16, and fp16's dynamic loss scaling.

fp16 has 5 exponent bits: gradients below about 6e-8 round to zero, and the backward pass's small
ones would. So the loss is multiplied by a scale S before ``backward`` (the gradients come out S
times larger, above the underflow) and the gradients divided by S before they are clipped or
applied (Micikevicius et al., 2018, "Mixed Precision Training"). S is dynamic, with
``torch.amp.GradScaler``'s rule and checkpoint format: an update whose gradients overflowed (inf
or NaN) is skipped and S halved; after 2000 updates in a row without overflow, S doubles. An
overflow is thus fp16's normal business, not a failure of the run: the loop counts the skipped
updates and goes on. bf16 has fp32's exponent range and needs no scaling; fp32 runs as it is.

The scaler is gptkit's own rather than GradScaler for three reasons. S lives on the host (a power
of two, exact as a Python float), so reading it for the log never waits for the device. The
gradients are unscaled with 1/S made on each gradient's own device, never copied there: GradScaler
copies it with ``non_blocking=True``, and a host kernel (FSDP2's gradients offloaded to the CPU)
may read the copy before it lands. And one overflow decision covers every optimizer: GradScaler
decides per optimizer, so Muon could step while AdamW skipped.
"""

from __future__ import annotations

import contextlib
import math
from collections import defaultdict
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
    which applies the update unless a gradient overflowed and moves the scale. ``found_inf`` holds
    the overflow on the device until the loop reads it with the update's other values. Under FSDP2
    each rank checks its own shards, and DTensor's all-reduce of the overflow flag (its rule for
    ``_amp_foreach_non_finite_check_and_unscale_``) makes every rank skip alike; under DDP the
    gradients are the same everywhere already.
    """

    def __init__(
        self,
        dtype: torch.dtype,
        device: torch.device,
        init_scale: float = 2.0**16,
        growth_interval: int = 2000,
    ):
        self.enabled = dtype == torch.float16
        self.device = device
        self.scale_value = float(init_scale)  # S: a power of two
        self.growth_factor, self.backoff_factor, self.growth_interval = 2.0, 0.5, growth_interval
        self.growth_tracker = 0  # updates in a row without overflow
        self.skipped = 0  # updates skipped for overflow, over the whole run (checkpointed)
        self.pending = False  # an update scaled and not yet stepped or discarded
        self.found_inf: torch.Tensor | None = None  # after unscale: > 0 where a gradient overflowed

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        """``loss`` times the current scale (``loss`` itself when not scaling)."""
        if not self.enabled:
            return loss
        self.pending = True
        return loss.float() * self.scale_value  # fp32: S itself may be past fp16's largest (65504)

    def unscale(self, optimizers: Sequence[torch.optim.Optimizer]) -> None:
        """Divide the gradients by the scale, noting any inf or NaN in ``found_inf`` (on the device)."""
        if not self.enabled:
            return
        groups: dict[tuple[torch.device, torch.dtype], list[torch.Tensor]] = defaultdict(list)
        for optimizer in optimizers:
            for group in optimizer.param_groups:
                for param in group["params"]:
                    if param.grad is None:
                        continue
                    if param.grad.dtype == torch.float16:  # 1/S would underflow in fp16
                        raise ValueError(
                            "fp16 loss scaling needs fp32 weights (and gradients): got fp16 ones"
                        )
                    groups[(param.grad.device, param.grad.dtype)].append(param.grad)
        flags = [torch.zeros((), device=self.device)]
        for (device, _), grads in groups.items():
            # Made where the gradients are, from the host's value: nothing to copy, nothing to wait for.
            inverse = torch.full((), 1.0 / self.scale_value, dtype=torch.float32, device=device)
            found = torch.zeros((), dtype=torch.float32, device=device)
            torch._amp_foreach_non_finite_check_and_unscale_(grads, found, inverse)
            # A host flag was written by a kernel that has finished; a copy from the host is ordered.
            flags.append(found.to(self.device))
        self.found_inf = torch.stack(flags).amax()

    def step(self, optimizers: Sequence[torch.optim.Optimizer], overflow: bool | None = None) -> bool:
        """Apply the update unless a gradient overflowed; move the scale. Whether it was applied.

        ``overflow``: ``found_inf`` as the caller read it; None reads it here (one wait for the
        device). One decision for every optimizer: all step, or none."""
        if not self.enabled:
            for optimizer in optimizers:
                optimizer.step()
            return True
        if self.pending and self.found_inf is None:  # never unscaled: do it now, as GradScaler does
            self.unscale(optimizers)
        if overflow is None:
            overflow = self.found_inf is not None and bool(self.found_inf.item())
        self.pending, self.found_inf = False, None
        if overflow:
            self.scale_value *= self.backoff_factor
            self.growth_tracker = 0
            self.skipped += 1
            return False
        for optimizer in optimizers:
            optimizer.step()
        self.growth_tracker += 1
        if self.growth_tracker >= self.growth_interval:
            grown = self.scale_value * self.growth_factor
            self.scale_value = grown if math.isfinite(grown) else self.scale_value
            self.growth_tracker = 0
        return True

    def discard(self) -> None:
        """Forget an update that is not applied for another reason (a non-finite loss, which no
        scale explains): the scale stays, and the next update unscales afresh."""
        self.pending, self.found_inf = False, None

    def metrics(self) -> dict[str, float]:
        """What the metrics log and the progress bar show: the scale and the updates skipped so far
        (nothing when not scaling). Host values: reading them waits for nothing."""
        if not self.enabled:
            return {}
        return {"loss_scale": self.scale_value, "skipped_updates": self.skipped}

    def state_dict(self) -> dict[str, Any]:
        """The scale, its growth counter and the skipped updates: plain numbers, in GradScaler's
        keys (a checkpoint written with it resumes here). Empty when not scaling."""
        if not self.enabled:
            return {}
        return {
            "scale": self.scale_value,
            "growth_factor": self.growth_factor,
            "backoff_factor": self.backoff_factor,
            "growth_interval": self.growth_interval,
            "_growth_tracker": self.growth_tracker,
            "skipped": self.skipped,
        }

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
        rules = {
            "growth_factor": lambda v: isinstance(v, float) and v > 1,
            "backoff_factor": lambda v: isinstance(v, float) and 0 < v < 1,
            "growth_interval": lambda v: isinstance(v, int) and not isinstance(v, bool) and v > 0,
        }
        factors = {name: state.get(name, getattr(self, name)) for name in rules}
        for name, value in factors.items():
            if not rules[name](value):
                raise ValueError(f"{source}: the loss scale's {name} is {value!r}")
        self.growth_factor, self.backoff_factor, self.growth_interval = factors.values()
        self.scale_value, self.growth_tracker, self.skipped = (
            scale,
            state["_growth_tracker"],
            state["skipped"],
        )
