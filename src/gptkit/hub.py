"""Where a model comes from: a local folder, or a published model by its Hugging Face Hub name.

Every loader (``GPT.from_pretrained``, ``Tokenizer.from_pretrained``, ``TaskModel.from_pretrained``,
a LoRA adapter's base, every command's ``--model``, ``--init`` and ``--tokenizer``) hands its value
to :func:`resolve`, the one place that tells a folder from a name:

- a folder that exists is used as it is, always, even where a name is spelled the same;
- ``org/name`` and ``org/name@revision`` (a branch, a tag or a commit) are Hub repositories;
- the short names people type (``gpt2``, ``gpt2-medium``, ``gpt2-large``, ``gpt2-xl``, ``openai-gpt``)
  stand for their ``openai-community/`` repositories.

A name is fetched through huggingface_hub's own cache (``snapshot_download``, with its progress bar),
so ``HF_HOME``, ``HF_HUB_CACHE``, ``HF_HUB_OFFLINE`` and ``HF_TOKEN`` mean what they mean everywhere
else; only the files gptkit reads are fetched (weights as safetensors, configs, vocabularies), never
a repository's other formats. A name that cannot be had is a :class:`HubError`: one line with the
name, whether the Hub was reached, and what to do.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

# What people type for OpenAI's published models, against the repositories that hold them now.
SHORT_NAMES = {
    "openai-gpt": "openai-community/openai-gpt",
    "gpt2": "openai-community/gpt2",
    "gpt2-medium": "openai-community/gpt2-medium",
    "gpt2-large": "openai-community/gpt2-large",
    "gpt2-xl": "openai-community/gpt2-xl",
}

# The files gptkit reads from a repository's top level: configs and task files (*.json), weights
# (*.safetensors), vocabularies (merges.txt, vocab.bpe). A repository's other formats (TensorFlow,
# Flax, ONNX, pickled PyTorch) are never fetched, nor anything in its sub-folders.
ALLOW_PATTERNS = ["*.json", "*.safetensors", "*.txt", "*.bpe"]
IGNORE_PATTERNS = ["*/*"]
# Only for a repository that publishes no safetensors: torch's zip format, read with weights_only.
PYTORCH_WEIGHTS = "pytorch_model.bin"

# A Hub repository id: an optional owner, a name, each of letters, digits, '-', '_' and '.'; then an
# optional @revision.
_NAME = re.compile(r"(?P<repo>(?:[A-Za-z0-9][\w.-]*/)?[A-Za-z0-9][\w.-]*)(?:@(?P<revision>[\w./-]+))?")


class HubError(OSError):
    """A published model that cannot be had: the message is the one line a user needs."""


@dataclass(frozen=True)
class HubName:
    """A repository on the Hub, at a revision (None: its main branch)."""

    repo_id: str
    revision: str | None = None

    def __str__(self) -> str:
        return self.repo_id + (f"@{self.revision}" if self.revision else "")


def parse_name(value: str | os.PathLike) -> HubName | None:
    """``value`` as a Hub name, or None when it can only be a path (absolute, ``./``, ``~``, or
    more than one ``/``). Short names become their repositories."""
    text = os.fspath(value)
    match = _NAME.fullmatch(text)
    if match is None or text.startswith(".") or text.endswith(("..", ".")):
        return None
    repo_id = SHORT_NAMES.get(match["repo"], match["repo"])
    return HubName(repo_id, match["revision"])


def resolve(source: str | os.PathLike) -> Path:
    """The local folder behind ``source``: the folder itself, or the Hub repository it names,
    fetched into (or found in) huggingface_hub's cache.

    Raises FileNotFoundError for a path that is not a folder, :class:`HubError` for a name that
    cannot be had.
    """
    path = Path(source).expanduser()
    if path.is_dir():
        return path
    if path.exists():
        raise NotADirectoryError(f"{source}: expected a model or tokenizer folder, found a file")
    name = parse_name(source)
    if name is None:
        raise FileNotFoundError(f"{source}: no such folder")
    return fetch(name, source=str(source))


def fetch(
    name: HubName,
    *,
    source: str | None = None,
    local_dir: str | os.PathLike | None = None,
    force_download: bool = False,
) -> Path:
    """The files gptkit reads from repository ``name``: from the cache when it holds them (and,
    online, the revision still points where it did), else downloaded with huggingface_hub's progress
    bar. ``local_dir`` puts plain copies there instead of the cache (``gptkit download --local-dir``).
    ``source`` is what the user typed, for messages."""
    try:
        from huggingface_hub import snapshot_download
    except ImportError as e:  # a dependency of gptkit: missing only in a broken environment
        raise HubError(f"{source or name}: fetching a published model needs huggingface_hub") from e
    options = dict(
        repo_id=name.repo_id,
        revision=name.revision,
        local_dir=local_dir,
        force_download=force_download,
        library_name="gptkit",
    )
    try:
        folder = Path(
            snapshot_download(allow_patterns=ALLOW_PATTERNS, ignore_patterns=IGNORE_PATTERNS, **options)
        )
        if not _has_weights(folder) and not _is_tokenizer_only(folder) and not _offline():
            # A repository without safetensors: its PyTorch weights (read with weights_only=True).
            folder = Path(snapshot_download(allow_patterns=[PYTORCH_WEIGHTS], **options))
    except Exception as e:  # huggingface_hub raises many types; each becomes one line below
        raise HubError(_explain(source or str(name), name, e)) from e
    return folder


def _has_weights(folder: Path) -> bool:
    return any(folder.glob("*.safetensors")) or (folder / PYTORCH_WEIGHTS).exists()


def _is_tokenizer_only(folder: Path) -> bool:
    return not (folder / "config.json").exists()


def _offline() -> bool:
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE)


def _cache_dir() -> str:
    from huggingface_hub import constants

    return str(constants.HF_HUB_CACHE)


def _explain(source: str, name: HubName, error: Exception) -> str:
    """One line for a failed fetch: the name, whether the Hub answered, what to do."""
    from huggingface_hub import errors

    # "gpt2 (openai-community/gpt2)"; a value that could have been a mistyped folder says it is not one.
    shown = source if source == str(name) else f"{source} ({name})"
    if source not in SHORT_NAMES:
        shown += ": no such local folder, and"
    else:
        shown += ":"
    if isinstance(error, errors.GatedRepoError):
        return (
            f"{shown} the Hub answered that {name.repo_id} is gated: accept its terms on its page "
            "at huggingface.co, then set HF_TOKEN (or run `hf auth login`)"
        )
    if isinstance(error, errors.RepositoryNotFoundError):
        return (
            f"{shown} the Hub answered that no repository {name.repo_id} exists (or it is private: set "
            "HF_TOKEN); check the spelling, or give a local folder"
        )
    if isinstance(error, errors.RevisionNotFoundError):
        return (
            f"{shown} the Hub has {name.repo_id} but no revision {name.revision!r}: check the branch, "
            "tag or commit"
        )
    if isinstance(error, errors.LocalEntryNotFoundError):
        if _offline():
            return (
                f"{shown} not in the Hugging Face cache ({_cache_dir()}), and the Hub was not contacted "
                f"(HF_HUB_OFFLINE=1): run `gptkit download {source}` with a connection, or unset HF_HUB_OFFLINE"
            )
        return (
            f"{shown} not in the Hugging Face cache ({_cache_dir()}), and the Hub could not be reached "
            f"({_first_line(error)}): check the connection (or HF_ENDPOINT), then run `gptkit download {source}`"
        )
    return f"{shown} fetching {name} failed ({type(error).__name__}: {_first_line(error)})"


def _first_line(error: BaseException) -> str:
    """The root of ``error`` in one line: its cause's, where huggingface_hub wrapped one."""
    root = error.__cause__ if error.__cause__ is not None and str(error.__cause__).strip() else error
    lines = str(root).strip().splitlines()
    return f"{type(root).__name__}: {lines[0]}" if root is not error and lines else (lines or [""])[0]


