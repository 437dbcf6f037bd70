"""A fine-tuned model on labelled data: the task's metrics, and predictions for new rows."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from gptkit import hub
from gptkit.data.examples import Example
from gptkit.data.registry import read_dataset
from gptkit.data.tables import parse_columns, read_table
from gptkit.data.tasks import task_metrics
from gptkit.hardware import DEVICE_HELP
from gptkit.io import atomic_write, read_json_object
from gptkit.model.task import TASK_NAME, TaskModel


@dataclass
class LabelledDataConfig:
    """Print a fine-tuned model's metrics on labelled data (your file or a public dataset) as JSON."""

    model: str = field(metadata={"help": "Folder written by `gptkit finetune`, or the Hub name of one."})
    data: str | None = field(
        default=None, metadata={"help": "CSV/TSV (with a header), JSONL or parquet file."}
    )
    columns: str | None = field(
        default=None, metadata={"help": "field=column,... as for finetune (default: the field names)."}
    )
    dataset: str | None = field(
        default=None, metadata={"help": "Or a public dataset by name (sst2, cola, rte, ...)."}
    )
    split: str = field(default="dev", metadata={"help": "Split of --dataset: train, dev or test."})
    data_dir: str = field(
        default="data", metadata={"help": "Where the public datasets live (for --dataset)."}
    )
    batch_size: int = field(default=64, metadata={"help": "Examples per forward pass."})
    device: str = field(default="auto", metadata={"help": DEVICE_HELP})

    def examples(self) -> list[Example]:
        """``dataset``'s split, or the rows of ``data`` read as the model's task."""
        if self.dataset:
            return read_dataset(self.dataset, self.split, self.data_dir)
        if not self.data:
            raise ValueError("give --data FILE or --dataset NAME")
        task = read_json_object(hub.resolve(self.model) / TASK_NAME).get("spec", {}).get("task")
        return read_table(self.data, task, parse_columns(self.columns))


@dataclass
class PredictConfig(LabelledDataConfig):
    """Write one JSON prediction (label and probabilities) per input row."""

    out: str = field(default="predictions.jsonl", metadata={"help": "Output JSONL file."})


def evaluate_labelled(config: LabelledDataConfig) -> dict[str, float]:
    """:func:`evaluate_model` on the config's examples."""
    return evaluate_model(config.model, config.examples(), config.batch_size, device=config.device)


def predict_to_file(config: PredictConfig) -> list[dict]:
    """:func:`predict` on the config's examples, written to ``config.out`` as JSON lines."""
    records = predict(config.model, config.examples(), config.batch_size, device=config.device)
    text = "".join(json.dumps(r) + "\n" for r in records)
    atomic_write(config.out, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))
    return records


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
