"""The metrics of a run: ``metrics.jsonl`` (the source of truth), its plot, and optional extra writers.

Every record is one JSON object with a ``step``; the training loop logs the loss, learning rate,
gradient norm, throughput and evaluations at the same steps for every writer. Extra writers (a
TensorBoard or W&B run, say) implement :class:`MetricsWriter` and receive the same records.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Protocol

from gptkit.io import atomic_write
from gptkit.train.rundir import RunDir


class MetricsWriter(Protocol):
    """Receives every record the run logs (called on the main process only)."""

    def write(self, record: dict) -> None: ...

    def close(self) -> None: ...


class MetricsLogger:
    """Appends records to ``metrics.jsonl`` and hands them to ``writers``; draws ``loss.png``."""

    def __init__(self, run_dir: RunDir, writers: tuple[MetricsWriter, ...] = (), enabled: bool = True):
        self.run_dir, self.writers, self.enabled = run_dir, writers, enabled

    def log(self, record: dict) -> None:
        if not self.enabled:
            return
        self.run_dir.root.mkdir(parents=True, exist_ok=True)
        with open(self.run_dir.metrics, "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")
        for writer in self.writers:
            writer.write(record)

    def records(self) -> list[dict]:
        return read_metrics(self.run_dir.metrics)

    def truncate(self, step: int) -> None:
        """On resume, forget records past the checkpoint: they will be written again."""
        if not self.enabled:
            return
        kept = [r for r in self.records() if r["step"] <= step]
        text = "".join(json.dumps(r) + "\n" for r in kept)
        atomic_write(self.run_dir.metrics, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))

    def plot(self) -> None:
        if self.enabled:
            plot_metrics(self.run_dir.metrics, self.run_dir.loss_plot)

    def close(self) -> None:
        for writer in self.writers:
            writer.close()


def read_metrics(path: str | Path) -> list[dict]:
    path = Path(path)
    if not path.exists():
        return []
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def loss_curves(records: list[dict]) -> dict[str, list[tuple[int, float]]]:
    """The plotted series: (step, value) of the training loss and of each held-out loss."""
    curves = {"train loss": [(r["step"], r["loss"]) for r in records if "loss" in r]}
    for key in ("val_loss", "dev_loss"):
        curves[key.replace("_", " ")] = [(r["step"], r[key]) for r in records if key in r]
    return {name: points for name, points in curves.items() if points}


def plot_metrics(metrics_path: Path, png_path: Path) -> None:
    """Training (and validation) loss against step, as a PNG. Skipped if matplotlib is missing."""
    curves = loss_curves(read_metrics(metrics_path))
    if not curves:
        return
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, ax = plt.subplots(figsize=(7, 4))
    for name, points in curves.items():
        style = dict(linewidth=1) if name == "train loss" else dict(marker="o")
        ax.plot(*zip(*points), label=name, **style)
    ax.set_xlabel("update")
    ax.set_ylabel("cross-entropy (nats / token)")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    atomic_write(png_path, lambda tmp: fig.savefig(tmp, dpi=110, format="png"))
    plt.close(fig)
