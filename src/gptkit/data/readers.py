"""Labelled data: the public benchmark files as published, and any CSV/TSV/JSONL file of yours.

Every reader returns ``Example``s that remember their file and line, so a bad row is reported
where it is. Fields by task:

    classification    text                     label
    entailment        premise, hypothesis      label
    similarity        text_a, text_b           label (a class, or a score with regression)
    multiple_choice   context, choices (list)  label (the index of the right choice)
                      question (optional)

A question (RACE-style: story, question, answers) is read from your own files only; the public
readers have none (Story Cloze asks nothing, MCTest's statements merge question and answer).
"""

from __future__ import annotations

import csv
import json
import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

Task = Literal["classification", "entailment", "similarity", "multiple_choice"]
TASKS: tuple[str, ...] = ("classification", "entailment", "similarity", "multiple_choice")
TEXT_FIELDS: dict[str, tuple[str, ...]] = {
    "classification": ("text",),
    "entailment": ("premise", "hypothesis"),
    "similarity": ("text_a", "text_b"),
    "multiple_choice": ("context", "choices"),
}
# Fields a task can do without; an example carries one only when its file gives it.
OPTIONAL_FIELDS: dict[str, tuple[str, ...]] = {"multiple_choice": ("question",)}


class DataError(ValueError):
    """A row that cannot be used; the message names the file, line and field."""


@dataclass
class Example:
    fields: dict[str, str | list[str]]
    label: str | float | int | None
    source: str = ""  # "file, line N"
    extra: dict = field(default_factory=dict)


def _error(source: str, message: str) -> DataError:
    return DataError(f"{source}: {message}")


def _check_text(example: Example, task: str) -> None:
    given = [name for name in OPTIONAL_FIELDS.get(task, ()) if name in example.fields]
    for name in (*TEXT_FIELDS[task], *given):
        value = example.fields.get(name)
        if name == "choices":
            if not isinstance(value, list) or len(value) < 2:
                raise _error(example.source, "field 'choices' needs at least two answers")
            for i, choice in enumerate(value):
                if not str(choice).strip():
                    raise _error(example.source, f"field 'choices' answer {i} is empty")
        elif value is None or not str(value).strip():
            raise _error(example.source, f"field {name!r} is empty")


# Your own files ---------------------------------------------------------------------------------


def parse_columns(spec: str | None) -> dict[str, str | list[str]]:
    """``premise=sentence_A,hypothesis=sentence_B,label=gold`` → mapping; ``choices=a|b|c`` → a list."""
    mapping: dict[str, str | list[str]] = {}
    if not spec:
        return mapping
    for part in spec.split(","):
        if "=" not in part:
            raise ValueError(f"--columns: expected field=column, got {part!r}")
        name, column = (s.strip() for s in part.split("=", 1))
        mapping[name] = column.split("|") if name == "choices" else column
    return mapping


def _rows(path: Path) -> Iterator[tuple[int, dict[str, str]]]:
    """(line number, row) of a CSV/TSV with a header, or a JSONL file. BOMs and CRLF are handled."""
    suffix = path.suffix.lower()
    if suffix in (".jsonl", ".json"):
        with open(path, encoding="utf-8-sig") as f:
            for line_number, line in enumerate(f, start=1):
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as e:
                    raise DataError(f"{path}, line {line_number}: not valid JSON ({e.msg})") from e
                if not isinstance(record, dict):
                    raise DataError(f"{path}, line {line_number}: expected a JSON object")
                yield line_number, {k: v if isinstance(v, str) else json.dumps(v) for k, v in record.items()}
        return
    with open(path, encoding="utf-8-sig", newline="") as f:
        if suffix == ".tsv":
            # Tab-separated files in the wild put bare quotes inside fields: split on tabs, no quoting.
            lines = (line.rstrip("\r\n") for line in f)
            header = next(lines, None)
            if header is None:
                return
            names = header.split("\t")
            for line_number, line in enumerate(lines, start=2):
                if line.strip():
                    yield line_number, dict(zip(names, line.split("\t")))
        else:
            reader = csv.DictReader(f)
            for row in reader:
                yield reader.line_num, {k: v for k, v in row.items() if k is not None}


