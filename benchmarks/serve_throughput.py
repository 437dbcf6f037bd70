"""Serving, the gain from batching: `gptkit serve` under 16 concurrent streaming clients against the
same requests one at a time (benchmarks/serve_peers.py compares it with the servers people run).

GPT-2-small shape, random weights, fp32, greedy, NEW_TOKENS new tokens per request. The server runs as
a subprocess on 127.0.0.1; the clients are asyncio tasks with httpx in this process.

(a) total generated tok/s of the server (CLIENTS clients, each streaming REQUESTS_PER_CLIENT requests one
    after the other) against the same kind of requests one at a time in this process, through
    transformers' GPT2LMHeadModel.generate (KV cache) and through gptkit.generate, same weights;
    the three alternate, REPEATS times, after a warm-up; medians;
(b) time to first token (median, p95) of the streamed requests under that load;
(c) the server's resident memory (VmRSS) after MEMORY_REQUESTS short requests against after its first
    MEMORY_FIRST (target: within 20%).
Each phase is bounded (PHASE_LIMIT_S); a phase that runs past it is reported as skipped.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
from common import (
    DATA,
    REPO,
    TIME_LIMIT_S,
    MeasurementTimeout,
    comparison,
    emit,
    median,
    skipped,
    spread_comparison,
    time_limit,
)

from gptkit import GPT, GPTConfig
from gptkit.generation import generate
from gptkit.testing.processes import free_port
from gptkit.tokenizer import Tokenizer

CLIENTS, REQUESTS_PER_CLIENT, NEW_TOKENS = 16, 2, 32
PEER_REQUESTS = 6  # one-at-a-time requests per repetition: a rate, so a sample of the load is enough
REPEATS = 5
MEMORY_FIRST, MEMORY_REQUESTS, MEMORY_NEW_TOKENS = 50, 500, 8
PHASE_LIMIT_S = min(TIME_LIMIT_S, 300.0)
MODEL_NAME = "gpt2-random"
EOS = 50256
PROMPTS = [  # varied lengths, so that the batch holds sequences of different lengths
    "It was a dark and stormy night, and",
    "The king said to his daughter",
    "Alice looked at the",
    "In the beginning",
    "She opened the door slowly and saw, to her great surprise, that the room",
    "Once upon a time there lived a poor miller who had a beautiful daughter",
    "The ship",
    "When the war was over, the soldiers came home to find",
]
ONE_AT_A_TIME = "one request at a time"


def build_model(directory: Path) -> None:
    """GPT-2 small with random weights and GPT-2's tokenizer files, in the Hugging Face format."""
    torch.manual_seed(0)
    GPT(GPTConfig.from_preset("gpt2")).save_pretrained(directory)
    Tokenizer.from_pretrained(DATA / "gpt2_bpe").save_pretrained(directory)


class Server:
    """`gptkit serve` in a subprocess, its output in a log file."""

    def __init__(self, model_dir: Path, log: Path):
        self.base = f"http://127.0.0.1:{free_port()}"
        self.log = log
        command = [sys.executable, "-m", "gptkit", "serve", "--model", str(model_dir)]
        command += ["--port", self.base.rsplit(":", 1)[1], "--model-name", MODEL_NAME]
        command += ["--dtype", "float32", "--device", "cpu", "--max-batch", str(CLIENTS)]
        command += ["--max-queue", "64", "--request-timeout", str(PHASE_LIMIT_S)]
        env = {key: value for key, value in os.environ.items() if key != "GPTKIT_API_KEY"}
        with open(log, "wb") as out:
            self.process = subprocess.Popen(command, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)

    def wait_ready(self, timeout: float = 180.0) -> None:
        import httpx

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"the server exited:\n{self.log.read_text()[-2000:]}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.base}/health", timeout=2).json().get("status") == "ok":
                    return
            time.sleep(0.3)
        raise RuntimeError(
            f"the server did not start within {timeout:.0f} s:\n{self.log.read_text()[-2000:]}"
        )

    def rss_mib(self) -> float:
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        raise RuntimeError("no VmRSS in /proc/PID/status")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)


