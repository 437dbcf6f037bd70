"""Decoding throughput on the GPU: gptkit's greedy ``generate`` with its KV cache, the server's
engine (continuous batching) with several streams at once, and transformers' GPT2LMHeadModel
``generate`` on the same random weights where transformers imports. Rows, not targets: the check's
``passed`` is null. GPT-2 small's shape (vocabulary 50257, context 1024) in fp32 on a GPU; a
two-layer GPT-2 of width 128 on the CPU stand-in.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import torch

from gptkit import GPT, GPTConfig
from gptkit.generation import SamplingParams, generate
from gptkit.testing.gpu_checks.common import Settings, synchronize, trained_tokenizer


def _seconds(run: Callable[[], Any], device: torch.device, repeats: int = 2) -> float:
    """The best of ``repeats`` timed calls after one untimed (kernels chosen, caches warm)."""
    run()
    best = float("inf")
    for _ in range(repeats):
        synchronize(device)
        started = time.perf_counter()
        run()
        synchronize(device)
        best = min(best, time.perf_counter() - started)
    return best


def _transformers_twin(model: GPT):
    """transformers' GPT2LMHeadModel holding ``model``'s weights, on its device."""
    import transformers

    from gptkit.model.weights import config_to_hf, state_dict_to_hf

    hf = {k: v for k, v in config_to_hf(model.config).items() if k != "gptkit"}
    twin = transformers.GPT2LMHeadModel(transformers.GPT2Config(**hf))
    twin.load_state_dict(state_dict_to_hf(model.config, model.state_dict()), strict=False)
    twin.tie_weights()
    return twin.to(next(model.parameters()).device).eval()


def _generate_rows(model: GPT, twin, prompt: torch.Tensor, new: int) -> dict[str, dict]:
    """gptkit's greedy decoding of ``new`` tokens after ``prompt`` (B, T), and transformers' beside
    it when there is a ``twin``: tokens per second, and whether both chose the same ids."""
    device, batch = prompt.device, prompt.size(0)
    ours = generate(model, prompt, new, temperature=0)
    seconds = _seconds(lambda: generate(model, prompt, new, temperature=0), device)
    rows = {f"gptkit generate, batch {batch}": {"tokens_per_s": round(batch * new / seconds, 1)}}
    if twin is None:
        return rows
    options = dict(max_new_tokens=new, min_new_tokens=new, do_sample=False, pad_token_id=0)
    mask = torch.ones_like(prompt)
    with torch.no_grad():
        theirs = twin.generate(prompt, attention_mask=mask, **options)
        seconds = _seconds(lambda: twin.generate(prompt, attention_mask=mask, **options), device)
    rows[f"transformers GPT2LMHeadModel.generate, batch {batch}"] = {
        "tokens_per_s": round(batch * new / seconds, 1),
        "same_greedy_ids_as_gptkit": bool(torch.equal(ours.cpu(), theirs.cpu())),
    }
    return rows


def _served(model: GPT, tokenizer, streams: int, new: int) -> float:
    """Seconds for the engine to decode ``streams`` greedy sequences of ``new`` tokens submitted at
    once (each a different prompt of 32 of the tokenizer's ids), the engine already warm."""
    from gptkit.serve.engine import Engine, GenerationRequest

    engine = Engine(model, tokenizer, max_batch=streams)
    engine.start()
    try:
        generator = torch.Generator().manual_seed(1)

        def run(count: int, tokens: int) -> None:
            done = threading.Semaphore(0)

            def deliver(event) -> None:
                if event.error is not None:
                    raise RuntimeError(f"the engine ended a sequence: {event.error}")
                if event.finish_reason is not None:
                    done.release()

            params = SamplingParams(max_tokens=tokens, temperature=0)
            prompts = torch.randint(1, len(tokenizer), (count, 32), generator=generator).tolist()
            engine.submit([GenerationRequest(i, p, params, deliver) for i, p in enumerate(prompts)])
            for _ in range(count):
                if not done.acquire(timeout=120):
                    raise RuntimeError("the engine did not finish its sequences within 120 s")

        run(1, 4)  # warm
        started = time.perf_counter()
        run(streams, new)
        return time.perf_counter() - started
    finally:
        engine.stop()


def check_decoding(settings: Settings) -> dict[str, Any]:
    """The rows of this module's docstring; the engine's needs gptkit's trained BPE (tokenizers,
    tiktoken), transformers' row needs transformers: each is skipped alone, by name."""
    device, missing = settings.torch_device, settings.missing
    small = dict(n_layer=2, n_head=2, d_model=128, context_length=128) if settings.stand_in else {}
    torch.manual_seed(0)
    model = GPT(GPTConfig.from_preset("gpt2", **small)).to(device).eval()
    new, streams = (16, 4) if settings.stand_in else (128, 8)
    twin = None if "transformers" in missing else _transformers_twin(model)
    generator, rows = torch.Generator().manual_seed(0), {}
    for batch in (1, streams):
        prompt = torch.randint(0, model.config.vocab_size, (batch, 32), generator=generator)
        rows.update(_generate_rows(model, twin, prompt.to(device), new))
    if twin is None:
        rows["transformers GPT2LMHeadModel.generate"] = {
            "skipped": f"needs transformers ({missing['transformers']})"
        }
    serve_row = f"gptkit serve engine, {streams} concurrent streams"
    lacking = [name for name in ("tokenizers", "tiktoken") if name in missing]
    if lacking:
        rows[serve_row] = {"skipped": f"needs {', '.join(lacking)} for the served tokenizer"}
    else:
        from gptkit.tokenizer import Tokenizer

        tokenizer = Tokenizer.from_pretrained(trained_tokenizer(settings.work))
        with torch.no_grad():  # greedy on random weights: end-of-text's logit 0, below the best's
            model.wte.weight[tokenizer.special_tokens["<|endoftext|>"]] = 0.0
        seconds = _served(model, tokenizer, streams, new)
        rows[serve_row] = {"tokens_per_s": round(streams * new / seconds, 1), "choosable_ids": len(tokenizer)}
    return {"passed": None, "target": "none: rows to read", "new_tokens": new, "rows": rows}
