"""An OpenAI-compatible server (the ``serve`` extra): completions with continuous batching for
language models, classify (vLLM's protocol) for fine-tuned models, embeddings for every model.

``gptkit serve --model [NAME=]DIR ...`` or :func:`run_server` with a :class:`ServeConfig` (the
command's flags are its fields); :class:`Engine` is the batching decode loop, usable without HTTP. FastAPI and uvicorn are imported only when the server starts.
"""

from gptkit.generation.sampling import SamplingParams
from gptkit.serve.config import ServeConfig, ServeLimits
from gptkit.serve.engine import Engine, Event, GenerationRequest
from gptkit.serve.server import run_server

__all__ = [
    "Engine",
    "Event",
    "GenerationRequest",
    "SamplingParams",
    "ServeConfig",
    "ServeLimits",
    "run_server",
]
