"""Serving fine-tuned models: `gptkit serve`'s /v1/classify under 16 concurrent clients, against
transformers' text-classification pipeline given the sentences in batches of 16 (and, as the gain
from batching, one request at a time); and LoRA adapters of one base in
mixed batches, against the same load sent to one adapter at a time.

The classifier is GPT-2 small's shape (random weights: speed does not depend on them) with GPT-1's
classification head W_y on h_n at `_classify_`, on the CPU; the requests are SST-2 dev sentences,
one sentence each.

(a) requests/s of the server (CLIENTS threads, each sending REQUESTS_PER_CLIENT requests one after
    the other; the server batches what is waiting) against transformers' `pipeline("text-classification")`
    on GPT2ForSequenceClassification holding the same transformer weights and W_y, in this process:
    the same number of sentences in batches of CLIENTS (`batch_size`, padded), and one sentence at a
    time (the gain from batching). The pipeline reads the sentence alone where gptkit's layout adds `_start_`
    and `_classify_` (two tokens more per request for gptkit), so the answers are not compared here:
    tests/test_serve_pooling.py checks the server's against the model run by hand. Both in fp32;
    then the server at its default dtype (`auto`: bf16 on a CPU that multiplies it natively) against
    the pipeline in fp32 (its default) and in bf16: what batching buys, and what the dtype buys.
    And the server against its own step (`classify` on the same batches of CLIENTS sentences, in this
    process): the share of its time spent outside the forward passes.
(b) ADAPTERS LoRA adapters (rank 8) of one base served together, fp32: the same load with every
    request for a different adapter than the one before (batches mix adapters) against all requests
    for one adapter. And the step alone, in this process, on batches of CLIENTS sentences: mixed over
    ADAPTERS adapters, with each row adding its own adapter's terms (the server's way, one pass of the
    base) against grouping by adapter (one pass per adapter), and a batch for one adapter both ways.
Each measurement alternates REPEATS times with the others; medians, with each side's least and most
("on par" where those overlap).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path

import torch
from common import DATA, REPO, emit, skipped, spread_comparison
from serve_throughput import Server, free_port

from gptkit import GPT, GPTConfig
from gptkit.data.registry import read_dataset
from gptkit.data.tasks import EncodedExample, TaskSpec, special_token_ids
from gptkit.hardware import bf16_native
from gptkit.model.lora import AdapterSet
from gptkit.model.task import TaskModel
from gptkit.serve.config import ServeLimits
from gptkit.serve.models import CLASSIFY, classify, classify_mixed, load_models
from gptkit.tokenizer import Tokenizer

CLIENTS, REQUESTS_PER_CLIENT = 16, 8
PEER_REQUESTS = 32
ADAPTERS = 4
REPEATS = 5
STEP_REPEATS = 5  # batches per step measurement
LABELS = ["negative", "positive"]
# What the server's dtype `auto` picks on this CPU: bf16 where it multiplies it natively, else fp32
# (and then the pipeline's bf16, which would crawl, is not measured).
BF16 = bf16_native(torch.device("cpu")).native
AUTO = torch.bfloat16 if BF16 else torch.float32


class ClassifyServer(Server):
    """`gptkit serve` with the named model directories."""

    def __init__(self, models: dict[str, Path], log: Path, dtype: str):
        self.base = f"http://127.0.0.1:{free_port()}"
        self.log = log
        command = [sys.executable, "-m", "gptkit", "serve"]
        for name, directory in models.items():
            command += ["--model", f"{name}={directory}"]
        command += ["--port", self.base.rsplit(":", 1)[1], "--dtype", dtype, "--device", "cpu"]
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


def transformers_pipeline(model: TaskModel, directory: Path, tokenizer_dir: Path, dtype: torch.dtype):
    """transformers' text-classification pipeline on GPT2ForSequenceClassification with the task
    model's transformer weights and W_y (its bias is zero, as initialised; the peer's score has none)."""
    import transformers

    model.gpt.save_pretrained(directory)
    hf = transformers.GPT2ForSequenceClassification.from_pretrained(
        directory, num_labels=len(LABELS), torch_dtype=dtype
    )
    with torch.no_grad():
        assert float(model.head.bias.abs().max()) == 0.0
        hf.score.weight.copy_(model.head.weight.to(dtype))
    hf.config.pad_token_id = 50256
    hf.config.id2label = dict(enumerate(LABELS))
    hf.eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(tokenizer_dir)
    tokenizer.pad_token = tokenizer.convert_ids_to_tokens(50256)  # batches pad with <|endoftext|>
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


def in_batches(pipeline, sentences: list[str]) -> float:
    """Sentences/s of the pipeline given CLIENTS × REQUESTS_PER_CLIENT sentences, CLIENTS a batch."""
    chosen = [sentences[i % len(sentences)] for i in range(CLIENTS * REQUESTS_PER_CLIENT)]
    started = time.perf_counter()
    pipeline(chosen, batch_size=CLIENTS)
    return len(chosen) / (time.perf_counter() - started)


def classify_grouped(
    adapters: AdapterSet, tasks: dict[str, TaskModel], items: list[tuple[str, EncodedExample]]
) -> list[dict]:
    """The step as it was: a batch's inputs grouped by adapter, one forward pass of the base per
    group with that adapter's matrices in place (S-LoRA's grouping)."""
    groups: dict[str, list[int]] = defaultdict(list)
    for i, (name, _) in enumerate(items):
        groups[name].append(i)
    records: list[dict] = [{}] * len(items)
    for name, indices in groups.items():
        with adapters.using(name):
            for i, record in zip(indices, classify(tasks[name], [items[i][1] for i in indices])):
                records[i] = record
    return records


def step_batches(adapters: dict[str, Path], sentences: list[str], names: list[str]) -> tuple:
    """The adapters loaded as the server loads them, and batches of CLIENTS sentences whose input i is
    for adapter names[i % len(names)]."""
    served = load_models(adapters, ServeLimits(), dtype="float32", device="cpu")
    adapter_set, tasks = served[0].batchers[CLASSIFY].shared.run.args
    encoded = tasks[names[0]].encode([{"text": sentence} for sentence in sentences])
    batches = [
        [(names[i % len(names)], encoded[(b * CLIENTS + i) % len(encoded)]) for i in range(CLIENTS)]
        for b in range(STEP_REPEATS)
    ]
    return adapter_set, tasks, batches


def batches_per_second(step, adapter_set: AdapterSet, tasks: dict, batches: list) -> float:
    started = time.perf_counter()
    for batch in batches:
        step(adapter_set, tasks, batch)
    return len(batches) / (time.perf_counter() - started)


def plain_batches_per_second(model: TaskModel, batches: list[list[EncodedExample]]) -> float:
    """:func:`classify`, the server's step for a fine-tuned model, on each batch."""
    started = time.perf_counter()
    for batch in batches:
        classify(model, batch)
    return len(batches) / (time.perf_counter() - started)


