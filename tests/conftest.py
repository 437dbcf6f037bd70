"""Shared fixtures: the public data beside the project, and tiny reference models."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

# The project's data lives in ../shared/data beside the checkout; GPTKIT_DATA overrides it.
DATA_DIR = Path(os.environ.get("GPTKIT_DATA", Path(__file__).resolve().parents[2] / "shared" / "data"))
# Throwaway runs need no fsync (about 10 ms a file); tests/test_io.py checks the durable path.
os.environ.setdefault("GPTKIT_FSYNC", "0")
# One intra-op thread in this process: the tests' models are tiny, where a second thread gains
# nothing, and where another process holds the cores two threads wait on each other (a budget
# test's 59 tiny updates: 0.9 s with one thread, 54 s with two on a busy 2-core machine).
torch.set_num_threads(1)

# A module whose every test is slow marks them all in this one line.
ALL_SLOW = "\npytestmark = pytest.mark.slow"


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """With -m "not slow" (`make test-fast`), a module whose every test is slow is not imported
    only to have each test deselected: those modules' client libraries (openai, schemathesis, onnx,
    playwright) took about a second of the fast suite's collection."""
    if collection_path.suffix != ".py" or config.getoption("markexpr").strip() != "not slow":
        return None
    return ALL_SLOW in collection_path.read_text(encoding="utf-8") or None


@pytest.fixture(scope="session")
def data_dir() -> Path:
    if not DATA_DIR.is_dir():
        if os.environ.get("CI"):
            pytest.fail(
                f"shared data not found at {DATA_DIR}: CI must run with ../shared beside the checkout"
            )
        pytest.skip(
            f"the public data is not at {DATA_DIR}: `gptkit data fetch --all --out {DATA_DIR}` "
            "fetches it (`make test` does, where the network allows), or set GPTKIT_DATA"
        )
    return DATA_DIR


# The small tokenizer's vocabulary: 256 bytes, <|endoftext|> and 255 merges.
SMALL_VOCAB = 512


@pytest.fixture(scope="session")
def small_tokenizer(data_dir, tmp_path_factory) -> Path:
    """A byte-level BPE of SMALL_VOCAB tokens learned from Alice in Wonderland, for tests where any
    byte-level tokenizer will do: it loads and saves in milliseconds (GPT-2's takes a third of a
    second each way, and every prepare does both), and a model over it has a small output layer."""
    from gptkit.tokenizer.train import train_bpe

    directory = tmp_path_factory.mktemp("small_tokenizer")
    tokenizer = train_bpe(
        [data_dir / "gutenberg" / "pg11.txt"], vocab_size=SMALL_VOCAB, out_dir=directory, show_progress=False
    )
    assert len(tokenizer) == SMALL_VOCAB
    return directory


@pytest.fixture(autouse=True)
def _seed_and_threads():
    torch.manual_seed(0)


@pytest.fixture
def offline_hub(tmp_path, monkeypatch) -> Path:
    """An empty ``HF_HOME`` with the Hub switched off, for this process (huggingface_hub's constants,
    read at import) and for the commands it starts (the environment)."""
    from huggingface_hub import constants

    hf_home = tmp_path / "hf_home"
    (hf_home / "hub").mkdir(parents=True)
    monkeypatch.setenv("HF_HOME", str(hf_home))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(hf_home / "hub"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    return hf_home
