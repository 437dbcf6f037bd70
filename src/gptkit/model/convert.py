"""`gptkit convert`: read weights in any layout gptkit reads, write them as a HF/gptkit directory."""

from __future__ import annotations

from dataclasses import dataclass, field

from gptkit.model.network import GPT


@dataclass
class ConvertConfig:
    """Convert weights: a HF directory, a gptkit directory or OpenAI's GPT-1 release → a HF/gptkit directory."""

    source: str = field(
        metadata={
            "help": "Folder or Hub name (gpt2, openai-community/openai-gpt, org/name@rev) to read.",
            "positional": True,
        }
    )
    destination: str = field(
        metadata={"help": "Directory to write (config.json + model.safetensors).", "positional": True}
    )
    n_head: int = field(
        default=12, metadata={"help": "Heads, for OpenAI's release, which does not record them."}
    )


def convert_weights(config: ConvertConfig) -> GPT:
    """Read ``source`` (whatever :meth:`GPT.from_pretrained` reads) and write it to ``destination`` in
    the Hugging Face format of its kind (:func:`gptkit.model.weights.hf_model_type`); returns the model.

    The model is built on the way, so that parameters that do not fit the config stop the conversion
    instead of being written.
    """
    model = GPT.from_pretrained(config.source, n_head=config.n_head)
    model.save_pretrained(config.destination)
    return model
