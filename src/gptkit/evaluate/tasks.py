"""The old name of :mod:`gptkit.evaluate.finetuned` (scoring fine-tuned task models), kept for one
release: "tasks" also named the task kinds of :mod:`gptkit.data.tasks`."""

import sys
import warnings

from gptkit.evaluate import finetuned

warnings.warn(
    "gptkit.evaluate.tasks is deprecated: import gptkit.evaluate.finetuned", DeprecationWarning, stacklevel=2
)
sys.modules[__name__] = finetuned
