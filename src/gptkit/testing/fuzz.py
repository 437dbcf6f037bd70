"""Fuzzing gptkit's readers: damage drawn by hypothesis, and one damaged input loaded under a time limit.

hypothesis draws the damage from what happens to files (cut short, bits flipped, bytes overwritten,
inserted or dropped, invalid UTF-8) and, for the structured formats, from what a hand edit or
another program does (a JSON value of the wrong type, missing and extra keys, huge, negative and NaN
numbers, deep nesting; a safetensors header whose length prefix lies). Each input must either load
or raise gptkit's own error (a ValueError or OSError) whose one-line message names the damaged file;
another exception, a message that does not say which file, or a load past :data:`TIME_LIMIT_S` is a
failure. The files themselves are :mod:`gptkit.testing.fuzz_targets`'.

hypothesis (not atheris): it runs in the test process on every platform PyTorch does, its seeded,
derandomized runs repeat exactly in the suite, and its strategies describe structured damage (a
JSON path, a header length) directly; the readers are Python over C libraries (json, safetensors,
numpy, pyarrow) whose own fuzzing is their projects', so coverage-guided byte mutation adds little.

Used by tests/test_fuzz_readers.py (a seeded slice) and benchmarks/fuzz_campaign.py (the campaign).
"""

from __future__ import annotations

import contextlib
import gzip
import json
import shutil
import signal
import struct
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hypothesis import strategies as st

TIME_LIMIT_S = 10.0  # an input that takes longer to load is a failure (a hang)

# Bytes that mean something to one reader or another: separators, quotes, a BOM, lone UTF-8 lead
# bytes, NUL, and numbers at the edges.
INTERESTING = [
    b"\t", b"\n", b"\r\n", b"\r", b'"', b",", b"\\", b"\x00", b"\xff", b"\xc3", b"\xed\xa0\x80",
    b"\xef\xbb\xbf", b" ", b"{", b"}", b"[", b"]", b"NaN", b"-1", b"1e999", b"99999999999999999999",
    b"</w>", b"#version: 0.2", b"\xc4\xa0",
]  # fmt: skip
DEEP = "\x00deep\x00"  # a JSON value replaced, once serialised, by arrays nested this deep
DEPTHS = [50, 1_000, 100_000]


class Hang(Exception):
    """A load ran past TIME_LIMIT_S."""


class Unexpected(Exception):
    """An input neither loaded nor raised gptkit's own error naming the file."""


@dataclass(frozen=True)
class Target:
    """``build(folder)`` writes valid files and returns the one to damage; ``load(folder)`` reads the
    folder as the command does. ``kind`` chooses the structured damage: json, safetensors, torch,
    lines, gzip, zstd or bytes (the byte-level damage applies to all)."""

    name: str
    build: Callable[[Path], Path]
    load: Callable[[Path], Any]
    kind: str = "bytes"
    needs_data: bool = False  # reads the head of a public dataset's file (GPTKIT_DATA)
    # What the message must name, when not the damaged file's name: a checkpoint's manifest lists
    # the checkpoint's other files, so a wrong entry is reported as that file not matching it.
    names: tuple[str, ...] = ()


# Damage ---------------------------------------------------------------------------------------------


def odd_values(depth: int = 2) -> st.SearchStrategy:
    """JSON values a reader does not expect: wrong types, numbers at the edges, NaN, deep nesting."""
    numbers = st.one_of(
        st.sampled_from([0, -1, 1, 2**31, 2**63, 2**64 + 1, -(2**63), 10**30, True, False]),
        st.integers(-(2**70), 2**70),
        st.floats(allow_nan=True, allow_infinity=True),
    )
    leaves = st.one_of(
        st.none(), numbers, st.text(max_size=12), st.sampled_from(["", "\x00", "..", "/", "uint17", DEEP])
    )
    if depth == 0:
        return leaves
    inner = odd_values(depth - 1)
    return st.one_of(
        leaves, st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=6), inner, max_size=3)
    )


