"""GPT-1's zero-shot heuristics (§5, Figure 2 right) run on a public dataset, for one model or a run.

The heuristics themselves are in :mod:`gptkit.evaluate.lm`; this module picks each one's dataset,
reads the examples and the start token, and walks a pre-training run's checkpoints.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from gptkit.data.registry import read_dataset
from gptkit.evaluate import lm
from gptkit.generation import start_ids
from gptkit.generation.text import InferenceConfig
from gptkit.model import GPT
from gptkit.tokenizer import Tokenizer
from gptkit.train.rundir import RunDir

# Each heuristic and the dataset the paper ran it on (multiple_choice: our stand-in for its DPRD
# Winograd schemas, which are not among the datasets here; question_answering: RACE).
ZEROSHOT_DATASETS = {
    "sentiment": "sst2",
    "multiple_choice": "story_cloze",
    "acceptability": "cola",
    "question_answering": "race",
}
# What each heuristic's score is and what guessing scores (Figure 2's chance lines).
ZEROSHOT_METRICS = {
    "sentiment": ("accuracy", 0.5),
    "multiple_choice": ("accuracy", 0.5),
    "acceptability": ("mcc", 0.0),
    "question_answering": ("accuracy", 0.25),
}


def _score_start(model: GPT, tokenizer: Tokenizer) -> list[int]:
    """The token a sentence is scored after: the start/end-of-text token when the model has its row
    (GPT-2; GPT-1 after fine-tuning), else "." — a sentence boundary every vocabulary has."""
    try:
        return start_ids(model, tokenizer)
    except ValueError:
        return tokenizer.encode(".")


def zeroshot(
    model: GPT,
    tokenizer: Tokenizer,
    task: str,
    data_dir: str | Path,
    dataset: str | None = None,
    split: str = "dev",
    limit: int | None = None,
) -> dict[str, float]:
    """Score ``model`` with the zero-shot heuristic of ``task`` (sentiment, multiple_choice,
    acceptability, question_answering) on ``split`` of ``dataset`` (default: the paper's dataset for
    the task)."""
    if task not in ZEROSHOT_DATASETS:
        raise ValueError(f"task must be one of {', '.join(ZEROSHOT_DATASETS)}, got {task!r}")
    dataset = dataset or ZEROSHOT_DATASETS[task]
    examples = read_dataset(dataset, split, data_dir)[:limit]
    encode = tokenizer.encode
    if task == "sentiment":
        return lm.zeroshot_sentiment(
            model, encode, [e.fields["text"] for e in examples], [e.label for e in examples]
        )
    if task in ("multiple_choice", "question_answering"):
        # RACE: the answer is scored after the document and its question (§5: "conditioned on the
        # document and question").
        return lm.zeroshot_multiple_choice(
            model,
            encode,
            [" ".join([e.fields["context"], e.fields.get("question", "")]).strip() for e in examples],
            [e.fields["choices"] for e in examples],
            [e.label for e in examples],
        )
    # Acceptability: the threshold is fitted on the training split, never on the one reported.
    fit = read_dataset(dataset, "train", data_dir)[:limit]
    return lm.zeroshot_acceptability(
        model,
        encode,
        _score_start(model, tokenizer),
        [e.fields["text"] for e in fit],
        [e.label for e in fit],
        [e.fields["text"] for e in examples],
        [e.label for e in examples],
    )


def run_checkpoints(run_dir: str | Path) -> list[tuple[int, Path]]:
    """(step, directory) of every complete checkpoint of a training run, oldest first: a folder that
    training would not resume from (no train_state.pt: a copy cut short, say) is not scored either."""
    run = RunDir(run_dir)
    directories = run.completed_checkpoints()
    if not directories:
        raise FileNotFoundError(f"{run.checkpoints}: no complete step-* checkpoints")
    return [(RunDir.step_of(p), p) for p in directories]


@dataclass
class ZeroshotConfig(InferenceConfig):
    """GPT-1's zero-shot heuristics (§5) on a public dataset, for a model or every checkpoint of a run."""

    model: str = field(
        metadata={
            "help": "A model folder or Hub name (gpt2, openai-gpt, org/name@rev), or a run directory with --checkpoints."
        }
    )
    task: Literal["acceptability", "multiple_choice", "question_answering", "sentiment"] = field(
        metadata={"help": "Which heuristic."}
    )
    tokenizer: str | None = field(
        default=None, metadata={"help": "Tokenizer folder or Hub name (default: the model's)."}
    )
    dataset: str | None = field(
        default=None,
        metadata={
            "help": "Public dataset (default: by task: sentiment → sst2, multiple_choice → story_cloze, "
            "acceptability → cola, question_answering → race)."
        },
    )
    split: str = field(default="dev", metadata={"help": "Split to score."})
    data_dir: str = field(default="data", metadata={"help": "Where the public datasets live."})
    limit: int | None = field(default=None, metadata={"help": "Use the first N examples."})
    checkpoints: bool = field(
        default=False, metadata={"help": "Evaluate every checkpoint of a pre-training run."}
    )


def run_zeroshot(config: ZeroshotConfig) -> Iterator[dict]:
    """One record (task, model, step, scores) for the model, or for each checkpoint of the run."""
    targets = run_checkpoints(config.model) if config.checkpoints else [(None, Path(config.model))]
    for step, directory in targets:
        # The dtype choice is the same for every checkpoint: said once.
        model, tokenizer = config.load(
            directory, config.tokenizer or config.model, decoding=False, verbose=directory == targets[0][1]
        )
        result = zeroshot(
            model, tokenizer, config.task, config.data_dir, config.dataset, config.split, config.limit
        )
        yield {"task": config.task, "model": str(directory), "step": step, **result}
