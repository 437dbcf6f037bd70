"""`gptkit serve` against its own OpenAPI document, and killed mid-stream.

A seeded slice of the schema campaign (benchmarks/fuzz_campaign.py --server runs 2,000 requests
and more): requests schemathesis generates from GET /openapi.json, valid and invalid, with and
without the API key, all answered without a 5xx and as the document says. Then `kill -9` of a
server with 8 streams of the official openai client in flight: each stream ends with an error
within 5 s, and a server started again on the same port answers.
"""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path

import pytest
import torch

pytest.importorskip("schemathesis")
openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")

from gptkit.testing.processes import ServerProcess, free_port  # noqa: E402
from gptkit.testing.serve_schema import KEY, build_models, fuzz_served  # noqa: E402

pytestmark = pytest.mark.slow  # servers in subprocesses


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    return build_models(tmp_path_factory.mktemp("models"))


@pytest.mark.parametrize("key", [None, KEY], ids=["no key", "api key"])
def test_generated_requests_get_answers_the_document_allows(models, tmp_path, key):
    result = fuzz_served(models, 30, seed=0, key=key, log=tmp_path / "server.log")
    assert result["requests"] >= 100, result
    assert result["failures"] == 0, result["failing"]
    assert not [status for status in result["statuses"] if status.startswith("5")], result["statuses"]
    assert result["statuses"].get("200", 0) > 0 and result["statuses"].get("400", 0) > 0, result["statuses"]
    if key:
        assert result["statuses"].get("401", 0) > 0, result["statuses"]
    assert result["server_alive"]


def test_the_document_names_every_endpoint_and_its_answers(models, tmp_path):
    port = free_port()
    from gptkit.testing.serve_schema import serve_args

    server = ServerProcess(serve_args(models, port, KEY), tmp_path / "server.log")
    try:
        server.wait_ready(f"http://127.0.0.1:{port}")
        document = httpx.get(f"http://127.0.0.1:{port}/openapi.json", timeout=10).json()
    finally:
        server.kill()
    assert set(document["paths"]) == {
        "/health", "/metrics", "/v1/models", "/v1/models/{name}", "/v1/completions", "/v1/chat/completions",
        "/v1/embeddings", "/v1/classify",
    }  # fmt: skip
    completions = document["paths"]["/v1/completions"]["post"]
    assert completions["requestBody"]["content"]["application/json"]["schema"]["properties"]["model"][
        "enum"
    ] == ["tiny-lm"]
    classify = document["paths"]["/v1/classify"]["post"]
    assert classify["requestBody"]["content"]["application/json"]["schema"]["properties"]["model"][
        "enum"
    ] == ["tiny-sst"]
    assert document["security"] == [{"bearer": []}]
    assert document["paths"]["/health"]["get"]["security"] == []


@pytest.fixture(scope="module")
def long_model(tmp_path_factory, models) -> Path:
    """A language model whose context holds a stream long enough to be killed mid-way: wide enough
    that its 8,000 tokens take seconds even through the native decoding step (the tiny preset's
    took well under one, and a stream could end before the last one started)."""
    from gptkit import GPT, GPTConfig
    from gptkit.tokenizer import Tokenizer

    directory = tmp_path_factory.mktemp("long")
    tokenizer = Tokenizer.from_pretrained(models["tiny-lm"])
    torch.manual_seed(0)
    GPT(
        GPTConfig.from_preset(
            "tiny",
            vocab_size=len(tokenizer),
            context_length=8192,
            n_layer=4,
            n_head=8,
            d_model=512,
            dropout=0.0,
        )
    ).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def test_kill_9_mid_stream_ends_every_stream_with_an_error_and_a_restart_answers(long_model, tmp_path):
    port, streams = free_port(), 8
    base = f"http://127.0.0.1:{port}"
    args = ["serve", "--model", f"long={long_model}", "--host", "127.0.0.1", "--port", str(port)]
    args += [
        "--dtype",
        "float32",
        "--device",
        "cpu",
        "--max-batch",
        str(streams),
        "--max-tokens-limit",
        "8000",
    ]
    server = ServerProcess(args, tmp_path / "server.log")
    server.wait_ready(base)
    client = openai.OpenAI(base_url=f"{base}/v1", api_key="none", max_retries=0, timeout=60)
    started = threading.Barrier(streams + 1, timeout=60)
    ended: list[tuple[str, float]] = []

    def stream() -> None:
        chunks = client.completions.create(model="long", prompt="a gem", max_tokens=8000, stream=True)
        try:
            iterator = iter(chunks)
            next(iterator)  # the stream is flowing
            started.wait()
            reasons = [chunk.choices[0].finish_reason for chunk in iterator if chunk.choices]
            ended.append(("finished" if "length" in reasons else "ended early", time.monotonic()))
        except Exception as e:  # what the client raises for a connection cut mid-stream
            ended.append((type(e).__name__, time.monotonic()))

    threads = [threading.Thread(target=stream, daemon=True) for _ in range(streams)]
    for thread in threads:
        thread.start()
    try:
        started.wait()
    finally:
        killed = time.monotonic()
        server.process.send_signal(signal.SIGKILL)
        server.process.wait(10)
    for thread in threads:
        thread.join(timeout=10)
    assert len(ended) == streams, f"{streams - len(ended)} stream(s) still waiting 10 s after the kill"
    # A stream whose 8,000 tokens were all generated while the last one waited for its first (a
    # loaded machine) was whole before the kill; every other one ends with an error, none cut short
    # as if complete, and most streams were in flight.
    cut = [(kind, at) for kind, at in ended if kind != "finished"]
    assert len(cut) > streams // 2 and all(kind != "ended early" for kind, _ in cut), ended
    assert max(at - killed for _, at in cut) < 5, ended
    again = ServerProcess(args, tmp_path / "server.log")  # the same port, at once
    try:
        again.wait_ready(base, timeout=60)
        answer = client.completions.create(model="long", prompt="a gem", max_tokens=4)
        assert answer.choices[0].finish_reason == "length" and answer.usage.completion_tokens == 4
    finally:
        again.kill()
