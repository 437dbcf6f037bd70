"""Serving against the servers people run: `gptkit serve` beside `transformers serve --continuous-batching`
and llama.cpp's `llama-server`, same model, same CPU, same load, in one run.

The model: GPT-2 small's shape, random weights (torch.manual_seed(0)), GPT-2's tokenizer, written as
serve_throughput.py writes it; llama-server reads the GGUF files `gptkit export` writes from it (f32,
bf16, q8_0). Precisions, each server at the same one: fp32 (gptkit float32, transformers float32,
llama-server f32), bf16 (bfloat16, bfloat16, bf16) and int8 (gptkit --quantize int8, llama-server q8_0).

The load, the same for every server: streamed greedy `/v1/completions` (temperature 0, max_tokens
NEW_TOKENS, usage asked for with stream_options), serve_throughput.py's PROMPTS (mixed lengths), from
1, 16 and 64 concurrent clients, each sending REQUESTS_PER_CLIENT requests one after another on its own
keep-alive HTTP/1.1 connection (opened again where the server closed it: llama-server does after every
stream; `reconnects` counts them). A server with a field for it is asked to ignore the end-of-text token
(llama-server's ignore_eos); gptkit has none and transformers has none in this API (with no
generation_config.json in the folder its continuous batching disables EOS itself): a request's tokens
are its usage's completion_tokens, else its chunks, so an early stop counts only what was generated
(`stopped_early` per server says how often). The load generator is this process: raw asyncio streams, the
requests encoded beforehand, the hot loop only splitting `data:` lines and time-stamping each HTTP chunk;
the JSON is parsed after the round. Its CPU time per round (time.process_time) over the round's wall time
is recorded (`client_cpu_fraction`).

The steady-state window of a round runs from the moment every client has received its first token to
the moment the first client has received its last request's last token: inside it every client is either
receiving tokens or between two of its requests (which is serving too), so warm-up (clients still
waiting for their first token) and ramp-down (clients already done) are left out; the whole round's
wall time would count a batching server's ramp (a lone straggler decoding at batch 1) against it. A
request's tokens are
stamped with its chunks' arrival times (spread evenly over its text chunks where chunks and tokens
differ); generated tok/s = tokens stamped in (start, end] / (end - start). Time to first token is over
every request of every round (median, p95). Peak RSS is VmHWM of the server's process tree, read after
its last round at that load (each load starts the servers afresh, llama-server's --parallel being the
load's client count). transformers' continuous batching, at its --cb-* defaults, sizes its KV cache from
the free memory of the device, on a CPU the host's: its RSS is that choice, not the model's needs.

Rounds: for each precision and load the servers are started together (one at a time, each stopped with
SIGSTOP once ready), each warmed up with WARMUP_REQUESTS_PER_CLIENT requests per client at that load,
then ROUNDS rounds run each server once in an order rotated each round, only the server under load
continued (SIGCONT), the others stopped. os.getloadavg() at the start and at each round's start.
gptkit's GET /metrics is read before and after each of its rounds: the deltas of every `gptkit_engine*`
sample. A server that does not start within START_LIMIT_S, or a round past ROUND_LIMIT_S, skips that
server's rows at that load with the reason; every server is killed at the end, errors or not. llama-server
is built by llama_server.py (the llama.cpp of the pinned llama-cpp-python, cached); where that cannot
be, its rows say why. On CPUs where llama.cpp's repacked (extra buffer type) q8_0 product crashes
(AMX), llama-server killed by a signal while starting or warming up is started again with --no-repack
and its rows say so; only then.

    python benchmarks/serve_peers.py [--precisions fp32,bf16,int8] [--loads 1,16,64] [--rounds 5]
        [--servers gptkit,transformers,llama] [--out FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from common import REPO, TIME_LIMIT_S, comparison, emit, median, skipped
from llama_server import LlamaServerUnavailable, llama_server, pinned_version
from serve_throughput import MODEL_NAME, PROMPTS, build_model, percentile

from gptkit.testing.processes import free_port

LOADS = (1, 16, 64)
REQUESTS_PER_CLIENT = {1: 8, 16: 4, 64: 3}
WARMUP_REQUESTS_PER_CLIENT = {1: 2, 16: 1, 64: 1}
NEW_TOKENS = 32
ROUNDS = 5
START_LIMIT_S = 300.0
ROUND_LIMIT_S = min(TIME_LIMIT_S, 600.0)
EXPORT_LIMIT_S = 300.0
# llama-server's context per slot (-c is this times --parallel): the longest prompt (16 tokens) and
# NEW_TOKENS fit; llama.cpp pads a slot's context up to a multiple of 256 in any case.
SLOT_CONTEXT = 256
CORES = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
SERVERS = ("gptkit", "transformers", "llama")
# precision: (gptkit's flags, transformers' --dtype or None, llama-server's GGUF type)
PRECISIONS = {
    "fp32": (["--dtype", "float32"], "float32", "f32"),
    "bf16": (["--dtype", "bfloat16"], "bfloat16", "bf16"),
    "int8": (["--dtype", "float32", "--quantize", "int8"], None, "q8_0"),
}
NO_REPACK = "--no-repack"
# Each server runs at its own default threads (all cores): no thread-count variable of ours reaches it.
DROPPED_ENV = ("GPTKIT_API_KEY", "OMP_NUM_THREADS", "MKL_NUM_THREADS")


@dataclass
class Spec:
    """How one server runs: its command (less --host/--port), the label its rows carry, what its
    requests say beyond the common fields."""

    name: str
    command: list[str]
    label: str
    body: dict
    metrics: bool = False  # gptkit's /metrics are scraped around its rounds
    crashed_without_repack: str | None = None  # llama-server: why it runs with --no-repack
    fallback: Spec | None = None  # llama-server: the same with --no-repack, should it crash without


@dataclass
class Outcome:
    """One server's figures at one precision and load."""

    spec: Spec
    rounds: list[dict] = field(default_factory=list)
    ttft: list[float] = field(default_factory=list)
    rss_mib: float | None = None
    skipped: str | None = None


