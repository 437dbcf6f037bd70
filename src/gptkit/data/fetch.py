"""`gptkit data fetch`: the datasets from their canonical public sources, or a local mirror.

Which files and where from is :data:`gptkit.data.registry.REGISTRY`, the one list of datasets. Two
kinds of source. A ``Source`` is files in a public repository at a pinned commit (the same files
the tests and the demo read). An ``Archive`` is a zip or tar.gz at its publisher's URL (SNLI,
MultiNLI, GLUE's QNLI and QQP, SciTail, RACE): it is downloaded into ``OUT/.downloads``, checked,
and the folders the readers need are extracted into the local layout (``QNLI/dev.tsv`` →
``qnli/dev.tsv``); members with an absolute path or ``..`` are refused before anything is written.
The archive is deleted once extracted, and not fetched again while the files it gave are there.

Files and archives with a known sha256 are verified; a mismatch removes the file. ``--mirror DIR``
copies from a local copy laid out as the readers expect (the extracted layout, for archives)
instead of downloading. Files are written atomically and existing ones are kept.
"""

from __future__ import annotations

import shutil
import tarfile
import urllib.parse
import urllib.request
import zipfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import IO

from tqdm import tqdm

from gptkit.data.registry import REGISTRY, Archive, Dataset, Source
from gptkit.io import atomic_write, file_sha256
from gptkit.progress import hidden_unless_terminal

RAW = "https://raw.githubusercontent.com/{repo}/{commit}/{path}"

# What `make demo` needs.
DEMO = ("gutenberg", "tinyshakespeare", "sst2", "story_cloze")


def _download(url: str, destination: Path, progress: bool = False) -> None:
    def write(tmp: str) -> None:
        request = urllib.request.Request(url, headers={"User-Agent": "gptkit"})
        with urllib.request.urlopen(request, timeout=60) as response, open(tmp, "wb") as f:
            if not progress:
                shutil.copyfileobj(response, f)
                return
            total = int(response.headers.get("Content-Length") or 0) or None
            with tqdm(
                total=total,
                unit="B",
                unit_scale=True,
                desc=destination.name,
                disable=hidden_unless_terminal(),
            ) as bar:
                for block in iter(lambda: response.read(1 << 20), b""):
                    f.write(block)
                    bar.update(len(block))

    try:
        atomic_write(destination, write)
    except OSError as e:
        raise OSError(f"could not download {url}: {e} (offline? use --mirror DIR)") from e


def _verify(path: Path, expected: str | None) -> None:
    """A file whose sha256 is not the published one is removed: it is never read."""
    if expected and file_sha256(path) != expected:
        path.unlink()
        raise ValueError(f"{path}: checksum mismatch (expected sha256 {expected}); file removed")


def _member_path(name: str, archive: Path) -> PurePosixPath:
    """A member's path inside the archive; one that could land outside the output folder is refused."""
    path = PurePosixPath(name.replace("\\", "/"))
    if path.is_absolute() or ".." in path.parts or (path.parts and ":" in path.parts[0]):
        raise ValueError(f"{archive}: refusing member {name!r}: an absolute path or '..' could write outside")
    return path


@contextmanager
def _open_archive(path: Path) -> Iterator[list[tuple[str, bool, Callable[[], IO[bytes]]]]]:
    """(name, is a regular file, opener) of every member of a zip or tar(.gz) archive."""
    if zipfile.is_zipfile(path):
        with zipfile.ZipFile(path) as z:
            yield [(i.filename, not i.is_dir(), lambda i=i: z.open(i)) for i in z.infolist()]
    elif tarfile.is_tarfile(path):
        with tarfile.open(path, "r:*") as t:
            # Links, devices and folders are not regular files: nothing is made for them.
            yield [(m.name, m.isfile(), lambda m=m: t.extractfile(m)) for m in t.getmembers()]
    else:
        raise ValueError(f"{path}: neither a zip nor a tar archive")


def _is_mac_metadata(path: PurePosixPath) -> bool:
    # Zips made on a Mac carry __MACOSX/ resource forks, ._ files and .DS_Store: no data.
    return "__MACOSX" in path.parts or path.name.startswith("._") or path.name == ".DS_Store"


def _extract(name: str, archive: Archive, path: Path, out_dir: Path) -> list[Path]:
    """Extract the members under the archive's folders into their local folders; existing files kept."""
    written = []
    with _open_archive(path) as members:
        # Every name is checked before the first file is written, so a bad archive leaves nothing.
        checked = [(_member_path(member, path), regular, opener) for member, regular, opener in members]
        root = out_dir.resolve()
        for member, regular, opener in tqdm(
            checked, desc=f"extracting {name}", unit="member", disable=hidden_unless_terminal()
        ):
            if not regular or _is_mac_metadata(member):
                continue
            text = member.as_posix()
            prefix = next((p for p in archive.folders if text.startswith(p)), None)
            if prefix is None:
                continue  # outside the folders the readers use
            destination = out_dir / archive.folders[prefix] / text[len(prefix) :]
            if not destination.resolve().is_relative_to(root):
                raise ValueError(f"{path}: refusing member {text!r}: it would be written outside {out_dir}")
            if destination.exists():
                continue

            def write(tmp: str, opener: Callable[[], IO[bytes]] = opener) -> None:
                with opener() as source, open(tmp, "wb") as f:
                    shutil.copyfileobj(source, f)

            atomic_write(destination, write)
            written.append(destination)
    return written


