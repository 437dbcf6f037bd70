"""Greedy decoding speed: new tokens/s for one 32-token prompt and 128 new tokens; time to first token
of a 512-token prompt; peak memory.

(a) GPT-2-small shape: gptkit (KV cache; fp32 in nn.Linear's layout and in the decoding layout that
    `gptkit generate` uses on a CPU, bf16 weights plain and in that layout, int8 weights) against
    GPT2LMHeadModel with its cache.
    gptkit's native step (gptkit.native: every block of a step in one call, fp32 and int8) against
    gptkit's PyTorch layouts (oneDNN-packed fp32, FBGEMM int8), alternating: new tok/s with the
    greedy ids compared.
    Beside it, the same weights in the other runtimes a user might pick, each alternating with gptkit:
    - ONNX Runtime on `gptkit export --past` (the past-key/value graph), decoded greedily step by
      step: fp32 against gptkit's fp32 decoding layout (ids checked equal), and ONNX Runtime's own
      int8 (`onnxruntime.quantization.quantize_dynamic` of that graph) against gptkit's int8 layout;
    - llama.cpp (llama-cpp-python, an optional extra that builds llama.cpp) on `gptkit export
      --quantize f32|bf16|q8_0`: gptkit fp32 / bf16 / int8 beside llama.cpp f32 / bf16 / q8_0, in a
      process of its own (a crash there, as its AMX q8_0 product's on gptkit's files, skips its rows
      naming the signal; on a CPU with AMX the q8_0 file loads with use_extra_bufts off, and says so);
    - time to first token of a 512-token prompt (the prefill), the same pairs;
    - peak resident memory of each runtime in a fresh process (load, the 512-token prompt, 8 new
      tokens), above what the process held after its imports.
    A runtime that is not installed gives skipped rows that say so.
(b) GPT-1 shape: gptkit against OpenAIGPTLMHeadModel (which recomputes the sequence every step).
Random weights (speed does not depend on them); the token ids are checked equal in fp32. Every row is
the median of REPEATS (5) rounds, the sides alternating, with each side's spread (``ours_spread``,
``peer_spread``) and ``on_par`` where the spreads overlap. Bandwidth fractions divide by a streaming
read's bandwidth (a copy's undercounts what a read-only step can reach).
`--only native`: the native step's rows alone, kept as generate_throughput_native: against the
PyTorch layouts (tok/s, read-bandwidth fractions); the same with a
CPU-bound process busy on every core, at 1, 2 and 4 threads, for GPT-2 small and a d_model-64 model;
and a trial of torch.compile (Inductor, freezing, a static KV cache) for the decoding step.
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
import contextlib
import importlib.metadata
import importlib.util
import json
import os
import signal
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
    spread_comparison,
    synchronize,
    time_limit,
)

from gptkit import GPT, generate, native
from gptkit.hardware import packs_for_onednn
from gptkit.model.layouts import Int8Linear, decoding_layout, has_decoding_layout, load_int8
from gptkit.model.native_step import NativeLinear

PROMPT, NEW, REPEATS = 32, 128, 5
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


def measure_seconds(ours_fn, peer_fn) -> tuple[list[float], list[float], object, object]:
    """Seconds of each in REPEATS rounds, alternating after a warm-up of both (so that the machine's
    drift touches both alike), and each one's last output."""
    with time_limit(TIME_LIMIT_S):
        ours_fn(), peer_fn()  # warm-up
        ours_s, peer_s = [], []
        for _ in range(REPEATS):
            seconds, ours_out = timed(ours_fn)
            ours_s.append(seconds)
            seconds, peer_out = timed(peer_fn)
            peer_s.append(seconds)
    return ours_s, peer_s, ours_out, peer_out


def measure(ours_fn, peer_fn, new: int | None = None) -> tuple[list[float], list[float], object, object]:
    """New tokens/s of each in every round (``new`` tokens a call, NEW by default), alternating."""
    new = NEW if new is None else new
    ours_s, peer_s, ours_out, peer_out = measure_seconds(ours_fn, peer_fn)
    return [new / s for s in ours_s], [new / s for s in peer_s], ours_out, peer_out


def compare(what: str, peer: str, ours_fn, peer_fn, same_ids: bool) -> tuple[dict, float | None]:
    """The comparison and the peer's tok/s; a skipped comparison (and None) past the time limit, or
    where the peer's process crashed."""
    try:
        ours_tps, peer_tps, ours_out, peer_out = measure(ours_fn, peer_fn)
    except MeasurementTimeout as e:
        return skipped(what, "tok/s", peer, f"the measurement {e}"), None
    except PeerCrashed as e:
        return skipped(what, "tok/s", peer, str(e)), None
    row = spread_comparison(what, "tok/s", ours_tps, peer, peer_tps)
    peer_tps = median(peer_tps)
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


# ONNX Runtime's rows: greedy decoding in fp32 and in int8, and time to first token by (gptkit's
# format, ONNX Runtime's format).
ONNX_FP32 = (
    "greedy new tok/s, GPT-2 small, fp32, gptkit decoding layout vs ONNX Runtime (gptkit export --past)"
)
ONNX_INT8 = "greedy new tok/s, GPT-2 small, int8, gptkit int8 weights vs ONNX Runtime quantize_dynamic int8"
ONNX_GPTKIT_FORMATS = {"fp32": "fp32 decoding layout", "bf16": "bf16 weights", "int8": "int8 weights"}
ONNX_PREFILL = {
    (mine, theirs): f"time to first token, GPT-2 small, {PREFILL}-token prompt, "
    f"gptkit {ONNX_GPTKIT_FORMATS[mine]} vs ONNX Runtime {theirs}"
    for mine, theirs in (("fp32", "fp32"), ("bf16", "fp32"), ("int8", "int8"))
}


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

    def all_skipped(peer: str, reason: str) -> tuple[list[dict], dict[str, Path]]:
        rows = [skipped(what, "tok/s", peer, reason) for what in (ONNX_FP32, ONNX_INT8)]
        return rows + [skipped(what, "s", peer, reason) for what in ONNX_PREFILL.values()], {}

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
    rows = onnxruntime_decode_rows(ours, sessions, prompt, peer, onnxruntime.__version__)
    return rows + onnxruntime_prefill_rows(ours, sessions, long_prompt, peer), paths