def write_models(root: Path, tokenizer: Tokenizer) -> tuple[dict[str, Path], dict]:
    """(a)'s classifier at root/sst2 with the transformers pipelines on its weights (fp32, bf16), and
    (b)'s base with its ADAPTERS adapters: the adapters' folders by name, and the pipelines."""
    from gptkit.testing.adapters import write_adapter_run

    model = write_classifier(root / "sst2", tokenizer)
    pipelines = {
        "peer": transformers_pipeline(model, root / "hf", root / "tokenizer", torch.float32),
        "peer_bf16": transformers_pipeline(model, root / "hf16", root / "tokenizer", torch.bfloat16),
    }
    del model
    torch.manual_seed(0)
    GPT(GPTConfig.from_preset("gpt2", dropout=0.0)).save_pretrained(root / "base")
    tokenizer.save_pretrained(root / "base")
    adapters = {f"task{i}": root / f"task{i}" for i in range(ADAPTERS)}
    for seed, directory in enumerate(adapters.values()):
        write_adapter_run(directory, root / "base", "classification", LABELS, seed, rank=8)
    return adapters, pipelines


def step_workloads(root: Path, adapters: dict[str, Path], sentences: list[str]) -> tuple[dict, list]:
    """The server's own steps, in this process: the plain classifier's in fp32 and bf16 (how much of
    its time the server spends outside the forward passes: HTTP, JSON, tokenization, batching), and
    the adapters' both ways on mixed and single-adapter batches. Each a call giving batches/s, by
    name; and the calls that warm them up."""
    plain = {
        dtype: TaskModel.from_pretrained(root / "sst2", device="cpu").to(dtype)
        for dtype in {torch.float32, AUTO}
    }
    encoded = plain[torch.float32].encode([{"text": sentence} for sentence in sentences])
    plain_batches = [
        [encoded[(b * CLIENTS + i) % len(encoded)] for i in range(CLIENTS)] for b in range(STEP_REPEATS)
    ]
    names = list(adapters)
    step_set, step_tasks, mixed_batches = step_batches(adapters, sentences, names)
    single_batches = [[(names[0], example) for _, example in batch] for batch in mixed_batches]
    steps = {
        "mixed_per_row": (classify_mixed, mixed_batches),
        "mixed_grouped": (classify_grouped, mixed_batches),
        "single_per_row": (classify_mixed, single_batches),
        "single_grouped": (classify_grouped, single_batches),
    }
    workloads = {
        f"plain_{dtype}": partial(plain_batches_per_second, model, plain_batches)
        for dtype, model in plain.items()
    }
    workloads |= {
        name: partial(batches_per_second, step, step_set, step_tasks, batches)
        for name, (step, batches) in steps.items()
    }
    # The steps warm up on one batch; the plain models on all of theirs.
    warm_ups = [
        partial(batches_per_second, step, step_set, step_tasks, batches[:1])
        for step, batches in steps.values()
    ]
    return workloads, warm_ups + [workloads[f"plain_{dtype}"] for dtype in plain]


