"""The docs' commands and links, checked against the code: every `gptkit ...` line in a shell block of
README.md or docs/*.md parses with gptkit's own parser (nothing runs), and every relative link
points at a file that exists (and, with a #fragment, at one of its headings)."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from gptkit.cli import build_parser

REPO = Path(__file__).resolve().parents[1]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
_FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.MULTILINE | re.DOTALL)
_LINK = re.compile(r"\]\(([^)\s]+)\)")
# A reference-style link's definition ("[name]: target", a line of its own) and use ("[text][name]").
_DEFINITION = re.compile(r"^\[([^\]]+)\]:\s+(\S+)", re.MULTILINE)
_REFERENCE = re.compile(r"\]\[([^\]]+)\]")


def _targets(text: str, line: str | None = None) -> list[str]:
    """The link targets of ``line`` (by default every one in ``text``): inline links, and
    reference-style ones through their definitions in ``text``."""
    definitions = {name.lower(): target for name, target in _DEFINITION.findall(text)}
    if line is None:
        return _LINK.findall(text) + list(definitions.values())
    return _LINK.findall(line) + [definitions[name.lower()] for name in _REFERENCE.findall(line)]


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
    for target in _targets(text):
        if re.match(r"[a-z]+:", target):  # https:, mailto:
            continue
        file_part, _, fragment = target.partition("#")
        linked = (path.parent / file_part).resolve() if file_part else path
        if not linked.exists():
            broken.append(f"{target} (no such file)")
        elif fragment and linked.suffix == ".md" and fragment not in _anchors(linked):
            broken.append(f"{target} (no such heading)")
    assert not broken, f"{path.relative_to(REPO)}: {', '.join(broken)}"


def _section(path: Path, anchor: str) -> str:
    """The text under the heading with this anchor, up to the next heading of its level or above."""
    lines = _FENCE.sub("", path.read_text(encoding="utf-8")).splitlines()
    for start, line in enumerate(lines):
        match = re.match(r"^(#+)\s+(.*)$", line)
        if match and re.sub(r"[^\w\- ]", "", match.group(2).strip().lower()).replace(" ", "-") == anchor:
            level = len(match.group(1))
            end = next(
                (i for i in range(start + 1, len(lines)) if re.match(rf"^#{{1,{level}}}\s", lines[i])),
                len(lines),
            )
            return "\n".join(lines[start:end])
    raise AssertionError(f"{path.name}: no heading with the anchor {anchor}")


# A figure: a decimal (1.33, 0.89, +0.020), or a quantity with its unit (665 MB, 40 min 40 s).
_FIGURE = re.compile(r"(?<![\w.-])(\d+\.\d+|\d[\d,]* MB|\d+ min \d+ s)(?![\d])")


def _whole(figure: str) -> str:
    """A pattern for the figure as a whole number: not part of a longer one on either side (1.3 is
    not in 1.33 nor in 21.3, 250 MB not in 1,250 MB), though a sentence's full stop may follow it."""
    return rf"(?<![\d.,]){re.escape(figure)}(?!\.?\d|,\d)"


def _claims() -> list[tuple[str, list[str]]]:
    text = (REPO / "README.md").read_text(encoding="utf-8")
    section = text.split("## What it does, measured", 1)[1].split("\n## ", 1)[0]
    return [(line, _targets(text, line)) for line in section.splitlines() if line.startswith("- ")]


def test_the_readme_has_its_claims():
    assert 5 <= len(_claims()) <= 10  # at most ten one-line claims; none means the reader broke


def test_the_readme_is_a_front_door():
    """What a newcomer reads before the first command is short: the command within the first 30
    lines, at most 15 lines of prose before the second section, and the measured section at most 12
    lines of at most 200 characters."""
    lines = (REPO / "README.md").read_text(encoding="utf-8").splitlines()
    assert any(line.startswith("make demo") for line in lines[:30])
    second = [i for i, line in enumerate(lines) if line.startswith("## ")][1]
    fenced = False
    prose = 0
    for line in lines[1:second]:
        fenced ^= line.startswith("```")
        prose += bool(line.strip()) and not fenced and not line.startswith(("#", "```"))
    assert prose <= 15
    start = lines.index("## What it does, measured") + 1
    end = next(i for i in range(start, len(lines)) if lines[i].startswith("## "))
    measured = [line for line in lines[start:end] if line.strip()]
    assert len(measured) <= 12 and all(len(line) <= 200 for line in measured), measured


