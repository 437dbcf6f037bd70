"""The pooling endpoints' batcher, in this process: what batches it forms, and how it fails.

The reference is the plain function it batches, called on each input alone.
"""

from __future__ import annotations

import asyncio
import threading

import pytest

from gptkit.serve.batcher import Batcher, BatchFailed
from gptkit.serve.engine import EngineStopped, QueueFull
from gptkit.serve.models import name_models


def square_all(batches: list[list[int]]):
    """A run function that records the batches it was given."""

    def run(items: list[int]) -> list[int]:
        batches.append(list(items))
        return [x * x for x in items]

    return run


def test_concurrent_requests_share_batches_each_getting_its_own_results_in_order():
    batches: list[list[int]] = []

    async def main():
        batcher = Batcher(square_all(batches), max_batch=8, max_queue=64, max_wait=0.05)
        batcher.start()
        requests = [list(range(10 * r, 10 * r + 1 + r % 3)) for r in range(12)]
        try:
            results = await asyncio.gather(*(batcher.submit(items, timeout=10) for items in requests))
        finally:
            await batcher.stop()
        return requests, results, batcher

    requests, results, batcher = asyncio.run(main())
    assert results == [[x * x for x in items] for items in requests]
    n_inputs = sum(len(items) for items in requests)
    assert all(len(batch) <= 8 for batch in batches) and sum(map(len, batches)) == n_inputs
    assert len(batches) == -(-n_inputs // 8), "every batch but the last was full"
    assert (batcher.batches, batcher.inputs) == (len(batches), n_inputs)


def test_a_lone_request_waits_at_most_max_wait():
    async def main():
        batcher = Batcher(lambda items: items, max_batch=8, max_queue=8, max_wait=0.2)
        batcher.start()
        loop = asyncio.get_running_loop()
        started = loop.time()
        try:
            assert await batcher.submit([1], timeout=10) == [1]
        finally:
            await batcher.stop()
        return loop.time() - started

    assert 0.19 < asyncio.run(main()) < 2


def test_a_full_queue_refuses_a_request_whole_and_at_once():
    release = threading.Event()

    def blocked(items):
        release.wait(10)
        return items

    async def main():
        batcher = Batcher(blocked, max_batch=1, max_queue=2, max_wait=0)
        batcher.start()
        running = asyncio.ensure_future(batcher.submit(["a"], timeout=10))  # taken, blocks the worker
        while not batcher.inputs:
            await asyncio.sleep(0.01)
        waiting = asyncio.ensure_future(batcher.submit(["b", "c"], timeout=10))  # fills the queue
        await asyncio.sleep(0.05)
        with pytest.raises(QueueFull, match="at most 2"):
            await batcher.submit(["d"], timeout=10)
        assert batcher.queue_length == 2, "a refused request leaves nothing behind"
        release.set()
        results = [await running, await waiting]
        await batcher.stop()
        return results

    assert asyncio.run(main()) == [["a"], ["b", "c"]]


def test_a_request_past_its_time_limit_is_dropped_and_the_others_go_on():
    release = threading.Event()
    seen: list[list[str]] = []

    def blocked(items):
        seen.append(list(items))
        release.wait(10)
        return items

    async def main():
        batcher = Batcher(blocked, max_batch=1, max_queue=8, max_wait=0)
        batcher.start()
        first = asyncio.ensure_future(batcher.submit(["first"], timeout=10))
        while not batcher.inputs:
            await asyncio.sleep(0.01)
        with pytest.raises(asyncio.TimeoutError):
            await batcher.submit(["late"], timeout=0.1)  # waits behind the blocked batch, then gives up
        release.set()
        assert await first == ["first"]
        assert await batcher.submit(["next"], timeout=10) == ["next"]
        await batcher.stop()

    asyncio.run(main())
    assert seen == [["first"], ["next"]], "the abandoned input never ran"


def test_a_failed_batch_fails_its_requests_only():
    def fragile(items):
        if "bad" in items:
            raise RuntimeError("out of memory, say")
        return items

    async def main():
        batcher = Batcher(fragile, max_batch=4, max_queue=8, max_wait=0)
        batcher.start()
        with pytest.raises(BatchFailed):
            await batcher.submit(["bad"], timeout=10)
        assert await batcher.submit(["good"], timeout=10) == ["good"]
        await batcher.stop()

    asyncio.run(main())


def test_stopping_fails_what_waits_and_refuses_what_comes():
    release = threading.Event()

    async def main():
        batcher = Batcher(lambda items: release.wait(10) and items, max_batch=1, max_queue=8, max_wait=0)
        batcher.start()
        running = asyncio.ensure_future(batcher.submit(["running"], timeout=10))
        while not batcher.inputs:
            await asyncio.sleep(0.01)
        waiting = asyncio.ensure_future(batcher.submit(["waiting"], timeout=10))
        await asyncio.sleep(0.05)
        await batcher.stop()
        release.set()
        for request in (running, waiting):
            with pytest.raises(EngineStopped):
                await request
        with pytest.raises(EngineStopped):
            await batcher.submit(["after"], timeout=10)

    asyncio.run(main())


def test_model_names_from_the_model_flags(tmp_path):
    assert name_models(["lm=runs/pre", "sst2=runs/sst2"]) == {"lm": "runs/pre", "sst2": "runs/sst2"}
    assert name_models(["runs/pre"]) == {"pre": "runs/pre"}
    assert name_models(["runs/pre"], "tiny") == {"tiny": "runs/pre"}
    assert name_models(["runs/pre", "rte=runs/rte"]) == {"pre": "runs/pre", "rte": "runs/rte"}
    odd = tmp_path / "a=b"  # a directory whose name holds "=": a path, not a name
    odd.mkdir()
    assert name_models([str(odd)]) == {"a=b": str(odd)}
    with pytest.raises(ValueError, match="two models are named 'pre'"):
        name_models(["runs/pre", "other/pre"])
    with pytest.raises(ValueError, match="--model-name names a single model"):
        name_models(["a=x", "b=y"], "tiny")
