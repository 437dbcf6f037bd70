"""Greedy decoding speed: new tokens/s for one 32-token prompt and 128 new tokens; time to first token
of a 512-token prompt; peak memory.

(a) GPT-2-small shape: gptkit (KV cache; fp32 in nn.Linear's layout and in the decoding layout that
    `gptkit generate` uses on a CPU, bf16 weights plain and in that layout, int8 weights) against
    GPT2LMHeadModel with its cache.
    gptkit's native step (gptkit.native: every block of a step in one call, fp32 and int8) against
    gptkit's PyTorch layouts (oneDNN-packed fp32, FBGEMM int8), alternating: new tok/s with the
    greedy ids compared, and the milliseconds a token spends outside its matrix products (token
    time minus the products' time alone, each measured here).
    Beside it, the same weights in the other runtimes a user might pick, each alternating with gptkit:
    - ONNX Runtime on `gptkit export --past` (the past-key/value graph), decoded greedily step by
      step: fp32 against gptkit's fp32 decoding layout (ids checked equal), and ONNX Runtime's own
      int8 (`onnxruntime.quantization.quantize_dynamic` of that graph) against gptkit's int8 layout;
    - llama.cpp (llama-cpp-python, an optional extra that builds llama.cpp) on `gptkit export
      --quantize f32|bf16|q8_0`: gptkit fp32 / bf16 / int8 beside llama.cpp f32 / bf16 / q8_0;
    - time to first token of a 512-token prompt (the prefill), the same pairs;
    - peak resident memory of each runtime in a fresh process (load, the 512-token prompt, 8 new
      tokens), above what the process held after its imports.
    A runtime that is not installed gives skipped rows that say so.
(b) GPT-1 shape: gptkit against OpenAIGPTLMHeadModel (which recomputes the sequence every step).
Random weights (speed does not depend on them); the token ids are checked equal in fp32.
bf16 weights are kept on CPUs without native bf16: decoding multiplies vectors by matrices, not the
bf16 matrix products that crawl there, and half-size weights halve the memory read per token.
A measurement running past common.TIME_LIMIT_S is reported as skipped. GPTKIT_BENCH_DEVICE=cuda (benchmarks/gpu.sh)
runs the models on a GPU; the CPU-only formats (the decoding layout, int8) and runtimes are then skipped.
`--quick`: one timed run a side and 32 new tokens, to check that every row runs. `--avx2`: the same
rows with PyTorch's kernels held to AVX2 and gptkit's native kernels built for AVX2 alone
(`GPTKIT_NATIVE_MARCH=haswell`), kept as generate_throughput_avx2. ONNX Runtime and llama.cpp pick their kernels from the
CPU alone and keep their AVX-512 ones: against them gptkit's ratio is a lower bound. On a CPU without
AVX-512 every runtime runs its AVX2 kernels; the run is kept as generate_throughput_avx2_cpu.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from unittest import mock

import numpy as np
import torch
from common import (
    DATA,
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

from gptkit import GPT, generate, native
from gptkit.hardware import packs_for_onednn
from gptkit.model.layouts import Int8Linear, decoding_layout, has_decoding_layout, load_int8

PROMPT, NEW, REPEATS = 32, 128, 3
PREFILL = 512  # the long prompt whose time to first token is measured
QUICK = False  # --quick: REPEATS 1, NEW 32
# --avx2: what holds each of PyTorch's kernel libraries to AVX2, as on a CPU without AVX-512.
AVX2_ONLY = {
    "ATEN_CPU_CAPABILITY": "avx2",
    "ONEDNN_MAX_CPU_ISA": "AVX2",
    "FBGEMM_ENABLE_INSTRUCTIONS": "AVX2",
    "MKL_ENABLE_INSTRUCTIONS": "AVX2",
    "GPTKIT_NATIVE_MARCH": "haswell",  # gptkit's native kernels built for AVX2 and FMA alone
}
# ONNX Runtime and llama.cpp pick their kernels from the CPU alone and cannot be held to AVX2: with
# --avx2 they keep this CPU's AVX-512 kernels, which puts gptkit's ratio to them at a lower bound.
PEER_UNCAPPED = ", not held to AVX2 (its AVX-512 kernels)"
# Tokens decoded after the long prompt when measuring memory: the peak is the load's or the prompt's;
# a few steps show that decoding runs, and keep the nine fresh processes short.
RSS_NEW = 8


def timed(fn) -> tuple[float, torch.Tensor]:
    synchronize()
    start = time.perf_counter()
    out = fn()
    synchronize()
    return time.perf_counter() - start, out


def measure_seconds(ours_fn, peer_fn) -> tuple[float, float, object, object]:
    """Median seconds of each, alternating after a warm-up of both, and each one's last output."""
    with time_limit(TIME_LIMIT_S):
        ours_fn(), peer_fn()  # warm-up
        ours_s, peer_s = [], []
        for _ in range(REPEATS):
            seconds, ours_out = timed(ours_fn)
            ours_s.append(seconds)
            seconds, peer_out = timed(peer_fn)
            peer_s.append(seconds)
    return median(ours_s), median(peer_s), ours_out, peer_out


