"""`gptkit serve` as its clients see it: the real server in a subprocess on 127.0.0.1, a tiny model.

The reference for every number is the same model run in this process (``gptkit.generate`` and the
model's own log-softmax), never the server's own code.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from gptkit.testing.processes import free_port  # noqa: E402

pytestmark = pytest.mark.slow  # servers in subprocesses

REPO = Path(__file__).resolve().parents[1]
KEY = "test-key"
MODEL = "tiny"
AUTH = {"Authorization": f"Bearer {KEY}"}
MAIN_MAX_TOKENS = 1000  # the main server's --max-tokens-limit
BODY_LIMIT = 50_000


class Server:
    """`gptkit serve` in a subprocess; its output goes to a log file (read when a test fails)."""

    def __init__(self, model_dir: Path | dict[str, Path], log: Path, *flags: str):
        """One model (named MODEL), or several as {name: directory}."""
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.log = log
        env = {**os.environ, "OMP_NUM_THREADS": "1"}  # two cores shared: one thread decodes fastest
        env.pop("GPTKIT_API_KEY", None)
        if isinstance(model_dir, dict):
            models = [arg for name, path in model_dir.items() for arg in ("--model", f"{name}={path}")]
        else:
            models = ["--model", str(model_dir), "--model-name", MODEL]
        with open(log, "wb") as out:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "gptkit", "serve", *models, "--port", str(self.port)]
                + ["--dtype", "float32", "--device", "cpu", *flags],
                cwd=REPO,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    def wait_ready(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                pytest.fail(
                    f"the server exited with {self.process.returncode}:\n{self.log.read_text()[-3000:]}"
                )
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.base}/health", timeout=2).status_code == 200:
                    return
            time.sleep(0.2)
        pytest.fail(f"the server did not answer /health within {timeout} s:\n{self.log.read_text()[-3000:]}")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)

    def client(self, **kwargs) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.base}/v1", api_key=KEY, max_retries=0, timeout=60, **kwargs)

    def metrics(self) -> dict[str, float]:
        text = httpx.get(f"{self.base}/metrics", timeout=10).text
        return {
            name: float(value)
            for name, value in (line.rsplit(" ", 1) for line in text.splitlines() if not line.startswith("#"))
        }


@pytest.fixture(scope="module")
def model_dir(data_dir, tmp_path_factory) -> Path:
    from gptkit import GPT, GPTConfig
    from gptkit.tokenizer import Tokenizer

    directory = tmp_path_factory.mktemp("serve") / "model"
    torch.manual_seed(0)
    # A wide init spreads the logits, so greedy choices are far from ties: a float rounding
    # difference between a batch and a single row cannot flip them.
    config = GPTConfig.from_preset(
        "tiny", vocab_size=50257, context_length=2048, ln_position="pre", dropout=0.0, init_std=0.2
    )
    GPT(config).save_pretrained(directory)
    Tokenizer.from_pretrained(data_dir / "gpt2_bpe").save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def servers(model_dir, tmp_path_factory):
    """The main server (API key, batch of 8) and a small one (1 row, 2 waiting, 2.5 s per request)."""
    logs = tmp_path_factory.mktemp("serve-logs")
    main = Server(
        model_dir,
        logs / "main.log",
        *("--api-key", KEY, "--max-batch", "8", "--max-tokens-limit", str(MAIN_MAX_TOKENS)),
        *("--max-body-bytes", str(BODY_LIMIT)),
    )
    small = Server(
        model_dir,
        logs / "small.log",
        *("--max-batch", "1", "--max-queue", "2", "--request-timeout", "2.5", "--max-tokens-limit", "2000"),
        *("--cors-origin", "http://playground.test"),
    )
    try:
        main.wait_ready()
        small.wait_ready()
        yield main, small
    finally:
        main.stop()
        small.stop()


@pytest.fixture(scope="module")
def server(servers) -> Server:
    return servers[0]


@pytest.fixture(scope="module")
def small_server(servers) -> Server:
    return servers[1]


@pytest.fixture(scope="module")
def reference(model_dir):
    from gptkit.generation import load_for_generation

    return load_for_generation(model_dir, dtype="float32", device="cpu")


@contextlib.contextmanager
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def greedy_ids(reference, prompt: str, max_tokens: int) -> list[int]:
    """The reference: gptkit.generate's greedy continuation, cut at the end-of-text token."""
    from gptkit.generation import generate

    model, tokenizer = reference
    ids = tokenizer.encode(prompt)
    with one_thread():
        out = generate(model, torch.tensor([ids]), max_tokens, temperature=0, eos_token_id=50256)
    out = out[0, len(ids) :].tolist()
    return out[: out.index(50256)] if 50256 in out else out


