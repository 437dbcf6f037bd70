"""The server's settings: :class:`ServeConfig` (what to serve, where) and :class:`ServeLimits` (what
one request may ask for, and how much work waits at once). ``gptkit serve``'s flags are their fields."""

from __future__ import annotations

from dataclasses import dataclass, field

from gptkit.generation.text import InferenceConfig

MAX_CHOICES_PER_PROMPT = 8  # the most `n` may be (and no more than max_batch)
DEFAULT_POOLING_BATCH = 16  # classify/embeddings inputs a forward pass, where --max-batch is not given


@dataclass(frozen=True)
class ServeLimits:
    """Bounds that keep a server responsive whatever its clients send."""

    max_batch: int | None = field(
        default=None,
        metadata={
            "help": "Sequences decoded together (default: measured at start, the batch past which more "
            "sequences stop adding tokens a second, within the memory; 16 without the native kernels); "
            "inputs of one classify/embeddings forward (default 16)."
        },
    )
    cache_mib: int | None = field(
        default=None,
        metadata={
            "help": "MiB of keys and values for the sequences decoded together, in pages (default: the whole "
            "context for every sequence, within half the memory available; only what is used is resident)."
        },
    )
    step_tokens: int = field(
        default=256,
        metadata={
            "help": "Prompt tokens a decoding step runs beside the running sequences' next tokens: more "
            "starts new requests sooner, fewer keeps the running ones' pace."
        },
    )
    max_queue: int = field(
        default=64,
        metadata={
            "help": "Sequences (and, apart, classify/embeddings inputs) waiting; past it requests get "
            "HTTP 429."
        },
    )
    max_tokens_limit: int = field(
        default=512, metadata={"help": "The largest max_tokens a request may ask for."}
    )
    max_body_bytes: int = field(default=1_000_000, metadata={"help": "Larger request bodies get HTTP 413."})
    request_timeout: float = field(
        default=120.0, metadata={"help": "Seconds a request may wait and generate, in all."}
    )
    batch_wait_ms: float = field(
        default=5.0,
        metadata={
            "help": "Milliseconds a classify/embeddings batch waits to fill once its first input has arrived."
        },
    )

    def __post_init__(self) -> None:
        for name in (
            "max_batch",
            "cache_mib",
            "step_tokens",
            "max_queue",
            "max_tokens_limit",
            "max_body_bytes",
        ):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not self.request_timeout > 0:
            raise ValueError(f"request_timeout must be > 0 seconds, got {self.request_timeout}")
        if not 0 <= self.batch_wait_ms <= 1000:
            raise ValueError(f"batch_wait_ms must be in 0..1000 milliseconds, got {self.batch_wait_ms}")

    @property
    def max_n(self) -> int:
        return min(MAX_CHOICES_PER_PROMPT, self.max_batch or MAX_CHOICES_PER_PROMPT)

    @property
    def pooling_batch(self) -> int:
        """Inputs of one classify/embeddings forward pass."""
        return self.max_batch or DEFAULT_POOLING_BATCH


@dataclass
class ServeConfig(InferenceConfig):
    """Serve models over HTTP: OpenAI's completions (continuous batching) and embeddings, vLLM's classify."""

    model: list[str] = field(
        metadata={
            "help": "Model folder (HF, gptkit, converted GPT-1 release, or one written by `gptkit "
            "finetune`) or Hub name (gpt2, openai-gpt, org/name@rev); NAME=DIR names it in the API. "
            "Repeat to serve several models.",
            "repeat": True,
            "metavar": "[NAME=]DIR",
        }
    )
    tokenizer: str | None = field(
        default=None,
        metadata={"help": "Tokenizer folder or Hub name of a single language model (default: the model's)."},
    )
    host: str = field(
        default="127.0.0.1",
        metadata={"help": "Address to listen on; 127.0.0.1 takes connections from this machine only."},
    )
    port: int = field(default=8000, metadata={"help": "TCP port."})
    api_key: str | None = field(
        default=None,
        metadata={
            "help": "Clients must send 'Authorization: Bearer KEY' (default: $GPTKIT_API_KEY; unset: no key)."
        },
    )
    limits: ServeLimits = field(default_factory=ServeLimits)
    cors_origin: list[str] | None = field(
        default=None,
        metadata={
            "help": "Allow browser pages from these origins (default: none, CORS off).",
            "metavar": "ORIGIN",
        },
    )
    model_name: str | None = field(
        default=None,
        metadata={
            "help": "The name in the API of a single model given as a bare DIR (default: the directory's name)."
        },
    )

    def __post_init__(self) -> None:
        if isinstance(self.model, str):  # one directory, as a library caller may write it
            self.model = [self.model]
        if not 0 < self.port < 65536:
            raise ValueError(f"port must be in 1..65535, got {self.port}")
