"""The docs' commands, links and figures, checked: every `gptkit ...` line in a command fence of
README.md or docs/*.md parses with gptkit's own parser (nothing runs), every relative link points at
a file that exists (and, with a #fragment, at one of its headings), and every figure a paragraph
attributes to results.md is in the section it cites."""

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


# A fence of shell commands: tagged as a shell, untagged, or whatever its tag opening on a command.
_SHELL_TAGS = ("", "bash", "sh", "shell", "console")
_OPENS_ON_A_COMMAND = re.compile(r"(\$ |gptkit |make |pip |python -m gptkit)")
# A line that runs gptkit, after any environment assignments (HF_HOME=... gptkit ...); one reading
# "gptkit prepare: error: ..." (argparse's prog, then a colon) is what gptkit printed instead.
_RUNS_GPTKIT = re.compile(r"(?:[A-Z_][A-Z0-9_]*=\S*\s+)*(?:gptkit|python -m gptkit)\s(?![\w ]+: )")


def _command_fences(text: str) -> list[tuple[int, str]]:
    """(line number of its first line, body) of each fence that holds commands: untagged or tagged as a
    shell, or any other (text, python, ...) whose first line that is not a comment opens on a command."""
    fences = []
    for block in _FENCE.finditer(text):
        lines = [line for line in block.group(2).splitlines() if line.strip()]
        first = next((line for line in lines if not line.lstrip().startswith("#")), "")
        if block.group(1) in _SHELL_TAGS or _OPENS_ON_A_COMMAND.match(first):
            fences.append((text[: block.start(2)].count("\n") + 1, block.group(2)))
    return fences


def _gptkit_arguments(command: str) -> list[str] | None:
    """The arguments of a `gptkit` (or `python -m gptkit`) command line, after any environment
    assignments and before what the shell does around it; None for any other command."""
    words = shlex.split(command, comments=True) if command else []
    # What the shell does around the command (redirections, pipes) is not its arguments.
    cut = [i for i, word in enumerate(words) if word in ("<", ">", "|", "&&", ";", "2>&1")]
    words = words[: cut[0]] if cut else words
    while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", words[0]):
        words.pop(0)
    if words[:1] == ["gptkit"]:
        return words[1:]
    if words[:3] == ["python", "-m", "gptkit"]:
        return words[3:]
    return None


def _shell_commands(path: Path) -> list[tuple[int, str]]:
    """(line number, arguments) of each `gptkit` command in the file's command fences, with
    continuation lines joined and comments dropped."""
    text = path.read_text(encoding="utf-8")
    commands = []
    for first_line, body in _command_fences(text):
        joined, start = "", None
        for offset, line in enumerate(body.splitlines()):
            line = line.removeprefix("$ ")
            if start is None:
                start = first_line + offset
            if line.rstrip().endswith("\\"):
                joined += line.rstrip().rstrip("\\").rstrip() + " "
                continue
            joined += line
            command = joined.split(" #", 1)[0].strip()
            arguments = _gptkit_arguments(command) if _RUNS_GPTKIT.match(command) else None
            if arguments is not None:
                commands.append((start, shlex.join(arguments)))
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


# A figure, in any unit, matched as its number is written (the rule is in the docstring of
# test_every_figure_of_the_docs_is_in_the_results_it_cites).
_NUMBER = r"\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?"
_UNIT = r"×|x\b|\s?%|\s(?:ms|s|min|h|[kMGT]i?B(?:/s)?|tok/s|tokens/s|req/s)(?![\w/]|\.\w)"
_FIGURE = re.compile(
    rf"(?<![\w.,/-])(?:\d+ min \d+ s|(?:{_NUMBER})(?={_UNIT})|\d{{1,3}}(?:,\d{{3}})+(?:\.\d+)?|\d+\.\d+)"
    r"(?!\.?\d|,\d|[eE][-+]?\d|-\d)"
)


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


RESULTS, EXPERIMENTS = REPO / "docs" / "results.md", REPO / "docs" / "experiments.md"
# Prose that cites results: README.md and docs/*.md but results.md itself (rendered from results/*.json)
# and experiments.md (a dated lab notebook: each section is dated and its figures are that day's
# records, not today's tables).
PROSE = [path for path in DOCS if path.name not in ("results.md", "experiments.md")]
# A block rendered into a prose doc from a results JSON by its benchmark (operations.md's fuzz and soak).
_RENDERED = re.compile(r"^<!-- begin: rendered from (results/\w+\.json).*?^<!-- end\b.*?$", re.M | re.S)
_JSON = re.compile(r"(?<![\w/])results/(\w+)\.json")
_CODE = re.compile(r"`[^`]*`")


def _paragraphs(path: Path) -> list[tuple[int, str]]:
    """(first line, text) of each block of consecutive non-blank lines outside fences and rendered
    blocks: a list's items or a table's rows are one block."""
    text = _RENDERED.sub(lambda block: "\n" * block.group(0).count("\n"), path.read_text(encoding="utf-8"))
    text = _FENCE.sub(lambda block: "\n" * block.group(0).count("\n"), text)
    blocks: list[tuple[int, str]] = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        if blocks and blocks[-1][0] + blocks[-1][1].count("\n") == number - 1:
            blocks[-1] = (blocks[-1][0], blocks[-1][1] + "\n" + line)
        else:
            blocks.append((number, line))
    return blocks


