"""Stopping a run on a signal: SIGTERM (pre-emption, a scheduler's warning) or Ctrl-C asks the
training loop to stop after the update in flight and save a checkpoint that resumes exactly.

Under torchrun a signal may reach the processes at different times: each process puts its request
into the update's shared values (one all-reduce), and all stop after the same update, the one
whose values first carry a request (:attr:`StopSignals.agreed`). A signal that comes after the
last update's values were shared is too late to agree on: the run ends as planned, with its final
checkpoint (alone, a process still reports it, exiting 128 + the signal's number).
"""

from __future__ import annotations

import signal
from typing import Any

# The signals that stop a run, in the order the update's shared values carry them.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class Interrupted(KeyboardInterrupt):
    """Training stopped by a signal (or Ctrl-C) after a checkpoint was saved."""

    def __init__(self, step: int, signum: int):
        name = signal.Signals(signum).name
        super().__init__(f"interrupted at step {step} ({name}); checkpoint saved, continue with --resume")
        self.exit_code = 128 + signum  # the shell's convention: 130 for SIGINT, 143 for SIGTERM


class StopSignals:
    """While training, SIGTERM and SIGINT (Ctrl-C) ask the loop to stop after the update in flight,
    so that the checkpoint it saves resumes exactly; a second Ctrl-C stops at once."""

    def __init__(self):
        self.signum: int | None = None  # the signal this process received
        self.agreed: int | None = None  # under torchrun: the signal every process stops for
        self.previous: dict[int, Any] = {}

    def requested(self, distributed: bool) -> int | None:
        """The signal to stop for now: this process's alone, or under torchrun the one all agreed on."""
        return self.agreed if distributed else self.signum

    def _handle(self, signum, frame) -> None:
        if self.signum is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt("interrupted twice: stopped without finishing the update in flight")
        self.signum = signum

    def __enter__(self) -> StopSignals:
        for signum in (signal.SIGINT, signal.SIGTERM):
            try:
                self.previous[signum] = signal.signal(signum, self._handle)
            except ValueError:  # not the main thread: signals go to the main thread's handlers
                pass
        return self

    def __exit__(self, *exc) -> None:
        for signum, handler in self.previous.items():
            signal.signal(signum, handler)
