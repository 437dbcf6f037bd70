"""Training throughput and peak memory: gptkit's GPT against transformers' OpenAIGPTLMHeadModel.

Shape: 6 layers, d 384, 6 heads, context 256, vocabulary 40478, batch 8, dropout 0; one step is
forward + backward + AdamW. fp32 and bf16 autocast. Each measurement runs in a fresh process (so
peak RSS is its own), the two libraries alternate, ROUNDS rounds, medians with each side's least and
most. MFU is against a 2048³ matmul measured in the same run. Both sides get the same threads and
the same allocator: glibc kept from returning freed memory (gptkit.train.memory.allocator, what gptkit's
Trainer sets on a CPU; `--plain-malloc` runs a worker with glibc's defaults); gptkit uses its fused
output-layer loss (no logits returned), as its Trainer does. Each side is also run under
torch.compile (fp32, the same allocator; the steps timed after COMPILE_WARMUP warm-up steps, the
compilation among them).

bf16 is skipped (ratio null, with the reason) on a CPU that does not multiply it natively, where it
runs 30-65x slower than fp32; a measurement running past common.TIME_LIMIT_S is killed and its
precision reported as skipped too.
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import time

from common import (
    DEVICE,
    TIME_LIMIT_S,
    MeasurementTimeout,
    emit,
    median,
    skipped,
    spread_comparison,
    synchronize,
)

SHAPE = dict(n_layer=6, d_model=384, n_head=6, context=256, vocab=40478, batch=8)
WARMUP, STEPS, ROUNDS = 1, 3, 5
COMPILE_WARMUP = 2  # the first compiles (forward and backward), the second runs compiled
PEER = "transformers OpenAIGPTLMHeadModel"
# The configurations each side runs in: (label in the row, worker flags).
SETTINGS = {
    "tuned": ("", []),
    "compiled": (", torch.compile", ["--compile"]),
}


def flops_per_token(shape: dict) -> float:
    """6·N for the matrices (tied output layer included) plus the attention scores (PaLM, App. B)."""
    d, L, T = shape["d_model"], shape["n_layer"], shape["context"]
    n_matmul = L * 12 * d * d + shape["vocab"] * d
    return 6 * n_matmul + 12 * L * d * T


def model_and_optimizer(library: str, tuned_malloc: bool) -> tuple:
    """SHAPE's model, on DEVICE in training mode, and its AdamW, each as the library's users build them."""
    import torch

    from gptkit.train.memory.allocator import keep_freed_memory

    if tuned_malloc and DEVICE == "cpu":
        keep_freed_memory()  # as gptkit's Trainer does on CPU; for both sides alike

    s = SHAPE
    if library == "gptkit":
        from gptkit import GPT, GPTConfig
        from gptkit.train.optim import build_optimizer

        model = GPT(
            GPTConfig(
                vocab_size=s["vocab"],
                context_length=s["context"],
                n_layer=s["n_layer"],
                n_head=s["n_head"],
                d_model=s["d_model"],
                dropout=0.0,
            )
        )
    else:
        from transformers import OpenAIGPTConfig, OpenAIGPTLMHeadModel

        model = OpenAIGPTLMHeadModel(
            OpenAIGPTConfig(
                vocab_size=s["vocab"],
                n_positions=s["context"],
                n_embd=s["d_model"],
                n_layer=s["n_layer"],
                n_head=s["n_head"],
                resid_pdrop=0.0,
                embd_pdrop=0.0,
                attn_pdrop=0.0,
            )
        )
    model.to(DEVICE).train()
    if library == "gptkit":
        optimizer = build_optimizer(model, 1e-4, 0.01)  # after the move: its state lives on the device
    else:
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01)
    return model, optimizer


def worker(library: str, precision: str, tuned_malloc: bool = True, compiled: bool = False) -> None:
    """One measurement, in its own process: tok/s of STEPS training steps after the warm-up, and peak
    memory."""
    import contextlib

    import torch

    torch.manual_seed(0)
    s = SHAPE
    model, optimizer = model_and_optimizer(library, tuned_malloc)
    if compiled:
        model = torch.compile(model)
    ids = torch.randint(0, s["vocab"], (s["batch"], s["context"])).to(DEVICE)
    device_type = torch.device(DEVICE).type
    autocast = (
        torch.autocast(device_type, dtype=torch.bfloat16) if precision == "bf16" else contextlib.nullcontext()
    )

    # gptkit's training loop asks for the loss only (no logits returned): the chunked loss path.
    kwargs = {"compute_logits": False} if library == "gptkit" else {}

    def step():
        with autocast:
            loss = model(input_ids=ids, labels=ids, **kwargs).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    for _ in range(COMPILE_WARMUP if compiled else WARMUP):
        step()
    synchronize()
    start = time.perf_counter()
    for _ in range(STEPS):
        step()
    synchronize()
    seconds = time.perf_counter() - start
    if device_type == "cuda":  # the memory that matters is the GPU's
        peak_mb = torch.cuda.max_memory_allocated() / 2**20
    else:
        peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"tokens_per_s": STEPS * s["batch"] * s["context"] / seconds, "peak_rss_mb": peak_mb}))


def matmul_peak(precision: str) -> None:
    import torch

    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    n = 8192 if DEVICE.startswith("cuda") else 2048  # a GPU needs a larger product to reach its peak
    a, b = torch.randn(n, n, dtype=dtype, device=DEVICE), torch.randn(n, n, dtype=dtype, device=DEVICE)
    for _ in range(2):
        a @ b
    times = []
    for _ in range(5):
        synchronize()
        start = time.perf_counter()
        a @ b
        synchronize()
        times.append(time.perf_counter() - start)
    print(json.dumps({"flops_per_s": 2 * n**3 / median(times)}))


def run(*worker_args: str) -> dict:
    """One measurement in a fresh process; MeasurementTimeout if it runs past TIME_LIMIT_S."""
    args = [sys.executable, __file__, "--worker", *worker_args]
    try:
        out = subprocess.run(args, capture_output=True, text=True, check=True, timeout=TIME_LIMIT_S)
    except subprocess.TimeoutExpired as e:
        raise MeasurementTimeout(
            f"a measurement ({' '.join(worker_args)}) ran past its {TIME_LIMIT_S:.0f} s limit"
        ) from e
    return json.loads(out.stdout.strip().splitlines()[-1])


def labels(precision: str) -> list[tuple[str, str, str]]:
    """(setting, what, unit) of each comparison for one precision, measured or skipped."""
    shape = f"6L/384, ctx 256, batch 8, {precision}" + ("" if DEVICE == "cpu" else f", {DEVICE}")
    memory = "RSS" if DEVICE == "cpu" else "GPU memory allocated"
    out = []
    for setting in settings(precision):
        suffix = SETTINGS[setting][0]
        out += [
            (setting, f"train tok/s, {shape}{suffix}", "tok/s"),
            (setting, f"train peak {memory}, {shape}{suffix}", "MB"),
            (setting, f"MFU, {shape}{suffix}", "fraction of matmul peak"),
        ]
    return out


def settings(precision: str) -> list[str]:
    """The configurations measured: eager, and torch.compile's trial in fp32."""
    return ["tuned"] + (["compiled"] if precision == "fp32" else [])