def onnxruntime_decode_rows(
    ours: dict[str, torch.nn.Module | None], sessions: dict, prompt: torch.Tensor, peer: str, version: str
) -> list[dict]:
    """Greedy decoding, gptkit against ONNX Runtime's ``sessions`` by format: fp32 (ids checked
    equal), and gptkit's int8 layout against ONNX Runtime's quantize_dynamic int8."""
    rows = [
        compare(
            ONNX_FP32,
            peer,
            lambda: generate(ours["fp32"], prompt, NEW, temperature=0),
            lambda: onnxruntime_greedy(sessions["fp32"], prompt),
            True,
        )[0]
    ]
    if ours["int8"] is None:
        rows.append(skipped(ONNX_INT8, "tok/s", peer, "a CPU format: gptkit uses int8 on CPUs only"))
    else:  # two int8 schemes: the ids are not expected to agree
        rows.append(
            compare(
                ONNX_INT8,
                f"onnxruntime {version} quantize_dynamic (int8 weights, one scale a tensor)"
                + (PEER_UNCAPPED if avx2_only() else ""),
                lambda: generate(ours["int8"], prompt, NEW, temperature=0),
                lambda: onnxruntime_greedy(sessions["int8"], prompt),
                False,
            )[0]
        )
    return rows


def onnxruntime_prefill_rows(
    ours: dict[str, torch.nn.Module | None], sessions: dict, long_prompt: torch.Tensor, peer: str
) -> list[dict]:
    """Time to first token of ``long_prompt``, each of ONNX_PREFILL's pairs of formats (ids checked
    equal in fp32 alone)."""
    rows = []
    for (mine, theirs), what in ONNX_PREFILL.items():
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
    return rows


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
    except PeerCrashed as e:
        return skipped(what, "s", peer, str(e))
    if same_ids:
        assert torch.equal(ours_out.cpu(), peer_out), "the first token differs from the peer's"
    return spread_comparison(what, "s", ours_s, peer, peer_s, higher_is_better=False)


# Peers in processes of their own ---------------------------------------------------------------


class PeerCrashed(RuntimeError):
    """A peer's process ended while measuring (a crash in its kernels): its rows are skipped, naming
    it and how it ended, and the benchmark goes on."""


def ended(returncode: int) -> str:
    """How a process ended, in words: 'signal 11 (SIGSEGV)' or 'exit status 3'."""
    if returncode < 0:
        try:
            return f"signal {-returncode} ({signal.Signals(-returncode).name})"
        except ValueError:
            return f"signal {-returncode}"
    return f"exit status {returncode}"


