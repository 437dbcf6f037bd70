"""Your own labelled files: CSV or TSV with a header, JSON lines, parquet or arrow, one example a
row, their columns mapped to the task's fields (``--columns``).

The line readers here (:func:`text_lines`, :func:`json_lines`) read the public benchmarks' files
too (:mod:`gptkit.data.benchmarks`).
"""

from __future__ import annotations

import contextlib
import csv
import json
from collections.abc import Iterator
from pathlib import Path

from gptkit.data.examples import OPTIONAL_FIELDS, TASKS, TEXT_FIELDS, Example, row_error
from gptkit.data.formats import DataError, table_rows, utf8_error
from gptkit.io import json_loads


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


def _as_text(value: object) -> str | None:
    """A JSON or parquet value as a column's text: strings as they are, null as missing, others as JSON."""
    if value is None or isinstance(value, str):
        return value
    return json.dumps(value, default=str)


def text_lines(path: Path) -> Iterator[tuple[int, str]]:
    """(line number, line) of every line of a UTF-8 file that is not blank, its line end removed."""
    with open(path, encoding="utf-8-sig", newline="") as f, csv_errors(path):
        for line_number, line in enumerate(f, start=1):
            line = line.rstrip("\r\n")
            if line.strip():
                yield line_number, line


def json_lines(path: Path) -> Iterator[tuple[int, dict]]:
    """(line number, object) of a JSON-lines file; a line that is no JSON object is a DataError."""
    for n, line in text_lines(path):
        try:
            record = json_loads(line)
        except json.JSONDecodeError as e:
            raise DataError(f"{path}, line {n}: not valid JSON ({e.msg}, column {e.colno})") from e
        if not isinstance(record, dict):
            raise DataError(f"{path}, line {n}: expected a JSON object")
        yield n, record


@contextlib.contextmanager
def csv_errors(path: Path) -> Iterator[None]:
    """A text file read inside: bytes that are not UTF-8, and what the csv module refuses (a field
    past its size limit), become DataErrors naming the file and line."""
    try:
        yield
    except UnicodeDecodeError as e:
        raise utf8_error(path) from e
    except csv.Error as e:
        raise DataError(f"{path}: not readable as CSV ({e})") from e


def _rows(path: Path) -> Iterator[tuple[str, dict[str, str | None]]]:
    """(where, row) of a CSV/TSV with a header, a JSONL, parquet or arrow file: where is "line N"
    (from 1) or, for parquet and arrow, "row N" (from 0, as pyarrow and pandas count). BOMs and
    CRLF are handled."""
    suffix = path.suffix.lower()
    if suffix in (".jsonl", ".json"):
        for line_number, record in json_lines(path):
            row = {k: v if isinstance(v, str) else json.dumps(v) for k, v in record.items()}
            yield f"line {line_number}", row
        return
    if suffix in (".parquet", ".arrow"):  # a row group (a record batch) at a time
        for index, record in table_rows(path):
            yield f"row {index}", {k: _as_text(v) for k, v in record.items()}
        return
    with open(path, encoding="utf-8-sig", newline="") as f, csv_errors(path):
        if suffix == ".tsv":
            # Tab-separated files in the wild put bare quotes inside fields: split on tabs, no quoting.
            lines = (line.rstrip("\r\n") for line in f)
            header = next(lines, None)
            if header is None:
                return
            names = header.split("\t")
            for line_number, line in enumerate(lines, start=2):
                if line.strip():
                    yield f"line {line_number}", dict(zip(names, line.split("\t")))
        else:
            reader = csv.DictReader(f)
            for row in reader:
                yield f"line {reader.line_num}", {k: v for k, v in row.items() if k is not None}


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
    for index, (where, row) in enumerate(_rows(path)):
        source = f"{path}, {where}"
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
                    problem = f"column {c!r} is null" if c in row else f"missing column {c!r}"
                    raise row_error(source, f"{problem} for field {name!r} (columns: {', '.join(row)})")
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
    raise row_error(
        source, f"label {label!r} is not a choice index (0..{len(choices) - 1}), column or answer text"
    )
