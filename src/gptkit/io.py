"""Files: atomic writes, JSON, safetensors and torch.load of tensors only.

Every layer reads and writes through these (tokenizers, data shards, checkpoints, runs); this
module imports no model, so nothing below the model depends on it. A damaged file is always a
ValueError that names the file, says what is wrong and what to do.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import re
import shutil
import socket
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

try:
    import fcntl
except ImportError:  # Windows: no advisory locks
    fcntl = None

# Atomic writes ---------------------------------------------------------------------------------


def atomic_write(path: str | Path, write: Callable[[str], None]) -> None:
    """Call ``write(tmp_path)``, then rename the file into place: a crash never leaves half a file.

    The file and the rename are ``fsync``ed (about 10 ms a file on a local disk); ``GPTKIT_FSYNC=0``
    skips that for throwaway runs (the test suite), which then survive a crash but not a power cut."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp, hidden = None, path.parent / f".{path.name}."
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=hidden.name, suffix=".tmp")
        os.close(fd)
        write(tmp)
        # Flushed before the rename, and the rename flushed after it: after a power loss the path
        # holds the old file or the new one, never a zero-length file (ext4's delayed allocation).
        durable = os.environ.get("GPTKIT_FSYNC", "1") != "0"
        if durable:
            with open(tmp, "rb") as f:
                os.fsync(f.fileno())
        os.replace(tmp, path)
        if durable:
            _fsync_directory(path.parent)
    except BaseException as e:
        if tmp is not None and os.path.exists(tmp):
            os.unlink(tmp)
        system = isinstance(e, OSError) and type(e).__module__ == "builtins"  # not gptkit's own
        if system and (e.filename is None or str(e.filename).startswith(str(hidden))):
            # A full disk or a read-only folder, said of the file being written, not of its hidden
            # temporary (or of nothing: a failed write() names no file).
            raise OSError(e.errno, e.strerror or str(e), str(path)) from e
        raise


# What a write meets when the disk, or the folder, cannot take it.
DISK_ERRNOS = frozenset(
    code for code in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS, errno.EIO) if code is not None
)


def free_space(path: str | Path) -> str:
    """ "N MB are free" on the disk that holds ``path`` (or its nearest folder that exists)."""
    path = Path(path).absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    try:
        return f"{shutil.disk_usage(path).free / 1e6:,.0f} MB are free"
    except OSError:
        return "the free space is unknown"


