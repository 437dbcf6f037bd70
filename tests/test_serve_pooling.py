"""`gptkit serve` with several models: fine-tuned models behind ``/v1/classify``, every model behind
``/v1/embeddings``, through the real server in a subprocess on 127.0.0.1 with tiny models.

The reference for every number is the model run in this process by hand: each input laid out as the
paper's Figure 1 says, h_n read at its last token, the head W_y applied, the softmax taken; never the
server's own code.
"""

from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from .test_serve import KEY, Server, _error, answers_any_request

httpx = pytest.importorskip("httpx")
openai = pytest.importorskip("openai")

from hypothesis import strategies as st  # noqa: E402

pytestmark = pytest.mark.slow  # a server of five models in a subprocess

AUTH = {"Authorization": f"Bearer {KEY}"}
LABELS = {"sst2": ["negative", "positive"], "rte": ["entailment", "not_entailment"]}
TASKS = {  # name → (task, regression)
    "sst2": ("classification", False),
    "rte": ("entailment", False),
    "sts": ("similarity", True),
    "mc": ("multiple_choice", False),
}
MAX_LENGTH = 48  # the task models' max_length
BATCH_WAIT_MS = 150  # long enough that concurrent requests share batches, also with the suite running beside
BATCHERS = [(name, "/v1/embeddings") for name in ["lm", *TASKS]] + [(name, "/v1/classify") for name in TASKS]
STARTUP_S = 600  # five models to load (seconds when the machine is quiet), on two cores others share


@pytest.fixture(scope="module")
def tokenizer(data_dir):
    from gptkit.tokenizer import Tokenizer

    return Tokenizer.from_pretrained(data_dir / "gpt2_bpe")


@pytest.fixture(scope="module")
def model_dirs(tokenizer, tmp_path_factory) -> dict[str, Path]:
    """A language model (GPT-2's layout) and one fine-tuned model per task kind (GPT-1's layout)."""
    from gptkit import GPT, GPTConfig
    from gptkit.data.tasks import TaskSpec, special_token_ids
    from gptkit.model.task import TaskModel

    root = tmp_path_factory.mktemp("pooling")
    torch.manual_seed(0)
    lm = GPTConfig.from_preset(
        "tiny", vocab_size=50257, context_length=128, ln_position="pre", dropout=0.0, init_std=0.2
    )
    GPT(lm).save_pretrained(root / "lm")
    tokenizer.save_pretrained(root / "lm")
    dirs = {"lm": root / "lm"}
    specials = special_token_ids(tokenizer)
    for name, (task, regression) in TASKS.items():
        config = GPTConfig.from_preset(
            "tiny", vocab_size=50257, n_special=3, context_length=64, dropout=0.0, init_std=0.2
        )
        spec = TaskSpec(
            task, labels=LABELS.get(name), regression=regression, max_length=MAX_LENGTH, specials=specials
        )
        TaskModel(GPT(config), spec, clf_dropout=0.0, tokenizer=tokenizer).save_pretrained(root / name)
        dirs[name] = root / name
    return dirs


@pytest.fixture(scope="module")
def server(model_dirs, tmp_path_factory):
    log = tmp_path_factory.mktemp("pooling-logs") / "server.log"
    server = Server(model_dirs, log, "--api-key", KEY, "--batch-wait-ms", str(BATCH_WAIT_MS))
    try:
        server.wait_ready(timeout=STARTUP_S)
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def references(model_dirs) -> dict:
    from gptkit import GPT
    from gptkit.model.task import TaskModel

    models = {name: TaskModel.from_pretrained(model_dirs[name], device="cpu") for name in TASKS}
    return {"lm": GPT.from_pretrained(model_dirs["lm"]).eval(), **models}


def post(server: Server, path: str, body, headers=AUTH) -> httpx.Response:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    headers = {"Content-Type": "application/json", **headers}
    return httpx.post(f"{server.base}{path}", content=content, headers=headers, timeout=60)


# The reference, by hand -------------------------------------------------------------------------


@torch.no_grad()
def last_state(gpt, ids: list[int]) -> torch.Tensor:
    """h_n at the last of ``ids``, the sequence run alone."""
    return gpt(torch.tensor([ids])).hidden_states[0, -1].float()