def measure(ours_fn, peer_fn) -> tuple[float, float, torch.Tensor, torch.Tensor]:
    """New tokens/s of each (NEW tokens a call), alternating."""
    ours_s, peer_s, ours_out, peer_out = measure_seconds(ours_fn, peer_fn)
    return NEW / ours_s, NEW / peer_s, ours_out, peer_out


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


def onnxruntime_session(path: str | Path):
    """An ONNX Runtime CPU session with as many threads as torch decodes with, pool threads not spinning."""
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = torch.get_num_threads()  # the threads torch decodes with
    # By default ONNX Runtime's pool threads spin on after each run, which took the cores from the
    # gptkit runs alternating with them (a tiny model: 2 against 195 tok/s for gptkit): off.
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def onnxruntime_greedy(session, prompt: torch.Tensor, new: int | None = None) -> torch.Tensor:
    """``new`` greedy tokens from the past-key/value ONNX graph: the prompt with empty pasts, then one
    token a step with the presents of the step before; returns (B, T + new) as generate does. With
    ``new`` 1 it is the prefill alone (time to first token). ``new``: NEW by default."""
    new = NEW if new is None else new  # read now: --quick changes NEW after the definition
    pasts = [i for i in session.get_inputs() if i.name.startswith("past_key_values.")]
    ids = prompt.cpu().numpy()
    # (batch, n_head, 0, head_size): n_head and head_size are the graph's static dimensions.
    empty = np.zeros((ids.shape[0], pasts[0].shape[1], 0, pasts[0].shape[3]), np.float32)
    feeds = {"input_ids": ids, **{p.name: empty for p in pasts}}
    steps = []
    for _ in range(new):
        logits, *present = session.run(None, feeds)
        next_ids = logits[:, -1].argmax(-1)[:, None]
        steps.append(next_ids)
        feeds = {"input_ids": next_ids, **{p.name: value for p, value in zip(pasts, present)}}
    return torch.from_numpy(np.concatenate([ids, *steps], axis=1))


def onnxruntime_int8(fp32_path: Path) -> Path:
    """ONNX Runtime's own weight int8: ``quantize_dynamic`` with its defaults (int8 weights, one scale
    per tensor; activations quantized to uint8 at run time, MatMulInteger) on the fp32 graph."""
    import logging

    from onnxruntime.quantization import QuantType, quantize_dynamic

    logging.getLogger().setLevel(logging.ERROR)  # its advice to run shape pre-processing first
    path = fp32_path.with_name(fp32_path.stem + "-int8.onnx")
    quantize_dynamic(fp32_path, path, weight_type=QuantType.QInt8)
    return path