# ---- the servers' commands ----------------------------------------------------------------------------


def gptkit_spec(model_dir: Path, precision: str, clients: int) -> Spec:
    flags = [*PRECISIONS[precision][0], "--device", "cpu", "--max-batch", str(clients)]
    flags += ["--max-queue", str(max(64, clients)), "--request-timeout", str(ROUND_LIMIT_S)]
    command = [sys.executable, "-m", "gptkit", "serve", "--model", str(model_dir), "--model-name", MODEL_NAME]
    label = "gptkit serve " + " ".join(flags)
    return Spec("gptkit", command + flags, label, {"model": MODEL_NAME}, metrics=True)


def transformers_spec(model_dir: Path, precision: str) -> Spec:
    import transformers

    flags = ["--continuous-batching", "--device", "cpu", "--dtype", PRECISIONS[precision][1]]
    command = [str(Path(sys.executable).with_name("transformers")), "serve", str(model_dir), *flags]
    label = (
        f"transformers serve MODEL_DIR {' '.join(flags)} (--cb-* at their defaults, transformers "
        f"{transformers.__version__})"
    )
    # A server pinned to a model answers requests naming it as it was given, or naming none.
    return Spec("transformers", command, label, {"model": str(model_dir)})


def llama_spec(binary: Path, gguf: Path, precision: str, clients: int, no_repack: bool = False) -> Spec:
    flags = ["-t", str(CORES), "--parallel", str(clients), "-c", str(SLOT_CONTEXT * clients)]
    flags += ["--cont-batching"]
    flags += [NO_REPACK] if no_repack else []
    command = [str(binary), "-m", str(gguf), *flags, "-a", MODEL_NAME]
    label = (
        f"llama-server -m {gguf.name} {' '.join(flags)} (the llama.cpp of llama-cpp-python "
        f"{pinned_version()}, built with GGML_NATIVE=ON; prompt cache at its default)"
    )
    spec = Spec("llama", command, label, {"model": MODEL_NAME, "ignore_eos": True})
    if not no_repack:
        spec.fallback = llama_spec(binary, gguf, precision, clients, no_repack=True)
    return spec