class PeerProcess:
    """A peer runtime loaded in a process of its own (this script with ``--peer-worker``), asked to
    decode over a pipe, one JSON line each way. A crash in its kernels ends that process, not the
    benchmark: llama.cpp (llama-cpp-python 0.3.36) segfaults in its AMX q8_0 product on gptkit's
    files (ggml-org/llama.cpp#20824), which took the whole run with it. Timed from here, the pipe's
    microseconds included, alternating with gptkit as any peer."""

    def __init__(self, runtime: str, path: str | Path = "", **options):
        self.runtime = runtime
        spec = json.dumps({"runtime": runtime, "path": str(path), **options})
        self.process = subprocess.Popen(
            [sys.executable, __file__, "--peer-worker", spec, *(["--quick"] if QUICK else [])],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.call(op="ready")  # loaded (or crashed loading)

    def call(self, **command) -> dict:
        line = ""
        try:
            self.process.stdin.write(json.dumps(command) + "\n")
            self.process.stdin.flush()
            line = self.process.stdout.readline()
        except (BrokenPipeError, OSError):
            pass
        if not line:
            code = self.process.wait()
            raise PeerCrashed(
                f"{self.runtime} crashed ({ended(code)}): its process ended, the benchmark went on"
            )
        answer = json.loads(line)
        if "error" in answer:
            raise RuntimeError(f"{self.runtime}: {answer['error']}")
        return answer

    def greedy(self, prompt: torch.Tensor, new: int | None = None) -> torch.Tensor:
        """``new`` greedy tokens after ``prompt`` (1, T) from the peer: (1, T + new)."""
        answer = self.call(op="greedy", prompt=prompt[0].tolist(), new=NEW if new is None else new)
        return torch.tensor([answer["ids"]])

    def close(self) -> None:
        if self.process.poll() is None:
            with contextlib.suppress(BrokenPipeError, OSError):
                self.process.stdin.close()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def peer_worker(spec: str) -> None:
    """``--peer-worker``: load the peer ``spec`` names, then answer PeerProcess's commands, one JSON
    line each, on the stdout it was started with (the libraries' own prints go to stderr)."""
    options = json.loads(spec)
    answers = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    runtime = options["runtime"]
    if runtime == "llama.cpp":
        llm = llama_cpp_model(options["path"], extra_bufts=options.get("extra_bufts", True))

        def greedy(prompt, new):
            return llama_cpp_greedy(llm, torch.tensor([prompt]), new)[0].tolist()
    elif runtime == "crashing-peer":  # the tests' peer: it crashes as llama.cpp's AMX product did
        if options.get("crash") == "load":
            os.kill(os.getpid(), signal.SIGSEGV)

        def greedy(prompt, new):
            os.kill(os.getpid(), signal.SIGSEGV)
    else:
        raise SystemExit(f"unknown peer runtime {runtime!r}")
    for line in sys.stdin:
        command = json.loads(line)
        if command["op"] == "ready":
            answer = {"ready": True}
        elif command["op"] == "greedy":
            answer = {"ids": greedy(command["prompt"], command["new"])}
        else:
            answer = {"error": f"unknown command {command['op']!r}"}
        answers.write(json.dumps(answer) + "\n")
        answers.flush()


def cpu_flags() -> set[str]:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def has_amx() -> bool:
    """An Intel CPU with AMX, where llama.cpp's extra buffer types repack q8_0 for its AMX product."""
    return bool({"amx_int8", "amx_tile"} & cpu_flags())


# On AMX CPUs llama.cpp's q8_0 product through its extra buffer types crashes on gptkit's files
# (ggml-org/llama.cpp#20824): those rows run with the model parameter use_extra_bufts off, and say so.
NO_EXTRA_BUFTS = ", use_extra_bufts off (its AMX q8_0 product crashes: ggml-org/llama.cpp#20824)"


def llama_cpp_model(path: str | Path, extra_bufts: bool = True):
    """llama.cpp (llama-cpp-python) on a GGUF file, on the CPU, as many threads as torch decodes with
    (for the prompt too), room for the long prompt and the new tokens; ``extra_bufts`` False loads it
    with llama.cpp's model parameter use_extra_bufts off (no repacking for AMX and the like)."""
    import llama_cpp
    import llama_cpp.llama_cpp as binding

    threads = torch.get_num_threads()
    defaults = binding.llama_model_default_params

    def without_extra_bufts():
        params = defaults()
        if hasattr(params, "use_extra_bufts"):
            params.use_extra_bufts = False
        return params

    if not extra_bufts:  # Llama() starts from llama_model_default_params(): ours, for this load
        binding.llama_model_default_params = without_extra_bufts
    try:
        return llama_cpp.Llama(
            model_path=str(path),
            n_ctx=PREFILL + NEW,
            n_batch=PREFILL,
            n_threads=threads,
            n_threads_batch=threads,
            n_gpu_layers=0,
            verbose=False,
        )
    finally:
        binding.llama_model_default_params = defaults


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


def llama_cpp_whats(mine: str, theirs: str) -> tuple[str, str]:
    """The decoding row's and the prefill row's names, gptkit's ``mine`` beside llama.cpp's ``theirs``."""
    pair = f"gptkit {mine} vs llama.cpp {theirs} (gptkit export --quantize {theirs})"
    return (
        f"greedy new tok/s, GPT-2 small, {pair}",
        f"time to first token, GPT-2 small, {PREFILL}-token prompt, {pair}",
    )


def llama_cpp_skipped(peer: str, reason: str) -> tuple[list[dict], dict[str, Path]]:
    """Every llama.cpp row skipped for ``reason``, and no files."""
    rows = []
    for mine, theirs in LLAMA_CPP_PAIRS:
        decode, prefill = llama_cpp_whats(mine, theirs)
        rows += [skipped(decode, "tok/s", peer, reason), skipped(prefill, "s", peer, reason)]
    return rows, {}


def llama_cpp_rows(
    model: GPT,
    ours: dict[str, torch.nn.Module | None],
    prompt: torch.Tensor,
    long_prompt: torch.Tensor,
    directory: str,
) -> tuple[list[dict], dict[str, Path]]:
    """gptkit against llama.cpp running ``model`` exported by `gptkit export --quantize` (f32, bf16,
    q8_0), alternating: greedy decoding (NEW tokens after the PROMPT-token prompt) and time to
    first token of the PREFILL-token prompt. llama.cpp runs in a process of its own per file: a crash
    skips that file's rows. Returns the rows and the GGUF files by type (none when skipped)."""
    if (
        importlib.util.find_spec("llama_cpp") is None
    ):  # found, not imported: its library loads in the peer's process
        return llama_cpp_skipped(
            "llama-cpp-python",
            "needs llama-cpp-python, which builds llama.cpp from source: pip install -e '.[llama]'",
        )
    peer = f"llama-cpp-python {importlib.metadata.version('llama-cpp-python')} (CPU)"
    if DEVICE != "cpu":
        return llama_cpp_skipped(peer, "measured on the CPU only")
    peer += PEER_UNCAPPED if avx2_only() else ""
    tokenizer_dir = DATA / "gpt2_bpe"
    if not tokenizer_dir.is_dir():
        return llama_cpp_skipped(peer, f"a GGUF file holds its tokenizer: GPT-2's is not at {tokenizer_dir}")
    from gptkit.export.gguf import export_gguf
    from gptkit.tokenizer import Tokenizer

    tokenizer = Tokenizer.from_pretrained(tokenizer_dir)
    paths, rows = {}, []
    for mine, theirs in LLAMA_CPP_PAIRS:
        decode, prefill = llama_cpp_whats(mine, theirs)
        if ours[mine] is None:
            rows += [
                skipped(w, u, peer, "this device lacks gptkit's format")
                for w, u in ((decode, "tok/s"), (prefill, "s"))
            ]
            continue
        paths[theirs] = export_gguf(
            model, tokenizer, Path(directory) / f"gpt2-{theirs}.gguf", quantize=theirs
        )
        rows += llama_cpp_pair(decode, prefill, peer, theirs, paths[theirs], ours[mine], prompt, long_prompt)
    return rows, paths


def llama_cpp_pair(
    decode: str,
    prefill: str,
    peer: str,
    theirs: str,
    path: Path,
    ours,
    prompt: torch.Tensor,
    long_prompt: torch.Tensor,
) -> list[dict]:
    """gptkit's ``ours`` against llama.cpp on the GGUF file at ``path`` (type ``theirs``), in a process
    of its own. On a CPU with AMX a q8_0 file loads with use_extra_bufts off (its AMX product
    crashes on gptkit's files), and the peer's name says so."""
    extra_bufts = not (theirs == "q8_0" and has_amx())
    label = f"{peer}, {theirs}" + ("" if extra_bufts else NO_EXTRA_BUFTS)
    return peer_pair(
        decode,
        prefill,
        label,
        ours,
        lambda: PeerProcess("llama.cpp", path, extra_bufts=extra_bufts),
        prompt,
        long_prompt,
    )


def peer_pair(
    decode: str, prefill: str, peer: str, ours, start_peer, prompt: torch.Tensor, long_prompt: torch.Tensor
) -> list[dict]:
    """gptkit's ``ours`` against a peer in its own process (``start_peer()``: a PeerProcess): greedy
    decoding, then prefill. A crash, loading or measuring, gives skipped rows naming it."""
    try:
        process = start_peer()
    except PeerCrashed as e:
        return [skipped(decode, "tok/s", peer, str(e)), skipped(prefill, "s", peer, str(e))]
    try:
        decode_row = compare(
            decode,
            peer,
            lambda: generate(ours, prompt, NEW, temperature=0),
            lambda: process.greedy(prompt),
            False,  # ggml's GELU reads an fp16 table: even f32 may flip a near-tie
        )[0]
        if decode_row.get("skipped"):  # it crashed: no process left to time the prefill
            return [decode_row, skipped(prefill, "s", peer, decode_row["skipped"])]
        first_token_row = prefill_row(
            prefill,
            peer,
            ours,
            lambda long_prompt: process.greedy(long_prompt, new=1),
            long_prompt,
            False,
        )
    finally:
        process.close()
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
        loaded = llama_cpp_model(path, extra_bufts=not (fmt == "q8_0" and has_amx()))
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
    measured, crashed = {}, {}
    for kind, path in kinds.items():
        out = subprocess.run(
            [sys.executable, __file__, "--peak-rss", kind, path, *(["--quick"] if QUICK else [])],
            capture_output=True,
            text=True,
        )
        if out.returncode != 0:  # a peer's crash skips its rows; gptkit's own fails the run
            if kind.startswith("gptkit:"):
                raise RuntimeError(f"the peak-memory worker for {kind} failed: {out.stderr[-2000:]}")
            crashed[kind] = (
                f"{kind} crashed ({ended(out.returncode)}) in its own process; the benchmark went on"
            )
            continue
        measured[kind] = json.loads(out.stdout.strip().splitlines()[-1])
    growth = {kind: m["peak_mb"] - m["baseline_mb"] for kind, m in measured.items()}
    rows = []
    for mine, peer in PEAK_RSS_PAIRS:
        if peer in crashed:
            rows.append(skipped(label(mine, peer), "MB", peer, crashed[peer]))
        elif peer not in growth:
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
    """Bytes per second this machine reads in a large streaming read (a sum over 256 MB, far past the
    caches; best of 5): the limit that a decoding step, which only reads its weights, runs into. Not a
    copy's bytes ÷ time: a copy's writes cost more than its reads, so it undercounts what a read-only
    step can reach (fractions of it passed 1)."""
    source = torch.ones(64 * 2**20, device=DEVICE)
    source.sum()
    best = min(timed(lambda: source.sum())[0] for _ in range(5))
    return source.nbytes / best


def weight_bytes(model: torch.nn.Module) -> int:
    """Bytes of the weights one decoding step reads: every matrix, bias and gain once (parameters,
    int8 buffers, oneDNN- and FBGEMM-packed matrices), the token and position tables only where the
    tied output layer reads the token table whole (a lookup reads one row of each)."""
    tables = {id(model.wpe.weight)} if hasattr(model, "wpe") else set()
    lm_head = getattr(model, "lm_head", None)
    if lm_head is not None and all(t is not model.wte.weight for t in lm_head.parameters()):
        tables.add(id(model.wte.weight))  # the output layer has its own copy
    # The native layout's matrices are packed copies (NativeLinear's buffers), the output layer's
    # too: the token table is then only looked up.
    native_linears = [m for m in model.modules() if isinstance(m, NativeLinear)]
    if isinstance(lm_head, NativeLinear):
        tables.add(id(model.wte.weight))
    tensors = [
        t
        for t in (*model.parameters(), *(b for b in model.buffers() if b.dtype == torch.int8 or b.is_mkldnn))
        if id(t) not in tables
    ]
    tensors += [b for m in native_linears for b in m.buffers() if b.dtype != torch.int8]
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
    native kernels are not used (not built, or without vector code or threads for the CPU)."""
    with mock.patch.dict(os.environ, {"GPTKIT_NATIVE": "0"}):
        return build()


def native_rows(
    tmp: str, prompt: torch.Tensor, ours_layout, ours_bf16_layout, ours_int8, bandwidth: float | None = None
) -> list[dict]:
    """gptkit's native step against gptkit's PyTorch layouts (oneDNN-packed fp32 and bf16, or bf16
    widened for a prompt; FBGEMM int8) in the same run: new tok/s with the greedy ids compared; with
    ``bandwidth`` (a streaming read's bytes/s) also the fraction of it each
    side's tokens/s reach."""
    if ours_layout is None or ours_layout.native_step is None:
        return [
            skipped("native step", "tok/s", "gptkit PyTorch layouts", "the native kernels are not available")
        ]
    bf16_layout = (
        "oneDNN-packed" if packs_for_onednn(torch.bfloat16, torch.device("cpu")) else "WideningLinear"
    )
    # Every PyTorch layout built before any is measured, as the native models were.
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
    rows = []
    for fmt, fast, pytorch, layout in pairs:
        rows += native_format_rows(fmt, fast, pytorch, layout, prompt, bandwidth)
    return rows


def native_format_rows(
    fmt: str, fast: GPT, pytorch: GPT, layout: str, prompt: torch.Tensor, bandwidth: float | None
) -> list[dict]:
    """One format's rows of native_rows: the native step (``fast``) against the PyTorch ``layout``
    (``pytorch``): tok/s, and the bandwidth fractions with ``bandwidth``."""
    peer = f"gptkit {fmt} in its PyTorch layout ({layout})"
    what = f"greedy new tok/s, GPT-2 small, {fmt}, gptkit native step"
    try:
        ours_tps, peer_tps, ours_out, peer_out = measure(
            lambda: generate(fast, prompt, NEW, temperature=0),
            lambda: generate(pytorch, prompt, NEW, temperature=0),
        )
    except MeasurementTimeout as e:
        return [skipped(what, "tok/s", peer, f"the measurement {e}")]
    row = spread_comparison(what, "tok/s", ours_tps, peer, peer_tps)
    row["same_ids"] = bool(torch.equal(ours_out, peer_out))
    rows = [row]
    if bandwidth is not None:
        rows.append(
            spread_comparison(
                f"memory-bandwidth fraction (a streaming read's), GPT-2 small, {fmt}, gptkit native step",
                "fraction of memory bandwidth",
                [weight_bytes(fast) * tps / bandwidth for tps in ours_tps],
                peer,
                [weight_bytes(pytorch) * tps / bandwidth for tps in peer_tps],
            )
        )
    return rows


# Under contention --------------------------------------------------------------------------------

# One busy loop a core, forked from one process: a CPU-bound neighbour on every core.
BUSY = "import os, sys\nfor _ in range(int(sys.argv[1]) - 1):\n    if os.fork() == 0:\n        break\nwhile True:\n    pass\n"
CONTENTION_THREADS = (1, 2, 4)


def usable_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


@contextlib.contextmanager
def competing_process():
    """A CPU-bound process busy on every core this one may use while the block runs; the cores."""
    cores = usable_cores()
    process = subprocess.Popen([sys.executable, "-c", BUSY, str(cores)], start_new_session=True)
    try:
        time.sleep(0.5)  # forked and spinning
        yield cores
    finally:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def contention_rows(directory: str, prompt: torch.Tensor) -> list[dict]:
    """gptkit's native step against its PyTorch layouts (what runs where the native kernels are not
    used) with a competing CPU-bound process on every core, at 1, 2 and 4 threads
    (torch.set_num_threads): GPT-2 small, and a model of d_model 64 (4 layers, 4 heads, GPT-2's
    vocabulary), random fp32 weights, greedy, the two alternating, medians of REPEATS with spreads."""
    import transformers

    models = (
        ("GPT-2 small", transformers.GPT2Config(), NEW // 4),
        ("d_model 64", transformers.GPT2Config(n_embd=64, n_layer=4, n_head=4), NEW),
    )
    rows, before = [], torch.get_num_threads()
    for name, config, new in models:
        folder = Path(directory) / f"contention-{config.n_embd}"
        torch.manual_seed(0)
        transformers.GPT2LMHeadModel(config).save_pretrained(folder)
        fast = decoding_layout(GPT.from_pretrained(folder))
        pytorch = without_native(lambda folder=folder: decoding_layout(GPT.from_pretrained(folder)))
        peer = "gptkit fp32 in its PyTorch layout (oneDNN-packed)"
        with competing_process() as cores:
            for threads in CONTENTION_THREADS:
                what = (
                    f"greedy new tok/s, a CPU-bound process on all {cores} cores, {name}, fp32, "
                    f"{threads} thread{'s' if threads > 1 else ''}, gptkit native step"
                )
                if fast.native_step is None:
                    rows.append(skipped(what, "tok/s", peer, "the native kernels are not used here"))
                    continue
                torch.set_num_threads(threads)
                try:
                    ours, theirs, ours_out, peer_out = measure(
                        lambda fast=fast, new=new: generate(fast, prompt, new, temperature=0),
                        lambda pytorch=pytorch, new=new: generate(pytorch, prompt, new, temperature=0),
                        new,
                    )
                except MeasurementTimeout as e:
                    rows.append(skipped(what, "tok/s", peer, f"the measurement {e}"))
                    continue
                finally:
                    torch.set_num_threads(before)
                row = spread_comparison(what, "tok/s", ours, peer, theirs)
                row |= {"threads": threads, "same_ids": bool(torch.equal(ours_out, peer_out))}
                rows.append(row)
    return rows


# torch.compile's trial -----------------------------------------------------------------------------


class StaticCacheDecoder(torch.nn.Module):
    """A GPT-2 decoding step for torch.compile: one token a row at a position given as a tensor, keys
    and values written in place into a static cache of fixed capacity, attention over the whole cache
    masked to the positions filled (fixed shapes: one graph for every step)."""

    def __init__(self, model: GPT, capacity: int):
        super().__init__()
        self.model = model
        c = model.config
        shape = (c.n_layer, 1, c.n_head, capacity, c.head_size)
        self.register_buffer("keys", torch.zeros(shape))
        self.register_buffer("values", torch.zeros(shape))
        self.register_buffer("slots", torch.arange(capacity))

    def forward(self, token: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
        """The greedy next token (1, 1) after ``token`` (1, 1) at ``position`` (1,)."""
        m, c = self.model, self.model.config
        x = m.wte(token) + m.wpe(position)[None]  # (1, 1, d)
        mask = (self.slots <= position)[None, None, None, :]  # (1, 1, 1, capacity)
        for layer, block in enumerate(m.h):
            qkv = block.attn.c_attn(block.ln_1(x)).view(1, 1, 3, c.n_head, c.head_size)
            q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # each (1, nh, 1, hs)
            self.keys[layer].index_copy_(2, position, k)
            self.values[layer].index_copy_(2, position, v)
            y = torch.nn.functional.scaled_dot_product_attention(
                q, self.keys[layer], self.values[layer], attn_mask=mask
            )
            x = x + block.attn.c_proj(y.transpose(1, 2).reshape(1, 1, c.d_model))
            x = x + block.mlp(block.ln_2(x))
        return m.output_layer(m.ln_f(x))[:, -1].argmax(-1, keepdim=True)


def gptkit_steps(model: GPT, prompt: torch.Tensor, steps: int):
    """(prefill, step) of greedy decoding through ``model`` and a KVCache."""
    from gptkit.model import KVCache

    state = {}

    def prefill() -> torch.Tensor:
        state["cache"] = KVCache(model.config, 1, prompt.size(1) + steps + 1, dtype=torch.float32)
        return model(prompt, cache=state["cache"]).logits[:, -1].argmax(-1, keepdim=True)

    def step(token: torch.Tensor) -> torch.Tensor:
        return model(token, cache=state["cache"]).logits[:, -1].argmax(-1, keepdim=True)

    return prefill, step


def compiled_steps(model: GPT, prompt: torch.Tensor, steps: int):
    """(prefill, step) of greedy decoding through torch.compile's graph of StaticCacheDecoder on the
    fp32 ``model`` in nn.Linear's layout (Inductor on the CPU, freezing on: the weights constants,
    prepacked for its products); the prompt through the model's own forward, its keys and values
    copied into the static cache."""
    from gptkit.model import KVCache

    decoder = StaticCacheDecoder(model, prompt.size(1) + steps + 1)
    compiled = torch.compile(decoder)
    state = {"position": prompt.size(1)}

    def prefill() -> torch.Tensor:
        cache = KVCache(model.config, 1, decoder.keys.size(3), dtype=torch.float32)
        logits = model(prompt, cache=cache).logits[:, -1]
        decoder.keys.copy_(cache.keys)
        decoder.values.copy_(cache.values)
        state["position"] = prompt.size(1)
        return logits.argmax(-1, keepdim=True)

    def step(token: torch.Tensor) -> torch.Tensor:
        token = compiled(token, torch.tensor([state["position"]]))
        state["position"] += 1
        return token

    return prefill, step


def timed_steps(prefill, step, steps: int) -> tuple[float, torch.Tensor]:
    """Seconds of ``steps`` greedy steps after ``prefill()`` (not timed), and the tokens (1, steps + 1)."""
    token = prefill()
    tokens = [token]
    start = time.perf_counter()
    for _ in range(steps):
        token = step(token)
        tokens.append(token)
    return time.perf_counter() - start, torch.cat(tokens, dim=1)


def compile_rows(folder: str, prompt: torch.Tensor) -> tuple[list[dict], dict]:
    """A measured trial of torch.compile (Inductor on the CPU, freezing, a static KV cache) for the
    decoding step of GPT-2 small, fp32: tokens/s of the steps alone (after the prompt) against the
    native step and against gptkit's PyTorch layouts, the three alternating, greedy ids compared.
    Returns the rows and the compilation's seconds."""
    steps = NEW - 1
    peer = "torch.compile (Inductor, freezing, static KV cache), fp32 in nn.Linear's layout"
    whats = [
        "greedy decoding-step tok/s, GPT-2 small, fp32, gptkit native step",
        "greedy decoding-step tok/s, GPT-2 small, fp32, gptkit PyTorch layout (oneDNN-packed)",
    ]
    if DEVICE != "cpu":
        return [skipped(w, "tok/s", peer, "a trial for the CPU") for w in whats], {}
    plain = GPT.from_pretrained(folder).eval().requires_grad_(False)
    fast = decoding_layout(GPT.from_pretrained(folder))
    pytorch = without_native(lambda: decoding_layout(GPT.from_pretrained(folder)))
    sides = [gptkit_steps(fast, prompt, steps), gptkit_steps(pytorch, prompt, steps)]
    previous = torch._inductor.config.freezing
    torch._inductor.config.freezing = True
    try:
        with time_limit(TIME_LIMIT_S):
            compiled = compiled_steps(plain, prompt, steps)
            start = time.perf_counter()
            timed_steps(*compiled, 1)  # compiles
            compile_s = time.perf_counter() - start
            for side in (*sides, compiled):
                timed_steps(*side, 2)  # warm-up
            seconds: list[list[float]] = [[], [], []]
            outputs = [None, None, None]
            for _ in range(REPEATS):
                for i, side in enumerate((*sides, compiled)):
                    spent, outputs[i] = timed_steps(*side, steps)
                    seconds[i].append(spent)
    except MeasurementTimeout as e:
        return [skipped(w, "tok/s", peer, f"the measurement {e}") for w in whats], {}
    except Exception as e:  # noqa: BLE001 (Inductor's failure is this trial's finding, not the run's end)
        reason = f"torch.compile failed: {type(e).__name__}: {str(e).splitlines()[0][:200]}"
        return [skipped(w, "tok/s", peer, reason) for w in whats], {}
    finally:
        torch._inductor.config.freezing = previous
    tps = [[steps / s for s in side] for side in seconds]
    rows = []
    for what, ours, out in zip(whats, tps[:2], outputs[:2]):
        row = spread_comparison(what, "tok/s", ours, peer, tps[2])
        row["same_ids"] = bool(torch.equal(out, outputs[2]))
        rows.append(row)
    return rows, {"compile_s": round(compile_s, 1), "steps": steps}


@torch.no_grad()
def main_native() -> None:
    """``--only native``: the native step's rows alone (against the PyTorch layouts, quiet and under
    contention, with bandwidth fractions; torch.compile's trial), kept as generate_throughput_native."""
    import tempfile

    import transformers

    load_before = [round(x, 2) for x in os.getloadavg()] if hasattr(os, "getloadavg") else None
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        transformers.GPT2LMHeadModel(transformers.GPT2Config()).save_pretrained(tmp)
        prompt = torch.randint(0, 50257, (1, PROMPT))
        bandwidth = memory_bandwidth()
        layout = decoding_layout(GPT.from_pretrained(tmp))
        bf16_layout = decoding_layout(GPT.from_pretrained(tmp, dtype=torch.bfloat16))
        comparisons = native_rows(tmp, prompt, layout, bf16_layout, load_int8(tmp), bandwidth)
        del layout, bf16_layout
        rows, compiled = compile_rows(tmp, prompt)
        comparisons += rows
        comparisons += contention_rows(tmp, prompt)
    emit(
        "generate_throughput_native",
        comparisons,
        device=DEVICE,
        prompt_tokens=PROMPT,
        new_tokens=NEW,
        repeats=REPEATS,
        quick=QUICK,
        memory_bandwidth_gb_s=round(bandwidth / 1e9, 1),
        load_average_before=load_before,
        torch_compile=compiled,
        native=native.report(),
    )


GPT2_PEER = "GPT2LMHeadModel (KV cache), fp32"
GPT1_PEER = "OpenAIGPTLMHeadModel (no cache), fp32"


def gpt2_format_rows(
    tmp: str, ours: GPT, prompt: torch.Tensor, peer
) -> tuple[list[dict], dict[str, torch.nn.Module | None]]:
    """(a)'s decoding rows, gptkit's formats against GPT2LMHeadModel (``peer()``): fp32 plain and in
    the decoding layout, bf16 weights plain and in it, int8 weights. Returns the rows and the models
    by format, in the rows' order (None where this device lacks the format)."""

    def versus(what: str, model, same_ids: bool) -> dict:
        row, _ = compare(what, GPT2_PEER, lambda: generate(model, prompt, NEW, temperature=0), peer, same_ids)
        return row

    def optional(what: str, unavailable: str | None, build, same_ids: bool):
        """The row of a format this device may lack (skipped, with the reason) and its model."""
        if unavailable:
            return skipped(what, "tok/s", GPT2_PEER, unavailable), None
        model = build()
        return versus(what, model, same_ids), model

    rows, models = [versus("greedy new tok/s, GPT-2 small, fp32", ours, True)], {"fp32": ours}
    on_cpu = None if DEVICE == "cpu" else "a CPU format: gptkit uses it on CPUs only"
    # What `gptkit generate` and load_for_generation run in fp32 on a CPU: the same values, in
    # the layouts the CPU streams fastest (gptkit.model.layouts.decoding_layout): the native
    # step where gptkit.native is built, else oneDNN-packed matrices.
    uses_native = DEVICE == "cpu" and native.available()
    row, models["fp32 layout"] = optional(
        "greedy new tok/s, GPT-2 small, fp32, gptkit decoding layout "
        + ("(native step)" if uses_native else "(oneDNN-packed)"),
        on_cpu,
        lambda: decoding_layout(GPT.from_pretrained(tmp)),
        True,
    )
    rows.append(row)
    models["bf16"] = GPT.from_pretrained(tmp, dtype=torch.bfloat16, device=DEVICE)
    rows.append(versus("greedy new tok/s, GPT-2 small, gptkit bf16 weights", models["bf16"], False))
    # What `gptkit generate --dtype bfloat16` runs on a CPU: packed where bf16 is native, else
    # bf16 rows a step and a prompt widened to fp32 (WideningLinear).
    packed = packs_for_onednn(torch.bfloat16, torch.device(DEVICE))
    row, models["bf16 layout"] = optional(
        "greedy new tok/s, GPT-2 small, gptkit bf16 weights, decoding layout "
        + ("(native step)" if uses_native else "(oneDNN-packed)" if packed else "(a prompt widened to fp32)"),
        None if has_decoding_layout(torch.bfloat16, torch.device(DEVICE)) else "a CPU layout",
        lambda: decoding_layout(GPT.from_pretrained(tmp, dtype=torch.bfloat16)),
        False,
    )
    rows.append(row)
    # int8 off the CPU: Int8Linear dequantizes the whole matrix, no fused kernel to measure.
    row, models["int8"] = optional(
        "greedy new tok/s, GPT-2 small, gptkit int8 weights "
        + ("(native step, 7-bit activations)" if uses_native else "(8-bit activations while decoding)"),
        on_cpu,
        lambda: load_int8(tmp),
        False,
    )
    rows.append(row)
    return rows, models


def other_runtime_rows(
    tmp: str, ours: GPT, models: dict[str, torch.nn.Module | None], prompt: torch.Tensor
) -> tuple[list[dict], dict]:
    """(a)'s rows against the other runtimes: ONNX Runtime and llama.cpp (decoding, time to first
    token), then every runtime's peak resident memory. Returns the rows and the peaks."""
    long_prompt = torch.randint(0, 50257, (1, PREFILL)).to(DEVICE)
    gptkit_formats = {  # what `gptkit generate` runs
        "fp32": models["fp32 layout"] if models["fp32 layout"] is not None else ours,
        "bf16": models["bf16 layout"] if models["bf16 layout"] is not None else models["bf16"],
        "int8": models["int8"],
    }
    rows, onnx_files = onnxruntime_rows(ours, gptkit_formats, prompt, long_prompt, tmp)
    llama_rows, gguf_files = llama_cpp_rows(ours, gptkit_formats, prompt, long_prompt, tmp)
    peer_files = {f"onnxruntime:{fmt}": path for fmt, path in onnx_files.items()}
    peer_files |= {f"llama.cpp:{fmt}": path for fmt, path in gguf_files.items()}
    rss_rows, peak_rss = peak_rss_rows(tmp, peer_files)
    return rows + llama_rows + rss_rows, peak_rss


def gpt2_rows(tmp: str) -> tuple[list[dict], float, dict]:
    """(a) GPT-2 small, its files in ``tmp``: gptkit's formats against GPT2LMHeadModel, again as
    fractions of the memory bandwidth, the native step's rows (on a CPU), the other runtimes'.
    Returns the rows, the bandwidth (bytes/s) and the peak resident memory by runtime."""
    import transformers

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

    rows, models = gpt2_format_rows(tmp, ours, prompt, peer)
    bandwidth = memory_bandwidth()
    peer_bytes = sum(  # the tied output layer once, the position table not (one row a step)
        p.numel() * p.element_size() for name, p in reference.named_parameters() if "wpe" not in name
    )
    # gpt2_format_rows gives one row a model, in the models' order.
    rows += bandwidth_rows(rows, list(models.values()), peer_bytes, bandwidth)
    if DEVICE == "cpu":
        rows += native_rows(tmp, prompt, models["fp32 layout"], models["bf16 layout"], models["int8"])
    runtime_rows, peak_rss = other_runtime_rows(tmp, ours, models, prompt)
    return rows + runtime_rows, bandwidth, peak_rss


def gpt1_rows(tmp: str) -> list[dict]:
    """(b) GPT-1, its files in ``tmp``: gptkit fp32 against OpenAIGPTLMHeadModel (no cache), and
    gptkit's bf16 weights against that same fp32 measurement."""
    import transformers

    reference = transformers.OpenAIGPTLMHeadModel(transformers.OpenAIGPTConfig()).eval().to(DEVICE)
    reference.save_pretrained(tmp)
    ours = GPT.from_pretrained(tmp, device=DEVICE)
    prompt = torch.randint(0, 40478, (1, PROMPT)).to(DEVICE)

    def peer():
        return reference.generate(
            prompt, max_new_tokens=NEW, min_new_tokens=NEW, do_sample=False, pad_token_id=0
        )

    row, peer_tps = compare(
        "greedy new tok/s, GPT-1, fp32",
        GPT1_PEER,
        lambda: generate(ours, prompt, NEW, temperature=0),
        peer,
        True,
    )
    ours_bf16 = GPT.from_pretrained(tmp, dtype=torch.bfloat16, device=DEVICE)
    what = "greedy new tok/s, GPT-1, gptkit bf16 weights"
    if peer_tps is None:
        return [row, skipped(what, "tok/s", GPT1_PEER, "the fp32 peer's measurement was skipped")]
    try:  # against the fp32 peer measured above, which is slow to run again
        bf16_tps, _, _, _ = measure(lambda: generate(ours_bf16, prompt, NEW, temperature=0), lambda: None)
        return [row, comparison(what, "tok/s", median(bf16_tps), GPT1_PEER, peer_tps)]
    except MeasurementTimeout as e:
        return [row, skipped(what, "tok/s", GPT1_PEER, f"the measurement {e}")]


@torch.no_grad()
def main() -> None:
    import tempfile

    torch.manual_seed(0)
    # Each model's files in a folder of their own, removed (and its models freed) before the next.
    with tempfile.TemporaryDirectory() as tmp:
        comparisons, bandwidth, peak_rss = gpt2_rows(tmp)
    with tempfile.TemporaryDirectory() as tmp:
        comparisons += gpt1_rows(tmp)
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
    parser.add_argument(
        "--only",
        choices=["native"],
        help="native: only the native step's rows (against the PyTorch layouts, quiet and under a "
        "competing process at 1, 2 and 4 threads; torch.compile's trial), kept as generate_throughput_native.",
    )
    parser.add_argument("--peak-rss", nargs=2, metavar=("KIND", "PATH"), help=argparse.SUPPRESS)  # a worker
    parser.add_argument("--peer-worker", metavar="SPEC", help=argparse.SUPPRESS)  # a peer's process
    args = parser.parse_args()
    if args.avx2 and os.environ.get("ATEN_CPU_CAPABILITY") != "avx2":
        # The caps are read when the libraries load: run again with them set.
        os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, **AVX2_ONLY})
    if args.quick:
        REPEATS, NEW, QUICK = 1, 32, True
    if args.peak_rss:
        peak_rss_worker(*args.peak_rss)
    elif args.peer_worker:
        peer_worker(args.peer_worker)
    elif args.only == "native":
        main_native()
    else:
        main()
