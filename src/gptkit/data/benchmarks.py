"""The public benchmarks, as their files were published: one reader per dataset format.

GLUE's (SST-2, CoLA, RTE, MRPC, STS-B), Story Cloze and MCTest, which GPT-1 reports, and the
other tasks of its Tables 2–4: SNLI, MultiNLI, QNLI, SciTail, QQP and RACE. Each reader takes the
path :data:`gptkit.data.registry.REGISTRY` names and returns ``Example``s
(:mod:`gptkit.data.examples`) that name their file and line.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterator
from pathlib import Path

from gptkit.data.examples import Example, row_error
from gptkit.data.formats import DataError
from gptkit.data.tables import csv_errors, json_lines, text_lines
from gptkit.io import json_loads


def _fields(path: Path, line_number: int, line: str, count: int) -> list[str]:
    parts = line.split("\t")
    if len(parts) < count:
        raise DataError(
            f"{path}, line {line_number}: expected at least {count} tab-separated fields, got {len(parts)}"
        )
    return parts


def read_sst2(path: Path) -> list[Example]:
    out = []
    for n, line in text_lines(path):
        label, _, text = line.partition(" ")
        out.append(Example({"text": text}, label, f"{path}, line {n}"))
    return out


def _tsv_rows(path: Path, count: int, header: bool = False) -> Iterator[tuple[str, list[str]]]:
    """(where, fields) of each row of a tab-separated file with at least ``count`` fields (quotes
    are text: these files' sentences contain ``"``); ``header``: the first line is skipped."""
    for n, line in text_lines(path):
        if not (header and n == 1):
            yield f"{path}, line {n}", _fields(path, n, line, count)


def read_cola(path: Path) -> list[Example]:
    return [Example({"text": f[3]}, f[1], where) for where, f in _tsv_rows(path, 4)]


def read_rte(path: Path) -> list[Example]:
    return [
        Example({"premise": f[1], "hypothesis": f[2]}, f[3], where)
        for where, f in _tsv_rows(path, 4, header=True)
    ]


def read_mrpc(path: Path) -> list[Example]:
    return [
        Example({"text_a": f[3], "text_b": f[4]}, f[0], where) for where, f in _tsv_rows(path, 5, header=True)
    ]


def read_stsb(path: Path) -> list[Example]:
    out = []
    for where, f in _tsv_rows(path, 7):  # a few rows carry two extra source columns: ignored
        try:
            score = float(f[4])
        except ValueError as e:
            raise DataError(f"{where}: field 'score' is not a number: {f[4]!r}") from e
        out.append(Example({"text_a": f[5], "text_b": f[6]}, score, where))
    return out


def read_story_cloze(path: Path) -> list[Example]:
    out = []
    with open(path, encoding="utf-8-sig", newline="") as f, csv_errors(path):
        reader = csv.DictReader(f)
        for row in reader:
            source = f"{path}, line {reader.line_num}"
            try:
                context = " ".join(row[f"InputSentence{i}"] for i in range(1, 5))
                choices = [row["RandomFifthSentenceQuiz1"], row["RandomFifthSentenceQuiz2"]]
                label = int(row["AnswerRightEnding"]) - 1  # 1/2 in the file
            except (KeyError, TypeError, ValueError) as e:
                raise DataError(f"{source}: bad or missing column ({e})") from e
            if label not in (0, 1):
                raise DataError(f"{source}: field 'AnswerRightEnding' is {label + 1}, not 1 or 2")
            out.append(Example({"context": context, "choices": choices}, label, source))
    return out


def read_mctest(statements: Path) -> list[Example]:
    """One example per question: the story as context, the four answer statements as choices."""
    answers_path = statements.with_name(statements.name.replace(".statements.tsv", ".ans"))
    answers = [line.split("\t") for _, line in text_lines(answers_path)]
    out = []
    for story_index, (n, line) in enumerate(text_lines(statements)):
        parts = _fields(statements, n, line, 23)
        story = parts[2].replace("\\newline", " ")
        if story_index >= len(answers):
            raise DataError(
                f"{answers_path}: no answers for story {story_index + 1} ({statements}, line {n})"
            )
        if len(answers[story_index]) < 4:
            raise DataError(
                f"{answers_path}, line {story_index + 1}: {len(answers[story_index])} answers, expected 4"
            )
        for q in range(4):
            block = parts[3 + 5 * q : 8 + 5 * q]
            letter = answers[story_index][q].strip()
            if letter not in "ABCD" or not letter:
                raise DataError(
                    f"{answers_path}, line {story_index + 1}: answer {q + 1} is {letter!r}, not A-D"
                )
            out.append(
                Example(
                    {"context": story, "choices": block[1:5]}, "ABCD".index(letter), f"{statements}, line {n}"
                )
            )
    return out


# The other GPT-1 benchmarks: SNLI, MultiNLI, QNLI, SciTail, QQP, RACE ------------------------------

NLI_LABELS = ("entailment", "neutral", "contradiction")
BINARY_ENTAILMENT_LABELS = ("entailment", "not_entailment")  # RTE and QNLI
SCITAIL_LABELS = ("entails", "neutral")
QQP_LABELS = ("0", "1")
RACE_LEVELS = ("middle", "high")  # the order a whole split is read in
NO_GOLD_LABEL = "-"  # SNLI-style files: the annotators reached no majority


def _header_tsv(path: Path, needed: tuple[str, ...]) -> tuple[list[str], Iterator[tuple[int, dict]]]:
    """The header and the (line number, row) pairs of a TSV whose first line names its columns.

    Split on tabs with quoting off (the sentences hold bare ``"``). A row may be shorter than the
    header (a line that lost its empty trailing fields): a needed column it lacks is reported by
    ``_text`` when the row is used.
    """
    lines = text_lines(path)
    first = next(lines, None)
    if first is None:
        return [], iter(())
    header = first[1].split("\t")
    missing = [name for name in needed if name not in header]
    if missing:
        raise DataError(
            f"{path}, line {first[0]}: no column {missing[0]!r} in the header (columns: {', '.join(header)})"
        )
    return header, ((n, dict(zip(header, line.split("\t")))) for n, line in lines)


def _text(row: dict, name: str, source: str) -> str:
    value = row.get(name)
    if not isinstance(value, str):
        raise row_error(
            source, f"field {name!r} is missing" if value is None else f"field {name!r} is not text"
        )
    return value


def _check_label(label: str, labels: tuple[str, ...], name: str, source: str) -> str:
    if label not in labels:
        raise row_error(source, f"field {name!r} is {label!r}, not one of {', '.join(labels)}")
    return label


def read_nli(path: Path) -> list[Example]:
    """SNLI 1.0 and MultiNLI 1.0: the release's ``.jsonl``, its ``.txt`` (SNLI 14 columns, MultiNLI
    15) or GLUE's MNLI ``.tsv``; the tab-separated ones are read by their header. GLUE's test files
    have no ``gold_label`` column: their labels are None.

    Rows whose ``gold_label`` is ``-`` (no majority among the annotators) are skipped, as is
    official practice: they have no gold label to train on or to score against, and GLUE leaves
    them out too. The sentences are kept as given, leading and trailing spaces included.
    """
    if path.suffix.lower() == ".jsonl":
        rows: Iterator[tuple[int, dict]] = json_lines(path)
        labelled = True
    else:
        header, rows = _header_tsv(path, ("sentence1", "sentence2"))
        labelled = "gold_label" in header
    out = []
    for n, row in rows:
        source = f"{path}, line {n}"
        label = _text(row, "gold_label", source) if labelled else None
        if label == NO_GOLD_LABEL:
            continue
        if label is not None:
            _check_label(label, NLI_LABELS, "gold_label", source)
        pair = {"premise": _text(row, "sentence1", source), "hypothesis": _text(row, "sentence2", source)}
        out.append(Example(pair, label, source))
    return out


def _read_glue_pairs(
    path: Path, columns: tuple[str, str], fields: tuple[str, str], label_column: str, labels: tuple[str, ...]
) -> list[Example]:
    """A GLUE pair TSV, by its header; the test files have no label column (labels None)."""
    header, rows = _header_tsv(path, columns)
    labelled = label_column in header
    out = []
    for n, row in rows:
        source = f"{path}, line {n}"
        # The texts come before the label in these files: a row cut short misses its label too.
        pair = {field_: _text(row, column, source) for field_, column in zip(fields, columns)}
        label = (
            _check_label(_text(row, label_column, source), labels, label_column, source) if labelled else None
        )
        out.append(Example(pair, label, source))
    return out


def read_qnli(path: Path) -> list[Example]:
    """GLUE QNLI (v2): ``index question sentence label``; premise = question, hypothesis = sentence."""
    return _read_glue_pairs(
        path, ("question", "sentence"), ("premise", "hypothesis"), "label", BINARY_ENTAILMENT_LABELS
    )


def read_qqp(path: Path) -> list[Example]:
    """GLUE QQP: ``id qid1 qid2 question1 question2 is_duplicate`` (0/1); test: ``id question1 question2``."""
    return _read_glue_pairs(
        path, ("question1", "question2"), ("text_a", "text_b"), "is_duplicate", QQP_LABELS
    )


def read_scitail(path: Path) -> list[Example]:
    """SciTail 1.1 in any of its release formats, chosen by the file's folder, else its suffix:

    - ``tsv_format`` (and any ``.tsv``): premise, hypothesis, label; no header.
    - ``dgem_format``: the same with a 4th column, the hypothesis as a graph, which is ignored.
    - ``snli_format`` (JSON lines named ``.txt``) and ``predictor_format`` (JSON lines named
      ``.tsv`` or ``.jsonl``): ``sentence1``, ``sentence2``, ``gold_label``.

    The snli_format says ``entailment`` where the others say ``entails``: it is normalised, so every
    format gives the labels ``entails``/``neutral``. A ``-`` gold label is skipped, as for SNLI.
    """
    folder = path.parent.name
    if folder in ("snli_format", "predictor_format"):
        as_json = True
    elif folder in ("tsv_format", "dgem_format"):
        as_json = False
    else:
        as_json = path.suffix.lower() != ".tsv"
    out = []
    if as_json:
        for n, record in json_lines(path):
            source = f"{path}, line {n}"
            label = _text(record, "gold_label", source)
            if label == NO_GOLD_LABEL:
                continue
            label = _check_label(
                "entails" if label == "entailment" else label, SCITAIL_LABELS, "gold_label", source
            )
            pair = {
                "premise": _text(record, "sentence1", source),
                "hypothesis": _text(record, "sentence2", source),
            }
            out.append(Example(pair, label, source))
        return out
    for n, line in text_lines(path):
        parts = _fields(path, n, line, 3)
        source = f"{path}, line {n}"
        label = _check_label(parts[2], SCITAIL_LABELS, "label", source)
        out.append(Example({"premise": parts[0], "hypothesis": parts[1]}, label, source))
    return out


def _race_files(folder: Path) -> list[Path]:
    """A level folder's passage files in numeric order (2.txt before 13.txt), as the release numbers them."""
    files = [p for p in folder.glob("*.txt") if p.is_file()]
    if not files:
        raise FileNotFoundError(f"{folder}: no RACE passage files (*.txt)")
    return sorted(files, key=lambda p: (not p.stem.isdigit(), int(p.stem) if p.stem.isdigit() else 0, p.name))


def _read_race_file(path: Path) -> list[Example]:
    try:
        passage = json_loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as e:
        raise DataError(f"{path}: not UTF-8 text (invalid byte at offset {e.start})") from e
    except json.JSONDecodeError as e:
        raise DataError(f"{path}: not valid JSON ({e.msg}, line {e.lineno}, column {e.colno})") from e
    if not isinstance(passage, dict):
        raise DataError(f"{path}: expected a JSON object with article, questions, options, answers")
    article = _text(passage, "article", str(path))
    questions, options, answers = (passage.get(key) for key in ("questions", "options", "answers"))
    if not all(isinstance(value, list) for value in (questions, options, answers)) or not (
        len(questions) == len(options) == len(answers)
    ):
        raise DataError(f"{path}: fields 'questions', 'options' and 'answers' must be lists of one length")
    out = []
    for k, (question, choices, answer) in enumerate(zip(questions, options, answers), start=1):
        source = f"{path}, question {k}"
        if not isinstance(question, str):
            raise row_error(source, "field 'questions' holds no text here")
        if not isinstance(choices, list) or len(choices) != 4 or not all(isinstance(c, str) for c in choices):
            raise row_error(source, "field 'options' needs a list of 4 answers here")
        if answer not in ("A", "B", "C", "D"):
            raise row_error(source, f"field 'answers' is {answer!r}, not A-D")
        fields = {"context": article, "question": question, "choices": list(choices)}
        out.append(Example(fields, "ABCD".index(answer), source))
    return out


def read_race(path: Path) -> list[Example]:
    """RACE, one example per question: the article as context, the question, 4 options, the index of
    the answer letter. ``path`` is a passage file, a level folder (``RACE/dev/middle``) or a split
    folder (``RACE/dev``: its middle, then its high passages, both required)."""
    if path.is_file():
        files = [path]
    elif any((path / level).is_dir() for level in RACE_LEVELS):
        files = []
        for level in RACE_LEVELS:
            if not (path / level).is_dir():
                raise FileNotFoundError(f"{path / level}: not found (a RACE split has middle/ and high/)")
            files += _race_files(path / level)
    else:
        files = _race_files(path)
    return [example for file in files for example in _read_race_file(file)]
