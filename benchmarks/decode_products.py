"""The products of one decoding step, kernel by kernel: GPT-2 small's 49 matrices (48 in the blocks,
the 50257×768 output layer) times one row, each kernel a user could pick for them, side by side.

gptkit's native products (gptkit.native: fp32, bf16 widened as read, int8 with 7-bit activations)
against, at the same precision:
- fp32: PyTorch's ``F.linear`` (nn.Linear's layout, MKL), oneDNN on prepacked weights (gptkit's
  PyTorch decoding layout), numpy's ``matmul`` (its OpenBLAS ``sgemv``), cython-blis's ``gemv``
  (installed with spaCy);
- bf16: PyTorch's ``F.linear``, oneDNN on prepacked weights where bf16 is native;
- int8: FBGEMM's dynamically quantized product on its prepacked matrix, PyTorch's weight-only
  ``_weight_int8pack_mm``.
Each kernel is called matrix by matrix from Python (the same few microseconds a call for all), the
kernels alternating, medians of REPEATS with each side's spread (least, most; ``on_par`` where the
two overlap): the milliseconds of the 49 products, and (the record's ``bandwidth_fraction``) the
fraction of the machine's read bandwidth each kernel reaches (the matrices' bytes ÷ time ÷ a large
streaming read's bandwidth, measured in the same run: a product only reads its matrix, so the
fraction stays at or below 1, where a copy's, whose writes cost more, let it pass 1). A kernel
this machine lacks gives a skipped row that says so.
On a CPU without AVX-512 the record is kept as decode_products_avx2_cpu.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F
from common import comparison, emit, median, skipped

from gptkit import native
from gptkit.hardware import fbgemm_pack, onednn_linear, onednn_pack, packs_for_onednn
from gptkit.model.layouts import Int8Linear

D, VOCAB, LAYERS = 768, 50257, 12
REPEATS = 7
IDLE_S = 0.3  # a pause before each timed kernel


def shapes() -> list[tuple[int, int]]:
    """(out, in) of GPT-2 small's matrices in the order a step multiplies them."""
    block = [(3 * D, D), (D, D), (4 * D, D), (D, 4 * D)]
    return block * LAYERS + [(VOCAB, D)]


def read_bandwidth() -> float:
    """Bytes per second of a large streaming read (a sum over 256 MB), best of 5."""
    source = torch.ones(64 * 2**20)
    source.sum()
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        source.sum()
        best = min(best, time.perf_counter() - start)
    return source.nbytes / best


# name → (one step's products, the bytes they read), or why the kernel is missing here
Kernels = dict[str, tuple[Callable[[], list], int] | str]


def products(weights: list[torch.Tensor], call: Callable) -> Callable[[], list]:
    """One step's products: ``call(i, w)`` for each matrix, in the order a step multiplies them."""
    return lambda: [call(i, w) for i, w in enumerate(weights)]


