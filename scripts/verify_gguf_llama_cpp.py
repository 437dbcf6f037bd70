"""Run gptkit's GGUF export in llama.cpp itself and compare it with gptkit: prints one JSON object.

Needs llama-cpp-python (``pip install llama-cpp-python``, which builds llama.cpp from source) besides
gptkit with its export extra. Run by hand where it is installed::

    python scripts/verify_gguf_llama_cpp.py --model runs/pretrain --out /tmp/gguf
    python scripts/verify_gguf_llama_cpp.py --model path/to/hf-gpt2 --tokenizer data/gpt2_bpe

For each type (f32, f16, bf16, q8_0: ``gptkit export --quantize``) the model is exported with :func:`gptkit.export.gguf.export_gguf`
and loaded with ``llama_cpp.Llama(logits_all=True)``; for each prompt, tokenized by gptkit:

- **tokenizer**: llama.cpp's tokenization of the prompt (from the tokenizer inside the file) equals
  gptkit's ids;
- **log-probabilities**: after the prompt is evaluated, log-softmax of llama.cpp's logits at every
  prompt position against gptkit's, at gptkit's 10 most likely next tokens of each position (the
  tail of the vocabulary, where nobody samples, is left out): the largest absolute difference;
- **greedy**: 32 new tokens, the arg-max of llama.cpp's logits fed back one at a time, against
  ``gptkit.generate(..., temperature=0)``; f32 must be identical.

Stated tolerances (max |Δ log P|): f32 0.01, f16 0.05, bf16 0.1 (3 fewer mantissa bits than f16),
q8_0 0.2. f32 is not exact because ggml's
CPU GELU reads a table indexed by the fp16-rounded input (GGML_GELU_FP16) and sums in its own
order; llama.cpp's KV cache, f16 by default, is set to f32 here so that only the weights' dtype
differs. The exit status is 1 when a check fails.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

from gptkit import GPT, Tokenizer, generate
from gptkit.export.gguf import export_gguf

PROMPTS = [
    "The meaning of life is",
    "Once upon a time, there was a little",
    "In 1492, Columbus sailed across the",
    "The capital of France is Paris. The capital of Germany is",
    "def fibonacci(n):\n    ",
]
TOLERANCES = {"f32": 0.01, "f16": 0.05, "bf16": 0.1, "q8_0": 0.2}
TOP_K = 10
GGML_TYPE_F32 = 0  # ggml's type id for float32, stable across versions (ggml.h)


def log_softmax(logits: np.ndarray) -> np.ndarray:
    logits = logits.astype(np.float64)
    shifted = logits - logits.max(-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))


def gptkit_reference(model: GPT, ids: list[int], new_tokens: int) -> dict:
    """gptkit's log-probabilities at every prompt position and its greedy continuation."""
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].numpy()
    continuation = generate(model, torch.tensor([ids]), new_tokens, temperature=0)[0, len(ids) :].tolist()
    return {"log_probs": log_softmax(logits), "greedy": continuation}


def llama_cpp_run(llm, ids: list[int], new_tokens: int) -> dict:
    """llama.cpp's log-probabilities at every prompt position, and its greedy continuation."""
    llm.reset()
    llm.eval(ids)
    log_probs = log_softmax(np.array(llm.scores[: len(ids)]))  # logits_all: one row per token
    continuation = []
    for _ in range(new_tokens):
        next_id = int(np.argmax(llm.scores[llm.n_tokens - 1]))
        continuation.append(next_id)
        llm.eval([next_id])
    return {"log_probs": log_probs, "greedy": continuation}


def compare(reference: dict, got: dict) -> dict:
    top = np.argsort(-reference["log_probs"], axis=-1)[:, :TOP_K]
    difference = np.abs(
        np.take_along_axis(got["log_probs"], top, -1) - np.take_along_axis(reference["log_probs"], top, -1)
    )
    matching = 0
    for ours, theirs in zip(reference["greedy"], got["greedy"]):
        if ours != theirs:
            break
        matching += 1
    return {
        "max_abs_log_prob_diff": float(difference.max()),
        "greedy_identical": got["greedy"] == reference["greedy"],
        "greedy_matching_prefix": matching,
    }


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="A gptkit or Hugging Face GPT-2 model directory.")
    parser.add_argument("--tokenizer", help="Tokenizer directory (default: the model directory).")
    parser.add_argument("--out", help="Where to write the .gguf files (default: a temporary directory).")
    parser.add_argument("--new-tokens", type=int, default=32, help="Greedy tokens per prompt (default: 32).")
    parser.add_argument("--threads", type=int, default=None, help="llama.cpp's threads (default: its own).")
    return parser.parse_args()


def verify_type(llm, path: Path, dtype: str, prompts: dict, references: dict, new_tokens: int) -> dict:
    """One exported type in llama.cpp against gptkit, prompt by prompt, and whether it passes."""
    tolerance = TOLERANCES[dtype]
    per_prompt = []
    for prompt, ids in prompts.items():
        row = compare(references[prompt], llama_cpp_run(llm, ids, new_tokens))
        row["tokenizer_agrees"] = llm.tokenize(prompt.encode("utf-8"), add_bos=False, special=False) == ids
        per_prompt.append({"prompt": prompt, **row})
    worst = max(row["max_abs_log_prob_diff"] for row in per_prompt)
    ok = worst <= tolerance and all(row["tokenizer_agrees"] for row in per_prompt)
    if dtype == "f32":
        ok = ok and all(row["greedy_identical"] for row in per_prompt)
    return {
        "file_bytes": path.stat().st_size,
        "max_abs_log_prob_diff": worst,
        "tolerance": tolerance,
        "greedy_identical": sum(row["greedy_identical"] for row in per_prompt),
        "prompts": per_prompt,
        "pass": ok,
    }


def main() -> int:
    args = parse_args()
    try:
        import llama_cpp
    except ImportError:
        print("needs llama-cpp-python: pip install llama-cpp-python (builds llama.cpp)", file=sys.stderr)
        return 2

    model = GPT.from_pretrained(args.model)
    tokenizer = Tokenizer.from_pretrained(args.tokenizer or args.model)
    prompts = {prompt: tokenizer.encode(prompt) for prompt in PROMPTS}
    references = {prompt: gptkit_reference(model, ids, args.new_tokens) for prompt, ids in prompts.items()}
    out = Path(args.out or tempfile.mkdtemp(prefix="gptkit-gguf-"))
    results = {}
    for dtype in TOLERANCES:
        path = export_gguf(model, tokenizer, out / f"model-{dtype}.gguf", quantize=dtype)
        llm = llama_cpp.Llama(
            model_path=str(path),
            n_ctx=model.config.context_length,
            logits_all=True,
            n_threads=args.threads,
            type_k=GGML_TYPE_F32,
            type_v=GGML_TYPE_F32,
            verbose=False,
        )
        results[dtype] = verify_type(llm, path, dtype, prompts, references, args.new_tokens)
        del llm  # one llama.cpp model in memory at a time
    passed = all(result["pass"] for result in results.values())
    report = {
        "check": "gguf_llama_cpp",
        "model": str(args.model),
        "llama_cpp_python": getattr(llama_cpp, "__version__", "unknown"),
        "new_tokens": args.new_tokens,
        "top_k_compared": TOP_K,
        "results": results,
        "pass": passed,
    }
    print(json.dumps(report))
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
