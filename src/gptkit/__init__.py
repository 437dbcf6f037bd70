"""gptkit: generative pre-training and discriminative fine-tuning of GPT models (GPT-1, GPT-2).

The public API::

    from gptkit import GPT, GPTConfig, Tokenizer, TaskModel, SamplingParams, generate, generate_text

``generate`` decodes token ids, ``generate_text``/``stream_text`` take and return text; how tokens
are chosen is one :class:`SamplingParams` (:mod:`gptkit.generation`).
"""

from gptkit.config import PRESETS, GPTConfig
from gptkit.generation import SamplingParams, generate, generate_text, load_for_generation, stream_text
from gptkit.model import GPT, GPTOutput, KVCache
from gptkit.model.task import TaskModel
from gptkit.tokenizer import Tokenizer

__version__ = "0.1.0"

__all__ = [
    "GPT",
    "GPTConfig",
    "GPTOutput",
    "KVCache",
    "PRESETS",
    "SamplingParams",
    "TaskModel",
    "Tokenizer",
    "generate",
    "generate_text",
    "load_for_generation",
    "stream_text",
    "__version__",
]
