"""Greedy decoding speed: new tokens/s for one 32-token prompt and 128 new tokens.

(a) GPT-2-small shape: gptkit (KV cache; fp32 in nn.Linear's layout and in the decoding layout that
    `gptkit generate` uses on a CPU, bf16 weights plain and in that layout, int8 weights) against
    GPT2LMHeadModel with its cache.
    Beside it, gptkit (the decoding layout, what `gptkit generate` runs on a CPU) against ONNX Runtime
    running the same weights exported by `gptkit export --past` (the past-key/value graph), decoded
    greedily step by step.
(b) GPT-1 shape: gptkit against OpenAIGPTLMHeadModel (which recomputes the sequence every step).
Random weights (speed does not depend on them); the token ids are checked equal in fp32.
bf16 weights are kept on CPUs without native bf16: decoding multiplies vectors by matrices, not the
bf16 matrix products that crawl there, and half-size weights halve the memory read per token.
A measurement running past common.TIME_LIMIT_S is reported as skipped. GPTKIT_BENCH_DEVICE=cuda (benchmarks/gpu.sh)
runs the models on a GPU; the CPU-only formats (the decoding layout, int8) are then skipped.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import torch
from common import (
    DEVICE,
    TIME_LIMIT_S,
    MeasurementTimeout,
    comparison,
    emit,
    median,
    skipped,
    synchronize,
    time_limit,
)

from gptkit import GPT, generate
from gptkit.model.layouts import decoding_layout, has_decoding_layout, quantize_int8

PROMPT, NEW, REPEATS = 32, 128, 3


def timed(fn) -> tuple[float, torch.Tensor]:
    synchronize()
    start = time.perf_counter()
    out = fn()
    synchronize()
    return time.perf_counter() - start, out


def measure(ours_fn, peer_fn) -> tuple[float, float, torch.Tensor, torch.Tensor]:
    with time_limit(TIME_LIMIT_S):
        ours_fn(), peer_fn()  # warm-up
        ours_s, peer_s = [], []
        for _ in range(REPEATS):
            seconds, ours_out = timed(ours_fn)
            ours_s.append(seconds)
            seconds, peer_out = timed(peer_fn)
            peer_s.append(seconds)
    return NEW / median(ours_s), NEW / median(peer_s), ours_out, peer_out


def compare(what: str, peer: str, ours_fn, peer_fn, same_ids: bool) -> tuple[dict, float | None]:
    """The comparison and the peer's tok/s; a skipped comparison (and None) past the time limit."""
    try:
        ours_tps, peer_tps, ours_out, peer_out = measure(ours_fn, peer_fn)
    except MeasurementTimeout as e:
        return skipped(what, "tok/s", peer, f"the measurement {e}"), None
    row = comparison(what, "tok/s", ours_tps, peer, peer_tps)
    if same_ids and DEVICE == "cpu":
        assert torch.equal(ours_out, peer_out), "greedy ids differ from transformers'"
    elif same_ids:  # GPU kernels may order sums differently and flip a near-tie: reported, not fatal
        row["same_ids"] = bool(torch.equal(ours_out, peer_out))
    return row, peer_tps


def onnxruntime_greedy(session, config, prompt: torch.Tensor) -> torch.Tensor:
    """NEW greedy tokens from the past-key/value ONNX graph: the prompt with empty pasts, then one
    token a step with the presents of the step before; returns (B, T + NEW) as generate does."""
    from gptkit.export.onnx import past_names

    names = past_names(config.n_layer)
    ids = prompt.cpu().numpy()
    empty = np.zeros((ids.shape[0], config.n_head, 0, config.head_size), np.float32)
    feeds = {"input_ids": ids, **dict.fromkeys(names, empty)}
    steps = []
    for _ in range(NEW):
        logits, *present = session.run(None, feeds)
        next_ids = logits[:, -1].argmax(-1)[:, None]
        steps.append(next_ids)
        feeds = {"input_ids": next_ids, **dict(zip(names, present))}
    return torch.from_numpy(np.concatenate([ids, *steps], axis=1))


