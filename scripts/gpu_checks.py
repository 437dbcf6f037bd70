"""Correctness checks that only a CUDA machine can make, run by ``benchmarks/gpu.sh``.

The test suite runs on CPUs, where some of CUDA's rules cannot apply: fused attention with dropout
draws its masks from the GPU's generator, fp16 needs loss scaling, NCCL refuses host tensors. The
tests make the CPU obey each rule; this script checks the real thing the first time a GPU is at
hand. It prints one JSON object: each check with ``passed`` (true, false, or null when skipped)
and what it measured. Exit status 1 when a check failed, 2 without a CUDA device.

    python scripts/gpu_checks.py [--only NAME ...] [--device cuda]

``--device cpu`` runs the same checks on the CPU (several processes over gloo), where they say
less (attention with dropout is unfused there; no device peak to compare the estimate with) but
show that the script itself works.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch

from gptkit import GPT, GPTConfig
from gptkit.hardware import bf16_native
from gptkit.train.memory.activation_checkpointing import apply_activation_checkpointing

DEVICE = "cuda"  # --device


def _device_count() -> int:
    return torch.cuda.device_count() if DEVICE == "cuda" else 2


def _gradients(model: torch.nn.Module, ids: torch.Tensor, dtype: torch.dtype, seed: int = 7) -> dict:
    torch.manual_seed(seed)  # the CUDA generator too: dropout's masks
    with torch.autocast(DEVICE, dtype=dtype, enabled=dtype != torch.float32):
        loss = model(ids, labels=ids, compute_logits=False).loss
    loss.backward()
    return {name: p.grad.detach().float().clone() for name, p in model.named_parameters()}


def _largest_difference(a: dict, b: dict) -> float:
    return max((a[name] - b[name]).abs().max().item() for name in a)


def check_selective_checkpointing_with_dropout() -> dict:
    """Gradients with dropout on, through CUDA's fused attention (flash in bf16, memory-efficient in
    fp32): selective checkpointing must give the unchecked run's, as full does. CUDA's attention
    backward sums in no fixed order, so both are compared with the unchecked run and selective may
    differ no more than full does (a mask drawn at another offset differs by the gradients' own
    size)."""
    torch.manual_seed(0)
    config = GPTConfig(vocab_size=512, context_length=256, n_layer=4, n_head=4, d_model=256, dropout=0.1)
    plain = GPT(config).to(DEVICE).train()
    ids = torch.randint(0, 512, (8, 256), device=DEVICE)
    measured = {}
    for dtype in (torch.float32, torch.bfloat16):
        if dtype == torch.bfloat16 and not bf16_native(torch.device(DEVICE)).native:
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
    )
    return {"passed": passed, "measured": measured}


REPO = Path(__file__).resolve().parents[1]
DATA = Path(os.environ.get("GPTKIT_DATA", REPO.parent / "shared" / "data"))
WORK = Path(tempfile.mkdtemp(prefix="gptkit-gpu-checks-"))


def _shards() -> Path:
    """Alice in Wonderland in GPT-2's tokens, a tenth held out (made once per run of this script)."""
    from gptkit.data.prepare import prepare

    out = WORK / "shards"
    if not out.exists():
        prepare(
            DATA / "gpt2_bpe", [DATA / "gutenberg" / "pg11.txt"], out, val_fraction=0.1, show_progress=False
        )
    return out