def layouts(model, tokenizer, row: dict) -> list[list[int]]:
    """GPT-1's Figure 1, written out: <s> ... $ ... <e>, one sequence per order or answer."""
    specials = model.spec.specials
    s, d, e = specials["_start_"], specials["_delimiter_"], specials["_classify_"]
    enc = tokenizer.encode
    task = model.spec.task
    if task == "classification":
        return [[s, *enc(row["text"]), e]]
    if task == "entailment":
        return [[s, *enc(row["premise"]), d, *enc(row["hypothesis"]), e]]
    if task == "similarity":
        a, b = enc(row["text_a"]), enc(row["text_b"])
        return [[s, *a, d, *b, e], [s, *b, d, *a, e]]
    stem = enc(row["context"]) + (enc(row["question"]) if "question" in row else [])
    return [[s, *stem, d, *enc(choice), e] for choice in row["choices"]]


def expected(model, tokenizer, row: dict) -> dict:
    """What /v1/classify must answer for ``row``: vLLM's fields, computed by hand."""
    sequences = layouts(model, tokenizer, row)
    states = [last_state(model.gpt, ids) for ids in sequences]
    with torch.no_grad():
        if model.spec.task == "multiple_choice":
            logits = torch.stack([model.head(h) for h in states])[:, 0]  # one score per answer
        elif model.spec.task == "similarity":
            logits = model.head(states[0] + states[1])  # both orders, added
        else:
            logits = model.head(states[0])
    tokens = sum(len(ids) for ids in sequences)
    if model.spec.regression:
        return {"score": float(logits[0]), "num_classes": 1, "label": None, "probs": [], "tokens": tokens}
    probs = logits.softmax(-1).tolist()
    names = model.spec.labels or [str(i) for i in range(len(probs))]
    best = max(range(len(probs)), key=probs.__getitem__)
    return {"label": names[best], "probs": probs, "num_classes": len(probs), "tokens": tokens}


ROWS = {
    "sst2": ["a gripping, beautifully made film", {"text": "dull and far too long"}, "fine"],
    "rte": [{"premise": "The cat sat on the mat.", "hypothesis": "A cat is sitting."}],
    "sts": [
        {"text_a": "A man is playing a guitar.", "text_b": "Someone plays music."},
        {"text_a": "Stocks fell sharply.", "text_b": "The dog barked at the mailman."},
    ],
    "mc": [
        {"context": "She opened the umbrella because", "choices": ["it rained.", "it was sunny.", "cats."]},
        {"context": "Tom lost his keys.", "question": "What did Tom do?", "choices": ["Searched.", "Slept."]},
    ],
}


def as_row(item) -> dict:
    return {"text": item} if isinstance(item, str) else item


# /v1/classify -------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(TASKS))
def test_classify_answers_the_models_own_probabilities(server, references, tokenizer, name):
    response = post(server, "/v1/classify", {"model": name, "input": ROWS[name]})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["id"].startswith("classify-") and body["object"] == "list" and body["model"] == name
    assert abs(body["created"] - time.time()) < 120
    wants = [expected(references[name], tokenizer, as_row(item)) for item in ROWS[name]]
    assert [d["index"] for d in body["data"]] == list(range(len(wants)))
    for got, want in zip(body["data"], wants):
        assert (got["label"], got["num_classes"]) == (want["label"], want["num_classes"])
        assert got["probs"] == pytest.approx(want["probs"], abs=1e-5)
        if "score" in want:
            assert got["score"] == pytest.approx(want["score"], abs=1e-5)
    if len(wants) > 1:  # the answers differ between inputs far beyond the tolerance: a real check
        answers = [want["probs"] or [want["score"]] for want in wants]
        assert max(abs(a - b) for answer in answers for a, b in zip(answer, answers[0])) > 1e-2
    tokens = sum(want["tokens"] for want in wants)
    assert body["usage"] == {
        "prompt_tokens": tokens,
        "total_tokens": tokens,
        "completion_tokens": 0,
        "prompt_tokens_details": None,
    }


def test_classify_answers_at_vllms_path_too(server):
    vllm = post(server, "/classify", {"model": "sst2", "input": "fine"}).json()
    ours = post(server, "/v1/classify", {"model": "sst2", "input": "fine"}).json()
    assert vllm["data"] == ours["data"]


# /v1/embeddings -----------------------------------------------------------------------------------


