#!/usr/bin/env bash
# Every benchmark in benchmarks/, on a CUDA machine: the GPU and software first (nvidia-smi, torch and
# CUDA versions), then each benchmark's JSON line, on the GPU (fp32 and bf16) where it takes a device.
#
#   benchmarks/gpu.sh [--quick] [--device-only] [--paper]
#
#   --quick        the benchmarks that have a smoke mode run it (evaluate_throughput, memory_estimate)
#   --device-only  skip the benchmarks that measure only the CPU (see below): a GPU machine's time
#                  is better spent on what needs the GPU
#   --paper        also the paper's Tables 2-3 from OpenAI's published GPT-1: `gptkit suite --init
#                  openai-gpt` on every task's full data, on the GPU, with the paper's settings; its
#                  results.md puts each score beside the paper's. Needs the weights (`gptkit download
#                  openai-gpt`, or HF_HOME holding them) and the datasets (GPTKIT_DATA, else `gptkit
#                  data fetch --all` into data/). Hours, not minutes. Written for a GPU but not yet
#                  run on one: untested there.
#   env: PYTHON (default .venv/bin/python), GPTKIT_DATA (default ../shared/data beside the checkout),
#        GPTKIT_PAPER_OUT (--paper's suite folder, default runs/gpu-paper; rerun, it continues),
#        GPTKIT_BENCH_TIME_LIMIT_S (common.py: the most one measurement may take), CUDA_VISIBLE_DEVICES
#
# Which benchmark runs where:
#   evaluate_throughput.py   --device cuda, in fp32 and in bf16 weights (skipped by the benchmark
#                            itself where the GPU has no native bf16).
#   train_throughput.py      GPTKIT_BENCH_DEVICE=cuda: both libraries train on the GPU, fp32 and bf16
#                            autocast; MFU against an 8192^3 matmul measured in the same run; peak
#                            memory is the GPU's (max_memory_allocated).
#   generate_throughput.py   GPTKIT_BENCH_DEVICE=cuda: greedy decoding on the GPU, fp32 and bf16
#                            weights, the memory-bandwidth fraction against a device copy; the CPU-only
#                            formats (the transposed fp32 layout, int8) are reported as skipped.
#   memory_estimate.py       GPTKIT_BENCH_DEVICE=cuda: `gptkit estimate --target gpu` beside the same
#                            training update run on the GPU, torch.cuda.max_memory_allocated (--quick:
#                            GPT-2 small only).
#   serve_throughput.py      no device option: it starts `gptkit serve --device cpu --dtype float32`.
#   tokenizer_throughput.py  the tokenizers run on the CPU by nature; nothing to move to a GPU.
#   prepare_throughput.py    corpus preparation is CPU work (tokenizing, writing shards) by nature.
#   scripts/gpu_checks.py    not a benchmark: what only CUDA can check (its JSON line says passed,
#                            failed or skipped and why for each), on every GPU for its multi-process
#                            checks (--nproc); it fails the script when a check fails.
# The CPU-only ones are run unchanged (their JSON records the CPU they ran on); --device-only skips
# them.
#
# Exit status: 2 when there is no CUDA device (nothing is measured); 1 when any benchmark failed (the
# others still run and print); 0 otherwise. Each JSON line is printed again together at the end.

set -uo pipefail

quick=() device_only=0 paper=0
for arg in "$@"; do
    case "$arg" in
        --quick) quick=(--quick) ;;
        --device-only) device_only=1 ;;
        --paper) paper=1 ;;
        -h | --help) sed -n '2,42p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "gpu.sh: unknown argument '$arg' (try --help)" >&2; exit 2 ;;
    esac
done

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo" || exit 2
python="${PYTHON:-.venv/bin/python}"
if ! command -v "$python" >/dev/null 2>&1 && [ ! -x "$python" ]; then
    echo "gpu.sh: no Python at '$python' (make setup, or set PYTHON)" >&2
    exit 2
fi

# No CUDA device: fail before measuring anything, saying why.
if ! command -v nvidia-smi >/dev/null 2>&1; then
    echo "gpu.sh: no CUDA device: nvidia-smi is not installed (no NVIDIA driver on this machine)" >&2
    exit 2
