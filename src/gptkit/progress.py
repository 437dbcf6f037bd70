"""Progress bars drawn only where someone watches them."""

from __future__ import annotations


def hidden_unless_terminal(wanted: bool = True) -> bool | None:
    """tqdm's ``disable`` for a bar that is drawn only on a terminal: None lets tqdm hide it where
    its stream is not a TTY (a log file or a pipe would otherwise keep every redraw), True hides it."""
    return None if wanted else True
