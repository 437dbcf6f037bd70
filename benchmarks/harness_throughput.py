"""lm-evaluation-harness speed: gptkit's model type against lm-eval's own ``hf`` backend, same weights.

One model directory (GPT-2 small's shape, random weights: speed does not depend on them; gptkit
writes it in the Hugging Face layout, with GPT-2's tokenizer, so both backends read the same files)
and two local tasks over real text, as lm-eval YAML over JSON lines (nothing downloaded):

- multiple choice: Story Cloze dev stories, the right and the wrong ending scored after the four
  sentences (``loglikelihood`` requests, two per story);
- rolling log-likelihood: WikiText-2 test paragraphs (``loglikelihood_rolling``, lm-eval's windows).

Each backend is built once, outside the clock, and handed to ``lm_eval.simple_evaluate``; the two
alternate, after a warm-up, REPEATS times; medians. Requests per second counts lm-eval's requests
(one per story ending, one per paragraph). The accuracies and perplexities of both are printed
beside the timings and must agree (the test suite checks log-likelihoods within 1e-4).
``--quick`` (or GPTKIT_BENCH_QUICK=1): a 2-layer model and a few examples, a smoke run.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import torch
from common import DATA, comparison, emit, median

from gptkit import GPT, GPTConfig, Tokenizer
from gptkit.data.registry import read_dataset
from gptkit.evaluate.harness import write_local_task

REPEATS = 3
FULL = dict(n_layer=12, d_model=768, n_head=12, context=1024, stories=100, paragraphs=20)
QUICK = dict(n_layer=2, d_model=64, n_head=2, context=128, stories=8, paragraphs=4)
BATCH_SIZE = 32
PEER = "lm-eval's hf backend (transformers GPT2LMHeadModel), same directory"


def write_model(directory: Path, shape: dict) -> None:
    torch.manual_seed(0)
    config = GPTConfig(
        vocab_size=50257,
        context_length=shape["context"],
        n_layer=shape["n_layer"],
        n_head=shape["n_head"],
        d_model=shape["d_model"],
        dropout=0.0,
    )
    GPT(config).save_pretrained(directory)
    Tokenizer.from_pretrained(DATA / "gpt2_bpe").save_pretrained(directory)


def write_tasks(directory: Path, shape: dict) -> list[str]:
    """The two tasks as lm-eval YAML (JSON is YAML) over JSON lines written here."""
    stories = read_dataset("story_cloze", "dev", DATA)[: shape["stories"]]
    rows = {
        "bench_story_cloze": [
            {"context": s.fields["context"], "choices": s.fields["choices"], "answer": s.label}
            for s in stories
        ],
        "bench_wikitext": [
            {"text": paragraph.strip()}
            for paragraph in (DATA / "wikitext2" / "test.txt").read_text(encoding="utf-8").split("\n \n")
            if len(paragraph.split()) > 50
        ][: shape["paragraphs"]],
    }
    settings = {
        "bench_story_cloze": {
            "output_type": "multiple_choice",
            "doc_to_text": "{{context}}",
            "doc_to_choice": "{{choices}}",
            "doc_to_target": "{{answer}}",
            "metric_list": [{"metric": "acc"}],
        },
        "bench_wikitext": {
            "output_type": "loglikelihood_rolling",
            "doc_to_text": "",
            "doc_to_target": "{{text}}",
            "metric_list": [{"metric": "word_perplexity"}],
        },
    }
    for name, task_rows in rows.items():
        write_local_task(directory, name, task_rows, settings[name])
    return list(rows)


def requests_in(results: dict) -> int:
    """lm-eval's requests of a run: one per choice of each multiple-choice example, one per document."""
    counted = 0
    for task, samples in results["samples"].items():
        counted += sum(len(sample["arguments"]) for sample in samples) if task else 0
    return counted


def race_backends(shape: dict) -> tuple[dict[str, list[float]], dict[str, dict], int]:
    """gptkit's backend and lm-eval's hf one over the same model directory and tasks, alternating after a
    warm-up, REPEATS times: each one's seconds a run, its last run's results by task, and the requests
    a run makes."""
    from lm_eval import simple_evaluate
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager

    from gptkit.evaluate.harness_model import GptkitLM

    with tempfile.TemporaryDirectory() as tmp:
        model_dir, task_dir = Path(tmp) / "model", Path(tmp) / "tasks"
        model_dir.mkdir()
        task_dir.mkdir()
        write_model(model_dir, shape)
        tasks = write_tasks(task_dir, shape)
        manager = TaskManager(include_path=str(task_dir), include_defaults=False)
        backends = {
            "gptkit": GptkitLM(pretrained=str(model_dir), batch_size=BATCH_SIZE, device="cpu"),
            "hf": HFLM(pretrained=str(model_dir), batch_size=BATCH_SIZE, device="cpu", dtype="float32"),
        }

        def evaluate(name: str) -> tuple[float, dict]:
            started = time.perf_counter()
            results = simple_evaluate(
                model=backends[name], tasks=tasks, task_manager=manager, log_samples=True, random_seed=0
            )
            return time.perf_counter() - started, results

        for name in backends:  # warm-up: lm-eval builds and caches the tasks' datasets the first time
            evaluate(name)
        seconds: dict[str, list[float]] = {name: [] for name in backends}
        scores = {}
        for _ in range(REPEATS):
            for name in backends:
                elapsed, results = evaluate(name)
                seconds[name].append(elapsed)
                scores[name] = {task: results["results"][task] for task in tasks}
                requests = requests_in(results)
    return seconds, scores, requests


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", default=os.environ.get("GPTKIT_BENCH_QUICK") == "1")
    args = parser.parse_args()
    shape = QUICK if args.quick else FULL
    seconds, scores, requests = race_backends(shape)

    rate = {name: requests / median(times) for name, times in seconds.items()}
    # The scores beside the timings: both backends must agree on them.
    shown = {
        name: {
            "story_cloze_acc": round(scores[name]["bench_story_cloze"]["acc,none"], 4),
            "wikitext_word_perplexity": round(scores[name]["bench_wikitext"]["word_perplexity,none"], 4),
        }
        for name in seconds
    }
    shape_text = f"{shape['n_layer']}L/{shape['d_model']}, ctx {shape['context']}, batch {BATCH_SIZE}, fp32"
    emit(
        "harness_throughput",
        [
            comparison(
                f"lm-eval requests/s, Story Cloze + WikiText-2, {shape_text}",
                "requests/s",
                rate["gptkit"],
                PEER,
                rate["hf"],
            )
        ],
        requests=requests,
        scores=shown,
        seconds=seconds,
    )


if __name__ == "__main__":
    main()
