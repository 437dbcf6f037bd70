"""The paper's input transformations (GPT-1 §3.3, Figure 1), and batches of them.

With start ``<s>`` = ``_start_``, delimiter ``$`` = ``_delimiter_`` and extract ``<e>`` = ``_classify_``:

    classification    <s> text <e>
    entailment        <s> premise $ hypothesis <e>
    similarity        <s> a $ b <e>   and   <s> b $ a <e>        (both orders)
    multiple choice   <s> context $ answer_k <e>                 (one sequence per answer)
                      <s> context question $ answer_k <e>        (with a question: [z; q; $; a_k])

Truncation: when a sequence would not fit in ``max_length`` tokens, its longest text segment loses
tokens from its end, one at a time, until it fits (so a long context gives way before a short
answer). With a question, the context alone gives way first, from its end, and the question and
answer lose tokens (longest first) only when they do not fit by themselves. The same rules run at
training and at test time.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

import torch

from gptkit.config import IGNORE_INDEX
from gptkit.data.batching import padded_length
from gptkit.data.examples import TASKS, Example, check_text
from gptkit.data.formats import DataError
from gptkit.data.metrics import classification_metrics, regression_metrics
from gptkit.tokenizer import GPT1_SPECIAL_TOKENS, Tokenizer


def special_token_ids(tokenizer: Tokenizer) -> dict[str, int]:
    """Ids of _start_, _delimiter_, _classify_: the tokenizer's own (GPT-1), else rows after its vocabulary."""
    if all(s in tokenizer.special_tokens for s in GPT1_SPECIAL_TOKENS):
        return {s: tokenizer.special_tokens[s] for s in GPT1_SPECIAL_TOKENS}
    return {s: len(tokenizer) + i for i, s in enumerate(GPT1_SPECIAL_TOKENS)}


@dataclass
class TaskSpec:
    """What a fine-tuned model does; saved beside it as ``task.json``."""

    task: str
    labels: list[str] | None = None  # class names, in the order of the head's outputs
    regression: bool = False
    n_choices: int | None = None
    max_length: int = 512
    metric: str = "accuracy"
    specials: dict[str, int] | None = None

    def __post_init__(self) -> None:
        if self.task not in TASKS:
            raise ValueError(f"task must be one of {', '.join(TASKS)}, got {self.task!r}")

    @property
    def n_outputs(self) -> int:
        """Outputs of the linear head W_y: one score per choice/regression, else one per label."""
        if self.task == "multiple_choice" or self.regression:
            return 1
        return len(self.labels or [])

    def to_dict(self) -> dict:
        return asdict(self)


def fit_segments(segments: list[list[int]], budget: int) -> list[list[int]]:
    """Cut the longest segment's end, token by token, until all fit in ``budget`` tokens."""
    lengths = [len(s) for s in segments]
    excess = sum(lengths) - budget
    while excess > 0:
        longest = max(range(len(lengths)), key=lambda i: lengths[i])
        lengths[longest] -= 1
        excess -= 1
    return [s[:n] for s, n in zip(segments, lengths)]


def fit_document_first(document: list[int], kept: list[list[int]], budget: int) -> list[list[int]]:
    """Cut ``document`` from its end until the ``kept`` segments fit beside it in ``budget`` tokens;
    if they alone are too long, the document is dropped and they share the budget by ``fit_segments``.

    Returns the document followed by the kept segments.
    """
    kept = fit_segments(kept, budget)
    room = budget - sum(len(s) for s in kept)
    return [document[:room], *kept]


def build_sequences(
    task: str, parts: dict[str, list[int] | list[list[int]]], specials: dict[str, int], max_length: int
) -> list[list[int]]:
    """Token sequences for one example, in the layouts of the module docstring.

    ``parts`` maps each field to its tokens (``choices`` to one list per answer); a multiple-choice
    ``question`` is optional and goes between the context and the delimiter.
    """
    start, delim, extract = specials["_start_"], specials["_delimiter_"], specials["_classify_"]
    if task == "classification":
        (text,) = fit_segments([parts["text"]], max_length - 2)
        return [[start, *text, extract]]
    if task == "entailment":
        premise, hypothesis = fit_segments([parts["premise"], parts["hypothesis"]], max_length - 3)
        return [[start, *premise, delim, *hypothesis, extract]]
    if task == "similarity":
        a, b = fit_segments([parts["text_a"], parts["text_b"]], max_length - 3)
        return [[start, *a, delim, *b, extract], [start, *b, delim, *a, extract]]
    question = parts.get("question")
    sequences = []
    for answer in parts["choices"]:
        if question is None:
            context, answer = fit_segments([parts["context"], answer], max_length - 3)
            sequences.append([start, *context, delim, *answer, extract])
            continue
        # The question says what to look for and the answer is what gets scored: a question or answer
        # cut short can no longer be judged, while a document cut short usually still holds the
        # evidence (a RACE passage runs to hundreds of tokens, its question and answers to a few).
        # So the document gives way entirely before either loses a token — unlike fit_segments,
        # which would start cutting the question once the document shrank to the question's length.
        context, question_kept, answer = fit_document_first(
            parts["context"], [question, answer], max_length - 3
        )
        sequences.append([start, *context, *question_kept, delim, *answer, extract])
    return sequences