def test_embeddings_through_the_openai_client_are_the_last_hidden_state(server, references, tokenizer):
    client = openai.OpenAI(base_url=f"{server.base}/v1", api_key=KEY, max_retries=0, timeout=60)
    texts = ["The quick brown fox", "jumps over the lazy dog, twice."]
    wants = [last_state(references["lm"], tokenizer.encode(text)) for text in texts]
    for encoding in ({}, {"encoding_format": "float"}):  # the client asks for base64 unless told
        result = client.embeddings.create(model="lm", input=texts, **encoding)
        assert result.model == "lm" and result.object == "list"
        assert [e.index for e in result.data] == [0, 1]
        for got, want in zip(result.data, wants):
            assert len(got.embedding) == 32
            torch.testing.assert_close(torch.tensor(got.embedding), want, atol=1e-4, rtol=1e-4)
        tokens = sum(len(tokenizer.encode(text)) for text in texts)
        assert (result.usage.prompt_tokens, result.usage.total_tokens) == (tokens, tokens)
    one = client.embeddings.create(model="lm", input=texts[0], encoding_format="float")
    assert one.data[0].embedding == pytest.approx(result.data[0].embedding, abs=1e-5)
    ids = tokenizer.encode(texts[1])
    for token_input in (ids, [ids]):
        by_ids = client.embeddings.create(model="lm", input=token_input, encoding_format="float")
        assert by_ids.data[0].embedding == pytest.approx(result.data[1].embedding, abs=1e-5)


def test_a_fine_tuned_models_embedding_is_what_its_head_reads(server, references, tokenizer):
    text = "a gripping, beautifully made film"
    model = references["sst2"]
    body = post(server, "/v1/embeddings", {"model": "sst2", "input": text, "encoding_format": "float"}).json()
    vector = torch.tensor(body["data"][0]["embedding"])
    [sequence] = layouts(model, tokenizer, {"text": text})
    torch.testing.assert_close(vector, last_state(model.gpt, sequence), atol=1e-4, rtol=1e-4)
    assert body["usage"]["prompt_tokens"] == len(sequence)
    classified = post(server, "/v1/classify", {"model": "sst2", "input": text}).json()["data"][0]
    with torch.no_grad():
        assert model.head(vector).softmax(-1).tolist() == pytest.approx(classified["probs"], abs=1e-5)


# Batching ------------------------------------------------------------------------------------------


def test_concurrent_requests_share_batches_and_get_what_they_get_alone(server):
    """Ten clients classify with one model at once, beside requests for every other batcher."""
    sst2 = [
        ("/v1/classify", {"model": "sst2", "input": [f"text {i}"] + ["another"] * (i % 3)}) for i in range(10)
    ]
    requests = sst2 + [
        ("/v1/classify", {"model": name, "input": item}) for name in TASKS for item in ROWS[name]
    ]
    requests += [
        ("/v1/embeddings", {"model": model, "input": f"text number {i}", "encoding_format": "float"})
        for i, model in enumerate(["lm", "lm", "lm", "sst2", "rte"])
    ]

    def send(request) -> dict:
        response = post(server, *request)
        assert response.status_code == 200, response.text
        return response.json()["data"]

    alone = [send(request) for request in requests]
    before = server.metrics()
    start = threading.Barrier(len(requests))

    def send_together(request) -> dict:
        start.wait()
        return send(request)

    with ThreadPoolExecutor(len(requests)) as pool:
        together = list(pool.map(send_together, requests))
    after = server.metrics()
    for got, want in zip(together, alone):
        assert [d.get("label") for d in got] == [d.get("label") for d in want]
        for g, w in zip(got, want):
            for field in ("probs", "embedding"):
                assert g.get(field) == pytest.approx(w.get(field), abs=1e-5)

    def change(name: str, model: str, endpoint: str = "/v1/classify") -> float:
        sample = f'{name}{{model="{model}",endpoint="{endpoint}"}}'
        return after[sample] - before[sample]

    inputs = sum(change("gptkit_pooling_inputs_total", *key) for key in BATCHERS)
    assert inputs == sum(len(data) for data in alone)
    batches = change("gptkit_pooling_batches_total", "sst2")
    assert batches < len(sst2) / 2, "the clients of one model shared forward passes"