def onnxruntime_rows(
    model: GPT,
    ours: dict[str, torch.nn.Module | None],
    prompt: torch.Tensor,
    long_prompt: torch.Tensor,
    directory: str,
) -> tuple[list[dict], dict[str, Path]]:
    """gptkit against ONNX Runtime on ``model``'s export (``gptkit export --past``), all alternating:
    fp32 greedy decoding (gptkit as `gptkit generate` runs it here, ids checked equal); int8 greedy
    decoding, gptkit's int8 layout against ONNX Runtime's ``quantize_dynamic`` of the same graph;
    time to first token of a PREFILL-token prompt for gptkit fp32, bf16 and int8 against ONNX
    Runtime fp32 and int8. ``ours``: gptkit's models by format (fp32, bf16, int8; None where this
    device lacks one). Returns the rows and the ONNX files by format (none when skipped)."""
    fp32 = (
        "greedy new tok/s, GPT-2 small, fp32, gptkit decoding layout vs ONNX Runtime (gptkit export --past)"
    )
    int8 = "greedy new tok/s, GPT-2 small, int8, gptkit int8 weights vs ONNX Runtime quantize_dynamic int8"
    formats = {"fp32": "fp32 decoding layout", "bf16": "bf16 weights", "int8": "int8 weights"}
    prefill = {
        (mine, theirs): f"time to first token, GPT-2 small, {PREFILL}-token prompt, "
        f"gptkit {formats[mine]} vs ONNX Runtime {theirs}"
        for mine, theirs in (("fp32", "fp32"), ("bf16", "fp32"), ("int8", "int8"))
    }

    def all_skipped(peer: str, reason: str) -> tuple[list[dict], dict[str, Path]]:
        rows = [skipped(what, "tok/s", peer, reason) for what in (fp32, int8)]
        return rows + [skipped(what, "s", peer, reason) for what in prefill.values()], {}

    try:
        import onnxruntime
    except ImportError:
        return all_skipped("onnxruntime", "needs the export extra: pip install -e '.[export]'")
    peer = f"onnxruntime {onnxruntime.__version__} (CPUExecutionProvider), past-key/value graph"
    if DEVICE != "cpu":
        return all_skipped(peer, "the installed onnxruntime runs on the CPU only")
    peer += PEER_UNCAPPED if avx2_only() else ""
    from gptkit.export.onnx import export_onnx

    paths = {"fp32": export_onnx(model, Path(directory) / "decoder.onnx", past=True)}
    paths["int8"] = onnxruntime_int8(paths["fp32"])
    sessions = {fmt: onnxruntime_session(path) for fmt, path in paths.items()}
    rows = [
        compare(
            fp32,
            peer,
            lambda: generate(ours["fp32"], prompt, NEW, temperature=0),
            lambda: onnxruntime_greedy(sessions["fp32"], prompt),
            True,
        )[0]
    ]
    if ours["int8"] is None:
        rows.append(skipped(int8, "tok/s", peer, "a CPU format: gptkit uses int8 on CPUs only"))
    else:  # two int8 schemes: the ids are not expected to agree
        rows.append(
            compare(
                int8,
                f"onnxruntime {onnxruntime.__version__} quantize_dynamic (int8 weights, one scale a tensor)"
                + (PEER_UNCAPPED if avx2_only() else ""),
                lambda: generate(ours["int8"], prompt, NEW, temperature=0),
                lambda: onnxruntime_greedy(sessions["int8"], prompt),
                False,
            )[0]
        )
    for (mine, theirs), what in prefill.items():
        session = sessions[theirs]
        rows.append(
            prefill_row(
                what,
                f"{peer}, {theirs}",
                ours[mine],
                lambda long_prompt, session=session: onnxruntime_greedy(session, long_prompt, new=1),
                long_prompt,
                mine == theirs == "fp32",
            )
        )
    return rows, paths


def prefill_row(what: str, peer: str, model, peer_fn, long_prompt: torch.Tensor, same_ids: bool) -> dict:
    """Time to first token (seconds, lower is better) of gptkit's ``model`` on ``long_prompt`` against
    ``peer_fn(long_prompt)``, which returns the prompt and its first token as generate does."""
    if model is None:
        return skipped(what, "s", peer, "this device lacks gptkit's format")
    try:
        ours_s, peer_s, ours_out, peer_out = measure_seconds(
            lambda: generate(model, long_prompt, 1, temperature=0), lambda: peer_fn(long_prompt)
        )
    except MeasurementTimeout as e:
        return skipped(what, "s", peer, f"the measurement {e}")
    if same_ids:
        assert torch.equal(ours_out.cpu(), peer_out), "the first token differs from the peer's"
    return comparison(what, "s", ours_s, peer, peer_s, higher_is_better=False)