def _paths(value: Any, prefix: tuple = ()) -> Iterator[tuple]:
    """Every path into a JSON value (object keys and array indices), the value's own first."""
    yield prefix
    children = (
        value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    )
    for key, child in children:
        if len(prefix) < 6:
            yield from _paths(child, (*prefix, key))


def _at(value: Any, path: tuple) -> Any:
    for key in path:
        value = value[key]
    return value


def _copy_tree(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _copy_tree(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_copy_tree(v) for v in value]
    return value


@st.composite
def mutated_tree(draw, tree: Any, deep_ok: bool = True) -> Any:
    """``tree`` (decoded JSON, or a torch state of dicts, lists and tensors) with one part replaced,
    removed or added to."""
    tree = _copy_tree(tree)
    paths = list(_paths(tree))
    # Few-key files first, then any path: a big vocabulary would otherwise draw only its leaves.
    path = draw(st.sampled_from(paths[:64]) | st.sampled_from(paths))
    action = draw(st.sampled_from(["replace", "replace", "delete", "add"]))
    values = odd_values() if deep_ok else odd_values().filter(lambda v: v != DEEP)
    if not path:
        return draw(values)
    parent, key = _at(tree, path[:-1]), path[-1]
    if action == "replace":
        parent[key] = draw(values)
    elif action == "delete":
        del parent[key]
    else:
        target = parent[key]
        if isinstance(target, dict):
            target[draw(st.text(max_size=8))] = draw(values)
        elif isinstance(target, list):
            target.insert(draw(st.integers(0, len(target))), draw(values))
        else:
            parent[key] = [target, draw(values)]
    return tree


def dump_json(value: Any, depth: int) -> bytes:
    text = json.dumps(value, ensure_ascii=False, allow_nan=True)
    return text.replace(json.dumps(DEEP), "[" * depth + "]" * depth).encode("utf-8", "surrogatepass")


@st.composite
def byte_damage(draw, data: bytes) -> bytes:
    """What happens to a file's bytes: cut short, bits flipped, bytes overwritten, inserted or removed."""
    n = len(data)
    action = draw(st.sampled_from(["truncate", "flip", "overwrite", "insert", "delete", "empty"]))
    if action == "empty" or n == 0:
        return b""
    at = draw(st.integers(0, n - 1) | st.integers(max(0, n - 16), n - 1) | st.integers(0, min(n - 1, 15)))
    if action == "truncate":
        return data[:at]
    if action == "flip":
        out = bytearray(data)
        for _ in range(draw(st.integers(1, 8))):
            position = draw(st.integers(0, n - 1)) if len(out) else 0
            out[position] ^= 1 << draw(st.integers(0, 7))
        return bytes(out)
    new = draw(st.sampled_from(INTERESTING) | st.binary(min_size=1, max_size=16))
    if action == "overwrite":
        return data[:at] + new + data[at + len(new) :]
    if action == "insert":
        return data[:at] + new + data[at:]
    return data[:at] + data[at + draw(st.integers(1, 64)) :]


@st.composite
def line_damage(draw, data: bytes) -> bytes:
    """A line dropped, repeated, cut or swapped for odd text; a field separator added or removed."""
    lines = data.split(b"\n")
    i = draw(st.integers(0, len(lines) - 1))
    action = draw(st.sampled_from(["drop", "repeat", "cut", "replace", "tab", "untab"]))
    if action == "drop":
        del lines[i]
    elif action == "repeat":
        lines.insert(i, lines[i])
    elif action == "cut":
        lines[i] = lines[i][: draw(st.integers(0, max(len(lines[i]) - 1, 0)))]
    elif action == "replace":
        lines[i] = draw(st.sampled_from(INTERESTING) | st.text(max_size=20).map(str.encode))
    elif action == "tab":
        lines[i] += b"\t" * draw(st.integers(1, 3))
    else:
        lines[i] = lines[i].replace(b"\t", b" ", 1).replace(b",", b" ", 1)
    return b"\n".join(lines)


@st.composite
def safetensors_damage(draw, data: bytes) -> bytes:
    """The 8-byte header length made to lie, or the JSON header itself edited (its length kept true)."""
    (length,) = struct.unpack("<Q", data[:8])
    header, body = json.loads(data[8 : 8 + length]), data[8 + length :]
    if draw(st.booleans()):
        lie = draw(st.sampled_from([0, 1, 2, length - 1, length + 1, len(data), 2**32, 2**63, 2**64 - 1]))
        return struct.pack("<Q", lie) + data[8:]
    edited = dump_json(draw(mutated_tree(header)), draw(st.sampled_from(DEPTHS)))
    return struct.pack("<Q", len(edited)) + edited + body


def damage(target: Target, original: bytes) -> st.SearchStrategy[bytes]:
    """The strategy of damaged versions of ``original`` for ``target``'s kind of file."""
    kinds = [byte_damage(original)]
    if target.kind == "json":
        tree = json.loads(original)
        kinds += [
            st.builds(dump_json, mutated_tree(tree), st.sampled_from(DEPTHS)),
            st.builds(dump_json, mutated_tree(tree), st.sampled_from(DEPTHS)),
        ]
    elif target.kind == "safetensors":
        kinds += [safetensors_damage(original)] * 2
    elif target.kind == "torch":
        kinds += [st.just(original).flatmap(lambda data: torch_damage(data))] * 2
    elif target.kind == "lines":
        kinds += [line_damage(original)] * 2
    elif target.kind == "gzip":
        plain = gzip.decompress(original)
        kinds += [(byte_damage(plain) | line_damage(plain)).map(lambda d: gzip.compress(d, mtime=0))]
    elif target.kind == "zstd":
        import zstandard

        plain = zstandard.ZstdDecompressor().decompress(original)
        compress = zstandard.ZstdCompressor().compress
        kinds += [(byte_damage(plain) | line_damage(plain)).map(compress)]
    return st.one_of(kinds)


def torch_damage(data: bytes) -> st.SearchStrategy[bytes]:
    """A torch.save file rewritten with one part of its state replaced, removed or added to."""
    import io

    import torch

    state = torch.load(io.BytesIO(data), weights_only=True)

    def save(tree: Any) -> bytes:
        buffer = io.BytesIO()
        torch.save(tree, buffer)
        return buffer.getvalue()

    return mutated_tree(state, deep_ok=False).map(save)


# Running one input ---------------------------------------------------------------------------------


@contextlib.contextmanager
def deadline(seconds: float) -> Iterator[None]:
    """Raise :class:`Hang` in the block after ``seconds``, and again every second after: an alarm
    that lands in a garbage-collector callback is printed and dropped by Python, not raised."""

    def expire(signum, frame):
        raise Hang(f"still loading after {seconds:.0f} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds, 1.0)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def try_input(target: Target, folder: Path, damaged: Path, data: bytes) -> str:
    """Write ``data`` as the damaged file, load the folder; "loaded" or "refused", else Unexpected."""
    original = damaged.read_bytes()
    damaged.write_bytes(data)
    try:
        with warnings.catch_warnings(), deadline(TIME_LIMIT_S):
            warnings.simplefilter("ignore")
            target.load(folder)
    except (ValueError, OSError) as e:
        if type(e) is UnicodeDecodeError:  # Python's own, naming no file
            raise Unexpected(f"{type(e).__name__}: {e}") from e
        message = str(e)
        if not any(name in message for name in (damaged.name, *target.names)) or "\n" in message.strip():
            raise Unexpected(
                f"{type(e).__name__} not naming {damaged.name} in one line: {message[:300]}"
            ) from e
        return "refused"
    except Hang as e:
        raise Unexpected(str(e)) from e
    except Exception as e:
        raise Unexpected(f"{type(e).__name__}: {str(e)[:300]}") from e
    finally:
        damaged.write_bytes(original)
    return "loaded"


def prepared(target: Target, root: Path) -> tuple[Path, Path]:
    """A folder of ``target``'s valid files under ``root`` and the file to damage; the valid files
    must load (else the damage would not be what fails)."""
    folder = root / target.name
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    damaged = target.build(folder)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        target.load(folder)
    return folder, damaged
