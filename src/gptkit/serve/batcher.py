"""Batches for requests answered by one forward pass (embeddings, classification).

The inputs of every request wait in one bounded queue: all of a request's inputs fit, or it gets
:class:`QueueFull` (HTTP 429) at once. A loop on the server's event loop takes up to ``max_batch``
waiting inputs, whichever requests they come from, and runs them through ``run`` in one call, in a
worker thread (the event loop keeps answering meanwhile). Once the first input has arrived the loop
waits at most ``max_wait`` seconds for a batch to fill: a lone request pays at most that; under load
the next batch fills while the previous one runs. A request gets its results, in order, when the
last of its inputs is done; one whose client stopped waiting (its time limit) is skipped.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from gptkit import native
from gptkit.serve.engine import EngineStopped, QueueFull

logger = logging.getLogger("gptkit.serve")


class BatchFailed(Exception):
    """The forward pass of a batch raised: every request in it fails."""


@dataclass(eq=False)
class _Job:
    """One request's inputs and its results as they come."""

    items: list[Any]
    future: asyncio.Future
    results: list[Any]
    left: int


class Batcher:
    """Runs ``run(items) -> results`` (one result per item, in order) over batches of many requests."""

    def __init__(
        self,
        run: Callable[[list[Any]], Sequence[Any]],
        *,
        max_batch: int,
        max_queue: int,
        max_wait: float,
        name: str = "batcher",
    ):
        if max_batch < 1 or max_queue < 1 or max_wait < 0:
            raise ValueError(
                f"max_batch and max_queue must be >= 1 and max_wait >= 0, got {max_batch}, {max_queue}, "
                f"{max_wait}"
            )
        self.run, self.name = run, name
        self.max_batch, self.max_queue, self.max_wait = max_batch, max_queue, max_wait
        self._waiting: deque[tuple[_Job, int]] = deque()  # (request, index of one of its inputs)
        self._running: list[tuple[_Job, int]] = []  # the batch in the worker thread
        self._arrived = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._executor: ThreadPoolExecutor | None = None
        # Counters, read by /metrics.
        self.batches = 0
        self.inputs = 0

    # Life cycle -------------------------------------------------------------------------------------

    def start(self) -> None:
        """Start the loop on the running event loop (the server's startup)."""
        self._executor = ThreadPoolExecutor(1, thread_name_prefix=f"gptkit-{self.name}")
        self._task = asyncio.get_running_loop().create_task(self._loop(), name=f"gptkit-{self.name}")

    async def stop(self) -> None:
        """Stop the loop; requests still waiting or running fail with :class:`EngineStopped`."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        for job, _ in [*self._running, *self._waiting]:
            if not job.future.done():
                job.future.set_exception(EngineStopped("the server is shutting down"))
        self._waiting.clear()
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)

    @property
    def alive(self) -> bool:
        return self._task is not None and not self._task.done()

    @property
    def queue_length(self) -> int:
        return len(self._waiting)

    # Requests ---------------------------------------------------------------------------------------

    async def submit(self, items: Sequence[Any], timeout: float) -> list[Any]:
        """The results of ``items``, in order. Raises QueueFull when they do not all fit in the queue,
        EngineStopped when the loop is not running, ``asyncio.TimeoutError`` after ``timeout``
        seconds and BatchFailed when their forward pass failed."""
        if not self.alive:
            raise EngineStopped("the server is shutting down")
        if len(self._waiting) + len(items) > self.max_queue:
            self._drop_abandoned()
            if len(self._waiting) + len(items) > self.max_queue:
                raise QueueFull(
                    f"the queue holds {len(self._waiting)} of at most {self.max_queue} waiting inputs; "
                    f"this request needs {len(items)} more: retry later"
                )
        future = asyncio.get_running_loop().create_future()
        job = _Job(list(items), future, [None] * len(items), len(items))
        self._waiting.extend((job, i) for i in range(len(items)))
        self._arrived.set()
        # On timeout wait_for cancels the future: the loop then skips this request's inputs.
        return await asyncio.wait_for(future, timeout)

    def _run_alone(self, items: list) -> Any:
        """``run(items)`` holding gptkit.native.TEAM: one team of threads at a time on the cores, never
        beside another batcher's forward pass or the engine's decoding step (which holds it too)."""
        with native.TEAM:
            return self.run(items)

    def _drop_abandoned(self) -> None:
        self._waiting = deque(entry for entry in self._waiting if not entry[0].future.done())

    # The loop ---------------------------------------------------------------------------------------

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await self._fill(loop)
            batch = self._take()
            if not batch:
                continue
            self.batches += 1
            self.inputs += len(batch)
            items = [job.items[i] for job, i in batch]
            self._running = batch  # stop() fails these if it cancels the loop during the forward
            try:
                results = await loop.run_in_executor(self._executor, self._run_alone, items)
                if len(results) != len(items):
                    raise RuntimeError(f"{len(results)} results for {len(items)} inputs")
            except Exception:  # a bug or out of memory: this batch's requests fail, the loop goes on
                logger.exception("%s: a batch of %d inputs failed", self.name, len(items))
                results = [BatchFailed()] * len(items)
            self._running = []
            for (job, i), result in zip(batch, results):
                if job.future.done():  # timed out, or failed in another batch
                    continue
                if isinstance(result, BatchFailed):
                    job.future.set_exception(result)
                    continue
                job.results[i] = result
                job.left -= 1
                if job.left == 0:
                    job.future.set_result(job.results)

    async def _fill(self, loop: asyncio.AbstractEventLoop) -> None:
        """Wait for a first input, then at most ``max_wait`` seconds for ``max_batch`` of them."""
        while not self._waiting:
            self._arrived.clear()
            await self._arrived.wait()
        fill_by = loop.time() + self.max_wait
        while len(self._waiting) < self.max_batch:
            left = fill_by - loop.time()
            if left <= 0:
                break
            self._arrived.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._arrived.wait(), left)

    def _take(self) -> list[tuple[_Job, int]]:
        batch: list[tuple[_Job, int]] = []
        while self._waiting and len(batch) < self.max_batch:
            entry = self._waiting.popleft()
            if not entry[0].future.done():
                batch.append(entry)
        return batch