def _fsync_directory(directory: Path) -> None:
    """Make a rename in ``directory`` durable (where the OS allows opening a directory)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:  # e.g. Windows
        return
    try:
        os.fsync(fd)
    except OSError:  # some filesystems refuse fsync on a directory
        pass
    finally:
        os.close(fd)


def write_json(path: str | Path, data: Any) -> None:
    def write(tmp: str) -> None:
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(data, f, indent=2, ensure_ascii=False)
            f.write("\n")

    atomic_write(path, write)


MAX_JSON_DEPTH = 100  # far beyond any file gptkit reads; a deeper value breaks repr() and ==


def json_loads(text: str | bytes) -> Any:
    """``json.loads``, with nesting deeper than :data:`MAX_JSON_DEPTH` (``[[[[...`` a hundred
    thousand deep) reported as a JSONDecodeError, not a RecursionError (here, or later when the
    value is compared or printed in a message)."""
    try:
        value = json.loads(text)
    except RecursionError:
        raise json.JSONDecodeError("nested too deeply to be read", "", 0) from None
    containers = [(value, 1)] if isinstance(value, (dict, list)) else []
    while containers:  # iteratively: the check itself must not recurse
        container, depth = containers.pop()
        if depth > MAX_JSON_DEPTH:
            raise json.JSONDecodeError(f"nested more than {MAX_JSON_DEPTH} deep", "", 0)
        children = container.values() if isinstance(container, dict) else container
        containers.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))
    return value


def read_json(path: str | Path) -> Any:
    """The JSON value in ``path``. A damaged file is a ValueError naming the file and the damage."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(
            f"{path}: not UTF-8 text (invalid byte at offset {e.start}): the file is damaged or not JSON"
        ) from e
    try:
        return json_loads(text)
    except json.JSONDecodeError as e:
        where = f"line {e.lineno}, column {e.colno}: {e.msg}"
        if not text.strip():
            raise ValueError(f"{path}: not valid JSON: the file is empty") from e
        # A file cut short fails at its very end, or inside a string that never closes.
        if e.pos >= len(text.rstrip()) or e.msg.startswith("Unterminated string"):
            raise ValueError(f"{path}: not valid JSON: the file ends early, it is truncated ({where})") from e
        raise ValueError(f"{path}: not valid JSON ({where})") from e


_JSON_TYPES = {dict: "an object", list: "an array", str: "a string", bool: "a boolean", type(None): "null"}


def json_type_name(value: Any) -> str:
    """How JSON calls the type of a decoded value ("an object", "a number", ...), for messages."""
    return _JSON_TYPES.get(type(value), "a number")


def read_json_object(path: str | Path) -> dict[str, Any]:
    """A JSON file that must hold an object ``{...}``: anything else is a ValueError naming the file."""
    value = read_json(path)
    if not isinstance(value, dict):
        raise ValueError(f"{path}: expected a JSON object {{...}}, found {json_type_name(value)}")
    return value


def save_safetensors(
    tensors: dict[str, torch.Tensor], path: str | Path, metadata: dict[str, str] | None = None
):
    from safetensors import SafetensorError
    from safetensors.torch import save_file

    tensors = {k: v.detach().contiguous().cpu() for k, v in tensors.items()}

    def write(tmp: str) -> None:
        try:
            save_file(tensors, tmp, metadata=metadata)
        except SafetensorError as e:  # its writer's I/O errors, a full disk's included
            code = re.search(r"code: (\d+)", str(e))
            if code is None:
                raise
            raise OSError(int(code.group(1)), os.strerror(int(code.group(1)))) from e

    atomic_write(path, write)


RESAVE_ADVICE = "re-download or re-save it"


def read_safetensors(path: str | Path) -> dict[str, torch.Tensor]:
    """The tensors of a ``.safetensors`` file; a damaged file is a ValueError that names it.

    The tensors are mapped from the file, not read: a page is read when a tensor is first used, and
    each tensor has a mapping of its own, so its pages leave memory as soon as it is dropped. A
    loader that copies the tensors one at a time and drops each (``GPT.from_pretrained``) holds the
    model once, not twice (with one mapping for the whole file, every page read stays resident until
    the last tensor is dropped).
    """
    from safetensors import SafetensorError, safe_open

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file")
    try:
        with safe_open(path, framework="pt") as file:
            names = list(file.keys())
        tensors = {}
        for name in names:
            with safe_open(path, framework="pt") as file:  # this tensor's own mapping
                tensors[name] = file.get_tensor(name)
        return tensors
    except SafetensorError as e:
        cause = " ".join(str(e).split())[:300]  # one line: the header's bad bytes may hold line ends
        raise ValueError(
            f"{path}: cannot be read ({cause}): the file is truncated or not a safetensors file; {RESAVE_ADVICE}"
        ) from e


def _torch_load(path: Path, remedy: str) -> Any:
    """``torch.load`` of tensors, numbers and strings only; a damaged file is a ValueError naming it."""
    try:
        # weights_only: never unpickle arbitrary objects from a file someone handed us.
        return torch.load(path, map_location="cpu", weights_only=True)
    except OSError as e:
        if e.filename is not None:
            raise  # missing or unreadable: the OS's message already names the file
        raise ValueError(f"{path}: cannot be read ({_one_line_cause(e)}); {remedy}") from e
    except Exception as e:  # torch reports damage as RuntimeError, EOFError, KeyError, UnpicklingError...
        cause = _one_line_cause(e)
        if "Unsupported global" in cause:
            problem = f"it holds Python objects other than tensors, which gptkit never unpickles ({cause})"
        else:
            problem = f"cannot be read ({cause}): the file is truncated or was not written by torch.save"
        raise ValueError(f"{path}: {problem}; {remedy}") from e


def _one_line_cause(error: Exception) -> str:
    """The gist of torch.load's error, whose message can run over many lines of advice."""
    text = str(error).strip()
    # The weights-only unpickler wraps the actual problem in a page about PyTorch 2.6's defaults.
    if "WeightsUnpickler error:" in text:
        text = text.split("WeightsUnpickler error:", 1)[1].strip()
    first_sentence = text.splitlines()[0].split(". ", 1)[0][:200] if text else ""
    return f"{type(error).__name__}: {first_sentence}" if first_sentence else type(error).__name__


def read_pytorch_weights(path: str | Path) -> dict[str, torch.Tensor]:
    """The tensors of a ``pytorch_model.bin``; a damaged file is a ValueError that names it."""
    path = Path(path)
    state = _torch_load(path, RESAVE_ADVICE)
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise ValueError(f"{path}: expected a dictionary of named tensors, found {type(state).__name__}")
    return state


# What Trainer.resume reads from train_state.pt.
TRAIN_STATE_FIELDS = ("step", "optimizer", "data", "rng")


def read_train_state(path: str | Path) -> dict[str, Any]:
    """A training checkpoint's ``train_state.pt`` (step, optimizer moments, data position, RNG).

    Any damage (truncated, garbage, missing fields) is a ValueError naming the file.
    """
    path = Path(path)
    remedy = (
        f"the checkpoint {path.parent.name} is damaged: point latest.json at an earlier step-* "
        "directory, or start the run again without --resume"
    )
    state = _torch_load(path, remedy)
    if not isinstance(state, dict):
        raise ValueError(f"{path}: expected a dictionary, found {type(state).__name__}; {remedy}")
    missing = [name for name in TRAIN_STATE_FIELDS if name not in state]
    if missing:
        raise ValueError(f"{path}: missing field(s) {', '.join(missing)}; {remedy}")
    expected = {"step": int, "optimizer": (dict, list), "data": dict, "rng": list, "plan": str}
    for name, kind in expected.items():
        if name in state and (not isinstance(state[name], kind) or isinstance(state[name], bool)):
            raise ValueError(f"{path}: field {name!r} is {type(state[name]).__name__}; {remedy}")
    if state["step"] < 0:
        raise ValueError(f"{path}: field 'step' is {state['step']}, not a count of updates; {remedy}")
    if "plan" in state:
        try:
            json_loads(state["plan"])
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}: field 'plan' is not JSON ({e}); {remedy}") from e
    return state


def file_sha256(path: str | Path) -> str:
    """The sha256 of a file's bytes, read a megabyte at a time."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


class DirectoryBusy(OSError):
    """Another process is writing this directory."""


@contextlib.contextmanager
def writer_lock(lock_file: Path, directory: Path, command: str) -> Iterator[None]:
    """Hold ``directory`` for one writer while the block runs; a second writer stops at once with
    :class:`DirectoryBusy` naming the holder.

    An OS lock (``flock``) on ``lock_file``: the system releases it when the holder ends, however it
    ends, so a lock left by a killed process is taken over (with a message naming it). The file
    records the holder's pid, host, command and start time, and is emptied on a clean exit. Where
    there is no ``fcntl`` (Windows) nothing is locked.
    """
    if fcntl is None:
        yield
        return
    fd = os.open(lock_file, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise DirectoryBusy(
                f"{directory} is being written by {_describe(_read_holder(fd))}: wait for it to "
                "finish, or write somewhere else"
            ) from None
        previous = _read_holder(fd)
        if previous:
            print(
                f"{directory}: taking over the lock left by {_describe(previous)}, which ended "
                "without releasing it",
                file=sys.stderr,
            )
        holder = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "command": command,
            "since": time.strftime("%Y-%m-%d %H:%M:%S"),
        }
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(holder).encode(), 0)
        try:
            yield
        finally:
            os.ftruncate(fd, 0)  # released by a live process (an error too): nobody to take over from
    finally:
        os.close(fd)  # releases the lock


def _read_holder(fd: int) -> dict:
    try:
        text = os.pread(fd, 4096, 0).decode("utf-8", "replace")
        return json.loads(text) if text.strip() else {}
    except (OSError, ValueError):
        return {"pid": "?", "host": "?", "command": "an unknown process"}


def _describe(holder: dict) -> str:
    return (
        f"`gptkit {holder.get('command', '?')}` (pid {holder.get('pid', '?')} on {holder.get('host', '?')}, "
        f"since {holder.get('since', '?')})"
    )
