"""`gptkit estimate` against measurement: the estimated peak of a training update beside the peak
measured when the same update runs on real tensors on this CPU.

Grid: GPT-2 small and medium shapes × {pretrain, fine-tune every weight, LoRA rank 8} × {no
activation checkpointing, full}; fp32, AdamW, one device. The estimate is `gptkit estimate ...
--target cpu` (this CPU's attention paths). The measurement runs in a fresh process: the same model
and Trainer step (gptkit.train.memory.simulation.build_trainer) on real tensors, two updates; its peak is
taken above what the process held before the model was built, so it counts the parameters as the
estimate does. Two peaks are measured: of the bytes malloc has handed out and not had back
(glibc's mallinfo2, sampled every 2 ms: every allocation, torch's or not), the one compared; and of the resident set (VmHWM), recorded beside it, which also holds the freed memory
the allocator keeps for reuse (a CPU's fragmentation, as a GPU's caching allocator has its own).
The comparisons' ``ratio`` is estimated / measured (1.0 is exact; the target is within 0.85-1.15).
Parameters, gradients and optimizer state, estimated and measured, are checked against the hand
arithmetic (4 bytes per weight held or trained, 8 per trained weight for AdamW's two moments).

On a GPU (GPTKIT_BENCH_DEVICE=cuda, as benchmarks/gpu.sh runs it) the update runs there, the
measured peak is torch.cuda.max_memory_allocated, and the estimate is `--target gpu`'s; each row
runs in fp32 and in bf16, where the estimate applies CUDA autocast's precision per operation.

  python benchmarks/memory_estimate.py [--quick]   (--quick: GPT-2 small only)
"""

from __future__ import annotations

import ctypes
import ctypes.util
import itertools
import json
import subprocess
import sys
import threading
import time
from pathlib import Path

from common import DEVICE, emit, synchronize

MB = 2**20
SHAPES = {"gpt2 small": dict(init="gpt2"), "gpt2 medium": dict(init="gpt2-medium")}
STAGES = ("pretrain", "finetune", "lora")
BATCH, LENGTH = 8, 256
UPDATES = 2  # the first allocates the optimizer's moments; the second is the steady state


def simulation(shape: str, stage: str, checkpointing: str, batch: int = BATCH, precision: str = "fp32"):
    """The run to estimate and measure, as gptkit.train.memory.estimate describes it."""
    from gptkit.train.config import TrainConfig
    from gptkit.train.finetune.tasks import FinetuneConfig, LoRAConfig
    from gptkit.train.memory.estimate import (
        EstimateOptions,
        FinetuneEstimateConfig,
        PretrainEstimateConfig,
        finetune_simulation,
        pretrain_simulation,
    )
    from gptkit.train.run import ModelShape

    train = TrainConfig(
        batch_size=batch, precision=precision, activation_checkpointing=checkpointing, max_steps=UPDATES
    )
    options = EstimateOptions(target="gpu" if DEVICE.startswith("cuda") else "cpu")
    model = ModelShape(**SHAPES[shape], context_length=LENGTH)
    if stage == "pretrain":
        return pretrain_simulation(PretrainEstimateConfig(model=model, training=train, estimate=options))
    lora = LoRAConfig(rank=8) if stage == "lora" else LoRAConfig()
    finetune = FinetuneConfig(model=model, lora=lora, max_length=LENGTH, training=train)
    return finetune_simulation(FinetuneEstimateConfig(finetune=finetune, estimate=options))


def _status(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"/proc/self/status has no {field}")


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
            "keepcost",
        )
    ]  # fmt: skip


class HeapInUse(threading.Thread):
    """The peak of the bytes malloc has handed out and not had back (glibc's mallinfo2: heap chunks
    in use plus mmapped ones), sampled every few milliseconds: every allocation, torch's or not,
    but not the freed memory the allocator keeps (which the resident set counts)."""

    def __init__(self, interval_s: float = 0.002):
        super().__init__(daemon=True)
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        self._mallinfo2 = libc.mallinfo2
        self._mallinfo2.restype = _MallInfo2
        self.interval_s, self.peak, self._done = interval_s, 0, threading.Event()

    def in_use(self) -> int:
        info = self._mallinfo2()
        return info.uordblks + info.hblkhd

    def run(self) -> None:
        while not self._done.is_set():
            self.peak = max(self.peak, self.in_use())
            time.sleep(self.interval_s)

    def stop(self) -> int:
        self._done.set()
        self.join()
        return max(self.peak, self.in_use())


