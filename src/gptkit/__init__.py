"""gptkit: generative pre-training and discriminative fine-tuning of GPT models (GPT-1, GPT-2).

The public API::

    from gptkit import GPT, GPTConfig, Tokenizer, TaskModel, generate_text, stream_text

``gptkit.generate`` is the decoding module (``gptkit.generate.generate`` decodes token ids);
``generate_text``/``stream_text`` take and return text.
"""

from gptkit.config import PRESETS, GPTConfig
from gptkit.model import GPT, GPTOutput, KVCache
from gptkit.task_model import TaskModel
from gptkit.textgen import generate_text, load_for_generation, stream_text
from gptkit.tokenizer import Tokenizer

__version__ = "0.1.0"

__all__ = [
    "GPT",
    "GPTConfig",
    "GPTOutput",
    "KVCache",
    "PRESETS",
    "TaskModel",
    "Tokenizer",
    "generate_text",
    "load_for_generation",
    "stream_text",
    "__version__",
]
