"""lm-evaluation-harness on a gptkit model: local tasks (multiple choice, loglikelihood, rolling
loglikelihood, generation) through lm-eval's own evaluator, checked against log-probabilities and
greedy continuations computed here by hand, one unbatched forward pass at a time."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from gptkit import GPT, GPTConfig, Tokenizer

pytest.importorskip("lm_eval")
harness = pytest.importorskip("gptkit.evaluate.harness")

CONTEXT = 32
MULTIPLE_CHOICE = [
    {"question": "The cat sat on the", "choices": ["mat", "moon", "idea"], "answer": 0},
    {"question": "Water is", "choices": ["dry", "wet"], "answer": 1},
    {"question": "One, two,", "choices": ["three", "blue", "seven", "tree"], "answer": 0},
]
# lm-eval strips a target's spaces, and moves a context's trailing space to the continuation's start.
LOGLIKELIHOOD = [
    {"context": "Alice was beginning to get very ", "continuation": "tired"},
    {"context": "Down, down, down. ", "continuation": "Would the fall never come to an end?"},
    # Longer than the context: its start is cut off.
    {"context": "So she was considering in her own mind " * 6, "continuation": "rabbit"},
]
ROLLING = [
    {"text": "Curiouser and curiouser!"},
    # Two of lm-eval's windows at this context: 31 tokens, then the rest after the 31 before it.
    {
        "text": "Alice was not a bit hurt, and she jumped up on to her feet in a moment: she looked up, "
        "but it was all dark overhead."
    },
]
GENERATION = [
    {"prompt": "Once upon a time", "target": "x"},
    {"prompt": "The Queen said", "target": "y"},
    {"prompt": "Off with", "target": "z"},
]
TASKS = {
    "tiny_mc": (
        MULTIPLE_CHOICE,
        {
            "output_type": "multiple_choice",
            "doc_to_text": "{{question}}",
            "doc_to_choice": "{{choices}}",
            "doc_to_target": "{{answer}}",
            "metric_list": [{"metric": "acc"}, {"metric": "acc_norm"}],
        },
    ),
    "tiny_ll": (
        LOGLIKELIHOOD,
        {
            "output_type": "loglikelihood",
            "doc_to_text": "{{context}}",
            "doc_to_target": "{{continuation}}",
            "metric_list": [{"metric": "perplexity"}, {"metric": "acc"}],
        },
    ),
    "tiny_rolling": (
        ROLLING,
        {
            "output_type": "loglikelihood_rolling",
            "doc_to_text": "",
            "doc_to_target": "{{text}}",
            "metric_list": [{"metric": "word_perplexity"}],
        },
    ),
    "tiny_gen": (
        GENERATION,
        {
            "output_type": "generate_until",
            "doc_to_text": "{{prompt}}",
            "doc_to_target": "{{target}}",
            "generation_kwargs": {"until": ["\n"], "max_gen_toks": 6, "do_sample": False},
            "metric_list": [{"metric": "exact_match"}],
        },
    ),
}


@pytest.fixture(scope="module")
def model_dir(small_tokenizer, tmp_path_factory) -> Path:
    """A tiny random GPT-2-shaped model with a small byte-level tokenizer, as a model directory."""
    tokenizer = Tokenizer.from_pretrained(small_tokenizer)
    torch.manual_seed(0)
    model = GPT(
        GPTConfig(
            vocab_size=len(tokenizer), context_length=CONTEXT, n_layer=1, n_head=2, d_model=32, dropout=0.0
        )
    )
    directory = tmp_path_factory.mktemp("model")
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def task_dir(tmp_path_factory) -> Path:
    """The tasks as lm-eval YAML over local JSON lines (``dataset_path: json``): nothing downloaded."""
    directory = tmp_path_factory.mktemp("tasks")
    for name, (rows, settings) in TASKS.items():
        harness.write_local_task(directory, name, rows, settings)
    return directory


@pytest.fixture(scope="module")
def evaluated(model_dir, task_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("results")
    config = harness.HarnessConfig(
        model=str(model_dir),
        tasks=list(TASKS),
        include_path=str(task_dir),
        include_defaults=False,
        batch_size=2,
        device="cpu",
        output_path=str(out),
        log_samples=True,
    )
    results = harness.run_harness(config)
    return results, out


def logprob(model: GPT, context: list[int], continuation: list[int]) -> tuple[float, bool]:
    """log P(continuation | context) and whether each token is the argmax, in one plain forward pass."""
    ids = (context + continuation)[-(CONTEXT):]
    start = len(ids) - len(continuation)
    with torch.no_grad():
        log_probs = model(torch.tensor([ids])).logits[0].double().log_softmax(-1)
    rows = log_probs[start - 1 : len(ids) - 1]
    targets = torch.tensor(continuation)
    total = float(rows.gather(1, targets[:, None]).sum())
    return total, bool((rows.argmax(-1) == targets).all())


def pair(tokenizer: Tokenizer, context: str, continuation: str) -> tuple[list[int], list[int]]:
    """lm-eval's split of a pair into tokens: the whole text's tokens after the context's."""
    whole, head = tokenizer.encode(context + continuation), tokenizer.encode(context)
    return head, whole[len(head) :]


