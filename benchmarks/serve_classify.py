"""Serving fine-tuned models: `gptkit serve`'s /v1/classify under 16 concurrent clients, against
transformers' text-classification pipeline one request at a time; and LoRA adapters of one base in
mixed batches, against the same load sent to one adapter at a time.

The classifier is GPT-2 small's shape (random weights: speed does not depend on them) with GPT-1's
classification head W_y on h_n at `_classify_`, fp32 on the CPU; the requests are SST-2 dev sentences,
one sentence each.

(a) requests/s of the server (CLIENTS threads, each sending REQUESTS_PER_CLIENT requests one after
    the other; the server batches what is waiting) against transformers' `pipeline("text-classification")`
    on GPT2ForSequenceClassification holding the same transformer weights and W_y, one sentence at a
    time in this process. The pipeline reads the sentence alone where gptkit's layout adds `_start_`
    and `_classify_` (two tokens more per request for gptkit), so the answers are not compared here:
    tests/test_serve_pooling.py checks the server's against the model run by hand.
(b) ADAPTERS LoRA adapters (rank 8) of one base served together: the same load with every request
    for a different adapter than the one before (batches mix adapters; the step runs each adapter's
    rows together) against all requests for one adapter (one adapter per batch).
The server runs as a subprocess on 127.0.0.1; each measurement alternates REPEATS times; medians.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch
from common import DATA, REPO, comparison, emit, median
from serve_throughput import Server, free_port

from gptkit import GPT, GPTConfig
from gptkit.data.readers import read_dataset
from gptkit.data.tasks import TaskSpec, special_token_ids
from gptkit.model.task import TaskModel
from gptkit.tokenizer import Tokenizer

CLIENTS, REQUESTS_PER_CLIENT = 16, 8
PEER_REQUESTS = 32
ADAPTERS = 4
REPEATS = 2
LABELS = ["negative", "positive"]


class ClassifyServer(Server):
    """`gptkit serve` with the named model directories."""

    def __init__(self, models: dict[str, Path], log: Path):
        self.base = f"http://127.0.0.1:{free_port()}"
        self.log = log
        command = [sys.executable, "-m", "gptkit", "serve"]
        for name, directory in models.items():
            command += ["--model", f"{name}={directory}"]
        command += ["--port", self.base.rsplit(":", 1)[1], "--dtype", "float32", "--device", "cpu"]
        command += ["--max-batch", str(CLIENTS), "--max-queue", "256", "--batch-wait-ms", "5"]
        env = {key: value for key, value in os.environ.items() if key != "GPTKIT_API_KEY"}
        with open(log, "wb") as out:
            self.process = subprocess.Popen(command, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)


def write_classifier(directory: Path, tokenizer: Tokenizer) -> TaskModel:
    torch.manual_seed(0)
    specials = special_token_ids(tokenizer)
    gpt = GPT(GPTConfig.from_preset("gpt2", dropout=0.0))
    gpt.add_special_tokens(max(specials.values()) + 1 - gpt.config.total_vocab_size)
    spec = TaskSpec("classification", labels=LABELS, specials=specials)
    model = TaskModel(gpt, spec, clf_dropout=0.0, tokenizer=tokenizer)
    model.save_pretrained(directory)
    return model


def transformers_pipeline(model: TaskModel, directory: Path, tokenizer_dir: Path):
    """transformers' text-classification pipeline on GPT2ForSequenceClassification with the task
    model's transformer weights and W_y (its bias is zero, as initialised; the peer's score has none)."""
    import transformers

    model.gpt.save_pretrained(directory)
    hf = transformers.GPT2ForSequenceClassification.from_pretrained(directory, num_labels=len(LABELS))
    with torch.no_grad():
        assert float(model.head.bias.abs().max()) == 0.0
        hf.score.weight.copy_(model.head.weight)
    hf.config.pad_token_id = 50256
    hf.config.id2label = dict(enumerate(LABELS))
    hf.eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(tokenizer_dir)
    return transformers.pipeline("text-classification", model=hf, tokenizer=tokenizer, device="cpu")


def load(server: Server, names: list[str], sentences: list[str]) -> float:
    """Requests per second: CLIENTS threads, request i of a client for model names[i % len(names)]."""
    import httpx

    def client(offset: int) -> None:
        with httpx.Client(timeout=300) as http:
            for i in range(REQUESTS_PER_CLIENT):
                name = names[(offset + i) % len(names)]
                sentence = sentences[(offset * REQUESTS_PER_CLIENT + i) % len(sentences)]
                response = http.post(f"{server.base}/v1/classify", json={"model": name, "input": sentence})
                response.raise_for_status()

    started = time.perf_counter()
    with ThreadPoolExecutor(CLIENTS) as pool:
        list(pool.map(client, range(CLIENTS)))
    return CLIENTS * REQUESTS_PER_CLIENT / (time.perf_counter() - started)


def one_at_a_time(pipeline, sentences: list[str]) -> float:
    started = time.perf_counter()
    for sentence in sentences[:PEER_REQUESTS]:
        pipeline(sentence)
    return PEER_REQUESTS / (time.perf_counter() - started)


def main() -> None:
    from tests.test_lora import write_adapter_run

    sentences = [e.fields["text"] for e in read_dataset("sst2", "dev", DATA)]
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        tokenizer = Tokenizer.from_pretrained(DATA / "gpt2_bpe")
        tokenizer.save_pretrained(root / "tokenizer")
        model = write_classifier(root / "sst2", tokenizer)
        pipeline = transformers_pipeline(model, root / "hf", root / "tokenizer")
        del model
        # (b)'s base and its adapters
        torch.manual_seed(0)
        GPT(GPTConfig.from_preset("gpt2", dropout=0.0)).save_pretrained(root / "base")
        tokenizer.save_pretrained(root / "base")
        adapters = {f"task{i}": root / f"task{i}" for i in range(ADAPTERS)}
        for seed, directory in enumerate(adapters.values()):
            write_adapter_run(directory, root / "base", "classification", LABELS, seed, rank=8)

        server = ClassifyServer({"sst2": root / "sst2", **adapters}, root / "server.log")
        try:
            server.wait_ready(timeout=600)
            load(server, ["sst2"], sentences)  # warm-up
            load(server, list(adapters), sentences)
            one_at_a_time(pipeline, sentences)
            served, peer, mixed, single = [], [], [], []
            for _ in range(REPEATS):
                served.append(load(server, ["sst2"], sentences))
                peer.append(one_at_a_time(pipeline, sentences))
                mixed.append(load(server, list(adapters), sentences))
                single.append(load(server, [next(iter(adapters))], sentences))
        finally:
            server.stop()

    emit(
        "serve_classify",
        [
            comparison(
                f"/v1/classify requests/s, {CLIENTS} clients, GPT-2 small shape, fp32",
                "requests/s",
                median(served),
                "transformers text-classification pipeline (GPT2ForSequenceClassification), one at a time",
                median(peer),
            ),
            comparison(
                f"/v1/classify requests/s, {CLIENTS} clients over {ADAPTERS} LoRA adapters of one base, mixed",
                "requests/s",
                median(mixed),
                "the same load for one adapter",
                median(single),
            ),
        ],
        runs={"served": served, "peer": peer, "mixed": mixed, "single_adapter": single},
    )


if __name__ == "__main__":
    main()