def onnxruntime_row(model: GPT, decoder: GPT, prompt: torch.Tensor, directory: str) -> dict:
    """gptkit's fp32 greedy decoding (``decoder``: ``model`` as `gptkit generate` runs it here, in the
    decoding layout on a CPU) against ONNX Runtime's on ``model``'s export (ids checked equal)."""
    what = (
        "greedy new tok/s, GPT-2 small, fp32, gptkit decoding layout vs ONNX Runtime (gptkit export --past)"
    )
    try:
        import onnxruntime
    except ImportError:
        return skipped(what, "tok/s", "onnxruntime", "needs the export extra: pip install -e '.[export]'")
    peer = f"onnxruntime {onnxruntime.__version__} (CPUExecutionProvider), past-key/value graph"
    if DEVICE != "cpu":
        return skipped(what, "tok/s", peer, "the installed onnxruntime runs on the CPU only")
    from gptkit.export.onnx import export_onnx

    path = export_onnx(model, Path(directory) / "decoder.onnx", past=True)
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = torch.get_num_threads()  # the threads torch decodes with
    # By default ONNX Runtime's pool threads spin on after each run, which took the cores from the
    # gptkit runs alternating with them (a tiny model: 2 against 195 tok/s for gptkit): off.
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    session = onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    return compare(
        what,
        peer,
        lambda: generate(decoder, prompt, NEW, temperature=0),
        lambda: onnxruntime_greedy(session, model.config, prompt),
        True,
    )[0]


def memory_bandwidth() -> float:
    """Bytes per second this machine moves in a large copy (read + write), best of 5: the limit that
    a decoding step, which reads every weight once, runs into."""
    source = torch.ones(64 * 2**20, device=DEVICE)  # 256 MB, far past the caches
    target = torch.empty_like(source)
    target.copy_(source)
    best = min(timed(lambda: target.copy_(source))[0] for _ in range(5))
    return 2 * source.nbytes / best


def weight_bytes(model: torch.nn.Module) -> int:
    """Bytes of the weights one decoding step reads: every matrix, bias and gain once (parameters,
    int8 buffers, oneDNN-packed matrices), the token and position tables only where the tied
    output layer reads the token table whole (a lookup reads one row of each)."""
    tables = {id(model.wpe.weight)} if hasattr(model, "wpe") else set()
    if getattr(model, "lm_head", None) is not None:  # the output layer has its own copy
        tables.add(id(model.wte.weight))
    tensors = [
        t
        for t in (*model.parameters(), *(b for b in model.buffers() if b.dtype == torch.int8 or b.is_mkldnn))
        if id(t) not in tables
    ]
    # Packed (opaque) matrices have no storage to look at: their elements, at least what they hold.
    packed = sum(t.numel() * t.element_size() for t in tensors if t.is_mkldnn)
    # Tensors sharing storage are read once (the transposed fallback's embedding and output layer).
    unique = {
        t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors if not t.is_mkldnn
    }
    return packed + sum(unique.values())


def bandwidth_rows(rows: list[dict], models: list[torch.nn.Module], peer_bytes: int, bandwidth: float):
    """Each decoding comparison again as the fraction of memory bandwidth its tokens/s reach."""
    out = []
    for row, model in zip(rows, models):
        if row.get("ratio") is None:
            continue
        ours = weight_bytes(model) * row["ours"] / bandwidth
        peer = peer_bytes * row["peer_value"] / bandwidth
        what = row["what"].replace("greedy new tok/s", "memory-bandwidth fraction")
        out.append(comparison(what, "fraction of memory bandwidth", ours, row["peer"], peer))
    return out