# The protocol through the official client -------------------------------------------------------


def test_completion_matches_greedy_generate_and_counts_usage(server, reference):
    tokenizer = reference[1]
    prompt = "The quick brown fox"
    result = server.client().completions.create(model=MODEL, prompt=prompt, max_tokens=12, temperature=0)
    expected = greedy_ids(reference, prompt, 12)
    assert len(expected) == 12, "the reference ran to its length"
    assert result.id.startswith("cmpl-") and result.object == "text_completion" and result.model == MODEL
    assert abs(result.created - time.time()) < 120
    [choice] = result.choices
    assert (choice.index, choice.text, choice.finish_reason) == (0, tokenizer.decode(expected), "length")
    assert choice.logprobs is None
    prompt_tokens = len(tokenizer.encode(prompt))
    assert (result.usage.prompt_tokens, result.usage.completion_tokens) == (prompt_tokens, 12)
    assert result.usage.total_tokens == prompt_tokens + 12


@pytest.mark.parametrize(
    "settings_",
    [dict(temperature=0), dict(temperature=0.9, top_k=40, top_p=0.95, repetition_penalty=1.2, seed=7)],
    ids=["greedy", "seeded-sampling"],
)
def test_one_request_decodes_to_the_same_tokens_through_library_cli_and_server(
    server, reference, model_dir, settings_
):
    """The generation contract: one SamplingParams, one sampler. The same request through
    ``gptkit.generation.generate``, `gptkit generate` and the server picks the same tokens."""
    from gptkit.generation import SamplingParams, generate

    model, tokenizer = reference
    prompt, max_tokens = "The quick brown fox", 12
    ids = tokenizer.encode(prompt)
    params = SamplingParams(max_tokens=max_tokens, **settings_)
    with one_thread():
        library = generate(model, torch.tensor([ids]), params=params, eos_token_id=50256)[0, len(ids) :]
    library = library.tolist()
    library = library[: library.index(50256)] if 50256 in library else library
    assert len(library) >= 4, "the reference made a continuation worth comparing"

    top_k = {"top_k": settings_["top_k"]} if "top_k" in settings_ else {}
    penalty = {"repetition_penalty": settings_.get("repetition_penalty", 1.0)}
    served = server.client().completions.create(
        model=MODEL, prompt=prompt, max_tokens=max_tokens, logprobs=0, extra_body={**top_k, **penalty},
        **{k: settings_[k] for k in ("temperature", "top_p", "seed") if k in settings_},
    )  # fmt: skip
    assert served.choices[0].logprobs.tokens == [tokenizer.decode([t]) for t in library]

    flags = [f"--{name.replace('_', '-')}={value}" for name, value in settings_.items()]
    command = [sys.executable, "-m", "gptkit", "generate", "--model", str(model_dir), "--prompt", prompt]
    command += ["--max-tokens", str(max_tokens), "--dtype", "float32", "--device", "cpu", *flags]
    cli = subprocess.run(command, capture_output=True, text=True, cwd=REPO, timeout=120)
    assert cli.returncode == 0, cli.stderr
    assert cli.stdout == prompt + tokenizer.decode(library) + "\n"


