"""What the GPU checks need from torch and from the packages around it, found out before any runs.

A lent GPU machine brings its own Python and torch: perhaps an older torch than gptkit's pins,
perhaps without the packages gptkit names as dependencies. The script looks first: a torch without
a feature every check relies on is refused in one line that names the feature; a missing package,
or a private torch module one check reads, skips that check alone, by name.
"""

from __future__ import annotations

import importlib

import torch

# (module, attribute, what for): every check, or gptkit's training code itself, needs these.
TORCH_FEATURES = (
    ("torch.distributed", "init_process_group", "process groups (a torch built with distributed)"),
    ("torch.distributed.fsdp", "fully_shard", "FSDP2 as a public API (torch 2.6)"),
    ("torch.distributed.fsdp", "CPUOffloadPolicy", "FSDP2's CPU offload (torch 2.6)"),
    ("torch.distributed.fsdp", "MixedPrecisionPolicy", "FSDP2's mixed precision (torch 2.6)"),
    ("torch.distributed.checkpoint.state_dict", "get_state_dict", "DCP's sharded state dicts"),
    ("torch.distributed.tensor", "DTensor", "DTensor as a public API (torch 2.5)"),
    ("torch.utils.checkpoint", "create_selective_checkpoint_contexts", "selective checkpointing (2.4)"),
    ("torch", "_amp_foreach_non_finite_check_and_unscale_", "fp16 loss scaling's unscale (any device)"),
)

# Private pieces one check reads: missing, that check is skipped, naming them.
CHECK_FEATURES = {
    "estimate": (
        ("torch._subclasses.fake_tensor", "FakeTensorMode", "tensors without storage"),
        ("torch.testing._internal.distributed.fake_pg", "FakeStore", "a fake process group"),
        ("torch.distributed._tools.mem_tracker", "MemTracker", "a step's memory"),
        ("torch.distributed._tools.fsdp2_mem_tracker", "FSDPMemTracker", "FSDP2's memory"),
    ),
    "sync_debug": (("torch.cuda", "set_sync_debug_mode", "counting host synchronisations"),),
}

# Packages a check needs beyond torch, numpy and tqdm (which gptkit itself imports), and why.
PACKAGES = {
    "tokenizers": "trains the checks' BPE vocabulary and writes tokenizer.json",
    "tiktoken": "encodes with a byte-level BPE vocabulary (gptkit's ByteLevelTokenizer)",
    "safetensors": "the model file a pre-training run exports",
    "transformers": "the GPT2LMHeadModel.generate row beside gptkit's decoding",
}


def _has(module: str, name: str) -> bool:
    try:
        return hasattr(importlib.import_module(module), name)
    except Exception:  # ImportError, or a module that fails as it loads on this build
        return False


def missing_features(features: tuple[tuple[str, str, str], ...]) -> list[str]:
    """Each of ``features`` this torch lacks, as ``module.name (what for)``."""
    return [f"{module}.{name} ({why})" for module, name, why in features if not _has(module, name)]


def refusal() -> str | None:
    """One line saying why this torch cannot run the checks, or None when it can."""
    missing = missing_features(TORCH_FEATURES)
    if not missing:
        return None
    return f"gpu_checks: torch {torch.__version__} lacks {'; '.join(missing)}: install torch 2.6 or later"


def missing_packages() -> dict[str, str]:
    """The packages of :data:`PACKAGES` that do not import here, each with the error it gave."""
    missing = {}
    for name in PACKAGES:
        try:
            importlib.import_module(name)
        except Exception as e:  # a broken install counts as missing, with its reason
            missing[name] = f"{type(e).__name__}: {e}"
    return missing


def skipped_for(check: str, needs: tuple[str, ...], missing: dict[str, str]) -> str | None:
    """Why ``check`` cannot run here (the packages it ``needs`` that are missing, or the private
    torch pieces it reads), or None."""
    lacking = [name for name in needs if name in missing]
    if lacking:
        return f"needs {', '.join(lacking)}, missing here ({'; '.join(missing[name] for name in lacking)})"
    pieces = missing_features(CHECK_FEATURES.get(check, ()))
    if pieces:
        return f"torch {torch.__version__} lacks {'; '.join(pieces)}"
    return None