def kernels(weights: list[torch.Tensor]) -> Kernels:
    """Every kernel of the record, by precision, gptkit's first in each (the order of its comparisons);
    the rows they multiply are drawn once and shared, so every kernel computes the same products."""
    rows = {D: torch.randn(1, D), 4 * D: torch.randn(1, 4 * D)}
    fp32_bytes = sum(w.numel() * 4 for w in weights)
    missing_native = None if native.available() else "the native kernels could not be built here"
    return {
        **fp32_kernels(weights, rows, fp32_bytes, missing_native),
        **bf16_kernels(weights, rows, fp32_bytes // 2, missing_native),
        **int8_kernels(weights, rows, fp32_bytes // 4, missing_native),
    }


def fp32_kernels(weights: list[torch.Tensor], rows: dict, nbytes: int, missing_native: str | None) -> Kernels:
    """fp32: gptkit's native product, PyTorch's F.linear, oneDNN prepacked, numpy's and cython-blis's gemv."""
    found: Kernels = {}
    matrices = [native.matrix(w) for w in weights]
    found["gptkit native, fp32"] = missing_native or (
        products(weights, lambda i, w: native.product(matrices[i], torch.float32, rows[w.size(1)])),
        nbytes,
    )
    found["PyTorch F.linear, fp32"] = (products(weights, lambda i, w: F.linear(rows[w.size(1)], w)), nbytes)
    if packs_for_onednn(torch.float32, torch.device("cpu")):
        packed = [onednn_pack(w) for w in weights]
        found["oneDNN prepacked, fp32"] = (
            products(weights, lambda i, w: onednn_linear(rows[w.size(1)], packed[i], None)),
            nbytes,
        )
    else:
        found["oneDNN prepacked, fp32"] = "PyTorch's oneDNN linear ops are missing here"
    arrays = [w.numpy() for w in weights]
    vectors = {n: r[0].numpy() for n, r in rows.items()}
    found["numpy matmul (OpenBLAS sgemv), fp32"] = (
        products(weights, lambda i, w: np.matmul(arrays[i], vectors[w.size(1)])),
        nbytes,
    )
    try:
        import blis.py

        found["cython-blis gemv, fp32"] = (
            products(weights, lambda i, w: blis.py.gemv(arrays[i], vectors[w.size(1)])),
            nbytes,
        )
    except ImportError:
        found["cython-blis gemv, fp32"] = "cython-blis is not installed"
    return found


def bf16_kernels(weights: list[torch.Tensor], rows: dict, nbytes: int, missing_native: str | None) -> Kernels:
    """bf16 weights: gptkit's native product (widened as read), PyTorch's F.linear, oneDNN prepacked."""
    found: Kernels = {}
    halves = [w.bfloat16() for w in weights]
    half_rows = {n: r.bfloat16() for n, r in rows.items()}
    half_matrices = [native.matrix(h) for h in halves]
    found["gptkit native, bf16"] = missing_native or (
        products(weights, lambda i, w: native.product(half_matrices[i], torch.bfloat16, rows[w.size(1)])),
        nbytes,
    )
    found["PyTorch F.linear, bf16"] = (
        products(weights, lambda i, w: F.linear(half_rows[w.size(1)], halves[i])),
        nbytes,
    )
    if packs_for_onednn(torch.bfloat16, torch.device("cpu")):
        half_packed = [onednn_pack(h) for h in halves]
        found["oneDNN prepacked, bf16"] = (
            products(weights, lambda i, w: onednn_linear(half_rows[w.size(1)], half_packed[i], None)),
            nbytes,
        )
    else:
        found["oneDNN prepacked, bf16"] = "bf16 is not native on this CPU (or oneDNN's ops are missing)"
    return found


def int8_kernels(weights: list[torch.Tensor], rows: dict, nbytes: int, missing_native: str | None) -> Kernels:
    """int8 weights: gptkit's native product, FBGEMM's dynamic quantization, PyTorch's weight-only product."""
    found: Kernels = {}
    quantized = [] if missing_native else [Int8Linear(w) for w in weights]
    found["gptkit native, int8"] = missing_native or (
        products(weights, lambda i, w: quantized[i](rows[w.size(1)])),
        nbytes,
    )
    # Symmetric per-row int8 (scale: the row's largest |w| over 127), the weights both peers read.
    integers = [torch.round(w / (w.abs().amax(1, keepdim=True) / 127)).to(torch.int8) for w in weights]
    scales = [w.abs().amax(1) / 127 for w in weights]
    fbgemm = [fbgemm_pack(q, s, None) for q, s in zip(integers, scales)]
    if all(p is not None for p in fbgemm):
        found["FBGEMM dynamic int8"] = (
            products(
                weights, lambda i, w: torch.ops.quantized.linear_dynamic(rows[w.size(1)], fbgemm[i], True)
            ),
            nbytes,
        )
    else:
        found["FBGEMM dynamic int8"] = "FBGEMM is missing here"
    found["PyTorch _weight_int8pack_mm, int8"] = (
        products(
            weights, lambda i, w: torch.ops.aten._weight_int8pack_mm(rows[w.size(1)], integers[i], scales[i])
        ),
        nbytes,
    )
    return found


@torch.no_grad()
def main() -> None:
    torch.manual_seed(0)
    weights = [torch.randn(out, inner) * 0.02 for out, inner in shapes()]
    found = kernels(weights)
    runnable = {name: k for name, k in found.items() if not isinstance(k, str)}
    for run, _ in runnable.values():
        run()  # warm-up: packing caches, threads, pages
    times: dict[str, list[float]] = {name: [] for name in runnable}
    for _ in range(REPEATS):  # every kernel once a round: the machine's drift touches all alike
        for name, (run, _) in runnable.items():
            # OpenBLAS's threads spin for a while after each call, taking the cores from whatever
            # runs next (gptkit's bf16 products after numpy's: 4× slower): they go idle first.
            time.sleep(IDLE_S)
            start = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - start)
    bandwidth = read_bandwidth()
    comparisons = []
    for precision in ("fp32", "bf16", "int8"):
        ours_name = f"gptkit native, {precision}"
        peers = [name for name in found if precision in name and name != ours_name]
        for peer in peers:
            what = f"ms for GPT-2 small's 49 products, one row, {precision}: gptkit native"
            if isinstance(found[peer], str) or isinstance(found[ours_name], str):
                reason = found[peer] if isinstance(found[peer], str) else found[ours_name]
                comparisons.append(skipped(what, "ms", peer, reason))
                continue
            ours_ms, peer_ms = [1e3 * t for t in times[ours_name]], [1e3 * t for t in times[peer]]
            row = comparison(what, "ms", median(ours_ms), peer, median(peer_ms), higher_is_better=False)
            row |= {
                "rounds": len(ours_ms),
                "ours_spread": [round(min(ours_ms), 4), round(max(ours_ms), 4)],
                "peer_spread": [round(min(peer_ms), 4), round(max(peer_ms), 4)],
                "on_par": not (min(ours_ms) > max(peer_ms) or min(peer_ms) > max(ours_ms)),
            }
            comparisons.append(row)
    # The fraction of a streaming read's bandwidth each kernel's products reach.
    fractions = {
        name: round(nbytes / median(times[name]) / bandwidth, 3) for name, (_, nbytes) in runnable.items()
    }
    cpu_avx2_only = torch.backends.cpu.get_cpu_capability() == "AVX2"
    emit(
        "decode_products_avx2_cpu" if cpu_avx2_only else "decode_products",
        comparisons,
        repeats=REPEATS,
        memory_bandwidth_gb_s=round(bandwidth / 1e9, 1),
        bandwidth_kind="streaming read's",
        bandwidth_fraction=fractions,
        threads=torch.get_num_threads(),
    )


if __name__ == "__main__":
    main()