def llama_cpp_model(path: str | Path):
    """llama.cpp (llama-cpp-python) on a GGUF file, on the CPU, as many threads as torch decodes with
    (for the prompt too), room for the long prompt and the new tokens."""
    import llama_cpp

    threads = torch.get_num_threads()
    return llama_cpp.Llama(
        model_path=str(path),
        n_ctx=PREFILL + NEW,
        n_batch=PREFILL,
        n_threads=threads,
        n_threads_batch=threads,
        n_gpu_layers=0,
        verbose=False,
    )


def llama_cpp_greedy(llm, prompt: torch.Tensor, new: int | None = None) -> torch.Tensor:
    """``new`` greedy tokens from llama.cpp: the prompt in one batch (a fresh KV cache), then one token
    a step, each the arg-max of the last position's logits, read from llama.cpp's buffer; (1, T + new).
    ``new``: NEW by default."""
    import llama_cpp

    new = NEW if new is None else new
    ids = prompt[0].tolist()
    llm.reset()
    llm.eval(ids)
    steps = []
    for step in range(new):
        logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm.ctx, -1), shape=(llm.n_vocab(),))
        steps.append(int(logits.argmax()))
        if step < new - 1:
            llm.eval(steps[-1:])
    return torch.tensor([ids + steps])


# gptkit's format against the llama.cpp file type it is set beside: fp32 and f32; bf16 weights and
# bf16; the int8 layout and q8_0 (8.5 bits a weight). (f16 files run too; left out to keep the
# benchmark short: on this CPU, with native bf16, bf16 is the half-precision format both would pick.)
LLAMA_CPP_PAIRS = (("fp32", "f32"), ("bf16", "bf16"), ("int8", "q8_0"))


def llama_cpp_rows(
    model: GPT,
    ours: dict[str, torch.nn.Module | None],
    prompt: torch.Tensor,
    long_prompt: torch.Tensor,
    directory: str,
) -> tuple[list[dict], dict[str, Path]]:
    """gptkit against llama.cpp running ``model`` exported by `gptkit export --quantize` (f32, bf16,
    q8_0), alternating: greedy decoding (NEW tokens after the PROMPT-token prompt) and time to
    first token of the PREFILL-token prompt. Returns the rows and the GGUF files by type (none when
    skipped)."""

    def whats(mine: str, theirs: str) -> tuple[str, str]:
        pair = f"gptkit {mine} vs llama.cpp {theirs} (gptkit export --quantize {theirs})"
        return (
            f"greedy new tok/s, GPT-2 small, {pair}",
            f"time to first token, GPT-2 small, {PREFILL}-token prompt, {pair}",
        )

    def all_skipped(peer: str, reason: str) -> tuple[list[dict], dict[str, Path]]:
        rows = []
        for mine, theirs in LLAMA_CPP_PAIRS:
            decode, prefill = whats(mine, theirs)
            rows += [skipped(decode, "tok/s", peer, reason), skipped(prefill, "s", peer, reason)]
        return rows, {}

    try:
        import llama_cpp
    except ImportError:
        return all_skipped(
            "llama-cpp-python",
            "needs llama-cpp-python, which builds llama.cpp from source: pip install -e '.[llama]'",
        )
    peer = f"llama-cpp-python {llama_cpp.__version__} (CPU)"
    if DEVICE != "cpu":
        return all_skipped(peer, "measured on the CPU only")
    peer += PEER_UNCAPPED if avx2_only() else ""
    tokenizer_dir = DATA / "gpt2_bpe"
    if not tokenizer_dir.is_dir():
        return all_skipped(peer, f"a GGUF file holds its tokenizer: GPT-2's is not at {tokenizer_dir}")
    from gptkit.export.gguf import export_gguf
    from gptkit.tokenizer import Tokenizer

    tokenizer = Tokenizer.from_pretrained(tokenizer_dir)
    paths, rows = {}, []
    for mine, theirs in LLAMA_CPP_PAIRS:
        decode, prefill = whats(mine, theirs)
        if ours[mine] is None:
            rows += [
                skipped(w, u, peer, "this device lacks gptkit's format")
                for w, u in ((decode, "tok/s"), (prefill, "s"))
            ]
            continue
        paths[theirs] = export_gguf(
            model, tokenizer, Path(directory) / f"gpt2-{theirs}.gguf", quantize=theirs
        )
        rows += llama_cpp_pair(
            decode, prefill, f"{peer}, {theirs}", ours[mine], paths[theirs], prompt, long_prompt
        )
    return rows, paths