def read_table(
    path: str | Path, task: str, columns: dict[str, str | list[str]] | None = None
) -> list[Example]:
    """Read a user file. ``columns`` maps the task's fields (and ``label``) to column names; by default
    the field names themselves are the columns.

    An optional field (multiple choice's ``question``) is read when ``columns`` names it or when the
    file's first row has a column of the field's own name; from then on every row must have that
    column, and an empty question is an error like any empty text (``--skip-bad-rows`` skips it).
    """
    if task not in TASKS:
        raise ValueError(f"task must be one of {', '.join(TASKS)}, got {task!r}")
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file")
    columns = dict(columns or {})
    wanted = list(TEXT_FIELDS[task]) + ["label"]
    optional = [name for name in OPTIONAL_FIELDS.get(task, ()) if name in columns]
    mapping = {name: columns.get(name, name) for name in wanted + optional}
    examples = []
    for index, (line_number, row) in enumerate(_rows(path)):
        source = f"{path}, line {line_number}"
        if index == 0:
            # The first row decides for the file: a column named like an optional field is used,
            # unless --columns already maps it to another field (context=question: a stem, once).
            mapped = {
                c for value in mapping.values() for c in (value if isinstance(value, list) else [value])
            }
            optional += [
                name
                for name in OPTIONAL_FIELDS.get(task, ())
                if name not in optional and row.get(name) is not None and name not in mapped
            ]
            mapping.update({name: columns.get(name, name) for name in optional})
        values: dict[str, str | list[str]] = {}
        for name in wanted + optional:
            column = mapping[name]
            names = column if isinstance(column, list) else [column]
            for c in names:
                if c not in row or row[c] is None:
                    if name == "label":
                        break
                    raise _error(
                        source, f"missing column {c!r} for field {name!r} (columns: {', '.join(row)})"
                    )
            else:
                values[name] = [row[c] for c in names] if isinstance(column, list) else row[column]
        label = values.pop("label", None)
        if task == "multiple_choice" and isinstance(label, str):
            label = _choice_index(label, values["choices"], mapping["choices"], source)
        examples.append(Example(fields=values, label=label, source=source))
    return examples


def _choice_index(label: str, choices: list[str], choice_columns, source: str) -> int:
    """The right answer of a multiple-choice row: a 0-based index, the column's name, or its text."""
    label = label.strip()
    if isinstance(choice_columns, list) and label in choice_columns:
        return choice_columns.index(label)
    if label.isdigit() and int(label) < len(choices):
        return int(label)
    if label in choices:
        return choices.index(label)
    raise _error(
        source, f"label {label!r} is not a choice index (0..{len(choices) - 1}), column or answer text"
    )


# The public benchmarks, as their files were published --------------------------------------------


def _lines(path: Path) -> Iterator[tuple[int, str]]:
    with open(path, encoding="utf-8-sig", newline="") as f:
        for line_number, line in enumerate(f, start=1):
            line = line.rstrip("\r\n")
            if line.strip():
                yield line_number, line


def _fields(path: Path, line_number: int, line: str, count: int) -> list[str]:
    parts = line.split("\t")
    if len(parts) < count:
        raise DataError(
            f"{path}, line {line_number}: expected at least {count} tab-separated fields, got {len(parts)}"
        )
    return parts


def read_sst2(path: Path) -> list[Example]:
    out = []
    for n, line in _lines(path):
        label, _, text = line.partition(" ")
        out.append(Example({"text": text}, label, f"{path}, line {n}"))
    return out


def read_cola(path: Path) -> list[Example]:
    out = []
    for n, line in _lines(path):
        parts = _fields(path, n, line, 4)
        out.append(Example({"text": parts[3]}, parts[1], f"{path}, line {n}"))
    return out


def read_rte(path: Path) -> list[Example]:
    out = []
    for n, line in _lines(path):
        if n == 1:
            continue  # header
        parts = _fields(path, n, line, 4)
        out.append(Example({"premise": parts[1], "hypothesis": parts[2]}, parts[3], f"{path}, line {n}"))
    return out


def read_mrpc(path: Path) -> list[Example]:
    out = []
    for n, line in _lines(path):
        if n == 1:
            continue
        parts = _fields(path, n, line, 5)
        out.append(Example({"text_a": parts[3], "text_b": parts[4]}, parts[0], f"{path}, line {n}"))
    return out


def read_stsb(path: Path) -> list[Example]:
    out = []
    for n, line in _lines(path):
        parts = _fields(path, n, line, 7)  # a few rows carry two extra source columns: ignored
        try:
            score = float(parts[4])
        except ValueError as e:
            raise DataError(f"{path}, line {n}: field 'score' is not a number: {parts[4]!r}") from e
        out.append(Example({"text_a": parts[5], "text_b": parts[6]}, score, f"{path}, line {n}"))
    return out


