"""The server's counters, in Prometheus' text exposition format (no client library needed)."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Sequence

from gptkit.serve.engine import PHASES
from gptkit.serve.models import ServedModel

LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)  # seconds


class Metrics:
    """HTTP requests by endpoint and status, and how long they took; the language models' decoding
    counters, summed; the classify/embeddings batchers' counters, by model and endpoint."""

    def __init__(self, models: Sequence[ServedModel]):
        self.engines = [model.engine for model in models if model.engine is not None]
        # (model, endpoint, its batcher) of the classify and embeddings endpoints
        self.batchers = [
            (m.name, endpoint, batcher) for m in models for endpoint, batcher in m.batchers.items()
        ]
        self._lock = threading.Lock()
        self.requests: Counter[tuple[str, int]] = Counter()
        self.bucket_counts = [0] * len(LATENCY_BUCKETS)
        self.latency_sum = 0.0
        self.latency_count = 0

    def observe(self, endpoint: str, status: int, seconds: float) -> None:
        with self._lock:
            self.requests[(endpoint, status)] += 1
            self.latency_sum += seconds
            self.latency_count += 1
            for i, bound in enumerate(LATENCY_BUCKETS):
                if seconds <= bound:
                    self.bucket_counts[i] += 1

    def _engines(self, counter: str) -> int:
        return sum(getattr(engine, counter) for engine in self.engines)

    def render(self) -> str:
        with self._lock:
            requests = sorted(self.requests.items())
            buckets, total, count = list(self.bucket_counts), self.latency_sum, self.latency_count
        lines: list[str] = []

        def metric(name: str, kind: str, help: str, samples: list[tuple[str, float]]) -> None:
            """``samples``: (sample name with its labels, value)."""
            lines.extend([f"# HELP {name} {help}", f"# TYPE {name} {kind}"])
            lines.extend(f"{sample} {value:g}" for sample, value in samples)

        metric(
            "gptkit_requests_total",
            "counter",
            "HTTP requests answered, by endpoint and status code.",
            [(f'gptkit_requests_total{{endpoint="{e}",status="{s}"}}', n) for (e, s), n in requests],
        )
        name = "gptkit_request_duration_seconds"
        metric(
            name,
            "histogram",
            "Time from a request's arrival to the end of its response.",
            [(f'{name}_bucket{{le="{bound:g}"}}', n) for bound, n in zip(LATENCY_BUCKETS, buckets)]
            + [(f'{name}_bucket{{le="+Inf"}}', count), (f"{name}_sum", total), (f"{name}_count", count)],
        )
        for name, kind, help, counter in _ENGINE_METRICS:
            metric(name, kind, help, [(name, self._engines(counter))])
        name = "gptkit_engine_phase_seconds_total"
        phases = [(f'{name}{{phase="{p}"}}', sum(e.times.seconds[p] for e in self.engines)) for p in PHASES]
        metric(name, "counter", _PHASE_HELP, phases)
        name = "gptkit_engine_step_tokens_total"
        kinds = [("prompt", "prefill_tokens"), ("decode", "decode_tokens")]
        tokens = [(f'{name}{{kind="{k}"}}', sum(getattr(e.times, a) for e in self.engines)) for k, a in kinds]
        metric(
            name,
            "counter",
            "Tokens the engine's steps ran: prompt tokens and decoding sequences' next inputs.",
            tokens,
        )
        for name, kind, help, counter in _POOLING_METRICS:
            samples = [
                (f'{name}{{model="{_label(model)}",endpoint="{endpoint}"}}', getattr(batcher, counter))
                for model, endpoint, batcher in self.batchers
            ]
            metric(name, kind, help, samples)
        return "\n".join(lines) + "\n"


def _label(value: str) -> str:
    """A label value as the exposition format writes it."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


# The engines' counters, summed over the served models: (metric, kind, help, the engines' field).
_ENGINE_METRICS = (
    ("gptkit_generated_tokens_total", "counter", "Completion tokens decoded.", "generated_tokens"),
    ("gptkit_prompt_tokens_total", "counter", "Prompt tokens read.", "prompt_tokens"),
    (
        "gptkit_sequences_finished_total",
        "counter",
        "Sequences that reached a finish (length or stop).",
        "finished_sequences",
    ),
    (
        "gptkit_sequences_cancelled_total",
        "counter",
        "Sequences stopped because their client went away.",
        "cancelled_sequences",
    ),
    ("gptkit_engine_steps_total", "counter", "Decoding steps of the running batch.", "steps"),
    ("gptkit_queue_length", "gauge", "Sequences waiting for a row of the batch.", "queue_length"),
    ("gptkit_running_sequences", "gauge", "Sequences in the running batch.", "batch_size"),
)
_PHASE_HELP = (
    "Seconds the engines spent in each phase of their loop: admission (taking waiting sequences), "
    "prefill (steps that ran prompt tokens), decode (steps of next tokens only), sampling, detokenize "
    "and handoff (passing a step's events to the event loop)."
)
# The classify/embeddings batchers' counters, one sample a model and endpoint.
_POOLING_METRICS = (
    ("gptkit_pooling_batches_total", "counter", "Forward passes of classify/embeddings batches.", "batches"),
    ("gptkit_pooling_inputs_total", "counter", "Classify/embeddings inputs run.", "inputs"),
    ("gptkit_pooling_queue_length", "gauge", "Classify/embeddings inputs waiting.", "queue_length"),
)