def test_a_full_queue_answers_429_at_once_and_a_batch_waits_a_bounded_time(model_dirs, tmp_path):
    """Batches of up to 4 inputs, at most 2 waiting, 1 s to fill: a request of 2 inputs fills the queue
    and waits the whole second for inputs that cannot come; one more input meanwhile gets 429."""
    server = Server(
        {"lm": model_dirs["lm"]},
        tmp_path / "small.log",
        *("--max-batch", "4", "--max-queue", "2", "--batch-wait-ms", "1000"),
    )
    answer: dict = {}

    def first() -> None:
        started = time.monotonic()
        answer["response"] = post(server, "/v1/embeddings", {"model": "lm", "input": ["a", "b"]}, headers={})
        answer["seconds"] = time.monotonic() - started

    try:
        server.wait_ready(timeout=STARTUP_S)
        thread = threading.Thread(target=first)
        thread.start()
        deadline = time.monotonic() + 5
        queue = 'gptkit_pooling_queue_length{model="lm",endpoint="/v1/embeddings"}'
        while server.metrics()[queue] < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        started = time.monotonic()
        error = _error(post(server, "/v1/embeddings", {"model": "lm", "input": "c"}, headers={}), 429)
        assert time.monotonic() - started < 0.5 and "queue" in error["message"]
        assert error["code"] == "queue_full"
        thread.join(30)
    finally:
        server.stop()
    assert answer["response"].status_code == 200 and len(answer["response"].json()["data"]) == 2
    assert 0.9 < answer["seconds"] < 5, "the batch waited its second to fill, then ran"


# Routing and errors --------------------------------------------------------------------------------


def test_models_lists_every_model_with_what_it_answers(server):
    client = openai.OpenAI(base_url=f"{server.base}/v1", api_key=KEY, max_retries=0, timeout=60)
    assert [m.id for m in client.models.list().data] == ["lm", *TASKS]
    cards = {card["id"]: card for card in httpx.get(f"{server.base}/v1/models", headers=AUTH).json()["data"]}
    lm_endpoints = ["/v1/completions", "/v1/chat/completions", "/v1/embeddings"]
    assert cards["lm"]["endpoints"] == lm_endpoints and "task" not in cards["lm"]
    assert cards["rte"]["endpoints"] == ["/v1/classify", "/v1/embeddings"]
    assert (cards["rte"]["task"], cards["rte"]["labels"]) == ("entailment", LABELS["rte"])
    assert (cards["sts"]["task"], cards["sts"]["regression"]) == ("similarity", True)
    health = httpx.get(f"{server.base}/health", timeout=10).json()
    assert health == {"status": "ok", "model": "lm", "models": ["lm", *TASKS]}


def test_the_language_model_still_completes_beside_the_task_models(server, references, tokenizer):
    client = openai.OpenAI(base_url=f"{server.base}/v1", api_key=KEY, max_retries=0, timeout=60)
    result = client.completions.create(model="lm", prompt="Hello", max_tokens=3, temperature=0)
    assert result.model == "lm" and result.usage.completion_tokens == 3
    from gptkit.generation import generate

    ids = tokenizer.encode("Hello")
    greedy = generate(references["lm"], torch.tensor([ids]), 3, temperature=0)[0, len(ids) :].tolist()
    assert 50256 not in greedy, "the reference ran to its length"
    assert result.choices[0].text == tokenizer.decode(greedy)


def test_an_endpoint_the_model_does_not_answer_is_a_400_naming_the_model(server):
    error = _error(post(server, "/v1/completions", {"model": "rte", "prompt": "hi"}), 400)
    assert (error["param"], error["code"]) == ("model", "model_not_supported")
    assert "`rte` is a fine-tuned entailment model" in error["message"] and "/v1/classify" in error["message"]
    error = _error(post(server, "/v1/classify", {"model": "lm", "input": "hi"}), 400)
    assert "`lm` is a language model" in error["message"] and "/v1/completions" in error["message"]
    client = openai.OpenAI(base_url=f"{server.base}/v1", api_key=KEY, max_retries=0, timeout=60)
    with pytest.raises(openai.BadRequestError, match="sts"):
        client.completions.create(model="sts", prompt="hi", max_tokens=1)
    for path in ("/v1/classify", "/v1/embeddings"):
        assert _error(post(server, path, {"model": "nope", "input": "hi"}), 404)["code"] == "model_not_found"
        assert _error(post(server, path, {"model": "sst2", "input": "hi"}, headers={}), 401)