def in_cache(directory: Path) -> HubName | None:
    """The repository whose cached snapshot ``directory`` is (``.../models--org--name/snapshots/REV``,
    as ``snapshot_download`` returns it), or None for any other folder."""
    parts = Path(directory).parts
    if len(parts) < 3 or parts[-2] != "snapshots" or not parts[-3].startswith("models--"):
        return None
    return HubName(parts[-3].removeprefix("models--").replace("--", "/"), parts[-1])


@contextlib.contextmanager
def reading(source: str | os.PathLike) -> Iterator[Path]:
    """Resolve ``source`` and read from its folder; a file that cannot be read there, when the folder
    is the Hub cache's copy, is reported as a damaged download with how to fetch it again (the cache
    is huggingface_hub's: gptkit never writes into it)."""
    directory = resolve(source)
    try:
        yield directory
    except (ValueError, OSError) as e:
        cached = in_cache(directory)
        # Only an error about a file of this folder (loaders name the file they could not read).
        if isinstance(e, HubError) or cached is None or str(directory) not in str(e):
            raise
        where = "read from the cache" + (", the Hub switched off (HF_HUB_OFFLINE=1)" if _offline() else "")
        raise ValueError(
            f"{source}: the cached copy of {cached.repo_id} is damaged ({_first_line(e)}; {where}): the cache "
            f"keeps a file once it holds it, so fetch it anew with `gptkit download {source} --force-download`"
        ) from e


def ensure_available(*sources: str | os.PathLike | None) -> None:
    """Find (or fetch) every model a run starts from before the run makes its folder: a name that
    cannot be had stops the run there, with nothing written. ``None`` entries are skipped."""
    for source in sources:
        if source is not None and str(source):
            resolve(source)


@dataclass
class DownloadConfig:
    """Fetch a published model ahead of time (into the Hugging Face cache) and print its folder."""

    name: str = field(
        metadata={
            "help": "Hub name: gpt2, gpt2-medium, gpt2-large, gpt2-xl, openai-gpt, org/name or org/name@rev.",
            "positional": True,
        }
    )
    revision: str | None = field(
        default=None, metadata={"help": "Branch, tag or commit (default: the name's @rev, else main)."}
    )
    local_dir: str | None = field(
        default=None, metadata={"help": "Put plain copies of the files here instead of the cache."}
    )
    force_download: bool = field(
        default=False, metadata={"help": "Fetch every file again, even those in the cache (a damaged copy)."}
    )


def download(config: DownloadConfig) -> Path:
    """:func:`fetch` the repository ``config.name`` names; returns the folder that holds its files."""
    name = parse_name(config.name)
    if name is None:
        raise ValueError(
            f"{config.name!r} is not a Hub name (expected gpt2, openai-gpt, org/name or org/name@revision)"
        )
    if config.revision is not None:
        name = HubName(name.repo_id, config.revision)
    return fetch(name, source=config.name, local_dir=config.local_dir, force_download=config.force_download)
