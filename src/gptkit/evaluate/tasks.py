"""A fine-tuned model on labelled data: the task's metrics, and predictions for new rows."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from gptkit.data.readers import Example
from gptkit.data.tasks import task_metrics
from gptkit.model.task import TaskModel


def _load(model: TaskModel | str | Path, device: str) -> TaskModel:
    return model if isinstance(model, TaskModel) else TaskModel.from_pretrained(model, device)


def evaluate_model(
    model: TaskModel | str | Path, examples: Sequence[Example], batch_size: int = 64, device: str = "auto"
) -> dict[str, float]:
    """The task's metrics of a fine-tuned model (or its directory) on labelled examples."""
    model = _load(model, device)
    encoded = model.encode(examples, require_labels=True)
    logits = model.logits(encoded, batch_size)
    return {"examples": len(encoded), **task_metrics(model.spec, logits, [e.target for e in encoded])}


def predict(
    model: TaskModel | str | Path, examples: Sequence[Example], batch_size: int = 64, device: str = "auto"
) -> list[dict]:
    """One record per example, in order (see :meth:`TaskModel.predict`)."""
    return _load(model, device).predict(examples, batch_size)


def correct_per_example(
    model: TaskModel | str | Path, examples: Sequence[Example], batch_size: int = 64, device: str = "auto"
) -> list[int]:
    """1 where the model's label (class or choice) is the example's, else 0, in order: what a paired
    comparison of two models on the same examples needs (:func:`gptkit.data.metrics.paired_difference`)."""
    model = _load(model, device)
    if model.spec.regression:
        raise ValueError(
            "correct_per_example needs a classification or multiple-choice model, not regression"
        )
    encoded = model.encode(examples, require_labels=True)
    predictions = model.logits(encoded, batch_size).argmax(-1).tolist()
    return [int(p == e.target) for p, e in zip(predictions, encoded)]
