"""What the GPU checks share: where they run, a corpus they make themselves, and result rows.

Nothing is read from outside the repository: the text is generated here (sentences from a small
seeded grammar, which a model learns quickly), its bytes are the token ids of the checks that need
no tokenizer, and the checks that do need one train gptkit's own BPE on it.
"""

from __future__ import annotations

import math
import os
import random
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch


@dataclass(frozen=True)
class Settings:
    """Where and how large the checks run: ``device`` cuda or cpu (the stand-in: small shapes,
    gloo), ``nproc`` processes for the multi-process checks, ``batch_size`` their global batch,
    ``work`` a scratch folder of this run, ``missing`` the optional packages that do not import
    here (each with its error)."""

    device: str = "cuda"
    nproc: int = 1
    batch_size: int = 8
    work: Path = field(default_factory=lambda: Path(tempfile.gettempdir()))
    missing: dict[str, str] = field(default_factory=dict)

    @property
    def stand_in(self) -> bool:
        return self.device == "cpu"

    @property
    def torch_device(self) -> torch.device:
        return torch.device("cuda", 0) if self.device == "cuda" else torch.device("cpu")

    def global_batch(self, *world_sizes: int) -> int:
        """``batch_size`` rounded up to split evenly over each of ``world_sizes`` processes (a run
        saved on N and resumed on 2 needs a batch both divide)."""
        step = math.lcm(*world_sizes)
        return max(step, -(-self.batch_size // step) * step)


def skipped(reason: str, **measured: Any) -> dict[str, Any]:
    """A check that did not run (or not in full): passed is null, and ``reason`` says why."""
    return {"passed": None, "skipped": reason, **measured}


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


_SUBJECTS = ("the cat", "a dog", "the old king", "my sister", "the small bird", "a farmer", "the queen")
_VERBS = ("sees", "follows", "likes", "finds", "helps", "calls", "watches")
_PLACES = ("in the garden", "by the river", "at the market", "under the tree", "near the castle")
_ENDINGS = (".", "!", ", and then it rains.", ", because it is late.")


def synthetic_text(sentences: int, seed: int = 0) -> str:
    """``sentences`` sentences of a small grammar, the same for a seed: words, spaces, punctuation
    and line breaks, so that a byte-level BPE finds merges and a model has something to learn."""
    rng = random.Random(seed)
    lines = []
    for i in range(sentences):
        sentence = (
            f"{rng.choice(_SUBJECTS)} {rng.choice(_VERBS)} {rng.choice(_SUBJECTS)} {rng.choice(_PLACES)}"
        )
        lines.append(sentence[0].upper() + sentence[1:] + rng.choice(_ENDINGS))
        if i % 5 == 4:
            lines.append("")  # paragraphs
    return "\n".join(lines) + "\n"


def corpus_file(work: Path, sentences: int = 6000) -> Path:
    """The synthetic corpus as a text file in ``work`` (about 50 bytes a sentence)."""
    path = work / "corpus.txt"
    if not path.exists():
        path.write_text(synthetic_text(sentences), encoding="utf-8")
    return path


def byte_ids(sentences: int = 6000) -> torch.Tensor:
    """The synthetic corpus's UTF-8 bytes as token ids (a vocabulary of 256): no tokenizer needed."""
    data = synthetic_text(sentences).encode("utf-8")
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).long()


class ByteWindows:
    """A training loop's batch source over :func:`byte_ids`: ``batch_size`` random windows of
    ``length`` tokens a step, drawn from a generator of its own (the same batches for a seed).
    ``before_batch(step)`` runs as each batch is drawn, before that update: the checks use it to
    act between updates, or to count what happened during the last one."""

    def __init__(self, ids: torch.Tensor, length: int, batch_size: int, seed: int = 0, before_batch=None):
        self.ids, self.length, self.batch_size = ids, length, batch_size
        self.seed, self.step, self.before_batch = seed, 0, before_batch

    def next_batch(self) -> dict[str, Any]:
        if self.before_batch is not None:
            self.before_batch(self.step)
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + self.step)
        starts = torch.randint(0, len(self.ids) - self.length, (self.batch_size,), generator=generator)
        windows = torch.stack([self.ids[s : s + self.length] for s in starts.tolist()])
        self.step += 1
        return {"input_ids": windows, "labels": windows, "compute_logits": False}

    def state_dict(self) -> dict[str, int]:
        return {"step": self.step}

    def load_state_dict(self, state: dict) -> None:
        self.step = int(state["step"])


VOCAB = 512  # at most: 256 bytes, <|endoftext|> and the merges the small grammar has (about 370 tokens)


def trained_tokenizer(work: Path) -> Path:
    """gptkit's byte-level BPE of :data:`VOCAB` tokens trained on the synthetic corpus, in
    ``work/tokenizer`` (trained once per run of the script: the checks' processes share it)."""
    from gptkit.tokenizer.train import train_bpe

    out = work / "tokenizer"
    if not (out / "tokenizer_config.json").exists():
        train_bpe([corpus_file(work)], vocab_size=VOCAB, out_dir=out, show_progress=False)
    return out


def prepared_shards(work: Path) -> Path:
    """The corpus as `gptkit prepare` writes it (train.bin, val.bin, meta.json), a tenth held out."""
    from gptkit.data.prepare import prepare

    out = work / "shards"
    if not (out / "meta.json").exists():
        prepare(trained_tokenizer(work), [corpus_file(work)], out, val_fraction=0.1, show_progress=False)
    return out


def stop(process: subprocess.Popen, group: bool = False) -> None:
    """Stop ``process`` (its whole process group with ``group``): SIGTERM first, which torchrun
    passes on to its workers (they run in sessions of their own), then SIGKILL after 10 s."""
    for signum, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, None)):
        try:
            if group:
                os.killpg(process.pid, signum)
            else:
                process.send_signal(signum)
            process.wait(wait)
            return
        except subprocess.TimeoutExpired:
            continue
        except ProcessLookupError:  # gone already
            return


def torchrun(nproc: int, args: list[str], timeout: float, threads: int = 1) -> None:
    """``torchrun --standalone --nproc_per_node=nproc -m gptkit.testing.gpu_checks.workers ARGS``,
    stopped after ``timeout`` seconds; a RuntimeError with the end of its output when it fails."""
    launch = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    with tempfile.TemporaryFile("w+") as log:
        process = subprocess.Popen(
            [*launch, "-m", "gptkit.testing.gpu_checks.workers", *args],
            stdout=log,
            stderr=log,
            text=True,
            env=env,
        )
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            stop(process)
            raise RuntimeError(f"torchrun {' '.join(args[:1])} took more than {timeout:.0f} s") from None
        if process.returncode != 0:
            log.seek(0)
            raise RuntimeError(f"torchrun exited {process.returncode}: {log.read()[-1500:]}")