def llama_cpp_pair(
    decode: str, prefill: str, peer: str, ours, path: Path, prompt: torch.Tensor, long_prompt: torch.Tensor
) -> list[dict]:
    """gptkit's ``ours`` against llama.cpp on the GGUF file ``path``: greedy decoding, then prefill."""
    llm = llama_cpp_model(path)
    try:
        decode_row = compare(
            decode,
            peer,
            lambda: generate(ours, prompt, NEW, temperature=0),
            lambda: llama_cpp_greedy(llm, prompt),
            False,  # ggml's GELU reads an fp16 table: even f32 may flip a near-tie
        )[0]
        first_token_row = prefill_row(
            prefill,
            peer,
            ours,
            lambda long_prompt: llama_cpp_greedy(llm, long_prompt, new=1),
            long_prompt,
            False,
        )
    finally:
        llm.close()
    return [decode_row, first_token_row]


def resident_mb(field: str = "VmRSS") -> float:
    """This process's resident memory (Linux's /proc) in MB: now (VmRSS) or its peak (VmHWM). Not
    getrusage's ru_maxrss, which Linux carries over from the parent through fork and exec."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) / 1024
    raise OSError(f"no {field} in /proc/self/status")


def peak_rss_worker(kind: str, path: str) -> None:
    """In a fresh process: load one runtime's model (``kind`` runtime:format, from ``path``), prefill
    the PREFILL-token prompt and decode RSS_NEW greedy tokens; print JSON with the resident memory after
    the imports, the process's peak (usually the load's), and what it holds after decoding, the model
    still loaded."""
    runtime, fmt = kind.split(":")
    if runtime == "onnxruntime":
        import onnxruntime  # noqa: F401  (its library counts in the baseline, as torch's does)
    elif runtime == "llama.cpp":
        import llama_cpp  # noqa: F401
    baseline = resident_mb()
    prompt = torch.randint(0, 50257, (1, PREFILL), generator=torch.Generator().manual_seed(0))
    if runtime == "gptkit":
        dtype = torch.bfloat16 if fmt == "bf16" else torch.float32
        if fmt == "int8":
            loaded = load_int8(path)  # as load_for_generation: each block quantized as it is read
        else:
            loaded = GPT.from_pretrained(path, dtype=dtype)
            if has_decoding_layout(dtype, torch.device("cpu")):
                loaded = decoding_layout(loaded)
        generate(loaded, prompt, RSS_NEW, temperature=0)
    elif runtime == "onnxruntime":
        loaded = onnxruntime_session(path)
        onnxruntime_greedy(loaded, prompt, RSS_NEW)
    elif runtime == "llama.cpp":
        loaded = llama_cpp_model(path)
        llama_cpp_greedy(loaded, prompt, RSS_NEW)
    else:
        raise ValueError(f"unknown runtime {runtime!r}")
    peak, after = resident_mb("VmHWM"), resident_mb()
    del loaded  # only now: `after` is with the model held, for every runtime alike
    print(
        json.dumps(
            {
                "kind": kind,
                "baseline_mb": round(baseline, 1),
                "peak_mb": round(peak, 1),
                "after_mb": round(after, 1),
            }
        )
    )


# gptkit's format against each peer's, for peak memory: (gptkit format, peer kind).
PEAK_RSS_PAIRS = (
    ("fp32", "onnxruntime:fp32"),
    ("bf16", "onnxruntime:fp32"),
    ("int8", "onnxruntime:int8"),
    ("fp32", "llama.cpp:f32"),
    ("bf16", "llama.cpp:bf16"),
    ("int8", "llama.cpp:q8_0"),
)


def peak_rss_rows(model_dir: str, peer_files: dict[str, Path]) -> tuple[list[dict], dict[str, dict]]:
    """Peak resident memory of each runtime in its own process (model load, PREFILL-token prompt,
    RSS_NEW tokens), above what the process held after its imports (the interpreter, torch and the
    runtime's library): gptkit's formats against ONNX Runtime's and llama.cpp's. ``peer_files``: the
    peers' files by kind (runtime:format); a peer without one was skipped above, and is here too."""
    what = f"peak RSS above the imports, GPT-2 small, {PREFILL}-token prompt + {RSS_NEW} new tokens, "

    def label(mine: str, peer: str) -> str:
        runtime, fmt = peer.split(":")
        return what + f"gptkit {mine} vs {'ONNX Runtime' if runtime == 'onnxruntime' else runtime} {fmt}"

    if DEVICE != "cpu" or not Path("/proc/self/status").exists():
        reason = "measured on Linux CPUs only (/proc, one process per runtime)"
        return [skipped(label(m, p), "MB", p, reason) for m, p in PEAK_RSS_PAIRS], {}
    kinds = {f"gptkit:{fmt}": model_dir for fmt in ("fp32", "bf16", "int8")}
    kinds |= {kind: str(peer_files[kind]) for _, kind in PEAK_RSS_PAIRS if kind in peer_files}
    measured = {}
    for kind, path in kinds.items():
        out = subprocess.run(
            [sys.executable, __file__, "--peak-rss", kind, path, *(["--quick"] if QUICK else [])],
            capture_output=True,
            text=True,
            check=True,
        )
        measured[kind] = json.loads(out.stdout.strip().splitlines()[-1])
    growth = {kind: m["peak_mb"] - m["baseline_mb"] for kind, m in measured.items()}
    rows = []
    for mine, peer in PEAK_RSS_PAIRS:
        if peer not in growth:
            rows.append(skipped(label(mine, peer), "MB", peer, "its runtime's rows were skipped above"))
        else:
            rows.append(
                comparison(label(mine, peer), "MB", growth[f"gptkit:{mine}"], peer, growth[peer], False)
            )
    return rows, measured


def avx2_only() -> bool:
    """Whether this run holds PyTorch to AVX2 (``--avx2``)."""
    return all(os.environ.get(name) == value for name, value in AVX2_ONLY.items())


def record_name() -> str:
    """generate_throughput on a CPU with AVX-512; generate_throughput_avx2 held to AVX2 there
    (``--avx2``, the peers on AVX-512); generate_throughput_avx2_cpu on a CPU without AVX-512,
    where every runtime runs its AVX2 kernels."""
    if avx2_only():
        return "generate_throughput_avx2"
    if DEVICE == "cpu" and torch.backends.cpu.get_cpu_capability() == "AVX2":
        return "generate_throughput_avx2_cpu"
    return "generate_throughput"


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
    int8 buffers, oneDNN- and FBGEMM-packed matrices), the token and position tables only where the
    tied output layer reads the token table whole (a lookup reads one row of each)."""
    tables = {id(model.wpe.weight)} if hasattr(model, "wpe") else set()
    lm_head = getattr(model, "lm_head", None)
    if lm_head is not None and all(t is not model.wte.weight for t in lm_head.parameters()):
        tables.add(id(model.wte.weight))  # the output layer has its own copy
    tensors = [
        t
        for t in (*model.parameters(), *(b for b in model.buffers() if b.dtype == torch.int8 or b.is_mkldnn))
        if id(t) not in tables
    ]
    # Packed (opaque) matrices have no storage to look at: their elements, at least what they hold.
    packed = sum(t.numel() * t.element_size() for t in tensors if t.is_mkldnn)
    packed += sum(  # FBGEMM's int8 matrices: a byte an element
        m.integers().numel() for m in model.modules() if isinstance(m, Int8Linear) and m.packed is not None
    )
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


def without_native(build):
    """``build()`` with gptkit's native kernels turned off: the PyTorch layouts gptkit uses where the
    native library cannot be built."""
    with mock.patch.dict(os.environ, {"GPTKIT_NATIVE": "0"}):
        return build()


def products_seconds(model: GPT) -> float:
    """Median seconds of one token's matrix products alone, one row: the native step's block
    products in one call, or each block Linear called in turn, then the output layer."""
    d, dtype = model.config.d_model, model.wte.weight.dtype
    row, wide = torch.randn(1, d, dtype=dtype), torch.randn(1, 4 * d, dtype=dtype)
    if model.native_step is not None:

        def run():
            model.native_step.products(1)
            model.output_layer(row)
    else:

        def run():
            for block in model.h:
                for linear, x in (
                    (block.attn.c_attn, row),
                    (block.attn.c_proj, row),
                    (block.mlp.c_fc, row),
                    (block.mlp.c_proj, wide),
                ):
                    linear(x)
            model.output_layer(row)

    run()
    return median([timed(run)[0] for _ in range(9)])


def native_rows(tmp: str, prompt: torch.Tensor, ours_layout, ours_bf16_layout, ours_int8) -> list[dict]:
    """gptkit's native step against gptkit's PyTorch layouts (oneDNN-packed fp32 and bf16, or bf16
    widened for a prompt; FBGEMM int8) in the same run: new tok/s with the greedy ids compared, and
    the time a token spends outside its products (token time minus the products' time, both
    measured here)."""
    rows = []
    if ours_layout is None or ours_layout.native_step is None:
        return [
            skipped("native step", "tok/s", "gptkit PyTorch layouts", "the native kernels are not available")
        ]
    bf16_layout = (
        "oneDNN-packed" if packs_for_onednn(torch.bfloat16, torch.device("cpu")) else "WideningLinear"
    )
    pairs = (
        (
            "fp32",
            ours_layout,
            without_native(lambda: decoding_layout(GPT.from_pretrained(tmp))),
            "oneDNN-packed",
        ),
        (
            "bf16",
            ours_bf16_layout,
            without_native(lambda: decoding_layout(GPT.from_pretrained(tmp, dtype=torch.bfloat16))),
            bf16_layout,
        ),
        ("int8", ours_int8, without_native(lambda: load_int8(tmp)), "FBGEMM"),
    )
    for fmt, fast, pytorch, layout in pairs:
        peer = f"gptkit {fmt} in its PyTorch layout ({layout})"
        what = f"greedy new tok/s, GPT-2 small, {fmt}, gptkit native step"
        try:
            ours_tps, peer_tps, ours_out, peer_out = measure(
                lambda model=fast: generate(model, prompt, NEW, temperature=0),
                lambda model=pytorch: generate(model, prompt, NEW, temperature=0),
            )
        except MeasurementTimeout as e:
            rows.append(skipped(what, "tok/s", peer, f"the measurement {e}"))
            continue
        row = comparison(what, "tok/s", ours_tps, peer, peer_tps)
        row["same_ids"] = bool(torch.equal(ours_out, peer_out))
        rows.append(row)
        outside = outside_products_ms([fast, pytorch], prompt)
        rows.append(
            comparison(
                f"ms a token spends outside its matrix products, GPT-2 small, {fmt}, gptkit native step",
                "ms",
                outside[0],
                peer,
                outside[1],
                higher_is_better=False,
            )
        )
    return rows


def outside_products_ms(models: list[GPT], prompt: torch.Tensor) -> list[float]:
    """Each model's milliseconds a token spends outside its matrix products: a decode of NEW tokens
    timed, then its products alone, back to back (the machine's drift touches both alike), the
    models alternating; the median of REPEATS rounds."""
    differences: list[list[float]] = [[] for _ in models]
    for _ in range(REPEATS):
        for model, spent in zip(models, differences):
            seconds, _ = timed(lambda model=model: generate(model, prompt, NEW, temperature=0))
            spent.append(seconds / NEW - products_seconds(model))
    return [1e3 * median(spent) for spent in differences]


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
        # the layouts the CPU streams fastest (gptkit.model.layouts.decoding_layout): the native
        # step where gptkit.native is built, else oneDNN-packed matrices.
        uses_native = DEVICE == "cpu" and native.available()
        row, ours_layout = optional(
            "greedy new tok/s, GPT-2 small, fp32, gptkit decoding layout "
            + ("(native step)" if uses_native else "(oneDNN-packed)"),
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
        # What `gptkit generate --dtype bfloat16` runs on a CPU: packed where bf16 is native, else
        # bf16 rows a step and a prompt widened to fp32 (WideningLinear).
        packed = packs_for_onednn(torch.bfloat16, torch.device(DEVICE))
        row, ours_bf16_layout = optional(
            "greedy new tok/s, GPT-2 small, gptkit bf16 weights, decoding layout "
            + (
                "(native step)"
                if uses_native
                else "(oneDNN-packed)"
                if packed
                else "(a prompt widened to fp32)"
            ),
            None if has_decoding_layout(torch.bfloat16, torch.device(DEVICE)) else "a CPU layout",
            lambda: decoding_layout(GPT.from_pretrained(tmp, dtype=torch.bfloat16)),
            False,
        )
        comparisons.append(row)
        # int8 off the CPU: Int8Linear dequantizes the whole matrix, no fused kernel to measure.
        row, ours_int8 = optional(
            "greedy new tok/s, GPT-2 small, gptkit int8 weights "
            + ("(native step, 7-bit activations)" if uses_native else "(8-bit activations while decoding)"),
            on_cpu,
            lambda: load_int8(tmp),
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
        if DEVICE == "cpu":
            comparisons += native_rows(tmp, prompt, ours_layout, ours_bf16_layout, ours_int8)
        long_prompt = torch.randint(0, 50257, (1, PREFILL)).to(DEVICE)
        gptkit_formats = {
            "fp32": ours_layout if ours_layout is not None else ours,  # what `gptkit generate` runs
            "bf16": ours_bf16_layout if ours_bf16_layout is not None else ours_bf16,
            "int8": ours_int8,
        }
        rows, onnx_files = onnxruntime_rows(ours, gptkit_formats, prompt, long_prompt, tmp)
        comparisons += rows
        rows, gguf_files = llama_cpp_rows(ours, gptkit_formats, prompt, long_prompt, tmp)
        comparisons += rows
        peer_files = {f"onnxruntime:{fmt}": path for fmt, path in onnx_files.items()}
        peer_files |= {f"llama.cpp:{fmt}": path for fmt, path in gguf_files.items()}
        rows, peak_rss = peak_rss_rows(tmp, peer_files)
        comparisons += rows
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
        record_name(),
        comparisons,
        device=DEVICE,
        prompt_tokens=PROMPT,
        new_tokens=NEW,
        memory_bandwidth_gb_s=round(bandwidth / 1e9, 1),
        prefill_tokens=PREFILL,
        repeats=REPEATS,
        quick=QUICK,
        peak_rss_mb=peak_rss,
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--avx2",
        action="store_true",
        help="Hold PyTorch's kernels (ATen, oneDNN, FBGEMM, MKL) to AVX2, as on a CPU without AVX-512, "
        "and keep the results as generate_throughput_avx2.",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"One timed run per side (not {REPEATS}) and 32 new tokens (not {NEW}): a check that every row runs.",
    )
    parser.add_argument("--peak-rss", nargs=2, metavar=("KIND", "PATH"), help=argparse.SUPPRESS)  # a worker
    args = parser.parse_args()
    if args.avx2 and os.environ.get("ATEN_CPU_CAPABILITY") != "avx2":
        # The caps are read when the libraries load: run again with them set.
        os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, **AVX2_ONLY})
    if args.quick:
        REPEATS, NEW, QUICK = 1, 32, True
    if args.peak_rss:
        peak_rss_worker(*args.peak_rss)
    else:
        main()