@torch.no_grad()
def main() -> None:
    import tempfile

    import transformers

    torch.manual_seed(0)
    comparisons = []
    with tempfile.TemporaryDirectory() as tmp:
        # (a) GPT-2 small
        reference = transformers.GPT2LMHeadModel(transformers.GPT2Config()).eval().to(DEVICE)
        reference.save_pretrained(tmp)
        ours = GPT.from_pretrained(tmp, device=DEVICE)
        prompt = torch.randint(0, 50257, (1, PROMPT)).to(DEVICE)
        mask = torch.ones_like(prompt)

        def peer():
            return reference.generate(
                prompt,
                attention_mask=mask,
                max_new_tokens=NEW,
                min_new_tokens=NEW,
                do_sample=False,
                pad_token_id=50256,
            )

        name = "GPT2LMHeadModel (KV cache), fp32"
        row, _ = compare(
            "greedy new tok/s, GPT-2 small, fp32",
            name,
            lambda: generate(ours, prompt, NEW, temperature=0),
            peer,
            True,
        )
        comparisons.append(row)

        def optional(what: str, unavailable: str | None, build, same_ids: bool):
            """The row of a format this device may lack (skipped, with the reason) and its model."""
            if unavailable:
                return skipped(what, "tok/s", name, unavailable), None
            model = build()
            return compare(what, name, lambda: generate(model, prompt, NEW, temperature=0), peer, same_ids)[
                0
            ], model

        on_cpu = None if DEVICE == "cpu" else "a CPU format: gptkit uses it on CPUs only"
        # What `gptkit generate` and load_for_generation run in fp32 on a CPU: the same values, in
        # the layouts the CPU streams fastest (gptkit.model.layouts.decoding_layout).
        row, ours_layout = optional(
            "greedy new tok/s, GPT-2 small, fp32, gptkit decoding layout (oneDNN-packed)",
            on_cpu,
            lambda: decoding_layout(GPT.from_pretrained(tmp)),
            True,
        )
        comparisons.append(row)
        ours_bf16 = GPT.from_pretrained(tmp, dtype=torch.bfloat16, device=DEVICE)
        row, _ = compare(
            "greedy new tok/s, GPT-2 small, gptkit bf16 weights",
            name,
            lambda: generate(ours_bf16, prompt, NEW, temperature=0),
            peer,
            False,
        )
        comparisons.append(row)
        # What `gptkit generate --dtype bfloat16` runs where a CPU multiplies bf16 natively.
        row, ours_bf16_layout = optional(
            "greedy new tok/s, GPT-2 small, gptkit bf16 weights, decoding layout (oneDNN-packed)",
            None
            if has_decoding_layout(torch.bfloat16, torch.device(DEVICE))
            else "needs a CPU with native bf16 and PyTorch's oneDNN ops",
            lambda: decoding_layout(GPT.from_pretrained(tmp, dtype=torch.bfloat16)),
            False,
        )
        comparisons.append(row)
        # int8 off the CPU: Int8Linear dequantizes the whole matrix, no fused kernel to measure.
        row, ours_int8 = optional(
            "greedy new tok/s, GPT-2 small, gptkit int8 weights (bf16 activations)",
            on_cpu,
            lambda: quantize_int8(GPT.from_pretrained(tmp)),
            False,
        )
        comparisons.append(row)
        bandwidth = memory_bandwidth()
        peer_bytes = sum(  # the tied output layer once, the position table not (one row a step)
            p.numel() * p.element_size() for name, p in reference.named_parameters() if "wpe" not in name
        )
        comparisons += bandwidth_rows(
            comparisons[-5:],
            [ours, ours_layout, ours_bf16, ours_bf16_layout, ours_int8],
            peer_bytes,
            bandwidth,
        )
        comparisons.append(
            onnxruntime_row(ours, ours_layout if ours_layout is not None else ours, prompt, tmp)
        )
        del reference, ours, ours_bf16

    with tempfile.TemporaryDirectory() as tmp:
        # (b) GPT-1
        reference = transformers.OpenAIGPTLMHeadModel(transformers.OpenAIGPTConfig()).eval().to(DEVICE)
        reference.save_pretrained(tmp)
        ours = GPT.from_pretrained(tmp, device=DEVICE)
        prompt = torch.randint(0, 40478, (1, PROMPT)).to(DEVICE)

        def peer():
            return reference.generate(
                prompt, max_new_tokens=NEW, min_new_tokens=NEW, do_sample=False, pad_token_id=0
            )

        name = "OpenAIGPTLMHeadModel (no cache), fp32"
        row, peer_tps = compare(
            "greedy new tok/s, GPT-1, fp32",
            name,
            lambda: generate(ours, prompt, NEW, temperature=0),
            peer,
            True,
        )
        comparisons.append(row)
        ours_bf16 = GPT.from_pretrained(tmp, dtype=torch.bfloat16, device=DEVICE)
        what = "greedy new tok/s, GPT-1, gptkit bf16 weights"
        if peer_tps is None:
            comparisons.append(skipped(what, "tok/s", name, "the fp32 peer's measurement was skipped"))
        else:  # against the fp32 peer measured above, which is slow to run again
            try:
                bf16_tps, _, _, _ = measure(
                    lambda: generate(ours_bf16, prompt, NEW, temperature=0), lambda: None
                )
                comparisons.append(comparison(what, "tok/s", bf16_tps, name, peer_tps))
            except MeasurementTimeout as e:
                comparisons.append(skipped(what, "tok/s", name, f"the measurement {e}"))
    emit(
        "generate_throughput",
        comparisons,
        device=DEVICE,
        prompt_tokens=PROMPT,
        new_tokens=NEW,
        memory_bandwidth_gb_s=round(bandwidth / 1e9, 1),
    )


if __name__ == "__main__":
    main()
