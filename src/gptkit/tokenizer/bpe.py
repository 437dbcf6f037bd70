"""Byte-pair encoding (Sennrich et al., 2016): apply a ranked list of merges to a word's symbols."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from gptkit.io import RESAVE_ADVICE, atomic_write, read_json


def read_merges(path: str | Path) -> list[tuple[str, str]]:
    """Read a ``vocab.bpe`` file: a ``#version`` line, then one ``left right`` merge per line.

    A damaged file (empty, not UTF-8, a line that is not a merge) is a ValueError naming it.
    """
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except UnicodeDecodeError as e:
        raise ValueError(
            f"{path}: not UTF-8 text (invalid byte at offset {e.start}): the file is damaged; {RESAVE_ADVICE}"
        ) from e
    if not text:
        raise ValueError(f"{path}: the file is empty; {RESAVE_ADVICE}")
    lines = text.split("\n")
    merges = []
    for line_number, line in enumerate(lines, start=1):
        if line_number == 1 and line.startswith("#version"):
            continue
        if not line:
            continue
        parts = line.split(" ")
        if len(parts) != 2 or not all(parts):
            message = f"{path}, line {line_number}: expected two symbols separated by a space, got {line!r}"
            # Every merge line ends with a newline: a last line without one was cut short.
            if line_number == len(lines):
                message += f": the file ends inside this line, it is truncated; {RESAVE_ADVICE}"
            raise ValueError(message)
        merges.append((parts[0], parts[1]))
    return merges


def read_encoder(path: str | Path) -> dict[str, int]:
    """An ``encoder.json``: token → id, the ids exactly 0 … n-1 (a damaged file is a ValueError)."""
    encoder = read_json(path)
    if not isinstance(encoder, dict):
        raise ValueError(f"{path}: expected a JSON object mapping tokens to ids")
    for token, token_id in encoder.items():
        if not isinstance(token_id, int) or isinstance(token_id, bool) or not 0 <= token_id < len(encoder):
            raise ValueError(
                f"{path}: token {token!r} has id {token_id!r}, expected an integer in 0..{len(encoder) - 1}"
            )
    if len(set(encoder.values())) != len(encoder):
        raise ValueError(f"{path}: some ids belong to more than one token; each token needs its own id")
    return encoder


def write_merges(path: str | Path, merges: Iterable[tuple[str, str]]) -> None:
    def write(tmp: str) -> None:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write("#version: 0.2\n")
            for left, right in merges:
                f.write(f"{left} {right}\n")

    atomic_write(path, write)


class BPE:
    """Merge adjacent symbols, lowest rank first, until no ranked pair is left."""

    def __init__(self, merges: list[tuple[str, str]]):
        self.ranks = {pair: rank for rank, pair in enumerate(merges)}

    def __call__(self, symbols: tuple[str, ...]) -> tuple[str, ...]:
        ranks = self.ranks
        word = list(symbols)
        while len(word) > 1:
            best, best_rank = None, None
            for pair in zip(word, word[1:]):
                rank = ranks.get(pair)
                if rank is not None and (best_rank is None or rank < best_rank):
                    best, best_rank = pair, rank
            if best is None:
                break
            first, second = best
            merged, i = [], 0
            # Merge every occurrence, scanning left to right without overlaps.
            while i < len(word):
                if i < len(word) - 1 and word[i] == first and word[i + 1] == second:
                    merged.append(first + second)
                    i += 2
                else:
                    merged.append(word[i])
                    i += 1
            word = merged
        return tuple(word)