def _rendered_from(name: str) -> str:
    """The text that renders results/<name>.json: a block of a prose doc between its markers, else
    the section of results.md headed with its benchmark's title (scripts/render_results.py)."""
    for path in PROSE:
        for block in _RENDERED.finditer(path.read_text(encoding="utf-8")):
            if block.group(1) == f"results/{name}.json":
                return block.group(0)
    sys.path.insert(0, str(REPO / "scripts"))
    import render_results

    title = render_results.title(json.loads((REPO / "results" / f"{name}.json").read_text(encoding="utf-8")))
    return _section(RESULTS, re.sub(r"[^\w\- ]", "", title.strip().lower()).replace(" ", "-"))


def _prose(paragraph: str) -> str:
    """The paragraph as a reader reads its figures, line for line: no code spans, link targets or
    definitions."""
    paragraph = re.sub(
        r"\]\([^)\s]+\)", "]", _CODE.sub(lambda span: "\n" * span.group(0).count("\n"), paragraph)
    )
    return "\n".join("" if _DEFINITION.match(line) else line for line in paragraph.splitlines())


def _citations(path: Path, paragraph: str) -> list[str]:
    """What the paragraph cites, by its path from the repository: each section of results.md it links
    to (a link without an anchor: the whole file), each results JSON it names by path, or
    docs/results.md named in its prose; with any of those, each section of experiments.md it links to."""
    definitions = {name.lower(): target for name, target in _DEFINITION.findall(path.read_text("utf-8"))}
    targets = _LINK.findall(paragraph) + [
        definitions[name.lower()] for name in _REFERENCE.findall(paragraph) if name.lower() in definitions
    ]
    results, experiments = [], []
    for target in targets:
        file_part, hash_sign, anchor = target.partition("#")
        linked = (path.parent / file_part).resolve() if file_part else None
        if linked == RESULTS:
            results.append(f"docs/results.md{hash_sign}{anchor}")
        elif linked == EXPERIMENTS and anchor:
            experiments.append(f"docs/experiments.md#{anchor}")
    results += [f"results/{name}.json" for name in _JSON.findall(paragraph)]
    if not results and "docs/results.md" in _prose(paragraph):  # named, not linked
        results.append("docs/results.md")
    return results + experiments if results else []


def _cited_text(citation: str) -> str:
    """The text a citation from _citations points at."""
    if citation.startswith("results/"):
        return _rendered_from(Path(citation).stem)
    file_part, _, anchor = citation.partition("#")
    return _section(REPO / file_part, anchor) if anchor else (REPO / file_part).read_text("utf-8")


def _citing_paragraphs() -> list[tuple[Path, int, str, list[str]]]:
    """(doc, line, paragraph, citations) of each paragraph of the prose docs that cites results; a
    table or list that such a paragraph introduces (ending on a colon) cites what it cites."""
    found = []
    for path in PROSE:
        introduced: list[str] = []
        for line, paragraph in _paragraphs(path):
            citations = _citations(path, paragraph) or (introduced if paragraph[0] in "|-" else [])
            if citations:
                found.append((path, line, paragraph, citations))
            introduced = citations if paragraph.rstrip().endswith(":") else []
    return found


CITING = _citing_paragraphs()


def test_the_docs_cite_results():
    figures = sum(len(_FIGURE.findall(_prose(paragraph))) for _, _, paragraph, _ in CITING)
    assert len(CITING) > 15 and figures > 100  # the docs quote many: too few means the reader broke


@pytest.mark.parametrize(
    "path, line, paragraph, citations", CITING, ids=[f"{p.relative_to(REPO)}:{n}" for p, n, _, _ in CITING]
)
def test_every_figure_of_the_docs_is_in_the_results_it_cites(path, line, paragraph, citations):
    """A paragraph of README.md or docs/*.md (but results.md, rendered from results/*.json, and
    experiments.md, a dated lab notebook: each of its sections is dated and its figures are that
    day's records) that links to a section of results.md or names a results JSON quotes it: each of
    its figures is in a section it cites, as the section writes it, so a rerun that changes the
    section shows here. A figure of a dated experiment is cited there, by a link to its section.

    A figure is a decimal (1.38), a number grouped by commas (1,034; also found ungrouped, 1034), or
    a number carrying a measured unit: a ratio (2.6×, 3x), a percentage (12%, 3.5 %), a time (ms, s,
    min, h: 431 ms, 40 min 40 s), a size (kB, MB, MiB, GB, GiB: 742 MiB) or a rate (tok/s, tokens/s,
    req/s, MB/s: 23 tok/s). Not figures: settings written as plain
    integers (GPT-2 small, 12 layers, batch 8 × 256, 2 cores, 16 clients, context 1024, seed 1337),
    dates and versions (2026-12-03, torch 2.13.0: numbers run on with points or dashes), e-notation
    (6e-3), code spans (`--lr 0.5`) and link targets."""
    sections = "\n".join(_cited_text(citation) for citation in citations)
    missing = [
        f"{path.relative_to(REPO)}:{line + offset}: {figure}"
        for offset, text in enumerate(_prose(paragraph).splitlines())
        for figure in _FIGURE.findall(text)
        if not re.search(_whole(figure), sections)
        and not re.search(_whole(figure.replace(",", "")), sections)
    ]
    assert not missing, (
        f"{'; '.join(missing)}: not in what the paragraph cites ({', '.join(citations)}); quote the "
        "section, cite where the figure comes from, or drop it"
    )


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
