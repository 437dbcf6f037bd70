"""Checkpoints that resume exactly: save, prune, find the latest, load.

Each checkpoint is a ``step-NNNNNNN/`` folder of the run directory (see :mod:`gptkit.train.rundir`):
the model's files and ``train_state.pt`` (optimizer moments, step, data position, every process's
RNG, the time budget's plan), written under a temporary name and renamed when complete, then named
in ``latest.json``. A ``kill -9`` thus loses at most the updates since the last checkpoint.

Under FSDP2, a stage that says how to describe its model (:attr:`Checkpointer.describe_model`)
gets sharded checkpoints instead (:mod:`gptkit.train.checkpoints.sharded`): each process writes
its own shards of the model and the moments, rank 0 the model's ``config.json`` and the rest of
``train_state.pt``; nothing is gathered, and another number of processes can resume them. DDP and
one process write the model whole, as the other commands read it.
"""

from __future__ import annotations

import json
import shutil
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.nn as nn

from gptkit.io import file_sha256, read_json, read_json_object, read_train_state, write_json
from gptkit.train.checkpoints.sharded import SHARDED_FORMAT, is_sharded_model, load_shards, save_shards
from gptkit.train.distributed.processes import DistributedContext, full_state_dicts, load_full_state_dicts
from gptkit.train.rundir import LATEST, TRAIN_STATE, RunDir

if TYPE_CHECKING:
    from torch.distributed.checkpoint.api import CheckpointException

SaveModel = Callable[[Path, dict[str, torch.Tensor]], None]
DescribeModel = Callable[[Path], None]  # writes the files that say what the model is (config.json)


class CheckpointWriteError(OSError):
    """A checkpoint could not be written; the message is one line naming the step, the folder and
    the free space. An OSError (``errno`` kept from the cause where it has one), so that the CLI
    prints it as one line without a traceback, whatever failed underneath: torch's zip writer
    reports a full disk as a RuntimeError (``[enforce fail at inline_container.cc] unexpected pos``)."""


@dataclass
class CheckpointConfig:
    """When and how many checkpoints (the training loop's ``checkpoint_every``/``keep_checkpoints``)."""

    every: int | None = None  # updates between checkpoints (None/0: only at the end)
    keep: int = 3  # the newest this many are kept


