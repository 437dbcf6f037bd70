"""An OpenAI-compatible completions server with continuous batching (the ``serve`` extra).

``gptkit serve --model DIR`` or :func:`run_server`; :class:`Engine` is the batching decode loop,
usable without HTTP. FastAPI and uvicorn are imported only when the server starts.
"""

from gptkit.generation.sampling import SamplingParams
from gptkit.serve.config import ServeLimits
from gptkit.serve.engine import Engine, Event, GenerationRequest
from gptkit.serve.server import run_server

__all__ = ["Engine", "Event", "GenerationRequest", "SamplingParams", "ServeLimits", "run_server"]
