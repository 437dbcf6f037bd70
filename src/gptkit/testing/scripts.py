"""The project's scripts (``scripts/*.py``) imported as modules, for tests that call their functions:
scripts are run as files, not installed, so they are loaded from their path."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

SCRIPTS = Path(__file__).resolve().parents[3] / "scripts"


def load_script(name: str) -> ModuleType:
    """``scripts/NAME.py``, executed as a module of that name."""
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    if spec is None or spec.loader is None:
        raise FileNotFoundError(f"no script {SCRIPTS / f'{name}.py'}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
