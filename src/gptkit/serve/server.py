"""``gptkit serve``: load a model, start the engine and answer HTTP until Ctrl-C or SIGTERM."""

from __future__ import annotations

import contextlib
import ipaddress
import signal
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

from gptkit.generation import load_for_generation
from gptkit.serve.config import ServeLimits
from gptkit.serve.engine import Engine


def run_server(
    model_dir: str | Path,
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
    """Serve ``model_dir`` with OpenAI's completions protocol on ``host:port`` until a signal.

    Ctrl-C or SIGTERM stops taking connections, lets the requests in flight finish (for at most
    ``request_timeout`` seconds more), then stops the engine, and returns.
    """
    try:
        import uvicorn

        from gptkit.serve.app import create_app
    except ImportError as e:
        raise ImportError(f"gptkit serve needs the serve extra: pip install 'gptkit[serve]' ({e})") from e
    limits = limits or ServeLimits()
    if not 0 < port < 65536:
        raise ValueError(f"port must be in 1..65535, got {port}")
    model, tokenizer = load_for_generation(
        model_dir, tokenizer_dir, dtype=dtype, device=device, verbose=True, quantize=quantize
    )
    name = model_name or Path(model_dir).name or "gptkit"
    engine = Engine(model, tokenizer, max_batch=limits.max_batch, max_queue=limits.max_queue)
    app = create_app(
        engine, model_name=name, limits=limits, api_key=api_key, cors_origins=tuple(cors_origins)
    )
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
    print(f"serving {name!r} on http://{host}:{port}/v1 (Ctrl-C to stop)", file=sys.stderr, flush=True)
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
