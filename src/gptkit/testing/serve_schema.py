"""`gptkit serve` fuzzed from its own OpenAPI document: schemathesis generates requests for every
operation (valid ones, and ones that break the schema), each is sent to a real server, and every
answer is checked against the document: no 5xx, a documented status, a documented content type,
a body the schema allows.

Used by tests/test_serve_schema.py (a seeded slice) and benchmarks/fuzz_campaign.py (--server);
benchmarks/serve_soak.py serves its models.
"""

from __future__ import annotations

import collections
from pathlib import Path

import torch

from gptkit.testing.processes import ServerProcess, free_port

LM, CLASSIFIER = "tiny-lm", "tiny-sst"
KEY = "schema-key"


def build_models(root: Path) -> dict[str, Path]:
    """A tiny language model and a tiny fine-tuned classifier, with a 300-token tokenizer."""
    from gptkit import GPT, GPTConfig
    from gptkit.data.tasks import TaskSpec, special_token_ids
    from gptkit.model.task import TaskModel
    from gptkit.tokenizer import train_bpe

    corpus = root / "corpus.txt"
    corpus.write_text("a gem of a film; dull and long; the plot holds, the cast shines.\n" * 200)
    tokenizer = train_bpe([corpus], vocab_size=300, out_dir=root / "tokenizer", show_progress=False)
    torch.manual_seed(0)
    config = GPTConfig.from_preset(
        "tiny", n_layer=1, vocab_size=len(tokenizer), context_length=64, dropout=0.0
    )
    GPT(config).save_pretrained(root / LM)
    tokenizer.save_pretrained(root / LM)
    task_gpt = GPT(
        GPTConfig.from_preset("tiny", n_layer=1, vocab_size=len(tokenizer), n_special=3, dropout=0.0)
    )
    spec = TaskSpec(
        "classification", labels=["neg", "pos"], max_length=32, specials=special_token_ids(tokenizer)
    )
    TaskModel(task_gpt, spec, clf_dropout=0.0, tokenizer=tokenizer).save_pretrained(root / CLASSIFIER)
    return {LM: root / LM, CLASSIFIER: root / CLASSIFIER}


def serve_args(models: dict[str, Path], port: int, key: str | None) -> list[str]:
    """`gptkit serve`'s arguments for ``models`` on 127.0.0.1:``port``: small limits, so generated
    requests stay cheap (at most 16 tokens a completion, 4 sequences at once)."""
    args = ["serve", *(a for name, path in models.items() for a in ("--model", f"{name}={path}"))]
    args += ["--host", "127.0.0.1", "--port", str(port), "--dtype", "float32", "--device", "cpu"]
    args += ["--max-tokens-limit", "16", "--max-batch", "4", "--max-queue", "8", "--request-timeout", "20"]
    return args + (["--api-key", key] if key else [])


def checks():
    from schemathesis.checks import not_a_server_error
    from schemathesis.specs.openapi.checks import (
        content_type_conformance,
        response_schema_conformance,
        status_code_conformance,
    )

    return [
        not_a_server_error,
        status_code_conformance,
        content_type_conformance,
        response_schema_conformance,
    ]


def fuzz_server(base: str, requests_per_operation: int, seed: int, key: str | None) -> dict:
    """Every operation of the server at ``base``, valid and invalid requests alike, sent with the
    right key (when the server has one), a wrong key, and none. Counts requests, answers by status,
    and failures (a 5xx, or an answer the document does not allow), with the first few described."""
    import schemathesis
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import seed as hypothesis_seed
    from hypothesis import strategies as st
    from hypothesis.errors import Unsatisfiable

    schema = schemathesis.openapi.from_url(f"{base}/openapi.json")
    headers = [{"Authorization": f"Bearer {key}"}, {"Authorization": "Bearer wrong"}, {}] if key else [{}]
    statuses: collections.Counter = collections.Counter()
    failures: list[str] = []
    count = [0, 0]  # requests, failures

    def run(operation, mode) -> None:
        label = f"{operation.label} ({mode.value})"

        @settings(
            max_examples=max(requests_per_operation // 2, 1),
            database=None,
            deadline=None,
            phases=[Phase.generate],
            suppress_health_check=list(HealthCheck),
        )
        @hypothesis_seed(seed)
        @given(case=operation.as_strategy(generation_mode=mode), auth=st.sampled_from(headers))
        def one(case, auth) -> None:
            response = case.call(base_url=base, headers=auth, timeout=30)
            count[0] += 1
            statuses[str(response.status_code)] += 1
            try:
                case.validate_response(response, checks=checks(), headers=auth)
            except Exception as e:  # schemathesis's Failure / FailureGroup: what the checks found
                count[1] += 1
                if len(failures) < 10:
                    failures.append(f"{label} -> {response.status_code}: {str(e)[:400]}")

        try:
            one()
        except Unsatisfiable:  # nothing to break in a request without parameters (GET /health)
            pass

    for result in schema.get_all_operations():
        for mode in (schemathesis.GenerationMode.POSITIVE, schemathesis.GenerationMode.NEGATIVE):
            run(result.ok(), mode)
    return {"requests": count[0], "failures": count[1], "statuses": dict(statuses), "failing": failures}


def fuzz_served(
    models: dict[str, Path], requests_per_operation: int, seed: int, key: str | None, log: Path
) -> dict:
    """:func:`fuzz_server` against a server of ``models`` started for it (and stopped after)."""
    port = free_port()
    server = ServerProcess(serve_args(models, port, key), log)
    try:
        server.wait_ready(f"http://127.0.0.1:{port}")
        result = fuzz_server(f"http://127.0.0.1:{port}", requests_per_operation, seed, key)
        result["server_alive"] = server.process.poll() is None
        return result
    finally:
        server.kill()
