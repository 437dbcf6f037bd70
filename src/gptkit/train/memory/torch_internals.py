"""PyTorch's private APIs that `gptkit estimate` relies on, all here and each checked on use.

The estimate runs a training step on fake tensors over a fake process group and reads PyTorch's
memory trackers; these live in private modules (``torch._subclasses``, ``torch.testing._internal``,
``torch.distributed._tools``), and the CUDA autocast rules come from the dispatcher's private
bindings (``torch._C``). A torch release may move or rename any of them. Each is reached through a
function here that fails with one line naming the missing piece and the torch version, instead of a
traceback deep in a step, and the trackers' categories are checked by name, so that a renamed one
is an error rather than bytes that silently move into "other".
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

import torch
import torch.nn as nn

# The trackers' reference types by the names they print, and the estimate's category of each.
TRACKER_CATEGORIES = {
    "Parameter": "parameters",  # MemTracker
    "Sharded Param": "parameters",  # FSDPMemTracker: this rank's shards
    "Gradient": "gradients",
    "Sharded Grad": "gradients",
    "Optstate": "optimizer_state",  # MemTracker's spelling
    "OptState": "optimizer_state",  # FSDPMemTracker's
    "Activation": "activations",
    # Gathered parameters and gradients, buffers, inputs, temporaries, communication buffers.
    "Unsharded Param": "other",
    "Unsharded Grad": "other",
    "Buffer": "other",
    "Temp": "other",
    "All Gather": "other",
    "Reduce Scatter": "other",
    "Inputs": "other",
    "Other": "other",
}
TOTAL = "Total"


def unsupported(what: str, why: str) -> ImportError:
    """The one-line error for a private API this torch does not have."""
    return ImportError(
        f"gptkit estimate needs {what} ({why}), which torch {torch.__version__} does not have: "
        "install the torch version gptkit's pyproject.toml names"
    )


def private(module: str, name: str, why: str) -> Any:
    """``module.name``, or the one-line error that says this torch lacks it."""
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError):
        raise unsupported(f"{module}.{name}", why) from None


def fake_tensor_mode() -> Any:
    """A FakeTensorMode: tensors with shapes, dtypes and devices but no storage."""
    return private("torch._subclasses.fake_tensor", "FakeTensorMode", "tensors without storage")()


def fake_store() -> Any:
    """The store of the "fake" process-group backend, whose collectives return at once."""
    return private("torch.testing._internal.distributed.fake_pg", "FakeStore", "a fake process group")()


def memory_tracker(model: nn.Module, optimizers: list[torch.optim.Optimizer], fsdp: bool) -> Any:
    """PyTorch's tracker of what one device holds, by reference type: FSDPMemTracker for an FSDP2
    model (this rank's shards, the gathered parameters), MemTracker otherwise."""
    module = "torch.distributed._tools"
    if fsdp:
        tracker_class = private(f"{module}.fsdp2_mem_tracker", "FSDPMemTracker", "FSDP2's memory")
        return tracker_class(model, optimizers[0])
    tracker = private(f"{module}.mem_tracker", "MemTracker", "a step's memory")()
    tracker.track_external(model, *optimizers)
    return tracker


class _NoHook:
    def remove(self) -> None:
        pass


def skip_gradient_hooks(tracker: Any, model: nn.Module) -> None:
    """Mark a frozen parameter's gradient as hooked already: the tracker hooks every parameter's
    gradient, which fails on one that has none (LoRA's base model)."""
    handles = getattr(tracker, "_param_to_grad_hook_handles", None)
    if handles is None:
        raise unsupported("the memory tracker's _param_to_grad_hook_handles", "frozen parameters")
    for param in model.parameters():
        if not param.requires_grad:
            handles[param] = (_NoHook(), _NoHook())


def watch_peaks(tracker: Any, on_change: Callable[[dict[str, int]], None]) -> None:
    """Call ``on_change`` with the tracker's current snapshot of this device (bytes by reference
    type) each time the tracker updates its peak, that is, on every allocation it records."""
    update = getattr(tracker, "_update_peak_stats", None)
    if update is None or not hasattr(tracker, "_curr_mem_snap"):
        raise unsupported("the memory tracker's _update_peak_stats", "the device's own peak")

    def updated(*args: Any, **kwargs: Any) -> None:
        update(*args, **kwargs)
        for snapshot in tracker._curr_mem_snap.values():
            on_change(snapshot)

    tracker._update_peak_stats = updated


def category(reftype: Any) -> str:
    """The estimate's category of a tracker's reference type; an unknown one is an error."""
    name = str(getattr(reftype, "value", reftype))
    if name not in TRACKER_CATEGORIES:
        raise unsupported(
            f"a memory tracker with the categories {sorted(TRACKER_CATEGORIES)}", f"got {name!r}"
        )
    return TRACKER_CATEGORIES[name]


# The dispatcher: which operators a device's autocast handles, and running below it.


def ops_with_kernel(dispatch_key: str) -> list[str]:
    """The names (``aten::layer_norm``, ``aten::softmax.int``) of the operators with a kernel of
    their own for ``dispatch_key`` (not the key's fallthrough)."""
    try:
        names = torch._C._dispatch_get_all_op_names()
        return [name for name in names if torch._C._dispatch_has_kernel_for_dispatch_key(name, dispatch_key)]
    except AttributeError:
        raise unsupported("torch._C._dispatch_has_kernel_for_dispatch_key", "the autocast lists") from None


def has_kernel(op_name: str, dispatch_key: str) -> bool:
    return torch._C._dispatch_has_kernel_for_dispatch_key(op_name, dispatch_key)


def without_key(dispatch_key: str) -> Any:
    """A context in which ``dispatch_key`` is skipped (as an autocast kernel calls the operator)."""
    try:
        key = getattr(torch._C.DispatchKey, dispatch_key)
        return torch._C._ExcludeDispatchKeyGuard(torch._C.DispatchKeySet(key))
    except AttributeError:
        raise unsupported(
            f"torch._C._ExcludeDispatchKeyGuard and DispatchKey.{dispatch_key}", "autocast"
        ) from None


def drop_library(library: torch.library.Library) -> None:
    """Remove the kernels ``library`` registered, restoring the ones they replaced."""
    destroy = getattr(library, "_destroy", None)
    if destroy is None:
        raise unsupported("torch.library.Library._destroy", "restoring the autocast kernels")
    destroy()