def read_story_cloze(path: Path) -> list[Example]:
    out = []
    with open(path, encoding="utf-8-sig", newline="") as f:
        reader = csv.DictReader(f)
        for row in reader:
            source = f"{path}, line {reader.line_num}"
            try:
                context = " ".join(row[f"InputSentence{i}"] for i in range(1, 5))
                choices = [row["RandomFifthSentenceQuiz1"], row["RandomFifthSentenceQuiz2"]]
                label = int(row["AnswerRightEnding"]) - 1  # 1/2 in the file
            except (KeyError, TypeError, ValueError) as e:
                raise DataError(f"{source}: bad or missing column ({e})") from e
            out.append(Example({"context": context, "choices": choices}, label, source))
    return out


def read_mctest(statements: Path) -> list[Example]:
    """One example per question: the story as context, the four answer statements as choices."""
    answers_path = statements.with_name(statements.name.replace(".statements.tsv", ".ans"))
    answers = [line.split("\t") for _, line in _lines(answers_path)]
    out = []
    for story_index, (n, line) in enumerate(_lines(statements)):
        parts = _fields(statements, n, line, 23)
        story = parts[2].replace("\\newline", " ")
        if story_index >= len(answers):
            raise DataError(
                f"{answers_path}: no answers for story {story_index + 1} ({statements}, line {n})"
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


@dataclass(frozen=True)
class Dataset:
    task: str
    reader: object
    files: dict[str, str]
    regression: bool = False
    metric: str = "accuracy"


DATASETS: dict[str, Dataset] = {
    "sst2": Dataset("classification", read_sst2, {"train": "sst2/stsa.binary.train", "dev": "sst2/stsa.binary.dev",
                                                  "test": "sst2/stsa.binary.test"}),
    "cola": Dataset("classification", read_cola, {"train": "cola/in_domain_train.tsv", "dev": "cola/in_domain_dev.tsv",
                                                  "test": "cola/out_of_domain_dev.tsv"}, metric="mcc"),
    "rte": Dataset("entailment", read_rte, {"train": "rte/train.tsv", "dev": "rte/dev.tsv"}),
    "mrpc": Dataset("similarity", read_mrpc, {"train": "mrpc/msr-para-train.tsv", "dev": "mrpc/msr-para-val.tsv",
                                              "test": "mrpc/msr-para-test.tsv"}, metric="f1"),
    "stsb": Dataset("similarity", read_stsb, {"train": "sts_benchmark/sts-train.csv", "dev": "sts_benchmark/sts-dev.csv",
                                              "test": "sts_benchmark/sts-test.csv"}, regression=True, metric="pearson"),
    "story_cloze": Dataset("multiple_choice", read_story_cloze, {
        "train": "story_cloze_2016/cloze_test_val__spring2016 - cloze_test_ALL_val.csv",
        "dev": "story_cloze_2016/cloze_test_val__spring2016 - cloze_test_ALL_val.csv",
        "test": "story_cloze_2016/cloze_test_test__spring2016 - cloze_test_ALL_test.csv"}),
    "mctest": Dataset("multiple_choice", read_mctest, {"train": "mctest/mc500.train.statements.tsv",
                                                       "dev": "mctest/mc500.dev.statements.tsv",
                                                       "test": "mctest/mc500.test.statements.tsv"}),
}  # fmt: skip

# GPT-1 (finetune-transformer-lm) split the Story Cloze validation set into 1,497 training and 374
# dev stories with this seed, and evaluated on the test set.
STORY_CLOZE_SEED = 3535999445
STORY_CLOZE_DEV = 374


def read_dataset(name: str, split: str, data_dir: str | Path) -> list[Example]:
    """A split ("train", "dev", "test") of a public benchmark, read from ``data_dir``."""
    if name not in DATASETS:
        raise ValueError(f"unknown dataset {name!r}; known: {', '.join(DATASETS)}")
    spec = DATASETS[name]
    if split not in spec.files:
        raise ValueError(f"dataset {name!r} has no {split!r} split (it has {', '.join(spec.files)})")
    path = Path(data_dir) / spec.files[split]
    if not path.is_file():
        raise FileNotFoundError(f"{path}: not found (is --data-dir the shared data directory?)")
    examples = spec.reader(path)
    if name == "story_cloze" and split in ("train", "dev"):
        order = list(range(len(examples)))
        random.Random(STORY_CLOZE_SEED).shuffle(order)
        keep = order[STORY_CLOZE_DEV:] if split == "train" else order[:STORY_CLOZE_DEV]
        examples = [examples[i] for i in sorted(keep)]
    return examples
