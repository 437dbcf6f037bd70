"""Pieces of a corpus → token ids, in this process alone or with a pool of helper processes.

``prepare`` (:mod:`gptkit.data.prepare`) writes the ids to the shards; this module only tokenizes.
The pool keeps the corpus's order and bounds memory whatever the corpus size; the ids are the same
for any number of workers.
"""

from __future__ import annotations

import multiprocessing
import os
import sys
from collections import deque
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass

import numpy as np

from gptkit.data.corpus import Piece
from gptkit.tokenizer import END_OF_TEXT, Tokenizer

TASK_BYTES = 1 << 16  # text per task for a worker process (many JSONL documents make one task)
TASKS_AHEAD = 2  # tasks per helper submitted ahead: one to run, one queued, so a helper never waits


def _dtype_for(vocab: int) -> np.dtype:
    return np.dtype(np.uint16) if vocab <= np.iinfo(np.uint16).max + 1 else np.dtype(np.uint32)


def default_workers() -> int:
    """The CPU cores this process may run on."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


# What tokenizes a piece: the tokenizer, the separator's ids (none when it has no end-of-text), the dtype.
Encoder = tuple[Tokenizer, list[int], np.dtype]


def encoder_for(tokenizer: Tokenizer) -> Encoder:
    """What tokenizes pieces with ``tokenizer``, into ids of the smallest dtype that holds its vocabulary."""
    separator = [tokenizer.special_tokens[END_OF_TEXT]] if END_OF_TEXT in tokenizer.special_tokens else []
    return tokenizer, separator, _dtype_for(len(tokenizer))


def _encode(encoder: Encoder, text: str, ends_document: bool) -> np.ndarray:
    tokenizer, separator, dtype = encoder
    ids = tokenizer.encode(text) if text else []
    if ends_document:
        ids = ids + separator
    return np.asarray(ids, dtype=dtype)


def encoded_here(pieces: Iterable[Piece], encoder: Encoder) -> Iterator[tuple[str, int, np.ndarray]]:
    """(split, bytes read, ids) of every piece, tokenized in this process."""
    for text, split, n_bytes, ends_document in pieces:
        yield split, n_bytes, _encode(encoder, text, ends_document)


# Set in each worker process by _start_worker: its tokenizer, or the error that loading it raised.
_worker_encoder: Encoder | Exception | None = None


def _start_worker(tokenizer_dir: str) -> None:
    global _worker_encoder
    try:
        _worker_encoder = encoder_for(Tokenizer.from_pretrained(tokenizer_dir))
    except Exception as e:  # raised by the first task, so it reaches the main process as it is
        _worker_encoder = e


def _encode_in_worker(texts: list[tuple[str, bool]]) -> list[np.ndarray]:
    if isinstance(_worker_encoder, Exception):
        raise _worker_encoder
    assert _worker_encoder is not None, "_start_worker runs first in every worker"
    return [_encode(_worker_encoder, text, ends_document) for text, ends_document in texts]


def _batches(pieces: Iterable[Piece]) -> Iterator[list[Piece]]:
    """Consecutive pieces, about TASK_BYTES of text a batch."""
    batch: list[Piece] = []
    size = 0
    for piece in pieces:
        batch.append(piece)
        size += len(piece[0])
        if size >= TASK_BYTES:
            yield batch
            batch, size = [], 0
    if batch:
        yield batch


def _pool_context() -> multiprocessing.context.BaseContext:
    """forkserver where the OS has it, else spawn: forking a process that runs torch's threads may hang."""
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("spawn")
    context = multiprocessing.get_context("forkserver")
    # Workers fork from one server that imported this module (the tokenizer and torch with it)
    # and, if this process loaded them for GPT-1's tokenizer, spaCy and ftfy: each worker then
    # starts in a fraction of a second. Missing modules are skipped; the list only counts when the server first starts.
    preload = [m for m in ("ftfy", "spacy.lang.en") if m.split(".")[0] in sys.modules]
    context.set_forkserver_preload([__name__, *preload])
    return context


@dataclass
class _Batch:
    """Consecutive pieces on their way to the shards: their labels (split, bytes read) and their ids,
    tokenized here (a list) or by a helper (a Future)."""

    labels: list[tuple[str, int]]
    result: Future | list[np.ndarray]

    def finished(self) -> bool:
        return not isinstance(self.result, Future) or self.result.done()

    def results(self) -> Iterator[tuple[str, int, np.ndarray]]:
        encoded = self.result.result() if isinstance(self.result, Future) else self.result
        for (split, n_bytes), ids in zip(self.labels, encoded, strict=True):
            yield split, n_bytes, ids


def encoded_in_pool(
    pieces: Iterable[Piece], encoder: Encoder, tokenizer_dir: str, workers: int
) -> Iterator[tuple[str, int, np.ndarray]]:
    """(split, bytes read, ids) of every piece in the corpus's order, tokenized by this process and
    ``workers - 1`` helper processes.

    A batch goes to a helper while the helpers have fewer than ``TASKS_AHEAD`` unfinished batches
    each; otherwise this process tokenizes it itself, so no core idles while a helper starts
    (loading the tokenizer takes a fraction of a second) or has work queued, and at the end of the
    corpus this process waits for at most ``TASKS_AHEAD`` batches per helper. Finished batches are
    written in order; at most ``2 · TASKS_AHEAD`` per process wait to be written, so memory is
    bounded whatever the corpus size (``Pool.imap`` would read the whole corpus into its task
    queue). A helper's exception is raised here, unchanged.
    """
    helpers = workers - 1
    pending: deque[_Batch] = deque()
    executor = ProcessPoolExecutor(
        helpers, mp_context=_pool_context(), initializer=_start_worker, initargs=(tokenizer_dir,)
    )
    try:
        for batch in _batches(pieces):
            while pending and pending[0].finished():
                yield from pending.popleft().results()
            texts = [(text, ends_document) for text, _, _, ends_document in batch]
            labels = [(split, n_bytes) for _, split, n_bytes, _ in batch]
            unfinished = sum(isinstance(entry.result, Future) and not entry.finished() for entry in pending)
            if unfinished < TASKS_AHEAD * helpers:
                pending.append(_Batch(labels, executor.submit(_encode_in_worker, texts)))
            else:
                pending.append(_Batch(labels, [_encode(encoder, text, ends) for text, ends in texts]))
            while len(pending) > 2 * TASKS_AHEAD * workers:  # wait for the oldest
                yield from pending.popleft().results()
        while pending:
            yield from pending.popleft().results()
    except BrokenProcessPool as e:  # a helper died: killed, out of memory, or it could not start
        raise RuntimeError(
            f"a tokenizing worker process stopped ({e}); its error, if any, is printed above. "
            "workers=1 (`gptkit prepare --workers 1`) tokenizes in this process alone"
        ) from e
    finally:
        executor.shutdown(wait=True, cancel_futures=True)
