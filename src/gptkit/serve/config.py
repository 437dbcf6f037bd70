"""The server's limits: what one request may ask for, and how much work waits at once."""

from __future__ import annotations

from dataclasses import dataclass

MAX_CHOICES_PER_PROMPT = 8  # the most `n` may be (and no more than max_batch)


@dataclass(frozen=True)
class ServeLimits:
    """Bounds that keep a server responsive whatever its clients send."""

    max_batch: int = 16  # sequences decoded together (rows of the KV cache); inputs per pooling forward
    max_queue: int = 64  # sequences (or pooling inputs) waiting; a request that does not fit gets HTTP 429
    max_tokens_limit: int = 512  # the largest max_tokens a request may ask for
    max_body_bytes: int = 1_000_000  # larger request bodies get HTTP 413
    request_timeout: float = 120.0  # seconds a request may wait and decode, in all
    batch_wait_ms: float = 5.0  # how long a classify/embeddings batch waits to fill after its first input

    def __post_init__(self) -> None:
        for name in ("max_batch", "max_queue", "max_tokens_limit", "max_body_bytes"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not self.request_timeout > 0:
            raise ValueError(f"request_timeout must be > 0 seconds, got {self.request_timeout}")
        if not 0 <= self.batch_wait_ms <= 1000:
            raise ValueError(f"batch_wait_ms must be in 0..1000 milliseconds, got {self.batch_wait_ms}")

    @property
    def max_n(self) -> int:
        return min(MAX_CHOICES_PER_PROMPT, self.max_batch)
