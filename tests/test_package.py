"""gptkit installs as a package: `python -m build` makes a wheel and an sdist, and the wheel, installed
into a fresh virtual environment, runs `gptkit --help` and a tiny generation offline.

The fresh environment sees only what the wheel declares: its core dependencies and theirs, linked
from this environment (no download, no copy of torch). So a module that imports an undeclared
package, or a file the wheel forgot (package data), fails here, as it would for a user.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tarfile
import venv
import zipfile
from importlib import metadata
from pathlib import Path

import pytest
import torch
from packaging.markers import Marker
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from gptkit import GPT, GPTConfig, SamplingParams, generate_text, load_for_generation
from gptkit.tokenizer.train import train_bpe

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("dist")
    # --no-isolation: build with this environment's setuptools (pinned in constraints.txt), offline.
    subprocess.run(
        [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(REPO)],
        check=True,
        capture_output=True,
        text=True,
    )
    (wheel,) = out.glob("gptkit-*.whl")
    (sdist,) = out.glob("gptkit-*.tar.gz")
    return {"wheel": wheel, "sdist": sdist}


def core_requirements(wheel: Path) -> list[Requirement]:
    with zipfile.ZipFile(wheel) as archive:
        (name,) = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        lines = archive.read(name).decode().splitlines()
    requirements = [
        Requirement(line.split(":", 1)[1].strip()) for line in lines if line.startswith("Requires-Dist:")
    ]
    return [r for r in requirements if r.marker is None or r.marker.evaluate({"extra": ""})]


def closure(requirements: list[Requirement]) -> set[str]:
    """The installed distributions these requirements need, transitively (extras left out)."""
    seen: set[str] = set()
    todo = list(requirements)
    while todo:
        requirement = todo.pop()
        name = canonicalize_name(requirement.name)
        if name in seen:
            continue
        seen.add(name)
        for line in metadata.distribution(name).requires or []:
            nested = Requirement(line)
            if nested.marker is None or Marker(str(nested.marker)).evaluate({"extra": ""}):
                todo.append(nested)
    return seen


def link_distributions(names: set[str], into: Path) -> None:
    """Symlink each distribution's top-level files and folders (and its .dist-info) into ``into``."""
    into.mkdir()
    for name in names:
        distribution = metadata.distribution(name)
        site = Path(distribution.locate_file(""))
        for path in distribution.files or []:
            top = path.parts[0]
            if top in ("..", "__pycache__") or (into / top).exists() or not (site / top).exists():
                continue
            (into / top).symlink_to(site / top)


@pytest.fixture(scope="module")
def installed(built, tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("fresh")
    # No pip of its own (ensurepip takes seconds): this environment's pip installs into it.
    venv.EnvBuilder(with_pip=False).create(root / "venv")
    python = root / "venv" / "bin" / "python"
    install = ["install", "-q", "--no-deps", "--no-index", str(built["wheel"])]
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), *install],
        check=True,
        capture_output=True,
        text=True,
        env=fresh_env(),  # a PYTHONPATH holding the checkout would make pip think gptkit is installed
    )
    link_distributions(closure(core_requirements(built["wheel"])), root / "dependencies")
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    (Path(site) / "dependencies.pth").write_text(str(root / "dependencies") + "\n")
    return root / "venv" / "bin"


def fresh_env() -> dict[str, str]:
    """This process's environment less what points at this checkout or its virtual environment."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["HF_HUB_OFFLINE"] = "1"
    return env


def run(command: list[str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(command, cwd=cwd, env=fresh_env(), capture_output=True, text=True, timeout=300)


def test_the_sdist_holds_the_sources_and_the_playground(built):
    with tarfile.open(built["sdist"]) as archive:
        names = {re.sub(r"^gptkit-[^/]+/", "", n) for n in archive.getnames()}
    assert {"pyproject.toml", "README.md", "src/gptkit/model/network.py", "src/gptkit/cli.py"} <= names
    assert any(n.startswith("src/gptkit/serve/static/") for n in names)


def test_the_wheel_holds_every_module_and_the_playground(built):
    with zipfile.ZipFile(built["wheel"]) as archive:
        names = set(archive.namelist())
    sources = {str(p.relative_to(REPO / "src")) for p in (REPO / "src" / "gptkit").rglob("*.py")}
    assert sources <= names, sorted(sources - names)
    static = {
        str(p.relative_to(REPO / "src")) for p in (REPO / "src" / "gptkit" / "serve" / "static").iterdir()
    }
    assert static and static <= names, sorted(static - names)


def test_the_installed_wheel_runs_offline_with_its_declared_dependencies_only(installed, data_dir, tmp_path):
    """`gptkit --help` and a greedy generation from a fresh environment, outside the checkout, give the
    continuation this checkout's library gives for the same model."""
    corpus = tmp_path / "alice.txt"
    corpus.write_text((data_dir / "gutenberg" / "pg11.txt").read_text(encoding="utf-8")[:20_000])
    model_dir = tmp_path / "model"
    tokenizer = train_bpe([corpus], vocab_size=300, out_dir=model_dir, show_progress=False)
    torch.manual_seed(0)
    GPT(GPTConfig.from_preset("tiny", vocab_size=tokenizer.vocab_size)).save_pretrained(model_dir)
    model, tokenizer = load_for_generation(model_dir, dtype="float32", device="cpu")  # what the command runs
    expected = generate_text(
        model, tokenizer, "Alice was", params=SamplingParams(max_tokens=8, temperature=0)
    )

    help_run = run([str(installed / "gptkit"), "--help"], cwd=tmp_path)
    assert help_run.returncode == 0, help_run.stderr
    for command in ("pretrain", "finetune", "generate", "serve", "download"):
        assert command in help_run.stdout

    generated = run(
        [str(installed / "gptkit"), "generate", "--model", str(model_dir), "--prompt", "Alice was"]
        + ["--max-tokens", "8", "--temperature", "0", "--device", "cpu", "--dtype", "float32"],
        cwd=tmp_path,
    )
    assert generated.returncode == 0, generated.stderr
    assert expected.strip() and expected.strip() in generated.stdout


def test_the_fresh_environment_cannot_see_an_undeclared_package(installed, tmp_path):
    """The check above means something: transformers (an extra, not a core dependency) is absent there."""
    probe = run([str(installed / "python"), "-c", "import transformers"], cwd=tmp_path)
    assert probe.returncode != 0 and "No module named 'transformers'" in probe.stderr