def test_streaming_sends_the_same_text_in_chunks_then_done(server):
    client = server.client()
    settings_ = dict(model=MODEL, prompt="Once upon a time", max_tokens=10, temperature=0)
    whole = client.completions.create(**settings_).choices[0].text
    chunks = list(client.completions.create(**settings_, stream=True, stream_options={"include_usage": True}))
    texts = [c.choices[0].text for c in chunks if c.choices]
    assert len(texts) > 1 and "".join(texts) == whole
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert all(c.id == chunks[0].id and c.object == "text_completion" for c in chunks)
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 10
    # On the wire: server-sent events ending in [DONE].
    body = {**settings_, "stream": True}
    raw = httpx.post(f"{server.base}/v1/completions", json=body, headers=AUTH, timeout=30)
    assert raw.headers["content-type"].startswith("text/event-stream")
    events = [e for e in raw.text.split("\n\n") if e]
    assert all(e.startswith("data: ") for e in events) and events[-1] == "data: [DONE]"


def test_echo_and_logprobs_are_the_models_log_softmax(server, reference):
    model, tokenizer = reference
    prompt = "Hello world, this is"
    result = server.client().completions.create(
        model=MODEL, prompt=prompt, max_tokens=6, temperature=0, echo=True, logprobs=3
    )
    prompt_ids = tokenizer.encode(prompt)
    ids = prompt_ids + greedy_ids(reference, prompt, 6)
    with torch.no_grad(), one_thread():
        log_p = torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), dim=-1)  # (T, V)
    choice = result.choices[0]
    assert choice.text == prompt + tokenizer.decode(ids[len(prompt_ids) :])
    logprobs = choice.logprobs
    assert logprobs.tokens == [tokenizer.decode([i]) for i in ids]
    assert logprobs.token_logprobs[0] is None and logprobs.top_logprobs[0] is None
    expected = [float(log_p[t - 1, ids[t]]) for t in range(1, len(ids))]
    assert logprobs.token_logprobs[1:] == pytest.approx(expected, abs=1e-4)
    for t in range(1, len(ids)):
        top = torch.topk(log_p[t - 1], 3)
        want = {tokenizer.decode([i]): v for i, v in zip(top.indices.tolist(), top.values.tolist())}
        assert logprobs.top_logprobs[t] == pytest.approx(want, abs=1e-4)
    offsets = [sum(len(s) for s in logprobs.tokens[:t]) for t in range(len(ids))]
    assert logprobs.text_offset == offsets
    assert result.usage.completion_tokens == 6 and result.usage.prompt_tokens == len(prompt_ids)


