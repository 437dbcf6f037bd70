"""Labelled examples: what every reader of labelled data returns, and the fields each task needs.

An ``Example`` remembers its file and line (RACE: file and question), so a bad row is reported
where it is. Fields by task:

    classification    text                     label
    entailment        premise, hypothesis      label
    similarity        text_a, text_b           label (a class, or a score with regression)
    multiple_choice   context, choices (list)  label (the index of the right choice)
                      question (optional)
    generation        prompt, completion       (none: the completion is what the model learns to write)

A question (story, question, answers) comes from RACE and from your own files; Story Cloze asks
nothing, and MCTest's statements merge question and answer.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from gptkit.data.formats import DataError

Task = Literal["classification", "entailment", "similarity", "multiple_choice", "generation"]
TASKS: tuple[str, ...] = ("classification", "entailment", "similarity", "multiple_choice", "generation")
# Tasks that learn to write text rather than to choose a label (no head, no label column).
GENERATIVE_TASKS: tuple[str, ...] = ("generation",)
TEXT_FIELDS: dict[str, tuple[str, ...]] = {
    "classification": ("text",),
    "entailment": ("premise", "hypothesis"),
    "similarity": ("text_a", "text_b"),
    "multiple_choice": ("context", "choices"),
    "generation": ("prompt", "completion"),
}
# Fields a task can do without; an example carries one only when its file gives it.
OPTIONAL_FIELDS: dict[str, tuple[str, ...]] = {"multiple_choice": ("question",)}


@dataclass
class Example:
    fields: dict[str, str | list[str]]
    label: str | float | int | None
    source: str = ""  # "file, line N"
    extra: dict = field(default_factory=dict)


def row_error(source: str, message: str) -> DataError:
    """A DataError that names where it is (``source``: "file, line N")."""
    return DataError(f"{source}: {message}")


def check_text(example: Example, task: str) -> None:
    """Refuse an example whose text field (or an answer) is empty."""
    given = [name for name in OPTIONAL_FIELDS.get(task, ()) if name in example.fields]
    for name in (*TEXT_FIELDS[task], *given):
        value = example.fields.get(name)
        if name == "choices":
            if not isinstance(value, list) or len(value) < 2:
                raise row_error(example.source, "field 'choices' needs at least two answers")
            for i, choice in enumerate(value):
                if not str(choice).strip():
                    raise row_error(example.source, f"field 'choices' answer {i} is empty")
        elif value is None or not str(value).strip():
            raise row_error(example.source, f"field {name!r} is empty")