def _copy_mirror(archive: Archive, mirror: Path, out_dir: Path) -> list[Path]:
    """An archive's dataset from a mirror holding its extracted layout: every file under its folders."""
    written = []
    for local in archive.folders.values():
        origin = mirror / local
        if not origin.is_dir():
            raise FileNotFoundError(f"{origin}: not in the mirror")
        for file in sorted(p for p in origin.rglob("*") if p.is_file()):
            destination = out_dir / local / file.relative_to(origin)
            if not destination.exists():
                atomic_write(destination, lambda tmp, file=file: shutil.copyfile(file, tmp))
                written.append(destination)
    return written


def _fetch_archive(name: str, dataset: Dataset, out_dir: Path, mirror: str | Path | None) -> list[Path]:
    archive = dataset.source
    assert isinstance(archive, Archive)
    expected = dataset.local_files  # while all exist, nothing is fetched
    if all((out_dir / local).exists() for local in expected):
        return []
    if mirror is not None:
        return _copy_mirror(archive, Path(mirror), out_dir)
    download = out_dir / ".downloads" / PurePosixPath(urllib.parse.urlparse(archive.url).path).name
    if not download.is_file():  # an archive left by an interrupted extraction is used again
        _download(archive.url, download, progress=True)
    _verify(download, archive.sha256)
    written = _extract(name, archive, download, out_dir)
    missing = [local for local in expected if not (out_dir / local).exists()]
    if missing:
        raise ValueError(
            f"{download}: the archive gave no {out_dir / missing[0]}; is its layout the expected one?"
        )
    download.unlink()  # the extracted files are what the readers use
    return written


def remote_path(source: Source, local: str) -> str:
    """Where a local file of a repository source is in its repository."""
    for local_folder, remote_folder in source.folders.items():
        if local.startswith(local_folder):
            return remote_folder + local[len(local_folder) :]
    raise ValueError(f"{local}: under none of the source's folders ({', '.join(source.folders)})")


def fetch(names: list[str], out_dir: str | Path, mirror: str | Path | None = None) -> list[Path]:
    """Fetch the named datasets into ``out_dir``; returns the files written (existing ones are kept)."""
    unknown = [n for n in names if n not in REGISTRY]
    if unknown:
        raise ValueError(f"unknown dataset(s) {', '.join(unknown)}; known: {', '.join(REGISTRY)}")
    out_dir = Path(out_dir)
    jobs = [
        (source, local)
        for name in names
        if isinstance(source := REGISTRY[name].source, Source)
        for local in REGISTRY[name].local_files
    ]
    written = []
    for source, local in tqdm(jobs, desc="fetching", unit="file", disable=hidden_unless_terminal(bool(jobs))):
        destination = out_dir / local
        if destination.exists():
            continue
        if mirror is not None:
            origin = Path(mirror) / local
            if not origin.is_file():
                raise FileNotFoundError(f"{origin}: not in the mirror")
            atomic_write(destination, lambda tmp, origin=origin: shutil.copyfile(origin, tmp))
        else:
            remote = urllib.request.quote(remote_path(source, local))
            _download(RAW.format(repo=source.repo, commit=source.commit, path=remote), destination)
        _verify(destination, (source.sha256 or {}).get(local))
        written.append(destination)
    for name in names:
        if isinstance(REGISTRY[name].source, Archive):
            written += _fetch_archive(name, REGISTRY[name], out_dir, mirror)
    return written


@dataclass
class FetchConfig:
    """Fetch sample datasets from their public sources (or copy them from a local mirror)."""

    names: list[str] | None = field(
        default=None,
        metadata={"help": "Datasets: gpt1_bpe, gpt2_bpe, gutenberg, sst2, rte, ...", "positional": True},
    )
    demo: bool = field(default=False, metadata={"help": "What `make demo` needs."})
    all: bool = field(
        default=False,
        metadata={"help": "Every dataset (with the six archives of the paper's tasks, about 400 MB)."},
    )
    out: str = field(default="data", metadata={"help": "Where to write them."})
    mirror: str | None = field(
        default=None, metadata={"help": "Copy from this local directory instead of downloading."}
    )

    def chosen(self) -> list[str]:
        """The datasets named, or those of --demo or --all."""
        names = list(REGISTRY) if self.all else list(DEMO) if self.demo else list(self.names or [])
        if not names:
            raise ValueError(f"name datasets to fetch ({', '.join(REGISTRY)}), or --demo, or --all")
        return names


def fetch_datasets(config: FetchConfig) -> list[Path]:
    """:func:`fetch` of the config's datasets."""
    return fetch(config.chosen(), config.out, mirror=config.mirror)