def measured_runs(
    servers: dict, pipelines: dict, sentences: list[str], names: list[str], steps: dict, warm_ups: list
) -> dict:
    """Every measurement once to warm up, then REPEATS rounds of all of them in turn: each one's
    results by name (requests/s or batches/s)."""
    server, server_auto = servers["float32"], servers["auto"]
    workloads = {
        "served": partial(load, server, ["sst2"], sentences),
        "peer": partial(in_batches, pipelines["peer"], sentences),
        "peer_one": partial(one_at_a_time, pipelines["peer"], sentences),
        "served_auto": partial(load, server_auto, ["sst2"], sentences),
        **({"peer_bf16": partial(in_batches, pipelines["peer_bf16"], sentences)} if BF16 else {}),
        "mixed": partial(load, server, names, sentences),
        "single_adapter": partial(load, server, names[:1], sentences),
    }
    for warm_up in [*workloads.values(), *warm_ups]:
        warm_up()
    runs: dict[str, list[float]] = defaultdict(list)
    for _ in range(REPEATS):
        for name, run in {**workloads, **steps}.items():
            runs[name].append(run())
    return runs


def rows(runs: dict[str, list[float]]) -> list[dict]:
    """The comparisons, each the medians of the rounds with their spreads."""
    served = f"/v1/classify requests/s, {CLIENTS} clients, GPT-2 small shape"
    peer = f"transformers text-classification pipeline (GPT2ForSequenceClassification), batches of {CLIENTS}"
    one = "transformers text-classification pipeline, one at a time (the gain from batching)"
    step = f"classify step, batches of {CLIENTS} sentences/s, fp32"
    mixed = f"{step}, mixed over {ADAPTERS} adapters, each row its own adapter (one pass)"
    table = [
        (f"{served}, fp32", "requests/s", "served", f"{peer}, fp32", "peer", 1),
        (f"{served}, fp32", "requests/s", "served", f"{one}, fp32", "peer_one", 1),
        (f"{served}, dtype auto", "requests/s", "served_auto", f"{peer}, fp32", "peer", 1),
        (f"{served}, dtype auto", "requests/s", "served_auto", f"{peer}, bf16", "peer_bf16", 1),
        (f"{served}, fp32", "requests/s", "served", f"its step alone in one process, fp32 ({CLIENTS} × batches/s)", "plain_torch.float32", CLIENTS),
        (f"{served}, dtype auto", "requests/s", "served_auto", f"its step alone in one process, {'bf16' if BF16 else 'fp32'} ({CLIENTS} × batches/s)", f"plain_{AUTO}", CLIENTS),
        (f"{served} over {ADAPTERS} LoRA adapters of one base, mixed, fp32", "requests/s", "mixed", "the same load for one adapter", "single_adapter", 1),
        (mixed, "batches/s", "mixed_per_row", "grouped by adapter (one pass per adapter)", "mixed_grouped", 1),
        (mixed, "batches/s", "mixed_per_row", "one adapter, each row its own adapter", "single_per_row", 1),
        (f"{step}, one adapter, each row its own adapter", "batches/s", "single_per_row", "one adapter, its matrices in place", "single_grouped", 1),
    ]  # fmt: skip
    return [
        spread_comparison(what, unit, runs[ours], name, [scale * x for x in runs[theirs]])
        if theirs in runs
        else skipped(
            what, unit, name, "this CPU does not multiply bf16 natively (the pipeline's bf16 would crawl)"
        )
        for what, unit, ours, name, theirs, scale in table
    ]


def main() -> None:
    sentences = [e.fields["text"] for e in read_dataset("sst2", "dev", DATA)]
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        tokenizer = Tokenizer.from_pretrained(DATA / "gpt2_bpe")
        tokenizer.save_pretrained(root / "tokenizer")
        adapters, pipelines = write_models(root, tokenizer)
        steps, warm_ups = step_workloads(root, adapters, sentences)
        servers = {
            "float32": ClassifyServer({"sst2": root / "sst2", **adapters}, root / "server.log", "float32"),
            "auto": ClassifyServer({"sst2": root / "sst2"}, root / "server-auto.log", "auto"),
        }
        try:
            for server in servers.values():
                server.wait_ready(timeout=600)
            runs = measured_runs(servers, pipelines, sentences, list(adapters), steps, warm_ups)
            log = servers["auto"].log.read_text().splitlines()
            auto_dtype = next(line for line in log if "dtype" in line)
        finally:
            for server in servers.values():
                server.stop()
    emit(
        "serve_classify",
        rows(runs),
        runs=dict(runs),
        auto_dtype=auto_dtype,
    )


if __name__ == "__main__":
    main()
