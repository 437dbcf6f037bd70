"""gptkit: generative pre-training and discriminative fine-tuning of GPT models (GPT-1, GPT-2)."""

from gptkit.config import PRESETS, GPTConfig
from gptkit.generate import generate, stream_ids
from gptkit.model import GPT, GPTOutput, KVCache

__version__ = "0.1.0"

__all__ = ["GPT", "GPTConfig", "GPTOutput", "KVCache", "PRESETS", "generate", "stream_ids", "__version__"]
