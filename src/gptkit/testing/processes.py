"""Processes a test or benchmark starts: one of a process group set up as torchrun sets it up (its
environment variables, then gptkit's init_distributed), a free port to meet on, and `gptkit serve`
in a subprocess."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from pathlib import Path


def torchrun_environment(rank: int, world_size: int, port: int) -> None:
    """The variables torchrun gives process ``rank`` of ``world_size`` meeting on 127.0.0.1:``port``."""
    os.environ.update(
        WORLD_SIZE=str(world_size),
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )


class ServerProcess:
    """`gptkit serve ARGS` in a subprocess, its output in ``log``."""

    def __init__(self, args: list[str], log: Path):
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        env.pop("GPTKIT_API_KEY", None)
        self.log = log
        with open(log, "ab") as out:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "gptkit", *args], env=env, stdout=out, stderr=subprocess.STDOUT
            )

    def wait_ready(self, base: str, timeout: float = 120.0) -> None:
        """Until GET /health answers 200; a RuntimeError with the log's end if it does not."""
        import httpx  # the serve extra's client

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"the server exited with {self.process.returncode}: {self.log.read_text()[-2000:]}"
                )
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{base}/health", timeout=2).status_code == 200:
                    return
            time.sleep(0.2)
        raise RuntimeError(f"no answer from {base}/health within {timeout} s: {self.log.read_text()[-2000:]}")

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(10)


def free_port() -> int:
    """A port on 127.0.0.1 that no one listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