def test_a_stop_string_ends_the_text_before_it(server, reference):
    tokenizer = reference[1]
    prompt = "In a hole in the ground"
    ids = greedy_ids(reference, prompt, 20)
    text = tokenizer.decode(ids)
    stop = text[len(text) // 2 : len(text) // 2 + 3]
    cut = text.find(stop)
    # By hand: the tokens decoded until the text first contains the stop string.
    needed = next(k for k in range(1, len(ids) + 1) if stop in tokenizer.decode(ids[:k]))
    client = server.client()
    for stream in (False, True):
        settings_ = dict(model=MODEL, prompt=prompt, max_tokens=20, temperature=0, stop=["\x00never", stop])
        if stream:
            chunks = list(
                client.completions.create(**settings_, stream=True, stream_options={"include_usage": True})
            )
            got = "".join(c.choices[0].text for c in chunks if c.choices)
            finish = [c.choices[0].finish_reason for c in chunks if c.choices][-1]
            usage = chunks[-1].usage
        else:
            result = client.completions.create(**settings_)
            got, finish, usage = result.choices[0].text, result.choices[0].finish_reason, result.usage
        assert (got, finish) == (text[:cut], "stop")
        assert usage.completion_tokens == needed


def test_n_list_prompts_and_seeds(server):
    client = server.client()
    settings_ = dict(
        model=MODEL, prompt=["First prompt", "Second"], max_tokens=8, n=3, seed=7, temperature=1.0
    )
    result = client.completions.create(**settings_, extra_body={"top_k": 50})
    assert [c.index for c in result.choices] == list(range(6))
    again = client.completions.create(**settings_, extra_body={"top_k": 50})
    assert [c.text for c in again.choices] == [c.text for c in result.choices], (
        "a seed reproduces the samples"
    )
    assert len({c.text for c in result.choices[:3]}) > 1, "the n choices of one prompt differ"
    assert result.usage.completion_tokens == 6 * 8
    # Choice i samples with seed + i, whatever else shares the batch.
    alone = client.completions.create(
        model=MODEL, prompt="Second", max_tokens=8, seed=7 + 4, extra_body={"top_k": 50}
    )
    assert alone.choices[0].text == result.choices[4].text


def test_greedy_output_is_the_same_alone_or_in_a_batch(server, reference):
    """8 different prompts at once, with sampled requests of other settings in the same batch."""
    tokenizer = reference[1]
    prompts = [f"Prompt number {i} says" + " more" * i for i in range(8)]
    lengths = [5 + 3 * i for i in range(8)]

    def greedy(i: int) -> list[str]:
        result = server.client().completions.create(
            model=MODEL, prompt=prompts[i], max_tokens=lengths[i], temperature=0, logprobs=0
        )
        return result.choices[0].logprobs.tokens

    def sampled(i: int) -> str:
        extra = {"top_k": 20, "repetition_penalty": 1.3} if i % 2 else {}
        result = server.client().completions.create(
            model=MODEL,
            prompt=prompts[i],
            max_tokens=15,
            temperature=0.7,
            top_p=0.9,
            seed=i,
            extra_body=extra,
        )
        return result.choices[0].text

    alone = [greedy(i) for i in range(8)]
    steps_before = server.metrics()["gptkit_engine_steps_total"]
    with ThreadPoolExecutor(12) as pool:
        greedy_runs = [pool.submit(greedy, i) for i in range(8)]
        sampled_runs = [pool.submit(sampled, i) for i in range(4)]
        batched = [run.result() for run in greedy_runs]
        assert all(run.result() for run in sampled_runs)
    steps = server.metrics()["gptkit_engine_steps_total"] - steps_before
    assert batched == alone
    assert steps < sum(lengths) + 4 * 15, "the requests shared decoding steps"
    for i in range(8):
        assert alone[i] == [tokenizer.decode([t]) for t in greedy_ids(reference, prompts[i], lengths[i])]


def test_models_health_and_metrics(server):
    models = server.client().models.list()
    assert [m.id for m in models.data] == [MODEL]
    assert httpx.get(f"{server.base}/health", timeout=10).json()["status"] == "ok"
    # Counters count from the server's start, and other tests share it: compare before and after
    # this test's own requests, so the check holds in any test order.
    ok = 'gptkit_requests_total{endpoint="/v1/completions",status="200"}'
    before = server.metrics()
    for prompt in ("one", "two", "three"):
        server.client().completions.create(model=MODEL, prompt=prompt, max_tokens=2, temperature=0)
    metrics = server.metrics()
    assert metrics[ok] - before.get(ok, 0) == 3
    assert metrics["gptkit_generated_tokens_total"] - before.get("gptkit_generated_tokens_total", 0) >= 3
    for name in ("gptkit_queue_length", "gptkit_running_sequences", "gptkit_request_duration_seconds_count"):
        assert name in metrics
    assert (
        metrics['gptkit_request_duration_seconds_bucket{le="+Inf"}']
        == metrics["gptkit_request_duration_seconds_count"]
    )


# Errors -------------------------------------------------------------------------------------------


def _post(server: Server, body, headers=AUTH, **kwargs) -> httpx.Response:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    headers = {"Content-Type": "application/json", **headers}
    return httpx.post(f"{server.base}/v1/completions", content=content, headers=headers, timeout=30, **kwargs)


def _error(response: httpx.Response, status: int) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    return error


def test_api_key_and_model_name_are_checked(server):
    ok = {"model": MODEL, "prompt": "hi", "max_tokens": 1}
    assert _error(_post(server, ok, headers={}), 401)["code"] == "invalid_api_key"
    assert (
        _error(_post(server, ok, headers={"Authorization": "Bearer wrong"}), 401)["code"] == "invalid_api_key"
    )
    assert _error(httpx.get(f"{server.base}/v1/models", timeout=10), 401)
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"{server.base}/v1", api_key="nope", max_retries=0).models.list()
    with pytest.raises(openai.NotFoundError) as raised:
        server.client().completions.create(model="gpt-5", prompt="hi", max_tokens=1)
    assert raised.value.code == "model_not_found"
    assert _error(httpx.get(f"{server.base}/no/such/route", timeout=10), 404)
    assert (
        "access-control-allow-origin"
        not in _post(server, ok, headers={**AUTH, "Origin": "http://x.test"}).headers
    )