def specs_for(precision: str, clients: int, servers: list[str], model_dir: Path, llama: dict) -> list:
    """The servers of ``precision`` at ``clients``: Specs, or (name, label, reason) where one cannot run."""
    found: list = []
    if "gptkit" in servers:
        found.append(gptkit_spec(model_dir, precision, clients))
    if "transformers" in servers and PRECISIONS[precision][1] is not None:
        found.append(transformers_spec(model_dir, precision))
    if "llama" in servers:
        gguf_type = PRECISIONS[precision][2]
        if "skipped" in llama:
            found.append(("llama", f"llama-server on a {gguf_type} GGUF file", llama["skipped"]))
        else:
            found.append(llama_spec(Path(llama["binary"]), llama["ggufs"][gguf_type], precision, clients))
    return found


# ---- the load generator ---------------------------------------------------------------------------------


def request_bytes(port: int, body: dict) -> bytes:
    payload = json.dumps(body).encode()
    head = (
        f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
        f"Accept: text/event-stream\r\nContent-Length: {len(payload)}\r\n\r\n"
    )
    return head.encode() + payload


def client_requests(spec: Spec, port: int, clients: int, per_client: int) -> list[list[bytes]]:
    """Each client's requests, encoded: the same prompts in the same order for every server."""
    common = {"max_tokens": NEW_TOKENS, "temperature": 0, "stream": True}
    common["stream_options"] = {"include_usage": True}
    prompt = [
        [PROMPTS[(c * per_client + r) % len(PROMPTS)] for r in range(per_client)] for c in range(clients)
    ]
    return [[request_bytes(port, {**spec.body, **common, "prompt": p}) for p in mine] for mine in prompt]


async def exchange(reader, writer, request: bytes) -> tuple[list[tuple[float, bytes]], bool] | None:
    """One request on an open connection: its `data:` payloads with their arrival times, and whether the
    connection stays open; None where the server had closed the connection."""
    try:
        writer.write(request)
        await writer.drain()
        status = await reader.readline()
    except (ConnectionResetError, BrokenPipeError):
        return None
    if not status:
        return None
    headers = {}
    while (line := await reader.readline()) not in (b"\r\n", b"\n", b""):
        name, _, value = line.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip().lower()
    if not status.startswith(b"HTTP/1.1 200"):
        raise RuntimeError(
            f"HTTP {status.decode('latin-1').strip()}: {(await read_body(reader, headers))[:300]!r}"
        )
    events: list[tuple[float, bytes]] = []
    pending = b""
    async for chunk in body_chunks(reader, headers):
        stamp = time.perf_counter()
        pending += chunk
        *lines, pending = pending.split(b"\n")
        events += [(stamp, line[5:].strip()) for line in lines if line.startswith(b"data:")]
    if pending.startswith(b"data:"):
        events.append((time.perf_counter(), pending[5:].strip()))
    return events, headers.get("connection") != "close"


async def body_chunks(reader, headers: dict):
    """The response body as it arrives: HTTP chunks, a Content-Length's bytes, or what comes until close."""
    if headers.get("transfer-encoding") == "chunked":
        while size := int((await reader.readline()).split(b";")[0], 16):
            yield await reader.readexactly(size)
            await reader.readexactly(2)
        while (await reader.readline()) not in (b"\r\n", b"\n", b""):  # trailers
            pass
    elif "content-length" in headers:
        yield await reader.readexactly(int(headers["content-length"]))
    else:
        while data := await reader.read(65536):
            yield data


async def read_body(reader, headers: dict) -> bytes:
    return b"".join([chunk async for chunk in body_chunks(reader, headers)])


async def client(port: int, requests: list[bytes]) -> list[dict]:
    """One client: its requests one after another on a keep-alive connection, opened again where the
    server closed it after a response (llama-server does after a stream, whatever its Keep-Alive says)."""
    connection, done = None, []
    try:
        for request in requests:
            reused = connection is not None
            connection = connection or await asyncio.open_connection("127.0.0.1", port)
            sent = time.perf_counter()
            answer = await exchange(*connection, request)
            retried = answer is None and reused
            if retried:  # closed before answering: as HTTP clients do, once again
                connection[1].close()
                connection = await asyncio.open_connection("127.0.0.1", port)
                sent = time.perf_counter()
                answer = await exchange(*connection, request)
            if answer is None:
                raise RuntimeError("the server closed a new connection without answering")
            events, keep = answer
            done.append({"sent": sent, "events": events, "reconnected": retried})
            if not keep:
                connection[1].close()
                connection = None
    finally:
        if connection is not None:
            connection[1].close()
    return done