def measure(precision: str) -> tuple[list[dict], float]:
    """The comparisons for one precision, and the matmul peak (FLOP/s) that MFU is against."""
    runs: dict[tuple[str, str], list[dict]] = {}
    for _ in range(ROUNDS):  # alternate, so drift in the machine hits all alike
        for setting in settings(precision):
            for library in ("gptkit", "transformers"):
                result = run(library, precision, *SETTINGS[setting][1])
                runs.setdefault((setting, library), []).append(result)
    peak = run("--matmul", precision)["flops_per_s"]
    per_token = flops_per_token(SHAPE)
    rows = []
    for setting, what, unit in labels(precision):
        ours, theirs = runs[(setting, "gptkit")], runs[(setting, "transformers")]
        key = "peak_rss_mb" if unit == "MB" else "tokens_per_s"
        scale = per_token / peak if unit.startswith("fraction") else 1.0
        rows.append(
            spread_comparison(
                what,
                unit,
                [r[key] * scale for r in ours],
                PEER,
                [r[key] * scale for r in theirs],
                higher_is_better=unit != "MB",
            )
        )
    return rows, peak


def not_native(precision: str) -> str | None:
    """Why this CPU cannot run ``precision`` natively, or None where it can."""
    import torch

    from gptkit.hardware import bf16_native

    native = bf16_native(torch.device(DEVICE))
    if precision == "bf16" and not native.native:
        return f"no native bf16: {native.reason}"
    return None


def main() -> None:
    comparisons, extra = [], {}
    for precision in ("fp32", "bf16"):
        reason = not_native(precision)
        if reason is None:
            try:
                rows, peak = measure(precision)
            except MeasurementTimeout as e:
                reason = str(e)
        if reason is None:
            comparisons += rows
            extra[f"matmul_peak_gflops_{precision}"] = round(peak / 1e9, 1)
        else:
            comparisons += [skipped(what, unit, PEER, reason) for _, what, unit in labels(precision)]
            extra[f"matmul_peak_gflops_{precision}"] = None
    emit(
        "train_throughput", comparisons, device=DEVICE, rounds=ROUNDS, compile_warmup=COMPILE_WARMUP, **extra
    )


if __name__ == "__main__":
    if len(sys.argv) >= 4 and sys.argv[1:3] == ["--worker", "--matmul"]:
        matmul_peak(sys.argv[3])
    elif len(sys.argv) >= 4 and sys.argv[1] == "--worker":
        worker(
            sys.argv[2],
            sys.argv[3],
            tuned_malloc="--plain-malloc" not in sys.argv,
            compiled="--compile" in sys.argv,
        )
    else:
        main()