fi
if ! nvidia-smi; then
    echo "gpu.sh: no CUDA device: nvidia-smi found no usable GPU (see its message above)" >&2
    exit 2
fi
if ! "$python" - <<'EOF'; then
import sys

import torch

if not torch.cuda.is_available():
    sys.exit(
        f"gpu.sh: no CUDA device: torch {torch.__version__} sees none "
        f"(built for CUDA: {torch.version.cuda or 'no, a CPU-only build'})"
    )
print(
    f"torch {torch.__version__}, CUDA {torch.version.cuda}, cuDNN {torch.backends.cudnn.version()}, "
    f"{torch.cuda.device_count()} x {torch.cuda.get_device_name(0)}, "
    f"bf16 native: {torch.cuda.is_bf16_supported(including_emulation=False)}"
)
EOF
    exit 2
fi

out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
failed=()

# run NAME ARGS...: one benchmark; its progress goes to stderr, its last line (the JSON) to stdout.
run() {
    local name="$1"
    shift
    local log="$out/$name.$(ls "$out" | wc -l).out"
    echo "== $name $*" >&2
    if "$python" "benchmarks/$name.py" "$@" >"$log"; then
        tail -n 1 "$log" | tee -a "$out/all.jsonl"
    else
        echo "gpu.sh: $name $* failed (exit $?); its output:" >&2
        cat "$log" >&2
        failed+=("$name $*")
    fi
}

run evaluate_throughput --device cuda --dtype float32 "${quick[@]}"
run evaluate_throughput --device cuda --dtype bfloat16 "${quick[@]}"
GPTKIT_BENCH_DEVICE=cuda run train_throughput
GPTKIT_BENCH_DEVICE=cuda run generate_throughput
GPTKIT_BENCH_DEVICE=cuda run memory_estimate "${quick[@]}"
if [ "$device_only" = 0 ]; then
    for name in serve_throughput tokenizer_throughput prepare_throughput; do
        run "$name"
    done
fi

# What only a GPU can check (scripts/gpu_checks.py, each check under its own timeout): `gptkit
# estimate`'s device peak against max_memory_allocated (and under FSDP2 with and without CPU offload
# on 2 or more GPUs), selective checkpointing's gradients with dropout through fused attention, bf16
# and fp16 training, an FSDP2 run's sharded (DCP) checkpoint resumed on 2 CPU processes, and
# decoding and serving throughput beside transformers'. PYTHONPATH=src: gptkit need not be installed.
gpus="$("$python" -c 'import torch; print(torch.cuda.device_count())')"
echo "== gpu_checks --nproc $gpus" >&2
if PYTHONPATH="$repo/src${PYTHONPATH:+:$PYTHONPATH}" "$python" scripts/gpu_checks.py --nproc "$gpus" \
    >"$out/gpu_checks.out"; then
    tail -n 1 "$out/gpu_checks.out" | tee -a "$out/all.jsonl"
else
    echo "gpu.sh: gpu_checks failed; its output:" >&2
    cat "$out/gpu_checks.out" >&2
    failed+=("gpu_checks")
fi

# The paper's Tables 2-3: GPT-1's published weights fine-tuned on each task's full data.
if [ "$paper" = 1 ]; then
    data="${GPTKIT_DATA:-$repo/../shared/data}"
    [ -d "$data/story_cloze_2016" ] || { data="$repo/data"; "$python" -m gptkit data fetch --all --out "$data" >&2; }
    paper_out="${GPTKIT_PAPER_OUT:-runs/gpu-paper}"
    echo "== paper: gptkit suite --init openai-gpt --data-dir $data --out $paper_out --device cuda" >&2
    if "$python" -m gptkit download openai-gpt >&2 \
        && "$python" -m gptkit suite --init openai-gpt --data-dir "$data" --out "$paper_out" \
            --device cuda --no-progress >&2; then
        cat "$paper_out/results.md"
    else
        failed+=("paper suite (see above)")
    fi
fi

echo "== all JSON lines" >&2
cat "$out/all.jsonl" 2>/dev/null
if [ "${#failed[@]}" -gt 0 ]; then
    printf 'gpu.sh: failed: %s\n' "${failed[@]}" >&2
    exit 1
fi
