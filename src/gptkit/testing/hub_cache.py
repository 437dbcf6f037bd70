"""A Hugging Face Hub cache built by hand, in the Hub's exact layout, for tests that run offline.

huggingface_hub keeps a repository's files as content-addressed blobs, with one folder of symbolic
links per commit and a file per branch naming its commit:

    $HF_HOME/hub/models--ORG--NAME/blobs/<sha256 (large files) or git blob sha1>
    $HF_HOME/hub/models--ORG--NAME/snapshots/<commit>/<file> -> ../../blobs/<hash>
    $HF_HOME/hub/models--ORG--NAME/refs/main                   (the commit, no newline)

:func:`publish` writes one commit of a repository so; with ``HF_HUB_OFFLINE=1`` (or
``huggingface_hub.constants.HF_HUB_OFFLINE`` set in-process) every loader finds it there as it would
find a real download. tests/conftest.py's ``offline_hub`` fixture gives a test an empty one.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

# Files the Hub stores through LFS (their blob is named by the content's sha256); others by git's sha1.
_LFS_SUFFIXES = (".safetensors", ".bin", ".h5", ".msgpack")


def _blob_name(name: str, content: bytes) -> str:
    if name.endswith(_LFS_SUFFIXES):
        return hashlib.sha256(content).hexdigest()
    return hashlib.sha1(b"blob %d\0" % len(content) + content).hexdigest()


def publish(hf_home: Path, repo_id: str, folder: Path, revision: str = "main") -> str:
    """Put ``folder``'s files into the cache under ``HF_HOME`` as commit ``revision`` of ``repo_id``;
    returns the commit hash (made from the files' contents, 40 hex digits as the Hub's are)."""
    repo = Path(hf_home) / "hub" / ("models--" + repo_id.replace("/", "--"))
    files = {p.name: p.read_bytes() for p in sorted(Path(folder).iterdir()) if p.is_file()}
    commit = hashlib.sha1(json.dumps({n: _blob_name(n, c) for n, c in files.items()}).encode()).hexdigest()
    (repo / "blobs").mkdir(parents=True, exist_ok=True)
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True, exist_ok=True)
    for name, content in files.items():
        blob = repo / "blobs" / _blob_name(name, content)
        blob.write_bytes(content)
        link = snapshot / name
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(os.path.relpath(blob, snapshot))
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / revision).write_text(commit)
    return commit