@pytest.mark.parametrize(
    "path, body, words",
    [
        ("/v1/classify", {"model": "sst2"}, "provide an 'input'"),
        ("/v1/classify", {"model": "sst2", "input": []}, "empty array"),
        ("/v1/classify", {"model": "sst2", "input": [1, 2]}, "must be a string or an object with 'text'"),
        ("/v1/classify", {"model": "sst2", "input": "   "}, "field 'text' is empty"),
        ("/v1/classify", {"model": "rte", "input": "just a string"}, "'premise', 'hypothesis'"),
        ("/v1/classify", {"model": "rte", "input": {"premise": "a"}}, "lacks the field 'hypothesis'"),
        (
            "/v1/classify",
            {"model": "rte", "input": {"premise": "a", "hypothesis": ""}},
            "'hypothesis' is empty",
        ),
        ("/v1/classify", {"model": "rte", "input": {"premise": "a", "hypothesis": 3}}, "must be a string"),
        ("/v1/classify", {"model": "sts", "input": {"text_a": "a", "text_c": "b"}}, "'text_c'"),
        ("/v1/classify", {"model": "mc", "input": {"context": "a", "choices": ["b"]}}, "at least two"),
        ("/v1/classify", {"model": "sst2", "input": "a", "top_k": 3}, "Unrecognized request argument"),
        ("/v1/classify", {"model": "sst2", "input": ["a"] * 65}, "queues at most 64"),
        ("/v1/embeddings", {"model": "lm"}, "provide an 'input'"),
        ("/v1/embeddings", {"model": "lm", "input": ""}, "empty string"),
        ("/v1/embeddings", {"model": "lm", "input": [["a"]]}, "token ids"),
        ("/v1/embeddings", {"model": "lm", "input": [70000]}, "token ids must be integers in 0..50256"),
        ("/v1/embeddings", {"model": "lm", "input": "a", "encoding_format": "int8"}, "'float' or 'base64'"),
        ("/v1/embeddings", {"model": "lm", "input": "a", "dimensions": 8}, "this model's width, 32"),
        ("/v1/embeddings", {"model": "lm", "input": [11] * 129}, "maximum input length is 128 tokens"),
        ("/v1/embeddings", {"model": "sst2", "input": [11] * 47}, "maximum input length is 46 tokens"),
        ("/v1/embeddings", {"model": "lm", "input": "a", "foo": 1}, "Unrecognized request argument"),
    ],
)
def test_bad_pooling_requests_get_a_400_saying_why(server, path, body, words):
    error = _error(post(server, path, body), 400)
    assert words in error["message"] and error["type"] == "invalid_request_error"


def test_accepted_fields(server, references, tokenizer):
    """``dimensions`` at the model's width and ``user`` are taken, and change nothing: the answers
    are the models' own, by hand."""
    body = {"model": "lm", "input": "a", "encoding_format": "float", "dimensions": 32, "user": "u1"}
    ok = post(server, "/v1/embeddings", body)
    assert ok.status_code == 200, ok.text
    want = last_state(references["lm"], tokenizer.encode("a"))
    torch.testing.assert_close(torch.tensor(ok.json()["data"][0]["embedding"]), want, atol=1e-4, rtol=1e-4)
    row = {"context": "a", "choices": ["b", "c"]}
    ok = post(server, "/v1/classify", {"model": "mc", "input": row, "user": "u"})
    assert ok.status_code == 200, ok.text
    [got] = ok.json()["data"]
    want = expected(references["mc"], tokenizer, row)
    assert (got["label"], got["num_classes"]) == (want["label"], 2)
    assert got["probs"] == pytest.approx(want["probs"], abs=1e-5)


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-10, 60000) | st.floats() | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=9), inner, max_size=3),
    max_leaves=8,
)
_TEXT = st.text(max_size=30)
_TASK_INPUT = st.fixed_dictionaries(
    {},
    optional={
        "text": _TEXT | _JSON,
        "premise": _TEXT,
        "hypothesis": _TEXT,
        "text_a": _TEXT,
        "text_b": _TEXT,
        "context": _TEXT,
        "question": _TEXT,
        "choices": st.lists(_TEXT, max_size=4) | _JSON,
    },
)
_BODIES = (
    st.fixed_dictionaries(
        {"model": st.sampled_from(["lm", *TASKS, "other"]) | _JSON},
        optional={
            "input": _TEXT
            | st.lists(_TEXT, max_size=3)
            | _TASK_INPUT
            | st.lists(_TASK_INPUT, max_size=3)
            | st.lists(st.integers(-2, 60000), max_size=4)
            | _JSON,
            "encoding_format": st.sampled_from(["float", "base64"]) | _JSON,
            "dimensions": st.just(32) | _JSON,
            "user": _TEXT | _JSON,
        },
    ).map(lambda d: json.dumps(d).encode())
    | _JSON.map(lambda v: json.dumps(v).encode())
    | st.binary(max_size=60)
)


def test_any_body_gets_an_answer_never_a_server_error_and_the_server_stays_healthy(server):
    paths = st.sampled_from(["/v1/classify", "/v1/embeddings"])
    answers_any_request(server, st.tuples(paths, _BODIES), max_examples=80)
