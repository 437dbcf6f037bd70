"""The GPT-1 paper's results as data: what ``gptkit suite`` puts beside its own scores.

Radford et al. 2018, "Improving Language Understanding by Generative Pre-Training". Scores are as
printed (percent; Matthews and Pearson correlations × 100). Tables 2–4 report test sets (GLUE's test
server for its tasks); Table 5 repeats the full model's Table 4 and Table 2 figures (MNLI as the mean
of matched and mismatched) beside its ablations.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class Evaluation:
    """One score of the paper's tables and the set we compute ours on."""

    title: str  # the paper's column name
    dataset: str  # a gptkit.data.registry.DATASETS name
    split: str  # test where its labels are public, else dev
    paper: float  # the paper's score


@dataclass(frozen=True)
class PaperTask:
    """A fine-tuning task of the paper: the data it trains on, its metric, its reported scores."""

    name: str
    table: str
    train: str  # the dataset trained on (and whose dev split picks the best epoch)
    metric: str  # a key of gptkit.data.tasks.task_metrics: accuracy, f1, mcc, pearson
    evaluations: tuple[Evaluation, ...]


TASKS: dict[str, PaperTask] = {
    task.name: task
    for task in (
        # Table 2: natural language inference.
        PaperTask("mnli", "Table 2", "mnli", "accuracy", (
            Evaluation("MNLI-m", "mnli", "dev", 82.1), Evaluation("MNLI-mm", "mnli", "dev_mismatched", 81.4))),
        PaperTask("snli", "Table 2", "snli", "accuracy", (Evaluation("SNLI", "snli", "test", 89.9),)),
        PaperTask("scitail", "Table 2", "scitail", "accuracy", (Evaluation("SciTail", "scitail", "test", 88.3),)),
        PaperTask("qnli", "Table 2", "qnli", "accuracy", (Evaluation("QNLI", "qnli", "dev", 88.1),)),
        PaperTask("rte", "Table 2", "rte", "accuracy", (Evaluation("RTE", "rte", "dev", 56.0),)),
        # Table 3: question answering and commonsense reasoning.
        PaperTask("story_cloze", "Table 3", "story_cloze", "accuracy", (
            Evaluation("Story Cloze", "story_cloze", "test", 86.5),)),
        PaperTask("race", "Table 3", "race", "accuracy", (
            Evaluation("RACE-m", "race_middle", "test", 62.9), Evaluation("RACE-h", "race_high", "test", 57.4),
            Evaluation("RACE", "race", "test", 59.0))),
        # Table 4: semantic similarity and classification.
        PaperTask("cola", "Table 4", "cola", "mcc", (Evaluation("CoLA", "cola", "dev", 45.4),)),
        PaperTask("sst2", "Table 4", "sst2", "accuracy", (Evaluation("SST-2", "sst2", "test", 91.3),)),
        PaperTask("mrpc", "Table 4", "mrpc", "f1", (Evaluation("MRPC", "mrpc", "test", 82.3),)),
        PaperTask("stsb", "Table 4", "stsb", "pearson", (Evaluation("STS-B", "stsb", "test", 82.0),)),
        PaperTask("qqp", "Table 4", "qqp", "f1", (Evaluation("QQP", "qqp", "dev", 70.3),)),
    )
}  # fmt: skip

# Table 5: the ablations, on the GLUE tasks; a variant's scores by suite task (MNLI: mean of m/mm).
TABLE5_TASKS = ("cola", "sst2", "mrpc", "stsb", "qqp", "mnli", "qnli", "rte")
TABLE5: dict[str, dict[str, float]] = {
    "full": dict(zip(TABLE5_TASKS, (45.4, 91.3, 82.3, 82.0, 70.3, 81.8, 88.1, 56.0))),
    "no_aux_lm": dict(zip(TABLE5_TASKS, (47.9, 92.0, 84.9, 83.2, 69.8, 81.1, 86.9, 54.4))),
    "no_pretraining": dict(zip(TABLE5_TASKS, (18.9, 84.0, 79.4, 30.9, 65.5, 75.7, 71.2, 53.8))),
}
TABLE5_AVERAGE = {"full": 74.7, "no_aux_lm": 75.0, "no_pretraining": 59.9}


# The variants `gptkit suite` runs: the full method and Table 5's ablations.
Variant = Literal["full", "no_aux_lm", "no_pretraining"]
VARIANTS: dict[str, str] = {
    "full": "pre-trained, with the auxiliary LM objective (λ = 0.5)",
    "no_aux_lm": "pre-trained, without the auxiliary LM objective (λ = 0)",
    "no_pretraining": "the same architecture from random weights (λ = 0.5)",
}