@pytest.mark.parametrize(
    "body, param, words",
    [
        (b"{not json", None, "could not parse the JSON"),
        (b"\xff\xfe", None, "could not parse the JSON"),
        ([1, 2], None, "JSON object"),
        ({"model": MODEL, "prompt": "hi", "foo": 1}, "foo", "Unrecognized request argument supplied: foo"),
        ({"model": MODEL}, "prompt", "prompt"),
        ({"prompt": "hi"}, "model", "model"),
        ({"model": MODEL, "prompt": 5}, "prompt", "prompt"),
        ({"model": MODEL, "prompt": "hi", "max_tokens": "5"}, "max_tokens", "integer"),
        ({"model": MODEL, "prompt": "hi", "max_tokens": 0}, "max_tokens", "between 1 and"),
        ({"model": MODEL, "prompt": "hi", "max_tokens": MAIN_MAX_TOKENS + 1}, "max_tokens", "between 1 and"),
        ({"model": MODEL, "prompt": "hi", "n": 9}, "n", "between 1 and 8"),
        ({"model": MODEL, "prompt": "hi", "temperature": True}, "temperature", "number"),
        ({"model": MODEL, "prompt": "hi", "top_p": 0}, "top_p", "(0, 1]"),
        ({"model": MODEL, "prompt": "hi", "logprobs": 6}, "logprobs", "between 0 and 5"),
        ({"model": MODEL, "prompt": "hi", "stop": ["a", ""]}, "stop", "empty"),
        ({"model": MODEL, "prompt": "hi", "suffix": "end"}, "suffix", "not supported"),
        ({"model": MODEL, "prompt": "hi", "presence_penalty": 0.5}, "presence_penalty", "repetition_penalty"),
        ({"model": MODEL, "prompt": "hi", "best_of": 3}, "best_of", "not supported"),
        ({"model": MODEL, "prompt": [1, 99999]}, "prompt", "token ids"),
        ({"model": MODEL, "prompt": "\ud800"}, "prompt", "Unicode"),
        (
            {"model": MODEL, "prompt": "hi", "stream_options": {"include_usage": True}},
            "stream_options",
            "stream",
        ),
    ],
)
def test_bad_requests_get_a_400_naming_the_field(server, body, param, words):
    error = _error(_post(server, body), 400)
    assert error["param"] == param and words in error["message"]
    assert error["type"] == "invalid_request_error"


def test_accepted_and_ignored_fields(server, reference):
    """OpenAI's fields that change nothing at these values are taken and ignored: the answer is the
    library's greedy text, as without them."""
    body = {"model": MODEL, "prompt": "Once upon", "max_tokens": 4, "temperature": 0}
    ignored = {"user": "u1", "presence_penalty": 0, "best_of": 1, "suffix": None, "logit_bias": {}}
    response = _post(server, {**body, **ignored})
    assert response.status_code == 200, response.text
    [choice] = response.json()["choices"]
    expected = greedy_ids(reference, "Once upon", 4)
    assert len(expected) == 4, "the reference ran to its length"
    assert (choice["text"], choice["finish_reason"]) == (reference[1].decode(expected), "length")
    assert response.json()["usage"]["completion_tokens"] == 4