@pytest.mark.parametrize("claim", _claims(), ids=lambda claim: claim[0][2:40])
def test_every_readme_figure_is_in_the_table_it_links_to(claim):
    """A figure in the README is one a linked results section holds: the README quotes, it does not
    round or recompute, so a rerun that changes the section shows here."""
    line, links = claim
    assert links, f"README claim without a link to its figures: {line}"
    sections = "\n".join(
        _section(REPO / target.partition("#")[0], target.partition("#")[2])
        for target in links
        if "#" in target
    )
    # A table measured on a machine busier than its cores says so (scripts/render_results.py): the
    # README leaves its figures alone until a rerun.
    assert "**Loaded**" not in sections, f"README quotes a table measured under load: {line[:60]}..."
    figures = _FIGURE.findall(re.split(r"\]\(|\]\[", line, maxsplit=1)[-1])
    assert figures, f"README claim without a figure: {line}"
    missing = [f for f in figures if not re.search(_whole(f), sections)]
    assert not missing, f"not in the linked sections: {missing} ({line[:60]}...)"


def test_results_md_is_what_the_benchmarks_printed():
    """docs/results.md's tables of today's figures are rendered from results/*.json, unedited."""
    done = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "render_results.py"), "--check"],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert sorted((REPO / "results").glob("*.json")), "results/ holds no benchmark's JSON"


def test_a_demo_run_is_kept_without_its_samples_and_rendered_with_its_figures(tmp_path):
    """`make keep-demo` keeps a demo's summary as results/demo.json: the figures stay, the samples go,
    and the table shows each task's difference with its error and threshold over seeds, or, from one
    seed a side, the difference alone."""
    sys.path.insert(0, str(REPO / "scripts"))
    import render_results

    per_seed = [
        {"seed": 1337, "updates": 186, "pretrained": 0.72, "from_scratch": 0.65, "one_answer": {}},
        {
            "seed": 1338,
            "updates": 180,
            "pretrained": 0.68,
            "from_scratch": 0.509,
            "one_answer": {"from_scratch": "1"},
        },
    ]
    task = {"metric": "dev accuracy", "examples": 872, "seeds": 2, "pretrained": 0.7, "from_scratch": 0.5795}
    task |= {"majority_class": 0.509, "difference": 0.1213, "stderr": 0.0501, "threshold": 12.71}
    task |= {"clears_threshold": False, "batch_size": 32, "per_seed": per_seed}
    summary = tmp_path / "summary.json"
    summary.write_text(
        json.dumps(
            {"recipe": "minutes", "pretrain": {"steps": 1234, "val_loss": 3.1}, "seconds": 840.0,
             "time_budget_s": 900.0, "tasks": {"sst2": task}, "samples": {"A": "b"}, "sampling": {}}
        )
    )  # fmt: skip
    kept = render_results.keep("demo", summary, tmp_path / "results")
    record = json.loads(kept.read_text())
    assert kept.name == "demo.json" and "samples" not in record and record["tasks"]["sst2"] == task
    rows = "\n".join(render_results.table(record))
    assert "1,234 pre-training updates; 14.0 minutes of a 15-minute budget, set-up included" in rows
    row = "| 872 | 2 | 186, 180 | 0.700 | 0.580 | 0.509 | +0.070, +0.171§ | +0.121 ± 0.050 | 12.7 | no |"
    assert f"| sst2 | dev accuracy {row}" in rows and "§ a side answered one class on every example" in rows
    one = task | {"seeds": 1, "stderr": None, "threshold": None, "clears_threshold": None}
    one["per_seed"] = per_seed[:1]
    summary.write_text(
        json.dumps({"recipe": "minutes", "pretrain": {"steps": 9}, "seconds": 60.0, "tasks": {"sst2": one}})
    )
    rows = "\n".join(
        render_results.table(json.loads(render_results.keep("demo", summary, tmp_path).read_text()))
    )
    assert "| 872 | 1 | 186 | 0.700 | 0.580 | 0.509 | +0.070 | +0.121 | — | one draw |" in rows
    assert "±" not in rows.split("| task |")[1]  # no error in the table
