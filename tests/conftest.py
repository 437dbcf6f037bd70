"""Shared fixtures: the public data beside the project, and tiny reference models."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

# The project's data lives in ../shared/data beside the checkout; GPTKIT_DATA overrides it.
DATA_DIR = Path(os.environ.get("GPTKIT_DATA", Path(__file__).resolve().parents[2] / "shared" / "data"))


@pytest.fixture(scope="session")
def data_dir() -> Path:
    if not DATA_DIR.is_dir():
        if os.environ.get("CI"):
            pytest.fail(
                f"shared data not found at {DATA_DIR}: CI must run with ../shared beside the checkout"
            )
        pytest.skip(f"shared data not found at {DATA_DIR} (set GPTKIT_DATA)")
    return DATA_DIR


@pytest.fixture(autouse=True)
def _seed_and_threads():
    torch.manual_seed(0)