def samples_of(results: dict, task: str) -> list[dict]:
    return sorted(results["samples"][task], key=lambda sample: sample["doc_id"])


@pytest.fixture(scope="module")
def reference(model_dir):
    return GPT.from_pretrained(model_dir).eval(), Tokenizer.from_pretrained(model_dir)


def test_multiple_choice_and_loglikelihoods_are_the_models(evaluated, reference):
    (results, _), (model, tokenizer) = evaluated, reference
    correct, correct_norm = [], []
    for row, sample in zip(MULTIPLE_CHOICE, samples_of(results, "tiny_mc")):
        scores = [logprob(model, *pair(tokenizer, row["question"], " " + c))[0] for c in row["choices"]]
        got = [float(response[0][0]) for response in sample["resps"]]  # samples hold them as text
        assert got == pytest.approx(scores, abs=1e-4)
        correct.append(max(range(len(scores)), key=scores.__getitem__) == row["answer"])
        per_char = [s / len(c) for s, c in zip(scores, row["choices"])]  # lm-eval: the choice's characters
        correct_norm.append(max(range(len(scores)), key=per_char.__getitem__) == row["answer"])
    metrics = results["results"]["tiny_mc"]
    assert metrics["acc,none"] == pytest.approx(sum(correct) / len(correct))
    assert metrics["acc_norm,none"] == pytest.approx(sum(correct_norm) / len(correct_norm))

    greedy = []
    for row, sample in zip(LOGLIKELIHOOD, samples_of(results, "tiny_ll")):
        expected, is_greedy = logprob(
            model, *pair(tokenizer, row["context"].rstrip(), " " + row["continuation"])
        )
        ((got, got_greedy),) = sample["resps"][0]
        assert float(got) == pytest.approx(expected, abs=1e-4) and str(got_greedy) == str(is_greedy)
        greedy.append(is_greedy)
    assert results["results"]["tiny_ll"]["acc,none"] == pytest.approx(sum(greedy) / len(greedy))


def test_rolling_loglikelihood_scores_every_token_once(evaluated, reference):
    (results, _), (model, tokenizer) = evaluated, reference
    eot = tokenizer.special_tokens["<|endoftext|>"]
    window = CONTEXT - 1  # tokens a window predicts (see harness_model.GptkitLM.loglikelihood_rolling)
    for row, sample in zip(ROLLING, samples_of(results, "tiny_rolling")):
        ids = tokenizer.encode(row["text"])
        assert len(ids) <= 2 * window
        expected = logprob(model, [eot], ids[:window])[0]
        if len(ids) > window:  # the rest, after as many tokens as the window holds
            end = len(ids)
            expected += logprob(model, ids[end - window - 1 : window], ids[window:])[0]
        assert float(sample["resps"][0][0]) == pytest.approx(expected, abs=1e-4)