class Checkpointer:
    """Writes and reads the checkpoints of one run directory; every process calls ``save``."""

    def __init__(
        self, run_dir: RunDir, save_model: SaveModel, config: CheckpointConfig, ctx: DistributedContext
    ):
        self.run_dir, self.save_model, self.config, self.ctx = run_dir, save_model, config, ctx
        # Set by a stage whose model can be exported from shards (pre-training): under FSDP2 its
        # checkpoints are then sharded. None: every checkpoint holds the model whole.
        self.describe_model: DescribeModel | None = None

    def due(self, step: int) -> bool:
        return bool(self.config.every) and step % self.config.every == 0

    def save(
        self, step: int, model: nn.Module, optimizers: list[torch.optim.Optimizer], state: dict[str, Any]
    ) -> Path:
        """Write ``step``'s checkpoint: the model, the optimizers and ``state`` (the data position,
        tokens seen, the plan: plain values). Every process takes part (FSDP gathers shards, or
        each process writes its own)."""
        rng_states = self.ctx.all_gather_object(rng_state())
        train_state = {"step": step, "rng": rng_states, "world_size": self.ctx.world_size, **state}
        if isinstance(train_state.get("plan"), dict):  # JSON text: the file holds tensors, plain values
            train_state["plan"] = json.dumps(train_state["plan"])
        final = self.run_dir.checkpoint(step)
        if self.describe_model is not None and is_sharded_model(model):
            self._save_sharded(final, model, optimizers, train_state)
        else:
            model_state, optim_state = full_state_dicts(model, optimizers, self.ctx)

            def write(staging: Path) -> None:
                self.save_model(staging, model_state)
                torch.save({**train_state, "optimizer": optim_state}, staging / TRAIN_STATE)
                write_manifest(staging)  # last: a checkpoint with a manifest is complete

            self._together(lambda: self._staged(final, write) if self.ctx.is_main else None)

        def commit() -> None:
            shutil.rmtree(final, ignore_errors=True)
            self.run_dir.staging(final).rename(final)
            write_json(self.run_dir.latest_pointer, {"step": step, "path": final.name})
            self.prune()

        self._together(commit if self.ctx.is_main else lambda: None)  # also the barrier that ends it
        return final

    def _save_sharded(
        self, final: Path, model: nn.Module, optimizers: list[torch.optim.Optimizer], train_state: dict
    ) -> None:
        """Every process writes its shards into the staging folder; then rank 0 the model's
        description, the training state (its moments are in the shards) and the manifest."""
        from torch.distributed.checkpoint.api import CheckpointException

        # Rank 0 makes the folder afresh (a write of nothing, its failure told as a write's); every
        # process learns it exists, empty, before anyone writes into it.
        self._together(lambda: self._staged(final, lambda _: None) if self.ctx.is_main else None)

        def write(staging: Path) -> None:
            try:
                entries = save_shards(staging, model, optimizers, self.ctx)
            except CheckpointException as e:  # not an Exception: made one, as this process tells it
                raise _dcp_failure(e, self.ctx.rank) from e
            if self.ctx.is_main:
                assert self.describe_model is not None
                self.describe_model(staging)
                torch.save({**train_state, "optimizer": {}, "format": SHARDED_FORMAT}, staging / TRAIN_STATE)
                write_manifest(staging, entries)

        try:
            self._together(lambda: self._staged(final, write, fresh=False))
        except Exception:
            if self.ctx.is_main:  # another process's failure leaves rank 0's files behind otherwise
                shutil.rmtree(self.run_dir.staging(final), ignore_errors=True)
            raise

    def _together(self, action: Callable[[], None]) -> None:
        """Run ``action`` here, then learn from every process whether it failed there: all raise
        together (this process its own error, the others one naming the process that failed and
        why), so that none is left waiting in a collective that a failed one never reaches. A
        barrier too. Alone, the error is raised as it was."""
        failure: Exception | None = None
        try:
            action()
        except Exception as e:
            failure = e
        reports = self.ctx.all_gather_object(None if failure is None else _report(failure))
        if failure is not None:
            raise failure
        for rank, report in enumerate(reports):
            if report is not None:
                code, message = report
                raise _write_error(code, f"rank {rank} failed: {message}")

    def _staged(self, final: Path, write: Callable[[Path], None], fresh: bool = True) -> None:
        """Run ``write`` into ``final``'s staging folder (made afresh unless ``fresh`` is False);
        a failure leaves no debris and is one line naming the folder and the free space."""
        staging = self.run_dir.staging(final)
        try:
            if fresh:
                shutil.rmtree(staging, ignore_errors=True)
                staging.mkdir(parents=True)
            write(staging)
        except BaseException as e:
            if self.ctx.is_main:
                shutil.rmtree(staging, ignore_errors=True)  # no half-written debris, whatever stopped it
            if not isinstance(e, Exception):  # Ctrl-C and the like stay what they are
                raise
            raise self._write_failure(final, e) from e

    def _write_failure(self, final: Path, error: Exception) -> CheckpointWriteError:
        """One line: what failed, where, how much room a checkpoint takes and how much is free, and
        what to do. Any failure may be a full disk in disguise, so the free space is always said."""
        if isinstance(error, OSError):
            cause = str(error.strerror or error) + (f" ({error.filename})" if error.filename else "")
        else:  # the first line only: C++ errors may carry a stack trace below it
            cause = f"{type(error).__name__}: {(str(error).strip().splitlines() or [''])[0]}"
        what = f"could not write checkpoint {final.name} in {final.parent}: {cause}"
        previous = self.run_dir.completed_checkpoints()
        if previous:
            size = sum(f.stat().st_size for f in previous[-1].iterdir() if f.is_file())
            what += f"; a checkpoint takes about {size / 1e6:,.0f} MB"
        free = shutil.disk_usage(final.parent).free
        what += f"{',' if previous else ';'} {free / 1e6:,.0f} MB are free. "
        if previous:
            what += "The previous checkpoint is intact: free space, then --resume"
        else:
            what += "No checkpoint was written yet: free space, then run again"
        return _write_error(error.errno if isinstance(error, OSError) else None, what)

    def prune(self) -> None:
        for old in self.run_dir.completed_checkpoints()[: -self.config.keep]:
            shutil.rmtree(old, ignore_errors=True)

    def latest(self) -> Path | None:
        """The newest checkpoint that is whole: the one ``latest.json`` names if its files match its
        manifest, else the newest older one that does (with a warning naming what was skipped).
        Every process calls it (they share the hashing) and gets the same answer."""
        candidates = self.run_dir.completed_checkpoints()[::-1]
        skipped = []
        try:
            named = self.run_dir.latest_checkpoint()
        except ValueError as e:  # the pointer itself is damaged (power loss before it reached the disk)
            named = None
            skipped.append(f"{LATEST} ({e})")
        if named is not None:
            candidates = [named] + [c for c in candidates if c != named and c.name < named.name]
        elif self.run_dir.latest_pointer.exists() and not skipped:  # it names a folder without its state
            skipped.append(f"{read_json(self.run_dir.latest_pointer).get('path')} (no {TRAIN_STATE})")
        for checkpoint in candidates:
            # Each process hashes its share of the files: a sharded checkpoint's are many and large.
            share = (self.ctx.rank, self.ctx.world_size)
            problems = self.ctx.all_gather_object(verify_manifest(checkpoint, share))
            problem = next((p for p in problems if p is not None), None)
            if problem is None:
                if skipped:
                    warnings.warn(
                        f"skipped damaged checkpoint(s) {'; '.join(skipped)}; resuming from {checkpoint.name}",
                        stacklevel=2,
                    )
                return checkpoint
            skipped.append(f"{checkpoint.name} ({problem})")
        if skipped:
            raise ValueError(f"no intact checkpoint in {self.run_dir.checkpoints}: {'; '.join(skipped)}")
        return None

    def holds(self, step: int) -> bool:
        """Whether the newest checkpoint is of ``step`` (nothing new to save)."""
        try:
            return self.run_dir.latest_checkpoint() is not None and self.run_dir.latest_step() == step
        except ValueError:  # a damaged pointer: the save about to happen rewrites it
            return False

    def load(
        self,
        checkpoint: Path,
        model: nn.Module,
        optimizers: list[torch.optim.Optimizer],
        load_model_state: Callable[[Path], dict[str, torch.Tensor]],
    ) -> dict[str, Any]:
        """Put ``checkpoint``'s weights and moments into ``model`` and ``optimizers``; return the
        rest of its state (step, data position, RNG for this process or None, the plan as a dict)."""
        state = read_train_state(checkpoint / TRAIN_STATE)
        if state.get("format") == SHARDED_FORMAT:  # resharded to this run's processes as it is read
            load_shards(checkpoint, model, optimizers)
        else:
            load_full_state_dicts(model, optimizers, load_model_state(checkpoint), state["optimizer"])
        state["plan"] = json.loads(state.get("plan", "{}"))
        rng = state["rng"]
        state["rng"] = rng[self.ctx.rank] if len(rng) == self.ctx.world_size else None
        state["rng_processes"] = len(rng)
        return state


