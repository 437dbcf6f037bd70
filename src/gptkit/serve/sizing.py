"""How many sequences a server decodes together, and how much memory their keys and values get,
where ``gptkit serve`` is not told: from the machine's memory and the model's measured step.

A step of B sequences reads every weight once, so its time grows slower than B until the products
are bound by the cores rather than the memory: past that point more sequences only make every
stream slower. :func:`choose_max_batch` times the native step at doubling batch sizes (a short
context, a scratch cache) and takes the largest whose doubling still gained at least
``GAIN_TO_DOUBLE`` in tokens a second, within what the memory holds.
"""

from __future__ import annotations

import os
import time

import torch

from gptkit.model import GPT
from gptkit.model.native_step import StepTokens
from gptkit.serve.pages import PAGE_SIZE, PagedCache, page_bytes

DEFAULT_MAX_BATCH = 16  # without the native step (a slot cache of the whole context a sequence)
BATCH_LADDER = (4, 8, 16, 32, 64, 128, 256)
GAIN_TO_DOUBLE = 1.15  # tokens a second a doubling must add for the larger batch to be taken
CACHE_SHARE = 0.5  # of the memory available, the most the keys and values may take
MEASURED_COLUMNS = 64  # the context each sequence has in the measured steps


def available_memory() -> int:
    """Bytes of memory available to this process (Linux's MemAvailable; else 8 GiB)."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 8 << 30


def cache_pages(model: GPT, max_batch: int, cache_mib: int | None) -> int:
    """Pages of the paged cache: ``cache_mib`` MiB, or by default room for every one of
    ``max_batch`` sequences at the whole context, within CACHE_SHARE of the memory available. The
    pages are touched only as sequences fill them: the resident memory follows what is used."""
    one = page_bytes(model.config, model.cache_dtype)
    if cache_mib is not None:
        return max(1, (cache_mib << 20) // one)
    whole = max_batch * -(-model.config.context_length // PAGE_SIZE)
    return max(1, min(whole, int(available_memory() * CACHE_SHARE) // one))


def step_seconds(model: GPT, rows: int, repeats: int = 2) -> float:
    """The best of ``repeats`` native steps of ``rows`` sequences, one token each, MEASURED_COLUMNS in."""
    columns = min(MEASURED_COLUMNS, model.config.context_length - 1)
    width = -(-(columns + 1) // PAGE_SIZE)
    cache = PagedCache(model.config, rows * width, rows, model.cache_dtype)
    cache.keys.zero_(), cache.values.zero_()  # no NaN or subnormal to slow the measured steps
    for _ in range(rows):
        cache.reserve(columns + 1)
    d = model.config.d_model
    best = float("inf")
    for _ in range(repeats + 1):  # the first warms the kernels and the cache's pages
        tokens = StepTokens(
            torch.zeros(rows, d),
            torch.arange(rows, dtype=torch.int32),
            torch.full((rows,), columns, dtype=torch.int32),
            cache.keys,
            cache.values,
            cache.block_table,
        )
        logits = torch.empty(rows, model.config.total_vocab_size)
        started = time.perf_counter()
        model.native_step.run(
            tokens, torch.arange(rows, dtype=torch.int32), logits, torch.empty(rows, dtype=torch.int32)
        )
        best = min(best, time.perf_counter() - started)
    return best


def choose_max_batch(model: GPT, log=None) -> int:
    """The sequences to decode together (see the module's docstring); DEFAULT_MAX_BATCH without the
    native step. ``log`` gets one line saying what was measured."""
    if model.native_step is None:
        return DEFAULT_MAX_BATCH
    per_sequence = page_bytes(model.config, model.cache_dtype) * -(
        -model.config.context_length // (4 * PAGE_SIZE)
    )
    memory_bound = max(1, int(available_memory() * CACHE_SHARE) // per_sequence)  # a quarter context each
    with torch.inference_mode():
        rates = {}
        for rows in BATCH_LADDER:
            if rows > memory_bound:
                break
            rates[rows] = rows / step_seconds(model, rows)
    chosen = BATCH_LADDER[0]
    for rows in list(rates)[1:]:
        if rates[rows] < GAIN_TO_DOUBLE * rates[rows // 2]:
            break
        chosen = rows
    chosen = min(max(chosen, min(BATCH_LADDER[0], memory_bound)), memory_bound)
    if log is not None:
        measured = ", ".join(f"{rows}: {rate:.0f}" for rows, rate in rates.items())
        log(
            f"--max-batch {chosen} (measured tokens/s by sequences decoded together: {measured}; cpu count {os.cpu_count()})"
        )
    return chosen
