"""A run directory's layout, in one place: every reader and writer of a run goes through :class:`RunDir`.

::

    runs/NAME/
      run_config.json       what defines the run; "resolved": what the hardware and a time budget chose
      metrics.jsonl         one JSON record per logged update: the source of truth for every logger and plot
      loss.png              the curves
      config.json, model.safetensors, tokenizer files
                            the model: pre-training's newest checkpoint, fine-tuning's best epoch
      task.json, head.safetensors, best.json, results.json
                            fine-tuning: the task, its head, the best epoch's dev score, the final scores
      .lock                 held by the one process writing the run (its pid, host, command)
      checkpoints/
        latest.json         {"step", "path"}: the newest complete checkpoint
        step-NNNNNNN/       model files + train_state.pt, written under a temporary name, then renamed
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from gptkit.io import DirectoryBusy, read_json_object, writer_lock

CHECKPOINTS = "checkpoints"
LATEST = "latest.json"
TRAIN_STATE = "train_state.pt"
METRICS = "metrics.jsonl"
LOSS_PLOT = "loss.png"
RUN_CONFIG = "run_config.json"
BEST = "best.json"
RESULTS = "results.json"
LOCK = ".lock"


RunDirBusy = DirectoryBusy  # another process is writing this run directory


@dataclass(frozen=True)
class RunDir:
    """The paths of one run directory (nothing is created until something is written)."""

    root: Path

    def __init__(self, root: str | Path):
        object.__setattr__(self, "root", Path(root))

    @property
    def run_config(self) -> Path:
        return self.root / RUN_CONFIG

    @property
    def metrics(self) -> Path:
        return self.root / METRICS

    @property
    def loss_plot(self) -> Path:
        return self.root / LOSS_PLOT

    @property
    def best(self) -> Path:
        return self.root / BEST

    @property
    def results(self) -> Path:
        return self.root / RESULTS

    @property
    def checkpoints(self) -> Path:
        return self.root / CHECKPOINTS

    @property
    def latest_pointer(self) -> Path:
        return self.checkpoints / LATEST

    def checkpoint(self, step: int) -> Path:
        return self.checkpoints / f"step-{step:07d}"

    @staticmethod
    def step_of(checkpoint: Path) -> int:
        """The number of updates a ``step-NNNNNNN`` checkpoint folder was written after."""
        return int(checkpoint.name.removeprefix("step-"))

    def staging(self, final: Path) -> Path:
        """Where ``final`` is written before it is renamed into place: a hidden sibling."""
        return final.parent / f".{final.name}.tmp"

    def completed_checkpoints(self) -> list[Path]:
        """Every complete ``step-*`` folder, oldest first."""
        return sorted(p for p in self.checkpoints.glob("step-*") if (p / TRAIN_STATE).is_file())

    def holds_a_run(self) -> bool:
        """Whether training has started here (a checkpoints folder exists)."""
        return self.checkpoints.exists()

    def latest_checkpoint(self) -> Path | None:
        """The newest complete checkpoint that ``latest.json`` names, or None."""
        if not self.latest_pointer.exists():
            return None
        name = read_json_object(self.latest_pointer).get("path")
        if not isinstance(name, str):
            raise ValueError(
                f"{self.latest_pointer}: no 'path' naming the latest step-* checkpoint; fix or delete it"
            )
        path = self.checkpoints / name
        return path if (path / TRAIN_STATE).exists() else None

    def latest_step(self) -> int | None:
        if not self.latest_pointer.exists():
            return None
        step = read_json_object(self.latest_pointer).get("step")
        if not isinstance(step, int):
            raise ValueError(f"{self.latest_pointer}: no integer 'step'; fix or delete it")
        return step

    def resolved_max_steps(self) -> int:
        """The updates the run planned (after a time budget's plan), from ``run_config.json``."""
        resolved = read_json_object(self.run_config).get("resolved")
        steps = resolved.get("max_steps") if isinstance(resolved, dict) else None
        if not isinstance(steps, int) or isinstance(steps, bool) or steps < 0:
            raise ValueError(
                f"{self.run_config}: field resolved.max_steps is {steps!r}, expected a count of updates; "
                "the file is damaged: run the stage again"
            )
        return steps

    def sweep_debris(self) -> list[Path]:
        """Remove what an interrupted write left (hidden ``.*.tmp`` files and folders); returns them."""
        swept = [*self.root.glob(".*.tmp"), *self.checkpoints.glob(".*.tmp")]
        for path in swept:
            shutil.rmtree(path) if path.is_dir() else path.unlink(missing_ok=True)
        return swept

    def writer_lock(self, command: str):
        """Hold the run directory for one writer (see :func:`gptkit.io.writer_lock`): a second
        writer stops at once with :class:`RunDirBusy` naming the holder."""
        self.root.mkdir(parents=True, exist_ok=True)
        return writer_lock(self.root / LOCK, self.root, command)