def test_generation_is_gptkits_greedy_continuation_cut_at_the_stop(evaluated, reference):
    (results, out), (model, tokenizer) = evaluated, reference
    eot = tokenizer.special_tokens["<|endoftext|>"]
    for row, sample in zip(GENERATION, samples_of(results, "tiny_gen")):
        ids = tokenizer.encode(row["prompt"])
        new = []
        for _ in range(6):  # max_gen_toks; no KV cache, no batch
            with torch.no_grad():
                token = int(model(torch.tensor([ids + new])).logits[0, -1].argmax())
            if token == eot:
                break
            new.append(token)
        expected = tokenizer.decode(new).split("\n")[0]
        assert sample["resps"][0][0] == expected
    exact = [s["resps"][0][0] == r["target"] for r, s in zip(GENERATION, samples_of(results, "tiny_gen"))]
    assert results["results"]["tiny_gen"]["exact_match,none"] == sum(exact) / len(exact)
    # lm-eval's own results file, where `lm_eval --output_path` puts it.
    (written,) = out.glob("*/results_*.json")
    assert (
        json.loads(written.read_text())["results"]["tiny_mc"]["acc,none"]
        == results["results"]["tiny_mc"]["acc,none"]
    )
    assert math.isfinite(results["results"]["tiny_rolling"]["word_perplexity,none"])


def test_the_harness_command_prints_and_writes_lm_evals_results(
    evaluated, model_dir, task_dir, tmp_path, capsys
):
    from gptkit.cli import main

    out = tmp_path / "out"
    args = ["harness", "--model", str(model_dir), "--tasks", "tiny_mc", "--include-path", str(task_dir)]
    assert main([*args, "--no-include-defaults", "--device", "cpu", "--output-path", str(out)]) == 0
    printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    expected = evaluated[0]["results"]["tiny_mc"]["acc,none"]
    assert printed["results"]["tiny_mc"]["acc,none"] == expected
    (written,) = out.glob("*/results_*.json")
    assert json.loads(written.read_text())["results"]["tiny_mc"]["acc,none"] == expected


def test_without_lm_eval_the_command_names_the_extra(monkeypatch, capsys):
    import sys

    from gptkit.cli import main

    monkeypatch.setitem(sys.modules, "lm_eval", None)  # not installed
    monkeypatch.delitem(sys.modules, "gptkit.evaluate.harness")
    monkeypatch.delitem(sys.modules, "gptkit.evaluate.harness_model", raising=False)
    # The command's config imports without lm-eval: every command's flags are read without it.
    with pytest.raises(SystemExit) as help_page:
        main(["harness", "--help"])
    assert help_page.value.code == 0 and "--include-path" in capsys.readouterr().out
    assert main(["harness", "--model", "m", "--tasks", "t"]) == 2
    assert capsys.readouterr().err.strip() == (
        "gptkit harness: error: gptkit harness needs lm-evaluation-harness: pip install -e '.[eval]'"
    )


def test_the_same_as_lm_evals_own_hf_backend_on_the_same_checkpoint(evaluated, model_dir, task_dir):
    """transformers loads the model directory whole (weights and tokenizer): lm-eval's `hf` backend
    scores the same requests to 1e-4 and generates the same text; the accuracies are equal."""
    pytest.importorskip("transformers")
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    ours = evaluated[0]
    tasks = ["tiny_mc", "tiny_ll", "tiny_gen"]
    theirs = simple_evaluate(
        model="hf", model_args={"pretrained": str(model_dir), "dtype": "float32"}, tasks=tasks,
        task_manager=TaskManager(include_path=str(task_dir), include_defaults=False), device="cpu",
        batch_size=2, log_samples=True,
    )  # fmt: skip
    for task in tasks:
        for name, value in ours["results"][task].items():
            if name.startswith(("acc", "exact_match")) and "stderr" not in name:
                assert theirs["results"][task][name] == value, (task, name)
        for a, b in zip(samples_of(ours, task), samples_of(theirs, task)):
            if task == "tiny_gen":
                assert a["resps"] == b["resps"]
            elif not (task == "tiny_ll" and a["doc_id"] == 2):  # over the context: hf keeps one more token
                ours_ll = [float(response[0][0]) for response in a["resps"]]
                assert ours_ll == pytest.approx([float(response[0][0]) for response in b["resps"]], abs=1e-4)
