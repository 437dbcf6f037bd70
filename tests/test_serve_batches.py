"""The server's greedy completions equal `gptkit generate`'s, one prompt at a time, whatever the batch
they are decoded in: 1, 16 and 64 concurrent requests of mixed prompt lengths, in fp32, bf16 and
int8, through the app (HTTP over ASGI) and its engine's paged cache, prompts cut into chunks across
steps. The reference is ``gptkit.generate`` on the same weights in the same precision, a prompt
alone (no batch, no paging, no chunks).
"""

from __future__ import annotations

import asyncio
import random

import pytest
import torch

from gptkit import GPT, GPTConfig, native
from gptkit.generation import generate, load_for_generation
from gptkit.tokenizer import Tokenizer

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")
pytestmark = pytest.mark.skipif(not native.available(), reason="the paged engine runs the native step")

EOS = 50256
NEW_TOKENS = 12
BATCHES = (1, 16, 64)


@pytest.fixture(scope="module")
def model_dir(data_dir, tmp_path_factory):
    directory = tmp_path_factory.mktemp("batches") / "model"
    torch.manual_seed(0)
    config = GPTConfig.from_preset("tiny", vocab_size=50257, context_length=128, dropout=0.0, init_std=0.2)
    GPT(config).save_pretrained(directory)
    Tokenizer.from_pretrained(data_dir / "gpt2_bpe").save_pretrained(directory)
    return directory


def prompts(count: int, seed: int) -> list[list[int]]:
    """Prompts of 1 to 60 token ids (their lengths mixed), none the end of text."""
    rng = random.Random(seed)
    return [[rng.randrange(EOS) for _ in range(rng.randint(1, 60))] for _ in range(count)]


def reference(model: GPT, prompt: list[int]) -> list[int]:
    out = generate(model, torch.tensor([prompt]), NEW_TOKENS, temperature=0, eos_token_id=EOS)[
        0, len(prompt) :
    ]
    out = out.tolist()
    return out[: out.index(EOS)] if EOS in out else out


async def served(app, batches: list[list[list[int]]]) -> list[list[tuple[str, int]]]:
    """Each prompt's greedy completion (text, completion tokens), a batch's requests sent at once."""
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(
            transport=transport, base_url="http://gptkit.test", timeout=300
        ) as client:

            async def one(prompt: list[int]) -> tuple[str, int]:
                body = {"model": "m", "prompt": prompt, "max_tokens": NEW_TOKENS, "temperature": 0}
                response = await client.post("/v1/completions", json=body)
                assert response.status_code == 200, response.text
                answer = response.json()
                return answer["choices"][0]["text"], answer["usage"]["completion_tokens"]

            return [await asyncio.gather(*(one(prompt) for prompt in batch)) for batch in batches]


@pytest.mark.parametrize("precision", ["float32", "bfloat16", "int8"])
def test_greedy_completions_equal_generate_alone_in_batches_of_1_16_and_64(model_dir, precision):
    from gptkit.serve.app import create_app
    from gptkit.serve.config import ServeLimits
    from gptkit.serve.models import load_model

    # A step runs 40 prompt tokens at most: the longer prompts are cut into chunks across steps.
    limits = ServeLimits(max_batch=64, max_queue=64, step_tokens=40)
    options = dict(quantize="int8") if precision == "int8" else dict(dtype=precision)
    model = load_model("m", model_dir, limits, device="cpu", **options)
    assert model.gpt.native_step is not None and model.engine.runner.chunked
    app = create_app([model], limits=limits)
    alone, _ = load_for_generation(model_dir, device="cpu", **({"dtype": "float32"} | options))
    batches = [prompts(size, seed) for seed, size in enumerate(BATCHES)]
    got = asyncio.run(served(app, batches))
    for batch, answers in zip(batches, got):
        ids = [reference(alone, prompt) for prompt in batch]
        assert answers == [(model.tokenizer.decode_text(i), len(i)) for i in ids], (
            f"{precision}, {len(batch)} at once"
        )
    # Every prompt token ran in the engine's steps (the longer prompts in several).
    assert model.engine.times.prefill_tokens == sum(len(p) for batch in batches for p in batch)
