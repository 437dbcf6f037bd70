"""``gptkit serve``: load the models, start their loops and answer HTTP until Ctrl-C or SIGTERM."""

from __future__ import annotations

import contextlib
import gc
import ipaddress
import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

from gptkit.serve.config import ServeConfig
from gptkit.serve.models import load_models, name_models


def run_server(config: ServeConfig) -> None:
    """Serve ``config.model`` (directories, ``NAME=DIR`` to name one) on ``host:port`` until a signal.

    Language models answer OpenAI's completions protocol, fine-tuned models (written by `gptkit
    finetune`) vLLM's classify protocol, and every model OpenAI's embeddings. A bare directory is
    named ``model_name`` when it is the only model, else after the directory. ``tokenizer`` is for a
    single language model; ``quantize`` applies to language models. Without ``api_key``, the
    ``GPTKIT_API_KEY`` environment variable's key (if set) is asked of clients.

    Ctrl-C or SIGTERM stops taking connections, lets the requests in flight finish (for at most
    ``request_timeout`` seconds more), then stops the models' loops, and returns.
    """
    try:
        import uvicorn

        from gptkit.serve.app import create_app
    except ImportError as e:
        raise ImportError(f"gptkit serve needs the serve extra: pip install -e '.[serve]' ({e})") from e
    limits, host = config.limits, config.host
    directories = name_models(config.model, config.model_name)
    if config.tokenizer is not None and len(directories) > 1:
        raise ValueError("--tokenizer is for a single model: each of several is served with its own")
    models = load_models(
        directories,
        limits,
        tokenizer_dir=config.tokenizer,
        dtype=config.dtype,
        device=config.device,
        quantize=config.quantize,
    )
    # What is loaded stays for the server's life: out of the collector's way, so that the full
    # collections a serving loop's allocations trigger do not walk the models and tokenizers
    # (4-5% of a step's time at 64 sequences, profiled).
    gc.collect()
    gc.freeze()
    api_key = config.api_key or os.environ.get("GPTKIT_API_KEY") or None
    app = create_app(models, limits=limits, api_key=api_key, cors_origins=tuple(config.cors_origin or ()))
    if not api_key and not _is_loopback(host):
        print(
            f"warning: serving on {host} without an API key: anyone who can reach it may use it",
            file=sys.stderr,
        )
    server = uvicorn.Server(
        uvicorn.Config(
            app,
            host=host,
            port=config.port,
            timeout_graceful_shutdown=int(limits.request_timeout) + 5,
            log_level="info",
        )
    )
    names = ", ".join(repr(model.name) for model in models)
    print(f"serving {names} on http://{host}:{config.port}/v1 (Ctrl-C to stop)", file=sys.stderr, flush=True)
    with _signals_end_quietly():
        server.run()


def restart_with_sleeping_threads() -> None:
    """Run this command again in a process whose OpenMP threads sleep between parallel regions
    (``OMP_WAIT_POLICY=passive``), unless the variable is set. By default PyTorch's OpenMP runtime
    (libgomp, read once as it loads) keeps its threads spinning for a while after every region: in
    a server, after every step, they spin on the cores the event loop and the clients need (16
    streaming clients, fp32 GPT-2 small, 2 cores: 2-3% more tokens a second with them asleep,
    alternating). The native step's own barrier already sleeps after a bounded spin (team.h). Only
    where this process is the ``gptkit`` command itself: a program that calls ``run_server`` or
    ``gptkit.cli.main`` keeps its process."""
    if "OMP_WAIT_POLICY" in os.environ or getattr(sys, "frozen", False) or not _running_as_the_command():
        return
    environment = {**os.environ, "OMP_WAIT_POLICY": "passive"}
    os.execve(sys.executable, [sys.executable, "-m", "gptkit", *sys.argv[1:]], environment)


def _running_as_the_command() -> bool:
    """Whether this process is ``gptkit ...``: the console script, or ``python -m gptkit``."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    if spec is not None:
        return spec.name in ("gptkit", "gptkit.__main__")
    return Path(sys.argv[0]).name == "gptkit"


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
