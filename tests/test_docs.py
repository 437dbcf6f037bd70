"""The docs' commands and links, checked against the code: every `gptkit ...` line in a shell block of
README.md or docs/*.md parses with gptkit's own parser (nothing runs), and every relative link
points at a file that exists (and, with a #fragment, at one of its headings)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from gptkit.cli import build_parser

REPO = Path(__file__).resolve().parents[1]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
_FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.MULTILINE | re.DOTALL)
_LINK = re.compile(r"\]\(([^)\s]+)\)")


def _shell_commands(path: Path) -> list[tuple[int, str]]:
    """(line number, command) of each `gptkit` command in the file's bash/sh/shell blocks, with
    continuation lines joined and comments dropped."""
    text = path.read_text(encoding="utf-8")
    commands = []
    for block in _FENCE.finditer(text):
        if block.group(1) not in ("bash", "sh", "shell", "console"):
            continue
        first_line = text[: block.start(2)].count("\n") + 1
        joined, start = "", None
        for offset, line in enumerate(block.group(2).splitlines()):
            line = line.removeprefix("$ ")
            if start is None:
                start = first_line + offset
            joined += line.rstrip("\\").rstrip() + " " if line.rstrip().endswith("\\") else line
            if line.rstrip().endswith("\\"):
                continue
            command = joined.split(" #", 1)[0].strip()
            # The command itself, after any environment assignments (HF_HOME=... gptkit ...).
            words = shlex.split(command, comments=True) if command else []
            # What the shell does around the command (redirections, pipes) is not its arguments.
            cut = [i for i, word in enumerate(words) if word in ("<", ">", "|", "&&", ";", "2>&1")]
            words = words[: cut[0]] if cut else words
            while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", words[0]):
                words.pop(0)
            if words and words[0] in ("gptkit", "python -m gptkit"):
                commands.append((start, shlex.join(words[1:])))
            elif words[:3] == ["python", "-m", "gptkit"]:
                commands.append((start, shlex.join(words[3:])))
            joined, start = "", None
    return commands


COMMANDS = [(path, line, command) for path in DOCS for line, command in _shell_commands(path)]


def test_the_docs_hold_commands_to_check():
    assert len(COMMANDS) > 30  # the docs are full of them: an empty list means the reader broke


@pytest.mark.parametrize(
    "path, line, command", COMMANDS, ids=[f"{p.relative_to(REPO)}:{n}" for p, n, _ in COMMANDS]
)
def test_every_documented_command_parses(path, line, command, capsys):
    parser = build_parser()
    try:
        parser.parse_args(shlex.split(command))
    except SystemExit as e:
        if e.code != 0:  # --help exits 0
            pytest.fail(
                f"{path.relative_to(REPO)}:{line}: `gptkit {command}`: {capsys.readouterr().err.strip()}"
            )


def _anchors(path: Path) -> set[str]:
    """GitHub's anchors for a Markdown file's headings: lower case, punctuation dropped, spaces to '-'."""
    anchors = set()
    text = _FENCE.sub("", path.read_text(encoding="utf-8"))  # a code block's comments are not headings
    for heading in re.findall(r"^#+\s+(.*)$", text, re.MULTILINE):
        anchors.add(re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-"))
    return anchors


@pytest.mark.parametrize("path", DOCS, ids=[str(p.relative_to(REPO)) for p in DOCS])
def test_every_relative_link_resolves(path):
    text = _FENCE.sub("", path.read_text(encoding="utf-8"))
    broken = []
    for target in _LINK.findall(text):
        if re.match(r"[a-z]+:", target):  # https:, mailto:
            continue
        file_part, _, fragment = target.partition("#")
        linked = (path.parent / file_part).resolve() if file_part else path
        if not linked.exists():
            broken.append(f"{target} (no such file)")
        elif fragment and linked.suffix == ".md" and fragment not in _anchors(linked):
            broken.append(f"{target} (no such heading)")
    assert not broken, f"{path.relative_to(REPO)}: {', '.join(broken)}"
