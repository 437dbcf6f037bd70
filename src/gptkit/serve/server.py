"""``gptkit serve``: load the models, start their loops and answer HTTP until Ctrl-C or SIGTERM."""

from __future__ import annotations

import contextlib
import ipaddress
import signal
import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

from gptkit.serve.config import ServeLimits
from gptkit.serve.models import load_models


def run_server(
    model_dir: str | Path | Mapping[str, str | Path],
    *,
    tokenizer_dir: str | Path | None = None,
    host: str = "127.0.0.1",
    port: int = 8000,
    api_key: str | None = None,
    cors_origins: Sequence[str] = (),
    model_name: str | None = None,
    dtype: str = "auto",
    device: str = "auto",
    limits: ServeLimits | None = None,
    quantize: str = "none",
) -> None:
    """Serve a model directory, or several as {name: directory}, on ``host:port`` until a signal.

    Language models answer OpenAI's completions protocol, fine-tuned models (written by `gptkit
    finetune`) vLLM's classify protocol, and every model OpenAI's embeddings. A single directory is
    named ``model_name``, else after the directory. ``tokenizer_dir`` is for a single language model;
    ``quantize`` applies to language models.

    Ctrl-C or SIGTERM stops taking connections, lets the requests in flight finish (for at most
    ``request_timeout`` seconds more), then stops the models' loops, and returns.
    """
    try:
        import uvicorn

        from gptkit.serve.app import create_app
    except ImportError as e:
        raise ImportError(f"gptkit serve needs the serve extra: pip install 'gptkit[serve]' ({e})") from e
    limits = limits or ServeLimits()
    if not 0 < port < 65536:
        raise ValueError(f"port must be in 1..65535, got {port}")
    if isinstance(model_dir, Mapping):
        if model_name is not None:
            raise ValueError("model_name names a single model: several are named by their keys")
        directories = dict(model_dir)
    else:
        directories = {model_name or Path(model_dir).name or "gptkit": model_dir}
    if tokenizer_dir is not None and len(directories) > 1:
        raise ValueError("--tokenizer is for a single model: each of several is served with its own")
    models = load_models(
        directories, limits, tokenizer_dir=tokenizer_dir, dtype=dtype, device=device, quantize=quantize
    )
    app = create_app(models, limits=limits, api_key=api_key, cors_origins=tuple(cors_origins))
    if not api_key and not _is_loopback(host):
        print(
            f"warning: serving on {host} without an API key: anyone who can reach it may use it",
            file=sys.stderr,
        )
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        timeout_graceful_shutdown=int(limits.request_timeout) + 5,
        log_level="info",
    )
    names = ", ".join(repr(model.name) for model in models)
    print(f"serving {names} on http://{host}:{port}/v1 (Ctrl-C to stop)", file=sys.stderr, flush=True)
    with _signals_end_quietly():
        uvicorn.Server(config).run()


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


@contextlib.contextmanager
def _signals_end_quietly() -> Iterator[None]:
    """uvicorn shuts down gracefully on SIGINT/SIGTERM, then raises the signal again for the handler
    it found; with these no-op handlers the process then exits normally (status 0)."""
    previous = {sig: signal.signal(sig, lambda *_: None) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