def test_a_prompt_longer_than_the_context_names_both_lengths(server):
    error = _error(_post(server, {"model": MODEL, "prompt": [11] * 2040, "max_tokens": 10}), 400)
    assert error["code"] == "context_length_exceeded"
    assert (
        "maximum context length is 2048 tokens" in error["message"]
        and "2040 in your prompt" in error["message"]
    )


def test_a_body_over_the_limit_gets_413(server):
    assert _error(_post(server, b"x" * (BODY_LIMIT + 1)), 413)["code"] == "request_too_large"
    chunks = (b"y" * 1000 for _ in range(BODY_LIMIT // 1000 + 2))  # chunked: no Content-Length
    response = httpx.post(f"{server.base}/v1/completions", content=chunks, headers=AUTH, timeout=30)
    assert _error(response, 413)


# The engine's life cycle --------------------------------------------------------------------------


def test_a_client_that_leaves_stops_its_generation(server):
    before = server.metrics()
    body = {"model": MODEL, "prompt": "Keep going", "max_tokens": MAIN_MAX_TOKENS, "stream": True}
    with httpx.stream(
        "POST", f"{server.base}/v1/completions", json=body, headers=AUTH, timeout=30
    ) as response:
        lines = response.iter_lines()
        assert next(line for line in lines if line.startswith("data: "))
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        after = server.metrics()
        cancelled = after["gptkit_sequences_cancelled_total"] - before["gptkit_sequences_cancelled_total"]
        if cancelled == 1 and after["gptkit_running_sequences"] == 0:
            break
        time.sleep(0.05)
    assert cancelled == 1 and after["gptkit_running_sequences"] == 0
    generated = after["gptkit_generated_tokens_total"] - before["gptkit_generated_tokens_total"]
    assert generated < MAIN_MAX_TOKENS, "the sequence stopped before its length"


_LEAF = (
    st.none()
    | st.booleans()
    | st.integers(-10, 40)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=12)
)
_JSON = st.recursive(
    _LEAF,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=8,
)
_FIELDS = {
    "model": st.sampled_from([MODEL, "other"]) | _JSON,
    "prompt": st.text(max_size=20)
    | st.lists(st.text(max_size=8), max_size=3)
    | st.lists(st.integers(-2, 60000), max_size=4)
    | _JSON,
    "max_tokens": st.integers(-2, 12) | _JSON,
    "temperature": st.floats(-1, 3) | _JSON,
    "top_p": st.floats(-0.5, 1.5) | _JSON,
    "top_k": st.integers(-1, 100) | _JSON,
    "n": st.integers(-1, 10) | _JSON,
    "stream": st.booleans() | _JSON,
    "logprobs": st.integers(-1, 7) | _JSON,
    "echo": st.booleans() | _JSON,
    "stop": st.text(max_size=3) | st.lists(st.text(max_size=3), max_size=5) | _JSON,
    "seed": st.integers(-(2**70), 2**70) | _JSON,
    "repetition_penalty": st.floats(-1, 12) | _JSON,
    "presence_penalty": _JSON,
    "stream_options": _JSON,
}
_PLAUSIBLE = {  # values a real client sends, in combinations: these bodies mostly succeed
    "max_tokens": st.integers(1, 8),
    "temperature": st.floats(0, 2),
    "top_p": st.floats(0.01, 1),
    "top_k": st.integers(1, 50),
    "n": st.integers(1, 3),
    "stream": st.booleans(),
    "logprobs": st.integers(0, 5),
    "echo": st.booleans(),
    "stop": st.text(min_size=1, max_size=2)
    | st.lists(st.text(min_size=1, max_size=2), min_size=1, max_size=4),
    "seed": st.integers(0, 2**32),
    "repetition_penalty": st.floats(0.5, 2),
}
_BODIES = (
    st.fixed_dictionaries({"model": st.just(MODEL), "prompt": st.text(max_size=20)}, optional=_PLAUSIBLE).map(
        lambda d: json.dumps(d).encode()
    )
    | st.fixed_dictionaries({}, optional=_FIELDS).map(lambda d: json.dumps(d).encode())
    | st.dictionaries(st.text(max_size=10), _JSON, max_size=4).map(lambda d: json.dumps(d).encode())
    | _JSON.map(lambda v: json.dumps(v).encode())
    | st.binary(max_size=100)
)


def answers_any_request(server: Server, requests: st.SearchStrategy, max_examples: int = 60) -> None:
    """Random (path, body) requests (hypothesis) each get an answer, never a server error, and the
    server is still up and answering after them."""

    @settings(
        max_examples=max_examples, deadline=None, suppress_health_check=[HealthCheck.too_slow], database=None
    )
    @given(request=requests)
    def answered(request):
        path, body = request
        headers = {"Content-Type": "application/json", **AUTH}
        response = httpx.post(f"{server.base}{path}", content=body, headers=headers, timeout=30)
        assert response.status_code < 500, response.text
        if response.status_code != 200:
            _error(response, response.status_code)

    answered()
    assert httpx.get(f"{server.base}/health", timeout=10).json()["status"] == "ok"
    assert server.process.poll() is None


def test_any_body_gets_an_answer_never_a_server_error_and_the_server_stays_healthy(server):
    """One test, so that it holds whatever order the tests run in."""
    answers_any_request(server, _BODIES.map(lambda body: ("/v1/completions", body)))


# The small server: one row, two waiting, 2.5 s per request ------------------------------------


def _open_stream(server: Server, max_tokens: int = 2000):
    body = {"model": MODEL, "prompt": "Hold the row", "max_tokens": max_tokens, "stream": True}
    context = httpx.stream("POST", f"{server.base}/v1/completions", json=body, timeout=30)
    return context, context.__enter__()


def test_a_full_queue_answers_429_at_once(small_server):
    running, response = _open_stream(small_server)
    waiting = []
    try:
        lines = response.iter_lines()  # kept: an iterator closed early would close the connection
        assert next(line for line in lines if line.startswith("data: "))  # it runs
        waiting = [_open_stream(small_server)[0] for _ in range(2)]  # both wait for the row
        deadline = time.monotonic() + 5
        while small_server.metrics()["gptkit_queue_length"] < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        started = time.monotonic()
        error = _error(
            _post(small_server, {"model": MODEL, "prompt": "one more", "max_tokens": 1}, headers={}), 429
        )
        assert time.monotonic() - started < 1.0 and "queue" in error["message"]
    finally:
        for context in [running, *waiting]:
            context.__exit__(None, None, None)


def test_cors_is_on_for_the_origins_given(small_server):
    preflight = httpx.options(
        f"{small_server.base}/v1/completions",
        headers={"Origin": "http://playground.test", "Access-Control-Request-Method": "POST"},
        timeout=10,
    )
    assert preflight.headers["access-control-allow-origin"] == "http://playground.test"
    other = httpx.get(f"{small_server.base}/health", headers={"Origin": "http://evil.test"}, timeout=10)
    assert "access-control-allow-origin" not in other.headers


def test_sigterm_lets_the_request_in_flight_end_then_exits_0(model_dir, tmp_path):
    # Its own server: the shared ones must outlive this test, whatever order the tests run in.
    server = Server(model_dir, tmp_path / "sigterm.log", "--max-batch", "1", "--max-tokens-limit", "2000")
    answer: dict = {}

    def request() -> None:
        body = {"model": MODEL, "prompt": "last words", "max_tokens": 300}
        answer["response"] = _post(server, body, headers={})

    try:
        server.wait_ready()
        thread = threading.Thread(target=request)
        thread.start()
        deadline = time.monotonic() + 5
        while server.metrics()["gptkit_running_sequences"] < 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        server.process.send_signal(signal.SIGTERM)
        assert server.process.wait(30) == 0
        thread.join(30)
    finally:
        server.stop()
    response = answer["response"]
    if response.status_code == 200:
        assert response.json()["choices"][0]["finish_reason"] == "length"
    else:
        _error(response, response.status_code)  # a clean error, never a dropped connection