def drive(port: int, requests: list[list[bytes]]) -> tuple[list[list[dict]], float, float]:
    """Every client at once: (each client's requests, the round's wall seconds, this process's CPU seconds)."""

    async def everyone():
        return await asyncio.gather(*(client(port, mine) for mine in requests))

    cpu, started = time.process_time(), time.perf_counter()
    done = asyncio.run(asyncio.wait_for(everyone(), ROUND_LIMIT_S))
    return done, time.perf_counter() - started, time.process_time() - cpu


# ---- what a round measured ------------------------------------------------------------------------------


def parse_request(request: dict) -> dict:
    """A streamed request's figures: its tokens' arrival times, its time to first token, its tokens."""
    text_stamps, tokens, last = [], None, request["sent"]
    for stamp, payload in request["events"]:
        if payload == b"[DONE]":
            continue
        chunk = json.loads(payload)
        if "error" in chunk:
            raise RuntimeError(f"the stream had an error: {str(chunk['error'])[:300]}")
        last = stamp
        if any(choice.get("text") for choice in chunk.get("choices") or []):
            text_stamps.append(stamp)
        if chunk.get("usage"):
            tokens = chunk["usage"]["completion_tokens"]
    tokens = len(text_stamps) if tokens is None else tokens
    stamps = spread(text_stamps or [last], tokens)
    first = text_stamps[0] if text_stamps else last
    return {
        "stamps": stamps,
        "ttft": first - request["sent"],
        "tokens": tokens,
        "first": first,
        "last": stamps[-1] if stamps else last,
    }