def measure(shape: str, stage: str, checkpointing: str, batch: int = BATCH, precision: str = "fp32") -> dict:
    """In this process (a fresh one): the update on real tensors. Its peak twice: of the resident
    set, and of malloc's bytes in use (:class:`HeapInUse`), each above what the process held before
    the model was built; and the median wall and CPU time of the updates after the first."""
    import tempfile

    import torch

    from gptkit.train.distributed.processes import DistributedContext
    from gptkit.train.memory.simulation import build_trainer, held_states

    sim = simulation(shape, stage, checkpointing, batch, precision)
    torch.manual_seed(0)
    batch_tensors = sim.make_batch(batch)
    device = torch.device(DEVICE)
    # The peak resident set from here on (Linux: writing 5 to clear_refs resets VmHWM to VmRSS).
    Path("/proc/self/clear_refs").write_text("5")
    start = _status("VmRSS")
    heap = HeapInUse()
    heap_start = heap.in_use()
    heap.start()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
        device_start = torch.cuda.memory_allocated()
    walls, cpus = [], []
    with tempfile.TemporaryDirectory() as out_dir, torch.device(device):
        trainer = build_trainer(sim, DistributedContext(device=device), batch, out_dir)
        for update in range(UPDATES):
            synchronize()
            wall, cpu = time.perf_counter(), time.process_time()
            trainer.compute_gradients(batch_tensors)
            if update == UPDATES - 1:
                states = held_states(trainer)
            trainer.apply_gradients()
            synchronize()
            if update:
                walls.append(time.perf_counter() - wall)
                cpus.append(time.process_time() - cpu)
    heap_peak = heap.stop() - heap_start
    if device.type == "cuda":  # the GPU's allocator's own count of the tensors' bytes
        heap_peak = torch.cuda.max_memory_allocated() - device_start
    return {
        "peak_bytes": heap_peak,
        "peak_rss_bytes": _status("VmHWM") - start,
        "states": states,
        "wall_s_per_update": round(sorted(walls)[len(walls) // 2], 2),
        "cpu_s_per_update": round(sorted(cpus)[len(cpus) // 2], 2),
    }


def measured_in_fresh_process(
    shape: str, stage: str, checkpointing: str, batch: int = BATCH, precision: str = "fp32"
) -> dict:
    out = subprocess.run(
        [sys.executable, __file__, "--worker", shape, stage, checkpointing, str(batch), precision],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def hand_arithmetic(shape: str, stage: str) -> dict[str, int]:
    """Bytes of parameters, gradients and AdamW's moments in fp32, counted from the shape."""
    from gptkit.config import GPTConfig
    from gptkit.train.memory.estimate import PUBLISHED

    c = GPTConfig.from_preset(PUBLISHED[SHAPES[shape]["init"]])
    d, layers = c.d_model, c.n_layer
    vocab = c.total_vocab_size + (0 if stage == "pretrain" else 3)  # the special tokens' rows
    block = 12 * d * d + 13 * d  # c_attn 3d² + 3d, c_proj d² + d, c_fc 4d² + 4d, proj 4d² + d, 2 LN 4d
    gpt = vocab * d + c.context_length * d + layers * block + 2 * d  # + the final LayerNorm
    head = 0 if stage == "pretrain" else 2 * d + 2  # W_y for two classes
    total = gpt + head
    if stage == "lora":
        rank = 8
        # c_attn (d → 3d), attn c_proj (d → d), c_fc (d → 4d), mlp c_proj (4d → d): A is r × in, B out × r.
        adapters = layers * rank * ((d + 3 * d) + (d + d) + (d + 4 * d) + (4 * d + d))
        total += adapters
        trained = adapters + head + 3 * d  # and the special tokens' three new rows
    else:
        trained = total
    return {"parameters": 4 * total, "gradients": 4 * trained, "optimizer_state": 8 * trained}


def main(quick: bool) -> None:
    from gptkit.train.memory.estimate import estimate

    shapes = ["gpt2 small"] if quick else list(SHAPES)
    comparisons, rows = [], []
    # On a GPU also bf16, where the estimate applies CUDA autocast's precision per operation.
    precisions = ("fp32", "bf16") if DEVICE.startswith("cuda") else ("fp32",)
    for shape, stage, checkpointing, precision in itertools.product(
        shapes, STAGES, ("none", "full"), precisions
    ):
        estimated = estimate(simulation(shape, stage, checkpointing, precision=precision))
        measured = measured_in_fresh_process(shape, stage, checkpointing, precision=precision)
        hand = hand_arithmetic(shape, stage)
        row = {
            "shape": shape,
            "stage": stage,
            "activation_checkpointing": checkpointing,
            "precision": precision,
            "estimated_peak_mb": round(estimated.peak_bytes / MB),
            "measured_peak_mb": round(measured["peak_bytes"] / MB),
            "measured_peak_rss_mb": round(measured["peak_rss_bytes"] / MB),
            "wall_s_per_update": measured["wall_s_per_update"],
            "cpu_s_per_update": measured["cpu_s_per_update"],
            "estimated_states": estimated.states,
            "measured_states": measured["states"],
            "hand_arithmetic": hand,
            "states_equal_hand_arithmetic": estimated.states == measured["states"] == hand,
            "by_category_mb": {k: round(v / MB) for k, v in estimated.by_category.items()},
        }
        rows.append(row)
        print(json.dumps(row), file=sys.stderr, flush=True)
        comparisons.append(
            {
                "what": f"estimated peak, {shape}, {stage}, checkpointing {checkpointing}, "
                f"batch {BATCH} × {LENGTH}, {precision}",
                "unit": "MB",
                "ours": row["estimated_peak_mb"],
                "peer": "measured peak of the same update: "
                + (
                    "torch.cuda.max_memory_allocated"
                    if DEVICE.startswith("cuda")
                    else "malloc's bytes in use"
                ),
                "peer_value": row["measured_peak_mb"],
                "ratio": round(estimated.peak_bytes / measured["peak_bytes"], 3),
            }
        )
    emit("memory_estimate", comparisons, rows=rows, batch=BATCH, length=LENGTH)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--worker"]:
        shape, stage, checkpointing, batch, precision = sys.argv[2:7]
        print(json.dumps(measure(shape, stage, checkpointing, int(batch), precision)))
    else:
        main(quick="--quick" in sys.argv)
