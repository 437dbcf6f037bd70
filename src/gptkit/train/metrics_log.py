"""The metrics of a run: ``metrics.jsonl`` (the source of truth), its plot, and optional extra writers.

Every record is one JSON object with a ``step``; the training loop logs the loss, learning rate,
gradient norm, throughput and evaluations at the same steps for every writer. Extra writers (a
TensorBoard or W&B run, say) implement :class:`MetricsWriter` and receive the same records.
"""

from __future__ import annotations

import json
import os
import warnings
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
        self.plotted = False  # whether loss.png shows every record logged

    def log(self, record: dict) -> None:
        if not self.enabled:
            return
        self.run_dir.root.mkdir(parents=True, exist_ok=True)
        with open(self.run_dir.metrics, "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")
        for writer in self.writers:
            writer.write(record)
        self.plotted = False

    def records(self) -> list[dict]:
        return read_metrics(self.run_dir.metrics)

    def truncate(self, step: int) -> None:
        """On resume, forget records past the checkpoint: they will be written again."""
        if not self.enabled or not self.run_dir.metrics.exists():
            return
        kept = [r for r in self.records() if r["step"] <= step]
        text = "".join(json.dumps(r) + "\n" for r in kept)
        atomic_write(self.run_dir.metrics, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))
        self.plotted = False

    def plot(self) -> None:
        """Draws loss.png, unless it already shows every record (a run's last checkpoint drew it)."""
        if self.enabled and not self.plotted:
            plot_metrics(self.run_dir.metrics, self.run_dir.loss_plot)
            self.plotted = True

    def close(self) -> None:
        for writer in self.writers:
            writer.close()


LOGGERS = ("tensorboard", "wandb")


def scalars(record: dict) -> dict[str, float]:
    """The numbers of a record, under their metrics.jsonl names (the step and flags left out)."""
    return {
        name: value
        for name, value in record.items()
        if name != "step" and isinstance(value, (int, float)) and not isinstance(value, bool)
    }


class TensorBoardWriter:
    """The same records as TensorBoard scalars (``tensorboard --logdir RUN/tensorboard``): every
    number of a record under its metrics.jsonl name, at its step."""

    def __init__(self, directory: Path):
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as e:
            raise ImportError(
                "--log-to tensorboard needs the tensorboard package: pip install -e '.[tensorboard]'"
            ) from e
        self.writer = SummaryWriter(log_dir=str(directory), flush_secs=10)

    def write(self, record: dict) -> None:
        for name, value in scalars(record).items():
            self.writer.add_scalar(name, value, global_step=record["step"])

    def close(self) -> None:
        self.writer.close()


class WandbWriter:
    """The same records as a Weights & Biases run, in ``RUN/wandb``: every number of a record under
    its metrics.jsonl name, at its step (W&B's own step), and the run's configuration.

    W&B's environment decides where the run goes: ``WANDB_MODE=offline`` keeps it in the run
    directory (``wandb sync RUN/wandb/offline-run-*`` uploads it later); ``WANDB_PROJECT`` names the
    project (default ``gptkit``). A resumed run is a new W&B run in the same group (the run
    directory's name), starting at the step it resumed from.
    """

    def __init__(self, run_dir: RunDir, config: dict | None = None):
        try:
            import wandb
        except ImportError as e:
            raise ImportError("--log-to wandb needs the wandb package: pip install -e '.[wandb]'") from e
        name = run_dir.root.resolve().name
        run_dir.root.mkdir(parents=True, exist_ok=True)  # W&B's files go in RUN/wandb
        try:
            self.run = wandb.init(
                dir=str(run_dir.root),
                project=os.environ.get("WANDB_PROJECT", "gptkit"),
                name=name,
                group=name,
                config=config or {},
                # The console stays in the terminal (the progress bar redraws it); W&B gets the numbers.
                settings=wandb.Settings(console="off"),
            )
        except wandb.errors.UsageError as e:  # online without a login, say
            raise ValueError(
                f"--log-to wandb: {e} Or set WANDB_MODE=offline to keep the W&B run in "
                f"{run_dir.root / 'wandb'} and upload it later with `wandb sync`."
            ) from e

    def write(self, record: dict) -> None:
        # Records of one step (the update's, then its evaluation's) join one row of W&B's history.
        self.run.log(scalars(record), step=record["step"])

    def close(self) -> None:
        self.run.finish()


def make_writers(
    names: list[str] | tuple[str, ...], run_dir: RunDir, config: dict | None = None
) -> tuple[MetricsWriter, ...]:
    """The extra writers ``--log-to`` names, writing into the run directory; ``config`` (the run's
    run_config.json) goes with the records where the destination keeps one (W&B)."""
    writers = []
    for name in names:
        if name == "tensorboard":
            writers.append(TensorBoardWriter(run_dir.root / "tensorboard"))
        elif name == "wandb":
            writers.append(WandbWriter(run_dir, config))
        else:
            raise ValueError(f"--log-to: unknown logger {name!r}; choose from {', '.join(LOGGERS)}")
    return tuple(writers)


def read_metrics(path: str | Path) -> list[dict]:
    """The records of ``metrics.jsonl``. A torn last line (the process died while appending it) is
    dropped with a warning; a damaged line before it is an error naming the file and line."""
    path = Path(path)
    if not path.exists():
        return []
    lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    records = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except ValueError as e:
            if number == len(lines):
                warnings.warn(f"{path}, line {number}: an unfinished record ({e}); dropped", stacklevel=2)
                break
            raise ValueError(f"{path}, line {number}: not a JSON record ({e}); fix or delete the line") from e
    return records


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