def spread(chunks: list[float], tokens: int) -> list[float]:
    """``tokens`` time stamps over the chunks' (one each where they are as many; else evenly, the last
    token on the last chunk)."""
    if tokens == len(chunks):
        return chunks
    return [chunks[-(-(i + 1) * len(chunks) // tokens) - 1] for i in range(tokens)]


def round_figures(done: list[list[dict]], wall_s: float, cpu_s: float) -> dict:
    """The steady-state window's tok/s (module docstring), the requests' times to first token, and the
    load generator's CPU time against the round's wall time."""
    clients = [[parse_request(request) for request in mine] for mine in done]
    start = max(mine[0]["first"] for mine in clients)
    end = min(mine[-1]["last"] for mine in clients)
    requests = [request for mine in clients for request in mine]
    figures = {
        "wall_s": round(wall_s, 3),
        "client_cpu_s": round(cpu_s, 3),
        "client_cpu_fraction": round(cpu_s / wall_s, 4),
        "requests": len(requests),
        "tokens": sum(r["tokens"] for r in requests),
        "stopped_early": sum(r["tokens"] < NEW_TOKENS for r in requests),
        # requests sent again on a new connection, the server having closed the kept-alive one
        "reconnects": sum(request["reconnected"] for mine in done for request in mine),
        "ttft": [round(r["ttft"], 4) for r in requests],
    }
    if end <= start:
        return figures | {"skipped": "no steady-state window: a client finished before the last one began"}
    in_window = sum(start < stamp <= end for r in requests for stamp in r["stamps"])
    window = {"window_s": round(end - start, 3), "window_tokens": in_window}
    return figures | window | {"tok_s": round(in_window / (end - start), 3)}


# ---- gptkit's /metrics ----------------------------------------------------------------------------------

SAMPLE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(\{.*\})?\s+(\S+)(?:\s+\S+)?$")


def engine_samples(port: int) -> dict[str, float]:
    """Every sample of GET /metrics whose name starts with gptkit_engine, labelled or not."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    samples = {}
    for line in text.splitlines():
        found = SAMPLE.match(line.strip())
        if found and found.group(1).startswith("gptkit_engine"):
            samples[found.group(1) + (found.group(2) or "")] = float(found.group(3))
    return samples


def deltas(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {name: round(value - before.get(name, 0.0), 6) for name, value in after.items()}


# ---- the server processes -------------------------------------------------------------------------------


class ServerFailed(Exception):
    """A server that did not start, crashed, or ran past a limit; the message says which."""


class Server:
    """A server on 127.0.0.1 in a process group of its own (stopped and continued as one), its output in
    a log file."""

    def __init__(self, spec: Spec, log_dir: Path):
        self.spec, self.port = spec, free_port()
        self.log = log_dir / f"{spec.name}-{self.port}.log"
        env = {key: value for key, value in os.environ.items() if key not in DROPPED_ENV}
        env["HF_HUB_OFFLINE"] = "1"  # transformers: the model is a local folder, nothing to fetch
        command = [*spec.command, "--host", "127.0.0.1", "--port", str(self.port)]
        with open(self.log, "wb") as out:
            self.process = subprocess.Popen(
                command, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )

    def wait_ready(self) -> None:
        deadline = time.monotonic() + START_LIMIT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise ServerFailed(self.exit_reason())
            with contextlib.suppress(OSError):  # not listening yet, or 503 while it loads
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=5) as answer:
                    if answer.status == 200:
                        return
            time.sleep(0.3)
        raise ServerFailed(f"{self.spec.name} did not start within {START_LIMIT_S:.0f} s")

    def exit_reason(self) -> str:
        code = self.process.returncode
        how = f"signal {signal.Signals(-code).name}" if code < 0 else f"exit status {code}"
        tail = " | ".join(self.log.read_text(errors="replace").strip().splitlines()[-3:])
        return f"{self.spec.name} died ({how}): {tail[-600:]}"

    def failure(self, error: BaseException) -> str:
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(2)
        alive = self.process.poll() is None
        return f"{type(error).__name__}: {error}"[:600] if alive else self.exit_reason()

    def send(self, number: int) -> None:
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, number)

    def peak_rss_mib(self) -> float:
        """VmHWM of the process and every process under it, summed."""
        pids, total_kib = [self.process.pid], 0
        while pids:
            pid = pids.pop()
            with contextlib.suppress(OSError):
                for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                    if line.startswith("VmHWM:"):
                        total_kib += int(line.split()[1])
                for children in Path(f"/proc/{pid}/task").glob("*/children"):
                    pids += [int(child) for child in children.read_text().split()]
        return round(total_kib / 1024, 1)

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGCONT)
            os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(15)
        except subprocess.TimeoutExpired:
            pass
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)  # whatever of its group is left
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(10)


def run_round(server: Server, clients: int, per_client: int) -> dict:
    """``clients`` clients sending ``per_client`` requests each to the (running) server: the figures."""
    requests = client_requests(server.spec, server.port, clients, per_client)
    try:
        before = engine_samples(server.port) if server.spec.metrics else None
        done, wall_s, cpu_s = drive(server.port, requests)
        figures = round_figures(done, wall_s, cpu_s)
        if before is not None:
            figures["engine_metrics"] = deltas(before, engine_samples(server.port))
    except TimeoutError:
        raise ServerFailed(f"a round ran past its {ROUND_LIMIT_S:.0f} s limit") from None
    except (OSError, RuntimeError, ValueError, KeyError, asyncio.IncompleteReadError) as e:
        raise ServerFailed(server.failure(e)) from None
    return figures


def launch(spec: Spec, clients: int, log_dir: Path) -> Server:
    """The server started, warmed up at this load, and stopped (SIGSTOP) until its rounds."""
    server = Server(spec, log_dir)
    try:
        server.wait_ready()
        run_round(server, clients, WARMUP_REQUESTS_PER_CLIENT[clients])
        server.send(signal.SIGSTOP)
    except BaseException:
        server.kill()
        raise
    return server


def start(outcome: Outcome, clients: int, log_dir: Path) -> Server | None:
    """``outcome``'s server launched; None, with ``outcome.skipped`` saying why, where it cannot be.
    llama-server killed by a signal is launched again with --no-repack (its spec's fallback)."""
    try:
        return launch(outcome.spec, clients, log_dir)
    except ServerFailed as e:
        crashed = outcome.spec.name == "llama" and " died (signal " in str(e)
        if not crashed or outcome.spec.fallback is None:
            outcome.skipped = str(e)
            return None
        outcome.spec = outcome.spec.fallback
        outcome.spec.crashed_without_repack = str(e)
        outcome.spec.label += f"; {NO_REPACK} because without it {str(e).split(':')[0]} on start"
    try:
        return launch(outcome.spec, clients, log_dir)
    except ServerFailed as e:
        outcome.skipped = f"with {NO_REPACK} too: {e}"
        return None


def load_average() -> list[float] | None:
    return [round(x, 2) for x in os.getloadavg()] if hasattr(os, "getloadavg") else None


def rounds_of(outcomes: list[Outcome], servers: dict[str, Server], clients: int, rounds: int) -> list[dict]:
    """``rounds`` rounds, each running every live server once (the order rotated each round), only the
    one under load continued: each round's order and load average; the figures go to the outcomes."""
    records = []
    for number in range(1, rounds + 1):
        live = [o for o in outcomes if o.skipped is None]
        shift = (number - 1) % max(1, len(live))
        order = live[shift:] + live[:shift]
        records.append(
            {"round": number, "load_average": load_average(), "order": [o.spec.name for o in order]}
        )
        for outcome in order:
            server = servers[outcome.spec.name]
            server.send(signal.SIGCONT)
            try:
                figures = run_round(server, clients, REQUESTS_PER_CLIENT[clients])
            except ServerFailed as e:
                outcome.skipped = f"round {number}: {e}"
                server.kill()
                continue
            server.send(signal.SIGSTOP)
            outcome.ttft += figures.pop("ttft")
            outcome.rounds.append({"round": number, **figures})
    return records


def measure_load(precision: str, clients: int, args, model_dir: Path, llama: dict, log_dir: Path) -> dict:
    """Every server of ``precision`` at ``clients`` clients: started, warmed up, raced, killed."""
    outcomes, servers = [], {}
    try:
        for spec in specs_for(precision, clients, args.servers, model_dir, llama):
            if isinstance(spec, tuple):
                name, label, reason = spec
                outcomes.append(Outcome(Spec(name, [], label, {}), skipped=reason))
                continue
            outcomes.append(Outcome(spec))
            server = start(outcomes[-1], clients, log_dir)
            if server is not None:
                servers[spec.name] = server
        records = rounds_of(outcomes, servers, clients, args.rounds)
        for outcome in outcomes:
            if outcome.skipped is None:
                outcome.rss_mib = servers[outcome.spec.name].peak_rss_mib()
    finally:
        for server in servers.values():
            server.kill()
    return {"precision": precision, "clients": clients, "outcomes": outcomes, "rounds": records}


# ---- the report -----------------------------------------------------------------------------------------


def tok_s(outcome: Outcome) -> list[float]:
    return [r["tok_s"] for r in outcome.rounds if "tok_s" in r]


def ttft(outcome: Outcome) -> dict | None:
    if not outcome.ttft:
        return None
    return {"median": round(median(outcome.ttft), 4), "p95": round(percentile(outcome.ttft, 0.95), 4)}


def summary(outcome: Outcome) -> dict:
    """One server's figures at one precision and load, as the JSON keeps them."""
    rates = tok_s(outcome)
    found: dict = {"command": outcome.spec.label}
    if outcome.skipped is not None:
        found["skipped"] = outcome.skipped
    if outcome.spec.crashed_without_repack:
        found["crashed_without_repack"] = outcome.spec.crashed_without_repack
    if rates:
        found["tok_s"] = {"median": round(median(rates), 3), "min": min(rates), "max": max(rates)}
    found |= {"ttft_s": ttft(outcome), "requests": len(outcome.ttft), "peak_rss_mib": outcome.rss_mib}
    found["stopped_early"] = sum(r["stopped_early"] for r in outcome.rounds)
    found["rounds"] = outcome.rounds
    return found


def rows(group: dict) -> list[dict]:
    """gptkit against each peer at this precision and load: tok/s (ratio gptkit/peer), TTFT, peak RSS."""
    by_name = {o.spec.name: o for o in group["outcomes"]}
    ours = by_name.get("gptkit")
    if ours is None:
        return []
    clients, precision = group["clients"], group["precision"]
    what = f"generated tok/s, {clients} streaming client{'s' * (clients > 1)}, GPT-2 small, {precision}, "
    what += f"greedy, {NEW_TOKENS} new tokens, steady state"
    found = []
    for peer in (o for o in group["outcomes"] if o is not ours):
        reason = next(
            (f"{o.spec.name}: {o.skipped or 'no round had a steady-state window'}" for o in (ours, peer)
             if o.skipped is not None or not tok_s(o)),
            None,
        )  # fmt: skip
        if reason is not None:
            found.append(skipped(what, "tok/s", peer.spec.label, reason) | {"ours_server": ours.spec.label})
            continue
        row = comparison(what, "tok/s", median(tok_s(ours)), peer.spec.label, median(tok_s(peer)))
        row["ours_spread"] = [min(tok_s(ours)), max(tok_s(ours))]
        row["peer_spread"] = [min(tok_s(peer)), max(tok_s(peer))]
        row["ours_server"] = ours.spec.label
        row["ttft_s"] = {"ours": ttft(ours), "peer": ttft(peer)}
        row["peak_rss_mib"] = {"ours": ours.rss_mib, "peer": peer.rss_mib}
        found.append(row)
    return found


def prepare_llama(servers: list[str], precisions: list[str], model_dir: Path, folder: Path) -> dict:
    """llama-server (built or cached) and the GGUF files of the precisions; {"skipped": why} where not."""
    if "llama" not in servers:
        return {"skipped": "not asked for (--servers)"}
    try:
        binary, about = llama_server()
    except LlamaServerUnavailable as e:
        return {"skipped": str(e)}
    ggufs = {}
    for precision in precisions:
        kind = PRECISIONS[precision][2]
        path = folder / f"{MODEL_NAME}-{kind}.gguf"
        command = [sys.executable, "-m", "gptkit", "export", str(model_dir), str(path), "--quantize", kind]
        try:
            subprocess.run(
                command, cwd=REPO, capture_output=True, text=True, timeout=EXPORT_LIMIT_S, check=True
            )
        except subprocess.TimeoutExpired:
            return about | {"skipped": f"gptkit export --quantize {kind} ran past {EXPORT_LIMIT_S:.0f} s"}
        except subprocess.CalledProcessError as e:
            return about | {"skipped": f"gptkit export --quantize {kind} failed: {e.stderr.strip()[-300:]}"}
        ggufs[kind] = path
    return about | {"ggufs": ggufs}


def source_state() -> dict:
    """The commit measured, whether src/ differed from it, and the newest source file's time (a tree
    edited during the run shows as a change between two groups)."""
    git = ["git", "-C", str(REPO)]
    newest = max(
        (p.stat().st_mtime for p in (REPO / "src").rglob("*") if p.suffix in (".py", ".cpp", ".h")),
        default=0.0,
    )
    found = {"commit": None, "src_modified": None, "src_newest_mtime": round(newest, 3)}
    with contextlib.suppress(OSError, subprocess.TimeoutExpired):
        head = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True, timeout=30)
        dirty = subprocess.run(
            [*git, "status", "--porcelain", "--", "src"], capture_output=True, text=True, timeout=30
        )
        found |= {"commit": head.stdout.strip() or None, "src_modified": bool(dirty.stdout.strip())}
    return found


def setup(args, llama: dict) -> dict:
    return {
        "model": "GPT-2 small shape, random weights (torch.manual_seed(0)), GPT-2's tokenizer",
        "precisions": args.precisions,
        "loads": args.loads,
        "requests_per_client": {c: REQUESTS_PER_CLIENT[c] for c in args.loads},
        "warmup_requests_per_client": {c: WARMUP_REQUESTS_PER_CLIENT[c] for c in args.loads},
        "new_tokens": NEW_TOKENS,
        "prompts": len(PROMPTS),
        "rounds": args.rounds,
        "request": "POST /v1/completions, stream, temperature 0, max_tokens 32, stream_options.include_usage",
        "eos": "llama-server: ignore_eos true; gptkit: no such field (may stop at EOS); transformers: no such "
        "field (its continuous batching disables EOS where the folder has no generation_config.json)",
        "window": "from every client's first token to the first client's last token; tokens in (start, end]",
        "alternation": "servers of a precision started together, SIGSTOP but the one under load; order rotated",
        "threads": f"every server at its default (all {CORES} cores; llama-server -t {CORES}); "
        f"{', '.join(DROPPED_ENV)} not passed on",
        "transformers": "--continuous-batching with its --cb-* defaults (none is documented as the setting for "
        "many clients; on a CPU they size the KV cache from the host's free memory, hence its RSS)",
        "gptkit": "--max-batch = clients, --max-queue = max(64, clients)",
        "llama_server": {key: str(value) for key, value in llama.items() if key != "ggufs"},
        "llama_slot_context": SLOT_CONTEXT,
        "limits_s": {"start": START_LIMIT_S, "round": ROUND_LIMIT_S},
    }


def report(groups: list[dict], args, llama: dict, at_start, seconds: float) -> dict:
    servers: dict = {}
    for group in groups:
        at = servers.setdefault(group["precision"], {}).setdefault(str(group["clients"]), {})
        at |= {o.spec.name: summary(o) for o in group["outcomes"]}
        at["rounds"] = group["rounds"]
        at["source"] = group["source"]
    fractions = [r["client_cpu_fraction"] for g in groups for o in g["outcomes"] for r in o.rounds]
    return {
        "comparisons": [row for group in groups for row in rows(group)],
        "servers": servers,
        "client_cpu_fraction_max": max(fractions, default=None),
        "load_average_at_start": at_start,
        "wall_s": round(seconds, 1),
        "setup": setup(args, llama),
        **(groups[0]["source"] if groups else source_state()),
        "source_changed_during_run": len({json.dumps(g["source"]) for g in groups}) > 1,
    }


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--precisions", default=",".join(PRECISIONS), help="of fp32,bf16,int8")
    parser.add_argument("--loads", default=",".join(map(str, LOADS)), help="concurrent clients: of 1,16,64")
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    parser.add_argument("--servers", default=",".join(SERVERS), help="of gptkit,transformers,llama")
    parser.add_argument("--out", type=Path, help="write the JSON line here instead of printing it")
    args = parser.parse_args()
    args.precisions = args.precisions.split(",")
    args.loads = [int(x) for x in args.loads.split(",")]
    args.servers = args.servers.split(",")
    for values, known, flag in (
        (args.precisions, PRECISIONS, "--precisions"),
        (args.loads, REQUESTS_PER_CLIENT, "--loads"),
        (args.servers, SERVERS, "--servers"),
    ):
        if unknown := [v for v in values if v not in known]:
            parser.error(f"{flag}: unknown {unknown}; known: {list(known)}")
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    return args


def main() -> None:
    args = parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so that the servers are killed on the way out
    at_start, started = load_average(), time.monotonic()
    groups = []
    with tempfile.TemporaryDirectory(prefix="serve_peers-") as tmp:
        folder = Path(tmp)
        build_model(folder / MODEL_NAME)
        llama = prepare_llama(args.servers, args.precisions, folder / MODEL_NAME, folder)
        for precision in args.precisions:
            for clients in args.loads:
                source = source_state()
                group = measure_load(precision, clients, args, folder / MODEL_NAME, llama, folder)
                groups.append(group | {"source": source})
                done = {o.spec.name: o.skipped or median(tok_s(o) or [0]) for o in group["outcomes"]}
                print(f"serve_peers: {precision}, {clients} clients: {done}", file=sys.stderr, flush=True)
    record = report(groups, args, llama, at_start, time.monotonic() - started)
    if args.out is None:
        emit("serve_peers", **record)
        return
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        emit("serve_peers", **record)
    args.out.write_text(printed.getvalue())
    print(f"serve_peers: wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