async def stream_one(client, server: Server, prompt: str, max_tokens: int) -> tuple[int, float, str]:
    """One streamed greedy request: (completion tokens, seconds to the first token, its text)."""
    body = {
        "model": MODEL_NAME,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    started = time.perf_counter()
    first, tokens, text = None, None, []
    async with client.stream("POST", f"{server.base}/v1/completions", json=body) as response:
        if response.status_code != 200:
            raise RuntimeError(f"HTTP {response.status_code}: {(await response.aread())[:300]!r}")
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if "error" in chunk:
                raise RuntimeError(f"the server's stream had an error: {chunk['error']}")
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
            for choice in chunk["choices"]:
                if first is None and (choice["text"] or choice["finish_reason"]):
                    first = time.perf_counter() - started
                text.append(choice["text"])
    if tokens is None or first is None:
        raise RuntimeError("the stream ended without usage or a token")
    return tokens, first, "".join(text)


async def load(server: Server, clients: int, requests: int, max_tokens: int) -> dict:
    """``requests`` streamed requests from ``clients`` concurrent clients, each sending one after another."""
    import httpx

    results: list[tuple[int, float, str]] = []
    numbers = iter(range(requests))  # shared: each client takes the next request number when free

    async def client_loop(client) -> None:
        for i in numbers:
            results.append(await stream_one(client, server, PROMPTS[i % len(PROMPTS)], max_tokens))

    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(timeout=httpx.Timeout(PHASE_LIMIT_S), limits=limits) as client:
        started = time.perf_counter()
        await asyncio.gather(*(client_loop(client) for _ in range(clients)))
        seconds = time.perf_counter() - started
    return {
        "tokens": sum(tokens for tokens, _, _ in results),
        "seconds": seconds,
        "ttft": [first for _, first, _ in results],
    }


def run_load(server: Server, clients: int, requests: int, max_tokens: int) -> dict:
    return asyncio.run(asyncio.wait_for(load(server, clients, requests, max_tokens), PHASE_LIMIT_S))


async def first_text(server: Server, prompt: str) -> str:
    import httpx

    async with httpx.AsyncClient(timeout=httpx.Timeout(PHASE_LIMIT_S)) as client:
        return (await stream_one(client, server, prompt, NEW_TOKENS))[2]


def one_at_a_time(decode, prompts: list[list[int]]) -> tuple[float, int]:
    """Seconds and new tokens for the prompts decoded one after the other by ``decode(ids) -> new ids``."""
    started, tokens = time.perf_counter(), 0
    for ids in prompts:
        tokens += len(decode(ids))
    return time.perf_counter() - started, tokens


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def measure_memory(server: Server) -> tuple[dict, dict]:
    """(the comparison, the figures): RSS after the first MEMORY_FIRST requests and after MEMORY_REQUESTS."""
    what = f"server RSS after {MEMORY_REQUESTS} requests ({MEMORY_NEW_TOKENS} new tokens, {CLIENTS} clients)"
    peer = f"the same server after its first {MEMORY_FIRST} requests"
    try:
        run_load(server, CLIENTS, MEMORY_FIRST, MEMORY_NEW_TOKENS)
        first = server.rss_mib()
        run_load(server, CLIENTS, MEMORY_REQUESTS - MEMORY_FIRST, MEMORY_NEW_TOKENS)
        last = server.rss_mib()
    except TimeoutError:
        reason = f"the memory phase ran past its {PHASE_LIMIT_S:.0f} s limit"
        return skipped(what, "MiB", peer, reason), {"skipped": reason}
    figures = {
        f"rss_after_{MEMORY_FIRST}_requests_mib": round(first, 1),
        f"rss_after_{MEMORY_REQUESTS}_requests_mib": round(last, 1),
        "growth": round(last / first, 3),
        "within_20_percent": abs(last / first - 1) <= 0.2,
    }
    return comparison(what, "MiB", last, peer, first, higher_is_better=False), figures


@torch.no_grad()
def main() -> None:
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = Path(tmp) / "gpt2-random"
        build_model(model_dir)
        server = Server(model_dir, Path(tmp) / "server.log")
        try:
            server.wait_ready()
            report = measure(server, model_dir)
        finally:
            server.stop()
    emit("serve_throughput", **report)


def one_at_a_time_decoders(model_dir: Path) -> tuple[Callable, Callable]:
    """Greedy decoders of one request, ``decode(ids) -> new ids``, on the server's weights: the two peers,
    transformers' GPT2LMHeadModel.generate and gptkit.generate, each with its KV cache."""
    import transformers

    reference = transformers.GPT2LMHeadModel.from_pretrained(model_dir).eval()
    ours = GPT.from_pretrained(model_dir, dtype=torch.float32).eval()

    def peer_decode(ids: list[int]) -> list[int]:
        x = torch.tensor([ids])
        out = reference.generate(
            x,
            attention_mask=torch.ones_like(x),
            max_new_tokens=NEW_TOKENS,
            do_sample=False,
            use_cache=True,
            eos_token_id=EOS,
            pad_token_id=EOS,
        )
        return out[0, len(ids) :].tolist()

    def ours_decode(ids: list[int]) -> list[int]:
        return generate(ours, torch.tensor([ids]), NEW_TOKENS, temperature=0, eos_token_id=EOS)[
            0, len(ids) :
        ].tolist()

    return peer_decode, ours_decode


def serves_the_peers_greedy_text(server: Server, tokenizer: Tokenizer, peer_decode: Callable) -> bool:
    """Whether the server's greedy text for the first prompt is transformers'; the request is also the
    server's warm-up."""
    served_text = asyncio.run(first_text(server, PROMPTS[0]))
    peer_ids = peer_decode(tokenizer.encode(PROMPTS[0]))
    peer_ids = peer_ids[: peer_ids.index(EOS)] if EOS in peer_ids else peer_ids  # the server drops it
    return served_text == tokenizer.decode_text(peer_ids)


def race(server: Server, prompts: list[list[int]], peer_decode: Callable, ours_decode: Callable) -> dict:
    """REPEATS rounds, each the server under load and then both peers one request at a time (alternating,
    so drift in the machine hits all alike): each side's tok/s and the times to first token; stopped at
    the first phase that runs past PHASE_LIMIT_S, with ``skip_reason`` saying which."""
    server_tps, peer_tps, ours_tps, ttft = [], [], [], []
    skip_reason = None
    for _ in range(REPEATS):
        try:
            result = run_load(server, CLIENTS, CLIENTS * REQUESTS_PER_CLIENT, NEW_TOKENS)
        except TimeoutError:
            skip_reason = f"the server phase ran past its {PHASE_LIMIT_S:.0f} s limit"
            break
        server_tps.append(result["tokens"] / result["seconds"])
        ttft += result["ttft"]
        try:
            with time_limit(PHASE_LIMIT_S):
                seconds, tokens = one_at_a_time(peer_decode, prompts)
                peer_tps.append(tokens / seconds)
                seconds, tokens = one_at_a_time(ours_decode, prompts)
                ours_tps.append(tokens / seconds)
        except MeasurementTimeout as e:
            skip_reason = f"the one-at-a-time phase {e}"
            break
    return {
        "server": server_tps,
        "peer": peer_tps,
        "ours": ours_tps,
        "ttft": ttft,
        "skip_reason": skip_reason,
    }


def throughput_rows(raced: dict) -> list[dict]:
    """The server's tok/s against each one-at-a-time peer, or both skipped with the race's reason."""
    what = (
        f"the gain from batching: generated tok/s, {CLIENTS} streaming clients vs {ONE_AT_A_TIME}, "
        "GPT-2 small, fp32, greedy"
    )
    peers = {
        "transformers": f"transformers GPT2LMHeadModel.generate (KV cache), {ONE_AT_A_TIME}",
        "gptkit": f"gptkit.generate (KV cache), {ONE_AT_A_TIME}",
    }
    if raced["skip_reason"] is not None:
        return [skipped(what, "tok/s", peer, raced["skip_reason"]) for peer in peers.values()]
    return [
        spread_comparison(what, "tok/s", raced["server"], peers["transformers"], raced["peer"]),
        spread_comparison(what, "tok/s", raced["server"], peers["gptkit"], raced["ours"]),
    ]


def latency(raced: dict) -> dict:
    """Time to first token under load, over every streamed request the race completed."""
    ttft = raced["ttft"]
    if not ttft:
        return {"skipped": raced["skip_reason"]}
    return {
        "median_s": round(median(ttft), 4),
        "p95_s": round(percentile(ttft, 0.95), 4),
        "requests": len(ttft),
    }


def measure(server: Server, model_dir: Path) -> dict:
    """Every figure of the report, the server running."""
    memory_row, memory = measure_memory(server)  # first, so that "the first 50" are the server's first

    tokenizer = Tokenizer.from_pretrained(model_dir)
    prompts = [tokenizer.encode(PROMPTS[i % len(PROMPTS)]) for i in range(PEER_REQUESTS)]
    peer_decode, ours_decode = one_at_a_time_decoders(model_dir)
    same_text = serves_the_peers_greedy_text(server, tokenizer, peer_decode)
    ours_decode(prompts[0])  # warm-up

    raced = race(server, prompts, peer_decode, ours_decode)
    return {
        "comparisons": [*throughput_rows(raced), memory_row],
        "time_to_first_token_under_load": latency(raced),
        "memory": memory,
        "same_greedy_text_as_transformers": same_text,
        "setup": {
            "clients": CLIENTS,
            "requests_per_client": REQUESTS_PER_CLIENT,
            "new_tokens": NEW_TOKENS,
            "one_at_a_time_requests": PEER_REQUESTS,
            "repeats": REPEATS,
            "server": f"gptkit serve --max-batch {CLIENTS} --dtype float32 --device cpu",
        },
    }


if __name__ == "__main__":
    main()
