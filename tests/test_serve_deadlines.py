"""Request deadlines, on a clock the test moves: a sequence past its deadline ends with "timeout",
running or waiting, and the app answers 408 with the error object of docs/serving.md (a stream: the
object as an event, then ``[DONE]``). No test waits real seconds for a deadline.

References: the library's greedy decoding (the token a sequence made before its deadline) and the
documented error table.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import threading

import pytest
import torch

from gptkit import GPT, GPTConfig
from gptkit.generation import SamplingParams, generate
from gptkit.serve.engine import Engine, Event, GenerationRequest
from gptkit.tokenizer import Tokenizer

TIMEOUT = 2.5  # seconds on the test's clock
# docs/serving.md, "Errors": 408, `request_timeout`.
TIMEOUT_ERROR = {
    "error": {
        "message": "the request ran past the server's time limit (--request-timeout)",
        "type": "timeout",
        "param": None,
        "code": "request_timeout",
    }
}


class Clock:
    """Seconds that pass only when the test moves them."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture(scope="module")
def tokenizer(data_dir) -> Tokenizer:
    return Tokenizer.from_pretrained(data_dir / "gpt2_bpe")


@pytest.fixture(scope="module")
def model(tokenizer) -> GPT:
    torch.manual_seed(0)
    # A wide init spreads the logits: the engine's and the library's greedy choices are far from ties.
    config = GPTConfig(
        vocab_size=len(tokenizer), context_length=64, n_layer=1, n_head=1, d_model=8, init_std=0.2
    )
    return GPT(config).eval()


def test_a_sequence_past_its_deadline_ends_whether_it_runs_or_waits(model, tokenizer):
    """One row: the first sequence runs, the second waits. The deadline passes as the first token
    arrives; the running sequence ends at the next step, the waiting one without ever running."""
    clock = Clock()
    engine = Engine(model, tokenizer, max_batch=1, clock=clock)
    prompts = [tokenizer.encode("Hold the row"), tokenizer.encode("Wait for it")]
    events: dict[int, list[Event]] = {0: [], 1: []}
    ended = {0: threading.Event(), 1: threading.Event()}

    def deliver(event: Event) -> None:  # called on the engine's thread, between two steps
        events[event.index].append(event)
        if event.token_id is not None:
            clock.now = TIMEOUT + 1  # the deadline passes with the first token
        if event.error or event.finish_reason:
            ended[event.index].set()

    params = SamplingParams(max_tokens=20, temperature=0)
    requests = [GenerationRequest(i, ids, params, deliver, deadline=TIMEOUT) for i, ids in enumerate(prompts)]
    engine.start()
    try:
        engine.submit(requests)
        assert ended[0].wait(60) and ended[1].wait(60), "both sequences ended"
    finally:
        engine.stop()
    first = generate(model, torch.tensor([prompts[0]]), 1, temperature=0)[0, -1].item()
    assert first != 50256, "the first token is text, not the end of text that would end the sequence"
    assert [(e.token_id, e.error) for e in events[0]] == [(first, None), (None, "timeout")]
    assert [(e.token_id, e.error) for e in events[1]] == [(None, "timeout")]
    assert engine.prompt_tokens == len(prompts[0]), "the waiting sequence never took a row"
    assert (engine.generated_tokens, engine.finished_sequences) == (1, 0)


class LateEngine(Engine):
    """An engine whose clock jumps past every deadline as a request is queued: its sequences are
    late before they can run, whatever the machine's speed."""

    def submit(self, requests):
        self.clock.now += TIMEOUT + 1
        super().submit(requests)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_a_request_past_its_time_limit_gets_408_with_the_documented_error(model, tokenizer, stream):
    pytest.importorskip("fastapi")
    httpx = pytest.importorskip("httpx")
    from gptkit.serve.app import create_app
    from gptkit.serve.config import ServeLimits
    from gptkit.serve.models import ServedModel

    limits = ServeLimits(max_batch=1, request_timeout=TIMEOUT)
    served = ServedModel.create("tiny", model, tokenizer, limits)
    engine = LateEngine(model, tokenizer, max_batch=1, clock=Clock())
    app = create_app([dataclasses.replace(served, engine=engine)], limits=limits)
    body = {"model": "tiny", "prompt": ["slow", "slower"], "max_tokens": 20, "stream": stream}

    async def post() -> httpx.Response:
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://gptkit.test") as client:
                return await client.post("/v1/completions", json=body, timeout=60)

    response = asyncio.run(post())
    assert engine.generated_tokens == 0 and engine.prompt_tokens == 0, "no sequence ran"
    if not stream:
        assert response.status_code == 408 and response.json() == TIMEOUT_ERROR
        return
    # The stream has started (200) when the deadline passes: each choice's error is an event.
    assert response.status_code == 200
    events = [e.removeprefix("data: ") for e in response.text.split("\n\n") if e]
    assert [json.loads(e) for e in events[:-1]] == [TIMEOUT_ERROR, TIMEOUT_ERROR] and events[-1] == "[DONE]"
