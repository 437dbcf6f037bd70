"""Where a measurement came from: the commit of the checkout that made it."""

from __future__ import annotations

import subprocess
from pathlib import Path

# What the benchmarks themselves write (`make bench` keeps each one's JSON before the next starts):
# a difference there is a measurement kept, not other code measured.
OUTPUTS = ("results", "docs/results.md")


def source_commit(repo: Path) -> str | None:
    """The commit checked out in ``repo``, with "+changes" where tracked files other than the
    benchmarks' outputs differ from it (what ran was not that commit alone); None outside a git
    checkout."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True, timeout=30, check=True
        ).stdout.strip()
        changed = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no", "--", ".", *(f":!{p}" for p in OUTPUTS)],
            cwd=repo,
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return head + ("+changes" if changed else "")