def _write_error(code: int | None, what: str) -> CheckpointWriteError:
    return CheckpointWriteError(code, what) if code is not None else CheckpointWriteError(what)


def _report(error: Exception) -> tuple[int | None, str]:
    """(errno or None, one line without it): what the other processes are told of a failure."""
    if isinstance(error, OSError):
        return error.errno, error.strerror or str(error)
    return None, f"{type(error).__name__}: {(str(error).strip().splitlines() or [''])[0]}"


def _dcp_failure(error: CheckpointException, rank: int) -> BaseException:
    """What failed in DCP's save, which raises every process's failures on every process: this
    process's own error where it failed, else the first failed process's, naming that process."""
    failures = {r: (f[0] if isinstance(f, tuple) else f) for r, f in error.failures.items()}
    if not failures:
        return RuntimeError(str(error))
    if rank in failures:
        return failures[rank]
    first = min(failures)
    cause = failures[first]
    if isinstance(cause, OSError):
        return OSError(cause.errno, f"{cause.strerror or cause} on rank {first}", cause.filename)
    line = (str(cause).strip().splitlines() or [""])[0]
    return RuntimeError(f"{type(cause).__name__} on rank {first}: {line}")


def rng_state() -> dict[str, torch.Tensor]:
    state = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict[str, torch.Tensor]) -> None:
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


MANIFEST = "manifest.json"


def write_manifest(directory: Path, known: dict[str, dict] | None = None) -> None:
    """Every file of a checkpoint with its size and sha256, written last; ``known`` gives files
    already hashed (by the process that wrote them)."""
    known = known or {}
    files = {
        path.name: known.get(path.name) or {"bytes": path.stat().st_size, "sha256": file_sha256(path)}
        for path in sorted(directory.iterdir())
        if path.is_file() and path.name != MANIFEST
    }
    write_json(directory / MANIFEST, {"files": files})


def verify_manifest(directory: Path, share: tuple[int, int] = (0, 1)) -> str | None:
    """None if the checkpoint's files match its manifest, else what is wrong. Every file's size is
    checked, and the checksums of the ``share`` = (index, count)'th part of them. A checkpoint
    written before manifests existed passes when its training state is there."""
    manifest = directory / MANIFEST
    if not (directory / TRAIN_STATE).is_file():
        return f"no {TRAIN_STATE}"
    if not manifest.is_file():
        return None
    try:
        files = read_json_object(manifest)["files"]
    except (OSError, ValueError, KeyError) as e:
        return f"unreadable {MANIFEST}: {e}"
    if not isinstance(files, dict) or not all(
        isinstance(entry, dict)
        and isinstance(entry.get("bytes"), int)
        and isinstance(entry.get("sha256"), str)
        and isinstance(name, str)
        and name
        for name, entry in files.items()
    ):
        return f"unreadable {MANIFEST}: 'files' is not an object of {{name: {{bytes, sha256}}}}"
    index, count = share
    for i, (name, expected) in enumerate(sorted(files.items())):
        path = directory / name
        try:  # a file that cannot be read is a problem to report, on every process alike
            if not path.is_file():
                return f"{name} missing"
            size = path.stat().st_size
            if size != expected["bytes"]:
                return f"{name} has {size} bytes, not {expected['bytes']}"
            if i % count == index and file_sha256(path) != expected["sha256"]:
                return f"{name} does not match its checksum"
        except OSError as e:
            return f"{name} unreadable ({e.strerror or e})"
    return None