@dataclass
class EncodedExample:
    sequences: list[list[int]]
    target: int | float | None
    source: str = ""


def _target(example: Example, spec: TaskSpec) -> int | float | None:
    label = example.label
    if label is None or (isinstance(label, str) and not label.strip()):
        return None
    if spec.task == "multiple_choice":
        index = int(label)
        if not 0 <= index < len(example.fields["choices"]):
            raise DataError(f"{example.source}: field 'label' = {label} is not a choice index")
        return index
    if spec.regression:
        try:
            return float(label)
        except ValueError as e:
            raise DataError(f"{example.source}: field 'label' is not a number: {label!r}") from e
    label = str(label).strip()
    if label not in (spec.labels or []):
        raise DataError(
            f"{example.source}: field 'label' = {label!r} is not one of the training labels {spec.labels}"
        )
    return spec.labels.index(label)


def encode_examples(
    examples: Sequence[Example],
    spec: TaskSpec,
    encode: Callable[[str], list[int]],
    require_labels: bool = True,
    skip_bad_rows: bool = False,
) -> tuple[list[EncodedExample], int]:
    """Tokenize and lay out examples; returns them and how many bad rows were skipped."""
    encoded, skipped = [], 0
    for example in examples:
        try:
            check_text(example, spec.task)
            target = _target(example, spec)
            if target is None and require_labels:
                raise DataError(f"{example.source}: field 'label' is missing")
            if spec.n_choices is not None and spec.task == "multiple_choice":
                if len(example.fields["choices"]) != spec.n_choices:
                    raise DataError(
                        f"{example.source}: {len(example.fields['choices'])} choices, the task has {spec.n_choices}"
                    )
            parts = {
                name: [encode(c) for c in value] if isinstance(value, list) else encode(value)
                for name, value in example.fields.items()
            }
            sequences = build_sequences(spec.task, parts, spec.specials, spec.max_length)
        except DataError:
            if not skip_bad_rows:
                raise
            skipped += 1
            continue
        encoded.append(EncodedExample(sequences, target, example.source))
    return encoded, skipped


def infer_labels(examples: Sequence[Example], spec_task: str, regression: bool) -> list[str] | None:
    """The label set, read from the training file, sorted (integers numerically)."""
    if spec_task == "multiple_choice" or regression:
        return None
    labels = {str(e.label).strip() for e in examples if e.label is not None and str(e.label).strip()}
    if len(labels) < 2:
        raise DataError(
            f"the training data has {len(labels)} distinct label(s); classification needs at least 2"
        )
    return sorted(
        labels, key=lambda s: (not s.lstrip("-").isdigit(), int(s) if s.lstrip("-").isdigit() else 0, s)
    )


def collate(
    batch: Sequence[EncodedExample],
    regression: bool = False,
    pad_to_multiple: int = 1,
    max_length: int | None = None,
) -> dict[str, torch.Tensor]:
    """Right-pad into (N, C, T): with causal attention no real token ever sees the padding.

    ``lm_labels`` hold -100 on padding; ``clf_positions`` index each sequence's ``<e>`` token.
    ``pad_to_multiple`` rounds T up (never past ``max_length``), as
    :func:`gptkit.data.batching.padded_length` does for every batch.
    """
    n_seq = {len(e.sequences) for e in batch}
    if len(n_seq) != 1:
        raise ValueError(f"examples in a batch have different numbers of sequences: {sorted(n_seq)}")
    (C,) = n_seq
    T = padded_length(max(len(s) for e in batch for s in e.sequences), max_length, pad_to_multiple)
    input_ids = torch.zeros(len(batch), C, T, dtype=torch.long)
    lm_labels = torch.full((len(batch), C, T), IGNORE_INDEX, dtype=torch.long)
    clf_positions = torch.zeros(len(batch), C, dtype=torch.long)
    for i, example in enumerate(batch):
        for j, seq in enumerate(example.sequences):
            input_ids[i, j, : len(seq)] = torch.tensor(seq)
            lm_labels[i, j, : len(seq)] = torch.tensor(seq)
            clf_positions[i, j] = len(seq) - 1
    out = {"input_ids": input_ids, "lm_labels": lm_labels, "clf_positions": clf_positions}
    if all(e.target is not None for e in batch):
        dtype = torch.float32 if regression else torch.long
        out["targets"] = torch.tensor([e.target for e in batch], dtype=dtype)
    return out


def task_metrics(spec: TaskSpec, logits: torch.Tensor, targets: Sequence) -> dict[str, float]:
    """Accuracy, F1 and MCC for classes and choices; Pearson and Spearman for a regression score."""
    if spec.regression:
        return regression_metrics(logits.tolist(), [float(t) for t in targets])
    predictions = logits.argmax(-1).tolist()
    n_classes = logits.size(-1) if spec.task != "multiple_choice" else 0
    return classification_metrics(predictions, list(targets), n_classes)
