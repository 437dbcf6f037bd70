"""A classify or embeddings request whose client disconnects while it waits is withdrawn: its inputs
never run (as a completion's decoding stops when its client leaves)."""

from __future__ import annotations

import asyncio
import threading

import pytest

from gptkit.serve.batcher import Batcher
from gptkit.serve.config import ServeLimits
from gptkit.serve.endpoints import _ClientLeft, _pool


class Client:
    """The part of a starlette Request that _pool reads: whether its client is still there."""

    def __init__(self) -> None:
        self.gone = False

    async def is_disconnected(self) -> bool:
        return self.gone


def test_a_waiting_request_whose_client_left_never_runs():
    release = threading.Event()
    seen: list[list[str]] = []

    def blocked(items):
        seen.append(list(items))
        release.wait(10)
        return items

    async def main():
        batcher = Batcher(blocked, max_batch=1, max_queue=8, max_wait=0)
        batcher.start()
        limits = ServeLimits()
        staying, leaving = Client(), Client()
        first = asyncio.ensure_future(_pool(batcher, ["first"], limits, staying))
        while not batcher.inputs:  # the first batch is running, and blocks
            await asyncio.sleep(0.01)
        left = asyncio.ensure_future(_pool(batcher, ["abandoned", "too"], limits, leaving))
        await asyncio.sleep(0.05)
        assert batcher.queue_length == 2  # waiting behind the blocked batch
        leaving.gone = True
        with pytest.raises(_ClientLeft):
            await left
        release.set()
        assert await first == ["first"]
        assert await _pool(batcher, ["next"], limits, staying) == ["next"]
        await batcher.stop()

    asyncio.run(main())
    assert seen == [["first"], ["next"]], "the inputs of the request whose client left never ran"