def _pretrain(out: Path, processes: int, *flags: str) -> list[dict]:
    """``gptkit pretrain`` of a small model on the GPUs (FSDP2 over several), its metrics records."""
    from gptkit.train.loop import read_metrics

    args = [
        *("-m", "gptkit", "pretrain", "--data", str(_shards()), "--out", str(out), "--device", DEVICE),
        *("--preset", "gpt2", "--n-layer", "4", "--d-model", "256", "--n-head", "4", "--context-length", "256"),
        *("--batch-size", "16", "--lr", "1e-3", "--eval-every", "0", "--log-every", "1"),
        *("--no-progress", *flags),
    ]  # fmt: skip
    if processes > 1:
        launch = ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={processes}"]
        args = [*launch, *args, "--fsdp"]
    done = subprocess.run([sys.executable, *args], cwd=REPO, capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        said = [line for line in done.stderr.splitlines() if "error" in line.lower()][:3]
        raise RuntimeError(
            f"gptkit pretrain exited {done.returncode}: {' / '.join(said) or done.stderr[-2000:]}"
        )
    return [r for r in read_metrics(out / "metrics.jsonl") if "loss" in r]


def check_fp16_training() -> dict:
    """200 updates in fp16 autocast with loss scaling on the GPU: the loss falls (the mean of the
    last 20 updates below the first 20's), the scale is finite and few updates are skipped."""
    records = _pretrain(WORK / "fp16", 1, "--precision", "fp16", "--max-steps", "200", "--warmup-steps", "10")
    first = sum(r["loss"] for r in records[:20]) / 20
    last = sum(r["loss"] for r in records[-20:]) / 20
    skipped = records[-1].get("skipped_updates")
    passed = last < first - 0.5 and skipped is not None and skipped < 20
    return {"passed": passed, "first_20_loss": first, "last_20_loss": last, "skipped_updates": skipped,
            "loss_scale": records[-1].get("loss_scale")}  # fmt: skip


def check_sharded_checkpoint_resume() -> dict:
    """FSDP2 on every GPU with sharded checkpoints: the run stopped after update 3 and resumed on
    half the GPUs ends as the run never stopped does, to CUDA's summation order (1e-3 on the loss)."""
    gpus = _device_count()
    if gpus < 2:
        return {"passed": None, "skipped": f"needs 2 or more GPUs, found {gpus}"}
    flags = ("--precision", "fp32", "--dropout", "0", "--max-steps", "6", "--warmup-steps", "2")
    flags = (*flags, "--checkpoint-every", "3")
    straight = _pretrain(WORK / "straight", gpus, *flags)
    stopped = WORK / "stopped"
    shutil.copytree(WORK / "straight", stopped)
    shutil.rmtree(stopped / "checkpoints" / "step-0000006")
    (stopped / "checkpoints" / "latest.json").write_text(json.dumps({"step": 3, "path": "step-0000003"}))
    resumed = _pretrain(stopped, max(gpus // 2, 1), *flags, "--resume")
    difference = max(abs(a["loss"] - b["loss"]) for a, b in zip(straight[3:], resumed[-3:], strict=True))
    return {"passed": difference < 1e-3, "saved_on": gpus, "resumed_on": max(gpus // 2, 1),
            "largest_loss_difference": difference}  # fmt: skip


def _offload_simulation(devices: int, offload: bool):
    """GPT-2 small pre-training under FSDP2 (optionally offloaded), 4 sequences of 512 a device."""
    from gptkit.train.config import TrainConfig
    from gptkit.train.memory.estimate import EstimateOptions, PretrainEstimateConfig, pretrain_simulation
    from gptkit.train.run import ModelShape

    train = TrainConfig(
        batch_size=4 * devices, precision="bf16", fsdp=True, fsdp_offload=offload, max_steps=2
    )
    options = EstimateOptions(devices=devices, target="gpu")
    shape = ModelShape(preset="gpt2", context_length=512)
    return pretrain_simulation(PretrainEstimateConfig(model=shape, training=train, estimate=options))


def offload_worker(offload: bool) -> None:
    """One torchrun process: two real FSDP2 updates of :func:`_offload_simulation`'s run; rank 0
    prints the device's peak (max_memory_allocated above what the process held before)."""
    from gptkit.train.distributed.processes import init_distributed, shutdown_distributed
    from gptkit.train.memory.simulation import build_trainer

    ctx = init_distributed(DEVICE)
    simulation = _offload_simulation(ctx.world_size, offload)
    before = torch.cuda.memory_allocated() if DEVICE == "cuda" else 0
    torch.manual_seed(ctx.rank)
    batch = simulation.make_batch(4)
    with tempfile.TemporaryDirectory() as out, torch.device(ctx.device):
        trainer = build_trainer(simulation, ctx, 4, out)
        for _ in range(2):
            trainer.compute_gradients(batch)
            trainer.apply_gradients()
    peak = torch.cuda.max_memory_allocated() - before if DEVICE == "cuda" else None
    if ctx.is_main:
        print(json.dumps({"peak_bytes": peak}), flush=True)
    shutdown_distributed()


def check_estimate_with_offload() -> dict:
    """`gptkit estimate --target gpu`'s device peak against max_memory_allocated of the same FSDP2
    update on every GPU, with and without CPU offload (the offloaded states are the host's)."""
    from gptkit.train.memory.estimate import estimate

    gpus = _device_count()
    if gpus < 2:
        return {"passed": None, "skipped": f"needs 2 or more GPUs, found {gpus}"}
    measured = {}
    for offload in (False, True):
        launch = ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={gpus}"]
        worker = [__file__, "--device", DEVICE, "--offload-worker", "on" if offload else "off"]
        done = subprocess.run([sys.executable, *launch, *worker], cwd=REPO, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"the offload worker exited {done.returncode}: {done.stderr[-1500:]}")
        peak = json.loads(done.stdout.strip().splitlines()[-1])["peak_bytes"]
        estimated = estimate(_offload_simulation(gpus, offload))
        measured["offload" if offload else "no offload"] = {
            "estimated_device_bytes": estimated.peak_bytes,
            "estimated_host_bytes": estimated.host_bytes,
            "measured_device_bytes": peak,
            "ratio": None if not peak else round(estimated.peak_bytes / peak, 3),
        }
    ratios = [m["ratio"] for m in measured.values()]
    passed = None if None in ratios else all(0.85 <= r <= 1.15 for r in ratios)
    return {"passed": passed, "devices": gpus, "measured": measured}


CHECKS: dict[str, Callable[[], dict]] = {
    "estimate_with_offload": check_estimate_with_offload,
    "selective_checkpointing_with_dropout": check_selective_checkpointing_with_dropout,
    "fp16_training": check_fp16_training,
    "sharded_checkpoint_resume": check_sharded_checkpoint_resume,
}


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--only", nargs="+", choices=sorted(CHECKS), help="Run these checks alone.")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="Where to check (cuda).")
    parser.add_argument("--offload-worker", choices=("on", "off"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    global DEVICE
    DEVICE = args.device
    if args.offload_worker:  # one of the processes check_estimate_with_offload starts
        offload_worker(args.offload_worker == "on")
        return 0
    if DEVICE == "cuda" and not torch.cuda.is_available():
        print(f"gpu_checks: no CUDA device (torch {torch.__version__})", file=sys.stderr)
        return 2
    results = {}
    for name in args.only or CHECKS:
        print(f"== {name}", file=sys.stderr, flush=True)
        try:
            results[name] = CHECKS[name]()
        except Exception as e:  # one check's failure is reported, the others still run
            results[name] = {"passed": False, "error": f"{type(e).__name__}: {e}"}
    shutil.rmtree(WORK, ignore_errors=True)
    device = torch.cuda.get_device_name(0) if DEVICE == "cuda" else "cpu"
    print(json.dumps({"gpu_checks": results, "device": device}), flush=True)
    return 1 if any(r.get("passed") is False for r in results.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
